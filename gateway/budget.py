"""The result's budget: which figures fit, how big a result is on the wire, and what gives way.

A serialized result stays within ``max_result_bytes`` (MCP clients accept 1 MiB for one
message), less :data:`ENVELOPE_BYTES`. :func:`choose_images` picks the figures that fit beside a
bare result; should the whole still be too big, :meth:`Cut.smaller` says what gives way next:
the small text files shown inline, the output down to :data:`OUTPUT_FLOOR` characters, then
figures from the last, then the output and the lists of names further.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from mcp.types import CallToolResult

from .facts import Figure
from .png import find_defect

__all__ = [
    "ENVELOPE_BYTES",
    "INLINE_FILE_BYTES",
    "INLINE_TOTAL_BYTES",
    "LISTING_CHARS",
    "OUTPUT_FLOOR",
    "OVER_BUDGET",
    "Cut",
    "choose_images",
    "wire_size",
]

#: Bytes of ``max_result_bytes`` kept for the JSON-RPC envelope and the SSE framing.
ENVELOPE_BYTES = 1024
#: Characters of output kept, when the result is too big, before figures are left out.
OUTPUT_FLOOR = 2000
#: Characters of names per list (figures, files) at most.
LISTING_CHARS = 6000
#: Why a figure that fits every other rule is not in the result.
OVER_BUDGET = "over the result's budget for images"
#: The largest written text file shown inline (an embedded resource), and all of them together.
INLINE_FILE_BYTES = 4096
INLINE_TOTAL_BYTES = 16384
#: Characters of an image block beyond its base64 data (its keys and MIME type).
_IMAGE_BLOCK_KEYS = 80


@dataclass(frozen=True)
class Cut:
    """How much of a result is kept: characters of output and of each list of names, which
    figures are returned (``reasons``: ``None`` returned, else why not), and bytes of written
    text files shown inline."""

    output_chars: int
    listing_chars: int
    reasons: Mapping[str, str | None]
    inline_bytes: int = INLINE_TOTAL_BYTES

    def smaller(self, floor: int) -> Cut | None:
        """The next cut when this one is too big, or ``None``: nothing more can give way."""
        returned = [path for path, reason in self.reasons.items() if reason is None]
        if self.inline_bytes:  # a copy of what resources/read gives: the first to go
            return replace(self, inline_bytes=0)
        if self.output_chars > floor:
            return replace(self, output_chars=max(floor, self.output_chars // 2))
        if returned:
            return replace(self, reasons={**self.reasons, returned[-1]: OVER_BUDGET})
        if self.output_chars:
            return replace(self, output_chars=self.output_chars // 2)
        if self.listing_chars:
            return replace(self, listing_chars=self.listing_chars // 2)
        return None


def choose_images(
    figures: Sequence[Figure], *, max_images: int, max_image_bytes: int, room: int
) -> dict[str, str | None]:
    """Which figures the result carries (``None``), in drawing order, and why not the others.

    Each figure must be whole, within ``max_images`` and ``max_image_bytes`` counted so far,
    fit in ``room`` bytes of the result, and pass :func:`~gateway.png.find_defect`.
    """
    reasons: dict[str, str | None] = {}
    count, png_bytes = 0, max_image_bytes
    for figure in figures:
        file = figure.file
        reason = figure.problem
        # A base64 string in an image block: 4 characters per 3 bytes, plus the block's keys.
        block = 4 * -(-file.size // 3) + _IMAGE_BLOCK_KEYS
        if reason is None:
            if not file.complete or count >= max_images or file.size > png_bytes or block > room:
                reason = OVER_BUDGET
            else:
                reason = find_defect(file.content)
        if reason is None:
            count, png_bytes, room = count + 1, png_bytes - file.size, room - block
        reasons[file.path] = reason
    return reasons


def wire_size(result: CallToolResult) -> int:
    """Bytes of ``result`` as the SDK sends it, every non-ASCII character escaped (the most)."""
    return len(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True)))
