"""The host users the runs have: an unprivileged uid and gid of their own for every sandbox.

A service started by root never lets a run keep root: each sandbox gets a host uid (and the
same gid) from a range reserved for it, ``first .. first + count - 1``, with no supplementary
groups. Two sandboxes alive at once never share a uid, so the kernel's per-user quotas
(inotify instances and watches, RLIMIT_NPROC, queued signals, POSIX message queues, pipe
buffers) are per run: one run exhausting one cannot starve the host or another run. The uids
own no file on the host and need no passwd entry; the range is checked at start to be unused.

A service started by an ordinary user cannot change uid: every run keeps that user's uid, and
the per-user quotas are shared (the seccomp filter then refuses inotify, the one a run could
exhaust at no cost; see :mod:`.seccomp`).

The sandbox user must reach the interpreter through the host's directories: those it may not
traverse (``/root`` is 0700, and pyenv, uv and venvs often live below it) are covered, in each
run's own mount namespace, by a tmpfs holding only the paths the sandbox binds (see
:func:`covers`).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from .errors import SandboxUnavailable

__all__ = ["RunUsers", "covers"]


class RunUsers:
    """The host ``(uid, gid)`` each sandbox gets: from a reserved range as root, else ``None``.

    Args:
        first: The first uid (and gid) of the range; ``None`` when runs keep the service's uid.
        count: How many sandboxes may be alive at once.
    """

    def __init__(self, first: int | None, count: int) -> None:
        self.first = first
        self.count = count
        self._free = list(range(count)) if first is not None else []
        self._taken: set[int] = set()

    @classmethod
    def for_service(cls, first: int, count: int) -> RunUsers:
        """Runs drop to ``first ..`` when this process is root; else they keep its uid.

        Raises:
            SandboxUnavailable: a uid or gid of the range belongs to a user or group here.
        """
        if os.geteuid() != 0:
            return cls(None, count)
        for number in range(first, first + count):
            for kind, lookup in (("user", pwd.getpwuid), ("group", grp.getgrgid)):
                try:
                    entry = lookup(number)
                except KeyError:
                    continue
                raise SandboxUnavailable(
                    f"the sandboxes' host ids {first}-{first + count - 1} must be unused, but "
                    f"{number} is the {kind} {entry[0]!r}: set EVALUATOR_SANDBOX_UID to the "
                    "start of a free range"
                )
        return cls(first, count)

    @property
    def dropping(self) -> bool:
        """Whether runs get uids of their own (the service is root)."""
        return self.first is not None

    def take(self) -> tuple[int, int] | None:
        """A free ``(uid, gid)`` for a new sandbox; ``None`` when runs keep the service's.

        Raises:
            OSError: every uid of the range is in use (more sandboxes than ``count``).
        """
        if self.first is None:
            return None
        if not self._free:
            raise OSError(f"all {self.count} sandbox uids are in use")
        # The lowest free one, so that a quiet service keeps using the same few.
        self._free.sort()
        offset = self._free.pop(0)
        self._taken.add(offset)
        return self.first + offset, self.first + offset

    def give_back(self, user: tuple[int, int] | None) -> None:
        """Return a sandbox's uid once none of its processes is left."""
        if user is None or self.first is None:
            return
        offset = user[0] - self.first
        if offset in self._taken:
            self._taken.discard(offset)
            self._free.append(offset)

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
    for path in paths:
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
