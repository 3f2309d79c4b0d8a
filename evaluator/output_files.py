"""The files a run gives back, by Snekbox's rules, read from its working directory.

Snekbox returns the files matching ``**/[!_]*`` that the run created or modified: not names
starting with ``_``, nothing under a directory or with a name starting with ``.``, no symlink,
FIFO or other non-regular file, no file sent in and left unmodified. Every read goes through
descriptors that never follow a symlink (:mod:`.fileops`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping

from snekbox_client import ContentWanted, File

from .errors import CollectError
from .fileops import read_beneath, walk_files

__all__ = ["MAX_DEPTH", "collect", "snapshot"]

# Directories nested deeper than this are not searched for output files (Snekbox stops at
# Python's recursion limit with the same message).
MAX_DEPTH = 100
_TIMEOUT = "TimeoutError: Exceeded time limit while parsing attachments"
_TOO_DEEP = "FileParsingError: Exceeded directory depth limit while parsing attachments"
_NOT_UTF8 = "FileParsingError: invalid bytes in filename while parsing attachments"


def collect(
    root_fd: int,
    written: Mapping[str, int],
    *,
    size: int,
    max_files: int,
    timeout: float,
    content_wanted: ContentWanted | None = None,
    strict: bool = True,
) -> tuple[File, ...]:
    """The files below ``root_fd`` the run created or modified (``written``: the mtimes, in ns,
    of the files sent in), at most ``max_files``, in path order, and ``size`` bytes in total.

    ``content_wanted`` (see :class:`snekbox_client.ContentWanted`): only the contents it asks
    for are read; the other files come back with their size and no content.

    ``strict`` ``False`` (a session's cell): what breaks a rule is left out instead, and the
    files found by ``timeout`` are returned.

    Raises:
        CollectError: ``strict``, and parsing took longer than ``timeout``, went too deep, or
            met a file name that is not UTF-8.
    """
    deadline = time.monotonic() + timeout
    found = sorted(_scan(root_fd, deadline, strict), key=lambda item: item[0])
    files: list[File] = []
    total = 0
    room = content_wanted.max_bytes if content_wanted else 0
    for rel, info in found:
        if time.monotonic() > deadline:
            if not strict:
                break
            raise CollectError(_TIMEOUT)
        if written.get(rel) == info.st_mtime_ns:
            continue
        if len(files) >= max_files:
            break
        total += info.st_size
        if total > size:
            break
        # content_wanted: whole, its first head_bytes, or nothing but the size.
        if content_wanted is None:
            content = read_beneath(root_fd, rel, info)
        elif not content_wanted.matches(rel):
            files.append(File(rel, b"", info.st_size))
            continue
        elif info.st_size <= room:
            content = read_beneath(root_fd, rel, info)
            room -= len(content or b"")
        else:
            content = read_beneath(root_fd, rel, info, content_wanted.head_bytes)
            if content is not None:
                files.append(File(rel, content, info.st_size))
            continue
        if content is not None:
            files.append(File(rel, content))
    return tuple(files)


def snapshot(root_fd: int, *, timeout: float) -> dict[str, int]:
    """The mtimes (ns) of the files :func:`collect` would return now, leniently (a session's
    cell returns only what it changes, and what the cell before left never keeps the next
    from running)."""
    found = _scan(root_fd, time.monotonic() + timeout, strict=False)
    return {rel: info.st_mtime_ns for rel, info in found}


def _scan(root_fd: int, deadline: float, strict: bool) -> list[tuple[str, os.stat_result]]:
    """The regular files below ``root_fd`` that Snekbox would return, with their stats."""
    found: list[tuple[str, os.stat_result]] = []
    walk = walk_files(root_fd, max_depth=MAX_DEPTH, deadline=deadline, strict=strict)
    with contextlib.closing(walk):
        try:
            for rel, info in _named_by_the_rules(walk, strict):
                found.append((rel, info))
        except RecursionError as exc:
            raise CollectError(_TOO_DEEP) from exc
        except TimeoutError as exc:
            raise CollectError(_TIMEOUT) from exc
    return found


def _named_by_the_rules(
    files: Iterator[tuple[str, os.stat_result]], strict: bool
) -> Iterator[tuple[str, os.stat_result]]:
    """``files`` without names starting with ``_``, nor (leniently) those not UTF-8.

    Raises:
        CollectError: ``strict``, and a name is not UTF-8.
    """
    for rel, info in files:
        if rel.rpartition("/")[2].startswith("_"):
            continue
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError as exc:
            if not strict:
                continue
            raise CollectError(_NOT_UTF8) from exc
        yield rel, info
