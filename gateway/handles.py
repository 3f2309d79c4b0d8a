"""Session handles: the ``session_id`` a client is given, which carries where the session lives.

A handle is ``<name>.<replica>.<tag>``: ``name`` is 128 random bits (the session's name in the
evaluator, too), ``replica`` the address of the evaluator replica holding its interpreter,
sealed (XORed with a keystream derived from the secret and the name, so that clients do not
learn the service's internal addresses), and ``tag`` an HMAC-SHA256 of both and of the client
that owns the session. Any gateway holding the same secret (``MCP_SESSION_SECRET``) can
continue a session another one started: it verifies the handle for the calling client, and
sends the call to that replica. Without a configured secret, each gateway makes its own at
start, so its handles mean nothing to another gateway or after a restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

__all__ = ["Handle", "SessionHandles"]

#: Bytes of the tag kept: 128 bits.
_TAG_BYTES = 16


@dataclass(frozen=True)
class Handle:
    """A verified handle: the session's name in the evaluator and where it lives."""

    text: str
    name: str
    replica: str | None


class SessionHandles:
    """Issues and verifies handles with one secret (random when none is given)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._key = (
            hashlib.sha256(b"python-mcp-server session handle\0" + secret).digest()
            if secret
            else secrets.token_bytes(32)
        )

    def issue(self, owner: str | None, replica: str | None, name: str | None = None) -> Handle:
        """A handle for ``owner`` (``None``: no authentication) of the session ``name`` (a new
        one: 128 random bits) on ``replica``."""
        name = name or secrets.token_urlsafe(16)
        sealed = _b64(self._seal(name, ipaddress.ip_address(replica).packed)) if replica else ""
        return Handle(f"{name}.{sealed}.{self._tag(name, sealed, owner)}", name, replica)

    def verify(self, text: str, owner: str | None) -> Handle | None:
        """The handle ``text`` if this secret issued it to ``owner``, else ``None``."""
        parts = text.split(".")
        if len(parts) != 3 or len(text) > 128 or not text.isascii():  # every handle is
            return None
        name, sealed, tag = parts
        # As bytes: compare_digest refuses str with non-ASCII characters, which a client may send.
        if not hmac.compare_digest(tag.encode(), self._tag(name, sealed, owner).encode()):
            return None
        replica = None
        if sealed:
            try:
                packed = self._seal(name, _unb64(sealed))
                replica = str(ipaddress.ip_address(packed))
            except (binascii.Error, ValueError):  # only if the secret issued garbage: never
                return None
        return Handle(text, name, replica)

    def _seal(self, name: str, data: bytes) -> bytes:
        stream = hmac.digest(self._key, b"replica\0" + name.encode(), "sha256")
        return bytes(a ^ b for a, b in zip(data, stream, strict=False))

    def _tag(self, name: str, sealed: str, owner: str | None) -> str:
        message = "\0".join(("tag", name, sealed, owner or "")).encode()
        return _b64(hmac.digest(self._key, message, "sha256")[:_TAG_BYTES])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
