"""What a call's files do to its session's: room checked before the run, kept after it."""

from __future__ import annotations

import plotting
from snekbox_client import EvalResult

from ..choices import Choices
from ..status import inputs_written
from ..uploads import UploadRefused
from .session import CodeSession, SessionView, held_bytes

__all__ = ["check_room", "keep_files", "remember"]


def check_room(session: CodeSession, uploads: dict[str, bytes], limit: int) -> None:
    """Refuse files that would make ``session`` hold more than ``limit`` bytes.

    Raises:
        UploadRefused: they would.
    """
    replaced = sum(map(session.held, uploads))
    added = sum(held_bytes(path, len(content)) for path, content in uploads.items())
    after = session.size - replaced + added
    if uploads and after > limit:
        raise UploadRefused(
            f"With these files the session would hold {after:,} bytes of files (their names "
            f"included); it may hold {limit:,}. Send smaller files, or start a new session."
        )


def keep_files(
    session: CodeSession, uploads: dict[str, bytes], result: EvalResult, limit: int
) -> SessionView:
    """Keep what the run wrote in ``session``, within ``limit`` bytes; say what was kept."""
    if result.ended_by != "packages_refused":  # it did not run: no call of the session
        session.calls += 1
    resumed, session.live = session.live, result.session_ended is False
    # A call that was interrupted or killed in a new interpreter may have stopped before
    # the prelude was kept there.
    session.prelude_loaded = (
        session.live
        and ((resumed and session.prelude_loaded) or result.ended_by == "exit")
        and not plotting.prelude_missing(result)  # a cell sent without it found none
    )
    if inputs_written(result.returncode, result.stdout, result.ended_by):
        for path, content in uploads.items():
            session.keep(path, content)
    returned = plotting.sort_files(result.files)
    if returned.manifest is not None:  # the code's word, about its own session's files
        for path in returned.manifest.gone:
            session.files.pop(path, None)
    kept: dict[str, bool] = {}
    size = session.size  # kept up to date here: summing every file for each would cost n x m
    for file in returned.others:
        after = size - session.held(file.path) + held_bytes(file.path, file.size)
        if file.complete and after <= limit:
            size += session.keep(file.path, file.content)
            kept[file.path] = True
        else:  # an older content is not this file any more
            size -= session.held(file.path)
            session.files.pop(file.path, None)
            kept[file.path] = False
    abandoned, session.abandoned = session.abandoned, False
    return SessionView(
        session.id,
        kept,
        limit,
        interpreter_ended=bool(result.session_ended),
        after_abandoned_call=abandoned,
    )


def remember(session: CodeSession, choices: Choices, result: EvalResult) -> None:
    """The session's Python and packages, once a call ran with them (a refused package is
    not asked for again)."""
    if result.ended_by == "packages_refused":
        return
    session.python = choices.python.executable_path if choices.python else None
    session.packages = choices.packages
