#!/usr/bin/env bash
# Make a local base image for the project's Dockerfiles, for machines that cannot pull images
# (no registry reachable, as in CI): Debian bookworm "minbase" with Debian's python3 (3.11),
# python3-venv and the CA store, made by debootstrap from Debian's package mirror and loaded
# with `docker import`. Hand it to the builds as the BASE_IMAGE build argument.
#
# The image's CA bundle is this machine's (CA_BUNDLE), so pip/uv inside the builds trust an
# HTTPS proxy whose CA the machine trusts. Cached: if an image with the same tag and the same
# recipe hash (script + CA bundle + suite) exists, nothing is done.
#
#   docker/make-base-image.sh            # prints the image reference on the last line
#   BASE_IMAGE_TAG=x:y DEBIAN_MIRROR=http://... docker/make-base-image.sh
set -euo pipefail

TAG="${BASE_IMAGE_TAG:-python-mcp-server-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
PACKAGES="python3,python3-venv,ca-certificates,libseccomp2"

recipe_hash="$(cat "$0" "$CA_BUNDLE" <(echo "$SUITE $PACKAGES") | sha256sum | cut -c1-16)"
have="$(docker image inspect -f '{{ index .Config.Labels "org.python-mcp-server.base-recipe" }}' \
    "$TAG" 2>/dev/null || true)"
if [[ "$have" == "$recipe_hash" ]]; then
    echo "base image $TAG is up to date (recipe $recipe_hash)" >&2
    echo "$TAG"
    exit 0
fi

command -v debootstrap >/dev/null || { echo "debootstrap is not installed" >&2; exit 1; }
work="$(mktemp -d /var/tmp/python-mcp-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
echo "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR ..." >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
    >"$work/debootstrap.log" 2>&1 || { tail -40 "$work/debootstrap.log" >&2; exit 1; }

cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
# Name resolution inside containers comes from Docker; drop the host's files debootstrap copied.
: >"$root/etc/resolv.conf"
: >"$root/etc/hostname"

echo "docker import -> $TAG" >&2
tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.python-mcp-server.base-recipe=$recipe_hash" \
    --change 'CMD ["/bin/bash"]' \
    - "$TAG" >&2
echo "$TAG"
