"""The working directory of one run: a fresh, size-bounded tmpfs seen as ``/home`` inside.

Where this process may mount (root), each run gets its own tmpfs, mounted by syscall (~0.2 ms)
with a size and an inode bound, on a directory inside a private 0700 directory of the service.
Elsewhere it is a plain directory and only the output collection bounds what comes back.
Input files are written in before the run; output files are collected after it by Snekbox's
rules, reading regular files only and never following a symlink.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from .models import FileAttachment
from .procfs import alive

__all__ = ["CollectError", "Workdir", "WorkdirRoot", "WriteError"]

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2

# Directories nested deeper than this are not searched for output files (Snekbox stops at
# Python's recursion limit with the same message).
MAX_DEPTH = 100
# The service's private directories: evaluator-<pid>-<random>.
_ROOT_NAME = re.compile(r"evaluator-(\d+)-\w+")


class WriteError(Exception):
    """An input file could not be written; the message is the run's output (Snekbox's)."""


class CollectError(Exception):
    """Output files could not be collected; the message is the run's output (Snekbox's)."""


class WorkdirRoot:
    """The service's private 0700 directory, under which every working directory lives."""

    def __init__(self, path: Path, can_mount: bool) -> None:
        self.path = path
        self.can_mount = can_mount

    @classmethod
    def create(cls, base: str | None) -> WorkdirRoot:
        """Create the private directory and find out whether tmpfs mounts are allowed.

        Directories left by an evaluator that died are removed first.
        """
        parent = Path(base or tempfile.gettempdir())
        sweep(parent)
        path = Path(tempfile.mkdtemp(prefix=f"evaluator-{os.getpid()}-", dir=parent))
        # Searchable, not listable: runs with a uid of their own must reach their directory.
        path.chmod(0o711)
        probe = path / "probe"
        probe.mkdir()
        try:
            _mount_tmpfs(probe, 1024 * 1024, 16)
        except OSError as exc:
            log.debug("no tmpfs per run: %s", exc)
            can_mount = False
        else:
            _unmount(probe)
            can_mount = True
        probe.rmdir()
        return cls(path, can_mount)

    def remove(self) -> None:
        _remove_tree(self.path)


class Workdir:
    """One run's working directory (``/home`` inside the sandbox)."""

    def __init__(self, path: Path, mounted: bool, size: int) -> None:
        self.path = path
        self.mounted = mounted
        self.size = size
        self.owner: tuple[int, int] | None = None

    @classmethod
    def create(
        cls, root: WorkdirRoot, size: int, inodes: int, owner: tuple[int, int] | None = None
    ) -> Workdir:
        """A fresh directory: a tmpfs of ``size`` bytes and ``inodes`` inodes where possible.

        ``owner``: the host ``(uid, gid)`` of the run, which then owns the directory.
        """
        path = Path(tempfile.mkdtemp(prefix="run-", dir=root.path))
        if root.can_mount:
            try:
                _mount_tmpfs(path, size, inodes, owner)
            except OSError:
                path.rmdir()
                raise
        elif owner is not None:
            os.chown(path, *owner)
        workdir = cls(path, root.can_mount, size)
        workdir.owner = owner
        # TMPDIR inside; hidden, so never returned.
        (path / ".tmp").mkdir(mode=0o700)
        if owner is not None:
            os.chown(path / ".tmp", *owner)
        return workdir

    def write_files(self, files: Iterable[FileAttachment]) -> dict[str, int]:
        """Write the request's files; return their mtimes (ns) to spot unmodified ones later.

        Raises:
            WriteError: a file could not be created (e.g. no space left).
        """
        written: dict[str, int] = {}
        for file in files:
            target = Path(os.path.normpath(self.path / file.path))
            try:
                if self.path not in target.parents:
                    raise IsADirectoryError(errno.EISDIR, "not a file path", str(target))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(file.content)
                target.chmod(0o777)
                if self.owner is not None:
                    _chown_below(self.path, target, self.owner)
                written[str(target.relative_to(self.path))] = target.stat().st_mtime_ns
            except OSError as exc:
                raise WriteError(
                    f"{type(exc).__name__}: Failed to create file '{file.path}'."
                ) from exc
        return written

    def collect(
        self, written: Mapping[str, int], *, max_files: int, timeout: float
    ) -> tuple[FileAttachment, ...]:
        """The files the run created or modified, by Snekbox's rules (pattern ``**/[!_]*``).

        Not returned: names starting with ``_``, anything under a directory or with a name
        starting with ``.``, symlinks, FIFOs and other non-regular files, files sent in and left
        unmodified. At most ``max_files``, in path order, and no more than the working directory's
        size in total.

        Raises:
            CollectError: parsing took longer than ``timeout``, went too deep, or met a file
                name that is not UTF-8.
        """
        deadline = time.monotonic() + timeout
        root_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            found: list[tuple[str, os.stat_result]] = []
            _scan(root_fd, "", 0, found, deadline)
            found.sort(key=lambda item: item[0])
            files: list[FileAttachment] = []
            total = 0
            for rel, info in found:
                if time.monotonic() > deadline:
                    raise CollectError(
                        "TimeoutError: Exceeded time limit while parsing attachments"
                    )
                if written.get(rel) == info.st_mtime_ns:
                    continue
                if len(files) >= max_files:
                    break
                total += info.st_size
                if total > self.size:
                    break
                content = _read_beneath(root_fd, rel, info)
                if content is not None:
                    files.append(FileAttachment(rel, content))
            return tuple(files)
        finally:
            os.close(root_fd)

    def remove(self) -> None:
        """Unmount and delete the directory."""
        if self.mounted:
            _unmount(self.path)
            self.mounted = False
        _remove_tree(self.path)


