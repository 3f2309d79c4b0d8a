"""Processes: is one alive, which children are ours, which orphans to reap.

This process is a child subreaper, so two kinds of zombie children show up here: the runs' own
processes (started by :func:`spawn_owned`, each reaped by its owner through its pidfd, which alone
gets its exit status) and orphans inherited from a sandbox (bwrap's init, when the outer bwrap
exits first), which :func:`reap_orphans` collects. The registry of owned children is process-wide:
every evaluator of the process shares the kernel's list of children.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "Orphans",
    "Status",
    "alive",
    "await_orphans",
    "descendants",
    "may_leave_idle",
    "reap_orphans",
    "reap_owned",
    "spawn_owned",
    "status",
]

# Spawns, reaps and orphan scans happen under this lock, so that a pid seen outside ``_owned`` by
# reap_orphans cannot be (or become, by pid reuse) a child that an owner is about to reap.
_lock = threading.Lock()
# Children started by spawn_owned and not yet reaped by their owner.
_owned: set[int] = set()
# The bit of CAP_SYS_NICE in the capability masks of /proc/<pid>/status (linux/capability.h).
_CAP_SYS_NICE = 23


class Orphans(NamedTuple):
    """What :func:`reap_orphans` found: how many zombies it reaped, and the orphans (pids)
    still running."""

    reaped: int
    running: frozenset[int]


class Status(NamedTuple):
    """A process's name (``comm``), state (``R``, ``S``, ``Z``...) and parent's pid."""

    name: str
    state: str
    parent: int


def status(pid: int) -> Status | None:
    """What ``/proc/<pid>/stat`` says of a process; ``None`` when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
    state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
    return Status(stat[stat.index("(") + 1 : stat.rindex(")")], state, int(parent))


def alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def may_leave_idle() -> bool:
    """Whether this process may move the runs' processes from ``SCHED_IDLE`` back to
    ``SCHED_OTHER``: that takes ``CAP_SYS_NICE`` in the initial user namespace. (An
    ``RLIMIT_NICE`` of 20 is not asked for: it helps only with processes of one's own user,
    and root's runs are another's; sched(7).)"""
    try:
        with open("/proc/self/uid_map") as uid_map:
            initial = uid_map.read().split() == ["0", "0", "4294967295"]
        with open("/proc/self/status") as status:
            caps = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return initial and bool(int(caps.split()[1], 16) >> _CAP_SYS_NICE & 1)


def spawn_owned(
    path: str, argv: Sequence[str], *, fds: Sequence[int], env: Mapping[str, str]
) -> int:
    """Start ``path`` with ``posix_spawn``; the child is owned (reap_orphans never touches it).

    ``fds[i]`` becomes the child's file descriptor ``i``; no other descriptor is inherited
    (the service opens all of them close-on-exec). The child gets a session of its own, so
    that its process group can be killed as a whole, and an empty signal mask. posix_spawn,
    unlike a fork, is safe in a process with threads: the child runs no code of ours until it
    has exec'd.
    """
    # Move every source above the targets first, so that no dup2 overwrites another source.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, len(fds) + 3) for fd in fds]
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(high)]
        with _lock:
            pid = os.posix_spawn(
                path, list(argv), env, file_actions=actions, setsid=True, setsigmask=()
            )
            _owned.add(pid)
    finally:
        for fd in high:
            os.close(fd)
    return pid


def reap_owned(pid: int, pidfd: int, *, block: bool) -> os.waitid_result | None:
    """Reap an owned child through its pidfd, and stop owning it in the same step.

    Returns ``None`` when ``block`` is false and the child has not exited.

    Raises:
        ChildProcessError: the child was already reaped (it is no longer owned either).
    """
    with _lock:
        try:
            result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | (0 if block else os.WNOHANG))
        except ChildProcessError:
            _owned.discard(pid)
            raise
        if result is not None:
            _owned.discard(pid)
    return result


def owned() -> frozenset[int]:
    """The children owned right now (for tests and diagnostics)."""
    with _lock:
        return frozenset(_owned)


def reap_orphans(command: str) -> Orphans:
    """Reap zombie children named ``command`` that no run owns; say how many, and how many such
    children are still running.

    As a child subreaper, this process inherits the sandbox's init when the outer bwrap exits
    first. Only such zombies are reaped: a run's own process is owned until its run reaps it,
    and other code in the process (the gateway) may be waiting for children of its own.
    """
    me = os.getpid()
    reaped = 0
    running = set()
    with _lock:
        for pid in _children():
            if pid in _owned:
                continue
            found = status(pid)
            if found is None or found.parent != me or found.name != command:
                continue
            if found.state != "Z":
                running.add(pid)
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                pass
    return Orphans(reaped, frozenset(running))


async def await_orphans(
    command: str, seconds: float, *, besides: frozenset[int] = frozenset()
) -> frozenset[int]:
    """Reap orphans named ``command`` until none is left running but ``besides``, for at most
    ``seconds``; return those still running (``besides`` among them, if they are).

    A killed sandbox's init leaves its cgroup at once, but becomes a zombie (and ours, once its
    outer bwrap is gone) only after every process of its PID namespace has died: on a busy
    machine, after its sandbox's disposal has looked. Left there, it would stay a zombie until
    the next disposal. ``besides``: orphans already waited for in vain, not waited for again.
    """
    deadline = time.monotonic() + seconds
    while True:
        running = reap_orphans(command).running
        if running <= besides or time.monotonic() >= deadline:
            return running
        await asyncio.sleep(0.01)


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it, as far as they are still there.

    Read from each thread's ``children`` file (CONFIG_PROC_CHILDREN), else from the parent of
    every process on the system. An orphan inside a sandbox is still found: the sandbox's own
    init (in its PID namespace) inherits it.
    """
    found = {pid}
    try:
        todo = [pid]
        while todo:
            parent = todo.pop()
            with contextlib.suppress(FileNotFoundError):  # it is gone
                for task in os.listdir(f"/proc/{parent}/task"):
                    with contextlib.suppress(FileNotFoundError):
                        text = Path(f"/proc/{parent}/task/{task}/children").read_text()
                        for child in map(int, text.split()):
                            if child not in found:
                                found.add(child)
                                todo.append(child)
        return found
    except PermissionError:
        pass
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (seen := status(int(name))) is not None:
            parents.setdefault(seen.parent, []).append(int(name))
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _children() -> set[int]:
    """This process's children: each thread's ``children`` file, else every pid on the system.

    The per-thread lists (CONFIG_PROC_CHILDREN) make a sweep cost a few reads instead of one
    per process on the machine, which matters because a sweep follows every run.
    """
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            pids.update(map(int, Path(f"/proc/self/task/{task}/children").read_text().split()))
    except FileNotFoundError:
        return {int(name) for name in os.listdir("/proc") if name.isdigit()}
    return pids
