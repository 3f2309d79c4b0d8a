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

import asyncio
import ctypes
import errno
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from snekbox_client import ContentWanted, File

from . import output_files
from .errors import CollectError, WriteError
from .fileops import open_dir, open_pinned, read_regular, remove_tree, write_beneath
from .procfs import alive

__all__ = ["INLINE_BYTES", "TMP_DIR", "CollectError", "Workdir", "WorkdirRoot", "WriteError"]

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2

# The service's private directories: evaluator-<pid>-<random>.
_ROOT_NAME = re.compile(r"evaluator-(\d+)-\w+")
#: The run's TMPDIR, relative to the working directory; hidden, so never returned.
TMP_DIR = ".tmp"
#: Hidden entries :meth:`Workdir.holds_nothing` reads before it gives up (and says no).
_FEW_HIDDEN = 4
#: Work on this many bytes is done on the event loop (tens of microseconds) rather than in a
#: worker thread, whose hop costs more (0.1 to 0.4 ms, more on a busy host): a request's body
#: and answer (see :mod:`.api`), its files (the gateway's prelude is two of 2 KB).
INLINE_BYTES = 16 * 1024
#: Files written on the event loop at most (of at most INLINE_BYTES in all).
_INLINE_FILES = 4
#: Files ``/dev/shm`` can hold: multiprocessing's semaphores and shared memory blocks take one
#: each; without a bound, an inode bomb there would eat the run's memory.
SHM_INODES = 1024


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
        remove_tree(self.path)


class Workdir:
    """One run's working directory (``/home`` inside the sandbox)."""

    def __init__(self, path: Path, mounted: bool, size: int) -> None:
        #: The directory as the run's launcher (and bwrap) sees it.
        self.path = path
        #: Where this process reads and writes it: ``path``, or the launcher's tmpfs.
        self.access = path
        self.mounted = mounted
        self.size = size
        #: No code has run in it yet (a session's cell says when one has): it holds nothing the
        #: code planted, such as a large file where a request's file goes.
        self.fresh = True
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

    async def write_in(self, files: Sequence[File]) -> dict[str, int]:
        """:meth:`write_files`, on the event loop when a worker thread's hop would cost more:
        the files few, small and shallow, in a fresh tmpfs (nothing there to truncate or wait
        for, no disk); else in a worker thread."""
        size = sum(len(file.content) for file in files)
        few = len(files) <= _INLINE_FILES and size <= INLINE_BYTES
        if few and self.fresh and self.mounted and all(f.path.count("/") < 4 for f in files):
            return self.write_files(files)
        return await asyncio.to_thread(self.write_files, files)

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
            root_fd = self._open()
        except OSError as exc:
            raise _write_error(exc, files[0]) from exc
        try:
            for file in files:
                target = Path(os.path.normpath(self.access / file.path))
                try:
                    if self.access not in target.parents:
                        raise IsADirectoryError(errno.EISDIR, "not a file path", str(target))
                    relative = target.relative_to(self.access)
                    written[str(relative)] = write_beneath(
                        root_fd, relative.parts, file.content, self.owner
                    )
                except OSError as exc:
                    raise _write_error(exc, file) from exc
        finally:
            os.close(root_fd)
        return written

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
        root_fd = self._open()
        try:
            return output_files.collect(
                root_fd,
                written,
                size=self.size,
                max_files=max_files,
                timeout=timeout,
                content_wanted=content_wanted,
                strict=strict,
            )
        finally:
            os.close(root_fd)

    def read(self, rel: str, limit: int) -> bytes | None:
        """The regular file ``rel`` if it holds at most ``limit`` bytes, read through no
        symlink; ``None`` otherwise."""
        root_fd = self._open()
        try:
            return read_regular(root_fd, rel, limit)
        finally:
            os.close(root_fd)

    def snapshot(self, *, timeout: float) -> dict[str, int]:
        """The mtimes (ns) of the files :meth:`collect` would return now: a session's cell
        returns only what it changes. As :meth:`collect` with ``strict`` ``False``: what the
        cell before left never keeps the next from running."""
        root_fd = self._open()
        try:
            return output_files.snapshot(root_fd, timeout=timeout)
        finally:
            os.close(root_fd)

    def holds_nothing(self) -> bool:
        """Whether :meth:`collect` and :meth:`snapshot` would find nothing: no entry but a few
        named ``.*`` (the run's ``.tmp``, matplotlib's ``.config``), which they never enter.
        Judged from the first entries read, however many there are: cheap enough for the event
        loop, where a thread's hop would cost more."""
        root_fd = self._open()
        try:
            with os.scandir(root_fd) as entries:
                for seen, entry in enumerate(entries):
                    if seen == _FEW_HIDDEN or not entry.name.startswith("."):
                        return False
            return True
        finally:
            os.close(root_fd)

    def _open(self) -> int:
        """A descriptor of the directory, as this process reaches it."""
        return open_dir(self.path) if self._fd is None else open_pinned(self._fd)

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
        remove_tree(self.path)
        if self.shm is not None:
            if self._shm_mounted:  # else the launcher's, gone with its namespaces
                _unmount(self.shm)
                self._shm_mounted = False
            remove_tree(self.shm)
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
            remove_tree(entry)
        except OSError as exc:
            # Whatever is left there must not keep the service from starting.
            log.warning(
                "could not remove %s, left by evaluator process %s: %s", entry, match[1], exc
            )


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
