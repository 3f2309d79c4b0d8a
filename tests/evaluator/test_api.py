"""The HTTP contract: Snekbox's status codes, bodies and defaulting, exactly."""

from __future__ import annotations

import asyncio

import anyio
import httpx
import pytest

import evaluator
from evaluator import Evaluator, create_app

from .conftest import b64, config, run


def test_public_api() -> None:
    assert set(evaluator.__all__) == {
        "Evaluator", "EvaluatorConfig", "EvaluatorError", "InvalidExecutable", "InvalidFile",
        "InProcessClient", "Limit", "QueueFull", "RequestInvalid", "SandboxUnavailable",
        "SessionNotFound", "create_app",
    }  # fmt: skip
    for name in evaluator.__all__:
        assert getattr(evaluator, name).__module__.startswith("evaluator.")


@pytest.mark.parametrize(
    "body",
    [
        {"args": ["-c", "print('output')"]},
        {"input": "print('output')"},
        {"input": "print('output')", "args": ["-c"]},
        {"input": "print('output')", "args": ["", "", "-c"]},  # leading empty args are dropped
        {"args": ["-c", "import sys; print(sys.argv[1:] == ['a'] and 'output')", "a"]},
    ],
)
async def test_valid_requests(client: httpx.AsyncClient, body: dict[str, object]) -> None:
    response = await client.post("/eval", json=body)
    assert response.status_code == 200
    assert response.json() == {
        "stdout": "output\n", "returncode": 0, "files": [], "ended_by": "exit"
    }  # fmt: skip


async def test_input_is_appended_to_args(client: httpx.AsyncClient) -> None:
    result = await run(client, "print(1)", args=["-X", "utf8", "-c"])
    assert result["stdout"] == "1\n"


async def test_script_from_files(client: httpx.AsyncClient) -> None:
    files = [{"path": "pkg/main.py", "content": b64(b"import sys; print(sys.argv)")}]
    response = await client.post("/eval", json={"args": ["pkg/main.py", "x"], "files": files})
    assert response.json()["stdout"] == "['pkg/main.py', 'x']\n"


@pytest.mark.parametrize(
    ("body", "description"),
    [
        ({"stuff": "foo"}, "{'stuff': 'foo'} is not valid under any of the given schemas"),
        ({"args": 400}, "400 is not of type 'array'"),
        ({"args": [], "files": [215]}, "215 is not of type 'object'"),
        ({"input": 1}, "1 is not of type 'string'"),
        ([], "[] is not of type 'object'"),
        ({"args": [], "files": [{}]}, "'path' is a required property"),
        ({"input": "", "time_limit": 0}, "0 is less than or equal to the minimum of 0"),
        ({"input": "", "time_limit": "1"}, "'1' is not of type 'number'"),
    ],
)
async def test_schema_failures(client: httpx.AsyncClient, body: object, description: str) -> None:
    response = await client.post("/eval", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "title": "Request data failed validation",
        "description": description,
    }


async def test_a_time_limit_shorter_than_the_services_is_applied(
    client: httpx.AsyncClient,
) -> None:
    """The code reports how long it has run, by its own clock: killed at 0.5 s, it never
    reports more, where the service's own limit (30 s) would let it go on. Nothing here
    depends on how fast a loaded host starts the sandbox (it may be killed before a line)."""
    spin = (
        "import time\nstart = time.monotonic()\nwhile True:\n"
        "    print(f'{time.monotonic() - start:.3f}', flush=True)\n    time.sleep(0.02)"
    )
    response = await client.post("/eval", json={"input": spin, "time_limit": 0.5})
    body = response.json()
    assert (body["returncode"], body["ended_by"]) == (137, "time_limit")
    assert all(float(line) <= 0.5 for line in body["stdout"].split()), body["stdout"]
    # A longer one than the service's is the service's.
    response = await client.post("/eval", json={"input": "print(1)", "time_limit": 10**6})
    assert response.json()["returncode"] == 0


@pytest.mark.parametrize("path", ["/", "/etc", "/etc/vars/secrets", "/absolute", r"a\0b", r"\0"])
async def test_absolute_and_backslash_zero_paths(client: httpx.AsyncClient, path: str) -> None:
    response = await client.post("/eval", json={"args": ["x.py"], "files": [{"path": path}]})
    assert response.status_code == 400
    assert response.json()["title"] == "Request data failed validation"
    assert "does not match" in response.json()["description"]


@pytest.mark.parametrize(
    "path", ["../secrets", "../../dir", "dir/../../secrets", "dir/var/../../../file", "a\0b"]
)
async def test_traversal_and_nul_paths(client: httpx.AsyncClient, path: str) -> None:
    response = await client.post("/eval", json={"args": ["x.py"], "files": [{"path": path}]})
    assert response.status_code == 400
    assert response.json() == {
        "title": "Request file is invalid",
        "description": f"File path '{path}' may not traverse beyond root",
    }


