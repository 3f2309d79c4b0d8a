"""matplotlib's property tables of its own artists: built once, read by every warm sandbox.

Importing pyplot writes a table of each artist class's settable properties into the docstring
of its ``set`` method and of a few functions (``matplotlib.artist.kwdoc``: some 120 tables, each
read out of the setters' docstrings). That is a sixth of the CPU time a warm sandbox takes to
import numpy and pyplot (``bench/bench_warming.py``), spent again by each; warming sandboxes is
what four agents calling at once outran on two cores.

The evaluator's start-up run builds them once in a sandbox (``python _artist_docs.py OUT``,
after matplotlib's font list, whose file name it prints): what ``kwdoc`` answered for each
class, in the order it was asked, while pyplot was imported. A warm sandbox's agent that
imports pyplot runs this file first (an absolute path among its modules, before the first of
matplotlib's, bound read-only beside the tables): ``kwdoc`` then answers from the tables, if
the same matplotlib built them and no artist exists yet, until the agent calls
``after_imports``. The docstrings are the same; a class the tables lack (one of a module
imported later, the code's own), or asked once more than they say, is inspected as before.

Standard library only: the sandbox's Python runs it.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported in a sandbox before the code asks for it
    from collections.abc import Callable
    from typing import Any

#: The tables' file name, beside this file in a warm sandbox.
TABLES = "artist-docs.json"
#: What the start-up run prints before the font list's file name, once it is built.
FONTLIST_BUILT = "font list built: "


def build(path: str) -> None:
    """Build the font list, then import pyplot as a warm sandbox would, recording each class's
    tables ``kwdoc`` gave, in the order it gave them; write them to ``path`` as JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.artist as artist
    import matplotlib.font_manager  # its font list, built once for every run

    for name in os.listdir(os.environ["MPLCONFIGDIR"]):
        if name.startswith("fontlist-"):
            sys.stdout.write(f"{FONTLIST_BUILT}{name}\n")  # one write: a line of its own
            sys.stdout.flush()
    real = artist.kwdoc
    tables: dict[str, list[str]] = {}

    def recording(of: Any) -> str:
        table: str = real(of)
        if isinstance(of, type):
            tables.setdefault(_name(of), []).append(table)
        return table

    artist.kwdoc = recording  # type: ignore[assignment]
    try:
        import matplotlib.pyplot
    except Exception:  # (a low memory limit) the font list is built: the tables are not
        return
    artist.kwdoc = real
    with open(path, "w", encoding="utf-8") as file:
        json.dump({"built_by": _built_by(matplotlib), "tables": tables}, file)


def answer_from_tables() -> Callable[[], None]:
    """Have ``kwdoc`` answer from the tables beside this file; what gives matplotlib its own
    back, which never raises (a no-op where there are no tables, or another matplotlib built
    them)."""
    if "matplotlib.artist" in sys.modules:  # artists were made: their calls are not replayed
        return lambda: None
    try:
        import matplotlib

        matplotlib.use("Agg")  # as the agent chooses it, before anything imports pyplot
        import matplotlib.artist as artist

        with open(os.path.join(os.path.dirname(__file__), TABLES), "rb") as file:
            known = json.load(file)
        if known["built_by"] != _built_by(matplotlib):
            return lambda: None
        tables, real = known["tables"], artist.kwdoc
        calls: dict[str | None, int] = {}  # each class's answers given so far
    except Exception:  # no matplotlib, no tables: each class is inspected
        return lambda: None

    def kwdoc(of: Any) -> str:
        name = _name(of) if isinstance(of, type) else None
        answers, call = tables.get(name, ()), calls.get(name, 0)
        if call < len(answers) and isinstance(answers[call], str):
            calls[name] = call + 1
            return answers[call]  # type: ignore[no-any-return]
        return real(of)

    artist.kwdoc = kwdoc  # type: ignore[assignment]
    return lambda: setattr(artist, "kwdoc", real)  # a module's attribute: nothing to fail


def _built_by(matplotlib: Any) -> list[str | bool]:
    """What the tables depend on: matplotlib's version and place, and whether it writes its
    docstrings for Sphinx."""
    hardcopy = bool(matplotlib.rcParams["docstring.hardcopy"])
    return [matplotlib.__version__, matplotlib.__file__, hardcopy]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


if __name__ == "__main__":
    build(sys.argv[1])
elif __name__ == "__warm__":  # run by a warm agent, before it imports matplotlib
    after_imports = answer_from_tables()
