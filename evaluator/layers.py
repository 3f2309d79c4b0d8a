"""A layer on disk: a resolved set of packages, installed, sealed read-only, linked into a
session's directory, removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from . import fileops

__all__ = [
    "IN_SANDBOX",
    "MARKER",
    "Layer",
    "link_layer",
    "make_read_only",
    "not_plain",
    "remove_tree",
    "tree_size",
]

#: Where a sandbox finds its layers: each directory below goes on ``sys.path`` (see _agent.py).
IN_SANDBOX = "/opt/packages"
#: In a layer: its pins, one a line (written last, before the layer is put in place).
MARKER = ".complete"


@dataclass(frozen=True)
class Layer:
    """A resolved set, installed: ``path`` goes on ``sys.path`` (read-only in the sandbox)."""

    key: str
    path: Path
    #: Empty: the set resolved to nothing (its markers exclude every requirement here), and
    #: the layer is nothing to bind (``key`` is empty too).
    pins: tuple[str, ...]
    #: Seconds it took to resolve and install (or only to find, when ``cached``).
    seconds: float
    cached: bool


def link_layer(layer: Layer, directory: Path, order: int) -> bool:
    """Put ``layer`` into ``directory`` (a sandbox's, bound read-only at :data:`IN_SANDBOX`)
    as ``NNN-key``, its files hard-linked: no copy, and visible at once to the sandbox's
    interpreter, which puts it on ``sys.path`` before the next cell. ``False``: it was there.

    Raises:
        OSError: it cannot be linked (``directory`` is on another file system than the cache).
    """
    if not layer.pins or any(e.name.endswith(f"-{layer.key}") for e in directory.iterdir()):
        return False
    # symlinks=True: should one be there, it is copied as a link (resolved in the sandbox),
    # never followed to a host file (layers hold none: see not_plain). Under a hidden name
    # first, renamed once whole: a copy that failed half-way is never taken for the layer.
    partial = directory / f".linking-{layer.key}"
    try:
        shutil.copytree(layer.path, partial, symlinks=True, copy_function=_link)
        partial.rename(directory / f"{order:03d}-{layer.key}")
    finally:
        if partial.exists():
            remove_tree(partial)
    return True


def _link(source: str, target: str) -> None:
    os.link(source, target, follow_symlinks=False)


def not_plain(path: Path) -> str | None:
    """The first entry below ``path`` that is neither a directory nor a regular file."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            mode = os.lstat(os.path.join(root, name)).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                return os.path.relpath(os.path.join(root, name), path)
    return None


def tree_size(path: Path) -> int:
    """The bytes of the files below ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def make_read_only(path: Path) -> None:
    """A layer's files cannot be changed, even by the service, once installed."""
    for root, dirs, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(path, 0o555)


def remove_tree(path: Path) -> None:
    """Remove a layer (read-only, see :func:`make_read_only`) or a staging directory, as far as it
    can be removed: never raises."""
    with contextlib.suppress(OSError):
        fileops.remove_tree(path)
