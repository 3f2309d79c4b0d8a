"""Which limits are really in force: the evaluator's own model.

What a run takes and gives back is the ``/eval`` wire format, defined once in
:mod:`snekbox_client` (``EvalRequest``, ``File``, ``EvalResult``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limit"]


@dataclass(frozen=True)
class Limit:
    """One limit, and whether and how this machine enforces it."""

    name: str
    enforced: bool
    how: str
    #: The number a run is held to, where this host may hold it below its setting (processes:
    #: the user's RLIMIT_NPROC below ``EVALUATOR_PIDS_LIMIT``); ``None``: not a number, or not
    #: held.
    value: int | None = None

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.how}"
            if self.enforced
            else f"{self.name}: NOT ENFORCED ({self.how})"
        )
