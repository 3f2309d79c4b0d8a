"""The result's budget, pure: which figures fit, and what gives way, in which order."""

from __future__ import annotations

import struct
import zlib

from gateway.budget import INLINE_TOTAL_BYTES, OVER_BUDGET, Cut, choose_images
from gateway.facts import Figure
from gateway.render import RenderLimits
from python_mcp_server import Settings, render_result
from snekbox_client import EvalResult, File
from tests.support import text_of


def png(width: int = 4, height: int = 4, padding: int = 0) -> bytes:
    """A sound grey PNG; ``padding`` adds an ancillary chunk of that many bytes (for its size)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\0" + b"\x80" * width for _ in range(height)))
    extra = chunk(b"tEXt", b"x" * padding) if padding else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + extra
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


def figures(*contents: bytes) -> list[Figure]:
    return [
        Figure.returned(File(f"figure_{i:03d}.png", content), max_side=2000)
        for i, content in enumerate(contents, 1)
    ]


def test_what_gives_way_and_in_which_order() -> None:
    cut: Cut | None = Cut(10_000, 6000, {"figure_001.png": None, "figure_002.png": None})
    assert cut is not None and cut.inline_bytes == INLINE_TOTAL_BYTES
    cut = cut.smaller(floor=2000)  # first the files shown inline, copies of resources
    assert cut is not None and (cut.inline_bytes, cut.output_chars) == (0, 10_000)
    steps = []
    while cut is not None:
        returned = sorted(path for path, reason in cut.reasons.items() if reason is None)
        steps.append((cut.output_chars, cut.listing_chars, returned))
        cut = cut.smaller(floor=2000)
    assert steps[:6] == [
        (10_000, 6000, ["figure_001.png", "figure_002.png"]),
        (5000, 6000, ["figure_001.png", "figure_002.png"]),  # the output, down to the floor
        (2500, 6000, ["figure_001.png", "figure_002.png"]),
        (2000, 6000, ["figure_001.png", "figure_002.png"]),
        (2000, 6000, ["figure_001.png"]),  # then the figures, the last first
        (2000, 6000, []),
    ]
    assert steps[6] == (1000, 6000, [])  # then the output below the floor
    assert steps[-2] == (0, 1, []) and steps[-1] == (0, 0, [])  # the names last


def test_figures_are_chosen_in_drawing_order_within_each_bound() -> None:
    drawn = figures(png(), png(), png())
    assert list(choose_images(drawn, max_images=2, max_image_bytes=10**6, room=10**6).values()) == [
        None,
        None,
        OVER_BUDGET,
    ]
    size = drawn[0].file.size
    by_bytes = choose_images(drawn, max_images=9, max_image_bytes=2 * size, room=10**6)
    assert list(by_bytes.values()) == [None, None, OVER_BUDGET]
    # A block is its base64 (4 characters per 3 bytes) and its keys: room for one.
    by_room = choose_images(drawn, max_images=9, max_image_bytes=10**6, room=2 * size + 80)
    assert list(by_room.values()) == [None, OVER_BUDGET, OVER_BUDGET]
    # A big one left out does not hold back a small one after it.
    mixed = figures(png(padding=5000), png())
    chosen = choose_images(mixed, max_images=9, max_image_bytes=1000, room=10**6)
    assert list(chosen.values()) == [OVER_BUDGET, None]


def test_a_figure_that_is_not_a_sound_png_is_refused_with_its_defect() -> None:
    cut_short = png()[:-12]
    chosen = choose_images(figures(cut_short), max_images=9, max_image_bytes=10**6, room=10**6)
    assert chosen == {"figure_001.png": "not a valid PNG: it is cut short (no IEND chunk)"}


def test_empty_output_is_said() -> None:
    result = render_result(EvalResult("", 0), duration=0.1, limits=RenderLimits.of(Settings()))
    assert text_of(result) == "(no output)\n[exit code 0: ok]"
