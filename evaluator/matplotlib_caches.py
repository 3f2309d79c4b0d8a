"""What matplotlib would build in every sandbox, built once at start in a sandbox of its own.

- **Its font list** (``fontlist-v*.json``): a run without it rebuilds it (~150 ms).
- **Its artists' property tables** (:mod:`._artist_docs`): a warm sandbox importing pyplot
  would build them again, a sixth of the CPU time its imports take.

One run of ``_artist_docs.py`` in a sandbox made like the runs' (before any code is taken)
builds both. Each is kept read-only in the evaluator's private directory; the runs' sandboxes
bind the font list where matplotlib looks for it, and the warm sandboxes bind the tables and the
script that reads them (:attr:`.CommandLines.artist_docs`).

What was built depends only on the script, the interpreter and what the sandboxes see of the
host, so it is built once a process: an evaluator started again in the same process (a library's
user may restart one; each process of this project's tests starts some 85) takes it rather than
a CPU-second. Should matplotlib change meanwhile, nothing goes wrong: the tables name the
matplotlib that built them and are not read by another, nor is a font list of another version.
They are then of no use (each warm sandbox builds its tables, each run its font list), as fonts
added to the host go unseen, until the process starts again: as with matplotlib's own cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ._artist_docs import FONTLIST_BUILT, TABLES
from .commands import ARTIST_DOCS_IN_SANDBOX, CommandLines
from .host import MPLCONFIGDIR
from .policy import SandboxView
from .pool import SandboxPool
from .pump import Outcome
from .workdir import Workdir, WorkdirRoot

__all__ = ["ARTIST_DOCS_MAX_BYTES", "FONTLIST_MAX_BYTES", "START_UP_TIME_LIMIT", "build"]

log = logging.getLogger(__name__)

#: The largest tables file kept (matplotlib 3.11's: 190 KB).
ARTIST_DOCS_MAX_BYTES = 4 << 20
#: The largest font list kept (a host with many fonts: a few hundred KB).
FONTLIST_MAX_BYTES = 16 << 20
#: Seconds the start-up run may take, whatever the runs' limit: it needs about a second of CPU,
#: and a busy host (load 10-27 on 2 cores was seen) must not lose the font list.
START_UP_TIME_LIMIT = 120.0
#: The script on the host, copied into the evaluator's private directory for the sandboxes.
_SCRIPT = Path(__file__).with_name("_artist_docs.py")
#: How the script names the font list it built (any later failure loses only the tables).
_FONTLIST_BUILT = re.compile(rb"^%s(fontlist-v[\w.]+\.json)$" % FONTLIST_BUILT.encode(), re.M)


@dataclass(frozen=True)
class _Built:
    """What a start-up run built: the font list (its name and bytes) and the tables' bytes
    (``None``: not built, or not of their shape)."""

    fontlist_name: str
    fontlist: bytes
    tables: bytes | None


#: The script's bytes, the default interpreter, the sandboxes' view (host name aside).
_Key = tuple[bytes, str, SandboxView | None]

#: Every whole build of this process, by what it depends on (:func:`_key`). One that lost its
#: tables (a limit met on a busy host) is not kept, so the next evaluator tries again.
_built: dict[_Key, _Built] = {}


async def build(
    pool: SandboxPool,
    commands: CommandLines,
    root: WorkdirRoot,
    output_limit: int,
    *,
    then: Callable[[], None],
) -> None:
    """Build the font list and the tables once in a sandbox (or take what an evaluator of this
    process built), keep them read-only in ``root`` and have the sandboxes bind them; ``then``
    is called once that sandbox, if any, is disposed of, whether anything was built or not."""
    try:
        source = _SCRIPT.read_bytes()
        script = _keep(root, "artist_docs.py", source)
        key = _key(source, commands)
        built = _built.get(key)
        if built is None:
            built = await _run(pool, commands, script, output_limit)
            if built is not None and built.tables is not None:
                _built[key] = built
        else:
            log.info("matplotlib's font list and artist tables: this process's earlier build")
        if built is not None:
            fontlist, tables = await asyncio.to_thread(_keep_built, built, root)
            commands.fontlist = (fontlist, f"{_in_sandbox(commands)}/{built.fontlist_name}")
            if tables is not None:
                commands.artist_docs = (script, tables)
    except Exception:  # the sandboxes build their own; the warm ones must still start
        log.exception("matplotlib's caches were not built")
    finally:
        then()


def _key(source: bytes, commands: CommandLines) -> _Key:
    """What a build depends on: the script, the interpreter and what the sandboxes see of the
    host (not their host name, each evaluator's own)."""
    view = commands.view
    return source, commands.default, replace(view, hostname="") if view is not None else None


async def _run(
    pool: SandboxPool, commands: CommandLines, script: str, output_limit: int
) -> _Built | None:
    """Run ``script`` in a sandbox of its own and read what it built (``None``: no font list)."""
    sandbox = pool.prepare()
    try:
        if not await sandbox.ready():
            log.info("no prebuilt matplotlib font list: its sandbox did not start")
            return None
        command = [commands.default, ARTIST_DOCS_IN_SANDBOX, f"{_in_sandbox(commands)}/{TABLES}"]
        argv = commands.argv(command, sandbox.workdir, [(script, ARTIST_DOCS_IN_SANDBOX)])
        sandbox.process.release(argv, START_UP_TIME_LIMIT)
        outcome = await sandbox.process.wait(output_limit)
        built = await asyncio.to_thread(_read_built, sandbox.workdir, outcome)
    finally:
        await pool.dispose(sandbox)
    if built is None:
        log.info(
            "no prebuilt matplotlib font list (is matplotlib installed?): its run ended by "
            "%s, status %d",
            outcome.ended_by, outcome.returncode,
        )  # fmt: skip
    elif built.tables is None:
        log.info("matplotlib's artist tables were not built: warm sandboxes build their own")
    return built


def _keep_built(built: _Built, root: WorkdirRoot) -> tuple[str, str | None]:
    """The font list and the tables (``None``: none), kept in ``root``."""
    fontlist = _keep(root, built.fontlist_name, built.fontlist)
    return fontlist, _keep(root, TABLES, built.tables) if built.tables is not None else None


def _in_sandbox(commands: CommandLines) -> str:
    """Where matplotlib keeps its caches in the sandbox."""
    return f"{commands.home}/{MPLCONFIGDIR}"


def _read_built(workdir: Workdir, outcome: Outcome) -> _Built | None:
    """The font list the start-up run named, and its tables if it ended well and they have
    their shape (``None``: no font list)."""
    named = _FONTLIST_BUILT.search(outcome.output)
    name = named[1].decode() if named else ""
    fontlist = workdir.read(f"{MPLCONFIGDIR}/{name}", FONTLIST_MAX_BYTES) if name else None
    if fontlist is None:
        return None
    tables = workdir.read(f"{MPLCONFIGDIR}/{TABLES}", ARTIST_DOCS_MAX_BYTES)
    kept = outcome.returncode == 0 and tables is not None and _valid_tables(tables)
    return _Built(name, fontlist, tables if kept else None)


def _keep(root: WorkdirRoot, name: str, data: bytes) -> str:
    """``data`` as the read-only file ``name`` of the evaluator's private directory."""
    kept = root.path / name
    kept.write_bytes(data)
    kept.chmod(0o444)
    return str(kept)


def _valid_tables(data: bytes) -> bool:
    """Whether ``data`` has the tables' shape (:mod:`._artist_docs`)."""
    try:
        known = json.loads(data)
    except (ValueError, RecursionError):
        return False
    tables = known.get("tables") if isinstance(known, dict) else None
    return (
        isinstance(tables, dict)
        and isinstance(known.get("built_by"), list)
        and all(
            isinstance(answers, list) and all(isinstance(a, str) for a in answers)
            for answers in tables.values()
        )
    )
