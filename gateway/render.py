"""What the model sees: one text block, one image per figure returned, and structured content.

The text is the output (cleaned, possibly cut in the middle), a closing line that the output
does not contain, then the gateway's own lines: the exit status in words, figures not returned
and why, files written and files not returned, names quoted. Small text files the session kept
follow the images as embedded resources, as ``resources/read`` would give them, when they are
text that the output's cleaning (:func:`~gateway.text.clean`) leaves as it is: a file holding
what output may not (a carriage return, a bidi override, an invisible tag character) is not
inlined, and a line says so. The structured content holds the same facts under the published
schema (:mod:`gateway.schema`). The serialized whole stays within the budget
(:mod:`gateway.budget`).
"""

from __future__ import annotations

import mimetypes
from base64 import b64encode
from collections.abc import Sequence
from dataclasses import dataclass

from mcp.types import (
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from snekbox_client import EvalResult

from .budget import (
    ENVELOPE_BYTES,
    INLINE_FILE_BYTES,
    LISTING_CHARS,
    OUTPUT_FLOOR,
    OVER_BUDGET,
    Cut,
    choose_images,
    wire_size,
)
from .code_sessions import SessionView, file_uri
from .facts import NOT_RETURNED, Facts
from .schema import ExecutionResult, FileInfo, ImageInfo, WrittenFile
from .settings import Settings
from .text import MAX_LISTED, clean, cut_middle, end_of_output, fitting, listing, quote, size

__all__ = ["RenderLimits", "SessionView", "compose", "mime_type", "render_result"]


def render_result(
    result: EvalResult,
    *,
    duration: float,
    limits: RenderLimits,
    session: SessionView | None = None,
    notes: Sequence[str] = (),
) -> CallToolResult:
    """Turn an evaluation into what the model reads: text, one image per figure, file lists.

    ``notes`` say how the call's arguments and its script block were reconciled.

    The serialized result stays within ``limits.max_result_bytes`` (less room for the
    envelope). Figures are chosen against a result whose output is cut to
    :data:`~gateway.budget.OUTPUT_FLOOR` characters; then the output gets what is left, up to
    ``max_output_chars``. Should that not be enough (output made of characters that take 12
    bytes each once escaped, say), :meth:`~gateway.budget.Cut.smaller` says what gives way, and
    each cut is said in the text.
    """
    facts = Facts.of(result, duration, limits.max_image_side, limits.memory_limit)
    limit = limits.max_result_bytes - ENVELOPE_BYTES
    floor = min(limits.max_output_chars, OUTPUT_FLOOR)
    extra = _Extra(result.installed, result.install_seconds, tuple(notes))
    reasons: dict[str, str | None] = {}
    if facts.figures:  # without any, the result is composed once, as most are
        # Figures are chosen before the inline files, which are the first to give way.
        unchosen = {f.file.path: f.problem or OVER_BUDGET for f in facts.figures}
        bare = compose(facts, limits, Cut(floor, LISTING_CHARS, unchosen, 0), session, extra)
        reasons = choose_images(
            facts.figures,
            max_images=limits.max_images,
            max_image_bytes=limits.max_image_bytes,
            room=limit - wire_size(bare),
        )
    cut: Cut | None = Cut(min(limits.max_output_chars, len(facts.output)), LISTING_CHARS, reasons)
    while cut is not None:
        rendered = compose(facts, limits, cut, session, extra)
        if wire_size(rendered) <= limit:
            return rendered
        cut = cut.smaller(floor)
    return rendered  # a budget smaller than a bare status line: nothing more could give way


@dataclass(frozen=True)
class RenderLimits:
    """The few limits a result is rendered within: its size, its output, its figures, and
    what the result says of the call's time limit and the memory limit."""

    max_result_bytes: int
    max_output_chars: int
    max_images: int
    max_image_bytes: int
    max_image_side: int
    #: The most a call's ``timeout_seconds`` may ask.
    max_time_limit: float
    #: MiB of memory the built-in evaluator enforces; ``None``: a remote service's own.
    memory_limit: int | None

    @classmethod
    def of(cls, settings: Settings) -> RenderLimits:
        """The limits ``settings`` set."""
        return cls(
            max_result_bytes=settings.max_result_bytes,
            max_output_chars=settings.max_output_chars,
            max_images=settings.max_images,
            max_image_bytes=settings.max_image_bytes,
            max_image_side=settings.max_image_side,
            max_time_limit=settings.max_time_limit,
            memory_limit=None if settings.snekbox_url else settings.evaluator_config.memory_limit,
        )


@dataclass(frozen=True)
class _Extra:
    """What a result says besides the run's facts: its packages, and the call's notes."""

    installed: tuple[str, ...] | None = None
    install_seconds: float | None = None
    notes: tuple[str, ...] = ()


def compose(
    facts: Facts,
    limits: RenderLimits,
    cut: Cut,
    session: SessionView | None = None,
    extra: _Extra = _Extra(),
) -> CallToolResult:
    """The result of ``facts``, cut as ``cut`` says."""
    shown, truncated = cut_middle(facts.output, cut.output_chars)
    lines = _head(facts, shown, truncated, extra)
    images, blocks = _figures(facts, limits, cut, lines)
    files = _files(facts, session, cut, lines, blocks)
    if session is not None:
        lines += _session_lines(session, limits)
    structured = ExecutionResult(
        stdout=shown,
        stdout_truncated=truncated,
        returncode=facts.returncode,
        status=facts.status,
        message=facts.message,
        images=images[:MAX_LISTED],
        images_unlisted=max(0, len(images) - MAX_LISTED),
        files=files.written[: files.listed],
        files_unlisted=len(files.written) - files.listed,
        files_not_returned=files.absent[: files.named],
        files_not_returned_count=facts.not_returned_count,
        session_id=session.id if session is not None else None,
        packages=list(extra.installed) if extra.installed is not None else None,
        install_seconds=extra.install_seconds,
        notes=list(extra.notes),
    )
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join(lines)), *blocks],
        structured_content=structured.model_dump(mode="json"),
    )


