"""The gateway's settings: each one declared once, typed and validated, read once at start-up.

:class:`Settings` is the declaration. Every field is the environment variable ``MCP_<NAME>``
(``SNEKBOX_URL`` for :attr:`Settings.snekbox_url`); those marked :class:`Flag` are also options
of ``python-mcp-server`` (:mod:`gateway.cli`). ``Settings(...)`` takes values as arguments and
reads nothing; :meth:`Settings.from_env` reads an environment (``os.environ`` at the entry
point) and turns a bad value into a :class:`SettingsError` of one line that names the variable,
the value and what is allowed. The built-in evaluator's own settings (``EVALUATOR_*``) are its
:class:`~evaluator.EvaluatorConfig`, held in :attr:`Settings.evaluator_config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecuritySettings
from pydantic import (
    AliasChoices,
    Field,
    InstanceOf,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

import plotting
from evaluator import EvaluatorConfig

from .edge import is_loopback

__all__ = [
    "SNEKBOX_WORKERS",
    "Flag",
    "LogLevel",
    "Settings",
    "SettingsError",
    "TokenFile",
    "environment_variable",
]

LogLevel = Literal["debug", "info", "warning", "error"]

#: Snekbox's own worker count (its gunicorn default): what a remote service runs at once.
SNEKBOX_WORKERS = 2
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: Settings whose value is never repeated in a message.
_SECRETS = frozenset({"auth_token"})


@dataclass(frozen=True)
class Flag:
    """Marks a setting that ``python-mcp-server`` also takes as ``--name`` (a flag wins)."""


@dataclass(frozen=True)
class TokenFile:
    """A file holding the bearer token (a Docker secret), read when the settings are made."""

    path: Path
    token: str = field(repr=False)


class SettingsError(ValueError):
    """A setting has a value that is not allowed; the message is one line for the operator."""


def environment_variable(name: str) -> str:
    """The environment variable of the setting ``name``."""
    return "SNEKBOX_URL" if name == "snekbox_url" else f"MCP_{name.upper()}"


class Settings(BaseSettings):
    """Everything the gateway can be told.

    ``snekbox_url`` ``None`` selects the built-in evaluator, configured by ``evaluator_config``.
    ``None`` for ``max_in_flight`` and ``eval_timeout`` means "derived from the evaluator": its
    concurrency and its time limit plus a margin, or Snekbox's for a remote service.
    """

    model_config = SettingsConfigDict(
        env_prefix="MCP_", frozen=True, extra="forbid", allow_inf_nan=False
    )

    snekbox_url: Annotated[str | None, Flag()] = Field(
        default=None,
        validation_alias=AliasChoices("snekbox_url", "SNEKBOX_URL"),
        description="Snekbox to evaluate code with; default: the built-in evaluator",
    )
    host: Annotated[str, Flag()] = Field(
        default="127.0.0.1", min_length=1, description="address to bind"
    )
    port: Annotated[int, Flag()] = Field(default=18080, ge=1, le=65535, description="port")
    # Before auth_token, whose validation takes the token from the file.
    auth_token_file: TokenFile | None = None
    auth_token: str | None = Field(default=None, repr=False, validate_default=True)
    allow_unauthenticated: Annotated[bool, Flag()] = Field(
        default=False, description="serve a non-loopback address without a token"
    )
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = ()
    max_in_flight: PositiveInt | None = None
    max_waiting: NonNegativeInt = 32
    max_wait: NonNegativeFloat = 30.0
    eval_timeout: PositiveFloat | None = None
    #: A floor, so that progress notifications cannot flood a client (0 sent 98,180 a second).
    progress_interval: float = Field(default=2.0, ge=0.1)
    max_request_bytes: PositiveInt = 4 * 1024 * 1024
    max_code_chars: PositiveInt = 1_000_000
    max_output_chars: PositiveInt = 20_000
    max_image_bytes: NonNegativeInt = 512 * 1024
    max_images: NonNegativeInt = 16
    log_level: Annotated[LogLevel, Flag()] = Field(default="info", description="log level")
    log_code: bool = False
    shutdown_grace: NonNegativeFloat = 30.0
    #: Sessions open at once, both transports; a new one closes the longest idle (gateway.sessions).
    max_sessions: PositiveInt = 256
    #: Seconds a Streamable HTTP session may go without a request before it is closed.
    session_idle_timeout: PositiveFloat = 600.0
    #: Seconds a request's headers, then its body, may take to arrive (gateway.serving, .edge).
    request_timeout: PositiveFloat = 20.0
    #: Connections open at once; one more is answered 503 (python-mcp-server only).
    max_connections: PositiveInt = 512
    #: Bytes of one serialized tool result at most, images included (MCP clients accept 1 MiB);
    #: at least enough for the status and the lists of names.
    max_result_bytes: int = Field(default=1024 * 1024, ge=16 * 1024)
    #: Pixels a side of a figure returned at most (the prelude draws within FIGURE_MAX_PIXELS).
    max_image_side: PositiveInt = plotting.FIGURE_MAX_PIXELS
    #: Read from the EVALUATOR_* variables by the evaluator's own declaration.
    evaluator_config: InstanceOf[EvaluatorConfig] = Field(default_factory=EvaluatorConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the arguments: the environment is read by :meth:`from_env`, at the entry point."""
        return (init_settings,)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, *, flags: Mapping[str, Any] | None = None
    ) -> Settings:
        """Settings from ``environ`` (empty variables are unset), ``flags`` winning over it.

        ``flags`` maps setting names to the values given on the command line.

        Raises:
            SettingsError: a value that is not allowed, named in one line.
            ValueError: an ``EVALUATOR_*`` value the evaluator refuses.
        """
        flags = dict(flags or {})
        evaluator_config = EvaluatorConfig.from_env(environ)
        values = {**_Environment(cls, environ)(), **flags}
        try:
            return cls(**values, evaluator_config=evaluator_config)
        except ValidationError as exc:
            raise SettingsError(_one_line(exc, flags)) from None

    @field_validator("snekbox_url", mode="before")
    @classmethod
    def _url_with_a_scheme(cls, value: Any) -> Any:
        if value is None or not isinstance(value, str) or not value.strip():
            return None if isinstance(value, str) else value
        url = value.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "it must be an http:// or https:// URL with a host, e.g. http://snekbox:8060"
            )
        return url

    @field_validator("auth_token_file", mode="before")
    @classmethod
    def _read_token_file(cls, value: Any) -> Any:
        if not isinstance(value, str | Path):
            return value
        path = Path(value)
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"the file cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ValueError("the file is not text") from None
        if not token:
            raise ValueError("the file is empty (it must hold the token)")
        return TokenFile(path, token)

    @field_validator("auth_token", mode="after")
    @classmethod
    def _token_or_its_file(cls, token: str | None, info: ValidationInfo) -> str | None:
        token_file = info.data.get("auth_token_file")
        return token if token or token_file is None else token_file.token

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

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
        if not loopback and not self.auth_token and not self.allow_unauthenticated:
            raise ValueError(
                f"refusing to listen on {self.host} without authentication: anyone who reaches "
                "this address could run code. Set MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE) to a "
                "secret that clients send as 'Authorization: Bearer <token>', or, if a proxy in "
                "front authenticates, opt out with MCP_ALLOW_UNAUTHENTICATED=true "
                "(--allow-unauthenticated)."
            )

    def transport_security(self) -> TransportSecuritySettings:
        """DNS-rebinding protection: loopback Hosts and Origins plus the configured extras."""
        hosts = [f"{h}:*" for h in _LOOPBACK_HOSTS] + list(self.allowed_hosts)
        origins = [f"http://{h}:*" for h in _LOOPBACK_HOSTS] + list(self.allowed_origins)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )


