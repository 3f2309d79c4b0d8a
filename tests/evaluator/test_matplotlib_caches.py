"""What matplotlib builds once at the evaluator's start (``evaluator/matplotlib_caches.py``).

The artist tables built in the start-up sandbox are what each warm sandbox's pyplot import
reads, through bwrap as the runs see them: the docstrings a warm run sees are those of a run
that imported matplotlib itself, and they come from the tables the evaluator keeps. What the
start-up run wrote is kept only if it has the tables' shape and size, read through no link.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from evaluator import Evaluator, matplotlib_caches
from evaluator.commands import CommandLines
from evaluator.fileops import read_regular
from evaluator.policy import SandboxView
from snekbox_client import EvalRequest

from .conftest import config
from .matplotlib_docs import DOCSTRINGS

#: Whether pyplot was imported before the code; a digest of the docstrings of each module of
#: matplotlib's (a warm sandbox may hold more of them: the prelude's); the marker's count.
DOCS = (
    DOCSTRINGS
    + r"""
import sys
warm = "matplotlib.pyplot" in sys.modules
import hashlib, json, matplotlib.pyplot, matplotlib.lines
digests = {
    module: hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()
    for module, docs in matplotlib_docs().items()
}
print(warm)
print(json.dumps(digests))
print(matplotlib.lines.Line2D.set.__doc__.count("FROM THE TABLES"))
"""
)


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(
        config(warm_sandboxes=1, preimport=("numpy", "matplotlib.pyplot"), time_limit=60)
    ) as started:
        assert started._matplotlib_task is not None
        await started._matplotlib_task
        yield started


async def warm_run(evaluator: Evaluator, args: tuple[str, ...]) -> list[str]:
    with anyio.fail_after(240):  # a loaded machine warms slowly
        while evaluator.warm_sandboxes < 1:  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.05)
    result = await evaluator.run(EvalRequest(args=args))
    assert result.returncode == 0, result.stdout
    return result.stdout.splitlines()


async def test_a_warm_run_sees_the_docstrings_pyplot_makes(evaluator: Evaluator) -> None:
    assert evaluator._commands is not None and evaluator._commands.artist_docs is not None
    for kept in evaluator._commands.artist_docs:
        assert os.stat(kept).st_mode & 0o777 == 0o444
    warm, warm_docs, read = await warm_run(evaluator, ("-c", DOCS))
    cold, cold_docs, _ = await warm_run(evaluator, ("-u", "-c", DOCS))  # no warm agent runs it
    assert (warm, cold, read) == ("True", "False", "0")
    seen, made = json.loads(warm_docs), json.loads(cold_docs)
    assert {"matplotlib.lines", "matplotlib.axes._axes", "mpl_toolkits.mplot3d.axes3d"} <= set(made)
    assert {name: seen.get(name) for name in made} == made


async def test_a_warm_sandbox_reads_the_tables_the_evaluator_keeps(
    evaluator: Evaluator,
) -> None:
    """Tables that say something else are what the docstrings say, once the sandboxes are made
    with them: they were read, not built again."""
    assert evaluator._commands is not None and evaluator._commands.artist_docs is not None
    script, kept = evaluator._commands.artist_docs
    known = json.loads(Path(kept).read_text())  # noqa: ASYNC240
    known["tables"]["matplotlib.lines.Line2D"][0] += "FROM THE TABLES"
    spoiled = Path(f"{kept}.spoiled")  # where every sandbox's user reaches it
    spoiled.write_text(json.dumps(known))  # noqa: ASYNC240
    spoiled.chmod(0o444)  # noqa: ASYNC240  (whatever the umask: the sandboxes' users read it)
    evaluator._commands.artist_docs = (script, str(spoiled))
    try:
        for _ in range(4):  # the sandbox warm before the change, then one made after it
            if (await warm_run(evaluator, ("-c", DOCS)))[2] == "1":
                break
        else:
            pytest.fail("no warm run read the tables it was given")
    finally:
        evaluator._commands.artist_docs = (script, kept)


async def test_an_evaluator_started_again_takes_what_the_first_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One start-up run a process: the next evaluator keeps the same files in its own
    directory, read-only, without a sandbox of its own."""
    runs: list[object] = []
    real_run = matplotlib_caches._run

    async def counted(*args: Any) -> Any:
        runs.append(args)
        return await real_run(*args)

    monkeypatch.setattr(matplotlib_caches, "_built", {})
    monkeypatch.setattr(matplotlib_caches, "_run", counted)
    kept: list[tuple[bytes, str, bytes]] = []
    places: set[str] = set()
    for _ in range(2):
        async with Evaluator(config()) as started:
            assert started._matplotlib_task is not None and started._commands is not None
            await started._matplotlib_task
            fontlist, artist_docs = started._commands.fontlist, started._commands.artist_docs
            assert fontlist is not None and artist_docs is not None
            for host in (fontlist[0], *artist_docs):
                assert os.stat(host).st_mode & 0o777 == 0o444
                places.add(host)
            kept.append(
                (Path(fontlist[0]).read_bytes(), fontlist[1], Path(artist_docs[1]).read_bytes())  # noqa: ASYNC240
            )
    assert len(runs) == 1
    assert kept[0] == kept[1] and len(places) == 6


