"""Which of the configured modules warm sandboxes import, following what first cells import
(fast lane: the policy alone; tests/evaluator/test_warm.py runs it on real sessions)."""

from __future__ import annotations

from evaluator.preimports import BACK, EVIDENCE, MOST_WATCHED, WINDOW, Preimports

MODULES = ("numpy", "pandas", "matplotlib.pyplot")
ALL, PANDAS = 0b111, 0b010
COLD: tuple[str, ...] = ()  # a started or cold sandbox: made with no module


def test_every_module_is_imported_until_first_cells_show_one_unused() -> None:
    preimports = Preimports(MODULES)
    assert preimports.current() == MODULES
    assert preimports.watch_argument == ["--watch=numpy,pandas,matplotlib.pyplot"]
    for _ in range(EVIDENCE - 1):
        preimports.observe(COLD, ALL, ALL & ~PANDAS)  # cold first cells that plotted
    assert preimports.current() == MODULES, "one observation is not evidence enough"
    preimports.observe(COLD, ALL, ALL & ~PANDAS)
    assert preimports.current() == ("numpy", "matplotlib.pyplot")


def test_a_module_left_out_comes_back_once_enough_first_cells_import_it() -> None:
    """... and is left out again only once none of its last observations imported it."""
    preimports = Preimports(MODULES)
    for _ in range(WINDOW):
        preimports.observe(COLD, ALL, 0)
    assert preimports.current() == ()
    for _ in range(BACK - 1):
        preimports.observe(COLD, PANDAS, PANDAS)  # warm sandboxes without pandas, cells using it
    assert preimports.current() == (), "one cell alone does not bring it back"
    preimports.observe(COLD, PANDAS, PANDAS)
    assert preimports.current() == ("pandas",)
    for _ in range(WINDOW - 1):
        preimports.observe(COLD, PANDAS, 0)
        assert preimports.current() == ("pandas",)
    preimports.observe(COLD, PANDAS, 0)
    assert preimports.current() == ()


def test_only_first_cells_that_started_without_a_module_count_for_it() -> None:
    """A cell whose sandbox was made with pandas says nothing of it, whatever its masks claim."""
    preimports = Preimports(MODULES)
    for _ in range(WINDOW):
        preimports.observe(MODULES, ALL, 0)
        preimports.observe(COLD, ALL & ~PANDAS, 0)
    assert preimports.current() == ("pandas",)


def test_modules_past_those_watched_are_always_imported() -> None:
    modules = tuple(f"m{i}" for i in range(MOST_WATCHED + 2))
    preimports = Preimports(modules)
    for _ in range(WINDOW):
        preimports.observe(COLD, 2**MOST_WATCHED - 1, 0)
    assert preimports.current() == modules[MOST_WATCHED:]
    assert len(preimports.watch_argument[0].split(",")) == MOST_WATCHED


def test_a_module_named_twice_is_watched_once() -> None:
    preimports = Preimports(("numpy", "pandas", "numpy"))
    assert (preimports.current(), preimports.watch_argument) == (
        ("numpy", "pandas"),
        ["--watch=numpy,pandas"],
    )


def test_nothing_configured_watches_nothing() -> None:
    preimports = Preimports(())
    preimports.observe(COLD, 0xFFFF, 0xFFFF)
    assert (preimports.current(), preimports.watch_argument) == ((), [])
