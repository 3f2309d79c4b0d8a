"""Which of the configured modules warm sandboxes import, following what first cells import
(fast lane: the policy alone; tests/evaluator/test_warm.py runs it on real sessions)."""

from __future__ import annotations

from evaluator.preimports import EVIDENCE, MOST_WATCHED, WINDOW, Preimports

MODULES = ("numpy", "pandas", "matplotlib.pyplot")
ALL, PANDAS = 0b111, 0b010


def test_every_module_is_imported_until_first_cells_show_one_unused() -> None:
    preimports = Preimports(MODULES)
    assert preimports.current() == MODULES
    assert preimports.watch_argument == ["--watch=numpy,pandas,matplotlib.pyplot"]
    for _ in range(EVIDENCE - 1):
        preimports.observe(ALL, ALL & ~PANDAS)  # cold first cells that plotted
    assert preimports.current() == MODULES, "one observation is not evidence enough"
    preimports.observe(ALL, ALL & ~PANDAS)
    assert preimports.current() == ("numpy", "matplotlib.pyplot")


def test_a_module_left_out_comes_back_with_the_first_cell_importing_it() -> None:
    """... and the warm sandboxes made before are of an older generation; it stays until none
    of its last observations imported it."""
    preimports = Preimports(MODULES)
    for _ in range(WINDOW):
        preimports.observe(ALL, 0)
    assert (preimports.current(), preimports.generation) == ((), 0)
    preimports.observe(ALL, PANDAS)  # warm sandboxes without pandas, a cell importing it
    assert (preimports.current(), preimports.generation) == (("pandas",), 1)
    for _ in range(WINDOW - 1):
        preimports.observe(PANDAS, 0)
    assert preimports.current() == ("pandas",)
    preimports.observe(PANDAS, 0)
    assert (preimports.current(), preimports.generation) == ((), 1), "leaving out is no growth"


def test_only_first_cells_that_started_without_a_module_count_for_it() -> None:
    """A cell that found pandas imported says nothing of it, whatever its mask of imports."""
    preimports = Preimports(MODULES)
    for _ in range(WINDOW):
        preimports.observe(ALL & ~PANDAS, 0)
    assert preimports.current() == ("pandas",)


def test_modules_past_those_watched_are_always_imported() -> None:
    modules = tuple(f"m{i}" for i in range(MOST_WATCHED + 2))
    preimports = Preimports(modules)
    for _ in range(WINDOW):
        preimports.observe(2**MOST_WATCHED - 1, 0)
    assert preimports.current() == modules[MOST_WATCHED:]
    assert len(preimports.watch_argument[0].split(",")) == MOST_WATCHED


def test_nothing_configured_watches_nothing() -> None:
    preimports = Preimports(())
    preimports.observe(0xFFFF, 0xFFFF)
    assert (preimports.current(), preimports.watch_argument) == ((), [])
