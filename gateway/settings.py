"""The gateway's settings: each one declared once, typed and validated, read once at start-up.

:class:`Settings` is the declaration, an :class:`~serving.settings.ExplicitSettings` like the
evaluator's own. Every field is the environment variable ``MCP_<NAME>`` (``SNEKBOX_URL`` for
:attr:`Settings.snekbox_url`); those marked :class:`~serving.settings.Flag` are also options
of ``python-mcp-server`` (:mod:`gateway.cli`). ``Settings(...)`` takes values as arguments and
reads nothing; :meth:`Settings.from_env` reads an environment (``os.environ`` at the entry
point) and turns bad values into a :class:`SettingsError` of one line that names, for each, the
variable or flag, the value and what is allowed (see :mod:`serving.settings`). The built-in
evaluator's own settings (``EVALUATOR_*``) are its :class:`~evaluator.EvaluatorConfig`, held in
:attr:`Settings.evaluator_config`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import (
    Field,
    InstanceOf,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import SettingsConfigDict

import plotting
from evaluator import EvaluatorConfig
from serving import KEEP_ALIVE_TIMEOUT, ExplicitSettings, Flag, SettingsError, load

from .edge import is_loopback
from .setting_types import (
    ClientTokensSetting,
    CommaSeparated,
    LogLevel,
    PythonTable,
    ServiceUrl,
    TokenFileSetting,
)
from .tokens import SINGLE_TOKEN_CLIENT

__all__ = ["SNEKBOX_WORKERS", "Settings", "SettingsError"]

#: Snekbox's own worker count (its gunicorn default): what a remote service runs at once.
SNEKBOX_WORKERS = 2


class Settings(ExplicitSettings):
    """Everything the gateway can be told.

    ``snekbox_url`` ``None`` selects the built-in evaluator, configured by ``evaluator_config``.
    ``None`` for ``max_in_flight`` and ``eval_timeout`` means "derived from the evaluator": its
    concurrency and its time limit plus a margin, or Snekbox's for a remote service.
    """

    model_config = SettingsConfigDict(env_prefix="MCP_")
    renamed: ClassVar[Mapping[str, str]] = {
        "MCP_MAX_SESSIONS": "max_transport_sessions",
        "MCP_SESSION_IDLE_TIMEOUT": "transport_session_idle_timeout",
    }

    snekbox_url: Annotated[
        ServiceUrl,
        Field(
            description="a Snekbox-compatible service to evaluate with; unset: the built-in "
            "evaluator, in-process"
        ),
        Flag("Snekbox to evaluate code with", default="the built-in evaluator", metavar="URL"),
    ] = None
    # ``{"3.12": "/path"}``; the built-in evaluator says its own (``GET /info``).
    snekbox_pythons: PythonTable = Field(
        default=None,
        description="with the real Snekbox: `VERSION=/path` pairs, comma-separated, naming the "
        "interpreters of its image a call may choose (`python`)",
    )
    host: Annotated[
        str,
        Field(
            min_length=1,
            description="address to listen on (IPv6 too, e.g. `::`); anything but loopback "
            "needs a token (or `MCP_ALLOW_UNAUTHENTICATED`)",
        ),
        Flag("address to bind"),
    ] = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535, description="port to listen on"), Flag("port")] = (
        18080
    )
    # Before auth_token, whose validation takes the token from the file.
    auth_token_file: TokenFileSetting = Field(
        default=None,
        description="read the token from this file (Docker secrets), which must hold one; "
        "`MCP_AUTH_TOKEN` wins if both are set",
    )
    #: A secret: never shown, in its repr or in a message (serving.settings).
    auth_token: str | None = Field(
        default=None,
        repr=False,
        description="bearer token clients must send (`Authorization: Bearer <token>`) on "
        "`/sse`, `/messages/`, `/mcp`",
    )
    # Parsed by gateway.settings.ClientTokens.
    auth_tokens_file: ClientTokensSetting = Field(
        default=None,
        description="several clients' tokens: a file of `NAME TOKEN` lines (`#` comments and "
        "blank lines skipped; names of letters, digits, `.`, `_`, `-`, unique; tokens of 16 "
        "characters or more, unique). Each client's sessions are its own and it gets its own "
        "share of them; its name, never its token, is in the log (`client`) and the metrics. "
        "With `MCP_AUTH_TOKEN` too, that token is the client `default`",
    )
    # Signs the session handles (gateway.handles).
    session_secret: str | None = Field(
        default=None,
        repr=False,
        min_length=16,
        description="at least 16 characters that sign the session ids: every gateway replica "
        "given the same secret (and the same `SNEKBOX_URL`, built-in evaluator) continues the "
        "others' live sessions; keep it as secret as the token",
        json_schema_extra={"shown_default": "unset (a random one per process)"},
    )
    allow_unauthenticated: Annotated[
        bool,
        Field(
            description="serve a non-loopback address without a token (when a proxy in front "
            "authenticates)"
        ),
        Flag("serve a non-loopback address without a token"),
    ] = False
    allowed_hosts: CommaSeparated = Field(
        default=(),
        description="extra `Host` values accepted (comma-separated, `host:*` for any port): "
        "DNS-rebinding protection",
        json_schema_extra={"shown_default": "loopback"},
    )
    allowed_origins: CommaSeparated = Field(
        default=(),
        description="extra `Origin` values accepted (comma-separated)",
        json_schema_extra={"shown_default": "loopback"},
    )
    max_in_flight: PositiveInt | None = Field(
        default=None,
        description="evaluations at once, across both transports; above the service's own "
        "workers, calls wait in its queue, where `MCP_MAX_WAIT` does not apply",
        json_schema_extra={
            "shown_default": "the evaluator's concurrency (2 with `SNEKBOX_URL`: Snekbox's workers)"
        },
    )
    max_waiting: NonNegativeInt = Field(
        default=32,
        description="calls allowed to wait for a slot (or for their session's running call, or "
        'for a session to make room); one more is told "busy, retry" at once',
    )
    max_wait: NonNegativeFloat = Field(
        default=30.0,
        description="seconds a call may wait for a slot (and, apart, for its session's running "
        'call, or for room for a new session) before it is told "busy, retry"',
    )
    eval_timeout: PositiveFloat | None = Field(
        default=None,
        description="seconds to wait for each answer of the evaluation service (a run read as "
        "it runs, on the built-in evaluator, is answered in pieces: this bounds each, beyond "
        "the wait the gateway asked for)",
        json_schema_extra={"shown_default": "time limit + 10 s (30 with `SNEKBOX_URL`)"},
    )
    # A floor, so that progress notifications cannot flood a client (0 sent 98,180 a second).
    progress_interval: float = Field(
        default=0.5,
        ge=0.05,
        description="seconds between progress notifications to clients that ask for them (at "
        "least 0.05); on the built-in evaluator each carries the newest output of the running "
        "code",
    )
    max_request_bytes: PositiveInt | None = Field(
        default=None,
        description="largest HTTP request body (413 above)",
        json_schema_extra={
            "shown_default": "room for `MCP_MAX_UPLOAD_BYTES` of binary files in base64 (4/3 as "
            "many bytes) and 2 MiB of code: 6 MiB by default"
        },
    )
    max_code_chars: PositiveInt = Field(default=1_000_000, description="longest code accepted")
    max_output_chars: PositiveInt = Field(
        default=20_000, description="output longer than this is cut in the middle"
    )
    max_image_bytes: NonNegativeInt = Field(
        default=512 * 1024,
        description="PNG bytes returned per call, so a result stays under 1 MiB",
    )
    max_images: NonNegativeInt = Field(
        default=16, description="figures returned per call (the rest are listed)"
    )
    log_level: Annotated[
        LogLevel, Field(description="`debug`, `info`, `warning`, `error`"), Flag("log level")
    ] = "info"
    log_code: bool = Field(
        default=False, description="also log each call's code and output (debugging only)"
    )
    shutdown_grace: NonNegativeFloat = Field(
        default=30.0,
        description="on SIGTERM, seconds to let calls in flight finish (new calls are turned away)",
    )
    # gateway.sessions: MCP transport sessions, not code sessions nor live interpreters.
    max_transport_sessions: PositiveInt = Field(
        default=256,
        description="MCP transport sessions (a client's connection state, not a code session) "
        "open at once, both transports together (an SSE session is its open `/sse` stream); a "
        "new one closes the session idle the longest without a call in flight, and is refused "
        "(503) only if every one has a call in flight. Was `MCP_MAX_SESSIONS`, still read for "
        "this release",
    )
    transport_session_idle_timeout: PositiveFloat = Field(
        default=600.0,
        description="seconds a Streamable HTTP transport session may go without a request "
        "before it is closed (its id then answers 404, and the client starts a new session). "
        "Was `MCP_SESSION_IDLE_TIMEOUT`, still read for this release",
    )
    # serving: the headers' deadline in the protocol, the body's in the middleware.
    request_timeout: PositiveFloat = Field(
        default=20.0,
        description="seconds a request's headers may take to arrive (from the connection's "
        "opening, or on a kept-alive connection from their first byte), then as long again for "
        "its body; later: 408, connection closed",
    )
    # python-mcp-server only, as the next: plain uvicorn has its own (see docs/operations.md).
    max_connections: PositiveInt = Field(
        default=512,
        description="connections open at once; one more closes one idle 5 s, or gets a 503",
    )
    keep_alive_timeout: PositiveInt = Field(
        default=KEEP_ALIVE_TIMEOUT,
        description="seconds an idle kept-alive connection stays open (unless closed for a new "
        "one at the cap): past clients' own (httpx 5 s) and a proxy's idle timeout",
    )
    # At least enough for the status and the lists of names.
    max_result_bytes: int = Field(
        default=1024 * 1024,
        ge=16 * 1024,
        description="bytes of one serialized result at most, images included (at least 16384)",
    )
    # The prelude draws within FIGURE_MAX_PIXELS.
    max_image_side: PositiveInt = Field(
        default=plotting.FIGURE_MAX_PIXELS,
        description="pixels a side of a figure returned at most",
    )
    # gateway.backend
    probe_interval: PositiveFloat = Field(
        default=600.0,
        description="seconds between the probes of what the evaluation service offers (its "
        "Python, packages and sessions), which the tool's description says; the description is "
        "made again when an answer changes it",
    )
    # gateway.code_sessions
    max_code_sessions: PositiveInt | None = Field(
        default=None,
        description="code sessions (`session_id`: a working directory's files kept across "
        "calls) open at once; a new one closes the longest idle session of the client holding "
        "the most, never one running a call (its id then answers that it was closed to make "
        "room), and is refused only if every one that could go is running a call. With the "
        "built-in evaluator in-process, at most its live-session cap",
        json_schema_extra={"shown_default": "the in-process evaluator's live-session cap, else 64"},
    )
    max_code_sessions_per_client: PositiveInt | None = Field(
        default=None,
        description="code sessions one client (a token's name; without tokens, an MCP "
        "connection) may hold; its next one closes its own longest idle",
        json_schema_extra={
            "shown_default": "three quarters of `MCP_MAX_CODE_SESSIONS`, rounded up"
        },
    )
    code_session_idle_timeout: PositiveFloat = Field(
        default=900.0,
        description="seconds a code session may go without a call before it ends (its id then "
        "answers that it expired)",
    )
    # Carried into each run.
    max_session_bytes: PositiveInt = Field(
        default=8 * 1024 * 1024,
        description="bytes of files a code session keeps (sent in and written), their names "
        "included; a written file that does not fit is listed as not kept",
    )
    max_upload_files: PositiveInt = Field(
        default=64, description="files one call may send in (`files`)"
    )
    max_upload_bytes: PositiveInt = Field(
        default=3 * 1024 * 1024,
        description="bytes of those files once decoded, in all (the request body is bounded by "
        "`MCP_MAX_REQUEST_BYTES` too)",
    )
    #: Read from the EVALUATOR_* variables by the evaluator's own declaration.
    evaluator_config: InstanceOf[EvaluatorConfig] = Field(default_factory=EvaluatorConfig)

    @classmethod
    def variable(cls, name: str) -> str:
        """``MCP_<NAME>``, but Snekbox's own ``SNEKBOX_URL`` for :attr:`snekbox_url`."""
        return "SNEKBOX_URL" if name == "snekbox_url" else super().variable(name)

    @classmethod
    def variables(cls) -> tuple[str, ...]:
        """Every field but :attr:`evaluator_config`, which its ``EVALUATOR_*`` variables set."""
        return tuple(name for name in cls.model_fields if name != "evaluator_config")

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        flags: Mapping[str, Any] | argparse.Namespace | None = None,
    ) -> Settings:
        """Settings from ``environ`` (empty variables are unset), ``flags`` (setting names to
        the values given on the command line) winning over it.

        Raises:
            SettingsError: every value not allowed, the evaluator's (``EVALUATOR_*``) first.
        """
        try:
            evaluator_config = EvaluatorConfig.from_env(environ)
        except SettingsError as refused:
            try:  # the gateway's own too, so that one start-up names every bad value
                load(cls, environ, flags, evaluator_config=EvaluatorConfig())
            except SettingsError as also:
                raise SettingsError(f"{refused}; {also}") from None
            raise
        return load(cls, environ, flags, evaluator_config=evaluator_config)

    @field_validator("auth_token", mode="after")
    @classmethod
    def _token_or_its_file(cls, token: str | None, info: ValidationInfo) -> str | None:
        token_file = info.data.get("auth_token_file")
        return token if token or token_file is None else token_file.token

    @property
    def client_tokens(self) -> dict[str, str]:
        """Every accepted bearer token and the name of its client (empty: no authentication)."""
        named = dict(self.auth_tokens_file.tokens) if self.auth_tokens_file else {}
        by_token = {token: name for name, token in named.items()}
        if self.auth_token:
            by_token.setdefault(self.auth_token, SINGLE_TOKEN_CLIENT)
        return by_token

    @property
    def authenticated(self) -> bool:
        """Whether clients must send a bearer token."""
        return bool(self.auth_token or self.auth_tokens_file)

    @property
    def request_bytes_limit(self) -> int:
        """The largest request body: the setting, or room for the uploads in base64 and 2 MiB."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return -(-self.max_upload_bytes * 4 // 3) + 2 * 1024 * 1024

    @property
    def backend_workers(self) -> int:
        """Evaluations the evaluation service runs at once (the rest wait in its own queue)."""
        return SNEKBOX_WORKERS if self.snekbox_url else self.evaluator_config.concurrency

    @property
    def in_flight_limit(self) -> int:
        """Evaluations at once, across both transports: by default, the service's workers."""
        return self.max_in_flight if self.max_in_flight is not None else self.backend_workers

    @property
    def timeout(self) -> float:
        """Seconds to wait for one evaluation's answer: a little longer than its time limit."""
        if self.eval_timeout is not None:
            return self.eval_timeout
        return 30.0 if self.snekbox_url else self.evaluator_config.time_limit + 10.0

    @property
    def max_time_limit(self) -> float:
        """The most a call's ``timeout_seconds`` may ask: the built-in evaluator's time limit,
        or, in front of Snekbox (whose own limit applies), the gateway's wait for an answer."""
        return self.timeout if self.snekbox_url else self.evaluator_config.time_limit

    @property
    def url(self) -> str:
        """The gateway's own base URL (an IPv6 address in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def check(self) -> None:
        """Refuse to serve the network without authentication, saying how to fix it.

        Raises:
            ValueError: with the message to show the operator.
        """
        loopback = self.host == "localhost" or is_loopback(self.host)
        if not loopback and not self.authenticated and not self.allow_unauthenticated:
            raise ValueError(
                f"refusing to listen on {self.host} without authentication: anyone who reaches "
                "this address could run code. Set MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE) to a "
                "secret that clients send as 'Authorization: Bearer <token>', or, if a proxy in "
                "front authenticates, opt out with MCP_ALLOW_UNAUTHENTICATED=true "
                "(--allow-unauthenticated)."
            )
