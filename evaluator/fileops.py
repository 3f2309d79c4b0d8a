"""Descriptor-safe file operations: writes, reads, walks and tree removal below a directory.

Every step goes through a descriptor, and none follows a symlink: each directory on the way is
opened ``O_NOFOLLOW`` relative to the one before (``openat``), a file is opened ``O_NOFOLLOW |
O_NONBLOCK`` (a planted FIFO cannot block the thread) and checked to be a regular file on its
descriptor. The trees these functions touch were the code's (a run's working directory, a
session's package directory), which may have planted symlinks, FIFOs and deep trees, and taken
the permissions away from its own files: when this process owns them (it is not root), it gives
itself back the bits it needs, on the very inode it pinned (see :func:`reopen_repaired`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Generator
from pathlib import Path

__all__ = [
    "DIR_FLAGS",
    "open_dir",
    "open_pinned",
    "read_beneath",
    "read_regular",
    "remove_tree",
    "reopen_repaired",
    "walk_files",
    "write_beneath",
]

#: How a directory is opened: never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """Open a directory, never through a symlink, with its owner's ``rwx`` given back if it is ours.

    The code may have taken them away from its own directories (which this process owns when it
    is not root); without them, nothing below could be listed, read or removed.
    """
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        return reopen_repaired(
            name, dir_fd, stat.S_ISDIR, 0o700, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        )
    try:
        info = os.fstat(fd)
        if info.st_mode & 0o700 != 0o700 and info.st_uid == os.geteuid():
            os.fchmod(fd, stat.S_IMODE(info.st_mode) | 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_pinned(path_fd: int) -> int:
    """Open the directory ``path_fd`` pins (``O_PATH``), its owner's ``rwx`` given back first."""
    pinned = f"/proc/self/fd/{path_fd}"
    info = os.stat(pinned)
    if info.st_mode & 0o700 != 0o700 and info.st_uid == os.geteuid():
        os.chmod(pinned, stat.S_IMODE(info.st_mode) | 0o700)
    return os.open(".", DIR_FLAGS, dir_fd=path_fd)


def reopen_repaired(
    name: str | Path,
    dir_fd: int | None,
    is_kind: Callable[[int], bool],
    bits: int,
    flags: int,
) -> int:
    """Open an entry of ours that we may not open (``EACCES``): add ``bits`` to its mode first.

    ``O_PATH | O_NOFOLLOW`` pins the entry itself, needing no permission on it (a symlink stays
    a symlink, and is refused like any entry not of ``is_kind``); the chmod and the reopening
    through ``/proc/self/fd`` act on that very inode, so no path is resolved twice.
    """
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        info = os.fstat(path_fd)
        if not is_kind(info.st_mode) or info.st_uid != os.geteuid():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
        pinned = f"/proc/self/fd/{path_fd}"
        os.chmod(pinned, stat.S_IMODE(info.st_mode) | bits)
        return os.open(pinned, flags)
    finally:
        os.close(path_fd)


def write_beneath(
    root_fd: int, parts: tuple[str, ...], content: bytes, owner: tuple[int, int] | None
) -> int:
    """Write ``content`` to the file ``parts`` below ``root_fd``, making its directories;
    return its mtime (ns).

    The file gets mode 0777 and, with its new directories, ``owner`` (a host ``(uid, gid)``).

    Raises:
        OSError: it cannot be written; ``FileExistsError`` when its path is taken by something
            that is not a directory or a regular file.
    """
    *dirs, name = parts
    fds: list[int] = []
    try:
        dir_fd = root_fd
        for part in dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=dir_fd)
            dir_fd = open_dir(part, dir_fd)
            fds.append(dir_fd)
            if owner is not None:
                os.fchown(dir_fd, *owner)
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        except PermissionError:
            fd = reopen_repaired(name, dir_fd, stat.S_ISREG, 0o200, flags)
        fds.append(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileExistsError(errno.EEXIST, "not a regular file", name)
        os.ftruncate(fd, 0)
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, 0o777)
        if owner is not None:
            os.fchown(fd, *owner)
        return os.fstat(fd).st_mtime_ns
    finally:
        for fd in reversed(fds):
            os.close(fd)


def read_beneath(
    root_fd: int, rel: str, expected: os.stat_result, limit: int | None = None
) -> bytes | None:
    """Read the regular file ``rel`` below ``root_fd``; ``None`` if it is no longer the file
    ``expected`` describes (or cannot be read).

    ``limit``: read only the first bytes.
    """
    fds: list[int] = []
    try:
        fd = _open_file(root_fd, rel, fds)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != expected.st_ino:
            return None
        return _read(fd, expected.st_size if limit is None else min(expected.st_size, limit))
    except OSError:
        return None
    finally:
        for fd in reversed(fds):
            os.close(fd)


