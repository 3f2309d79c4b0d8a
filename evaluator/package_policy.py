"""Which package requirements are taken: the operator's policy, a requirement's checks, and
uv's errors read as refusals that name the requirement and why."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from .errors import PackageRefused, Why

__all__ = ["Policy", "check_requirement", "refusal_from_uv"]

#: Characters of uv's own message kept in a refusal.
_MESSAGE_CHARS = 600
_MAX_REQUIREMENT = 200


@dataclass(frozen=True)
class Policy:
    """Which projects may be asked for: none (``off``), any, or those named."""

    allowed: frozenset[str] | None  # None: any
    enabled: bool = True

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``off``, ``any``, or a comma-separated allow-list of project names."""
        value = text.strip()
        if value.lower() == "off":
            return cls(frozenset(), enabled=False)
        if value.lower() == "any":
            return cls(None)
        names = [name.strip() for name in value.split(",") if name.strip()]
        if not names:
            raise ValueError("an empty package allow-list: say 'off' to allow none")
        return cls(frozenset(canonicalize_name(name) for name in names))

    def allows(self, name: str) -> bool:
        return self.enabled and (self.allowed is None or canonicalize_name(name) in self.allowed)

    @property
    def kind(self) -> Literal["off", "any", "allow-list"]:
        """How ``GET /info`` names it."""
        if not self.enabled:
            return "off"
        return "any" if self.allowed is None else "allow-list"


def check_requirement(text: str, policy: Policy, *, trusted: bool = False) -> str:
    """``text`` as a PEP 508 requirement ``policy`` allows (any, when ``trusted``), normalized.

    Raises:
        PackageRefused: it is not one, names a URL, or is not allowed.
    """
    if not text.isprintable() or len(text) > _MAX_REQUIREMENT:
        raise PackageRefused(
            text[:80], "invalid", "not a PEP 508 requirement (too long, or unprintable)"
        )
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise PackageRefused(text, "invalid", f"not a PEP 508 requirement ({exc})") from None
    if requirement.url is not None:
        raise PackageRefused(text, "invalid", "direct URLs are not installed; name a version")
    if not trusted and not policy.allows(requirement.name):
        allowed = (
            "package installs are turned off here"
            if not policy.enabled
            else f"the operator allows only: {', '.join(sorted(policy.allowed or ()))}"
        )
        raise PackageRefused(text, "not allowed", allowed)
    requirement.name = canonicalize_name(requirement.name)
    return str(requirement)


def refusal_from_uv(message: str, wanted: Sequence[str]) -> PackageRefused:
    """What uv's error says, as a refusal naming the requirement it names, if any."""
    text = " ".join(message.split())[:_MESSAGE_CHARS].rstrip(".")
    lowered = text.lower()
    # The requirement uv names: as written (``tinypkg==9.9``), else by its project's name,
    # whole words only (``six`` is not named by ``sixel``); of those named, not one that is
    # part of another (``tinypkg`` of ``tinypkg==9.9``), and the later: a call's own come
    # after its session's.
    written = [r for r in wanted if _names_it(lowered, r.lower())]
    whole = [r for r in written if not any(r != o and r.lower() in o.lower() for o in written)]
    named = (whole[-1] if whole else None) or next(
        (r for r in wanted if _names_it(lowered, canonicalize_name(Requirement(r).name))), None
    )
    if any(s in lowered for s in ("no wheels", "wheels are required", "from source is disabled")):
        why: Why = "no wheel"
    elif any(s in lowered for s in ("not found", "no version", "is available", "are available")):
        why = "not found"
    elif "no solution" in lowered and len(written) > 1:  # two of them at odds
        why = "conflict"
    elif "no solution" in lowered:  # no version of it is what it asks for
        why = "not found"
    else:
        why = "failed"
    return PackageRefused(named, why, text or "uv failed without a message")


def _names_it(text: str, word: str) -> bool:
    return (
        re.search(rf"(?<![a-z0-9._-]){re.escape(word)}(?![a-z0-9_-]|\.[a-z0-9])", text) is not None
    )