class _Environment(EnvSettingsSource):
    """pydantic-settings' reading of environment variables, from a mapping given to it.

    Values are stripped, and an empty one counts as unset (an unset ``SNEKBOX_URL=`` in a
    compose file means the built-in evaluator).
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ  # before super(), which loads the variables
        super().__init__(settings_cls, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The hook pydantic-settings' own .env source overrides to read another mapping.
        stripped = {name.lower(): value.strip() for name, value in self._environ.items()}
        return {name: value for name, value in stripped.items() if value}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name == "evaluator_config":  # the EVALUATOR_* variables, read by its own class
            return None, field_name, False
        return super().get_field_value(field, field_name)


def _one_line(error: ValidationError, flags: Mapping[str, Any]) -> str:
    """``VARIABLE='value' is not valid: what is allowed``, for each bad value, in one line."""
    problems = []
    for detail in error.errors(include_url=False):
        name = str(detail["loc"][0]) if detail["loc"] else ""
        if name in flags:
            where = f"--{name.replace('_', '-')}"
        else:
            where = environment_variable(name) if name in Settings.model_fields else name
        shown = "(hidden)" if name in _SECRETS else repr(detail["input"])
        allowed = detail["msg"].removeprefix("Value error, ")
        problems.append(f"{where}={shown} is not valid: {allowed[:1].lower()}{allowed[1:]}")
    return "; ".join(problems)
