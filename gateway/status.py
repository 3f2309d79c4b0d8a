"""How a run ended, in words: the status line of every result, and its one-word ``status``."""

from __future__ import annotations

import re
import signal
from typing import Literal

from snekbox_client import EndedBy

from .text import quote

__all__ = ["Status", "describe_exit", "inputs_written"]

Status = Literal[
    "ok",
    "error",
    "exception",
    "killed",
    "interrupted",
    "running",
    "output_limit",
    "signal",
    "sandbox_error",
    "invalid_output",
    "files_not_collected",
    "not_run",
    "packages_refused",
    "evaluator_error",
]

#: Characters of an evaluator's message shown at most (cut in the middle).
_MESSAGE_CHARS = 300

# The evaluator's messages when it answers returncode null (Snekbox's wording, which the
# built-in evaluator shares): those that mean the code ran but its output and files were lost.
_INVALID_OUTPUT = "UnicodeDecodeError: invalid Unicode in output pipe"
_FILES_NOT_COLLECTED = re.compile(
    r"FileParsingError: .*|TimeoutError: Exceeded time limit while parsing attachments", re.DOTALL
)
_NOT_RUN = re.compile(
    r"\w+: Failed to create file '.*'\.|ValueError: embedded null byte"
    # The built-in evaluator's, when a session's sandbox or interpreter fails to start.
    r"|the session's interpreter could not start: .*",
    re.DOTALL,
)
#: What bwrap says when the kernel refuses it a process (RLIMIT_NPROC) or memory.
_NO_ROOM = "Resource temporarily unavailable"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def describe_exit(
    returncode: int | None,
    stdout: str,
    duration: float,
    ended_by: EndedBy | None = None,
    *,
    memory_limit_mib: int | None = None,
    session_ended: bool | None = None,
) -> tuple[Status, str]:
    """Say in words how a run ended: the status line of every result.

    With ``returncode`` ``None``, ``stdout`` is the evaluator's message: it tells whether the
    code ran (its output and files then lost) or not, and an unknown message says neither.
    ``ended_by`` is the evaluator's word on which limit ended the run; ``None`` (Snekbox never
    says) leaves a 137 worded as either limit. ``memory_limit_mib``, when known, is named in a
    memory kill's message. ``session_ended`` ``False``: a cell of a live session, whose
    interpreter the time limit only interrupted.
    """
    if returncode is None and ended_by == "packages_refused":
        return "packages_refused", f"not run: {quote(stdout.strip(), _MESSAGE_CHARS * 2)}"
    if returncode is None:
        return _describe_message(stdout)
    if ended_by == "interrupted" and session_ended is False:
        return "interrupted", (
            f"interrupted after {duration:.1f} s by interrupt() (KeyboardInterrupt, then exit "
            f"code {returncode}); the session's variables are kept"
        )
    if ended_by == "interrupted":
        return "killed", (
            f"killed after {duration:.1f} s: it did not stop at interrupt()'s "
            "KeyboardInterrupt, so its interpreter was ended; the session's variables are lost"
        )
    if session_ended is False and ended_by == "time_limit":
        return "interrupted", (
            f"interrupted after {duration:.1f} s (KeyboardInterrupt, then exit code "
            f"{returncode}): the time limit was reached; the session's variables are kept"
        )
    if returncode == 0:
        return "ok", "exit code 0: ok"
    if ended_by == "time_limit":
        return "killed", (
            f"killed after {duration:.1f} s (exit code 137, SIGKILL): the time limit was "
            "reached; make the code faster or make it do less"
        )
    if ended_by == "memory_limit":
        size = "" if memory_limit_mib is None else f" ({memory_limit_mib:,} MiB)"
        return "killed", (
            f"killed (exit code 137, SIGKILL): the memory limit{size} was reached; use less "
            "memory, e.g. process the data in chunks or use smaller types"
        )
    if returncode == 137 and ended_by is None:
        return "killed", (
            f"killed after {duration:.1f} s (exit code 137, SIGKILL): the time limit or the "
            "memory limit was reached (this evaluator does not say which); if the code ran for "
            "about its time limit, make it faster or make it do less, otherwise use less memory"
        )
    if returncode == 143 and ended_by in (None, "output_limit"):
        return "output_limit", (
            "stopped (exit code 143, SIGTERM): the output limit was reached, the run was cut short"
        )
    if returncode == 255:
        return "sandbox_error", "exit code 255: the sandbox itself failed to run the code"
    if returncode > 128:
        name = _signal_name(returncode - 128)
        return "signal", f"crashed: killed by signal {name} (exit code {returncode})"
    if returncode == 1 and _last_line(stdout).startswith("MemoryError"):
        size = "" if memory_limit_mib is None else f" ({memory_limit_mib:,} MiB)"
        return "exception", (
            f"exit code 1: an uncaught MemoryError (traceback above): the memory limit{size} "
            "was likely reached; use less memory, e.g. process the data in chunks or use "
            "smaller types"
        )
    if returncode == 1 and _looks_like_exception(stdout):
        return "exception", "exit code 1: an uncaught exception (traceback above)"
    return "error", f"exit code {returncode}"


def inputs_written(returncode: int | None, stdout: str, ended_by: EndedBy | None) -> bool:
    """Whether the evaluator wrote the run's input files: not when it refused its packages
    first, nor when writing one failed (the code then did not run)."""
    if ended_by == "packages_refused":
        return False
    return not (returncode is None and _NOT_RUN.fullmatch(stdout))


def _describe_message(message: str) -> tuple[Status, str]:
    quoted = f'"{quote(message.strip(), _MESSAGE_CHARS)}"'
    if message == _INVALID_OUTPUT:
        return "invalid_output", (
            "the code ran, but it wrote bytes that are not UTF-8 straight to a file "
            "descriptor (os.write, a subprocess, C code), so the evaluator discarded all of "
            f"its output and files (its message: {quoted}). Write text through print() or "
            "sys.stdout, or decode bytes first (data.decode('utf-8', 'replace'))"
        )
    if _FILES_NOT_COLLECTED.fullmatch(message):
        return "files_not_collected", (
            "the code ran, but the evaluator could not collect the files it wrote, so it "
            f"discarded all of its output and files (its message: {quoted}). Write fewer "
            "files, in fewer directory levels, with UTF-8 names"
        )
    if _NOT_RUN.fullmatch(message):
        hint = ""
        if _NO_ROOM in message:
            hint = (
                "; the host refused the sandbox a process: the evaluator's user has too many "
                "running (its own programs count too), so retry in a moment"
            )
        return "not_run", f"the evaluator could not run the code (its message: {quoted}){hint}"
    return "evaluator_error", (
        f"the evaluator answered with an error instead of a result (its message: {quoted}); "
        "whether the code ran is not known"
    )


def _last_line(stdout: str) -> str:
    return stdout.rstrip().rsplit("\n", 1)[-1]


def _looks_like_exception(stdout: str) -> bool:
    tail = _last_line(stdout)
    return "Traceback (most recent call last):" in stdout or bool(_EXCEPTION_LINE.match(tail))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"#{number}"
