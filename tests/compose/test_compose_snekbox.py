"""The real Snekbox's stack (compose.yaml), live: the limits of docker/snekbox/snekbox.cfg, and a
session's files, through the gateway's published port.

Runs when .ci/compose-test has started compose.yaml (COMPOSE_TEST_STACK=snekbox): Snekbox built
from upstream's sources (docker/snekbox/source.Dockerfile), its container given the least set
of capabilities (compose.yaml), three replicas. Its time limit is tested with the built-in
evaluator's in test_compose_stack.py. Each limit is tested on both sides of its value, so a
limit that is not enforced fails the test. And the one change the image makes to Snekbox's
code (docker/snekbox/drain_output.py), on the reader it changes.
"""

from __future__ import annotations

import json
import marshal
import re
from typing import Any

import pytest

import plotting
from snekbox_client import EvalRequest, File
from tests.compose.live import NO_STACK, STACK, URL, call, docker, replica_containers
from tests.support import connect, text_of

pytestmark = [
    pytest.mark.skipif(not URL, reason=NO_STACK),
    pytest.mark.skipif(
        STACK != "snekbox", reason="the real Snekbox's stack is not the one running"
    ),
]

#: docker/snekbox/snekbox.cfg (tests/compose/test_compose_static.py holds it to these).
MEMORY_LIMIT_MIB, PIDS_LIMIT = 384, 64

#: Snekbox's own reader, handed a process that has already exited with its output unread: what
#: happens to a short run when the server's thread looks late (a busy host). Upstream reads
#: nothing (the run's answer was ``returncode: 0``, empty stdout); the image reads it all.
LATE_READER = """
import subprocess, types
from snekbox.nsjail import NsJail
run = subprocess.Popen(["echo", "written"], stdout=subprocess.PIPE, text=True)
run.wait()
limits = types.SimpleNamespace(read_chunk_size=10_000, max_output_size=1_000_000)
print("read:", repr(NsJail._consume_stdout(limits, run)))
"""


#: Posts stdin to the replica's own Snekbox and prints its answer.
POST_EVAL = """
import sys, urllib.request
request = urllib.request.Request(
    "http://127.0.0.1:8060/eval", sys.stdin.buffer.read(), {"Content-Type": "application/json"}
)
print(urllib.request.urlopen(request, timeout=30).read().decode())
"""


def test_the_image_keeps_the_gateways_prelude_resident() -> None:
    """A run sent without the prelude (``resident``, as the gateway sends every run to Snekbox)
    runs the one the image keeps (docker/snekbox/Dockerfile); one of another digest ends before
    its code, as the gateway expects of an image without it."""
    [replica, *_] = replica_containers()

    def run(request: EvalRequest) -> dict[str, Any]:
        body = json.dumps(request.to_json())
        answer: dict[str, Any] = json.loads(
            docker("exec", "-i", replica, "python", "-c", POST_EVAL, stdin=body)
        )
        return answer

    request = plotting.build_request("print(6 * 7)", resident=True)
    assert not plotting.carries_prelude(request) and request.files == ()  # launched
    answer = run(request)
    assert (answer["returncode"], answer["stdout"]) == (0, "42\n"), answer
    digest = plotting.prelude_digest()
    launched = [arg.replace(digest, bytes(16).hex()) for arg in request.args or ()]
    boot, bundle = plotting.prelude_files(b"print(6 * 7)", resident=True)
    head = marshal.loads(bundle.content)
    other = marshal.dumps((*head[:5], bytes(16)), 4)  # another prelude's digest
    for missing in (
        run(EvalRequest(args=launched)),
        run(EvalRequest(args=[boot.path], files=[boot, File(bundle.path, other)])),
    ):
        assert missing["returncode"] == 121 and "nor resident" in missing["stdout"], missing


@pytest.mark.anyio
async def test_the_gateway_finds_the_prelude_resident_in_the_image() -> None:
    """The gateway's runs go without the prelude: the image keeps its very digest (built from
    the same checkout), so no run finds it missing and the gateway never says so."""
    for _ in range(3):  # one on each replica, most likely
        result = await call("http", "print(6 * 7)")
        assert result.structured_content["stdout"] == "42\n", text_of(result)
    [gateway] = replica_containers("gateway")
    assert "keeps no resident prelude" not in docker("logs", gateway)


