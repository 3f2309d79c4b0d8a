"""The support module's manifest: the list of the files the evaluator should return.

Part of the support module (see ``_support.py``): at the end of a run that left files,
:data:`MANIFEST_NAME` lists them (see :func:`write_manifest`), so that the gateway can name
those it did not return.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.

import os
import stat

#: The manifest: a name Snekbox returns (no leading ``_`` or ``.``) and that sorts before any
#: ordinary name, so that an evaluator returning files in path order returns it first.
MANIFEST_NAME = "!mcp-manifest"
#: The manifest's first line, then one ``<size> <path>\0`` record per file, in path order,
#: then one ``- <path>\0`` per file that was there when the code started and is gone.
MANIFEST_HEADER = b"mcp-manifest 1 %d %d\n"  # files found, 1 if the walk saw everything
MANIFEST_MAX_BYTES = 64 * 1024
# Bounds of the walk over the working directory: entries examined, directory levels.
_WALK_ENTRIES = 10_000
_WALK_DEPTH = 100

# Set by configure(): the working directory. Files that were there before the code ran:
# path -> mtime (ns).
_workdir = "."
_inputs: "dict[str, int]" = {}


def configure(workdir: str) -> None:
    """Called for each run (each cell of a session): the working directory walked."""
    global _workdir
    _workdir = workdir


def write_if_needed() -> None:
    """At the end of the run: the manifest, if files were sent in (they may all be gone: the
    manifest says so) or the working directory holds any."""
    if _inputs or has_files():
        write_manifest()


def has_files() -> bool:
    """Whether the working directory holds what Snekbox could return (nothing hidden)."""
    try:
        return any(not name.startswith(".") for name in os.listdir(_workdir))
    except OSError:
        return False


def note_inputs() -> None:
    """Remember the files sent in, which Snekbox does not return unless the code changes them."""
    global _inputs
    found, _ = _walk()
    _inputs = {path: mtime for path, _, mtime in found}


def write_manifest() -> None:
    """List the files the evaluator should return, with their sizes, in :data:`MANIFEST_NAME`.

    The rules are Snekbox's: regular files, not symlinks, no name starting with ``_`` and nothing
    under a name starting with ``.``; files sent in and left unchanged are left out. The walk is
    bounded (:data:`_WALK_ENTRIES`, :data:`_WALK_DEPTH`) and says whether it saw everything; the
    list is cut at :data:`MANIFEST_MAX_BYTES`, the count still covering every file found. Inputs
    now gone follow (the gateway forgets them). A failure writes nothing.
    """
    try:
        found, complete = _walk()
        files = sorted(
            (path, size)
            for path, size, mtime in found
            if path != MANIFEST_NAME and _inputs.get(path) != mtime
        )
        there = {path for path, _, _ in found}
        # Only names the gateway can have kept: a name that is not UTF-8 never came back.
        gone = [
            p
            for p in sorted(set(_inputs) - there - {MANIFEST_NAME})
            if complete and os.fsencode(p) == p.encode("utf-8", "replace")
        ]
        if not files and not gone:
            return
        header = MANIFEST_HEADER % (len(files), complete)
        room = MANIFEST_MAX_BYTES - len(header)
        # The files gone first: the gateway forgets them, where the list only names files.
        removed = _fitting([b"- %s\0" % os.fsencode(path) for path in gone], room)
        room -= sum(map(len, removed))
        listed = _fitting([b"%d %s\0" % (size, os.fsencode(path)) for path, size in files], room)
        records = listed + removed
        with open(os.path.join(_workdir, MANIFEST_NAME), "wb") as out:
            out.write(header + b"".join(records))
    except Exception:
        pass


def _fitting(records: "list[bytes]", room: int) -> "list[bytes]":
    kept = []
    for record in records:
        room -= len(record)
        if room < 0:
            break
        kept.append(record)
    return kept


def _walk() -> "tuple[list[tuple[str, int, int]], bool]":
    """``(path, size, mtime_ns)`` of the files Snekbox would return; whether all were seen."""
    found: list[tuple[str, int, int]] = []
    budget = [_WALK_ENTRIES]
    fd = os.open(_workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        complete = _walk_directory(fd, "", 0, found, budget)
    finally:
        os.close(fd)
    return found, complete


def _walk_directory(
    fd: int, prefix: str, depth: int, found: "list[tuple[str, int, int]]", budget: "list[int]"
) -> bool:
    # By descriptor, never by path: a deep tree's paths are longer than the kernel accepts.
    complete = True
    with os.scandir(fd) as entries:
        for entry in entries:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            name = entry.name
            if name.startswith("."):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    if depth >= _WALK_DEPTH:
                        complete = False
                        continue
                    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                    sub = os.open(name, flags, dir_fd=fd)
                    try:
                        seen = _walk_directory(sub, f"{prefix}{name}/", depth + 1, found, budget)
                    finally:
                        os.close(sub)
                    complete = complete and seen
                elif stat.S_ISREG(info.st_mode) and not name.startswith("_"):
                    found.append((prefix + name, info.st_size, info.st_mtime_ns))
            except OSError:
                complete = False
    return complete
