"""What the prelude needs only sometimes: tracebacks, import hooks, figures, files, bytes.

It travels in the prelude's bundle, compiled by the gateway (or as source, for an interpreter
with another bytecode format), and the prelude makes it the module ``_mcp_support`` the first
time a run needs it: an uncaught exception, a syntax error, the user's code importing matplotlib
or ``linecache`` or using ``sys.stdout.buffer``, files in the working directory, or an
interpreter that imported matplotlib or ``linecache`` before the prelude ran (see :func:`start`).
Standard-library only; matplotlib is imported only here, and only once something else did.

Figures: the backend defined here draws with Agg; ``plt.show()`` saves every open figure and
closes it, ``Figure.show()`` saves and closes that figure, and the prelude has whatever is still
open at the end saved too. Each becomes ``figure_001.png``, ``figure_002.png``, ... in the working
directory, in drawing order, skipping names that already exist (a file the user saved is never
overwritten), at :data:`FIGURE_DPI`, lowered so that no side exceeds :data:`FIGURE_MAX_PIXELS`.
A figure is drawn under its name plus :data:`PARTIAL_SUFFIX` and takes its name only once
complete, so a run killed while saving one leaves ``figure_NNN.png.part``, never a truncated PNG
under a figure's name. A figure that cannot be saved is reported in one line on stderr; nothing
else changes.

Files: at the end of a run that left files, ``MANIFEST_NAME`` lists the files the evaluator
should return, so that the gateway can name those it did not return.

It is made of parts, one concern each: ``_output`` (the guarded streams' bytes, notes on stderr),
``_tracebacks``, ``_figures`` (the backend, saving), ``_imports`` (the import hooks) and
``_manifest``; this module is what the prelude calls. All travel in the bundle's tail, and the
prelude makes them the modules ``_mcp_support.<part>`` (this one ``_mcp_support``): they import
one another relatively, and nothing beyond the standard library. No part has side effects on
import: the gateway imports them for their constants.
"""

import sys

from . import _figures, _manifest, _output, _tracebacks
from ._imports import adopt_matplotlib, find_spec
from ._manifest import MANIFEST_NAME, note_inputs
from ._output import buffer, detach, replace
from ._tracebacks import register_source, report_uncaught

TYPE_CHECKING = False
if TYPE_CHECKING:
    import io
    from collections.abc import Sequence
    from types import CodeType

# What the prelude calls.
__all__ = [
    "MANIFEST_NAME",
    "buffer",
    "configure",
    "detach",
    "find_spec",
    "finish",
    "replace",
    "report_uncaught",
    "start",
]

# Whether the code is a session's cell (set by configure()).
_session = False


def configure(
    *,
    workdir: str,
    source: bytes,
    hide: "tuple[CodeType, ...]",
    streams: "Sequence[io.TextIOWrapper]" = (),
    session: bool = False,
) -> None:
    """Called by the prelude once this module is loaded.

    Args:
        workdir: The run's working directory, where figures are saved.
        source: The user's code, for ``linecache``.
        hide: The code of the prelude's functions that run the user's (and show its last
            value): their frames are dropped from the head of tracebacks (whatever their file
            name: compiled by the gateway, or from source).
        streams: The prelude's guarded ``sys.stdout`` and ``sys.stderr`` (see
            ``_output.finish_streams``).
        session: The code is a cell of a session: called again for each cell, which starts
            afresh (its note, its interruption), and an interrupted cell ends the cell only.
    """
    global _session
    _session = session
    _figures.configure(workdir)
    _manifest.configure(workdir)
    _output.configure(streams)
    _tracebacks.configure(source, hide)


def start() -> None:
    """Called by the prelude, before the code runs, when one of these needs doing.

    Files in the working directory were sent in: they are remembered, so that the manifest
    leaves out those the code leaves alone. Modules loaded before the prelude ran, so that its
    import hooks never see them: ``linecache`` learns the user's source, and matplotlib gets
    the capturing backend (see ``_imports.adopt_matplotlib``).
    """
    note_inputs()
    if "linecache" in sys.modules:
        register_source(sys.modules["linecache"])
    if "matplotlib" in sys.modules:
        adopt_matplotlib()


def finish() -> None:
    """Called by the prelude once the code has run, when something is left to do.

    Figures pyplot still holds open are saved, the manifest is written, the streams are
    flushed and what ``sys.stdout.buffer`` still holds written out, followed by the note on
    what had to be replaced; after a KeyboardInterrupt, the run ends by SIGINT.
    """
    _figures.capture_open_figures()
    _manifest.write_if_needed()
    _output.flush_streams()
    _output.finish_streams()
    if _tracebacks.interrupted and not _session:
        _tracebacks.die_of_sigint()