@pytest.mark.anyio
async def test_a_run_starts_with_the_font_list_and_nothing_imported_for_it() -> None:
    """docker/snekbox/usercustomize.py copies the font list the image built into each run's
    fresh home (else matplotlib rebuilds it, for seconds, at a run's first import of it), and
    imports nothing for that: every run, a figure's or not, pays for what it imports."""
    code = (
        "import os, sys\n"
        "print(sorted(set(sys.modules) & {'shutil', 'fnmatch', 'bz2', 'lzma'}))\n"
        "print([n for n in os.listdir(os.environ['MPLCONFIGDIR']) if n.startswith('fontlist')])\n"
        "import matplotlib.font_manager\n"
    )
    result = await call("http", code)
    assert not result.is_error, text_of(result)
    stdout = result.structured_content["stdout"]
    imported, fontlist, *rest = stdout.splitlines()
    assert imported == "[]", stdout
    assert re.fullmatch(r"\['fontlist-v[\w.]+\.json'\]", fontlist), stdout
    assert rest == [], stdout  # no "Matplotlib is building the font cache"


def test_output_is_read_after_nsjail_has_exited() -> None:
    [replica, *_] = replica_containers()
    done = docker(
        "exec", "-w", "/snekbox", "-e", "PYTHONPATH=.", replica, "python", "-c", LATE_READER
    )
    assert "read: 'written\\n'" in done, done


@pytest.mark.anyio
@pytest.mark.parametrize(("mib", "killed"), [(200, False), (2 * MEMORY_LIMIT_MIB, True)])
async def test_the_memory_limit(mib: int, killed: bool) -> None:
    """The run's memory cgroup: 200 MiB are allowed, twice the limit is killed (137), which the
    4 GiB address-space limit alone would allow."""
    code = f"x = bytearray({mib} * 1024 * 1024)\nprint('held', len(x) >> 20, 'MiB')"
    result = await call("http", code)
    assert not result.is_error, "a memory-limit kill is a result, not a tool error"
    facts = result.structured_content
    if killed:
        assert (facts["status"], facts["returncode"]) == ("killed", 137), text_of(result)
        assert "held" not in facts["stdout"]
    else:
        assert (facts["status"], facts["returncode"]) == ("ok", 0), text_of(result)
        assert facts["stdout"] == f"held {mib} MiB\n"


@pytest.mark.anyio
async def test_the_process_limit() -> None:
    """The run's pids cgroup: forking stops short of the limit (64 tasks, the interpreter and
    its threads included), where 100 children would otherwise all start."""
    code = (
        "import os, time\n"
        "started = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(5)\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "except OSError as error:\n"
        "    print('refused after', started, error.errno)\n"
        "else:\n"
        "    print('all', started, 'started')\n"
    )
    result = await call("http", code)
    assert not result.is_error, result
    found = re.match(r"refused after (\d+) 11\n", result.structured_content["stdout"])
    assert found, text_of(result)  # EAGAIN
    started = int(found[1])
    print(f"{started} children started, then fork failed with EAGAIN")
    assert PIDS_LIMIT // 2 <= started < PIDS_LIMIT


@pytest.mark.anyio
async def test_no_network() -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('10.0.0.1', 80), timeout=5)\n"
        "except OSError as error:\n"
        "    print('refused', error.errno)\n"
    )
    result = await call("http", code)
    assert not result.is_error, result
    assert result.structured_content["stdout"] == "refused 101\n", text_of(result)  # ENETUNREACH


@pytest.mark.anyio
async def test_a_session_keeps_its_files() -> None:
    """Snekbox runs each call in a fresh sandbox: the gateway sends the session's files (those
    the client sent and those the code wrote) with every call of the session."""
    async with connect(URL, "http") as client:
        first = await client.call_tool(
            "execute_python_code",
            {
                "code": "open('written.txt', 'w').write('by the code')\nprint('first')",
                "files": [{"path": "sent.txt", "content": "by the client"}],
            },
        )
        assert not first.is_error, first
        session_id = first.structured_content["session_id"]
        assert [f["path"] for f in first.structured_content["files"]] == ["written.txt"]
        second = await client.call_tool(
            "execute_python_code",
            {
                "code": "print(open('sent.txt').read(), '|', open('written.txt').read())",
                "session_id": session_id,
            },
        )
        assert not second.is_error, second
        assert second.structured_content["stdout"] == "by the client | by the code\n"
        assert second.structured_content["session_id"] == session_id
