# syntax=docker/dockerfile:1
# The real Snekbox built from its upstream sources, for machines that cannot pull
# ghcr.io/python-discord/snekbox (no container registry, as in CI). It follows upstream's own
# Dockerfile (python-discord/snekbox at 6100833: NsJail built at the commit it pins, Snekbox's
# pinned requirements, gunicorn with config/gunicorn.conf.py) on a Debian base image, and lays
# the image out the same way: /usr/sbin/nsjail, /snekbox (the server, config/snekbox.cfg),
# /snekbin/python/default (the jailed interpreter's prefix). docker/snekbox/Dockerfile then
# extends it exactly as it extends upstream's image:
#
#   docker build -f docker/snekbox/source.Dockerfile --build-arg BASE_IMAGE=... -t SNEKBOX ctx/
#   docker compose build --build-arg SNEKBOX_IMAGE=SNEKBOX snekbox   (or SNEKBOX_IMAGE in .env)
#
# Build context: a directory holding the three `git archive` tarballs of the pinned commits
# (.ci/compose-test copies them there from the vendor directory; their checksums are pinned
# below, so another commit fails the build):
#   snekbox.tar.gz  python-discord/snekbox 610083369354da6714c368bc3ae446cef4a29baf (MIT)
#   nsjail.tar.gz   google/nsjail dccf911fd2659e7b08ce9507c25b2b38ec2c5800 (Apache-2.0), the
#                   commit upstream's Dockerfile checks out
#   kafel.tar.gz    google/kafel 00532cc1ee142355c2db8a58001bcc669893cff8 (Apache-2.0), NsJail's
#                   submodule at that commit
#
# What differs from upstream's image, and why:
# - The jailed interpreter is the base image's Debian CPython 3.11, not a CPython 3.14 built from
#   source (CPython's sources cannot be fetched here). It sits where upstream's config expects
#   it: /usr/local/bin/python (a link to /usr/bin/python3.11, which NsJail's bind mount follows)
#   and /snekbin/python/default -> /usr/local; in the jail it finds its standard library in
#   /usr/lib/python3.11 (its built-in prefix, /usr/lib being bound). pip for it comes from
#   Debian (python3-pip), and the image is its own Python environment (PEP 668's marker
#   removed), so `python -m pip install --user` works as it does on upstream's image.
# - Snekbox's own server runs from /snekbox (its source, `snekbox:SnekAPI()`, as upstream's dev
#   image runs it) in a virtual environment of its own, /snekbox/venv, which no sandbox sees:
#   the tarball has no .git, which Snekbox's version scheme needs to build a wheel.
ARG BASE_IMAGE=python-mcp-server-base:bookworm

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS builder-nsjail
ARG NSJAIL_SHA256=52f8be338ac8b623ff79ee3697dec201c9df66ef5375d15105c3f3fdbe55edb5
ARG KAFEL_SHA256=5a6b692694c4fae70ddcb53f8b1db3b0af139826d475d57053359e4da5f6898b
RUN apt-get -y -q update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        bison flex g++ make pkg-config libprotobuf-dev libnl-route-3-dev protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /nsjail
COPY nsjail.tar.gz kafel.tar.gz /tmp/
RUN echo "${NSJAIL_SHA256}  /tmp/nsjail.tar.gz" | sha256sum -c - \
    && echo "${KAFEL_SHA256}  /tmp/kafel.tar.gz" | sha256sum -c - \
    && tar -xzf /tmp/nsjail.tar.gz --strip-components=1 \
    && rm -rf kafel && mkdir kafel && tar -xzf /tmp/kafel.tar.gz -C kafel --strip-components=1 \
    && make -j"$(nproc)" \
    && ./nsjail --help >/dev/null

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG SNEKBOX_SHA256=098efb57b11991936f07ce1a5a3ba5b08a287d6a926ccc807477e0c6ee244a37
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# NsJail's libraries, and pip for the jailed interpreter (the packages the extension adds).
RUN apt-get -y -q update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        libnl-route-3-200 libprotobuf32 python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && rm -f /usr/lib/python3.*/EXTERNALLY-MANAGED
COPY --from=builder-nsjail /nsjail/nsjail /usr/sbin/nsjail
# The jailed interpreter, at the path Snekbox runs by default (/snekbin/python/default/bin/python).
RUN mkdir -p /snekbin/python /usr/local/bin \
    && ln -s "$(readlink -f /usr/bin/python3)" /usr/local/bin/python \
    && ln -s /usr/local /snekbin/python/default \
    && /snekbin/python/default/bin/python -c 'import sys; assert sys.version_info >= (3, 11)'
WORKDIR /snekbox
COPY snekbox.tar.gz /tmp/
RUN echo "${SNEKBOX_SHA256}  /tmp/snekbox.tar.gz" | sha256sum -c - \
    && tar -xzf /tmp/snekbox.tar.gz --strip-components=1 \
        --wildcards '*/snekbox/*' '*/config/*' '*/requirements/*' '*/LICENSE*' \
    && rm /tmp/snekbox.tar.gz \
    && python3 -m venv /snekbox/venv \
    && /snekbox/venv/bin/pip install --quiet -r requirements/requirements.pip \
    && cd / && /snekbox/venv/bin/python -c 'import sys; sys.path.insert(0, "/snekbox"); import snekbox'
ENV PATH=/snekbox/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.opencontainers.image.source="https://github.com/python-discord/snekbox" \
      org.opencontainers.image.revision="610083369354da6714c368bc3ae446cef4a29baf" \
      org.python-mcp-server.nsjail-revision="dccf911fd2659e7b08ce9507c25b2b38ec2c5800"
EXPOSE 8060
ENTRYPOINT ["gunicorn"]
CMD ["-c", "config/gunicorn.conf.py"]
