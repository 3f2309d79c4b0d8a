"""Questions about processes, answered from /proc: is it alive, which orphans to reap."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["alive", "reap_orphans"]


def alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(command: str, exclude: set[int]) -> int:
    """Reap zombie children named ``command`` that are not in ``exclude``; return how many.

    As a child subreaper, this process inherits the sandbox's init when the outer bwrap is killed
    first. Only such zombies are reaped: other code in the process (the gateway) may be waiting
    for children of its own.
    """
    me = os.getpid()
    reaped = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if state == "Z" and int(ppid) == me and comm == command:
            try:
                os.waitpid(int(entry.name), os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                pass
    return reaped
