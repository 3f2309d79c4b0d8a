"""Whether the service keeps the gateway's prelude resident, as its runs found.

A run to a service that keeps it carries the call's code alone (``plotting.prelude_files``).
A run the gateway could not send again whole (a cell answered ``running`` and read later: the
built-in evaluator's) goes so only on the service's word (``GET /info``), and never again once a
run found it missing. Snekbox says nothing and reads no cell later: whether it keeps one is
learnt from runs. Found missing, it is tried again after :data:`RETRY_SECONDS` (the service may
have been upgraded behind its URL), for runs that can be sent again.
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
        self._ever_missing = False
        self._missing_at: float | None = None

    def usable(self, *, resent: bool, said: bool = False) -> bool:
        """Whether a run goes without the prelude: one that can be ``resent`` whole if the
        service turns out to keep none; any run on the service's word (``said``) until one
        found it missing."""
        if self._missing_at is not None:
            if time.monotonic() - self._missing_at < RETRY_SECONDS:
                return False
            self._missing_at = None
        if said:
            return resent or not self._ever_missing
        return resent

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
        self._ever_missing = True
        self._missing_at = time.monotonic()