def _head(facts: Facts, shown: str, truncated: bool, extra: _Extra) -> list[str]:
    """The text's first lines: the output as ``shown``, its closing line, the exit status in
    words, the packages installed and the call's notes."""
    # The output comes first (the README promises output, then the status), so it cannot be
    # fenced from above without moving it; instead a closing line the output does not contain
    # ends it, and only the gateway writes after that line: output that imitates the
    # gateway's lines stays above it, and names below it are quoted.
    if facts.returncode is not None and shown.strip():
        region = shown.rstrip("\n")
        lines = [region, end_of_output(region, truncated)]
    else:
        lines = ["(no output)"]
    lines.append(f"[{facts.message}]")
    if extra.installed is not None:
        took = extra.install_seconds or 0.0
        lines.append(
            f"[packages: {', '.join(extra.installed) or 'none'} (ready in {took:.2f} s, not "
            "counted in the time limit)]"
        )
    lines += [f"[note: {note}]" for note in extra.notes]
    return lines


def _figures(
    facts: Facts, limits: RenderLimits, cut: Cut, lines: list[str]
) -> tuple[list[ImageInfo], list[ContentBlock]]:
    """One image block per figure returned and every figure's entry; a line in ``lines`` for
    each kind of figure not returned (over the budget, unfit, lost, missing)."""
    images: list[ImageInfo] = []
    blocks: list[ContentBlock] = []
    over_budget: list[str] = []
    unfit: list[str] = []
    lost: list[str] = []
    missing: list[str] = []
    for figure in facts.figures:
        file = figure.file
        reason = cut.reasons.get(file.path, figure.problem)
        if reason is None:
            data = b64encode(file.content).decode("ascii")
            blocks.append(ImageContent(type="image", data=data, mime_type="image/png"))
        path = quote(file.path)  # a figure's name is ASCII, but its digits are many or few
        entry = f"{path} ({size(file.size)})"
        if figure.kind == "lost":
            lost.append(entry)
        elif figure.kind == "missing":
            missing.append(entry)
        elif reason == OVER_BUDGET:
            over_budget.append(entry)
        elif reason is not None:
            unfit.append(f"{entry}: {reason}")
        images.append(
            ImageInfo(
                path=path,
                size=file.size,
                width=figure.width,
                height=figure.height,
                returned=reason is None,
                reason=reason,
            )
        )
    total = len(facts.figures)
    chars = cut.listing_chars
    if over_budget:
        lines.append(
            f"[{len(over_budget)} of {total} figures not returned: "
            f"{listing(over_budget, chars)}; a result holds at most "
            f"{limits.max_images} images and {limits.max_image_bytes:,} bytes of PNG, and "
            f"{limits.max_result_bytes:,} bytes in all. Draw fewer or smaller figures "
            "(figsize, dpi) to see them.]"
        )
    if unfit:
        lines.append(
            f"[{len(unfit)} of {total} figures not returned, being unfit to show: "
            f"{listing(unfit, chars, '; ')}]"
        )
    if lost:
        lines.append(
            f"[{len(lost)} of {total} figures lost, still being saved when the run ended: "
            f"{listing(lost, chars)}]"
        )
    if missing:
        lines.append(
            f"[{len(missing)} of {total} figures {NOT_RETURNED} (so says the sandbox's own "
            f"list): {listing(missing, chars)}]"
        )
    return images, blocks


