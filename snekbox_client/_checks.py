"""The one check of a ``POST /eval`` request, for the service that answers it.

Snekbox's JSON schema, with this project's extensions (:data:`REQUEST_SCHEMA`), and its rules
for a file's path and content. A JSON body is checked and turned into an :class:`EvalRequest`
by :func:`parse_request`; a request built in the service's own process (the gateway's, with the
built-in evaluator in it) by :func:`check_request`: the same rules, the same errors
(:class:`InvalidRequest`, worded as Snekbox words its 400 answers), so that no request the
HTTP API would refuse runs in process.
"""

from __future__ import annotations

import base64
import binascii
import math
import posixpath
from collections.abc import Sequence
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from ._exceptions import InvalidRequest, InvalidRequestFile
from ._fields import (
    CONTENT_WANTED_FIELD,
    END_SESSIONS_FIELD,
    PACKAGES_FIELD,
    SESSION_FIELD,
    SESSION_OWNER_FIELD,
    SESSION_RESUME_FIELD,
    TIME_LIMIT_FIELD,
    WAIT_FIELD,
)
from ._request import ContentWanted, EvalRequest, File

__all__ = ["REQUEST_SCHEMA", "check_request", "parse_request"]

# A live session's id: the request's session, and each of its end_sessions.
_SESSION_PATTERN = "^[A-Za-z0-9_-]{1,64}$"
#: Snekbox's request schema. The path pattern rejects a leading ``/`` and the two characters
#: ``\0`` (a literal backslash-zero, as Snekbox's own tests expect).
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "input": {"type": "string"},
        "args": {"type": "array", "items": {"type": "string"}},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "pattern": r"^(?!/)(?!.*\\0).*$"},
                    "content": {"type": "string"},
                },
                "required": ["path"],
            },
        },
        "executable_path": {"type": "string"},
        # This project's extensions (see the fields' names in ._fields).
        TIME_LIMIT_FIELD: {"type": "number", "exclusiveMinimum": 0},
        SESSION_FIELD: {"type": "string", "pattern": _SESSION_PATTERN},
        SESSION_RESUME_FIELD: {"type": "boolean"},
        END_SESSIONS_FIELD: {
            "type": "array",
            "items": {"type": "string", "pattern": _SESSION_PATTERN},
            "maxItems": 64,
        },
        SESSION_OWNER_FIELD: {"type": "string", "pattern": _SESSION_PATTERN},
        PACKAGES_FIELD: {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 200},
            "maxItems": 64,
        },
        WAIT_FIELD: {"type": "number", "minimum": 0, "maximum": 86_400},
    },
    "anyOf": [{"required": ["input"]}, {"required": ["args"]}],
}
_validator = jsonschema.Draft202012Validator(REQUEST_SCHEMA)


def parse_request(body: Any, *, max_files: int, reserved: Sequence[str] = ()) -> EvalRequest:
    """Check a decoded JSON body and build the run it asks for.

    When ``input`` is given, ``args`` defaults to ``["-c"]`` and ``input`` is appended to it
    (:attr:`EvalRequest.argv`).

    Args:
        body: The decoded body.
        max_files: The most files a request may send.
        reserved: Directories of the working directory the service keeps for itself: a file
            at or below one, or at one of its parents, is refused.

    Raises:
        InvalidRequest: the body fails the schema, has more than ``max_files`` files, or a
            number that is not finite ("Request data failed validation").
        InvalidRequestFile: a file path is absolute, has a NUL, is not UTF-8, leaves the working
            directory or collides with a reserved directory, or its content is not base64
            ("Request file is invalid").
    """
    # The schema takes ~20 us per file and ~8 us per argument: count the files first, and show
    # it only the first argument that is not a string (its verdict and message are the same).
    checked, files_given = body, 0
    if isinstance(body, dict):
        files, args = body.get("files"), body.get("args")
        files_given = len(files) if isinstance(files, list) else 0
        if isinstance(args, list):
            checked = {**body, "args": [a for a in args if not isinstance(a, str)][:1]}
    _check_fields(checked, files_given, max_files)
    files = tuple(_parse_file(item, reserved) for item in body.get("files", []))
    # content_wanted: this project's extension of the request (Snekbox ignores the field).
    try:
        wanted = body.get(CONTENT_WANTED_FIELD)
        content_wanted = None if wanted is None else ContentWanted.from_json(wanted)
        return EvalRequest(
            input=body.get("input"),
            args=body.get("args"),
            files=files,
            executable_path=body.get("executable_path") or None,
            content_wanted=content_wanted,
            time_limit=body.get(TIME_LIMIT_FIELD),
            session=body.get(SESSION_FIELD),
            session_resume=body.get(SESSION_RESUME_FIELD, False),
            end_sessions=tuple(body.get(END_SESSIONS_FIELD, ())),
            session_owner=body.get(SESSION_OWNER_FIELD),
            packages=tuple(body.get(PACKAGES_FIELD, ())),
            wait=body.get(WAIT_FIELD),
        )
    except ValueError as exc:  # whatever the models refuse is the request's fault: a 400
        raise InvalidRequest(str(exc)) from exc


