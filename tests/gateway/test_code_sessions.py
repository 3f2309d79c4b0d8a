"""Code sessions through real gateways and real MCP clients: files in, kept, out as resources.

Each test runs against the gateway with its evaluator in-process (live interpreters, see
test_live_sessions.py) and with the evaluator as a separate one-shot ``/eval`` service (as
Snekbox is: the gateway carries the files), over both transports.
"""

from __future__ import annotations

import base64
import functools
import re
import time
from typing import Any

import anyio
import httpx
import pytest
from mcp import MCPError
from mcp.types import (
    BlobResourceContents,
    EmbeddedResource,
    TextResourceContents,
)

from python_mcp_server import Settings
from tests.gateway.conftest import gateway, with_time_limit
from tests.support import call_code, connect, facts, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("transport", ["sse", "http"])]

CSV = "city,temp\nOslo,3\nLima,19\n"


async def test_files_sent_and_written_stay_with_the_session(
    gateway_url: str, transport: str, request: pytest.FixtureRequest
) -> None:
    # In-process, the built-in evaluator keeps a live interpreter; over HTTP (as Snekbox) the
    # gateway carries the files, and variables do not last.
    live = request.node.callspec.params["gateway_url"] == "in-process"
    png = b"\x89PNG\r\n\x1a\n\x00\xff"
    files = [
        {"path": "data/cities.csv", "content": CSV},
        {"path": "raw.bin", "content": base64.b64encode(png).decode(), "encoding": "base64"},
    ]
    write = (
        "import pandas as pd\nlabel = 'first'\npd.read_csv('data/cities.csv').to_pickle('df.pkl')"
    )
    async with connect(gateway_url, transport) as client:
        first = facts(await call_code(client, write, files=files))
        session_id = first["session_id"]
        assert isinstance(session_id, str) and len(session_id) >= 22
        assert f'[session_id: "{session_id}"' in text_of(
            await call_code(client, "1", session_id=session_id)
        )
        assert [f["path"] for f in first["files"]] == ["df.pkl"]
        read = (
            f"import pandas as pd\nprint(open('raw.bin', 'rb').read() == {png!r})\n"
            "print(pd.read_pickle('df.pkl').temp.sum())\nprint('label' in globals())"
        )
        second = facts(await call_code(client, read, session_id=session_id))
        assert second["stdout"] == f"True\n22\n{live}\n"  # files kept; variables if live
        assert second["session_id"] == session_id
        # Another session sees none of it.
        listing = "import os\nsorted(f for f in os.listdir() if not f.startswith('.'))"
        other = facts(await call_code(client, listing))
        assert other["session_id"] != session_id and other["stdout"] == "[]\n"


async def test_written_files_are_resources_while_the_session_lives(
    gateway_url: str, transport: str
) -> None:
    code = (
        "import os\nopen('notes.txt', 'w').write('héllo')\n"
        "open('blob.dat', 'wb').write(bytes(range(256)))\n"
        "os.mkdir('sub dir')\nopen('sub dir/é 100%#?.txt', 'w').write('odd name')\n"
        # A name the SDK's default checks take for a Windows drive: a file all the same.
        "open('C:x', 'w').write('drive')"
    )
    async with connect(gateway_url, transport) as client:
        result = facts(await call_code(client, code))
        written = {f["path"]: f for f in result["files"]}
        odd_names = {"sub dir/é 100%#?.txt": "odd name", "C:x": "drive"}
        assert set(written) == {"notes.txt", "blob.dat", *odd_names}
        for name, expected in odd_names.items():
            odd = await client.read_resource(written[name]["uri"])
            (content,) = odd.contents
            assert isinstance(content, TextResourceContents) and content.text == expected
        assert written["notes.txt"]["mime_type"] == "text/plain"
        assert written["notes.txt"]["size"] == len("héllo".encode())
        text = await client.read_resource(written["notes.txt"]["uri"])
        (content,) = text.contents
        assert isinstance(content, TextResourceContents) and content.text == "héllo"
        blob = await client.read_resource(written["blob.dat"]["uri"])
        (content,) = blob.contents
        assert isinstance(content, BlobResourceContents)
        assert base64.b64decode(content.blob) == bytes(range(256))
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == [
            "session://{session_id}/{+path}"
        ]
        session_id = result["session_id"]
        with pytest.raises(MCPError, match="has no file"):
            await client.read_resource(f"session://{session_id}/absent.txt")
        with pytest.raises(MCPError, match="does not exist") as unknown:
            await client.read_resource("session://not-a-session/notes.txt")
        # Not found (-32602, as an absent file), worded for a read: no code was to run.
        assert unknown.value.code == -32602
        assert unknown.value.message.endswith(": its files are gone.")
        ended = await client.call_tool("end_session", {"session_id": session_id})
        assert not ended.is_error and "ended" in text_of(ended)
        with pytest.raises(MCPError, match="was ended on purpose: its files are gone"):
            await client.read_resource(written["notes.txt"]["uri"])


