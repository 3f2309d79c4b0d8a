"""The working directory of one run: a fresh, size-bounded tmpfs seen as ``/home`` inside.

Where this process may mount (root), each run gets its own tmpfs, mounted by syscall (~0.2 ms)
with a size and an inode bound, on a directory inside a private directory of the service.
Where it may not (an ordinary user), the run's launcher mounts that tmpfs in a user and mount
namespace of its own (:mod:`._launcher`), and this process reaches it by a descriptor opened
through ``/proc/<launcher>/root`` (:meth:`Workdir.attach`), which keeps it alive after the run's
namespaces are gone. Unsandboxed, it is a plain directory, and only the output collection
bounds what comes back.
The run's ``/dev/shm`` is a second such tmpfs, made the same way and bound there by bwrap (whose
own ``--tmpfs`` cannot be ``noexec``): neither is a place a dropped binary runs from.
Input files are written in before the run; output files are collected after it by Snekbox's
rules, reading regular files only and never following a symlink.

Whatever the code did to its own files (modes that lock out their owner, deep trees), collection
and removal work: when this process is not root, it owns those files and gives itself back the
permissions it needs, through descriptors that never follow a symlink.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from snekbox_client import ContentWanted, File

from .procfs import alive

__all__ = ["TMP_DIR", "CollectError", "Workdir", "WorkdirRoot", "WriteError"]

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2

# Directories nested deeper than this are not searched for output files (Snekbox stops at
# Python's recursion limit with the same message).
MAX_DEPTH = 100
# The service's private directories: evaluator-<pid>-<random>.
_ROOT_NAME = re.compile(r"evaluator-(\d+)-\w+")
#: The run's TMPDIR, relative to the working directory; hidden, so never returned.
TMP_DIR = ".tmp"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Files ``/dev/shm`` can hold: multiprocessing's semaphores and shared memory blocks take one
#: each; without a bound, an inode bomb there would eat the run's memory.
SHM_INODES = 1024


class WriteError(Exception):
    """An input file could not be written; the message is the run's output (Snekbox's)."""


class CollectError(Exception):
    """Output files could not be collected; the message is the run's output (Snekbox's)."""


class WorkdirRoot:
    """The service's private directory, under which every working directory lives.

    Mode 0711: a run with a host uid of its own reaches its working directory through it, but
    cannot list it.
    """

    def __init__(self, path: Path, can_mount: bool) -> None:
        self.path = path
        self.can_mount = can_mount
        #: The runs' launchers mount their working directories (set by the service).
        self.launchers_mount = False

    @property
    def bounded(self) -> bool:
        """Whether each working directory is a size-bounded tmpfs."""
        return self.can_mount or self.launchers_mount

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
        #: The directory as the run's launcher (and bwrap) sees it.
        self.path = path
        #: Where this process reads and writes it: ``path``, or the launcher's tmpfs.
        self.access = path
        self.mounted = mounted
        self.size = size
        self.owner: tuple[int, int] | None = None
        #: ``(bytes, inodes)`` of the tmpfs the run's launcher mounts, until :meth:`attach`.
        self.launcher_mount: tuple[int, int] | None = None
        #: The host directory bound as ``/dev/shm``: a ``noexec`` tmpfs there (mounted by this
        #: process, or by the launcher when :attr:`launcher_mount` is set); ``None``: bwrap's
        #: own tmpfs, where binaries run (no mount is possible here).
        self.shm: Path | None = None
        self._shm_mounted = False
        self._fd: int | None = None

    @classmethod
    def create(
        cls,
        root: WorkdirRoot,
        size: int,
        inodes: int,
        owner: tuple[int, int] | None = None,
        shm_size: int | None = None,
    ) -> Workdir:
        """A fresh directory: a tmpfs of ``size`` bytes and ``inodes`` inodes where possible.

        ``owner``: the host ``(uid, gid)`` of the run, which then owns the directory.
        ``shm_size``: bytes of the run's ``/dev/shm``, made beside it where a tmpfs can be
        (:attr:`shm`); ``None``: none.
        """
        path = Path(tempfile.mkdtemp(prefix="run-", dir=root.path))
        shm = Path(f"{path}.shm") if shm_size is not None and root.bounded else None
        if shm is not None:
            shm.mkdir(mode=0o700)
        if root.launchers_mount and not root.can_mount:
            workdir = cls(path, False, size)
            workdir.launcher_mount = (size, inodes)
            workdir.shm = shm
            return workdir
        if root.can_mount:
            try:
                _mount_tmpfs(path, size, inodes, owner)
                if shm is not None and shm_size is not None:
                    try:
                        _mount_tmpfs(shm, shm_size, SHM_INODES, owner)
                    except OSError:
                        _unmount(path)
                        raise
            except OSError:
                path.rmdir()
                if shm is not None:
                    shm.rmdir()
                raise
        elif owner is not None:
            os.chown(path, *owner)
        workdir = cls(path, root.can_mount, size)
        workdir.owner = owner
        workdir.shm, workdir._shm_mounted = shm, shm is not None
        (path / TMP_DIR).mkdir(mode=0o700)
        if owner is not None:
            os.chown(path / TMP_DIR, *owner)
        return workdir

    def attach(self, pid: int) -> None:
        """Reach the tmpfs launcher ``pid`` mounted (:data:`launcher_mount`) from now on.

        Raises:
            OSError: it cannot be opened, or what is there is not the launcher's mount.
        """
        fd = os.open(f"/proc/{pid}/root{self.path}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        if os.fstat(fd).st_dev == os.stat(self.path).st_dev:
            os.close(fd)
            raise OSError(errno.ENOENT, "the launcher's working directory is not mounted")
        self._fd = fd
        self.access = Path(f"/proc/self/fd/{fd}")
        self.mounted = True

    def write_files(self, files: Iterable[File]) -> dict[str, int]:
        """Write the request's files; return their mtimes (ns) to spot unmodified ones later.

        In a session the code has had the directory to itself: any name may be a symlink, a FIFO
        or a directory it planted, and its threads may still be changing them. So every step goes
        through descriptors that never follow a symlink: each directory on the way is opened
        ``O_NOFOLLOW``, the file is opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO cannot block this
        thread) and must be a regular file, and its mode and owner are set on that descriptor.

        Raises:
            WriteError: a file could not be created (no space left, or its path is taken by
                something that is not a directory or a regular file).
        """
        written: dict[str, int] = {}
        files = list(files)
        if not files:
            return written
        try:
            root_fd = _open_dir(self.path) if self._fd is None else _open_attached(self._fd)
        except OSError as exc:
            raise _write_error(exc, files[0]) from exc
        try:
            for file in files:
                target = Path(os.path.normpath(self.access / file.path))
                try:
                    if self.access not in target.parents:
                        raise IsADirectoryError(errno.EISDIR, "not a file path", str(target))
                    relative = target.relative_to(self.access)
                    written[str(relative)] = self._write_beneath(root_fd, relative.parts, file)
                except OSError as exc:
                    raise _write_error(exc, file) from exc
        finally:
            os.close(root_fd)
        return written

    def _write_beneath(self, root_fd: int, parts: tuple[str, ...], file: File) -> int:
        """Write one file below ``root_fd``, making its directories; return its mtime (ns)."""
        *dirs, name = parts
        fds: list[int] = []
        try:
            dir_fd = root_fd
            for part in dirs:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=dir_fd)
                dir_fd = _open_dir(part, dir_fd)
                fds.append(dir_fd)
                if self.owner is not None:
                    os.fchown(dir_fd, *self.owner)
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
            except PermissionError:
                fd = _reopen_repaired(name, dir_fd, stat.S_ISREG, 0o200, flags)
            fds.append(fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FileExistsError(errno.EEXIST, "not a regular file", name)
            os.ftruncate(fd, 0)
            view = memoryview(file.content)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o777)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            return os.fstat(fd).st_mtime_ns
        finally:
            for fd in reversed(fds):
                os.close(fd)

    def collect(
        self,
        written: Mapping[str, int],
        *,
        max_files: int,
        timeout: float,
        content_wanted: ContentWanted | None = None,
        strict: bool = True,
    ) -> tuple[File, ...]:
        """The files the run created or modified, by Snekbox's rules (pattern ``**/[!_]*``).

        Not returned: names starting with ``_``, anything under a directory or with a name
        starting with ``.``, symlinks, FIFOs and other non-regular files, files sent in and left
        unmodified. At most ``max_files``, in path order, and no more than the working directory's
        size in total.

        ``content_wanted`` (see :class:`snekbox_client.ContentWanted`): only the contents it
        asks for are read; the other files come back with their size and no content.

        ``strict`` ``False`` (a session's cell): what breaks a rule is left out instead, and
        the files found by ``timeout`` are returned; else one bad name would lose every later
        cell's output, until the code that cannot run undoes it.

        Raises:
            CollectError: ``strict``, and parsing took longer than ``timeout``, went too deep,
                or met a file name that is not UTF-8.
        """
        deadline = time.monotonic() + timeout
        root_fd = _open_dir(self.path) if self._fd is None else _open_attached(self._fd)
        try:
            found = _scan_all(root_fd, deadline, strict)
            found.sort(key=lambda item: item[0])
            files: list[File] = []
            total = 0
            room = content_wanted.max_bytes if content_wanted else 0  # content_wanted
            for rel, info in found:
                if time.monotonic() > deadline:
                    if not strict:
                        break
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
                # content_wanted: whole, its first head_bytes, or nothing but the size.
                if content_wanted is None:
                    content = _read_beneath(root_fd, rel, info)
                elif not content_wanted.matches(rel):
                    files.append(File(rel, b"", info.st_size))
                    continue
                elif info.st_size <= room:
                    content = _read_beneath(root_fd, rel, info)
                    room -= len(content or b"")
                else:
                    content = _read_beneath(root_fd, rel, info, content_wanted.head_bytes)
                    if content is not None:
                        files.append(File(rel, content, info.st_size))
                    continue
                if content is not None:
                    files.append(File(rel, content))
            return tuple(files)
        finally:
            os.close(root_fd)

    def snapshot(self, *, timeout: float) -> dict[str, int]:
        """The mtimes (ns) of the files :meth:`collect` would return now: a session's cell
        returns only what it changes. As :meth:`collect` with ``strict`` ``False``: what the
        cell before left never keeps the next from running."""
        root_fd = _open_dir(self.path) if self._fd is None else _open_attached(self._fd)
        try:
            found = _scan_all(root_fd, time.monotonic() + timeout, strict=False)
            return {rel: info.st_mtime_ns for rel, info in found}
        finally:
            os.close(root_fd)

    def remove(self) -> None:
        """Unmount and delete the directory."""
        if self._fd is not None:
            # The last reference to the launcher's tmpfs, once its namespaces are gone.
            os.close(self._fd)
            self._fd = None
            self.access = self.path
            self.mounted = False
        if self.mounted:
            _unmount(self.path)
            self.mounted = False
        _remove_tree(self.path)
        if self.shm is not None:
            if self._shm_mounted:  # else the launcher's, gone with its namespaces
                _unmount(self.shm)
                self._shm_mounted = False
            _remove_tree(self.shm)
            self.shm = None


def _write_error(exc: OSError, file: File) -> WriteError:
    """Snekbox's words for an input file that could not be written: the run's output."""
    return WriteError(f"{type(exc).__name__}: Failed to create file '{file.path}'.")


def sweep(parent: Path) -> None:
    """Remove the private directories (and their mounts) of evaluators that no longer run."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _ROOT_NAME.fullmatch(entry.name)
        if match is None or alive(int(match[1])):
            continue
        try:
            info = entry.lstat()
            # Only this user's own directories: the parent may be shared (/tmp).
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            log.info("removing %s, left by evaluator process %s", entry, match[1])
            for mount_point in _mounts_under(entry):
                _unmount(mount_point)
            _remove_tree(entry)
        except OSError as exc:
            # Whatever is left there must not keep the service from starting.
            log.warning(
                "could not remove %s, left by evaluator process %s: %s", entry, match[1], exc
            )


class _Lenient(Exception):
    """Out of time in a lenient scan: the rest is left out."""


def _scan_all(root_fd: int, deadline: float, strict: bool) -> list[tuple[str, os.stat_result]]:
    """The regular files below ``root_fd`` that Snekbox would return, with their stats."""
    found: list[tuple[str, os.stat_result]] = []
    with contextlib.suppress(_Lenient):  # out of time: what was found by then
        _scan(root_fd, "", 0, found, deadline, strict)
    return found


def _scan(
    dir_fd: int,
    prefix: str,
    depth: int,
    found: list[tuple[str, os.stat_result]],
    deadline: float,
    strict: bool,
) -> None:
    if depth > MAX_DEPTH:
        if not strict:
            return
        raise CollectError(
            "FileParsingError: Exceeded directory depth limit while parsing attachments"
        )
    for name in os.listdir(dir_fd):
        if time.monotonic() > deadline:
            if not strict:
                raise _Lenient
            raise CollectError("TimeoutError: Exceeded time limit while parsing attachments")
        if name.startswith("."):
            continue
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:  # removed since listed: by a session's running process
            continue
        rel = prefix + name
        if stat.S_ISDIR(info.st_mode):
            try:
                sub_fd = _open_dir(name, dir_fd)
            except OSError:
                continue
            try:
                _scan(sub_fd, rel + "/", depth + 1, found, deadline, strict)
            finally:
                os.close(sub_fd)
        elif stat.S_ISREG(info.st_mode) and not name.startswith("_"):
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError as exc:
                if not strict:
                    continue
                raise CollectError(
                    "FileParsingError: invalid bytes in filename while parsing attachments"
                ) from exc
            found.append((rel, info))


def _read_beneath(
    root_fd: int, rel: str, expected: os.stat_result, limit: int | None = None
) -> bytes | None:
    """Read a regular file below ``root_fd`` without following any symlink; None if it changed.

    ``limit``: read only the first bytes (content_wanted's head).
    """
    *dirs, name = rel.split("/")
    fds: list[int] = []
    try:
        dir_fd = root_fd
        for part in dirs:
            dir_fd = _open_dir(part, dir_fd)
            fds.append(dir_fd)
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except PermissionError:
            fd = _reopen_repaired(
                name, dir_fd, stat.S_ISREG, 0o400, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
            )
        fds.append(fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != expected.st_ino:
            return None
        chunks: list[bytes] = []
        remaining = expected.st_size if limit is None else min(expected.st_size, limit)
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 1 << 20))):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        for fd in reversed(fds):
            os.close(fd)


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


