"""The types of the gateway's settings that are read from text: each parses and checks its value.

A value the environment gives as a string (``SNEKBOX_URL``, ``MCP_SNEKBOX_PYTHONS``, a token
file's path, a comma-separated list, a log level) becomes the typed value here, or is refused
with a reason that completes "... is not allowed: " (see :mod:`serving.settings`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator

from serving import comma_separated

from .tokens import ClientTokens, TokenFile

__all__ = [
    "ClientTokensSetting",
    "CommaSeparated",
    "LogLevel",
    "PythonTable",
    "ServiceUrl",
    "TokenFileSetting",
]

_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?")


def _url_with_a_scheme(value: Any) -> Any:
    if value is None or not isinstance(value, str) or not value.strip():
        return None if isinstance(value, str) else value
    url = value.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            "it must be an http:// or https:// URL with a host, e.g. http://snekbox:8060"
        )
    return url


def _version_table(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    table = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        version, _, path = item.partition("=")
        version, path = version.strip(), path.strip()
        if not _VERSION.fullmatch(version) or not path.startswith("/"):
            raise ValueError(
                "it must be comma-separated VERSION=/absolute/path pairs, e.g. "
                "3.12=/usr/local/bin/python3.12"
            )
        table[version] = path
    return table


def _token_file(value: Any) -> Any:
    return TokenFile.read(Path(value)) if isinstance(value, str | Path) else value


def _tokens_file(value: Any) -> Any:
    return ClientTokens.read(Path(value)) if isinstance(value, str | Path) else value


def _lower_case(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


#: An evaluation service's base URL (``None``: the built-in evaluator).
ServiceUrl = Annotated[str | None, BeforeValidator(_url_with_a_scheme)]
#: Snekbox's interpreters a call may choose, ``{"3.12": "/path"}`` from ``3.12=/path,...``.
PythonTable = Annotated[dict[str, str] | None, BeforeValidator(_version_table)]
#: A file holding one bearer token, read when the settings are made.
TokenFileSetting = Annotated[TokenFile | None, BeforeValidator(_token_file)]
#: A file of several clients' named tokens, read when the settings are made.
ClientTokensSetting = Annotated[ClientTokens | None, BeforeValidator(_tokens_file)]
#: A comma-separated list, stripped, empty items dropped.
CommaSeparated = Annotated[tuple[str, ...], BeforeValidator(comma_separated)]
#: The log level, in any case.
LogLevel = Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower_case)]
