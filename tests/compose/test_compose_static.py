"""Static checks of the Docker stack: what compose.yaml and compose.builtin.yaml declare.

No daemon needed (fast suite). `docker compose config` / `docker-compose config` also runs when
a compose implementation is installed; the live stack is tested by test_compose_stack.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from plotting._bundle import RESIDENT_DIR
from tests.compose.support import COMPOSE_FILES, EVALUATION_SERVICE, ROOT, load, variables

STACKS = sorted(COMPOSE_FILES)
GATEWAY_PORT = 18080
# The sandbox limits the README documents (both evaluation services must agree).
TIME_LIMIT_S, MEMORY_LIMIT_MIB, PIDS_LIMIT = 10, 384, 64


def services(stack: str) -> dict[str, Any]:
    found = load(stack)["services"]
    assert isinstance(found, dict)
    return found


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run(
            [docker, "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@pytest.mark.parametrize("stack", STACKS)
def test_compose_config_accepts_the_file(stack: str) -> None:
    command = compose_command()
    if command is None:
        pytest.skip("no compose implementation installed (docker compose / docker-compose)")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE_FILES[stack]), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_services(stack: str) -> None:
    assert set(services(stack)) == {"gateway", EVALUATION_SERVICE[stack]}


@pytest.mark.parametrize("stack", STACKS)
def test_only_the_gateway_is_published_and_only_on_loopback(stack: str) -> None:
    for name, service in services(stack).items():
        if name != "gateway":
            assert "ports" not in service, f"{name} must not be published"
    assert services(stack)["gateway"]["ports"] == [f"127.0.0.1:{GATEWAY_PORT}:18080"]
    changed = load(stack, {"GATEWAY_PORT": "28080"})["services"]["gateway"]["ports"]
    assert changed == ["127.0.0.1:28080:18080"]


@pytest.mark.parametrize("stack", STACKS)
def test_gateway_is_locked_down(stack: str) -> None:
    gateway = services(stack)["gateway"]
    assert gateway["user"] == "10001:10001"
    assert gateway["read_only"] is True
    assert gateway["cap_drop"] == ["ALL"] and "cap_add" not in gateway
    assert "no-new-privileges:true" in gateway["security_opt"]
    assert not gateway.get("privileged")
    assert gateway["restart"] == "unless-stopped"
    assert gateway["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert gateway["healthcheck"]["test"] == ["CMD", "python", "/app/healthcheck.py", "gateway"]
    assert "/readyz" in (ROOT / "docker/healthcheck.py").read_text()


@pytest.mark.parametrize("stack", STACKS)
def test_gateway_talks_to_the_evaluation_service_once_healthy(stack: str) -> None:
    gateway = services(stack)["gateway"]
    evaluation = EVALUATION_SERVICE[stack]
    assert gateway["environment"]["SNEKBOX_URL"] == f"http://{evaluation}:8060"
    assert gateway["depends_on"] == {evaluation: {"condition": "service_healthy"}}
    allowed = gateway["environment"]["MCP_ALLOWED_HOSTS"].split(",")
    assert {"127.0.0.1:*", "localhost:*"} <= set(allowed)


def test_both_stacks_run_the_same_gateway() -> None:
    def comparable(stack: str) -> dict[str, Any]:
        gateway = dict(services(stack)["gateway"])
        gateway["environment"] = dict(gateway["environment"])
        del gateway["environment"]["SNEKBOX_URL"], gateway["depends_on"]
        return gateway

    assert comparable("snekbox") == comparable("builtin")


@pytest.mark.parametrize("stack", STACKS)
def test_networks(stack: str) -> None:
    data = load(stack)
    assert data["networks"]["sandbox"] == {"internal": True}
    assert services(stack)["gateway"]["networks"] == ["frontend", "sandbox"]
    assert services(stack)[EVALUATION_SERVICE[stack]]["networks"] == ["sandbox"]


@pytest.mark.parametrize("stack", STACKS)
def test_evaluation_service_has_a_real_evaluation_as_healthcheck(stack: str) -> None:
    service = services(stack)[EVALUATION_SERVICE[stack]]
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and test[-1] == "evaluator" and test[-2].endswith("healthcheck.py")
    script = (ROOT / "docker/healthcheck.py").read_text()
    assert "/eval" in script and "print(6 * 7)" in script
    assert service["restart"] == "unless-stopped"
    assert service["ipc"] == "none"


def test_real_snekbox_runs_with_our_config_and_packages() -> None:
    snekbox = services("snekbox")["snekbox"]
    assert snekbox["volumes"] == ["./docker/snekbox/snekbox.cfg:/snekbox/config/snekbox.cfg:ro"]
    assert snekbox["build"]["args"]["SNEKBOX_IMAGE"].startswith("ghcr.io/python-discord/snekbox")
    dockerfile = (ROOT / "docker/snekbox/Dockerfile").read_text()
    assert "PYTHONUSERBASE=/snekbox/user_base" in dockerfile
    assert "-m pip install --user" in dockerfile
    # The prelude kept resident where _boot.py looks, in the user base every sandbox binds.
    assert snekbox["build"] == {
        "context": ".",
        "dockerfile": "docker/snekbox/Dockerfile",
        "args": snekbox["build"]["args"],
    }
    assert f"/tmp/plotting/_bundle.py {RESIDENT_DIR} " in dockerfile
    assert RESIDENT_DIR.startswith("/snekbox/user_base/")
    wanted = {"numpy", "matplotlib", "pandas", "scipy", "sympy"}
    requirements = (ROOT / "docker/snekbox/requirements.txt").read_text()
    listed = {
        re.split(r"[<>=!~ ]", line)[0]
        for line in requirements.splitlines()
        if line and not line.startswith("#")
    }
    assert wanted <= listed


#: What NsJail and Snekbox need of the container (compose.yaml says why for each; .ci/compose-test
#: runs every limit under exactly this).
SNEKBOX_CAPABILITIES = {"SYS_ADMIN", "SETUID", "SETGID"}


def test_real_snekbox_gets_the_least_set_not_a_privileged_container() -> None:
    snekbox = services("snekbox")["snekbox"]
    assert not snekbox.get("privileged")
    assert snekbox["cap_drop"] == ["ALL"]
    assert set(snekbox["cap_add"]) == SNEKBOX_CAPABILITIES
    assert sorted(snekbox["security_opt"]) == sorted(
        ["no-new-privileges:true", "seccomp=docker/snekbox/seccomp.json", "apparmor=unconfined"]
    )
    assert snekbox["init"] is True
    # The cgroups NsJail limits become writable at start (CAP_SYS_ADMIN), then Snekbox runs.
    dockerfile = (ROOT / "docker/snekbox/Dockerfile").read_text()
    assert 'ENTRYPOINT ["/snekbox/entrypoint.sh"]' in dockerfile
    entrypoint = (ROOT / "docker/snekbox/entrypoint.sh").read_text()
    assert "mount -o remount,bind,rw" in entrypoint and 'exec gunicorn "$@"' in entrypoint
    assert (ROOT / "docker/snekbox/entrypoint.sh").stat().st_mode & 0o111


def test_upstreams_privileged_way_is_one_override_away() -> None:
    text = (ROOT / "compose.snekbox-privileged.yaml").read_text()
    assert re.search(r"^  snekbox:\n    privileged: true$", text, re.MULTILINE)
    for reset in ("cap_drop: !reset []", "cap_add: !reset []", "security_opt: !reset []"):
        assert reset in text
    command = compose_command()
    if command is None or "docker-compose" in command[0]:
        return  # `!reset` needs Compose v2.24 or newer
    result = subprocess.run(
        [*command, "-f", "compose.yaml", "-f", "compose.snekbox-privileged.yaml", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)["services"]["snekbox"]
    assert merged["privileged"] is True
    assert not merged.get("cap_drop") and not merged.get("security_opt")


def denied_calls(profile: str) -> set[str]:
    data = json.loads((ROOT / profile).read_text())
    assert data["defaultAction"] == "SCMP_ACT_ALLOW"
    return {
        name
        for rule in data["syscalls"]
        for name in rule["names"]
        if rule["action"] == "SCMP_ACT_ERRNO"
    }


def test_real_snekbox_seccomp_profile() -> None:
    """NsJail's needs stay allowed (pivot_root is what Docker's default refuses); the kernel
    attack surface the built-in evaluator's profile denies is denied here too."""
    denied = denied_calls("docker/snekbox/seccomp.json")
    assert not denied & {"unshare", "clone", "clone3", "mount", "umount2", "pivot_root", "setns"}
    assert denied_calls("docker/evaluator-seccomp.json") <= denied


