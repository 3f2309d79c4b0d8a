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
import re
from collections.abc import Callable
from pathlib import Path

from ._artist_docs import FONTLIST_BUILT, TABLES
from .commands import ARTIST_DOCS_IN_SANDBOX, CommandLines
from .host import MPLCONFIGDIR
from .pool import SandboxPool
from .workdir import WorkdirRoot

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
    sandbox = pool.prepare()
    try:
        script = _keep(root, "artist_docs.py", _SCRIPT.read_bytes())
        await sandbox.ready()
        in_sandbox = f"{commands.home}/{MPLCONFIGDIR}"
        command = [commands.default, ARTIST_DOCS_IN_SANDBOX, f"{in_sandbox}/{TABLES}"]
        argv = commands.argv(command, sandbox.workdir, [(script, ARTIST_DOCS_IN_SANDBOX)])
        sandbox.process.release(argv, START_UP_TIME_LIMIT)
        outcome = await sandbox.process.wait(output_limit)
        built = _FONTLIST_BUILT.search(outcome.output)
        name = built[1].decode() if built else ""
        fontlist = sandbox.workdir.read(f"{MPLCONFIGDIR}/{name}", FONTLIST_MAX_BYTES)
        if not name or fontlist is None:
            log.info("no prebuilt matplotlib font list (is matplotlib installed?)")
            return
        commands.fontlist = (_keep(root, name, fontlist), f"{in_sandbox}/{name}")
        tables = sandbox.workdir.read(f"{MPLCONFIGDIR}/{TABLES}", ARTIST_DOCS_MAX_BYTES)
        if outcome.returncode != 0 or tables is None or not _valid_tables(tables):
            log.info("matplotlib's artist tables were not built: warm sandboxes build their own")
            return
        commands.artist_docs = (script, _keep(root, TABLES, tables))
    finally:
        await pool.dispose(sandbox)
        then()


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
