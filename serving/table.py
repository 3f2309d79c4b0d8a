"""A bounded table: entries by key, the longest idle closed to make room, busy ones spared.

Both services keep such tables (the gateway's MCP transport sessions and code sessions; the
evaluator's live interpreters), with one rule for who goes when room is needed:

- a group (a client: a token's name, an MCP connection; ``None`` for every entry of a table
  without groups) that holds its ``share`` makes room for its next entry by closing its own
  longest idle entry;
- a table that holds ``limit`` entries closes the longest idle entry of the group holding the
  most (among groups with an idle one; between groups holding as many, the one whose idle entry
  is the oldest; a table made with ``newcomer_counted`` counts the new entry in its group's
  tally), so that a group flooding the table closes its own entries before anyone else's;
- a busy entry (one running a call) is never closed to make room, nor when it expires: when
  only busy entries could go, :class:`TableFull` says so.

The table decides who goes; its owner closes it (:meth:`BoundedTable.pop`), since what closing
means (ending an interpreter, cancelling a stream) is the owner's.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["BoundedTable", "Entry", "TableFull"]


class Entry(Protocol):
    """What the table needs of an entry: when it was last used (``time.monotonic()``)."""

    last_used: float


E = TypeVar("E", bound=Entry)


class TableFull(Exception):
    """No room can be made: every entry that would have to close is busy. ``held``: how many
    entries were counted; ``own``: those are the group's own, at its share."""

    def __init__(self, held: int, *, own: bool) -> None:
        self.held = held
        self.own = own
        whose = "of the group's own (its share)" if own else "in the table (its limit)"
        super().__init__(f"all {held} entries {whose} are busy")


class BoundedTable(Generic[E]):
    """At most ``limit`` entries, ``share`` of them per group (``None``: no share), kept least
    recently used first; ``busy`` says which may not be closed.

    Args:
        limit: Entries at most.
        busy: Whether an entry is running a call (never closed to make room or on expiry).
        share: Entries one group may hold before its own make room; a share of ``limit`` or
            more is no share.
        newcomer_counted: Count the entry to add in its group's tally when choosing the group
            that makes room: a group that would hold as many as another with it closes its
            own (the evaluator's live sessions, which have no share).
    """

    def __init__(
        self,
        limit: int,
        busy: Callable[[E], bool],
        share: int | None = None,
        *,
        newcomer_counted: bool = False,
    ) -> None:
        if limit < 1:
            raise ValueError("a table's limit must be at least 1")
        self.limit = limit
        self.share = share
        self.newcomer_counted = newcomer_counted
        self._busy = busy
        self._rows: OrderedDict[str, tuple[E, Hashable]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __iter__(self) -> Iterator[E]:
        """The entries, least recently used first."""
        return (entry for entry, _ in self._rows.values())

    def get(self, key: str) -> E | None:
        row = self._rows.get(key)
        return None if row is None else row[0]

    def group(self, key: str) -> Hashable:
        """The group ``key``'s entry counts in."""
        return self._rows[key][1]

    def held(self, group: Hashable) -> int:
        """Entries ``group`` holds."""
        return sum(g == group for _, g in self._rows.values())

    def add(self, key: str, entry: E, group: Hashable = None) -> None:
        """Hold ``entry``, as the most recently used (make room first: :meth:`to_close`)."""
        self._rows[key] = (entry, group)
        self._rows.move_to_end(key)

    def pop(self, key: str) -> E:
        """Remove ``key``'s entry and return it. Raises ``KeyError``: there is none."""
        return self._rows.pop(key)[0]

    def touch(self, entry: E, key: str) -> None:
        """Mark ``entry`` (held as ``key``, or no longer held) used now."""
        entry.last_used = time.monotonic()
        row = self._rows.get(key)
        if row is not None and row[0] is entry:
            self._rows.move_to_end(key)

    def to_close(self, group: Hashable = None) -> str | None:
        """The key of the entry to close so that ``group`` may add one (``None``: there is
        room). Close it and ask again: one entry is named at a time.

        Raises:
            TableFull: the entries that would have to close are all busy.
        """
        share = self.share
        if share is not None and share < self.limit:
            own = [(key, entry) for key, (entry, g) in self._rows.items() if g == group]
            if len(own) >= share:
                idle = [key for key, entry in own if not self._busy(entry)]
                if not idle:
                    raise TableFull(len(own), own=True)
                return idle[0]
        if len(self._rows) >= self.limit:
            victim = self._fairest_victim(group)
            if victim is None:
                raise TableFull(len(self._rows), own=False)
            return victim
        return None

    def _fairest_victim(self, newcomer: Hashable) -> str | None:
        """The longest idle entry of the group holding the most (among those with one idle; a
        tie goes to the group whose idle entry is the oldest), ``newcomer``'s new entry counted
        if the table says so."""
        held: dict[Hashable, int] = {newcomer: 1} if self.newcomer_counted else {}
        oldest_idle: dict[Hashable, tuple[str, E]] = {}
        for key, (entry, group) in self._rows.items():  # least recently used first
            held[group] = held.get(group, 0) + 1
            if not self._busy(entry):
                oldest_idle.setdefault(group, (key, entry))
        if not oldest_idle:
            return None
        chosen = max(oldest_idle, key=lambda g: (held[g], -oldest_idle[g][1].last_used))
        return oldest_idle[chosen][0]

    def expired(self, idle_timeout: float) -> list[str]:
        """The keys of the entries unused for longer than ``idle_timeout`` seconds and not
        busy, least recently used first (to close)."""
        deadline = time.monotonic() - idle_timeout
        found = []
        for key, (entry, _) in self._rows.items():
            if entry.last_used > deadline:
                break  # the rest were used later
            if not self._busy(entry):
                found.append(key)
        return found
