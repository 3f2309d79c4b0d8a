"""What a call runs with in its session: its Python and packages, and its time limit.

A session keeps the Python its first call ran and every package its calls asked for (see
:func:`~gateway.code_sessions.remember`); the choices of one call (:mod:`gateway.choices`) are
reconciled with them here. The time limit is the call's ``timeout_seconds`` within the service's
maximum, or for a cell read as it runs (``wait_seconds``) the long-run limit.
"""

from __future__ import annotations

from dataclasses import replace

from .choices import MAX_PACKAGES, ChoiceRefused, Choices, choose, script_metadata
from .code_sessions import CodeSession
from .connection import Connection

__all__ = ["call_choices", "time_limit"]


async def call_choices(
    connection: Connection,
    session: CodeSession,
    *,
    python: str | None,
    packages: list[str] | None,
    code: str,
) -> Choices:
    """The Python and packages of a call in ``session``: in a live session, its interpreter's
    Python, and every package its calls asked for.

    Raises:
        ChoiceRefused: they cannot be had here, or the session runs another Python.
    """
    offers = connection.offers()
    current = next((o for o in offers if o.executable_path == session.python), None)
    kept = session.calls > 0  # a session keeps the Python its first call ran
    choices = choose(
        python=python,
        packages=packages,
        script=await script_metadata(code),  # in a worker thread when there is a block
        offers=offers,
        # Turned off, the evaluator refuses them itself: a result, as any other refusal.
        installs=connection.info.packages in ("any", "allow-list", "off"),
        why_no_installs=connection.why_no_installs(),
        prefer=current if session.calls else None,
    )
    chosen = choices.python.executable_path if choices.python is not None else None
    if kept and choices.python is not None and chosen != session.python:
        running = current.version if current is not None else "another version"
        raise ChoiceRefused(
            f"This session runs Python {running}; a session keeps the Python it started "
            "with. Omit session_id to start a new session with another Python."
        )
    if choices.python is None and session.calls:
        chosen = session.python  # unasked: the session's own
    packages_all = tuple(dict.fromkeys((*session.packages, *choices.packages)))
    if len(packages_all) > MAX_PACKAGES:
        raise ChoiceRefused(
            f"This session would have {len(packages_all)} packages; at most {MAX_PACKAGES} "
            "are kept for a session. Start a new session for other packages."
        )
    python_offer = next((o for o in offers if o.executable_path == chosen), None)
    return replace(choices, python=python_offer, packages=packages_all)


def time_limit(
    connection: Connection, asked: float | None, wait_seconds: float | None
) -> tuple[float | None, float | None]:
    """A call's time limit (``None``: the service's own; for a cell read as it runs, with
    ``wait_seconds``, the long-run limit) and, if lowered to the maximum, what was asked."""
    maximum = connection.max_time_limit()
    if asked is None:
        long = wait_seconds is not None and connection.reads_cells
        return (maximum if long else None), None
    if asked > maximum:
        return maximum, asked
    return asked, None