def test_snekbox_config_binds_the_interpreter_it_runs() -> None:
    """Snekbox runs /snekbin/python/default/bin/python; /snekbin/python/default is a link to
    /usr/local in its image, so the jail needs /usr/local/bin/python itself (upstream's config
    binds it too)."""
    cfg = (ROOT / "docker/snekbox/snekbox.cfg").read_text()
    binds = {
        (re.search(r'src: "([^"]+)"', m) or [None, None])[1]
        for m in re.findall(r"mount \{(.*?)\}", cfg, re.DOTALL)
    }
    assert {"/usr/local/bin/python", "/snekbin", "/snekbox/user_base", "/usr/lib"} <= binds


def test_snekbox_from_source_pins_upstreams_commits() -> None:
    dockerfile = (ROOT / "docker/snekbox/source.Dockerfile").read_text()
    pins = dict(re.findall(r"^ARG (\w+_SHA256)=([0-9a-f]{64})$", dockerfile, re.MULTILINE))
    assert set(pins) == {"NSJAIL_SHA256", "KAFEL_SHA256", "SNEKBOX_SHA256"}
    assert "dccf911fd2659e7b08ce9507c25b2b38ec2c5800" in dockerfile  # upstream's NsJail pin
    assert "ln -s /usr/local /snekbin/python/default" in dockerfile
    vendor = ROOT.parent / "shared" / "vendor"
    if not vendor.is_dir():
        return  # the tarballs are not on this machine: .ci/compose-test says so
    for name, pin in pins.items():
        (tarball,) = vendor.glob(f"{name.split('_')[0].lower()}-*.tar.gz")
        assert hashlib.sha256(tarball.read_bytes()).hexdigest() == pin, tarball


