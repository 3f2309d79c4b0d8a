"""PNG checks: a figure is forwarded only if it is a sound, still, bounded PNG.

The code can write any bytes under a figure's name, and a client decodes what it is sent. So
:func:`check_header` reads the size a PNG claims and bounds it, and :func:`find_defect` reads
every chunk before the image is forwarded.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

__all__ = ["PngHeader", "check_header", "find_defect"]

# Valid bit depths of each PNG colour type, and its channels.
_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_CRITICAL = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND"})


@dataclass(frozen=True)
class PngHeader:
    """The size a PNG claims, if it can be read, and what bars it from a result, if anything."""

    width: int | None = None
    height: int | None = None
    problem: str | None = None


def check_header(data: bytes, max_side: int, *, complete: bool = True) -> PngHeader:
    """A PNG's real size from its IHDR chunk, and what bars it from the result, if anything.

    Checked: the chunk's length (13) and checksum, values the PNG format allows, each side
    against ``max_side``, and the bytes the pixels take once decoded against a ``max_side``
    square of 8-bit RGBA: what a client would have to decode stays bounded. Of a PNG not
    ``complete`` (only its head came back), only the size it claims is read.
    """
    if not complete:
        if len(data) >= 24 and data[12:16] == b"IHDR":
            width, height = struct.unpack_from(">II", data, 16)
            return PngHeader(width, height)
        return PngHeader()
    if len(data) < 33:
        return PngHeader(problem="not a valid PNG: it ends within its header")
    length, kind = struct.unpack_from(">I4s", data, 8)
    if (length, kind) != (13, b"IHDR"):
        return PngHeader(problem="not a valid PNG: its first chunk is not a 13-byte IHDR")
    if zlib.crc32(data[12:29]) != struct.unpack_from(">I", data, 29)[0]:
        return PngHeader(problem="not a valid PNG: its header fails its checksum")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack_from(
        ">IIBBBBB", data, 16
    )
    if (
        not (0 < width < 2**31 and 0 < height < 2**31)
        or depth not in _DEPTHS.get(colour, ())
        or (compression, filtering) != (0, 0)
        or interlace > 1
    ):
        return PngHeader(problem="not a valid PNG: its header holds impossible values")
    if width > max_side or height > max_side:
        return PngHeader(
            width,
            height,
            f"{width:,} x {height:,} pixels, over the limit of {max_side:,} pixels a side",
        )
    decoded = width * height * -(-_CHANNELS[colour] * depth // 8)
    if decoded > max_side * max_side * 4:
        return PngHeader(
            width,
            height,
            f"{decoded:,} bytes once decoded, over the limit of {max_side * max_side * 4:,}",
        )
    return PngHeader(width, height)


def find_defect(data: bytes) -> str | None:
    """What makes a PNG with a sound header unfit to forward, or ``None``: every chunk is read.

    Each chunk must fit in the file and pass its checksum; an unknown critical chunk, an animation
    (APNG: every frame would be decoded), no image data, a missing end or bytes after it are
    refused.
    """
    view = memoryview(data)
    offset, has_data = 8, False
    while offset + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        end = offset + 12 + length
        if end > len(data):
            return "not a valid PNG: a chunk runs past the end of the file"
        if not kind.isalpha():
            return "not a valid PNG: a chunk has an invalid type"
        if zlib.crc32(view[offset + 4 : end - 4]) != struct.unpack_from(">I", data, end - 4)[0]:
            return "not a valid PNG: a chunk fails its checksum"
        if kind == b"acTL":
            return "an animated PNG: only still images are returned"
        if kind[:1].isupper() and kind not in _CRITICAL:
            return "not a valid PNG: it has an unknown critical chunk"
        has_data = has_data or kind == b"IDAT"
        offset = end
        if kind == b"IEND":
            if offset != len(data):
                return "not a valid PNG: bytes follow its end"
            return None if has_data else "not a valid PNG: it holds no image data"
    return "not a valid PNG: it is cut short (no IEND chunk)"
