"""Bearer tokens: one (``MCP_AUTH_TOKEN``, or its file) or several clients' named ones.

A name tells a client apart for the fair sharing of sessions and slots, and appears in logs and
metrics; a token never does. Both are read once, when the settings are made.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MIN_TOKEN_CHARS", "SINGLE_TOKEN_CLIENT", "ClientTokens", "TokenFile"]


@dataclass(frozen=True)
class TokenFile:
    """A file holding the bearer token (a Docker secret), read when the settings are made."""

    path: Path
    token: str = field(repr=False)

    @classmethod
    def read(cls, path: Path) -> TokenFile:
        """The token in the file at ``path``, stripped.

        Raises:
            ValueError: it cannot be read, is not text, or is empty.
        """
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"the file cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ValueError("the file is not text") from None
        if not token:
            raise ValueError("the file is empty (it must hold the token)")
        return cls(path, token)


#: A client's name in a tokens file: it appears in logs and metrics.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: The name of the client that sends MCP_AUTH_TOKEN.
SINGLE_TOKEN_CLIENT = "default"
#: The fewest characters a token of a tokens file may have: a guessable one is no token.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class ClientTokens:
    """The bearer tokens of several clients, each with a name (``MCP_AUTH_TOKENS_FILE``).

    The file holds one ``NAME TOKEN`` pair a line; blank lines and lines starting with ``#``
    are skipped. Names are unique, so are tokens. The name tells the clients apart for the
    fair sharing of sessions and appears in logs and metrics; the token never does.
    """

    path: Path
    tokens: tuple[tuple[str, str], ...] = field(repr=False)

    @classmethod
    def read(cls, path: Path) -> ClientTokens:
        """Parse the file at ``path``.

        Raises:
            ValueError: it cannot be read, or a line breaks a rule (its number is named; the
                token is never shown).
        """
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"the file cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ValueError("the file is not text") from None
        tokens: dict[str, str] = {}
        seen: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"line {number} must be 'NAME TOKEN' (two words)")
            name, token = parts
            if not _CLIENT_NAME.fullmatch(name):
                raise ValueError(
                    f"line {number}: a name is 1-64 letters, digits, '.', '_' or '-', "
                    "starting with a letter or digit"
                )
            if name in tokens:
                raise ValueError(f"line {number}: the name {name!r} is given twice")
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(
                    f"line {number}: the token of {name!r} is shorter than "
                    f"{MIN_TOKEN_CHARS} characters"
                )
            if token in seen:
                raise ValueError(f"line {number}: the token of {name!r} is another's too")
            tokens[name] = token
            seen.add(token)
        if not tokens:
            raise ValueError("the file holds no 'NAME TOKEN' line")
        return cls(path, tuple(tokens.items()))
