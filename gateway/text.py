"""Text from the sandbox made safe to show: output cleaned, names quoted, long text cut.

Everything in an evaluation's answer was written by the sandboxed code. So its output is
cleaned of everything a terminal would act on (:func:`clean`), names are shown in double quotes
with JSON-style escapes (:func:`quote`), and long text keeps its head and tail (:func:`cut_middle`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = [
    "MAX_LISTED",
    "clean",
    "cut_middle",
    "duration",
    "end_of_output",
    "fitting",
    "listing",
    "quote",
    "size",
]

#: Entries of one list (figures, files) named at most.
MAX_LISTED = 100
#: Characters of one name shown at most (cut in the middle).
_NAME_CHARS = 160

# What a terminal acts on instead of printing (ECMA-48), in 7-bit (ESC ...) and 8-bit (C1)
# forms. Strings run to their terminator or to the next control character; the possessive
# quantifiers keep hostile output (introducers without terminators) linear.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*+[ -/]*+[@-~]"  # CSI: colours, cursor moves, erasing
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x80-\x9f]*+(?:\x07|\x1b\\|\x9c)"  # OSC: titles, links, clipboard
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x80-\x9f]*+(?:\x1b\\|\x9c)"  # DCS, SOS, PM, APC
    r"|\x1b[ -/]*+[0-~]"  # every other escape: intermediates, then one final character
)
# Line ends as a reader (and str.splitlines) sees them: a carriage return would let output
# overwrite itself on a terminal, so each one becomes a newline and nothing is hidden.
_LINE_BREAK = re.compile(r"\r\n?|[\v\f\x1c-\x1e\x85\u2028\u2029]")
# Left after those: control characters but tab and newline (a lone ESC, backspace, DEL, C1),
# bidi embeddings, overrides and isolates (they reorder what a reader sees), tag characters
# (invisible text).
_INVISIBLE = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f]"
)
_SURROGATE = re.compile(r"[\ud800-\udfff]")

# Names are shown in double quotes, JSON-style: a backslash, a quote and every character that is
# not plainly visible (controls, format characters such as bidi overrides, separators, spaces
# other than " ", unassigned and private code points, lone surrogates) become escapes, and the
# ellipsis too, since it marks a shortened name. A name then cannot end its quotes, break a line
# or change how the text around it reads.
_NOT_PLAIN = re.compile(r'[^ -~]|["\\]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})


def size(count: int) -> str:
    """``1 byte``, ``1,024 bytes``."""
    return "1 byte" if count == 1 else f"{count:,} bytes"


def duration(seconds: float) -> str:
    """``90 seconds``, ``15 minutes``: as a person would say a timeout."""
    if seconds < 120:
        return "1 second" if seconds == 1 else f"{seconds:g} seconds"
    return f"{seconds / 60:g} minutes"


def clean(text: str) -> str:
    """``text`` as plain lines: no terminal control sequence, no control but tab and newline."""
    text = _ESCAPE_SEQUENCE.sub("", text)
    text = _LINE_BREAK.sub("\n", text)
    text = _INVISIBLE.sub("", text)
    return _SURROGATE.sub("\ufffd", text)


def quote(text: str, limit: int = _NAME_CHARS) -> str:
    """``text`` escaped as inside a JSON string (see :data:`_NOT_PLAIN`), in at most about
    ``limit`` characters: a longer one keeps its start and end around an ellipsis."""
    if len(text) <= limit and len(escaped := _escape(text)) <= limit:
        return escaped
    head = _escaped_within(text, limit // 2)
    tail = _escaped_within(text[::-1], limit // 2)
    return "".join(head) + "…" + "".join(reversed(tail))


def cut_middle(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of ``text`` within ``limit`` characters, saying what was cut."""
    if len(text) <= limit:
        return text, False
    head = text[: limit * 3 // 5]
    tail = text[len(text) - limit * 2 // 5 :]
    cut = len(text) - len(head) - len(tail)
    note = (
        f"\n[... output cut: {cut:,} of {len(text):,} characters omitted; "
        f"the first {len(head):,} and the last {len(tail):,} are shown ...]\n"
    )
    return head + note + tail, True


def end_of_output(region: str, truncated: bool) -> str:
    """The line that closes the output: worded (numbered) so that the output does not hold it."""
    tag, number = "", 1
    while f"[end of output{tag}" in region:
        number += 1
        tag = f" #{number}"
    return f"[end of output{tag}{'; it was cut in the middle' if truncated else ''}]"


def fitting(entries: Sequence[str], chars: int) -> list[str]:
    """The first ``entries`` (at most :data:`MAX_LISTED`) that fit in ``chars`` characters."""
    fit: list[str] = []
    for entry in entries[:MAX_LISTED]:
        chars -= len(entry) + 2
        if chars < 0:
            break
        fit.append(entry)
    return fit


def listing(
    entries: Sequence[str], chars: int, separator: str = ", ", *, total: int | None = None
) -> str:
    """``entries`` joined, as many as fit in ``chars``, then how many of ``total`` are left out."""
    shown = fitting(entries, chars)
    left_out = (len(entries) if total is None else total) - len(shown)
    text = separator.join(shown)
    if left_out:
        text += f"{separator if shown else ''}{left_out:,} more not listed"
    return text


def _escaped_within(text: str, limit: int) -> list[str]:
    """The escaped forms of the first characters of ``text``, while they fit in ``limit``."""
    parts: list[str] = []
    for char in text:
        part = _escape(char)
        limit -= len(part)
        if limit < 0:
            break
        parts.append(part)
    return parts


def _escape(text: str) -> str:
    return _NOT_PLAIN.sub(_escape_character, text)


def _escape_character(match: re.Match[str]) -> str:
    char = match[0]
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    if char != "…" and unicodedata.category(char) not in _HIDDEN:
        return char
    units = char.encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