async def test_small_text_files_written_come_inline_as_resources(
    gateway_url: str, transport: str
) -> None:
    """Only small, whole, plain-text files the session kept: each embedded resource is what
    resources/read gives for its uri."""
    code = (
        "open('small.csv', 'w').write('city,temp\\nOslo,3\\n')\n"
        "open('big.txt', 'w').write('x' * 5000)\n"
        "open('blob.dat', 'wb').write(bytes(range(256)))\n"
        "open('control.txt', 'w').write('\\x1b[31mred')\n"
        "open('empty.txt', 'w')"
    )
    async with connect(gateway_url, transport) as client:
        result = await call_code(client, code)
        uris = {f["path"]: f["uri"] for f in facts(result)["files"]}
        assert set(uris) == {"small.csv", "big.txt", "blob.dat", "control.txt", "empty.txt"}
        embedded = [block for block in result.content if isinstance(block, EmbeddedResource)]
        assert [block.resource.uri for block in embedded] == [uris["small.csv"]]
        (inline,) = embedded
        assert isinstance(inline.resource, TextResourceContents)
        assert inline.resource.text == "city,temp\nOslo,3\n"
        assert inline.resource.mime_type == "text/csv"
        assert '[shown below as resources: "small.csv"]' in text_of(result)
        (read,) = (await client.read_resource(uris["small.csv"])).contents
        assert isinstance(read, TextResourceContents) and read.text == inline.resource.text


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ([{"path": "../escape.txt", "content": "x"}], '"../escape.txt"'),
        ([{"path": "a/../../escape.txt", "content": "x"}], '"a/../../escape.txt"'),
        ([{"path": "/etc/passwd", "content": "x"}], '"/etc/passwd"'),
        ([{"path": "a//b", "content": "x"}], '"a//b"'),
        ([{"path": ".config/x", "content": "x"}], '".config/x"'),
        ([{"path": "a\x00b", "content": "x"}], '"a\\u0000b"'),
        ([{"path": "_mcp_prelude.py", "content": "x"}], '"_mcp_prelude.py"'),
        ([{"path": "", "content": "x"}], "empty path"),
        ([{"path": "a/" * 101 + "x", "content": "x"}], "101 folders deep; at most 100"),
        ([{"path": "x.bin", "content": "not base64!", "encoding": "base64"}], '"x.bin"'),
        ([{"path": "x", "content": "1"}, {"path": "x", "content": "2"}], '"x" is sent twice'),
        ([{"path": "a", "content": "1"}, {"path": "a/b", "content": "2"}], '"a" is sent as'),
        ([{"path": f"f{i}", "content": ""} for i in range(65)], "at most 64"),
        ([{"path": "big", "content": "x" * (3 * 1024 * 1024 + 1)}], "more than 3,145,728"),
    ],
)
async def test_bad_files_are_refused_and_the_code_does_not_run(
    gateway_url: str, transport: str, files: list[dict[str, str]], named: str
) -> None:
    async with connect(gateway_url, transport) as client:
        result = await call_code(client, "open('ran', 'w').close()\nprint('ran')", files=files)
        assert result.is_error
        assert named in text_of(result) and "ran" not in text_of(result).split(":")[0]


