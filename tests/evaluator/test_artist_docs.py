"""matplotlib's artist tables (``evaluator/_artist_docs.py``), outside any sandbox.

Built by one interpreter and read by another as a warm agent reads them, they must leave every
docstring and signature of matplotlib as its own import makes them, and answer only where they
were built for that matplotlib, before any artist existed, until ``after_imports``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from evaluator import _artist_docs

from .matplotlib_docs import DOCSTRINGS

SCRIPT = Path(_artist_docs.__file__)

#: Runs the script as a warm agent does (``exec`` as ``__warm__``), if asked, then imports what a
#: warm sandbox imports and prints every docstring and signature matplotlib's modules hold.
DUMP = (
    DOCSTRINGS
    + r"""
import json, sys
script, use, before = sys.argv[1], sys.argv[2] == "use", sys.argv[3] == "before"
if before:
    import matplotlib.artist
scope = {"__file__": script, "__name__": "__warm__"}
if use:
    with open(script, "rb") as file:
        exec(compile(file.read(), script, "exec"), scope)
import numpy, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
import matplotlib.artist as artist
patched = artist.kwdoc.__module__ != "matplotlib.artist"
scope.get("after_imports", lambda: None)()
restored = artist.kwdoc.__module__ == "matplotlib.artist"
docs = {path: doc for module in matplotlib_docs().values() for path, doc in module.items()}
print(json.dumps({"docs": docs, "patched": patched, "restored": restored}))
"""
)


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The script and the tables it built, side by side, as a warm sandbox sees them."""
    directory = tmp_path_factory.mktemp("artist-docs")
    shutil.copyfile(SCRIPT, directory / "artist_docs.py")
    env = {"MPLCONFIGDIR": str(directory), "PATH": "/usr/bin:/bin"}
    built = subprocess.run(
        [sys.executable, directory / "artist_docs.py", directory / _artist_docs.TABLES],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr
    fontlists = [p.name for p in directory.glob("fontlist-*.json")]
    assert fontlists
    assert built.stdout.splitlines() == [f"{_artist_docs.FONTLIST_BUILT}{n}" for n in fontlists]
    return directory


class Dump(NamedTuple):
    docs: dict[str, str]
    patched: bool  # kwdoc answered from the tables while pyplot was imported
    restored: bool  # matplotlib's own kwdoc, after after_imports


def dump(place: Path, *, use: bool, before: bool = False) -> Dump:
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            DUMP,
            str(place / "artist_docs.py"),
            "use" if use else "plain",
            "before" if before else "",
        ],
        env={"MPLCONFIGDIR": str(place), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stderr
    return Dump(**json.loads(ran.stdout))


def tables(place: Path) -> Any:
    return json.loads((place / _artist_docs.TABLES).read_text())


def test_the_tables_hold_each_artist_as_pyplot_made_it(place: Path) -> None:
    known = tables(place)
    spec = importlib.util.find_spec("matplotlib")  # not imported here: only in the children
    assert spec is not None
    version = importlib.metadata.version("matplotlib")
    assert known["built_by"] == [version, spec.origin, False]
    held = known["tables"]
    assert isinstance(held, dict)
    # Line2D's set() is documented before its aliases exist, then its table is asked again.
    assert len(held) > 50 and len(held["matplotlib.lines.Line2D"]) >= 2, sorted(held)
    first, later = held["matplotlib.lines.Line2D"][:2]
    assert "linewidth: float" in first and "linewidth or lw: float" in later


def test_every_docstring_is_the_same_read_from_the_tables(place: Path) -> None:
    plain, used = dump(place, use=False), dump(place, use=True)
    assert used.patched and used.restored and not plain.patched and plain.restored
    assert len(plain.docs) > 5000
    differ = sorted(k for k in plain.docs if plain.docs[k] != used.docs.get(k))
    assert not differ and plain.docs == used.docs, differ[:10]


def test_the_answers_come_from_the_tables(tmp_path: Path, place: Path) -> None:
    """Tables that say something else are what the docstrings say: they were read."""
    copy = tmp_path / "copy"
    shutil.copytree(place, copy)
    known = tables(place)
    known["tables"]["matplotlib.lines.Line2D"][0] = "FROM THE TABLES"
    (copy / _artist_docs.TABLES).write_text(json.dumps(known))
    assert "FROM THE TABLES" in dump(copy, use=True).docs["matplotlib.lines.Line2D.set"]


@pytest.mark.parametrize("spoiled", ["another matplotlib", "artists made before", "no tables"])
def test_tables_that_do_not_fit_are_not_read(tmp_path: Path, place: Path, spoiled: str) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(place, copy)
    known = tables(place)
    known["tables"]["matplotlib.lines.Line2D"][0] = "FROM THE TABLES"
    if spoiled == "another matplotlib":
        known["built_by"][0] = "0.0"
    (copy / _artist_docs.TABLES).write_text(json.dumps(known))
    if spoiled == "no tables":
        (copy / _artist_docs.TABLES).unlink()
    ran = dump(copy, use=True, before=spoiled == "artists made before")
    assert not ran.patched
    assert "FROM THE TABLES" not in ran.docs["matplotlib.lines.Line2D.set"]