def test_builtin_evaluator_gets_no_privilege_beyond_what_bubblewrap_needs() -> None:
    evaluator = services("builtin")["evaluator"]
    assert not evaluator.get("privileged")
    assert evaluator["user"] == "10001:10001"
    assert evaluator["read_only"] is True
    assert evaluator["cap_drop"] == ["ALL"] and "cap_add" not in evaluator
    assert sorted(evaluator["security_opt"]) == sorted(
        [
            "no-new-privileges:true",
            "seccomp=docker/evaluator-seccomp.json",
            "systempaths=unconfined",
        ]
    )
    assert "pids_limit" in evaluator and "mem_limit" in evaluator
    profile = json.loads((ROOT / "docker/evaluator-seccomp.json").read_text())
    denied = {
        name
        for rule in profile["syscalls"]
        for name in rule["names"]
        if rule["action"] == "SCMP_ACT_ERRNO"
    }
    # bubblewrap's needs stay allowed, the kernel attack surface it does not need is denied.
    assert not denied & {"unshare", "clone", "clone3", "mount", "umount2", "pivot_root", "setns"}
    assert {
        "bpf",
        "keyctl",
        "ptrace",
        "userfaultfd",
        "io_uring_setup",
        "kexec_load",
        "init_module",
        "perf_event_open",
        "open_by_handle_at",
    } <= denied


def test_the_evaluator_that_has_no_route_out_installs_no_packages() -> None:
    assert load("builtin")["networks"]["sandbox"]["internal"] is True
    assert services("builtin")["evaluator"]["environment"]["EVALUATOR_PACKAGES"] == "off"


def test_sandbox_limits_agree_between_the_two_evaluation_services() -> None:
    env = services("builtin")["evaluator"]["environment"]
    assert (
        int(env["EVALUATOR_TIME_LIMIT"]),
        int(env["EVALUATOR_MEMORY_LIMIT"]),
        int(env["EVALUATOR_PIDS_LIMIT"]),
    ) == (TIME_LIMIT_S, MEMORY_LIMIT_MIB, PIDS_LIMIT)
    cfg = (ROOT / "docker/snekbox/snekbox.cfg").read_text()

    def value(key: str) -> str:
        found = re.search(rf"^{key}: (\S+)$", cfg, re.MULTILINE)
        assert found, key
        return found.group(1)

    assert int(value("time_limit")) == TIME_LIMIT_S
    assert int(value("cgroup_mem_max")) == MEMORY_LIMIT_MIB * 1024 * 1024
    assert int(value("cgroup_mem_swap_max")) == 0
    assert int(value("cgroup_pids_max")) == PIDS_LIMIT
    for kept in ("clone_newnet", "clone_newuser", "clone_newpid", "iface_no_lo"):
        assert value(kept) == "true", kept
    # Read-only file system: every bind mount is rw: false (only tmpfs are writable).
    binds = re.findall(r"mount \{(.*?)\}", cfg, re.DOTALL)
    for bind in binds:
        if "is_bind: true" in bind:
            assert "rw: false" in bind, bind


def test_env_example_documents_every_variable() -> None:
    used = set()
    for path in COMPOSE_FILES.values():
        used |= variables(path.read_text())
    example = (ROOT / "docker/env.example").read_text()
    documented = set(re.findall(r"^([A-Z0-9_]+)=", example, re.MULTILINE))
    assert used == documented


def test_dockerfile_base_image_argument_and_non_root_gateway() -> None:
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in dockerfile
    gateway_stage = dockerfile.split("AS gateway", 1)[1]
    assert "USER 10001:10001" in gateway_stage


def test_the_image_holds_every_package_the_wheel_does() -> None:
    """A package added to the project (serving/, say) must reach the image too: the build
    context lets it through and the builder copies it before installing the project."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    included = re.search(
        r"\[tool\.hatch\.build\.targets\.wheel\].*?\ninclude = \[(.*?)\]", pyproject, re.S
    )
    assert included is not None
    packages = [p.strip().strip('"/') for p in included[1].split(",") if p.strip()]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    for package in packages:
        name = package if package.endswith(".py") else f"{package}/"
        assert f"COPY {name} " in dockerfile, package
        assert f"!{name}" in allowed, package
