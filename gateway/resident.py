"""Whether the service keeps the gateway's prelude resident, as its runs found.

A run to a service that keeps it carries the call's code alone (``plotting.prelude_files``).
The built-in evaluator says which it keeps (``GET /info``); Snekbox says nothing, and whether
it keeps one is learnt from runs. Until a run finds it there, a run the gateway could not send
again (a cell answered ``running`` and read later) carries the prelude. Found missing, it is
tried again after :data:`RETRY_SECONDS`: the service may have been upgraded behind its URL.
"""

from __future__ import annotations

import logging
import time

__all__ = ["RETRY_SECONDS", "ResidentPrelude"]

logger = logging.getLogger("python_mcp_server")

#: Seconds after which a service found without the resident prelude is tried again.
RETRY_SECONDS = 600.0


class ResidentPrelude:
    """What runs found of the service's resident prelude (see the module's docstring)."""

    def __init__(self) -> None:
        self._found = False
        self._missing_at: float | None = None

    def usable(self, *, resent: bool) -> bool:
        """Whether a run goes without the prelude: one that can be ``resent`` whole if the
        service turns out to keep none, or any run once one found it there."""
        if self._missing_at is not None:
            if time.monotonic() - self._missing_at < RETRY_SECONDS:
                return False
            self._missing_at = None
        return self._found or resent

    def found(self) -> None:
        """A run without the prelude ran the service's."""
        self._found = True

    def missing(self) -> None:
        """A run of no code without the prelude found none: runs carry it for a while."""
        if self._missing_at is None:
            logger.info(
                "the evaluation service keeps no resident prelude of this gateway's (a Snekbox "
                "image not built from docker/snekbox/Dockerfile, another version, an evaluator "
                "on another Python or unsandboxed): runs carry it (about 37 KB) for the next "
                "%.0f s",
                RETRY_SECONDS,
            )
        self._found = False
        self._missing_at = time.monotonic()
