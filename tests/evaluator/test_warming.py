"""How many sandboxes of each kind the pool keeps, and which it makes next (fast lane: the
policy alone, on placeholders; tests/evaluator/test_warm.py runs it on real sandboxes)."""

from __future__ import annotations

from typing import cast

import pytest

from evaluator import warming
from evaluator.sandbox import Sandbox
from evaluator.warming import Tier, WarmDemand, next_tier


def sandboxes(count: int) -> list[Sandbox]:
    return [cast(Sandbox, object()) for _ in range(count)]


def tier(floor: int, *, waiting: int = 0, warming_now: int = 0, at_once: int = 2) -> Tier:
    kind = Tier(lambda _: [], at_once, WarmDemand(floor, 8))
    kind.waiting, kind.warming = sandboxes(waiting), sandboxes(warming_now)
    return kind


def test_a_sandbox_made_after_the_number_kept_fell_is_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three kept, two waiting and one still being made when demand falls to two: a waiting one
    goes at once; and at the floor, one made beyond it goes too."""
    kind = tier(2, waiting=2, warming_now=1)
    kind.demand.target = 3
    monkeypatch.setattr(warming, "SHRINK_AFTER", 0.0)
    assert kind.shrink() is not None
    assert (kind.demand.target, len(kind.waiting)) == (2, 1)
    kind.waiting.append(kind.warming.pop())  # the one being made is ready
    assert kind.shrink() is None  # two kept, two waiting
    kind.waiting.extend(sandboxes(1))
    assert kind.shrink() is not None and len(kind.waiting) == 2


def test_started_sandboxes_short_hold_back_warm_ones() -> None:
    """While started ones are short, none warm is begun; with a cpu controller up to each
    kind's at_once at a time, without one a single one, and only with spare CPU."""
    full, started = tier(2), tier(2, warming_now=2)
    started.demand.target = 3  # a run started cold: one short, and two being made already
    assert next_tier(full, started, cpu_controller=True, spare_cpu=lambda: True) is None
    started.warming.pop()
    assert next_tier(full, started, cpu_controller=True, spare_cpu=lambda: True) is started
    started.waiting = sandboxes(2)  # started ones no longer short: a warm one
    assert next_tier(full, started, cpu_controller=True, spare_cpu=lambda: True) is full
    assert next_tier(full, started, cpu_controller=False, spare_cpu=lambda: True) is None
    started.waiting.append(started.warming.pop())  # ready: nothing is being made
    assert next_tier(full, started, cpu_controller=False, spare_cpu=lambda: False) is None
    assert next_tier(full, started, cpu_controller=False, spare_cpu=lambda: True) is full
    assert next_tier(full, None, cpu_controller=True, spare_cpu=lambda: False) is full


class Placeholder:
    """A sandbox as the claim policy sees it: what its agent imports."""

    def __init__(self, imports: tuple[str, ...]) -> None:
        self.imports = imports


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


async def test_a_run_claims_a_sandbox_far_enough_in_the_imports_first_cells_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No warm-up timed yet: none is claimed. Then one that has warmed half the time recent
    ones took, and imports what first cells use; a claimed one is nobody else's, and once warm
    it goes to its run, not to wait for one."""
    clock = Clock()
    monkeypatch.setattr(warming, "time", clock)
    kind = tier(2)
    numpy, both = ("numpy",), ("numpy", "pandas")
    first, second = (cast(Sandbox, Placeholder(numpy)) for _ in range(2))
    kind.begin(first)
    kind.begin(second)
    assert kind.claimable(numpy) is None  # nothing to go by
    clock.now = 1.0
    kind.warmed(first)
    kind.warmed(second)
    assert kind.waiting == [first, second]

    early, heavier, late = (cast(Sandbox, Placeholder(m)) for m in (numpy, both, numpy))
    kind.begin(early)
    kind.begin(heavier)
    clock.now = 1.4
    kind.begin(late)
    assert kind.claimable(numpy) is None  # 0.4 s of the 1 s they took
    clock.now = 1.6
    assert kind.claimable(numpy) is early
    assert kind.claimable(both) is heavier  # not one importing pandas when pandas is used
    assert kind.claimable(()) is None  # first cells use none: a started one imports nothing

    claim = kind.claim(early)
    assert early not in kind.warming and kind.warms(early)
    assert kind.claimable(numpy) is None  # the late one: 0.2 s
    clock.now = 3.0
    kind.warmed(early)
    assert claim.done() and claim.result() is True
    assert early not in kind.waiting and not kind.warms(early)
    assert kind.claimable(numpy) is late

    given_up = kind.claim(late)
    kind.failed(late)
    kind.failed(late)  # once disposed of, again: nothing left of it
    assert given_up.result() is False and not kind.warms(late) and late not in kind.warming
