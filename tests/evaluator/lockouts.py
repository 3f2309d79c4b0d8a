"""Runs that lock their owner out of their own files: for the root and the ordinary-user tests.

Each run first writes a hidden marker (never returned), by which a test finds its working
directory on the host, then takes away permissions the service needs: to list, read or remove.
The service must still answer 200 with the files Snekbox would return (Snekbox runs as root and
reads them all), and remove the directory.
"""

from __future__ import annotations

from pathlib import Path

#: A tree deeper than Python's recursion limit, every directory 0o000 (hidden: not collected).
DEEP = 2000

#: name: (code, the files returned as {path: content}).
LOCKOUTS: dict[str, tuple[str, dict[str, str]]] = {
    "working directory 0o300": (
        "open('out.txt', 'w').write('out'); os.chmod('.', 0o300)",
        {"out.txt": "out"},
    ),
    "working directory 0o000": (
        "open('out.txt', 'w').write('out'); os.chmod('.', 0)",
        {"out.txt": "out"},
    ),
    "subdirectory 0o600": (
        "os.mkdir('sub'); open('sub/in.txt', 'w').write('in'); os.chmod('sub', 0o600)",
        {"sub/in.txt": "in"},
    ),
    "subdirectory 0o000": (
        "os.makedirs('a/b'); open('a/b/in.txt', 'w').write('in')\n"
        "os.chmod('a/b', 0); os.chmod('a', 0)",
        {"a/b/in.txt": "in"},
    ),
    "file 0o000": (
        "open('locked.txt', 'w').write('locked'); os.chmod('locked.txt', 0)",
        {"locked.txt": "locked"},
    ),
    "deep tree of 0o000 directories": (
        f"os.mkdir('.deep'); os.chdir('.deep')\n"
        f"for _ in range({DEEP}): os.mkdir('d'); os.chdir('d')\n"
        f"for _ in range({DEEP}): os.chdir('..'); os.chmod('d', 0)\n"
        "os.chdir('..'); os.chmod('.deep', 0)",
        {},
    ),
}


def code(name: str, marker: str) -> str:
    """The run ``name``, marking its working directory with ``marker``."""
    return f"import os\nopen({marker!r}, 'w').close()\n{LOCKOUTS[name][0]}"


def directories_marked(root: Path, marker: str) -> list[Path]:
    """The working directories under ``root`` (a service's private directory) with ``marker``."""
    return [run for run in root.glob("run-*") if (run / marker).exists()]
