"""The running stack the compose test started (.ci/compose-test), as the live tests see it.

Environment (set by .ci/compose-test; without COMPOSE_TEST_URL every live test is skipped):
COMPOSE_TEST_URL, COMPOSE_TEST_URL_B (the two gateways' published ports), COMPOSE_TEST_STACK
("builtin": compose.builtin.yaml; "snekbox": compose.yaml, the real Snekbox),
COMPOSE_TEST_REPLICAS, COMPOSE_TEST_TIME_LIMIT (the evaluator's limit, seconds),
COMPOSE_TEST_PROJECT (the compose project, to find and kill replicas), COMPOSE_TEST_DOCKER.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from typing import Any

import anyio

from tests.compose.support import EVALUATION_SERVICE
from tests.support import connect, text_of

URL = os.environ.get("COMPOSE_TEST_URL", "").rstrip("/")
URL_B = os.environ.get("COMPOSE_TEST_URL_B", "").rstrip("/")
STACK = os.environ.get("COMPOSE_TEST_STACK", "builtin")
REPLICAS = int(os.environ.get("COMPOSE_TEST_REPLICAS", "1"))
TIME_LIMIT = float(os.environ.get("COMPOSE_TEST_TIME_LIMIT", "10"))
PROJECT = os.environ.get("COMPOSE_TEST_PROJECT", "")
DOCKER = os.environ.get("COMPOSE_TEST_DOCKER", "docker")
SERVICE = EVALUATION_SERVICE.get(STACK, "evaluator")

NO_STACK = (
    "no Docker stack: COMPOSE_TEST_URL is unset (run .ci/compose-test to build and start it; "
    "the fast suite needs no daemon)"
)


async def call(transport: str, code: str, limit: float = 90, url: str = "", **arguments: Any):  # type: ignore[no-untyped-def]
    with anyio.fail_after(limit):
        async with connect(url or URL, transport) as client:
            return await client.call_tool("execute_python_code", {"code": code, **arguments})


def docker(*args: str, stdin: str | None = None) -> str:
    """What a docker command printed, stdout then stderr (`docker logs` gives both)."""
    done = subprocess.run(
        [DOCKER, *args], input=stdin, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout + done.stderr


def replica_containers(service: str = SERVICE) -> list[str]:
    """The names of the running containers of ``service`` (the evaluation service's)."""
    assert PROJECT, "COMPOSE_TEST_PROJECT is unset"
    names = docker(
        "ps",
        "--filter",
        f"label=com.docker.compose.project={PROJECT}",
        "--filter",
        f"label=com.docker.compose.service={service}",
        "--format",
        "{{.Names}}",
    )
    return sorted(names.split())


# --- Which replica ran a call ---------------------------------------------------------------------
# The built-in evaluator's sandbox keeps its container's host name. Snekbox's does not (NsJail
# names every run "snekbox"), but Snekbox logs the path of each file a request sends: a call
# sends an empty file named after a fresh marker, and the replica whose log holds it ran it.

WHERE = "import socket\nprint(socket.gethostname())"


def marked() -> tuple[str, dict[str, Any]]:
    """A marker and the arguments of a call that carries it."""
    marker = f"replica-marker-{uuid.uuid4().hex}.txt"
    return marker, {"files": [{"path": marker, "content": ""}]}


async def where(url: str = "", limit: float = 120) -> str:
    """Run one call; what names the replica that ran it (see :func:`replicas_of`)."""
    marker, arguments = marked()
    result = await call("http", WHERE, limit=limit, url=url, **arguments)
    assert not result.is_error, result
    return text_of(result).splitlines()[0] if STACK == "builtin" else marker


def replicas_of(seen: list[str]) -> list[str]:
    """The replicas that ran the calls :func:`where` returned, in order."""
    if STACK == "builtin":
        return seen
    logs = {name: docker("logs", name) for name in replica_containers()}
    found = []
    for marker in seen:
        holders = [name for name, log in logs.items() if marker in log]
        assert len(holders) == 1, f"{marker} in the logs of {holders}"
        found.append(holders[0])
    return found
