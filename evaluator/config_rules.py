"""What :class:`~evaluator.config.EvaluatorConfig` checks and derives, apart from its declaration.

The declaration (:mod:`.config`: each setting, its bounds, its description, its flag) is what an
operator reads; this base class holds the checks that span a setting's own bounds (a consent
phrase, a uid range that depends on the concurrency, module names) and the values derived from
several settings (the request body bound, the live session cap, the wait queue).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

from pydantic import ValidationInfo, field_validator

from serving import ExplicitSettings, comma_separated, load

from .cgroups import own_memory_limit

__all__ = ["SHARED_UID_RANGE", "UNSANDBOXED_CONSENT", "ConfigRules", "MiB"]

MiB = 1024 * 1024
_MAX_UID = 2**31 - 1

#: The value ``EVALUATOR_UNSANDBOXED`` must have to run code without a sandbox.
UNSANDBOXED_CONSENT = "i-understand-this-runs-code-unsandboxed"


class ConfigRules(ExplicitSettings):
    """The validators and derived values of the evaluator's settings (declared by the subclass,
    :class:`~evaluator.config.EvaluatorConfig`)."""

    if TYPE_CHECKING:  # declared, with their bounds, by EvaluatorConfig
        concurrency: int
        max_queue: int | None
        memory_limit: int
        workdir_size: int
        max_sessions: int | None
        max_request_bytes: int | None

    @field_validator("pythons", "python_packages", mode="before", check_fields=False)
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return comma_separated(value)

    @field_validator("packages", check_fields=False)
    @classmethod
    def _package_policy(cls, value: str) -> str:
        from .packages import Policy

        Policy.parse(value)
        return value

    @field_validator("unsandboxed", mode="before", check_fields=False)
    @classmethod
    def _consent(cls, value: Any) -> Any:
        # From the environment or a flag it is a string: only the exact consent turns it on.
        if isinstance(value, str):
            if value != UNSANDBOXED_CONSENT:
                raise ValueError(f"it must be exactly {UNSANDBOXED_CONSENT}, or unset")
            return True
        return value

    @field_validator("sandbox_uid", check_fields=False)
    @classmethod
    def _uid_range(cls, value: int, info: ValidationInfo) -> int:
        needed = _sandbox_uids(info.data.get("concurrency", 1))
        if not 1000 <= value <= _MAX_UID - needed:
            raise ValueError(
                f"it must be an integer from 1000 that leaves {needed} uids below 2**31 "
                "(the range the services of a host share)"
            )
        return value

    @field_validator("preimport", mode="before", check_fields=False)
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, list | tuple):
            return value
        names = tuple(str(name).strip() for name in names if str(name).strip())
        if not all(all(part.isidentifier() for part in name.split(".")) for name in names):
            raise ValueError(
                "it must be comma-separated module names (e.g. numpy,pandas), or empty"
            )
        return names

    @field_validator("cgroup_name", check_fields=False)
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not value or "/" in value or value.startswith("."):
            raise ValueError("it must be a plain name: not empty, no '/', not starting with '.'")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """A config from the ``EVALUATOR_*`` variables of ``environ``; unset or empty ones keep
        their defaults.

        Raises:
            SettingsError: a value is not allowed; its one-line message names the variable,
                the value and what is allowed.
        """
        return load(cls, environ)

    @property
    def sandbox_uids(self) -> int:
        """The uids from :attr:`sandbox_uid` that the root services of this host share."""
        return _sandbox_uids(self.concurrency)

    @property
    def request_bytes_limit(self) -> int:
        """The largest request body, in bytes."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return -(-self.workdir_size * MiB * 4 // 3) + 4 * MiB

    @property
    def session_limit(self) -> int:
        """Live sessions at once, each counted at :attr:`memory_limit` (as a memory cgroup
        enforces it; without one, the evaluator's ``session_limit`` counts more)."""
        return self.sessions_within(self.memory_limit * MiB)

    def sessions_within(self, session_bytes: int) -> int:
        """Live sessions at once: :attr:`max_sessions`, or as many as half the memory holds
        (the machine's, or the service's own cgroup's when less: a container's ``mem_limit``)
        at ``session_bytes`` each; at least one."""
        if self.max_sessions is not None:
            return self.max_sessions
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        total = min(total, own_memory_limit() or total)
        return max(1, total // 2 // session_bytes)

    @property
    def queue_limit(self) -> int:
        """How many runs may wait for a slot."""
        return 4 * self.concurrency if self.max_queue is None else self.max_queue


#: The uids every root service on a host shares from the same EVALUATOR_SANDBOX_UID, each
#: claiming the ones its live sandboxes use (see users.py): room for many services (tests,
#: replicas on one host), each with ready, warm, running and retiring sandboxes.
SHARED_UID_RANGE = 65536


def _sandbox_uids(concurrency: int) -> int:
    return max(SHARED_UID_RANGE, 4 * concurrency + 16)
