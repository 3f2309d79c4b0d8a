"""What an evaluation's answer says, cleaned and checked, before anything is cut to size.

Everything in the answer was written by the sandboxed code: its output, the names, sizes and
contents of its files, its figures, even the manifest the prelude leaves. :meth:`Facts.of` reads
it as hostile: output cleaned, figures' headers checked, the manifest only ever adding names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import plotting
from snekbox_client import EvalResult, File

from .png import check_header
from .status import Status, describe_exit
from .text import clean

__all__ = ["LOST", "NOT_RETURNED", "Facts", "Figure"]

#: The status line of a cell that went without the prelude to an interpreter that had none, read
#: only once the call that sent it had ended (so it could not be sent again).
_PRELUDE_LOST = (
    "not run: the session's interpreter no longer had the gateway's prelude (its code removed "
    "it); call again: the next call brings it"
)

#: Why a figure is not in the result: the run ended while it was saved; the evaluator kept it.
LOST = "lost: the run ended while it was being saved"
NOT_RETURNED = (
    "not returned by the evaluator, which returns a limited number and size of files (and none "
    "over 100 folders deep, named with bytes that are not UTF-8, or changed as it read them)"
)


@dataclass(frozen=True)
class Figure:
    """A figure the run drew: its real size, and what bars it from the result.

    ``kind``: ``"figure"`` returned by the evaluator, ``"lost"`` still being saved when the run
    ended, ``"missing"`` named by the manifest but not returned.
    """

    file: File
    width: int | None = None
    height: int | None = None
    problem: str | None = None
    kind: Literal["figure", "lost", "missing"] = "figure"

    @classmethod
    def returned(cls, file: File, max_side: int) -> Figure:
        """A figure the evaluator returned, its header read (:func:`gateway.png.check_header`)."""
        header = check_header(file.content, max_side, complete=file.complete)
        return cls(file, header.width, header.height, header.problem)


@dataclass(frozen=True)
class Facts:
    """What a result says: output, exit status, figures in drawing order, the other files."""

    output: str
    returncode: int | None
    status: Status
    message: str
    figures: list[Figure]
    files: list[File]
    #: Files the manifest names that the evaluator did not return: (name, size).
    not_returned: list[tuple[str, int]]
    not_returned_count: int
    not_returned_exact: bool

    @classmethod
    def of(
        cls,
        result: EvalResult,
        duration: float,
        max_image_side: int,
        memory_limit_mib: int | None = None,
    ) -> Facts:
        output = clean(result.stdout)
        status, message = describe_exit(
            result.returncode,
            output,
            duration,
            result.ended_by,
            memory_limit_mib=memory_limit_mib,
            session_ended=result.session_ended,
        )
        if plotting.prelude_missing(result):  # the first file's answer, read too late to resend
            status, message = "not_run", _PRELUDE_LOST
        files = plotting.sort_files(result.files)
        figures = [Figure.returned(f, max_image_side) for f in files.figures]
        figures += [Figure(f, problem=LOST, kind="lost") for f in files.lost_figures]
        not_returned: list[tuple[str, int]] = []
        count, exact = 0, True
        if files.manifest is not None:
            returned = {f.path for f in result.files}
            listed = {path for path, _ in files.manifest.files}
            for path, size in files.manifest.files:
                if path in returned:
                    continue
                if plotting.is_figure(path):
                    missing = File(path, b"", size)
                    figures.append(Figure(missing, problem=NOT_RETURNED, kind="missing"))
                else:
                    not_returned.append((path, size))
            # Of the files the manifest counts but does not name, those returned are among the
            # returned files it does not name.
            unnamed = files.manifest.total - len(files.manifest.files)
            returned_unnamed = len(returned - listed - {plotting.MANIFEST_NAME})
            count = len(not_returned) + max(0, unnamed - returned_unnamed)
            exact = files.manifest.complete
        figures.sort(key=lambda f: plotting.figure_number(f.file.path))
        return cls(
            output,
            result.returncode,
            status,
            message,
            figures,
            files.others,
            not_returned,
            count,
            exact,
        )
