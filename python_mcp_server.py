"""The gateway: an MCP server whose tool ``execute_python_code`` runs Python in a sandbox.

One Starlette app, :data:`starlette_app`, serves MCP over SSE (``GET /sse`` + ``POST /messages/``)
and over Streamable HTTP (``/mcp``), plus ``/healthz``, ``/readyz`` and ``/metrics``. Every call
is forwarded as one ``POST /eval`` through :mod:`snekbox_client` to the evaluation service: the
Snekbox at ``SNEKBOX_URL``, or, when none is set, the built-in :mod:`evaluator` running in-process
behind an ASGI transport. :mod:`plotting` supplies the prelude that turns matplotlib figures into
PNG files.

Run it with ``python-mcp-server`` (see ``--help``) or ``uvicorn python_mcp_server:starlette_app``;
the latter reads its settings from the environment when the attribute is first looked up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import re
import signal
import socket
import struct
import sys
import time
import unicodedata
import zlib
from base64 import b64encode
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Literal

import anyio
import httpx
import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

import evaluator
import plotting
from gateway import (
    LoopbackGuard,
    RequestDeadline,
    SessionTable,
    SseSessions,
    StreamableSessions,
    guarded_protocol,
)
from snekbox_client import (
    ContentWanted,
    EvalResult,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    File,
    InvalidResponse,
    SnekboxClient,
    SnekboxError,
)

__all__ = [
    "Admission",
    "Busy",
    "DrainingServer",
    "ExecutionResult",
    "FileInfo",
    "Gateway",
    "ImageInfo",
    "Metrics",
    "Settings",
    "StaticTokenVerifier",
    "create_app",
    "create_server",
    "describe_exit",
    "main",
    "render_result",
]

logger = logging.getLogger("python_mcp_server")

TOOL_NAME = "execute_python_code"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class Settings:
    """Everything the gateway can be told; :meth:`from_env` reads the environment once.

    ``snekbox_url`` ``None`` selects the built-in evaluator, configured by ``evaluator_config``.
    ``None`` for ``max_in_flight`` and ``eval_timeout`` means "derived from the evaluator": its
    concurrency and its time limit plus a margin (or fixed defaults for a remote Snekbox).
    """

    snekbox_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 18080
    auth_token: str | None = None
    allow_unauthenticated: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_in_flight: int | None = None
    max_waiting: int = 32
    max_wait: float = 30.0
    eval_timeout: float | None = None
    progress_interval: float = 2.0
    max_request_bytes: int = 4 * 1024 * 1024
    max_code_chars: int = 1_000_000
    max_output_chars: int = 20_000
    max_image_bytes: int = 512 * 1024
    max_images: int = 16
    log_level: str = "info"
    log_code: bool = False
    shutdown_grace: float = 30.0
    evaluator_config: evaluator.EvaluatorConfig = field(default_factory=evaluator.EvaluatorConfig)
    #: Sessions open at once, both transports; a new one closes the longest idle (gateway.sessions).
    max_sessions: int = 256
    #: Seconds a Streamable HTTP session may go without a request before it is closed.
    session_idle_timeout: float = 600.0
    #: Seconds a request's headers, then its body, may take to arrive (gateway.serving, .edge).
    request_timeout: float = 20.0
    #: Connections open at once; one more is answered 503 (python-mcp-server only).
    max_connections: int = 512
    #: Bytes of one serialized tool result at most, images included (MCP clients accept 1 MiB).
    max_result_bytes: int = 1024 * 1024
    #: Pixels a side of a figure returned at most (the prelude draws within FIGURE_MAX_PIXELS).
    max_image_side: int = plotting.FIGURE_MAX_PIXELS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Settings from ``SNEKBOX_URL``, the ``MCP_*`` variables and the evaluator's own.

        Raises:
            ValueError: a malformed value, or an unreadable ``MCP_AUTH_TOKEN_FILE``.
        """
        values: dict[str, Any] = {}
        for variable, (name, parse) in _ENVIRONMENT.items():
            raw = environ.get(variable, "").strip()
            if raw:
                try:
                    values[name] = parse(raw)
                except ValueError as exc:
                    raise ValueError(f"{variable}={raw!r} is not valid: {exc}") from exc
        token_file = environ.get("MCP_AUTH_TOKEN_FILE", "").strip()
        if token_file and "auth_token" not in values:
            try:
                values["auth_token"] = Path(token_file).read_text().strip() or None
            except OSError as exc:
                raise ValueError(f"MCP_AUTH_TOKEN_FILE={token_file!r}: {exc.strerror}") from exc
        return cls(**values, evaluator_config=evaluator.EvaluatorConfig.from_env(environ))

    @property
    def in_flight_limit(self) -> int:
        """Evaluations at once, across both transports."""
        if self.max_in_flight is not None:
            return self.max_in_flight
        return 4 if self.snekbox_url else self.evaluator_config.concurrency

    @property
    def timeout(self) -> float:
        """Seconds to wait for one evaluation's answer: a little longer than its time limit."""
        if self.eval_timeout is not None:
            return self.eval_timeout
        return 30.0 if self.snekbox_url else self.evaluator_config.time_limit + 10.0

    def check(self) -> None:
        """Refuse configurations that are unsafe or meaningless, saying how to fix them.

        Raises:
            ValueError: with the message to show the operator.
        """
        loopback = self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")
        if not loopback and not self.auth_token and not self.allow_unauthenticated:
            raise ValueError(
                f"refusing to listen on {self.host} without authentication: anyone who reaches "
                "this address could run code. Set MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE) to a "
                "secret that clients send as 'Authorization: Bearer <token>', or, if a proxy in "
                "front authenticates, opt out with MCP_ALLOW_UNAUTHENTICATED=true "
                "(--allow-unauthenticated)."
            )
        if self.in_flight_limit < 1 or self.max_waiting < 0 or self.max_wait < 0:
            raise ValueError(
                "MCP_MAX_IN_FLIGHT must be >= 1, MCP_MAX_WAITING and MCP_MAX_WAIT >= 0"
            )
        if self.max_sessions < 1 or self.max_connections < 1:
            raise ValueError("MCP_MAX_SESSIONS and MCP_MAX_CONNECTIONS must be >= 1")
        if not (0 < self.session_idle_timeout < math.inf and 0 < self.request_timeout < math.inf):
            raise ValueError("MCP_SESSION_IDLE_TIMEOUT and MCP_REQUEST_TIMEOUT must be > 0 seconds")

    def transport_security(self) -> TransportSecuritySettings:
        """DNS-rebinding protection: loopback Hosts and Origins plus the configured extras."""
        hosts = [f"{h}:*" for h in _LOOPBACK_HOSTS] + list(self.allowed_hosts)
        origins = [f"http://{h}:*" for h in _LOOPBACK_HOSTS] + list(self.allowed_origins)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )


