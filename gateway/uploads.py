"""Files a call sends in (the tool's ``files``): checked, decoded, bounded, or refused whole.

A path is relative and stays inside the working directory: no empty, ``.`` or ``..`` part, no
leading ``/``, no NUL or other control character, no part starting with ``.`` (the sandbox keeps
its own there), none of the prelude's names. Contents are UTF-8 text or strict base64. A call
whose files break a rule is refused before anything runs, with the first rule broken and the
path it concerns, so that the model can fix that one file.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Literal

from pydantic import BaseModel, Field

import plotting

__all__ = ["InputFile", "UploadRefused", "decode_files"]

#: Characters of a path at most, and of each of its parts (Linux: 4096 and 255 bytes).
MAX_PATH_CHARS = 1024
MAX_PART_BYTES = 255
#: Folder levels a file may be in: Snekbox's (and the built-in evaluator's) depth limit when it
#: collects files, past which a run's files are all lost.
MAX_FOLDERS = 100
_RESERVED = {plotting.PRELUDE_NAME, plotting.BUNDLE_NAME, plotting.MANIFEST_NAME}


class InputFile(BaseModel):
    """A file to write into the working directory before the code runs."""

    path: str = Field(
        description="relative to the working directory; sub-folders are made (e.g. data/a.csv)"
    )
    content: str = Field(description="the file's content, as `encoding` says")
    encoding: Literal["utf-8", "base64"] = Field(
        default="utf-8", description="utf-8 for text, base64 for any bytes"
    )


class UploadRefused(ValueError):
    """The files sent in break a rule; the message names the path and the rule."""


def decode_files(files: list[InputFile], *, max_files: int, max_bytes: int) -> dict[str, bytes]:
    """The files' paths and decoded contents, in order.

    Raises:
        UploadRefused: a path or content breaks a rule, a path repeats or is also a folder of
            another, or there are more than ``max_files`` files or ``max_bytes`` bytes in all.
    """
    if len(files) > max_files:
        raise UploadRefused(
            f"{len(files)} files were sent; a call may send at most {max_files}. Send fewer "
            "(an archive, unpacked by the code, counts as one)."
        )
    decoded: dict[str, bytes] = {}
    total = 0
    for item in files:
        path = _checked_path(item.path)
        if path in decoded:
            raise UploadRefused(f"The path {_q(path)} is sent twice; send each file once.")
        if item.encoding == "base64":
            try:
                content = base64.b64decode(item.content, validate=True)
            except (binascii.Error, ValueError):
                raise UploadRefused(
                    f"The content of {_q(path)} is not valid base64 (encoding 'base64'); send "
                    "text with encoding 'utf-8'."
                ) from None
        else:
            content = item.content.encode("utf-8", "surrogatepass")
        total += len(content)
        if total > max_bytes:
            raise UploadRefused(
                f"The files sent add up to more than {max_bytes:,} bytes (at {_q(path)}), the "
                "limit of one call; send less, or have the code generate the data."
            )
        decoded[path] = content
    folders = {"/".join(p.split("/")[:i]) for p in decoded for i in range(1, p.count("/") + 1)}
    for path in decoded:
        if path in folders:
            raise UploadRefused(
                f"The path {_q(path)} is sent as a file and as a folder of another file."
            )
    return decoded


def _checked_path(path: str) -> str:
    if not path:
        raise UploadRefused("A file has an empty path; give each file a relative path.")
    if len(path) > MAX_PATH_CHARS:
        raise UploadRefused(f"The path {_q(path[:80])}... is longer than {MAX_PATH_CHARS} chars.")
    if path.startswith("/"):
        raise UploadRefused(
            f"The path {_q(path)} is absolute; paths are relative to the working directory "
            "(e.g. 'data.csv' or 'data/a.csv')."
        )
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        raise UploadRefused(f"The path {_q(path)} holds a control character; use plain names.")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise UploadRefused(
                f"The path {_q(path)} has an empty, '.' or '..' part; paths stay inside the "
                "working directory, without such parts."
            )
        if part.startswith("."):
            raise UploadRefused(
                f"The path {_q(path)} has a hidden part ({_q(part)}); names starting with '.' "
                "are the sandbox's own."
            )
        if len(part.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES:
            raise UploadRefused(f"A part of {_q(path)} is longer than {MAX_PART_BYTES} bytes.")
    if path.count("/") > MAX_FOLDERS:
        raise UploadRefused(
            f"The path {_q(path[:80])}... is {path.count('/')} folders deep; at most "
            f"{MAX_FOLDERS} are collected after a run."
        )
    if path in _RESERVED:
        raise UploadRefused(f"The path {_q(path)} is reserved by the gateway; use another name.")
    return path


def _q(text: str) -> str:
    """A path as the model can copy it: in double quotes, escaped as JSON."""
    return json.dumps(text)