async def test_a_session_that_is_gone_is_said_never_replaced(
    gateway_url: str, transport: str
) -> None:
    async with connect(gateway_url, transport) as client:
        unknown = await call_code(client, "print('ran')", session_id="x" * 22)
        assert unknown.is_error and "does not exist" in text_of(unknown)
        assert "Call again without session_id" in text_of(unknown)
        hostile = await call_code(client, "print('ran')", session_id="\x1b[2J" + "y" * 100_000)
        assert hostile.is_error and "does not exist" in text_of(hostile)
        assert len(text_of(hostile)) < 1000 and "\x1b" not in text_of(hostile)
        session_id = facts(await call_code(client, "1"))["session_id"]
        await client.call_tool("end_session", {"session_id": session_id})
        ended = await call_code(client, "print('ran')", session_id=session_id)
        assert ended.is_error and "was ended on purpose" in text_of(ended)
        again = await client.call_tool("end_session", {"session_id": session_id})
        assert again.is_error
        assert text_of(again).endswith("was ended on purpose: there is nothing to end.")


@pytest.fixture(scope="module", params=["in-process", "over-http"])
def small_gateway(request: pytest.FixtureRequest, settings: Settings) -> Any:
    """At most two sessions of 64 KiB. Idle sessions last 10 minutes: a session start on a
    loaded machine can take seconds, and eviction must not race expiry. Its time limit no
    call meant to finish comes near; those meant to be stopped ask for less."""
    small = with_time_limit(settings, 30.0).model_copy(
        update={
            "max_code_sessions": 2,
            "code_session_idle_timeout": 600,
            "max_session_bytes": 64 * 1024,
        }
    )
    with gateway(small, request.param) as url:
        yield url


@pytest.fixture(scope="module", params=["in-process", "over-http"])
def expiring_gateway(request: pytest.FixtureRequest, settings: Settings) -> Any:
    """Sessions idle for at most 1.5 s."""
    with gateway(
        settings.model_copy(update={"code_session_idle_timeout": 1.5}), request.param
    ) as url:
        yield url


async def _session_metric(url: str, name: str) -> float:
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{url}/metrics")).text
    assert re.search(r"^mcp_code_sessions_open \d", metrics, re.M)
    found = re.search(rf"^mcp_code_sessions_{re.escape(name)} (\S+)$", metrics, re.M)
    return float(found[1]) if found else 0.0


async def test_the_longest_idle_session_is_evicted_at_the_cap(
    small_gateway: str, transport: str
) -> None:
    async with connect(small_gateway, transport) as client:
        first = facts(await call_code(client, "1"))["session_id"]
        second = facts(await call_code(client, "1"))["session_id"]
        await call_code(client, "1", session_id=first)  # now second is the longest idle
        third = facts(await call_code(client, "1"))["session_id"]
        evicted = await call_code(client, "1", session_id=second)
        assert evicted.is_error and "to make room" in text_of(evicted)
        facts(await call_code(client, "1", session_id=third))
        facts(await call_code(client, "1", session_id=first))
    assert await _session_metric(small_gateway, 'closed_total{why="evicted"}') >= 1
    assert await _session_metric(small_gateway, "created_total") >= 3


async def _calls_under_way(url: str, count: int) -> None:
    """Return once ``count`` calls hold their sessions (running, or waiting for a slot)."""
    with anyio.fail_after(60):
        while True:
            under_way = sum(
                [
                    await _metric(url, "mcp_evaluations_in_flight"),
                    await _metric(url, "mcp_evaluations_waiting"),
                ]
            )
            if under_way >= count:
                return
            await anyio.sleep(0.05)


async def _metric(url: str, name: str) -> float:
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{url}/metrics")).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
    assert found, name
    return float(found[1])


