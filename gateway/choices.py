"""What a call asks to run with: its Python and its packages, from its arguments or its script.

A call names them with ``python`` and ``packages``, or in a PEP 723 block of its code
(``# /// script`` with ``requires-python`` and ``dependencies``). An argument wins over the
block; where they disagree, a note says so. The versions come from the service (its
``GET /info``) or, for Snekbox, from the operator's table (``MCP_SNEKBOX_PYTHONS``); a version
not offered, a block that is not valid, and packages asked of a service that installs none are
refused with a message saying what is offered instead.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "MAX_PACKAGES",
    "MAX_REQUIREMENT",
    "MAX_SCRIPT_CHARS",
    "ChoiceRefused",
    "Choices",
    "Offer",
    "Script",
    "choose",
    "parse_script",
    "script_metadata",
]

#: Requirements one call (and one session) may ask for, and the length of one.
MAX_PACKAGES, MAX_REQUIREMENT = 64, 200
#: Characters of a ``script`` block read at most. The fields read from it (a requires-python and
#: at most MAX_PACKAGES requirements of MAX_REQUIREMENT characters) take about 13,000 once
#: quoted: 64 Ki leaves room for comments and ``[tool]`` tables, and tomllib reads it in about
#: 10 ms (0.93 MB took about 0.15 s, each call, in pure Python).
MAX_SCRIPT_CHARS = 65_536
#: The line that opens a PEP 723 block of this type.
_OPENING = "# /// script"


class ChoiceRefused(Exception):
    """The call cannot run as asked; the message says why and what is offered."""


@dataclass(frozen=True)
class Offer:
    """One Python the service runs: its version, and the ``executable_path`` that selects it
    (``None``: the service's default, selected by sending none)."""

    version: str
    executable_path: str | None

    def matches(self, asked: str) -> bool:
        """Whether ``asked`` (``3.12`` or ``3.12.1``) names this version."""
        return self.version == asked or self.version.startswith(asked + ".")


@dataclass(frozen=True)
class Script:
    """A PEP 723 ``script`` block's fields (``None``: absent)."""

    requires_python: str | None = None
    dependencies: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Choices:
    """What the call runs with, and the notes that go into its result."""

    python: Offer | None
    packages: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


async def script_metadata(code: str) -> Script:
    """The ``script`` block of ``code``, read in a worker thread when there is one.

    Reading a block (TOML) is pure Python: on the event loop, ten calls with big blocks held
    ``/healthz`` for seconds. Most code holds no block, which a substring search tells at once.

    Raises:
        ChoiceRefused: see :func:`parse_script`.
    """
    if _OPENING not in code:
        return Script()
    return await anyio.to_thread.run_sync(parse_script, code)


def parse_script(code: str) -> Script:
    """The ``script`` block of ``code``, as PEP 723 reads it (blocking: see
    :func:`script_metadata`).

    Raises:
        ChoiceRefused: there are two, it is over :data:`MAX_SCRIPT_CHARS`, or it is not valid
            TOML with the fields' types, whatever the reason (too deeply nested, say).
    """
    blocks = _blocks(code)
    if not blocks:
        return Script()
    if len(blocks) > 1:
        raise ChoiceRefused("The code has more than one '# /// script' block (PEP 723): keep one.")
    data = _toml(blocks[0])
    requires = data.get("requires-python")
    dependencies = data.get("dependencies")
    if requires is not None and not isinstance(requires, str):
        raise ChoiceRefused("The script block's requires-python must be a string, e.g. '>=3.12'.")
    if requires is not None and len(requires) > MAX_REQUIREMENT:
        raise ChoiceRefused(
            f"The script block's requires-python is longer than {MAX_REQUIREMENT} characters."
        )
    if dependencies is not None and not (
        isinstance(dependencies, list) and all(isinstance(d, str) for d in dependencies)
    ):
        raise ChoiceRefused("The script block's dependencies must be a list of strings.")
    return Script(requires, None if dependencies is None else tuple(dependencies))


def _toml(content: str) -> dict[str, Any]:
    """The block's table; anything a block may make the parser raise is a refusal, since a
    block is the caller's argument (a ``RecursionError`` read as the gateway's failure)."""
    if len(content) > MAX_SCRIPT_CHARS:
        raise ChoiceRefused(
            f"The code's '# /// script' block is {len(content):,} characters long; the limit is "
            f"{MAX_SCRIPT_CHARS:,}. A block names a Python and at most {MAX_PACKAGES} packages: "
            "keep other text out of it."
        )
    try:
        return tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise ChoiceRefused(f"The code's '# /// script' block is not valid TOML: {exc}.") from None
    except RecursionError:
        raise ChoiceRefused(
            "The code's '# /// script' block is nested too deeply to read: it is not valid."
        ) from None
    except Exception as exc:  # whatever else a malformed block makes tomllib raise
        raise ChoiceRefused(
            f"The code's '# /// script' block could not be read ({type(exc).__name__}): it is "
            "not valid TOML."
        ) from None


def _blocks(code: str) -> list[str]:
    """The contents of the ``script`` blocks of ``code``, read line by line as PEP 723 says
    (its reference expression backtracks for seconds on many unclosed openings)."""
    blocks: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        if lines[i] != _OPENING:
            i += 1
            continue
        content: list[str] = []
        j = i + 1
        while j < len(lines) and (lines[j] == "#" or lines[j].startswith("# ")):
            if lines[j] == "# ///":
                break
            content.append(lines[j][2:])
            j += 1
        if j < len(lines) and lines[j] == "# ///":
            blocks.append("\n".join(content) + "\n")
            i = j + 1
        else:
            # Not closed: not a block, nor is any opening among these lines (they end at the
            # same place), so the scan goes on after them: linear, whatever the code.
            i = max(j, i + 1)
    return blocks


def choose(
    *,
    python: str | None,
    packages: list[str] | None,
    script: Script,
    offers: tuple[Offer, ...],
    installs: bool,
    why_no_installs: str,
    prefer: Offer | None = None,
) -> Choices:
    """The Python and packages of a call: its arguments, else its script block.

    ``offers``: the versions the service runs, the default first (empty: one, not named).
    ``installs``: whether the service installs packages; ``why_no_installs`` says why not.
    ``prefer``: the Python a ``requires-python`` keeps when it allows it (a session's).

    Raises:
        ChoiceRefused: a version not offered, no offered version meets the block's
            ``requires-python``, packages where none are installed, or too many of them.
    """
    notes: list[str] = []
    wanted = script.dependencies if packages is None else tuple(packages)
    block = script.dependencies
    if packages is not None and block is not None and sorted(packages) != sorted(block):
        notes.append(
            "the packages argument was used; the script block's dependencies "
            f"({', '.join(block) or 'none'}) were not"
        )
    wanted = tuple(dict.fromkeys(d.strip() for d in wanted or () if d.strip()))
    if len(wanted) > MAX_PACKAGES:
        raise ChoiceRefused(f"At most {MAX_PACKAGES} packages may be asked for in one call.")
    if any(len(d) > MAX_REQUIREMENT for d in wanted):
        raise ChoiceRefused(f"A requirement is longer than {MAX_REQUIREMENT} characters.")
    if wanted and not installs:
        raise ChoiceRefused(
            f"Packages cannot be installed here ({why_no_installs}); asked for: "
            f"{', '.join(wanted)}. The code did not run: use what is preinstalled."
        )
    specifier = _specifier(script.requires_python)
    chosen = _offer(python, offers) if python is not None else None
    if specifier is not None:
        if chosen is not None:
            if not _meets(chosen.version, specifier):
                notes.append(
                    f"python {python} was used, which the script block's requires-python "
                    f"({script.requires_python}) does not allow"
                )
        elif prefer is not None and _meets(prefer.version, specifier):
            chosen = prefer
        else:
            chosen = _meeting(specifier, offers, script.requires_python or "")
    return Choices(chosen, wanted, tuple(notes))


def _offer(asked: str, offers: tuple[Offer, ...]) -> Offer:
    asked = asked.strip()
    found = [offer for offer in offers if offer.matches(asked)]
    if found:
        return found[0]
    if not offers:
        raise ChoiceRefused(
            f"Python {asked!r} cannot be chosen here: this evaluation service runs one Python "
            "(see the tool's description); omit `python`."
        )
    raise ChoiceRefused(
        f"Python {asked!r} is not offered here; offered: "
        f"{', '.join(offer.version for offer in offers)}."
    )


def _meeting(specifier: SpecifierSet, offers: tuple[Offer, ...], text: str) -> Offer | None:
    """The default if it meets ``specifier``, else the newest offer that does."""
    if not offers:
        return None  # one Python, its version unknown: the run will tell
    if _meets(offers[0].version, specifier):
        return offers[0]
    meeting = sorted(
        (o for o in offers if _meets(o.version, specifier)), key=lambda o: Version(o.version)
    )
    if not meeting:
        raise ChoiceRefused(
            f"No Python offered here meets the script block's requires-python ({text}); "
            f"offered: {', '.join(offer.version for offer in offers)}."
        )
    return meeting[-1]


def _specifier(text: str | None) -> SpecifierSet | None:
    if text is None:
        return None
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ChoiceRefused(
            f"The script block's requires-python {text!r} is not a version specifier "
            "(e.g. '>=3.12')."
        ) from None


def _meets(version: str, specifier: SpecifierSet) -> bool:
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False