def sweep(parent: Path) -> None:
    """Remove the private directories (and their mounts) of evaluators that no longer run."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _ROOT_NAME.fullmatch(entry.name)
        if match is None or alive(int(match[1])) or not entry.is_dir():
            continue
        log.info("removing %s, left by evaluator process %s", entry, match[1])
        for mount_point in _mounts_under(entry):
            _unmount(mount_point)
        _remove_tree(entry)


def _scan(
    dir_fd: int, prefix: str, depth: int, found: list[tuple[str, os.stat_result]], deadline: float
) -> None:
    if depth > MAX_DEPTH:
        raise CollectError(
            "FileParsingError: Exceeded directory depth limit while parsing attachments"
        )
    for name in os.listdir(dir_fd):
        if time.monotonic() > deadline:
            raise CollectError("TimeoutError: Exceeded time limit while parsing attachments")
        if name.startswith("."):
            continue
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        rel = prefix + name
        if stat.S_ISDIR(info.st_mode):
            try:
                sub_fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
            except OSError:
                continue
            try:
                _scan(sub_fd, rel + "/", depth + 1, found, deadline)
            finally:
                os.close(sub_fd)
        elif stat.S_ISREG(info.st_mode) and not name.startswith("_"):
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise CollectError(
                    "FileParsingError: invalid bytes in filename while parsing attachments"
                ) from exc
            found.append((rel, info))


def _read_beneath(root_fd: int, rel: str, expected: os.stat_result) -> bytes | None:
    """Read a regular file below ``root_fd`` without following any symlink; None if it changed."""
    *dirs, name = rel.split("/")
    fds: list[int] = []
    try:
        dir_fd = root_fd
        for part in dirs:
            dir_fd = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
            )
            fds.append(dir_fd)
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
        fds.append(fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != expected.st_ino:
            return None
        chunks: list[bytes] = []
        remaining = expected.st_size
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 1 << 20))):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _chown_below(root: Path, target: Path, owner: tuple[int, int]) -> None:
    """Give ``target`` and the directories between it and ``root`` to the run's user."""
    for path in [target, *target.parents]:
        if path == root:
            return
        os.chown(path, *owner, follow_symlinks=False)


def _mount_tmpfs(path: Path, size: int, inodes: int, owner: tuple[int, int] | None = None) -> None:
    options = f"size={size},nr_inodes={inodes},mode=0700".encode()
    if owner is not None:
        options += f",uid={owner[0]},gid={owner[1]}".encode()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs: {os.strerror(err)}", str(path))


def _unmount(path: Path) -> None:
    # Lazy: a straggling open file cannot keep the mount (or the run's memory) alive.
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
            raise OSError(err, f"umount: {os.strerror(err)}", str(path))


def _mounts_under(directory: Path) -> list[Path]:
    prefix = str(directory) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Octal escapes (\040 for a space) never occur in the names this module creates.
        mount_point = line.split()[4]
        if mount_point.startswith(prefix):
            found.append(Path(mount_point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except PermissionError:
        # Code running as this same (non-root) user may have taken away write permission.
        for directory, _, _ in os.walk(path):
            os.chmod(directory, 0o700)
        shutil.rmtree(path)
