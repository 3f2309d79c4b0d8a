"""Fixtures shared by every suite, and the two lanes.

The fast lane, ``pytest -m "not slow"``, is the modules listed in :data:`FAST_MODULES`: they
start no sandbox, server process or uvicorn (the gateway runs against a fake service,
``tests/gateway/fake_service.py``). Every other test is marked ``slow`` here, so that a new
module starts in the slow lane until it is listed; and a fast test that tries to start a real
part (a process, the evaluator, uvicorn) fails at once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest
import uvicorn

from evaluator import Evaluator

#: The modules of the fast lane (see the module's docstring).
FAST_MODULES = frozenset(
    {
        "tests.test_layering",
        "tests.test_public_api",
        "tests.test_shape",
        "tests.test_kubernetes",
        "tests.serving.test_slots",
        "tests.serving.test_table",
        "tests.evaluator.test_deadlines",
        "tests.evaluator.test_errors",
        "tests.evaluator.test_meminfo",
        "tests.evaluator.test_preimports",
        "tests.evaluator.test_pump",
        "tests.evaluator.test_run_slots",
        "tests.evaluator.test_warming",
        "tests.snekbox_client.test_exported_members",
        "tests.gateway.test_budget",
        "tests.gateway.test_cell_reads",
        "tests.gateway.test_choices",
        "tests.gateway.test_code_session_store",
        "tests.gateway.test_handles",
        "tests.gateway.test_pipeline",
        "tests.gateway.test_render",
        "tests.gateway.test_session_sharing",
        "tests.gateway.test_sse_sessions",
        "tests.snekbox_client.test_answer",
        "tests.snekbox_client.test_info",
    }
)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ not in FAST_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_real_parts(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """In a fast test, starting a process, the evaluator or uvicorn is an error."""
    if request.node.get_closest_marker("slow") is None:

        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            raise RuntimeError("a fast test starts no real part: mark the module slow")

        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
        monkeypatch.setattr(Evaluator, "start", refuse)
        monkeypatch.setattr(uvicorn.Server, "serve", refuse)
    yield
