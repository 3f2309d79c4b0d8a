"""What a run takes and gives back, and which limits are really in force."""

from __future__ import annotations

from dataclasses import dataclass

from snekbox_client import ContentWanted

__all__ = ["EvalRequest", "EvalResult", "FileAttachment", "Limit"]


@dataclass(frozen=True)
class FileAttachment:
    """A file of the working directory; ``path`` is relative to it."""

    path: str
    content: bytes
    # content_wanted: the file's size, more than len(content) when the content was left out
    # (see snekbox_client.ContentWanted); -1 means len(content).
    size: int = -1

    def __post_init__(self) -> None:
        if self.size < 0:
            object.__setattr__(self, "size", len(self.content))


@dataclass(frozen=True)
class EvalRequest:
    """One run: the interpreter's arguments, as Snekbox builds them from ``input`` and ``args``.

    ``executable_path`` selects another interpreter visible in the sandbox (``None``: the
    configured one). Files are written into the working directory before the run.
    ``content_wanted``: which output files' contents to return (``None``: all, as Snekbox).
    """

    args: tuple[str, ...]
    files: tuple[FileAttachment, ...] = ()
    executable_path: str | None = None
    content_wanted: ContentWanted | None = None  # content_wanted


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one run.

    ``returncode`` is the exit status (0 ok, 1 uncaught exception, 137 killed at the time or
    memory limit, 143 output limit, 128+N killed by signal N, 255 the sandbox failed), or
    ``None`` when the evaluator could not produce a result; ``stdout`` then says why.
    """

    stdout: str
    returncode: int | None
    files: tuple[FileAttachment, ...] = ()


@dataclass(frozen=True)
class Limit:
    """One limit, and whether and how this machine enforces it."""

    name: str
    enforced: bool
    how: str

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.how}"
            if self.enforced
            else f"{self.name}: NOT ENFORCED ({self.how})"
        )
