"""What a service offers beyond Snekbox's API: the built-in evaluator's ``GET /info``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from ._exceptions import InvalidResponse
from ._fields import is_int, is_number

__all__ = ["Python", "ServiceInfo"]


@dataclass(frozen=True)
class Python:
    """An interpreter a service offers: ``executable_path`` runs Python ``version``."""

    version: str
    executable_path: str


#: Interpreters and allowed package names a ``GET /info`` answer may list, and their length.
_MAX_PYTHONS, _MAX_ALLOWED, _MAX_NAME = 32, 1000, 200
_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?[A-Za-z0-9+.]*")
_DIGEST = re.compile(r"[0-9a-f]{32}")
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ServiceInfo:
    """What a service offers beyond Snekbox's API, from the built-in evaluator's ``GET /info``
    (Snekbox has none: :meth:`none`).

    ``max_sessions``: the live sessions one replica holds (0: none, every run is one-shot);
    ``session_idle_timeout``: seconds after which it ends an idle one; ``time_limit``: its
    longest run, in seconds (``None``: not said); ``long_time_limit``: the longest a session's
    cell may run when its caller does not wait for it (:attr:`EvalRequest.wait`; ``None``: such
    cells are not offered, and no output is read before a run's end). ``pythons``: the
    interpreters a request may name in ``executable_path``, the default first (empty: not
    said). ``packages``: whether it installs requested packages, ``"off"``, ``"any"`` or
    ``"allow-list"`` (``None``: not said, as Snekbox: it installs none); ``allowed``: the
    allow-list's names; ``packages_why``: why it installs none, when ``off``.
    """

    max_sessions: int = 0
    session_idle_timeout: float | None = None
    time_limit: float | None = None
    pythons: tuple[Python, ...] = ()
    packages: Literal["off", "any", "allow-list"] | None = None
    allowed: tuple[str, ...] = ()
    packages_why: str | None = None
    #: Seconds one resolution, or one install, of a set may take there (``None``: not said).
    install_timeout: float | None = None
    long_time_limit: float | None = None
    #: The digest (hex) of the gateway's prelude the service keeps resident for its default
    #: interpreter (``plotting.prelude_digest``; ``None``: not said, or none kept).
    resident_prelude: str | None = None

    @classmethod
    def none(cls) -> ServiceInfo:
        """A service that says nothing (Snekbox): one-shot runs, its own limits."""
        return cls()

    def to_json(self) -> dict[str, Any]:
        """The ``GET /info`` answer (the evaluator's side)."""
        body: dict[str, Any] = {
            "sessions": {"max": self.max_sessions, "idle_timeout": self.session_idle_timeout},
            "time_limit": self.time_limit,
            "long_time_limit": self.long_time_limit,
            "pythons": [
                {"version": p.version, "executable_path": p.executable_path} for p in self.pythons
            ],
        }
        if self.resident_prelude is not None:
            body["resident_prelude"] = self.resident_prelude
        if self.packages is not None:
            body["packages"] = {"policy": self.packages, "allowed": list(self.allowed)}
            if self.packages_why is not None:
                body["packages"]["why"] = self.packages_why
            if self.install_timeout is not None:
                body["packages"]["timeout"] = self.install_timeout
        return body

    @classmethod
    def from_json(cls, data: Any) -> ServiceInfo:
        """Parse a decoded ``GET /info`` body, raising :class:`InvalidResponse` when malformed."""
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), dict):
            raise InvalidResponse("'sessions' is missing or not an object")
        sessions = data["sessions"]
        max_sessions, idle, time_limit = (
            sessions.get("max"),
            sessions.get("idle_timeout"),
            data.get("time_limit"),
        )
        if not is_int(max_sessions) or max_sessions < 0:
            raise InvalidResponse("'sessions.max' is not a non-negative integer")
        long_limit = data.get("long_time_limit")
        for name, value in (
            ("sessions.idle_timeout", idle),
            ("time_limit", time_limit),
            ("long_time_limit", long_limit),
        ):
            if value is not None and not (is_number(value) and value > 0):
                raise InvalidResponse(f"'{name}' is not a positive number")
        packages, allowed, why, install_timeout = _packages_from_info(data.get("packages"))
        resident = data.get("resident_prelude")
        if not (isinstance(resident, str) and _DIGEST.fullmatch(resident)):
            resident = None  # optional: another form (a later version's) is none this one knows
        return cls(
            max_sessions,
            None if idle is None else float(idle),
            None if time_limit is None else float(time_limit),
            _pythons_from_info(data.get("pythons", [])),
            packages,
            allowed,
            why,
            install_timeout,
            None if long_limit is None else float(long_limit),
            resident,
        )


def _pythons_from_info(value: Any) -> tuple[Python, ...]:
    if not isinstance(value, list) or len(value) > _MAX_PYTHONS:
        raise InvalidResponse(f"'pythons' is not a list of at most {_MAX_PYTHONS}")
    pythons = []
    for item in value:
        version = item.get("version") if isinstance(item, dict) else None
        path = item.get("executable_path") if isinstance(item, dict) else None
        if not isinstance(version, str) or len(version) > 32 or not _VERSION.fullmatch(version):
            raise InvalidResponse("a 'pythons' entry has no valid 'version'")
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 4096:
            raise InvalidResponse("a 'pythons' entry has no absolute 'executable_path'")
        if not path.isprintable():
            raise InvalidResponse("a 'pythons' entry has an unprintable 'executable_path'")
        pythons.append(Python(version, path))
    return tuple(pythons)


def _packages_from_info(
    value: Any,
) -> tuple[Literal["off", "any", "allow-list"] | None, tuple[str, ...], str | None, float | None]:
    if value is None:
        return None, (), None, None
    policy = value.get("policy") if isinstance(value, dict) else None
    if policy not in ("off", "any", "allow-list"):
        raise InvalidResponse("'packages.policy' is not one of off, any, allow-list")
    allowed = value.get("allowed", [])
    if (
        not isinstance(allowed, list)
        or len(allowed) > _MAX_ALLOWED
        or not all(
            isinstance(n, str) and len(n) <= _MAX_NAME and _PROJECT.fullmatch(n) for n in allowed
        )
    ):
        raise InvalidResponse("'packages.allowed' is not a list of project names")
    why = value.get("why")
    if why is not None and not (isinstance(why, str) and len(why) <= 500 and why.isprintable()):
        raise InvalidResponse("'packages.why' is not a short line of text")
    timeout = value.get("timeout")
    if timeout is not None and not (is_number(timeout) and 0 < timeout <= 86_400):
        raise InvalidResponse("'packages.timeout' is not a number of seconds")
    return policy, tuple(allowed), why, None if timeout is None else float(timeout)
