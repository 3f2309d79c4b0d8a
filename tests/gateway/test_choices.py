"""A call's Python and packages from its arguments and its PEP 723 block (gateway.choices)."""

from __future__ import annotations

import threading
import tomllib
from typing import Any

import anyio.to_thread
import pytest

from gateway.choices import (
    MAX_SCRIPT_CHARS,
    ChoiceRefused,
    Offer,
    Script,
    choose,
    parse_script,
    script_metadata,
)

OFFERS = (Offer("3.11.7", None), Offer("3.12.1", "/py312"), Offer("3.13.0", "/py313"))


def chosen(**arguments: object) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    values: dict[str, object] = {
        "python": None,
        "packages": None,
        "script": Script(),
        "offers": OFFERS,
        "installs": True,
        "why_no_installs": "",
        **arguments,
    }
    choices = choose(**values)  # type: ignore[arg-type]
    version = choices.python.version if choices.python is not None else None
    return version, choices.packages, choices.notes


def test_a_block_is_read_as_pep_723_says() -> None:
    code = (
        "#!/usr/bin/env python\n# /// script\n# requires-python = '>=3.12'\n"
        "# dependencies = [\n#   'tabulate==0.9.0',\n#   'sympy>=1.12',\n# ]\n# ///\nprint(1)\n"
    )
    assert parse_script(code) == Script(">=3.12", ("tabulate==0.9.0", "sympy>=1.12"))
    assert parse_script("print(1)\n# /// other\n# x = 1\n# ///\n") == Script()
    assert parse_script("# /// script\n# dependencies = ['a']\nprint(1)\n") == Script()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("# /// script\n# x = [\n# ///\n", "is not valid TOML"),
        ("# /// script\n# dependencies = 'a'\n# ///\n", "must be a list of strings"),
        ("# /// script\n# requires-python = 3.12\n# ///\n", "must be a string"),
        ("# /// script\n# ///\n# /// script\n# ///\n", "more than one '# /// script' block"),
    ],
)
def test_a_block_that_is_not_valid_is_refused(code: str, message: str) -> None:
    with pytest.raises(ChoiceRefused, match=message):
        parse_script(code)


def block(*lines: str) -> str:
    """A PEP 723 ``script`` block of these TOML lines."""
    return "\n".join(["# /// script", *(f"# {line}" for line in lines), "# ///", "print(1)"])


def test_a_block_over_the_limit_is_refused_naming_it() -> None:
    padding = "#" * (MAX_SCRIPT_CHARS - 40)  # a TOML comment: the block just fits
    assert parse_script(block("dependencies = ['a']", padding)) == Script(None, ("a",))
    with pytest.raises(ChoiceRefused, match=r"is 65,\d+ characters long; the limit is 65,536\."):
        parse_script(block("dependencies = ['a']", padding + "#" * 100))


@pytest.mark.parametrize(
    "value",
    ["[" * 3000 + "]" * 3000, "{a = " * 3000 + "1" + "}" * 3000],
    ids=["arrays", "inline-tables"],
)
def test_a_deeply_nested_block_is_refused_not_a_failure(value: str) -> None:
    with pytest.raises(ChoiceRefused, match="nested too deeply to read: it is not valid"):
        parse_script(block(f"x = {value}"))


def test_whatever_the_parser_raises_is_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str) -> dict[str, Any]:
        raise ValueError("a parser's own bug")

    monkeypatch.setattr(tomllib, "loads", broken)
    with pytest.raises(ChoiceRefused, match=r"could not be read \(ValueError\): it is not valid"):
        parse_script(block("dependencies = ['a']"))


def test_a_long_requires_python_is_refused() -> None:
    # A specifier set of thousands of clauses takes packaging a tenth of a second to read.
    long = ",".join(f">=3.{i}" for i in range(100))
    with pytest.raises(ChoiceRefused, match="requires-python is longer than 200 characters"):
        parse_script(block(f"requires-python = '{long}'"))


@pytest.mark.anyio
async def test_a_block_is_read_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.get_ident()
    readers: list[int] = []
    loads = tomllib.loads

    def recorded(text: str) -> dict[str, Any]:
        readers.append(threading.get_ident())
        return loads(text)

    monkeypatch.setattr(tomllib, "loads", recorded)
    assert await script_metadata(block("dependencies = ['a']")) == Script(None, ("a",))
    assert len(readers) == 1 and readers[0] != loop_thread


@pytest.mark.anyio
async def test_code_without_a_block_takes_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("a thread was taken for code without a block")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    assert await script_metadata("print(1)\n" * 100_000) == Script()


def test_many_unclosed_openings_are_no_block() -> None:
    # PEP 723's reference expression backtracks for minutes on this; a line scan does not.
    assert parse_script("# /// script\n" * 100_000) == Script()
    assert parse_script("# /// script\n# a\n" * 50_000 + "print(1)\n") == Script()


def test_an_argument_wins_over_the_block_and_a_note_says_so() -> None:
    block = Script(">=3.13", ("tinypkg==1.0",))
    assert chosen(script=block) == ("3.13.0", ("tinypkg==1.0",), ())
    version, packages, notes = chosen(script=block, packages=["tinypkg==1.1"], python="3.12")
    assert (version, packages) == ("3.12.1", ("tinypkg==1.1",))
    assert notes == (
        "the packages argument was used; the script block's dependencies (tinypkg==1.0) were not",
        "python 3.12 was used, which the script block's requires-python (>=3.13) does not allow",
    )


def test_requires_python_keeps_the_default_or_the_preferred_when_it_allows_them() -> None:
    assert chosen(script=Script(">=3.11"))[0] == "3.11.7"
    assert chosen(script=Script(">=3.11"), prefer=OFFERS[1])[0] == "3.12.1"
    assert chosen(script=Script("<3.13,>=3.12"))[0] == "3.12.1"
    with pytest.raises(ChoiceRefused, match=r"No Python offered here meets .* \(>=3.14\)"):
        chosen(script=Script(">=3.14"))
    with pytest.raises(ChoiceRefused, match="is not a version specifier"):
        chosen(script=Script("three"))


def test_a_version_not_offered_and_packages_where_none_install_are_refused() -> None:
    with pytest.raises(ChoiceRefused, match=r"Python '3\.9' is not offered here; offered: 3\.11"):
        chosen(python="3.9")
    with pytest.raises(ChoiceRefused, match="this evaluation service runs one Python"):
        chosen(python="3.12", offers=())
    with pytest.raises(ChoiceRefused, match=r"Packages cannot be installed here \(none\)"):
        chosen(packages=["a"], installs=False, why_no_installs="none")
    with pytest.raises(ChoiceRefused, match="At most 64 packages"):
        chosen(packages=[f"p{i}" for i in range(65)])
    assert chosen(python="3.13.0")[0] == "3.13.0"
    with pytest.raises(ChoiceRefused, match="not offered"):
        chosen(python="3.1")  # not a prefix of 3.11.7: versions match whole parts