async def test_a_session_whose_call_runs_is_never_evicted(
    small_gateway: str, transport: str
) -> None:
    """At the cap, the longest idle session makes room, not a longer unused one that is
    running a call; when every session is running one, a new session waits for one to end."""
    slow = "import time\ntime.sleep(60)"
    async with connect(small_gateway, transport) as client:
        running = facts(await call_code(client, "1"))["session_id"]
        idle = facts(await call_code(client, "1"))["session_id"]
        results: dict[str, Any] = {}

        async def call(name: str, session_id: str) -> None:
            results[name] = await call_code(client, slow, session_id=session_id, timeout_seconds=5)

        async with anyio.create_task_group() as group:
            group.start_soon(call, "running", running)
            await _calls_under_way(small_gateway, 1)
            facts(await call_code(client, "1", session_id=idle))  # the running one is older now
            third = facts(await call_code(client, "1"))["session_id"]
            evicted = await call_code(client, "1", session_id=idle)
            # Only then is the call ended (cancelled): it ran all along, its session kept.
            group.cancel_scope.cancel()
        assert "running" not in results
        assert evicted.is_error and "to make room" in text_of(evicted)
        # Where code outlives its call (issue 29), it went on after the call was left: stopped,
        # the session goes on. A one-shot service ended it with the call.
        with anyio.fail_after(60):
            stopped = await client.call_tool("interrupt", {"session_id": running})
        if "runs each call to its end" not in text_of(stopped):
            assert facts(stopped)["status"] in ("interrupted", "killed"), text_of(stopped)
        facts(await call_code(client, "1", session_id=running))

        async with anyio.create_task_group() as group:
            group.start_soon(call, "first", running)
            group.start_soon(call, "second", third)
            await _calls_under_way(small_gateway, 2)
            waited = await call_code(client, "print('ran')")  # until one ends (5 s limit)
        assert facts(waited)["stdout"] == "ran\n"
        assert all("time limit" in text_of(results[name]) for name in ("first", "second"))
        closed = [await call_code(client, "1", session_id=s) for s in (running, third)]
        assert sum("to make room" in text_of(result) for result in closed) == 1


@pytest.mark.parametrize(("waiting", "why"), [(1, "none ended it within 0.5 s"), (0, "0 calls")])
async def test_a_new_session_waits_for_room_within_the_bounds(
    settings: Settings, transport: str, waiting: int, why: str
) -> None:
    """Every session running a call, a new one waits at most MCP_MAX_WAIT among
    MCP_MAX_WAITING, then is refused, said why; nothing of it runs."""
    bounded = settings.model_copy(
        update={"max_code_sessions": 1, "max_wait": 0.5, "max_waiting": waiting}
    )
    with gateway(bounded, "in-process") as url:
        async with connect(url, transport) as client, anyio.create_task_group() as group:
            session_id = facts(await call_code(client, "1"))["session_id"]
            slow = functools.partial(call_code, client, "import time; time.sleep(60)")
            group.start_soon(functools.partial(slow, session_id=session_id))
            await _calls_under_way(url, 1)
            started = time.monotonic()
            refused = await call_code(client, "open('ran', 'w')")
            assert time.monotonic() - started >= 0.5 * waiting
            group.cancel_scope.cancel()
    assert refused.is_error and "All 1 sessions" in text_of(refused)
    assert why in text_of(refused), text_of(refused)


async def test_an_idle_session_expires(expiring_gateway: str, transport: str) -> None:
    async with connect(expiring_gateway, transport) as client:
        session_id = facts(await call_code(client, "1"))["session_id"]
        started = time.monotonic()
        await anyio.sleep(1.6)
        expired = await call_code(client, "1", session_id=session_id)
        assert time.monotonic() - started >= 1.5
        assert expired.is_error and "expired after" in text_of(expired)
    assert await _session_metric(expiring_gateway, 'closed_total{why="expired"}') >= 1


