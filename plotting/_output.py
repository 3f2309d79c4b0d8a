"""The support module's output: standard streams that write only UTF-8, and notes on stderr.

Part of the support module (see ``_support.py``): what the prelude's guarded ``sys.stdout`` and
``sys.stderr`` need once the code goes past text (``buffer``, ``detach()``, bytes that are not
UTF-8), and the one-line notes the other parts write on stderr.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.
# ruff: noqa: SIM105

import codecs
import io
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# Set by configure(): the prelude's guarded streams. How many characters or bytes of the output
# had to be replaced.
_streams: "Sequence[io.TextIOWrapper]" = ()
_replaced = 0


def configure(streams: "Sequence[io.TextIOWrapper]") -> None:
    """Called for each run (each cell of a session): its guarded streams, and no replacement
    counted yet (see :func:`finish_streams`)."""
    global _streams, _replaced
    _streams, _replaced = streams, 0


def replace(error: UnicodeError) -> tuple[str | bytes, int]:
    """The guarded streams' error handler: U+FFFD for what is not UTF-8, counted for the note."""
    global _replaced
    if isinstance(error, UnicodeDecodeError):  # bytes that are not UTF-8: one mark per sequence
        _replaced += 1
        return "\ufffd", error.end
    if isinstance(error, UnicodeEncodeError):  # lone surrogates: one mark per character
        _replaced += error.end - error.start
        # Bytes: the UTF-8 encoder takes only ASCII text from an error handler.
        return b"\xef\xbf\xbd" * (error.end - error.start), error.end
    raise error


def finish_streams() -> None:
    """At the end of the run, once the streams are flushed: what ``buffer`` still holds, then
    the note, on stderr, saying once whether anything had to be replaced."""
    for stream in _streams:
        try:
            checked = stream.__dict__.get("_mcp_checked")
            if checked is not None:
                checked.finish()
        except Exception:
            pass
    if _replaced and _streams:
        try:  # after the output (flushed by the prelude)
            _streams[-1].write(
                f"[{_replaced:,} character(s) or byte(s) of the output were not valid UTF-8 "
                "and were replaced with U+FFFD]\n"
            )
            _streams[-1].flush()
        except Exception:
            pass


def buffer(stream: "io.TextIOWrapper") -> "CheckedBytes":
    """The prelude's guarded stream's ``buffer``: a :class:`CheckedBytes` made on first use."""
    checked: CheckedBytes | None = stream.__dict__.get("_mcp_checked")
    if checked is None:
        binary = io.TextIOWrapper.buffer.__get__(stream)  # the stream's own, under the property
        checked = stream.__dict__["_mcp_checked"] = CheckedBytes(stream, binary)
    return checked


def detach(stream: "io.TextIOWrapper") -> "CheckedBytes":
    """The prelude's guarded stream's ``detach()``: its ``buffer``, which stays guarded."""
    checked = buffer(stream)
    io.TextIOWrapper.detach(stream)
    return checked


class CheckedBytes(io.BufferedIOBase):
    """``sys.stdout.buffer`` (or stderr's): bytes that are not UTF-8 are replaced on the way.

    They are decoded with the text stream's error handler (which counts what it replaces for the
    prelude's note) and written, re-encoded, to the real binary stream, after whatever the text
    stream still holds. A character split over two writes waits for its end; :meth:`finish`
    writes out what is left at the end of the run.
    """

    def __init__(
        self, text: "io.TextIOWrapper", target: "io.RawIOBase | io.BufferedIOBase"
    ) -> None:
        super().__init__()
        self._text = text
        self._target = target
        self._decoder = codecs.getincrementaldecoder("utf-8")(text.errors or "strict")

    def write(self, data: "bytes | bytearray | memoryview") -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("write to closed file")
        raw = bytes(data)
        self._write(self._decoder.decode(raw))
        return len(raw)

    def finish(self) -> None:
        self._write(self._decoder.decode(b"", final=True))
        self.flush()

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self._text.flush()
        except ValueError:  # the code detached or closed the text stream
            pass
        view = memoryview(text.encode("utf-8"))
        while view:  # an unbuffered stream may take only part of a write
            written = self._target.write(view)
            view = view[written if written is not None else 0 :]

    def flush(self) -> None:
        if not self.closed:
            self._target.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    @property
    def name(self) -> object:
        return getattr(self._target, "name", None)

    @property
    def mode(self) -> str:
        return "wb"


def note(message: str) -> None:
    """Say ``message`` in one line on stderr, in brackets, after what stdout holds."""
    flush_stdout()
    try:
        sys.stderr.write(f"[{message}]\n")
    except Exception:
        pass
    flush(sys.stderr)


def flush_streams() -> None:
    """Flush the standard streams and the prelude's guarded ones (the code may have rebound
    the first)."""
    for stream in (sys.stdout, sys.stderr, *_streams):
        flush(stream)


def flush_stdout() -> None:
    """Flush ``sys.stdout`` (whatever it is now), ignoring any failure."""
    flush(sys.stdout)


def flush(stream: object) -> None:
    """Flush ``stream``, ignoring any failure (the code may have closed or replaced it)."""
    try:
        stream.flush()  # type: ignore[attr-defined]
    except Exception:
        pass