def _open_attached(path_fd: int) -> int:
    """Open the directory ``path_fd`` pins (``O_PATH``), its owner's ``rwx`` given back first."""
    pinned = f"/proc/self/fd/{path_fd}"
    info = os.stat(pinned)
    if info.st_mode & 0o700 != 0o700 and info.st_uid == os.geteuid():
        os.chmod(pinned, stat.S_IMODE(info.st_mode) | 0o700)
    return os.open(".", _DIR_FLAGS, dir_fd=path_fd)


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """Open a directory, never through a symlink, with its owner's ``rwx`` given back if it is ours.

    The code may have taken them away from its own directories (which this process owns when it
    is not root); without them, nothing below could be listed, read or removed.
    """
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        return _reopen_repaired(
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


def _reopen_repaired(
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


def _remove_tree(path: Path) -> None:
    """Delete ``path`` and everything below it, whatever the code did to it.

    Iterative and descriptor-based: any depth works with two descriptors open, no symlink is
    followed, no other file system (a mount point left behind) is entered, and the modes the code
    took away are given back on the way down (see :func:`_open_dir`).
    """
    try:
        fd = _open_dir(path)
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
                child = _open_dir(subdirs[-1], fd)
                way_down.append(((here.st_dev, here.st_ino), subdirs))
                fd, parent = child, fd
                os.close(parent)
                here = os.fstat(fd)
                if here.st_dev != device:
                    raise OSError(errno.EXDEV, "a mount point is left below", str(path))
                subdirs = _clear(fd)
            elif way_down:
                identity, subdirs = way_down.pop()
                fd, child = os.open("..", _DIR_FLAGS, dir_fd=fd), fd
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
