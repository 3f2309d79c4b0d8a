"""Make Snekbox read a run's output to its end, not only while NsJail is running.

Why: upstream's ``NsJail._consume_stdout`` reads the pipe ``while nsjail.poll() is None``. When
NsJail has exited by the time the loop looks (a short run on a busy host, where the server's
thread is scheduled late), what the run wrote is still in the pipe and is never read: the result
is ``returncode: 0`` with empty ``stdout`` (1 call in 96 under load in this project's compose
test). Reading to end of file instead loses nothing and still ends: NsJail's exit kills every
process of the jail, which closes the pipe's last writer. The output limit is kept as upstream
wrote it (it stops reading and terminates NsJail).

Run at image build, on whichever Snekbox the image extends (upstream's or one built from its
sources): it edits the installed ``snekbox/nsjail.py`` in place and fails the build if the loop
it edits is not there exactly once (a newer Snekbox, to be looked at again).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

LOOP = "while nsjail.poll() is None:"
READ = "chars = nsjail.stdout.read(self.read_chunk_size)"
MARK = "# python-mcp-server: drained to end of file"


def nsjail_module() -> Path:
    """snekbox/nsjail.py as the server imports it (``find_spec`` of a top-level package does not
    run its ``__init__``)."""
    spec = importlib.util.find_spec("snekbox")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("drain_output: no snekbox package for this interpreter")
    return Path(next(iter(spec.submodule_search_locations)), "nsjail.py")


def drained(source: str) -> str:
    """``source`` with the read loop going on to end of file."""
    if MARK in source:
        return source
    if source.count(LOOP) != 1 or source.count(READ) != 1:
        sys.exit(f"drain_output: Snekbox's read loop is not as expected ({LOOP!r}, {READ!r})")
    lines = source.splitlines(keepends=True)
    for number, line in enumerate(lines):
        if LOOP in line:
            lines[number] = line.replace(LOOP, f"while True:  {MARK}")
        elif READ in line:
            indent = line[: len(line) - len(line.lstrip())]
            lines.insert(number + 1, f"{indent}if not chars:\n{indent}    break\n")
            break
    return "".join(lines)


def main() -> None:
    path = nsjail_module()
    path.write_text(drained(path.read_text()))
    print(f"drain_output: {path} reads NsJail's output to end of file")


if __name__ == "__main__":
    main()
