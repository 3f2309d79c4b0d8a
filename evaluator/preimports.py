"""Which of ``EVALUATOR_PREIMPORT`` the next warm sandboxes import: those first cells use.

Importing the modules is most of the CPU time a warm sandbox takes (numpy, pandas and pyplot:
0.7 to 1.2 CPU-seconds), pandas alone about a third of it. When calls that start a session come
faster than spare CPU makes warm sandboxes, each is made for one of them whether or not it uses
what it imported, and the calls that find none warm import what they use themselves: four
agents plotting at once on two cores found a warm sandbox for nearly every call only once
pandas was left out (``bench/bench_plot_agents.py``).

So a session's interpreter says, after each cell, which of the configured modules it had not
imported ahead and which of those its cells have imported since (:data:`._agent.STATUS_FD`).
The first cell's answer, for each module its sandbox was not made with, is one observation. A
module is left out of the warm sandboxes made next once its last :data:`WINDOW` observations
(at least :data:`EVIDENCE`) all went without it, and brought back once :data:`BACK` of them
imported it; the warm sandboxes then waiting without it are made again
(:meth:`.SandboxPool.take_warm`). Only cells that started without a module tell whether it is
used: those of the started and cold sandboxes, which run when warm ones are short (the only
time leaving a module out pays), and, once it is left out, every first cell.

The answer comes from the code's own interpreter, which may write anything on that pipe: a
client can make the warm sandboxes import fewer or more of the configured modules, or have
those waiting made again (as its own calls taking them would), and nothing else (another
client's first cell may then import one itself). What a warm sandbox imported, which code can
see, tells of what recent first cells imported (``docs/security.md``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["BACK", "EVIDENCE", "MOST_WATCHED", "WINDOW", "Preimports"]

#: Observations of a module kept: its last first cells that started without it.
WINDOW = 8
#: Observations, none importing it, before a module may be left out.
EVIDENCE = 2
#: Observations importing it, of the last :data:`WINDOW`, that bring a module back.
BACK = 2
#: Modules watched at the most (the agent's masks are 2 bytes); those after are always imported.
MOST_WATCHED = 16


class Preimports:
    """The modules warm sandboxes import now (:meth:`current`), following what first cells
    imported (:meth:`observe`).

    Args:
        modules: ``EVALUATOR_PREIMPORT``, in its order.
    """

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = tuple(dict.fromkeys(modules))
        #: The modules whose use is watched, in the order of the agent's masks.
        self.watched = self.modules[:MOST_WATCHED]
        self._seen: dict[str, deque[bool]] = {m: deque(maxlen=WINDOW) for m in self.watched}
        self._left_out: set[str] = set()

    @property
    def watch_argument(self) -> list[str]:
        """The agent's argument naming the watched modules (none: nothing is watched)."""
        return [f"--watch={','.join(self.watched)}"] if self.watched else []

    def current(self) -> tuple[str, ...]:
        """The modules the next warm sandbox imports, in the configured order."""
        return tuple(m for m in self.modules if m not in self._left_out)

    def observe(self, given: Sequence[str], unloaded: int, imported: int) -> None:
        """One first cell's answer: the watched modules it started without (a mask, bit ``i``
        for ``watched[i]``), and those of them it imported; ``given``: the modules its sandbox
        was made with (the answer says nothing of those, whatever it claims)."""
        for i, name in enumerate(self.watched):
            if unloaded >> i & 1 and name not in given:
                seen = self._seen[name]
                seen.append(bool(imported >> i & 1))
                if len(seen) >= EVIDENCE and not any(seen):
                    self._left_out.add(name)
                elif sum(seen) >= BACK:
                    self._left_out.discard(name)
