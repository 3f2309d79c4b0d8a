"""The tool's published output schema: the structured form of a result (clients depend on it)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, WithJsonSchema

from .status import Status

__all__ = ["ExecutionResult", "FileInfo", "ImageInfo", "WrittenFile"]

# A nullable field published as ``{"type": [T, "null"]}`` rather than pydantic's ``anyOf`` of
# two schemas: the same values, but a validating client (the MCP SDK's client checks every
# result) descends into one schema instead of up to two: 15 descents instead of 21 for a
# ``print(1)`` result, about a quarter less time.
_NullableInt = Annotated[int | None, WithJsonSchema({"type": ["integer", "null"]})]
_NullableFloat = Annotated[float | None, WithJsonSchema({"type": ["number", "null"]})]
_NullableStr = Annotated[str | None, WithJsonSchema({"type": ["string", "null"]})]
_NullableStrList = Annotated[
    list[str] | None, WithJsonSchema({"type": ["array", "null"], "items": {"type": "string"}})
]


class ImageInfo(BaseModel):
    """A figure the run drew, and whether the result carries it."""

    path: str
    size: int = Field(description="PNG size in bytes")
    width: _NullableInt = None
    height: _NullableInt = None
    returned: bool = Field(description="False when the result does not carry it (see reason)")
    reason: _NullableStr = Field(default=None, description="why the result does not carry it")


class FileInfo(BaseModel):
    """A file the run wrote (other than a figure)."""

    path: str = Field(
        description="its name, with JSON-style escapes for characters that are not plainly "
        "visible, shortened in the middle (…) when long"
    )
    size: int = Field(description="size in bytes")


class WrittenFile(FileInfo):
    """A file the run wrote, and where to read it while its session lives."""

    mime_type: str = Field(description="its type, guessed from its name")
    uri: _NullableStr = Field(
        default=None,
        description="read it with resources/read while the session lives; null when the "
        "session could not keep it (see the text)",
    )


class ExecutionResult(BaseModel):
    """The structured form of a result: the same facts as the text and image content."""

    stdout: str = Field(
        description="stdout and stderr merged, control sequences removed, possibly cut in the "
        "middle; when returncode is null, the evaluator's message instead"
    )
    stdout_truncated: bool
    returncode: _NullableInt
    status: Status
    message: str = Field(description="the exit status in words")
    images: list[ImageInfo]
    images_unlisted: int = Field(default=0, description="figures left out of `images`")
    files: list[WrittenFile] = Field(description="files the run wrote, as many as fit")
    files_unlisted: int = Field(default=0, description="files carried but left out of `files`")
    files_not_returned: list[FileInfo] = Field(
        default_factory=list,
        description="files the run wrote that the evaluator did not return, as the sandbox's "
        "own list (which the code could alter) names them",
    )
    files_not_returned_count: int = Field(
        default=0, description="how many such files, listed or not (at least)"
    )
    session_id: _NullableStr = Field(
        default=None, description="the session this call ran in: pass it to continue it"
    )
    packages: _NullableStrList = Field(
        default=None, description="the packages installed for it, pinned (null: none asked for)"
    )
    install_seconds: _NullableFloat = Field(
        default=None,
        description="seconds the install took, not counted in the time limit (null: none)",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="how the call's arguments and its '# /// script' block were reconciled",
    )