@pytest.mark.parametrize(
    "path", ["file.txt", "./0.jpg", "folder/../hm", "traversal/but/../not/beyond/../root"]
)
async def test_legal_paths(client: httpx.AsyncClient, path: str) -> None:
    result = await run(client, "print('ok')", files=[{"path": path, "content": b64(b"x")}])
    assert (result["stdout"], result["returncode"]) == ("ok\n", 0)


async def test_bad_base64(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/eval", json={"input": "", "files": [{"path": "a.bin", "content": "a"}]}
    )
    assert response.status_code == 400
    assert response.json() == {
        "title": "Request file is invalid",
        "description": "Invalid base64 encoding for file 'a.bin'",
    }


@pytest.mark.parametrize(
    ("path", "title"),
    [
        ("/nonexistent/python", "executable_path does not exist"),
        ("/etc/hostname", "executable_path does not exist"),  # outside the sandbox's view
        ("/usr/lib/x86_64-linux-gnu", "executable_path is not a file"),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", None),
    ],
)
async def test_executable_path(client: httpx.AsyncClient, path: str, title: str | None) -> None:
    response = await client.post("/eval", json={"input": "", "executable_path": path})
    if title is None:  # libc.so.6 is executable: it prints its version
        assert response.status_code == 200
        return
    assert response.status_code == 400
    assert response.json() == {"title": title}


async def test_executable_path_not_executable(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    prefix = evaluator.config.executable.rsplit("/bin/", 1)[0]
    response = await client.post(
        "/eval", json={"input": "", "executable_path": f"{prefix}/pyvenv.cfg"}
    )
    assert response.json() == {"title": "executable_path is not executable"}


async def test_executable_path_runs_that_interpreter(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    result = await run(
        client, "import sys; print(sys.executable)", executable_path=evaluator.config.executable
    )
    assert result["stdout"] == evaluator.config.executable + "\n"


async def test_unsupported_media_type(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/eval", content="{'input': 'foo'}", headers={"Content-Type": "application/xml"}
    )
    assert response.status_code == 415
    assert response.json() == {
        "title": "415 Unsupported Media Type",
        "description": "application/xml is an unsupported media type.",
    }


@pytest.mark.parametrize(
    ("content", "description"),
    [
        (b"", "Could not parse an empty JSON body"),
        (b"{", "Could not parse JSON body - Expecting property name enclosed in double quotes: "
         "line 1 column 2 (char 1)"),
    ],
)  # fmt: skip
async def test_invalid_json(client: httpx.AsyncClient, content: bytes, description: str) -> None:
    response = await client.post(
        "/eval", content=content, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json() == {"title": "Invalid JSON", "description": description}


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_other_methods(client: httpx.AsyncClient, method: str) -> None:
    response = await client.request(method, "/eval")
    assert response.status_code == 405
    assert response.json() == {"title": "405 Method Not Allowed"}
    assert response.headers["Allow"] == "POST, OPTIONS"


async def test_options(client: httpx.AsyncClient) -> None:
    response = await client.options("/eval")
    assert response.status_code == 200
    assert response.headers["Allow"] == "POST"


async def test_unknown_path(client: httpx.AsyncClient) -> None:
    response = await client.post("/run", json={"input": ""})
    assert response.status_code == 404
    assert response.json() == {"title": "404 Not Found"}


async def test_nul_byte_in_code(client: httpx.AsyncClient) -> None:
    result = await run(client, "print('a')\0")
    assert result == {"stdout": "ValueError: embedded null byte", "returncode": None, "files": []}


async def test_unexpected_failure_is_500(evaluator: Evaluator) -> None:
    class Broken(Evaluator):
        async def run(self, request: object) -> object:  # type: ignore[override]
            raise OSError("disk on fire")

    app = create_app(Broken(evaluator.config))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://x") as http:
        response = await http.post("/eval", json={"input": ""})
    assert response.status_code == 500
    assert response.json() == {"title": "500 Internal Server Error"}


async def test_full_queue_is_503() -> None:
    async with Evaluator(config(concurrency=1, max_queue=1)) as busy:
        app = create_app(busy)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://x", timeout=30
        ) as http:
            sleeper = {"input": "import time; time.sleep(1)"}
            first = asyncio.ensure_future(http.post("/eval", json=sleeper))
            second = asyncio.ensure_future(http.post("/eval", json=sleeper))
            with anyio.fail_after(60):
                while busy._slots.waiting < 1:  # noqa: ASYNC110 - the queue's own state is tested
                    await asyncio.sleep(0.01)
            refused = await http.post("/eval", json={"input": ""})
            assert refused.status_code == 503
            assert refused.json()["title"] == "Evaluation queue is full"
            assert (
                "1 evaluation slots are busy and 1 evaluations are waiting"
                in (refused.json()["description"])
            )
            assert refused.headers["Retry-After"] == "1"
            with anyio.fail_after(120):  # a hang guard, not a timing
                assert [r.status_code for r in await asyncio.gather(first, second)] == [200, 200]