@dataclass(frozen=True)
class _Files:
    """The written files' part of a result: every entry, how many are listed, and the files
    not returned (how many of those are named)."""

    written: list[WrittenFile]
    listed: int
    absent: list[FileInfo]
    named: int


def _files(
    facts: Facts,
    session: SessionView | None,
    cut: Cut,
    lines: list[str],
    blocks: list[ContentBlock],
) -> _Files:
    """The files written: listed in ``lines``, the small clean text ones inlined as resource
    blocks in ``blocks``, those the session did not keep and those not returned said."""
    chars = cut.listing_chars
    kept = session.kept if session is not None else {}
    files = [
        WrittenFile(
            path=quote(f.path),
            size=f.size,
            mime_type=mime_type(f.path),
            uri=file_uri(session.id, f.path) if session and kept.get(f.path) else None,
        )
        for f in facts.files
    ]
    listed = fitting([f'"{f.path}" ({size(f.size)})' for f in files], chars)
    if files:
        lines.append(f"[files written: {listing(listed, chars, total=len(files))}]")
    inline, unclean = _inline_files(facts, files, cut.inline_bytes)
    if inline:
        shown_inline = fitting([f'"{f.path}"' for f in inline], chars)
        lines.append(f"[shown below as resources: {listing(shown_inline, chars)}]")
        blocks += [
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri=f.uri, mime_type=f.mime_type, text=f.text),
            )
            for f in inline
        ]
    if unclean:
        lines.append(
            "[not shown inline, holding characters that output never shows (carriage returns, "
            "bidi controls, invisible or control characters; print a file to see it cleaned, or "
            f"read its uri for its exact bytes): {listing(unclean, chars)}]"
        )
    dropped = [f'"{f.path}"' for f in files if session and f.uri is None]
    if session is not None and dropped:
        lines.append(
            f"[not kept by the gateway, which keeps at most {session.max_bytes:,} bytes of a "
            "session's files, names included (or returned only in part), so without a uri: "
            f"{listing(fitting(dropped, chars), chars)}]"
        )
    absent = [FileInfo(path=quote(path), size=size) for path, size in facts.not_returned]
    named = fitting([f'"{f.path}" ({size(f.size)})' for f in absent], chars)
    if facts.not_returned_count:
        at_least = "" if facts.not_returned_exact else "at least "
        lines.append(
            f"[{at_least}{facts.not_returned_count:,} more files written but {NOT_RETURNED} "
            "(so says the sandbox's own list): "
            f"{listing(named, chars, total=facts.not_returned_count)}]"
        )
    return _Files(files, len(listed), absent, len(named))


def _session_lines(session: SessionView, limits: RenderLimits) -> list[str]:
    """What the result says of its session: its interpreter, a lowered time limit, its id."""
    lines = []
    if session.after_abandoned_call:
        lines.append(
            "[the session's call before this one ended without its answer (cancelled, "
            "timed out or cut off), which ended its interpreter: this call ran in a new "
            "one, with the session's files; the variables and imports of earlier calls are "
            "gone]"
        )
    if session.interpreter_ended:
        lines.append(
            "[the session's interpreter ended with this call: its variables and imports are "
            "lost; its files are kept, and the next call starts a new interpreter with them]"
        )
    if session.time_limit_lowered is not None:
        lines.append(
            f"[timeout_seconds {session.time_limit_lowered:g} is above the maximum, "
            f"{limits.max_time_limit:g} s, which was used instead]"
        )
    lines.append(f'[session_id: "{session.id}" (pass it to continue this session)]')
    return lines


@dataclass(frozen=True)
class _Inline:
    path: str  # quoted, as listed
    uri: str
    mime_type: str
    text: str


def mime_type(path: str) -> str:
    """The MIME type of a session's file, by its name: one for ``files[]``, the inline
    resources and ``resources/read``."""
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def _inline_files(
    facts: Facts, files: list[WrittenFile], room: int
) -> tuple[list[_Inline], list[str]]:
    """The written files shown inline, and the (quoted) names of those that would have been
    but for characters output may not hold.

    Shown: kept by the session (so they have a ``uri``), whole, at most
    :data:`INLINE_FILE_BYTES` each and ``room`` in all, UTF-8, and as the output's cleaning
    leaves them: a file is shown as it is (as ``resources/read`` gives it), or not at all.
    """
    chosen: list[_Inline] = []
    unclean: list[str] = []
    for file, info in zip(facts.files, files, strict=True):
        if info.uri is None or not file.complete or file.size > min(INLINE_FILE_BYTES, room):
            continue
        try:
            text = file.content.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text:
            continue
        if clean(text) != text:
            unclean.append(f'"{info.path}"')
            continue
        chosen.append(_Inline(info.path, info.uri, info.mime_type, text))
        room -= file.size
    return chosen, unclean
