"""The shared bounded table: who goes when room is needed, and who expires."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from serving import BoundedTable, TableFull


@dataclass(eq=False)
class Item:
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)


def table(limit: int, share: int | None = None) -> BoundedTable[Item]:
    return BoundedTable(limit, busy=lambda item: item.busy, share=share)


def fill(t: BoundedTable[Item], *rows: tuple[str, str | None]) -> dict[str, Item]:
    """Add ``(key, group)`` rows in order, each used after the one before."""
    items = {}
    for key, group in rows:
        items[key] = Item()
        t.add(key, items[key], group)
        t.touch(items[key], key)
    return items


def test_room_needs_no_closing_below_the_limit() -> None:
    t = table(3)
    fill(t, ("a", None), ("b", None))
    assert t.to_close() is None


def test_the_longest_idle_goes_and_a_touch_keeps_one() -> None:
    t = table(3)
    items = fill(t, ("a", None), ("b", None), ("c", None))
    assert t.to_close() == "a"
    t.touch(items["a"], "a")
    assert t.to_close() == "b"


def test_busy_entries_are_spared_and_all_busy_is_full() -> None:
    t = table(2)
    items = fill(t, ("a", None), ("b", None))
    items["a"].busy = True
    assert t.to_close() == "b"
    items["b"].busy = True
    with pytest.raises(TableFull) as caught:
        t.to_close()
    assert (caught.value.held, caught.value.own) == (2, False)


def test_the_group_holding_the_most_goes_first() -> None:
    t = table(4)
    fill(t, ("a1", "a"), ("b1", "b"), ("b2", "b"), ("b3", "b"))
    # a1 is the longest idle, but b holds the most.
    assert t.to_close("a") == "b1"


def test_a_tie_goes_to_the_group_with_the_oldest_idle_entry() -> None:
    t = table(4)
    items = fill(t, ("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b"))
    assert t.to_close("c") == "a1"
    items["a1"].busy = True
    assert t.to_close("c") == "b1"  # a's idle one (a2) is younger than b1


def test_a_group_at_its_share_closes_its_own() -> None:
    t = table(10, share=2)
    items = fill(t, ("a1", "a"), ("b1", "b"), ("a2", "a"))
    assert t.to_close("a") == "a1"
    assert t.to_close("b") is None
    items["a1"].busy = items["a2"].busy = True
    with pytest.raises(TableFull) as caught:
        t.to_close("a")
    assert (caught.value.held, caught.value.own) == (2, True)


def test_a_share_of_the_limit_or_more_is_no_share() -> None:
    t = table(2, share=2)
    fill(t, ("a1", "b"), ("a2", "a"))
    assert t.to_close("a") == "a1"  # the table's rule, not the group's


def test_expiry_spares_busy_and_recent_entries() -> None:
    t = table(5)
    items = fill(t, ("a", None), ("b", None), ("c", None))
    items["a"].last_used -= 100
    items["b"].last_used -= 100
    items["b"].busy = True
    assert t.expired(50) == ["a"]


def test_a_touch_moves_only_the_entry_held_under_its_key() -> None:
    t = table(3)
    items = fill(t, ("a", None), ("b", None))
    gone = t.pop("a")
    t.add("a", Item(), None)  # the same key, another entry
    t.touch(gone, "a")
    assert [key for key in ("a", "b") if t.get(key) is items.get(key)] == ["b"]
    assert t.to_close() is None and len(t) == 2
    assert list(t) == [items["b"], t.get("a")]


def test_a_table_may_count_the_newcomer_in_its_groups_tally() -> None:
    """Each group holds one; a newcomer of a's would make a hold two: counted, a closes its own
    (b's, the longest idle, is spared); not counted, the tie goes to the longest idle."""
    rows = (("b1", "b"), ("a1", "a"))
    counted: BoundedTable[Item] = BoundedTable(
        2, busy=lambda item: item.busy, newcomer_counted=True
    )
    fill(counted, *rows)
    assert counted.to_close("a") == "a1"
    assert counted.to_close("c") == "b1"  # c holds none: as if not counted
    plain = table(2)
    fill(plain, *rows)
    assert plain.to_close("a") == "b1"
