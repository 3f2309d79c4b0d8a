"""What matplotlib would build in every sandbox, built once at start in a sandbox of its own.

- **Its font list** (``fontlist-v*.json``): a run without it rebuilds it (~150 ms).
- **Its artists' property tables** (:mod:`._artist_docs`): a warm sandbox importing pyplot
  would build them again, a sixth of the CPU time its imports take.

One run of ``_artist_docs.py`` in a sandbox made like the runs' (before any code is taken)
builds both. Each is kept read-only in the evaluator's private directory; the runs' sandboxes
bind the font list where matplotlib looks for it, and the warm sandboxes bind the tables and the
script that reads them (:attr:`.CommandLines.artist_docs`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ._artist_docs import TABLES
from .commands import ARTIST_DOCS_IN_SANDBOX, CommandLines
from .host import MPLCONFIGDIR
from .pool import SandboxPool
from .workdir import WorkdirRoot

__all__ = ["ARTIST_DOCS_MAX_BYTES", "build"]

log = logging.getLogger(__name__)

#: The largest tables file kept (matplotlib 3.11's: 169 KB).
ARTIST_DOCS_MAX_BYTES = 4 << 20
# Where the start-up run sees the script that builds them.
_SCRIPT = Path(__file__).with_name("_artist_docs.py")


async def build(
    pool: SandboxPool,
    commands: CommandLines,
    root: WorkdirRoot,
    output_limit: int,
    *,
    then: Callable[[], None],
) -> None:
    """Build the font list and the tables once in a sandbox, keep them read-only in ``root``
    and have the sandboxes bind them; ``then`` is called once that sandbox is disposed of,
    whether anything was built or not."""
    script = root.path / "artist_docs.py"
    script.write_bytes(_SCRIPT.read_bytes())
    script.chmod(0o444)
    in_sandbox = f"{commands.home}/{MPLCONFIGDIR}"
    sandbox = pool.prepare()
    try:
        await sandbox.ready()
        command = [commands.default, ARTIST_DOCS_IN_SANDBOX, f"{in_sandbox}/{TABLES}"]
        binds = [(str(script), ARTIST_DOCS_IN_SANDBOX)]
        sandbox.process.release(commands.argv(command, sandbox.workdir, binds), 60)
        outcome = await sandbox.process.wait(output_limit)
        cache = sandbox.workdir.access / MPLCONFIGDIR
        built = sorted(cache.glob("fontlist-v*.json")) if outcome.returncode == 0 else []
        if not built:
            log.info("no prebuilt matplotlib font list (is matplotlib installed?)")
            return
        kept = root.path / built[-1].name
        shutil.copyfile(built[-1], kept)
        kept.chmod(0o444)
        commands.fontlist = (str(kept), f"{in_sandbox}/{built[-1].name}")
        tables = _valid_tables(cache / TABLES)
        if tables is None:
            log.info("matplotlib's artist tables were not built: warm sandboxes build their own")
            return
        kept = root.path / TABLES
        kept.write_bytes(tables)
        kept.chmod(0o444)
        commands.artist_docs = (str(script), str(kept))
    finally:
        await pool.dispose(sandbox)
        then()


def _valid_tables(path: Path) -> bytes | None:
    """The tables file the start-up run wrote, if it has their shape and size (its own links
    not followed); ``None`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        data = file.read(ARTIST_DOCS_MAX_BYTES + 1)
    try:
        known = json.loads(data) if len(data) <= ARTIST_DOCS_MAX_BYTES else None
    except ValueError:
        return None
    if not isinstance(known, dict) or not isinstance(known.get("built_by"), list):
        return None
    tables = known.get("tables")
    if not isinstance(tables, dict) or not all(
        isinstance(answers, list) and all(isinstance(a, str) for a in answers)
        for answers in tables.values()
    ):
        return None
    return data
