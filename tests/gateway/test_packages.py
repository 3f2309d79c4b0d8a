"""`packages`, `python` and PEP 723 blocks through the tool, with real MCP clients.

The built-in evaluator (in the gateway's process, and as its own service over HTTP) installs
from a folder of wheels made here (tests/wheels.py); no outside index is reached. A
Snekbox-like service (no ``GET /info``, no package field) stands in for the real Snekbox, which
installs nothing and runs the interpreters the operator's table names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from python_mcp_server import Settings, create_app
from tests.evaluator.test_run_packages import searchable
from tests.gateway.conftest import with_evaluator
from tests.gateway.harness import ServiceProcess
from tests.support import HAS_313, PY313, call_code, connect, facts, serve, text_of
from tests.wheels import wheels

pytestmark = pytest.mark.anyio

needs_313 = pytest.mark.skipif(not HAS_313, reason=f"no CPython 3.13 at {PY313}")

BLOCK = '# /// script\n# dependencies = ["tinypkg==1.0"]\n# requires-python = ">=3.11"\n# ///\n'


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels(tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module")
def package_settings(
    settings: Settings, index: Path, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    return with_evaluator(
        settings,
        time_limit=20.0,
        package_index=str(index),
        package_cache=str(searchable(tmp_path_factory.mktemp("cache"))),
        pythons=(str(PY313),) if HAS_313 else (),
        python_packages=(),
    )


@contextlib.contextmanager
def evaluator_process(package_settings: Settings) -> Iterator[str]:
    """``python -m evaluator`` with these package settings, keeping live sessions."""
    config = package_settings.evaluator_config
    env = {
        "EVALUATOR_PACKAGE_INDEX": str(config.package_index),
        "EVALUATOR_PACKAGE_CACHE": str(config.package_cache),
        "EVALUATOR_PYTHONS": ",".join(config.pythons or ()),
        "EVALUATOR_PYTHON_PACKAGES": "",
        # Above what the module's tests open together: each connection is a client of its own,
        # and at the cap the one holding the most (a test's own) would lose its session.
        "EVALUATOR_MAX_SESSIONS": "16",
    }
    args = ["-m", "evaluator", "--port", "{port}", "--log-level", "warning", "--time-limit", "20"]
    service = ServiceProcess(args, env, ("OPTIONS", "/eval"))
    service.start()
    try:
        yield service.url
    finally:
        service.stop()


@pytest.fixture(scope="module", params=["in-process", "live-over-http"])
def url(request: pytest.FixtureRequest, package_settings: Settings) -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        settings = package_settings
        if request.param == "live-over-http":
            service = stack.enter_context(evaluator_process(package_settings))
            settings = settings.model_copy(update={"snekbox_url": service})
        yield stack.enter_context(serve(create_app(settings)))


async def description(client: Client) -> str:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    return tools["execute_python_code"].description or ""


async def test_a_call_gets_the_packages_it_names_and_is_told_what_was_installed(url: str) -> None:
    async with connect(url, "http") as client:
        code = "import tinypkg; print(tinypkg.VALUE)"
        result = await call_code(client, code, packages=["tinypkg"])
        found = facts(result)
        text = text_of(result)
        described = await description(client)
    assert found["stdout"] == "11\n" and found["status"] == "ok"
    assert found["packages"] == ["tinypkg==1.1"] and found["install_seconds"] >= 0
    assert "[packages: tinypkg==1.1 (ready in" in text and "not counted in the time limit" in text
    assert "`packages`: PEP 508 requirements" in described and "any project" in described


async def test_a_pep_723_block_is_honoured_and_an_argument_wins_over_it(url: str) -> None:
    code = BLOCK + "import tinypkg; print(tinypkg.VALUE)"
    async with connect(url, "http") as client:
        from_block = facts(await call_code(client, code))
        from_argument = facts(await call_code(client, code, packages=["tinypkg==1.1"]))
    assert from_block["stdout"] == "1\n" and from_block["packages"] == ["tinypkg==1.0"]
    assert from_block["notes"] == []
    assert from_argument["stdout"] == "11\n"
    assert from_argument["notes"] == [
        "the packages argument was used; the script block's dependencies (tinypkg==1.0) were not"
    ]


@pytest.mark.parametrize(
    ("requirement", "why"), [("sourceonly", "no wheel"), ("nosuchproject", "not found")]
)
async def test_a_refused_package_is_a_result_naming_it_and_why(
    url: str, requirement: str, why: str
) -> None:
    async with connect(url, "http") as client:
        result = await call_code(client, "print('RAN')", packages=[requirement])
    found = facts(result)  # a result, not a tool error
    assert found["status"] == "packages_refused" and found["returncode"] is None
    assert f"{requirement!r} was refused ({why})" in found["message"], found["message"]
    assert "RAN" not in text_of(result) and "The code did not run" in text_of(result)


async def test_a_sessions_packages_stay_for_its_later_calls(url: str) -> None:
    async with connect(url, "http") as client:
        first = facts(await call_code(client, "x = 41"))
        session = {"session_id": first["session_id"]}
        second = facts(
            await call_code(
                client, "import withdep; print(withdep.VALUE, x + 1)", packages=["withdep"],
                **session,
            )
        )  # fmt: skip
        third = facts(await call_code(client, "import withdep; print(withdep.VALUE)", **session))
        refused = facts(await call_code(client, "print(x)", packages=["sourceonly"], **session))
        after = facts(await call_code(client, "print(x)", **session))
    assert second["stdout"] == "11 42\n", second
    assert third["stdout"] == "11\n" and third["packages"] == ["tinypkg==1.1", "withdep==2.0"]
    assert refused["status"] == "packages_refused"
    assert after["stdout"] == "41\n"  # the refused one is not asked for again


async def test_a_session_whose_first_call_was_refused_starts_with_its_next(url: str) -> None:
    async with connect(url, "http") as client:
        refused = facts(await call_code(client, "x = 1", packages=["sourceonly"]))
        session = {"session_id": refused["session_id"]}
        after = facts(await call_code(client, "x = 2; print(x)", **session))
        again = facts(await call_code(client, "print(x + 1)", **session))
    assert refused["status"] == "packages_refused"
    assert after["stdout"] == "2\n" and again["stdout"] == "3\n"


@needs_313
async def test_a_call_chooses_an_offered_python_and_a_session_keeps_it(url: str) -> None:
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    async with connect(url, "http") as client:
        described = await description(client)
        chosen = facts(await call_code(client, code, python="3.13"))
        default = facts(await call_code(client, code))
        unknown = await call_code(client, code, python="3.9")
        switch = await call_code(client, code, python="3.11", session_id=chosen["session_id"])
        kept = facts(await call_code(client, code, session_id=chosen["session_id"]))
        # Its interpreter ended: the next one runs the same Python, which it still keeps.
        await call_code(client, "import os; os._exit(0)", session_id=chosen["session_id"])
        switch_after = await call_code(client, code, python="3.11", session_id=chosen["session_id"])
        kept_after = facts(await call_code(client, code, session_id=chosen["session_id"]))
        allows = '# /// script\n# requires-python = ">=3.11"\n# ///\n' + code
        kept_by_block = facts(await call_code(client, allows, session_id=chosen["session_id"]))
        block = '# /// script\n# requires-python = ">=3.13"\n# ///\n'
        by_block = facts(await call_code(client, block + code))
        with_packages = facts(
            await call_code(client, code + "; import tinypkg", python="3.13", packages=["tinypkg"])
        )
    assert "`python`: the Python version to run, one of" in described and "3.13.0" in described
    assert chosen["stdout"] == "3.13\n" and default["stdout"] == "3.11\n"
    assert unknown.is_error and "Python '3.9' is not offered here; offered: " in text_of(unknown)
    assert "3.13.0" in text_of(unknown)
    assert switch.is_error and "This session runs Python 3.13.0" in text_of(switch)
    assert switch_after.is_error and "This session runs Python 3.13.0" in text_of(switch_after)
    assert kept_after["stdout"] == "3.13\n"
    assert kept["stdout"] == "3.13\n" and by_block["stdout"] == "3.13\n"
    assert kept_by_block["stdout"] == "3.13\n"  # the session's Python meets the block
    assert with_packages["stdout"] == "3.13\n" and with_packages["status"] == "ok"


@contextlib.contextmanager
def snekbox_like(settings: Settings, *also: str, **changes: Any) -> Iterator[str]:
    """A gateway in front of a Snekbox-like service (no ``/info``, no packages), as the real
    Snekbox is to it; ``also``: other interpreters its sandbox holds."""
    args = ["-m", "tests.snekbox_client.snekbox_like", "--port", "{port}", "--no-info"]
    args += [arg for path in also for arg in ("--also", path)]
    service = ServiceProcess(args, {}, ("OPTIONS", "/eval"))
    service.start()
    with contextlib.ExitStack() as stack:
        stack.callback(service.stop)
        remote = settings.model_copy(update={"snekbox_url": service.url, **changes})
        yield stack.enter_context(serve(create_app(remote)))


async def test_snekbox_refuses_packages_and_a_choice_of_python_clearly(settings: Settings) -> None:
    with snekbox_like(settings) as gateway_url:
        async with connect(gateway_url, "http") as client:
            described = await description(client)
            packages = await call_code(client, "print('RAN')", packages=["tabulate"])
            block = await call_code(client, BLOCK + "print('RAN')")
            python = await call_code(client, "print('RAN')", python="3.12")
    assert "no package can be added (the evaluation service installs none" in described
    for refused in (packages, block):
        assert refused.is_error and "RAN" not in text_of(refused)
        assert "Packages cannot be installed here (the evaluation service installs none; its " in (
            text_of(refused)
        )
    assert python.is_error and "this evaluation service runs one Python" in text_of(python)


async def test_packages_turned_off_are_a_refusal_not_a_tool_error(settings: Settings) -> None:
    """``EVALUATOR_PACKAGES=off``: asked for anyway, a result with status packages_refused
    (as any refused package), the code not run."""
    off = with_evaluator(settings, packages="off")
    with serve(create_app(off)) as gateway_url:
        async with connect(gateway_url, "http") as client:
            refused = await call_code(client, "print('RAN')", packages=["tabulate"])
            block = await call_code(client, BLOCK + "print('RAN')")
    for result in (refused, block):
        found = facts(result)
        assert found["status"] == "packages_refused" and "RAN" not in text_of(result)
        assert "(not allowed): turned off by configuration (EVALUATOR_PACKAGES=off)" in (
            text_of(result)
        )


@needs_313
async def test_snekbox_runs_the_interpreters_of_the_operators_table(settings: Settings) -> None:
    table = {"3.13": str(PY313)}
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    with snekbox_like(settings, str(PY313), snekbox_pythons=table) as gateway_url:
        async with connect(gateway_url, "http") as client:
            chosen = facts(await call_code(client, code, python="3.13"))
            unknown = await call_code(client, code, python="3.12")
    assert chosen["stdout"] == "3.13\n"
    assert unknown.is_error and "Python '3.12' is not offered here; offered: " in text_of(unknown)
