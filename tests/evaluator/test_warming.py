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