def test_a_build_is_taken_again_only_with_the_same_script_interpreter_and_view() -> None:
    view = SandboxView("/usr/bin/bwrap", ("/usr",), (), (("HOME", "/home"),), 1 << 20, "sb-1")

    def key(source: bytes = b"script", default: str = "/usr/bin/python3", **changed: Any) -> Any:
        commands = SimpleNamespace(default=default, view=dataclasses.replace(view, **changed))
        return matplotlib_caches._key(source, cast(CommandLines, commands))

    assert key(hostname="sb-2") == key()
    others = [
        key(b"another script"),
        key(default="/opt/python3.13/bin/python3"),
        key(readonly_paths=("/usr", "/opt/fonts")),
        key(env=(("HOME", "/home"), ("MPLCONFIGDIR", "/tmp"))),
        key(home="/tmp"),
    ]
    assert key() not in others and len(set(others)) == len(others)


#: A start-up script that builds a font list, says so, then fails (argv[1]: how).
FAILING = r"""
import os, sys, time
name = "fontlist-v0.json"
os.makedirs(os.environ["MPLCONFIGDIR"], exist_ok=True)
with open(os.path.join(os.environ["MPLCONFIGDIR"], name), "w") as file:
    file.write("{}")
sys.stdout.write(f"font list built: {name}\n")
sys.stdout.flush()
time.sleep(600) if os.environ.get("FAIL") == "time limit" else sys.exit(1)
"""


@pytest.mark.parametrize("failure", ["status", "time limit"])
async def test_the_font_list_is_kept_when_the_run_fails_after_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failure: str
) -> None:
    """A start-up run that ends badly once the font list is built (a memory or time limit met
    by pyplot's import) loses only the tables."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING.replace('os.environ.get("FAIL")', repr(failure)))
    monkeypatch.setattr(matplotlib_caches, "_SCRIPT", script)
    monkeypatch.setattr(matplotlib_caches, "START_UP_TIME_LIMIT", 15.0)  # a busy host: 1-2 s
    async with Evaluator(config()) as started:
        assert started._matplotlib_task is not None and started._commands is not None
        await started._matplotlib_task
        assert started._commands.artist_docs is None
        fontlist = started._commands.fontlist
        assert fontlist is not None and fontlist[1].endswith("/fontlist-v0.json")
        assert Path(fontlist[0]).read_bytes() == b"{}"  # noqa: ASYNC240
    # Not kept for the next evaluator, which tries again.
    assert all(b.fontlist_name != "fontlist-v0.json" for b in matplotlib_caches._built.values())


async def test_a_warm_sandbox_without_pyplot_runs_no_tables() -> None:
    probe = "import os, sys; print(os.path.exists('/run/evaluator/artist_docs.py'))"
    async with Evaluator(config(warm_sandboxes=1, preimport=("numpy", "matplotlib"))) as started:
        assert started._matplotlib_task is not None
        await started._matplotlib_task
        assert started._commands is not None and started._commands.artist_docs is not None
        assert await warm_run(started, ("-c", probe)) == ["False"]


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b'{"tables": {}}',
        b'{"built_by": "3.11", "tables": {}}',
        b'{"built_by": [], "tables": []}',
        b'{"built_by": [], "tables": {"a.B": "a table"}}',
        b'{"built_by": [], "tables": {"a.B": [1]}}',
        b"\xff{",
        b"[" * 100_000,  # deeper than the parser goes
    ],
)
def test_tables_of_another_shape_are_not_kept(content: bytes) -> None:
    assert not matplotlib_caches._valid_tables(content)


def test_tables_of_their_shape_are_kept() -> None:
    content = {"built_by": ["3.11.2", "/m/__init__.py", False], "tables": {"a.B": ["x", "y"]}}
    assert matplotlib_caches._valid_tables(json.dumps(content).encode())


def test_what_the_start_up_run_left_is_read_through_no_link_and_up_to_its_size(
    tmp_path: Path,
) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file").write_bytes(b"x" * 10)
    (tmp_path / "linked").symlink_to(tmp_path / "dir")
    (tmp_path / "dir" / "link").symlink_to(tmp_path / "dir" / "file")
    root_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_regular(root_fd, "dir/file", 10) == b"x" * 10
        assert read_regular(root_fd, "dir/file", 9) is None
        assert read_regular(root_fd, "linked/file", 10) is None
        assert read_regular(root_fd, "dir/link", 10) is None
        assert read_regular(root_fd, "dir", 10) is None
        assert read_regular(root_fd, "dir/missing", 10) is None
        assert read_regular(root_fd, "dir/../dir/file", 10) is None
        assert read_regular(root_fd, f"{tmp_path}/dir/file", 10) is None
        os.mkfifo(tmp_path / "dir" / "fifo")
        assert read_regular(root_fd, "dir/fifo", 10) is None  # without blocking
    finally:
        os.close(root_fd)
