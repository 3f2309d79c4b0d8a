"""Static checks of the Docker stack: what compose.yaml and compose.builtin.yaml declare.

No daemon needed (fast suite). `docker compose config` / `docker-compose config` also runs when
a compose implementation is installed; the live stack is tested by test_compose_stack.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

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


def test_real_snekbox_is_privileged_with_our_config() -> None:
    snekbox = services("snekbox")["snekbox"]
    assert snekbox["privileged"] is True
    assert snekbox["volumes"] == ["./docker/snekbox/snekbox.cfg:/snekbox/config/snekbox.cfg:ro"]
    assert snekbox["build"]["args"]["SNEKBOX_IMAGE"].startswith("ghcr.io/python-discord/snekbox")
    dockerfile = (ROOT / "docker/snekbox/Dockerfile").read_text()
    assert "PYTHONUSERBASE=/snekbox/user_base" in dockerfile
    assert "-m pip install --user" in dockerfile
    wanted = {"numpy", "matplotlib", "pandas", "scipy", "sympy"}
    requirements = (ROOT / "docker/snekbox/requirements.txt").read_text()
    listed = {
        re.split(r"[<>=!~ ]", line)[0]
        for line in requirements.splitlines()
        if line and not line.startswith("#")
    }
    assert wanted <= listed


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