async def test_timeout_seconds_is_the_calls_limit_up_to_the_maximum(
    small_gateway: str, transport: str
) -> None:
    # The code reports how long it has run, by its own clock, which starts after the call's:
    # stopped at the call's 1 s (the interrupt may come late on a loaded host), it never
    # reports near the service's own limit (30 s). It may be stopped before its first line.
    spin = (
        "import time\nstart = time.monotonic()\nwhile True:\n"
        "    print(f'{time.monotonic() - start:.3f}', flush=True)\n    time.sleep(0.02)"
    )
    async with connect(small_gateway, transport) as client:
        result = await call_code(client, spin, timeout_seconds=1)
        assert "time limit" in text_of(result), text_of(result)
        stdout = facts(result)["stdout"]
        reported = [float(line) for line in re.findall(r"^\d+\.\d{3}$", stdout, re.MULTILINE)]
        assert max(reported, default=0.0) < 10, reported
        lowered = facts(await call_code(client, "print('ok')", timeout_seconds=10**6))
        assert lowered["stdout"] == "ok\n"
        assert "timeout_seconds 1e+06 is above the maximum" in text_of(
            await call_code(client, "1", timeout_seconds=10**6)
        )


async def test_concurrent_sessions_do_not_see_each_other(gateway_url: str, transport: str) -> None:
    async with connect(gateway_url, transport) as client:
        ids: dict[int, str] = {}

        async def one(n: int) -> None:
            result = facts(await call_code(client, f"open('same.txt', 'w').write('{n}')"))
            ids[n] = result["session_id"]

        async with anyio.create_task_group() as group:
            for n in range(4):
                group.start_soon(one, n)
        for n, session_id in ids.items():
            result = facts(
                await call_code(client, "open('same.txt').read()", session_id=session_id)
            )
            assert result["stdout"] == f"'{n}'\n"


async def test_a_session_holds_a_bounded_amount_of_files(
    small_gateway: str, transport: str, request: pytest.FixtureRequest
) -> None:
    live = request.node.callspec.params["small_gateway"] == "in-process"
    async with connect(small_gateway, transport) as client:
        files = [{"path": "a.txt", "content": "a" * 40_000}]
        first = facts(await call_code(client, "print('ran')", files=files))
        session = {"session_id": first["session_id"]}
        more = [{"path": "b.txt", "content": "b" * 40_000}]
        refused = await call_code(client, "print('ran')", files=more, **session)
        assert refused.is_error and "may hold 65,536" in text_of(refused)
        same = facts(
            await call_code(client, "print(len(open('a.txt').read()))", files=files, **session)
        )
        assert same["stdout"] == "40000\n"  # a file sent again replaces itself
        big = "open('big.bin', 'wb').write(b'x' * 100_000);\nopen('small.txt', 'w').write('s');"
        written = facts(await call_code(client, big, **session))
        uris = {f["path"]: f["uri"] for f in written["files"]}
        assert uris["big.bin"] is None and uris["small.txt"] is not None
        assert "not kept by the gateway" in text_of(await call_code(client, big, **session))
        # A live interpreter's directory still has it; a one-shot run gets only what is kept.
        gone = facts(await call_code(client, "import os\nos.path.exists('big.bin')", **session))
        assert gone["stdout"] == f"{live}\n"


