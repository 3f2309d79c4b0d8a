"""The host users the runs have: an unprivileged uid and gid of their own for every sandbox.

A service started by root never lets a run keep root: each sandbox gets a host uid (and the
same gid) from a range reserved for it, ``first .. first + count - 1``, with no supplementary
groups. Two sandboxes alive at once never share a uid, even of two services on one host (a uid
is claimed with an exclusive ``flock`` on a file of its own under :data:`CLAIMS`, held while
the sandbox lives and released by the kernel if the service dies), so the kernel's per-user
quotas
(inotify instances and watches, RLIMIT_NPROC, queued signals, POSIX message queues, pipe
buffers) are per run: one run exhausting one cannot starve the host or another run. The uids
own no file on the host and need no passwd entry; the range is checked at start to be unused
(the entries the system lists), and each uid again before its first use (for user databases
that cannot be listed).

A service started by an ordinary user cannot change uid: every run keeps that user's uid, and
the per-user quotas are shared (the seccomp filter then refuses inotify, the one a run could
exhaust at no cost; see :mod:`.seccomp`), but for RLIMIT_NPROC, which each run's launcher sets in
a user namespace of its own, where the kernel counts that run's tasks alone (see :mod:`.limits`).

The sandbox user must reach the interpreter through the host's directories: those it may not
traverse (``/root`` is 0700, and pyenv, uv and venvs often live below it) are covered, in each
run's own mount namespace, by a tmpfs holding only the paths the sandbox binds (see
:func:`covers`).
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import stat
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from .errors import SandboxUnavailable

__all__ = ["CLAIMS", "RunUsers", "covers"]

#: Where root services claim the uids of their sandboxes (``/run`` when there is one).
CLAIMS = "python-mcp-evaluator-uids"


class RunUsers:
    """The host ``(uid, gid)`` each sandbox gets: from a reserved range as root, else ``None``.

    Args:
        first: The first uid (and gid) of the range; ``None`` when runs keep the service's uid.
        count: How many sandboxes may be alive at once.
    """

    def __init__(self, first: int | None, count: int, claims: Path | None = None) -> None:
        self.first = first
        self.count = count
        self._claims = claims
        self._held: dict[int, int] = {}  # uid -> the fd holding its claim
        self._checked: dict[int, bool] = {}  # uid -> whether no user or group has it
        # Sandboxes are made in a worker thread too (see pool.SandboxPool.refill).
        self._lock = threading.Lock()

    @classmethod
    def for_service(cls, first: int, count: int) -> RunUsers:
        """Runs drop to ``first ..`` when this process is root; else they keep its uid.

        Raises:
            SandboxUnavailable: a uid or gid of the range belongs to a user or group here.
        """
        if os.geteuid() != 0:
            return cls(None, count)
        listed = [("user", u.pw_name, u.pw_uid) for u in pwd.getpwall()]
        listed += [("group", g.gr_name, g.gr_gid) for g in grp.getgrall()]
        for kind, name, number in listed:
            if first <= number < first + count:
                raise SandboxUnavailable(
                    f"the sandboxes' host ids {first}-{first + count - 1} must be unused, but "
                    f"{number} is the {kind} {name!r}: set EVALUATOR_SANDBOX_UID to the "
                    "start of a free range"
                )
        base = Path("/run") if os.path.isdir("/run") else Path(tempfile.gettempdir())
        claims = base / CLAIMS
        claims.mkdir(mode=0o700, exist_ok=True)
        if claims.is_symlink() or claims.stat().st_uid != 0:
            raise SandboxUnavailable(f"{claims} must be a directory of root's")
        return cls(first, count, claims)

    @property
    def dropping(self) -> bool:
        """Whether runs get uids of their own (the service is root)."""
        return self.first is not None

    def take(self) -> tuple[int, int] | None:
        """A free ``(uid, gid)`` for a new sandbox; ``None`` when runs keep the service's.

        Raises:
            OSError: every uid of the range is in use (more sandboxes than ``count``).
        """
        if self.first is None or self._claims is None:
            return None
        with self._lock:
            return self._take(self.first, self._claims)

    def _take(self, first: int, claims: Path) -> tuple[int, int]:
        # The lowest free one, so that a quiet service keeps using the same few.
        for uid in range(first, first + self.count):
            if uid in self._held or not self._unused(uid):
                continue
            fd = os.open(claims / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # another service's sandbox has it
                continue
            self._held[uid] = fd
            return uid, uid
        raise OSError(f"all {self.count} sandbox uids from {first} are in use")

    def _unused(self, uid: int) -> bool:
        """Whether no user or group has the id (looked up once, on first use)."""
        if uid not in self._checked:
            for lookup in (pwd.getpwuid, grp.getgrgid):
                with contextlib.suppress(KeyError):
                    lookup(uid)
                    self._checked[uid] = False
                    return False
            self._checked[uid] = True
        return self._checked[uid]

    def give_back(self, user: tuple[int, int] | None) -> None:
        """Return a sandbox's uid once none of its processes is left."""
        if user is None:
            return
        with self._lock:
            fd = self._held.pop(user[0], None)
        if fd is not None:
            os.close(fd)  # releases the claim

    def close(self) -> None:
        """Release every claim (the sandboxes are gone)."""
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held.clear()

    def describe(self) -> str:
        if self.first is None:
            return (
                f"this service's own uid ({os.getuid()}): the per-user kernel quotas are shared "
                "with it; inotify is refused"
            )
        return (
            f"host uids {self.first}-{self.first + self.count - 1}, one per sandbox alive, "
            "no capabilities, no supplementary groups"
        )


def covers(paths: Iterable[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The directories a user with no file of its own cannot traverse, with the paths below.

    For each path, the highest ancestor lacking the others' search bit is the one to cover;
    the paths are grouped by it.

    Raises:
        SandboxUnavailable: a path itself is not searchable (a directory) or readable (a
            file) by others, so no cover can make it usable.
    """
    found: dict[str, list[str]] = {}
    unique = {os.path.normpath(p) for p in paths}
    # A path inside another one comes with it (the bundled bwrap inside the venv, say).
    outermost = [p for p in unique if not any(p.startswith(q + "/") for q in unique if q != p)]
    for path in sorted(outermost):
        info = os.stat(path)
        needed = stat.S_IXOTH if stat.S_ISDIR(info.st_mode) else stat.S_IROTH
        if info.st_mode & needed != needed:
            raise SandboxUnavailable(
                f"the sandbox user cannot reach {path} (mode {stat.filemode(info.st_mode)}): "
                "make it searchable (directories) or readable (files) by others, or run the "
                "service as an ordinary user"
            )
        for ancestor in reversed(Path(path).parents[:-1]):  # from the top, "/" excluded
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                found.setdefault(str(ancestor), []).append(path)
                break
    return tuple((blocked, tuple(sorted(below))) for blocked, below in sorted(found.items()))