def _flag(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


#: The environment variable of each setting, and how its value is parsed.
_ENVIRONMENT: dict[str, tuple[str, Callable[[str], Any]]] = {
    "SNEKBOX_URL": ("snekbox_url", str),
    "MCP_HOST": ("host", str),
    "MCP_PORT": ("port", int),
    "MCP_AUTH_TOKEN": ("auth_token", str),
    "MCP_ALLOW_UNAUTHENTICATED": ("allow_unauthenticated", _flag),
    "MCP_ALLOWED_HOSTS": ("allowed_hosts", lambda v: _split(v)),
    "MCP_ALLOWED_ORIGINS": ("allowed_origins", lambda v: _split(v)),
    "MCP_MAX_IN_FLIGHT": ("max_in_flight", int),
    "MCP_MAX_WAITING": ("max_waiting", int),
    "MCP_MAX_WAIT": ("max_wait", float),
    "MCP_EVAL_TIMEOUT": ("eval_timeout", float),
    "MCP_PROGRESS_INTERVAL": ("progress_interval", float),
    "MCP_MAX_REQUEST_BYTES": ("max_request_bytes", int),
    "MCP_MAX_CODE_CHARS": ("max_code_chars", int),
    "MCP_MAX_OUTPUT_CHARS": ("max_output_chars", int),
    "MCP_MAX_IMAGE_BYTES": ("max_image_bytes", int),
    "MCP_MAX_IMAGES": ("max_images", int),
    "MCP_LOG_LEVEL": ("log_level", str.lower),
    "MCP_LOG_CODE": ("log_code", _flag),
    "MCP_SHUTDOWN_GRACE": ("shutdown_grace", float),
    "MCP_MAX_SESSIONS": ("max_sessions", int),
    "MCP_SESSION_IDLE_TIMEOUT": ("session_idle_timeout", float),
    "MCP_REQUEST_TIMEOUT": ("request_timeout", float),
    "MCP_MAX_CONNECTIONS": ("max_connections", int),
    "MCP_MAX_RESULT_BYTES": ("max_result_bytes", int),
    "MCP_MAX_IMAGE_SIDE": ("max_image_side", int),
}


def _split(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


# --- The result the model sees ---------------------------------------------------------------
#
# Everything in an evaluation's answer was written by the sandboxed code: its output, the names,
# sizes and contents of its files, its figures, even the manifest the prelude leaves. So the
# output is cleaned of everything a terminal would act on, names are quoted with escapes, every
# PNG is checked before it is forwarded, and the serialized result is measured against
# ``max_result_bytes`` (see render_result for what gives way, in which order).

Status = Literal[
    "ok",
    "error",
    "exception",
    "killed",
    "output_limit",
    "signal",
    "sandbox_error",
    "invalid_output",
    "files_not_collected",
    "not_run",
    "evaluator_error",
]


class ImageInfo(BaseModel):
    """A figure the run drew, and whether the result carries it."""

    path: str
    size: int = Field(description="PNG size in bytes")
    width: int | None = None
    height: int | None = None
    returned: bool = Field(description="False when the result does not carry it (see reason)")
    reason: str | None = Field(default=None, description="why the result does not carry it")


class FileInfo(BaseModel):
    """A file the run wrote (other than a figure)."""

    path: str = Field(
        description="its name, with JSON-style escapes for characters that are not plainly "
        "visible, shortened in the middle (…) when long"
    )
    size: int = Field(description="size in bytes")


class ExecutionResult(BaseModel):
    """The structured form of a result: the same facts as the text and image content."""

    stdout: str = Field(
        description="stdout and stderr merged, control sequences removed, possibly cut in the "
        "middle; when returncode is null, the evaluator's message instead"
    )
    stdout_truncated: bool
    returncode: int | None
    status: Status
    message: str = Field(description="the exit status in words")
    images: list[ImageInfo]
    images_unlisted: int = Field(default=0, description="figures left out of `images`")
    files: list[FileInfo] = Field(description="files the result carries, as many as fit")
    files_unlisted: int = Field(default=0, description="files carried but left out of `files`")
    files_not_returned: list[FileInfo] = Field(
        default_factory=list,
        description="files the run wrote that the evaluator did not return, as the sandbox's "
        "own list (which the code could alter) names them",
    )
    files_not_returned_count: int = Field(
        default=0, description="how many such files, listed or not (at least)"
    )


#: Bytes of ``max_result_bytes`` kept for the JSON-RPC envelope and the SSE framing.
_ENVELOPE_BYTES = 1024
#: Characters of output kept, when the result is too big, before figures are left out.
_OUTPUT_FLOOR = 2000
#: Entries of one list (figures, files) named at most, and characters of names per list.
_MAX_LISTED = 100
_LISTING_CHARS = 6000
#: Characters of one name, and of an evaluator's message, shown at most (cut in the middle).
_NAME_CHARS = 160
_MESSAGE_CHARS = 300

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

# Valid bit depths of each PNG colour type, and its channels.
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PNG_CRITICAL = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND"})

# The evaluator's messages when it answers returncode null (Snekbox's wording, which the
# built-in evaluator shares): those that mean the code ran but its output and files were lost.
_INVALID_OUTPUT = "UnicodeDecodeError: invalid Unicode in output pipe"
_FILES_NOT_COLLECTED = re.compile(
    r"FileParsingError: .*|TimeoutError: Exceeded time limit while parsing attachments", re.DOTALL
)
_NOT_RUN = re.compile(
    r"\w+: Failed to create file '.*'\.|ValueError: embedded null byte", re.DOTALL
)


def render_result(result: EvalResult, *, duration: float, settings: Settings) -> CallToolResult:
    """Turn an evaluation into what the model reads: text, one image per figure, file lists.

    The serialized result stays within ``settings.max_result_bytes`` (less room for the
    envelope). Figures are chosen against a result whose output is cut to
    :data:`_OUTPUT_FLOOR` characters; then the output gets what is left, up to
    ``max_output_chars``. Should that not be enough (output made of characters that take 12
    bytes each once escaped, say), the output is cut down to the floor, then figures are left
    out from the last, then the output and the lists of names are cut further: each is said in
    the text.
    """
    facts = _Facts.of(result, duration, settings)
    limit = settings.max_result_bytes - _ENVELOPE_BYTES
    floor = min(settings.max_output_chars, _OUTPUT_FLOOR)
    unchosen = {f.file.path: f.problem or _OVER_BUDGET for f in facts.figures}
    bare = _compose(facts, settings, floor, _LISTING_CHARS, unchosen)
    reasons = _choose_images(facts.figures, settings, limit - _wire_size(bare))
    output_chars = min(settings.max_output_chars, len(facts.output))
    listing_chars = _LISTING_CHARS
    while True:
        rendered = _compose(facts, settings, output_chars, listing_chars, reasons)
        returned = [path for path, reason in reasons.items() if reason is None]
        if _wire_size(rendered) <= limit:
            return rendered
        if output_chars > floor:
            output_chars = max(floor, output_chars // 2)
        elif returned:
            reasons[returned[-1]] = _OVER_BUDGET
        elif output_chars:
            output_chars //= 2
        elif listing_chars:
            listing_chars //= 2
        else:  # a budget smaller than a bare status line: nothing more can give way
            return rendered


#: Why a figure that fits every other rule is not in the result.
_OVER_BUDGET = "over the result's budget for images"
_LOST = "lost: the run ended while it was being saved"
_NOT_RETURNED = "not returned by the evaluator, which returns a limited number and size of files"


@dataclass(frozen=True)
class _Figure:
    """A figure the run drew: its real size, and what bars it from the result.

    ``kind``: ``"figure"`` returned by the evaluator, ``"lost"`` still being saved when the run
    ended, ``"missing"`` named by the manifest but not returned.
    """

    file: File
    width: int | None = None
    height: int | None = None
    problem: str | None = None
    kind: Literal["figure", "lost", "missing"] = "figure"


@dataclass(frozen=True)
class _Facts:
    """What a result says, cleaned and checked, before anything is cut to size."""

    output: str
    returncode: int | None
    status: Status
    message: str
    figures: list[_Figure]
    files: list[File]
    not_returned: list[tuple[str, int]]
    not_returned_count: int
    not_returned_exact: bool

    @classmethod
    def of(cls, result: EvalResult, duration: float, settings: Settings) -> _Facts:
        output = _clean(result.stdout)
        status, message = describe_exit(result.returncode, output, duration)
        files = plotting.sort_files(result.files)
        figures = [_inspect_figure(f, settings.max_image_side) for f in files.figures]
        figures += [_Figure(f, problem=_LOST, kind="lost") for f in files.lost_figures]
        not_returned: list[tuple[str, int]] = []
        count, exact = 0, True
        if files.manifest is not None:
            returned = {f.path for f in result.files}
            listed = {path for path, _ in files.manifest.files}
            for path, size in files.manifest.files:
                if path in returned:
                    continue
                if plotting.is_figure(path):
                    missing = File(path, b"", size)
                    figures.append(_Figure(missing, problem=_NOT_RETURNED, kind="missing"))
                else:
                    not_returned.append((path, size))
            # Of the files the manifest counts but does not name, those returned are among the
            # returned files it does not name.
            unnamed = files.manifest.total - len(files.manifest.files)
            returned_unnamed = len(returned - listed - {plotting.MANIFEST_NAME})
            count = len(not_returned) + max(0, unnamed - returned_unnamed)
            exact = files.manifest.complete
        figures.sort(key=lambda f: plotting.figure_number(f.file.path))
        return cls(
            output,
            result.returncode,
            status,
            message,
            figures,
            files.others,
            not_returned,
            count,
            exact,
        )


def _compose(
    facts: _Facts,
    settings: Settings,
    output_chars: int,
    listing_chars: int,
    reasons: Mapping[str, str | None],
) -> CallToolResult:
    """The result, with the output cut to ``output_chars`` and figures returned as ``reasons``
    says (``None``: returned, else why not)."""
    shown, truncated = _cut_middle(facts.output, output_chars)
    # The output comes first (the README promises output, then the status), so it cannot be
    # fenced from above without moving it; instead a closing line the output does not contain
    # ends it, and only the gateway writes after that line: output that imitates the
    # gateway's lines stays above it, and names below it are quoted.
    if facts.returncode is not None and shown.strip():
        region = shown.rstrip("\n")
        lines = [region, _end_of_output(region, truncated)]
    else:
        lines = ["(no output)"]
    lines.append(f"[{facts.message}]")

    images: list[ImageInfo] = []
    blocks: list[ContentBlock] = []
    over_budget: list[str] = []
    unfit: list[str] = []
    lost: list[str] = []
    missing: list[str] = []
    for figure in facts.figures:
        file = figure.file
        reason = reasons.get(file.path, figure.problem)
        if reason is None:
            data = b64encode(file.content).decode("ascii")
            blocks.append(ImageContent(type="image", data=data, mime_type="image/png"))
        path = _name(file.path)  # a figure's name is ASCII, but its digits are many or few
        entry = f"{path} ({file.size:,} bytes)"
        if figure.kind == "lost":
            lost.append(entry)
        elif figure.kind == "missing":
            missing.append(entry)
        elif reason == _OVER_BUDGET:
            over_budget.append(entry)
        elif reason is not None:
            unfit.append(f"{entry}: {reason}")
        images.append(
            ImageInfo(
                path=path,
                size=file.size,
                width=figure.width,
                height=figure.height,
                returned=reason is None,
                reason=reason,
            )
        )
    total = len(facts.figures)
    if over_budget:
        lines.append(
            f"[{len(over_budget)} of {total} figures not returned: "
            f"{_listing(over_budget, listing_chars)}; a result holds at most "
            f"{settings.max_images} images and {settings.max_image_bytes:,} bytes of PNG, and "
            f"{settings.max_result_bytes:,} bytes in all. Draw fewer or smaller figures "
            "(figsize, dpi) to see them.]"
        )
    if unfit:
        lines.append(
            f"[{len(unfit)} of {total} figures not returned, being unfit to show: "
            f"{_listing(unfit, listing_chars, '; ')}]"
        )
    if lost:
        lines.append(
            f"[{len(lost)} of {total} figures lost, still being saved when the run ended: "
            f"{_listing(lost, listing_chars)}]"
        )
    if missing:
        lines.append(
            f"[{len(missing)} of {total} figures {_NOT_RETURNED} (so says the sandbox's own "
            f"list): {_listing(missing, listing_chars)}]"
        )

    files = [FileInfo(path=_name(f.path), size=f.size) for f in facts.files]
    listed = _fitting([f'"{f.path}" ({f.size:,} bytes)' for f in files], listing_chars)
    if files:
        lines.append(f"[files written: {_listing(listed, listing_chars, total=len(files))}]")
    absent = [FileInfo(path=_name(path), size=size) for path, size in facts.not_returned]
    named = _fitting([f'"{f.path}" ({f.size:,} bytes)' for f in absent], listing_chars)
    if facts.not_returned_count:
        at_least = "" if facts.not_returned_exact else "at least "
        lines.append(
            f"[{at_least}{facts.not_returned_count:,} more files written but not returned by "
            "the evaluator, which returns a limited number and size of files (so says the "
            "sandbox's own list): "
            f"{_listing(named, listing_chars, total=facts.not_returned_count)}]"
        )

    structured = ExecutionResult(
        stdout=shown,
        stdout_truncated=truncated,
        returncode=facts.returncode,
        status=facts.status,
        message=facts.message,
        images=images[:_MAX_LISTED],
        images_unlisted=max(0, len(images) - _MAX_LISTED),
        files=files[: len(listed)],
        files_unlisted=len(files) - len(listed),
        files_not_returned=absent[: len(named)],
        files_not_returned_count=facts.not_returned_count,
    )
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join(lines)), *blocks],
        structured_content=structured.model_dump(mode="json"),
    )