def read_regular(root_fd: int, rel: str, limit: int) -> bytes | None:
    """The regular file ``rel`` below ``root_fd``, whole, if it holds at most ``limit`` bytes;
    ``None`` otherwise, or if its size changed as it was read, or a step of ``rel`` is not a
    plain name below the one before."""
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return None
    fds: list[int] = []
    try:
        fd = _open_file(root_fd, rel, fds)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = _read(fd, limit + 1)
        return data if len(data) == info.st_size else None
    except OSError:
        return None
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _open_file(root_fd: int, rel: str, fds: list[int]) -> int:
    """A descriptor of the entry ``rel`` below ``root_fd``, each directory on the way and the
    entry opened through no symlink, the entry non-blocking (a FIFO cannot hold the thread);
    each descriptor opened is put on ``fds``, for the caller to close."""
    *dirs, name = rel.split("/")
    dir_fd = root_fd
    for part in dirs:
        dir_fd = open_dir(part, dir_fd)
        fds.append(dir_fd)
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except PermissionError:
        fd = reopen_repaired(
            name, dir_fd, stat.S_ISREG, 0o400, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        )
    fds.append(fd)
    return fd


def _read(fd: int, most: int) -> bytes:
    """Up to ``most`` bytes of ``fd``, to its end."""
    chunks: list[bytes] = []
    while most > 0 and (chunk := os.read(fd, min(most, 1 << 20))):
        chunks.append(chunk)
        most -= len(chunk)
    return b"".join(chunks)


def walk_files(
    dir_fd: int, *, max_depth: int, deadline: float, strict: bool, prefix: str = ""
) -> Generator[tuple[str, os.stat_result], None, None]:
    """The regular files below ``dir_fd``, depth first in directory order: their paths relative
    to it (``/``-separated) and their stats. Entries named ``.*`` are neither entered nor given.

    ``strict`` ``False``: a directory deeper than ``max_depth`` is left out, and the walk ends
    when ``deadline`` (``time.monotonic()``) has passed.

    Raises:
        RecursionError: ``strict``, and a directory is deeper than ``max_depth``.
        TimeoutError: ``strict``, and ``deadline`` has passed.
    """
    yield from _walk(dir_fd, prefix, 0, max_depth, deadline, strict)


def _walk(
    dir_fd: int, prefix: str, depth: int, max_depth: int, deadline: float, strict: bool
) -> Generator[tuple[str, os.stat_result], None, bool]:
    """What :func:`walk_files` gives, from ``dir_fd`` at ``depth``; whether the walk goes on
    (``False``: a lenient walk ran out of time)."""
    if depth > max_depth:
        if strict:
            raise RecursionError("directory depth limit")
        return True
    for name in os.listdir(dir_fd):
        if time.monotonic() > deadline:
            if strict:
                raise TimeoutError("walk time limit")
            return False
        if name.startswith("."):
            continue
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:  # removed since listed: by a session's running process
            continue
        rel = prefix + name
        if stat.S_ISDIR(info.st_mode):
            try:
                sub_fd = open_dir(name, dir_fd)
            except OSError:
                continue
            try:
                going_on = yield from _walk(
                    sub_fd, rel + "/", depth + 1, max_depth, deadline, strict
                )
            finally:
                os.close(sub_fd)
            if not going_on:
                return False
        elif stat.S_ISREG(info.st_mode):
            yield rel, info
    return True


def remove_tree(path: Path) -> None:
    """Delete ``path`` and everything below it, whatever the code did to it; nothing there is
    no error.

    Iterative and descriptor-based: any depth works with two descriptors open, no symlink is
    followed, no other file system (a mount point left behind) is entered, and the modes the code
    took away are given back on the way down (see :func:`open_dir`).

    Raises:
        OSError: something below cannot be removed, is another file system's, or moved.
    """
    try:
        fd = open_dir(path)
    except FileNotFoundError:
        return
    try:
        here = os.fstat(fd)
        device = here.st_dev
        # The way down: each directory's identity, and its subdirectories still to remove.
        way_down: list[tuple[tuple[int, int], list[str]]] = []
        subdirs = _clear(fd)
        while True:
            if subdirs:
                child = open_dir(subdirs[-1], fd)
                way_down.append(((here.st_dev, here.st_ino), subdirs))
                fd, parent = child, fd
                os.close(parent)
                here = os.fstat(fd)
                if here.st_dev != device:
                    raise OSError(errno.EXDEV, "a mount point is left below", str(path))
                subdirs = _clear(fd)
            elif way_down:
                identity, subdirs = way_down.pop()
                fd, child = os.open("..", DIR_FLAGS, dir_fd=fd), fd
                os.close(child)
                here = os.fstat(fd)
                if (here.st_dev, here.st_ino) != identity:
                    raise OSError(errno.ESTALE, "the tree moved while it was removed", str(path))
                os.rmdir(subdirs.pop(), dir_fd=fd)
            else:
                break
    finally:
        os.close(fd)
    os.rmdir(path)


def _clear(dir_fd: int) -> list[str]:
    """Unlink every entry of a directory but its subdirectories, which are returned."""
    subdirs = []
    for name in os.listdir(dir_fd):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except IsADirectoryError:
            subdirs.append(name)
    return subdirs