def check_request(request: EvalRequest, *, max_files: int, reserved: Sequence[str] = ()) -> None:
    """What :func:`parse_request` checks, of a request built in this process rather than sent
    as JSON: the same rules and errors, so that no request the API would refuse runs.

    Raises:
        InvalidRequest: as :func:`parse_request` does.
        InvalidRequestFile: as :func:`parse_request` does.
    """
    # The schema's verdict on all but the files' contents and the arguments, which the
    # dataclass has as bytes and strings already.
    checked: dict[str, Any] = {
        name: value
        for name, value in (
            ("input", request.input),
            ("args", None if request.args is None else []),
            ("files", [{"path": file.path} for file in request.files] or None),
            ("executable_path", request.executable_path),
            (TIME_LIMIT_FIELD, request.time_limit),
            (SESSION_FIELD, request.session),
            (SESSION_RESUME_FIELD, request.session_resume or None),
            (END_SESSIONS_FIELD, list(request.end_sessions) or None),
            (SESSION_OWNER_FIELD, request.session_owner),
            (PACKAGES_FIELD, list(request.packages) or None),
            (WAIT_FIELD, request.wait),
        )
        if value is not None
    }
    _check_fields(checked, len(request.files), max_files)
    for file in request.files:
        _check_path(file.path, reserved)


def _check_fields(checked: Any, files: int, max_files: int) -> None:
    """The rules both ways in share, but a file's: how many files, the schema, a finite
    ``time_limit``.

    Raises:
        InvalidRequest: the first rule broken.
    """
    if files > max_files:
        raise InvalidRequest(f"A request may send at most {max_files} files, not {files}")
    error = jsonschema.exceptions.best_match(_validator.iter_errors(checked))
    if error is not None:
        raise InvalidRequest(error.message)
    # NaN compares false with every bound (exclusiveMinimum lets it through), and no run
    # takes forever.
    time_limit = checked.get(TIME_LIMIT_FIELD)
    if isinstance(time_limit, float) and not math.isfinite(time_limit):
        raise InvalidRequest(f"{time_limit} is not a finite number")


def _parse_file(item: dict[str, str], reserved: Sequence[str]) -> File:
    path = item["path"]
    _check_path(path, reserved)
    try:
        content = base64.b64decode(item.get("content", ""))
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestFile(f"Invalid base64 encoding for file '{path}'") from exc
    return File(path, content)


def _check_path(path: str, reserved: Sequence[str]) -> None:
    """Snekbox's rules for a file's path, and the service's reserved directories.

    Raises:
        InvalidRequestFile: the path breaks one (the message says which).
    """
    if path.startswith("/"):
        raise InvalidRequestFile(f"File path '{path}' must be relative")
    # Snekbox resolves the path under /home; a NUL byte makes that fail the same way.
    resolved = posixpath.normpath(posixpath.join("/home", path))
    if "\0" in path or not (resolved == "/home" or resolved.startswith("/home/")):
        raise InvalidRequestFile(f"File path '{path}' may not traverse beyond root")
    try:
        path.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: no file can have that name
        raise InvalidRequestFile(f"File path {path!r} is not valid UTF-8") from exc
    relative = posixpath.relpath(resolved, "/home")
    for directory in reserved:
        if f"{relative}/".startswith(f"{directory}/") or directory.startswith(f"{relative}/"):
            raise InvalidRequestFile(
                f"File path '{path}' collides with '{directory}', a directory the evaluator "
                "keeps for itself"
            )