def _wire_size(result: CallToolResult) -> int:
    """Bytes of ``result`` as the SDK sends it, every non-ASCII character escaped (the most)."""
    return len(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True)))


def _choose_images(
    figures: Sequence[_Figure], settings: Settings, room: int
) -> dict[str, str | None]:
    """Which figures the result carries (``None``), in drawing order, and why not the others."""
    reasons: dict[str, str | None] = {}
    count, png_bytes = 0, settings.max_image_bytes
    for figure in figures:
        file = figure.file
        reason = figure.problem
        # A base64 string in an image block: 4 characters per 3 bytes, plus the block's keys.
        block = 4 * -(-file.size // 3) + 80
        if reason is None:
            if (
                not file.complete
                or count >= settings.max_images
                or file.size > png_bytes
                or block > room
            ):
                reason = _OVER_BUDGET
            else:
                reason = _png_defect(file.content)
        if reason is None:
            count, png_bytes, room = count + 1, png_bytes - file.size, room - block
        reasons[file.path] = reason
    return reasons


def _fitting(entries: Sequence[str], chars: int) -> list[str]:
    """The first ``entries`` (at most :data:`_MAX_LISTED`) that fit in ``chars`` characters."""
    fitting: list[str] = []
    for entry in entries[:_MAX_LISTED]:
        chars -= len(entry) + 2
        if chars < 0:
            break
        fitting.append(entry)
    return fitting


def _listing(
    entries: Sequence[str], chars: int, separator: str = ", ", *, total: int | None = None
) -> str:
    """``entries`` joined, as many as fit in ``chars``, then how many of ``total`` are left out."""
    shown = _fitting(entries, chars)
    left_out = (len(entries) if total is None else total) - len(shown)
    text = separator.join(shown)
    if left_out:
        text += f"{separator if shown else ''}{left_out:,} more not listed"
    return text


def _end_of_output(region: str, truncated: bool) -> str:
    """The line that closes the output: worded (numbered) so that the output does not hold it."""
    tag, number = "", 1
    while f"[end of output{tag}" in region:
        number += 1
        tag = f" #{number}"
    return f"[end of output{tag}{'; it was cut in the middle' if truncated else ''}]"


def _clean(text: str) -> str:
    """``text`` as plain lines: no terminal control sequence, no control but tab and newline."""
    text = _ESCAPE_SEQUENCE.sub("", text)
    text = _LINE_BREAK.sub("\n", text)
    text = _INVISIBLE.sub("", text)
    return _SURROGATE.sub("\ufffd", text)


def _name(text: str, limit: int = _NAME_CHARS) -> str:
    """``text`` escaped as inside a JSON string (see :data:`_NOT_PLAIN`), in at most about
    ``limit`` characters: a longer one keeps its start and end around an ellipsis."""
    if len(text) <= limit and len(escaped := _escape(text)) <= limit:
        return escaped
    head = _escaped_within(text, limit // 2)
    tail = _escaped_within(text[::-1], limit // 2)
    return "".join(head) + "…" + "".join(reversed(tail))


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


def _inspect_figure(file: File, max_side: int) -> _Figure:
    """A figure's real size from its IHDR chunk, and what bars it from the result, if anything.

    Checked: the chunk's length (13) and checksum, values the PNG format allows, each side
    against ``max_side``, and the bytes the pixels take once decoded against a ``max_side``
    square of 8-bit RGBA: what a client would have to decode stays bounded.
    """
    data = file.content
    if not file.complete:  # over the image budget, only its head came back: the size it claims
        if len(data) >= 24 and data[12:16] == b"IHDR":
            width, height = struct.unpack_from(">II", data, 16)
            return _Figure(file, width, height)
        return _Figure(file)
    if len(data) < 33:
        return _Figure(file, problem="not a valid PNG: it ends within its header")
    length, kind = struct.unpack_from(">I4s", data, 8)
    if (length, kind) != (13, b"IHDR"):
        return _Figure(file, problem="not a valid PNG: its first chunk is not a 13-byte IHDR")
    if zlib.crc32(data[12:29]) != struct.unpack_from(">I", data, 29)[0]:
        return _Figure(file, problem="not a valid PNG: its header fails its checksum")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack_from(
        ">IIBBBBB", data, 16
    )
    if (
        not (0 < width < 2**31 and 0 < height < 2**31)
        or depth not in _PNG_DEPTHS.get(colour, ())
        or (compression, filtering) != (0, 0)
        or interlace > 1
    ):
        return _Figure(file, problem="not a valid PNG: its header holds impossible values")
    if width > max_side or height > max_side:
        return _Figure(
            file,
            width,
            height,
            f"{width:,} x {height:,} pixels, over the limit of {max_side:,} pixels a side",
        )
    decoded = width * height * -(-_PNG_CHANNELS[colour] * depth // 8)
    if decoded > max_side * max_side * 4:
        return _Figure(
            file,
            width,
            height,
            f"{decoded:,} bytes once decoded, over the limit of {max_side * max_side * 4:,}",
        )
    return _Figure(file, width, height)


def _png_defect(data: bytes) -> str | None:
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
        if kind[:1].isupper() and kind not in _PNG_CRITICAL:
            return "not a valid PNG: it has an unknown critical chunk"
        has_data = has_data or kind == b"IDAT"
        offset = end
        if kind == b"IEND":
            if offset != len(data):
                return "not a valid PNG: bytes follow its end"
            return None if has_data else "not a valid PNG: it holds no image data"
    return "not a valid PNG: it is cut short (no IEND chunk)"


def describe_exit(returncode: int | None, stdout: str, duration: float) -> tuple[Status, str]:
    """Say in words how a run ended: the status line of every result.

    With ``returncode`` ``None``, ``stdout`` is the evaluator's message: it tells whether the
    code ran (its output and files then lost) or not, and an unknown message says neither.
    """
    if returncode is None:
        quoted = f'"{_name(stdout.strip(), _MESSAGE_CHARS)}"'
        if stdout == _INVALID_OUTPUT:
            return "invalid_output", (
                "the code ran, but it wrote bytes that are not UTF-8 straight to a file "
                "descriptor (os.write, a subprocess, C code), so the evaluator discarded all of "
                f"its output and files (its message: {quoted}). Write text through print() or "
                "sys.stdout, or decode bytes first (data.decode('utf-8', 'replace'))"
            )
        if _FILES_NOT_COLLECTED.fullmatch(stdout):
            return "files_not_collected", (
                "the code ran, but the evaluator could not collect the files it wrote, so it "
                f"discarded all of its output and files (its message: {quoted}). Write fewer "
                "files, in fewer directory levels, with UTF-8 names"
            )
        if _NOT_RUN.fullmatch(stdout):
            return "not_run", f"the evaluator could not run the code (its message: {quoted})"
        return "evaluator_error", (
            f"the evaluator answered with an error instead of a result (its message: {quoted}); "
            "whether the code ran is not known"
        )
    if returncode == 0:
        return "ok", "exit code 0: ok"
    if returncode == 137:
        return "killed", (
            f"killed after {duration:.1f} s (exit code 137, SIGKILL): the time limit or the "
            "memory limit was reached"
        )
    if returncode == 143:
        return "output_limit", (
            "stopped (exit code 143, SIGTERM): the output limit was reached, the run was cut short"
        )
    if returncode == 255:
        return "sandbox_error", "exit code 255: the sandbox itself failed to run the code"
    if returncode > 128:
        name = _signal_name(returncode - 128)
        return "signal", f"crashed: killed by signal {name} (exit code {returncode})"
    if returncode == 1 and _looks_like_exception(stdout):
        return "exception", "exit code 1: an uncaught exception (traceback above)"
    return "error", f"exit code {returncode}"


def _looks_like_exception(stdout: str) -> bool:
    tail = stdout.rstrip().rsplit("\n", 1)[-1]
    return "Traceback (most recent call last):" in stdout or bool(
        re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", tail)
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"#{number}"


def _cut_middle(text: str, limit: int) -> tuple[str, bool]:
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


# --- Admission and metrics --------------------------------------------------------------------


class Busy(Exception):
    """No evaluation slot could be had: the wait queue is full or the wait took too long."""


class Admission:
    """At most ``limit`` evaluations at once across every session and transport.

    Up to ``max_waiting`` more wait for a slot, each at most ``max_wait`` seconds; beyond either
    bound the call is refused at once with :class:`Busy`, so no caller hangs.
    """

    def __init__(self, limit: int, max_waiting: int, max_wait: float) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self.max_wait = max_wait
        self.in_flight = 0
        self.waiting = 0
        self._slots = anyio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            await self._wait_for_slot()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._slots.release()

    async def _wait_for_slot(self) -> None:
        if self.waiting >= self.max_waiting:
            raise Busy(f"all {self.limit} slots are running and {self.waiting} calls are waiting")
        self.waiting += 1
        try:
            with anyio.fail_after(self.max_wait):
                await self._slots.acquire()
        except TimeoutError:
            raise Busy(f"no slot came free within {self.max_wait:g} s") from None
        finally:
            self.waiting -= 1


class Metrics:
    """The gateway's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "mcp_tool_calls",
            "execute_python_code calls by outcome (a run's status, or the service failure)",
            ["outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "mcp_tool_call_duration_seconds",
            "Time from the call's arrival to its answer",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80),
            registry=self.registry,
        )
        self.evaluator_errors = Counter(
            "mcp_evaluator_errors",
            "Failures of the evaluation service, by kind",
            ["kind"],
            registry=self.registry,
        )
        in_flight = Gauge(
            "mcp_evaluations_in_flight", "Evaluations running", registry=self.registry
        )
        in_flight.set_function(lambda: admission.in_flight)
        waiting = Gauge(
            "mcp_evaluations_waiting", "Calls waiting for a slot", registry=self.registry
        )
        waiting.set_function(lambda: admission.waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --- The tool ----------------------------------------------------------------------------------


class Gateway:
    """Owns the connection to the evaluation service and implements the tool.

    Use it as an async context manager: entering it starts the built-in evaluator when no
    ``snekbox_url`` is configured and opens the shared HTTP client; leaving it closes both.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admission = Admission(
            settings.in_flight_limit, settings.max_waiting, settings.max_wait
        )
        self.metrics = Metrics(self.admission)
        self._client: SnekboxClient | None = None
        self._builtin: evaluator.Evaluator | None = None
        #: Set on shutdown: calls in flight finish, new ones are turned away.
        self.draining = False
        #: Tool calls between arrival and answer (admission counts only the evaluations).
        self.active_calls = 0
        self._call_ended: anyio.Event | None = None

    async def __aenter__(self) -> Gateway:
        settings = self.settings
        if settings.snekbox_url:
            self._client = SnekboxClient(settings.snekbox_url, timeout=settings.timeout)
        else:
            self._builtin = evaluator.Evaluator(settings.evaluator_config)
            await self._builtin.start()
            self._client = SnekboxClient(
                "http://builtin-evaluator",
                transport=httpx.ASGITransport(evaluator.create_app(self._builtin)),
                timeout=settings.timeout,
            )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._builtin is not None:
            await self._builtin.aclose()

    @property
    def client(self) -> SnekboxClient:
        if self._client is None:
            raise RuntimeError("the gateway is not started: use it as an async context manager")
        return self._client

    def tool_description(self) -> str:
        """The tool's description, written for the model that calls it."""
        if self.settings.snekbox_url:
            python = "Python 3"
            limits = (
                "The evaluation service sets the limits on time, memory, processes and output; "
                "a run that exceeds the time or memory limit is killed (exit code 137)."
            )
        else:
            cfg = self.settings.evaluator_config
            python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
            limits = (
                f"Limits: {cfg.time_limit:g} s wall-clock, {cfg.memory_limit} MiB of memory, "
                f"{cfg.pids_limit} processes and threads, {cfg.output_limit:,} bytes of output; "
                f"the working directory holds {cfg.workdir_size} MiB."
            )
        return (
            f"Run {python} code in a fresh, isolated sandbox and return what it prints.\n\n"
            "- Every call starts from scratch: no variables, imports or files carry over.\n"
            "- Preinstalled: numpy, pandas, matplotlib and the standard library. There is no "
            "network access, so pip install and downloads do not work.\n"
            "- The result is stdout and stderr together, in order (terminal control sequences "
            "removed), then a line [end of output] (numbered, [end of output #2], if the output "
            "holds that text), then the gateway's own lines: the exit status in words, figures "
            "not returned, files written. Print what you want to see: a bare expression is not "
            "echoed. Output must be UTF-8: bytes that are not, written straight to a file "
            "descriptor, lose the whole output.\n"
            "- Figures: every matplotlib figure comes back as a PNG image, in drawing order, with "
            "no extra step: plt.show() or simply leaving the figure open is enough. At most "
            f"{self.settings.max_image_side:,} pixels a side are returned.\n"
            "- Files the code writes in its working directory are listed with their sizes, "
            "their names in double quotes with JSON-style escapes.\n"
            f"- {limits} Output longer than {self.settings.max_output_chars:,} characters is cut "
            "in the middle, keeping its start and end."
        )

    async def execute_python_code(
        self, code: str, ctx: Context[Any, Any]
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Run ``code`` once; service failures become tool errors, user errors do not."""
        started = time.monotonic()
        outcome = "cancelled"  # unless the call gets further
        log: dict[str, Any] = {"code_chars": len(code)}
        self.active_calls += 1
        try:
            if len(code) > self.settings.max_code_chars:
                outcome = "refused"
                raise ToolError(
                    f"The code is {len(code):,} characters long; the limit is "
                    f"{self.settings.max_code_chars:,}. Send less code, or generate the data "
                    "inside the code instead of pasting it."
                )
            result = await self._evaluate_with_progress(code, ctx, started)
            rendered = render_result(
                result, duration=time.monotonic() - started, settings=self.settings
            )
            structured = rendered.structured_content or {}
            outcome = structured.get("status", "ok")
            log.update(
                returncode=result.returncode,
                stdout_chars=len(result.stdout),
                images=sum(isinstance(c, ImageContent) for c in rendered.content),
                files=len(structured.get("files", ())),
            )
            if self.settings.log_code:
                log.update(code=code, stdout=result.stdout)
            return rendered
        except _ServiceFailure as failure:
            outcome = failure.kind
            raise ToolError(failure.message) from failure
        finally:
            self.active_calls -= 1
            if self._call_ended is not None:
                self._call_ended.set()
            duration = time.monotonic() - started
            self.metrics.calls.labels(outcome).inc()
            self.metrics.duration.observe(duration)
            _log_call(ctx, outcome, duration, log)

    async def drained(self) -> None:
        """Return once no tool call is in progress (set ``draining`` first, or it may never)."""
        while self.active_calls:
            self._call_ended = anyio.Event()
            await self._call_ended.wait()

    async def _evaluate_with_progress(
        self, code: str, ctx: Context[Any, Any], started: float
    ) -> EvalResult:
        # A plain task rather than a task group, so the evaluation's errors come back unwrapped.
        progress = asyncio.ensure_future(self._report_progress(ctx, started))
        try:
            return await self._evaluate(code)
        finally:
            progress.cancel()

    async def _evaluate(self, code: str) -> EvalResult:
        if self.draining:
            raise _ServiceFailure(
                "shutting_down",
                "The gateway is shutting down; the code did not run. Retry in a few seconds.",
            )
        try:
            async with self.admission.slot():
                # Only figures' contents come back (bounded); other files: names and sizes.
                wanted = ContentWanted(
                    _FIGURES,
                    self.settings.max_image_bytes + plotting.MANIFEST_MAX_BYTES,
                    _PNG_HEAD_BYTES,
                )
                request = replace(plotting.build_request(code), content_wanted=wanted)
                return await self.client.eval(request)
        except Busy as exc:
            raise _ServiceFailure(
                "busy",
                f"The gateway is busy ({exc}); the code did not run. Retry in a few seconds.",
            ) from exc
        except SnekboxError as exc:
            kind = _ERROR_KINDS.get(type(exc), "evaluator_error")
            self.metrics.evaluator_errors.labels(kind).inc()
            raise _ServiceFailure(kind, _explain(exc)) from exc

    async def _report_progress(self, ctx: Context[Any, Any], started: float) -> None:
        """Tell a client that asked for progress that the call is alive (a no-op otherwise)."""
        if self._builtin is not None:
            total: float | None = self.settings.evaluator_config.time_limit
        else:
            total = None
        while True:
            await anyio.sleep(self.settings.progress_interval)
            elapsed = round(time.monotonic() - started, 1)
            await ctx.report_progress(elapsed, total, f"running for {elapsed:g} s")

    async def readiness(self) -> str | None:
        """``None`` when the evaluation service answers, else why not (safe to show anyone)."""
        try:
            await self.client.ping()
        except EvaluatorUnavailable:
            return "the evaluation service is unreachable"
        except SnekboxError as exc:
            return f"the evaluation service is unhealthy ({type(exc).__name__})"
        return None


class _ServiceFailure(Exception):
    """A call the service could not answer: ``kind`` for metrics, ``message`` for the model."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


#: The files whose contents an evaluation returns (a superset of plotting.FIGURE_PATTERN's
#: names, and the prelude's manifest), and how much of a figure beyond the image budget: a
#: PNG's signature and size.
_FIGURES = ("figure_[0-9][0-9][0-9]*.png", plotting.MANIFEST_NAME)
_PNG_HEAD_BYTES = 24

_ERROR_KINDS: dict[type[SnekboxError], str] = {
    EvaluatorUnavailable: "unavailable",
    EvaluatorTimeout: "timeout",
    EvaluatorRejected: "rejected",
    InvalidResponse: "invalid_response",
}


def _log_call(
    ctx: Context[Any, Any], outcome: str, duration: float, fields: dict[str, Any]
) -> None:
    """One structured line per call; the code and output only when MCP_LOG_CODE asks.

    ``session`` is the SSE or Streamable HTTP session id; sessionless clients (the 2026-07-28
    protocol) have none, and their calls are told apart by ``request``.
    """
    request = ctx.request_context.request if ctx.request_context else None
    transport, session = "memory", None
    if isinstance(request, Request):
        transport = "sse" if request.url.path.startswith("/messages") else "streamable-http"
        session = request.headers.get("mcp-session-id") or request.query_params.get("session_id")
    record = {
        "event": "tool_call",
        "session": session,
        "request": ctx.request_id,
        "transport": transport,
        "outcome": outcome,
        "duration_ms": round(duration * 1000, 1),
        **fields,
    }
    logger.info("%s", json.dumps(record, default=str))


def _explain(exc: SnekboxError) -> str:
    """A tool error the model can act on: what failed, whether the code ran, what to do."""
    if isinstance(exc, EvaluatorUnavailable):
        return (
            f"The Python evaluation service is unreachable ({exc.reason}); the code did not run. "
            "Retry in a few seconds; if this persists, the service is down and needs an operator."
        )
    if isinstance(exc, EvaluatorTimeout):
        return (
            f"The evaluation service did not answer within {exc.timeout:g} s; the result is lost. "
            "Retry, and if the code is slow, make it faster or smaller."
        )
    if isinstance(exc, EvaluatorRejected):
        if exc.status_code == 503:
            return (
                "The evaluation service is busy (every slot is running and the queue is full); "
                "the code did not run. Retry in a few seconds."
            )
        detail = f": {exc.description}" if exc.description else ""
        return (
            f"The evaluation service rejected the request ({exc.status_code} {exc.title}{detail})."
        )
    if isinstance(exc, InvalidResponse):
        return f"The evaluation service answered something that is not a result ({exc}). Retry."
    return f"The evaluation service failed: {exc}"


class StaticTokenVerifier:
    """Accepts exactly one bearer token, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id="bearer", scopes=[])
        return None

    def __repr__(self) -> str:
        return "StaticTokenVerifier(token=<hidden>)"


def create_server(gateway: Gateway) -> MCPServer[Any]:
    """The MCP server with its one tool, bound to ``gateway``; bearer auth when a token is set."""
    settings = gateway.settings
    auth: dict[str, Any] = {}
    if settings.auth_token:
        auth = {
            "token_verifier": StaticTokenVerifier(settings.auth_token),
            # The SDK's resource-server mode: it checks bearer tokens and answers 401 with
            # WWW-Authenticate; the issuer is only advertised, never contacted.
            "auth": AuthSettings(
                issuer_url=f"http://{settings.host}:{settings.port}",  # type: ignore[arg-type]
                resource_server_url=None,
            ),
        }
    server: MCPServer[Any] = MCPServer(
        name="python-mcp-server",
        instructions="Use execute_python_code to run Python: computations, data, charts.",
        **auth,
    )
    server.add_tool(
        gateway.execute_python_code,
        name=TOOL_NAME,
        title="Run Python",
        description=gateway.tool_description(),
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )
    return server


# --- The HTTP app ------------------------------------------------------------------------------


def create_app(settings: Settings | None = None) -> Starlette:
    """The Starlette app serving SSE, Streamable HTTP, ``/healthz``, ``/readyz`` and ``/metrics``.

    The gateway (evaluator, HTTP client) and the Streamable HTTP session manager live in the
    app's lifespan, so the app must be run by a server that runs lifespans (uvicorn does).

    Raises:
        ValueError: the settings are unsafe (see :meth:`Settings.check`).
    """
    settings = settings or Settings.from_env()
    settings.check()
    gateway = Gateway(settings)
    server = create_server(gateway)
    security = settings.transport_security()
    body_limit = settings.max_request_bytes
    sse = server.sse_app(transport_security=security, max_request_body_size=body_limit)
    streamable = server.streamable_http_app(
        transport_security=security,
        max_request_body_size=body_limit,
        session_idle_timeout=settings.session_idle_timeout,
        # A backstop only: the table below keeps the count, closing idle sessions.
        max_sessions=2 * settings.max_sessions,
    )
    sessions = SessionTable(settings.max_sessions, registry=gateway.metrics.registry)
    StreamableSessions.install(server.session_manager, sessions)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        reason = await gateway.readiness()
        if reason is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with gateway, server.session_manager.run():
            yield

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *sse.routes,
        *streamable.routes,
    ]
    middleware = [Middleware(RequestDeadline, timeout=settings.request_timeout)]
    if not settings.auth_token and not settings.allow_unauthenticated:
        middleware.append(Middleware(LoopbackGuard, open_paths=_OPEN_PATHS))
    # Both sub-apps carry the same authentication middleware (none without a token).
    middleware += [*streamable.user_middleware, Middleware(SseSessions, table=sessions)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.gateway = gateway
    return app


#: Routes that need no token and are served to any address: they reveal nothing secret.
_OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


def __getattr__(name: str) -> Any:
    # `uvicorn python_mcp_server:starlette_app` looks the app up; build it then, not at import,
    # so importing this module (tests, tools) reads no environment and starts nothing.
    if name == "starlette_app":
        app = create_app()
        globals()["starlette_app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DrainingServer(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT first lets the calls in flight finish (up to ``grace`` s).

    Meanwhile the gateway turns new calls away with a "shutting down" tool error; then the
    usual graceful shutdown closes the connections (SSE streams included). A second signal
    stops at once.
    """

    def __init__(self, config: uvicorn.Config, gateway: Gateway, grace: float) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.grace = grace
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gateway.draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self.gateway.draining = True
        asyncio.run_coroutine_threadsafe(self._drain(sig), self._loop)

    async def _drain(self, sig: int) -> None:
        gateway = self.gateway
        if gateway.active_calls:
            logger.info("draining %d call(s) before shutdown", gateway.active_calls)
        with anyio.move_on_after(self.grace) as grace:
            await gateway.drained()
            # The last answers are written to their streams just after the tool returns.
            await anyio.sleep(_FLUSH_DELAY)
        if grace.cancelled_caught:
            logger.warning("shutdown grace of %g s is over; stopping anyway", self.grace)
        super().handle_exit(sig, None)


_FLUSH_DELAY = 0.5


def _parse_args(argv: Sequence[str] | None, settings: Settings) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python-mcp-server",
        description="Serve the execute_python_code MCP tool over SSE (/sse) and HTTP (/mcp). "
        "Every setting is also an environment variable (see the README).",
    )
    parser.add_argument("--host", default=settings.host, help="address to bind (MCP_HOST)")
    parser.add_argument("--port", type=int, default=settings.port, help="port (MCP_PORT)")
    parser.add_argument(
        "--snekbox-url",
        default=settings.snekbox_url,
        help="Snekbox to evaluate code with (SNEKBOX_URL); default: the built-in evaluator",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=settings.allow_unauthenticated,
        help="serve a non-loopback address without a token (MCP_ALLOW_UNAUTHENTICATED)",
    )
    parser.add_argument("--log-level", default=settings.log_level, help="(MCP_LOG_LEVEL)")
    args = parser.parse_args(argv)
    return replace(
        settings,
        host=args.host,
        port=args.port,
        snekbox_url=args.snekbox_url or None,
        allow_unauthenticated=args.allow_unauthenticated,
        log_level=args.log_level.lower(),
    )


def _without_query_strings(record: logging.LogRecord) -> bool:
    """Drop query strings from access-log lines: a client may put a secret there."""
    if isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, version, status = record.args
        record.args = (client, method, str(path).split("?", 1)[0], version, status)
    return True


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``python-mcp-server [--host H] [--port P] [--snekbox-url URL]``."""
    try:
        settings = _parse_args(argv, Settings.from_env())
        app = create_app(settings)
    except ValueError as exc:
        sys.exit(f"python-mcp-server: {exc}")
    # force: the mcp SDK configures the root logger when the server is created.
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # httpx logs every request at INFO: one line per call is ours to write.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.access").addFilter(_without_query_strings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # After the drain, what remains are idle streams: close them promptly.
        timeout_graceful_shutdown=2,
        http=guarded_protocol(
            header_timeout=settings.request_timeout, max_connections=settings.max_connections
        ),
    )
    DrainingServer(config, app.state.gateway, settings.shutdown_grace).run()


if __name__ == "__main__":
    main()