async def test_the_names_of_a_sessions_files_take_its_room_too(
    small_gateway: str, transport: str
) -> None:
    """Empty files with long names fill a session's 64 KiB as well: else code could have the
    gateway keep thousands of names, in memory, at no cost."""
    deep = "/".join(chr(ord("a") + level) * 250 for level in range(10))
    code = (
        f"import os\nos.makedirs({deep!r})\n"
        f"for i in range(30):\n    open(f'{deep}/{{i:02}}' + 'f' * 200, 'w').close()"
    )
    name = len(f"{deep}/00" + "f" * 200)  # 2,712 bytes: 24 fit
    async with connect(small_gateway, transport) as client:
        result = await call_code(client, code)
    written = facts(result)["files"]
    dropped = [f for f in written if f["uri"] is None]
    assert (len(written), len(dropped)) == (30, 30 - 65_536 // name)
    assert "not kept by the gateway" in text_of(result)


async def test_calls_queued_on_a_session_share_its_room(small_gateway: str, transport: str) -> None:
    """Room is counted once the call's turn comes: two calls queued together cannot both
    bring files that fit only one at a time."""
    async with connect(small_gateway, transport) as client:
        session = {"session_id": facts(await call_code(client, "x = 1"))["session_id"]}
        files = [[{"path": f"{name}.txt", "content": name * 40_000}] for name in "ab"]
        results: list[Any] = [None, None]

        async def call(index: int, code: str) -> None:
            results[index] = await call_code(client, code, files=files[index], **session)

        async with anyio.create_task_group() as group:
            group.start_soon(call, 0, "import time; time.sleep(2)")
            await anyio.sleep(0.3)  # most often, its turn taken
            group.start_soon(call, 1, "print('ran')")
    # One ran, the other was refused (which came first is the machine's to decide).
    refused = [r for r in results if r.is_error]
    ran = [r for r in results if not r.is_error]
    assert len(refused) == 1 and "may hold 65,536" in text_of(refused[0])
    assert len(ran) == 1 and facts(ran[0])["status"] == "ok"


async def test_a_session_keeps_only_the_files_that_are_there(
    gateway_url: str, transport: str
) -> None:
    """A file sent with a call that never wrote it is not kept; nor a file the code replaced
    with a folder: the session's later runs (a new interpreter's, or every one-shot run) are
    then given its files without a file where a folder must be."""
    async with connect(gateway_url, transport) as client:
        first = facts(
            await call_code(
                client,
                "import os\nos.makedirs('e/f')\nopen('e/f/g', 'w')\nopen('d', 'w').write('file')",
            )
        )
        session = {"session_id": first["session_id"]}
        unwritable = [{"path": "e", "content": "a file where a folder is"}]
        refused = await call_code(client, "print('ran')", files=unwritable, **session)
        assert facts(refused)["status"] == "not_run"
        assert "Failed to create file 'e'" in text_of(refused)
        with pytest.raises(MCPError, match="has no file"):
            await client.read_resource(f"session://{session['session_id']}/e")
        into_folder = "import os\nos.remove('d')\nos.mkdir('d')\nopen('d/x', 'w').write('inside')"
        assert facts(await call_code(client, into_folder, **session))["status"] == "ok"
        with pytest.raises(MCPError, match="has no file"):
            await client.read_resource(f"session://{session['session_id']}/d")
        await call_code(client, "import os; os._exit(0)", **session)  # a new interpreter next
        after = facts(await call_code(client, "print(open('d/x').read())", **session))
        assert (after["status"], after["stdout"]) == ("ok", "inside\n")


async def test_a_file_the_code_removes_leaves_the_session(
    small_gateway: str, transport: str
) -> None:
    """Its room is free again, it cannot be read, and no later run is given it back."""
    async with connect(small_gateway, transport) as client:
        first = facts(await call_code(client, "open('a.bin', 'wb').write(b'a' * 40_000)"))
        session = {"session_id": first["session_id"]}
        swap = "import os\nos.remove('a.bin')\nopen('b.bin', 'wb').write(b'b' * 40_000)"
        second = facts(await call_code(client, swap, **session))
        assert {f["path"]: f["uri"] is not None for f in second["files"]} == {"b.bin": True}
        with pytest.raises(MCPError, match="has no file"):
            await client.read_resource(f"session://{session['session_id']}/a.bin")
        await call_code(client, "import os; os._exit(0)", **session)  # a new interpreter next
        listing = "import os\nprint(sorted(f for f in os.listdir() if not f.startswith('.')))"
        after = facts(await call_code(client, listing, **session))
        assert after["stdout"] == "['b.bin']\n"


async def test_the_largest_binary_upload_fits_in_a_request(
    gateway_url: str, transport: str
) -> None:
    """MCP_MAX_UPLOAD_BYTES of binary content is 4/3 as many bytes of base64: the request
    body's bound leaves room for it, so the advertised size is what a client can send."""
    content = bytes(range(256)) * (3 * 1024 * 1024 // 256)
    files = [
        {"path": "big.bin", "content": base64.b64encode(content).decode(), "encoding": "base64"}
    ]
    async with connect(gateway_url, transport) as client:
        result = facts(
            await call_code(client, "print(len(open('big.bin', 'rb').read()))", files=files)
        )
    assert result["stdout"] == f"{len(content)}\n"
