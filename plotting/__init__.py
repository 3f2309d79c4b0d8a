"""The prelude that runs before the user's code in every sandboxed run, and what it promises.

The gateway does not send the user's code as ``python -c code``: it sends two files and runs
the first, which runs the code (to a service that keeps the prelude resident, it sends no file:
``python -c LAUNCHER code``, see :func:`build_request`)::

    from plotting import build_request, sort_files

    result = await client.eval(build_request("import matplotlib.pyplot as plt; plt.plot([1, 2])"))
    files = sort_files(result.files)  # files.figures: figure_001.png, ... in drawing order

The first file, :data:`PRELUDE_NAME` (``_boot.py``), is a few statements: it loads the prelude
(``_prelude.py``) from the bundle, :data:`BUNDLE_NAME`, which holds the code and, compiled by
the gateway's interpreter, the prelude and its support module (``_support.py`` and its parts),
with their sources for an interpreter with another bytecode format (see :func:`prelude_files`).
Snekbox starts a fresh interpreter for every run, and compiling the prelude there would cost
more than all else it does; the support module is loaded only when a run needs it. The prelude
removes the files sent and runs the code as ``__main__``: tracebacks show only the user's frames
(file :data:`CODE_FILENAME`) with the user's line numbers, ``sys.exit(n)`` exits with n and an
uncaught exception with 1. Every matplotlib figure shown with ``plt.show()`` or still open at
the end becomes ``figure_NNN.png`` in the working directory (NNN = 001, 002, ... in drawing
order; a name that already exists is skipped, so a user's file is never overwritten) at
:data:`FIGURE_DPI`, lowered so that no side exceeds :data:`FIGURE_MAX_PIXELS`; while it is being
saved it is ``figure_NNN.png.part``. The helper files' names start with ``_``, so Snekbox never
returns them; figure names do not, so it does. An interpreter that imported matplotlib before
running the first file (one kept warm) gets the same figures.

What the run writes to ``sys.stdout`` and ``sys.stderr`` (their ``buffer`` included) reaches the
evaluator as UTF-8, what had to be replaced being said in a note at the end of the output. A run
that left files ends by writing :data:`MANIFEST_NAME`, the list of the files the evaluator should
return; :func:`sort_files` reads it. Everything the run leaves, that list included, is written
by code the user controls: :func:`read_manifest` treats it as hostile.
"""

import base64
import functools
import marshal
import re
from collections.abc import Iterable
from dataclasses import dataclass

from snekbox_client import EvalRequest, EvalResult, File

from ._bundle import RESIDENT_DIR, WARM_PATH
from ._bundle import Parts as _Parts
from ._bundle import launcher as _bundle_launcher
from ._bundle import write_resident as _write_resident
from ._figures import FIGURE_DPI, FIGURE_MAX_PIXELS, PARTIAL_SUFFIX
from ._manifest import MANIFEST_MAX_BYTES, MANIFEST_NAME
from ._prelude import BUNDLE_NAME, CODE_FILENAME, PRELUDE_NAME

__all__ = [
    "BUNDLE_NAME",
    "CODE_FILENAME",
    "FIGURE_DPI",
    "FIGURE_MAX_PIXELS",
    "FIGURE_PATTERN",
    "LOST_FIGURE_PATTERN",
    "MANIFEST_MAX_BYTES",
    "MANIFEST_NAME",
    "PNG_SIGNATURE",
    "PRELUDE_NAME",
    "RESIDENT_DIR",
    "WARM_PATH",
    "Manifest",
    "ReturnedFiles",
    "build_request",
    "carries_prelude",
    "figure_number",
    "is_figure",
    "prelude_digest",
    "prelude_files",
    "prelude_missing",
    "read_manifest",
    "sort_files",
    "write_resident",
]

#: Names of the figures the prelude captures; group 1 is the figure's number (ASCII digits).
FIGURE_PATTERN = re.compile(r"figure_([0-9]{3,})\.png")
#: Names of figures still being saved: left over when a run ended during a save.
LOST_FIGURE_PATTERN = re.compile(r"figure_([0-9]{3,})\.png" + re.escape(PARTIAL_SUFFIX))
#: What a run answers that was sent without the prelude, when neither its interpreter nor the
#: service holds it (``_boot.py`` writes them): see :func:`prelude_missing`.
_PRELUDE_MISSING_STATUS = 121
_PRELUDE_MISSING_OUTPUT = (
    "The prelude is not in this interpreter, nor resident in the service: the code did not run; "
    "call again.\n"
)
#: The longest code a launched run takes as its argument (Linux takes 128 KiB in one).
_ARGUMENT_MAX_BYTES = 64 * 1024
#: The first bytes of every PNG file.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_MANIFEST_HEADER = re.compile(rb"mcp-manifest 1 ([0-9]{1,12}) ([01])\n")
_MANIFEST_RECORD = re.compile(rb"([0-9]{1,20}|-) (.+)", re.DOTALL)


@functools.cache
def _parts() -> _Parts:
    """The prelude compiled by this interpreter, once."""
    return _Parts()


def prelude_files(
    code: bytes, *, later_cell: bool = False, resident: bool = False
) -> tuple[File, File]:
    """The two files of the request that runs ``code``: the first file and the bundle.

    The bundle is two ``marshal`` records, readable by any Python 3. The head, ``(magic, prelude
    code, prelude source, code, size of the tail, digest)``: ``magic`` is the bytecode magic number
    (``importlib.util.MAGIC_NUMBER``) of the interpreter that compiled the prelude's code (this one;
    a resident bundle's: the service's), ``marshal``-ed (see ``_bundle.py``), its source compressed
    with ``zlib``, the digest names this prelude. The tail, ``(support code, support source)``: each
    a ``marshal``-ed tuple of ``(part, code)`` (or source) pairs of the support module's parts, the
    module itself last (part ``""``), compressed with ``zlib``: read only by a run that needs the
    support module. ``_boot.py`` loads the compiled prelude when its interpreter has the same magic
    number, else it compiles the prelude's source, and the prelude does the same with the support
    module.

    ``later_cell``: a later cell of a live session, whose interpreter keeps the prelude an
    earlier cell ran (``sys._mcp_prelude``): the bundle is the head alone, with the prelude's
    code and source empty and a tail of 0 bytes (2 KiB on the wire instead of 50). If that
    interpreter holds no prelude with this digest (the code removed it, another gateway's
    sent it), it runs the service's resident prelude, as ``resident`` does; failing that, the
    cell ends before the code runs, as :func:`prelude_missing` tells, and is to be sent again
    whole.

    ``resident``: the service may keep this prelude resident (the real Snekbox built from
    ``docker/snekbox/Dockerfile``, which runs ``plotting/_bundle.py``; the built-in evaluator,
    see :func:`write_resident`): the bundle is the head
    alone, as for a later cell, and the first file loads the whole bundle the service keeps for
    its interpreter (``_bundle.RESIDENT_DIR``).
    """
    parts = _parts()
    boot_file, tail_base64 = _encoded_parts()
    if later_cell or resident:
        head = marshal.dumps((parts.magic, b"", b"", code, 0, parts.digest), 4)
        return boot_file, File(BUNDLE_NAME, head)
    head = parts.head(code)
    return boot_file, File.encoded(
        BUNDLE_NAME, head + parts.tail, base64.b64encode(head) + tail_base64
    )


def prelude_digest() -> str:
    """The name of this prelude (hex): a service keeping it resident says it (``GET /info``)."""
    return _parts().digest.hex()


def write_resident(directory: str) -> str:
    """Write the prelude as a service keeps it resident for this interpreter (see
    :func:`prelude_files`), in ``directory``, which the service's sandboxes see as
    :data:`RESIDENT_DIR`. Returns its path."""
    return _write_resident(directory, _parts())


@functools.cache
def _encoded_parts() -> tuple[File, bytes]:
    """The first file, and the bundle's tail in base64: the same in every request (the head
    is padded to whole base64 quanta, so the bundle's base64 is the head's and the tail's)."""
    parts = _parts()
    return File(PRELUDE_NAME, parts.boot), base64.b64encode(parts.tail)


def prelude_missing(result: EvalResult) -> bool:
    """Whether a run sent without the prelude (a later cell, or ``resident``: see
    :func:`prelude_files`) found none to run: the code did not run, and the run is to be sent
    again with the prelude.

    What the first file answers then; code that prints the same and exits the same way is
    merely run again once, after a run of no code that tells whether the service keeps it.
    """
    return (
        result.returncode == _PRELUDE_MISSING_STATUS
        and result.stdout == _PRELUDE_MISSING_OUTPUT
        and result.ended_by in ("exit", None)
    )


def carries_prelude(request: EvalRequest) -> bool:
    """Whether ``request`` (of :func:`build_request`) carries the prelude, rather than running
    one its sandbox holds (a later cell's, or the service's resident one)."""
    bundle = next((f for f in request.files if f.path == BUNDLE_NAME), None)
    return bundle is not None and bool(marshal.loads(bundle.content)[2])


def build_request(
    code: str,
    *,
    executable_path: str | None = None,
    later_cell: bool = False,
    resident: bool = False,
) -> EvalRequest:
    """The ``POST /eval`` request that runs ``code`` under the prelude.

    The code travels in the bundle (see :func:`prelude_files`), encoded as UTF-8; lone
    surrogates pass through, and the prelude reports them as a syntax error, as ``python``
    would for such a script. A ``resident`` run, not a later cell, sends no file when it can:
    ``python -c LAUNCHER CODE``, where the launcher (``_bundle.launcher``) makes the bundle's
    head of the code and runs the first file the service keeps compiled beside its prelude.
    The service then writes no file before the run, and the interpreter compiles a few lines
    instead of the first file. Code that cannot be an argument (over
    :data:`_ARGUMENT_MAX_BYTES`, a NUL, a lone surrogate) goes in the bundle.

    Args:
        code: The user's Python source.
        executable_path: The interpreter to run inside the service (``None``: its default).
        later_cell: The run is a later cell of a live session that holds the prelude already
            (see :func:`prelude_files`).
        resident: The service may keep the prelude resident (see :func:`prelude_files`).
    """
    code_bytes = code.encode("utf-8", "surrogatepass")
    if resident and not later_cell and _fits_an_argument(code_bytes):
        return EvalRequest(args=["-c", _launcher(), code], executable_path=executable_path)
    return EvalRequest(
        args=[PRELUDE_NAME],
        files=prelude_files(code_bytes, later_cell=later_cell, resident=resident),
        executable_path=executable_path,
    )


def _fits_an_argument(code: bytes) -> bool:
    """Whether ``code`` (UTF-8, lone surrogates passed) can be a command-line argument that
    python reads back as it was sent."""
    if len(code) > _ARGUMENT_MAX_BYTES or b"\0" in code:
        return False
    try:
        code.decode("utf-8")
    except UnicodeDecodeError:  # a lone surrogate, which no argument can carry
        return False
    return True


@functools.cache
def _launcher() -> str:
    """The ``-c`` code of a run launched from the resident prelude (see :func:`build_request`)."""
    return _bundle_launcher(_parts(), _PRELUDE_MISSING_OUTPUT.removesuffix("\n"))


def is_figure(path: str) -> bool:
    """Whether a returned file's path is a name the prelude gives to captured figures."""
    return FIGURE_PATTERN.fullmatch(path) is not None


def figure_number(path: str) -> int:
    """The drawing-order number of a captured (or lost) figure's path (``figure_012.png`` -> 12).

    Raises:
        ValueError: ``path`` is not a figure's name, nor a lost figure's.
    """
    match = FIGURE_PATTERN.fullmatch(path) or LOST_FIGURE_PATTERN.fullmatch(path)
    if match is None:
        raise ValueError(f"{path!r} is not the name of a captured figure")
    return int(match.group(1))


@dataclass(frozen=True)
class Manifest:
    """The run's own list of the files it left: what the prelude wrote, or what the code forged.

    ``files`` holds ``(path, size)`` pairs, as many as fit in :data:`MANIFEST_MAX_BYTES`;
    ``total`` counts every file found, and ``complete`` says whether the walk over the working
    directory saw all of it (when not, ``total`` is a lower bound). ``gone``: files that were
    there when the code started and are no more (as many as fit).
    """

    files: tuple[tuple[str, int], ...]
    total: int
    complete: bool
    gone: tuple[str, ...] = ()


def read_manifest(data: bytes) -> Manifest | None:
    """Parse a manifest; ``None`` for anything but a well-formed one within its size bound.

    Paths that are not UTF-8 are decoded with U+FFFD; nothing else is checked about them, since
    they are only ever shown (escaped) to the model, or forgotten from the run's own session.
    """
    if len(data) > MANIFEST_MAX_BYTES:
        return None
    header = _MANIFEST_HEADER.match(data)
    if header is None:
        return None
    records = data[header.end() :].split(b"\0")
    if records.pop() != b"":  # every record ends with a NUL
        return None
    files: list[tuple[str, int]] = []
    gone: list[str] = []
    for record in records:
        match = _MANIFEST_RECORD.fullmatch(record)
        if match is None:
            return None
        path = match[2].decode("utf-8", "replace")
        if match[1] == b"-":
            gone.append(path)
        elif gone:  # the files come first
            return None
        else:
            files.append((path, int(match[1])))
    total = int(header[1])
    if total < len(files):
        return None
    return Manifest(tuple(files), total, header[2] == b"1", tuple(gone))


@dataclass(frozen=True)
class ReturnedFiles:
    """The files of a result, sorted by what they are.

    ``figures``: files with a figure's name whose content starts as a PNG, in drawing order (a
    file the user named ``figure_001.png`` that holds something else is among ``others``).
    ``lost_figures``: ``figure_NNN.png.part`` files whose figure did not come back, in drawing
    order: the run ended while saving them (a ``.part`` beside its complete figure, left when the
    run ended between the two steps of giving the figure its name, is dropped). ``manifest``: the
    parsed :data:`MANIFEST_NAME`, ``None`` when absent, malformed or returned without its whole
    content; the file itself is never among the others.
    """

    figures: list[File]
    lost_figures: list[File]
    manifest: Manifest | None
    others: list[File]


def sort_files(files: Iterable[File]) -> ReturnedFiles:
    """Sort a result's files into figures, lost figures, the manifest and the user's files."""
    files = list(files)
    paths = {file.path for file in files}
    figures: list[File] = []
    lost: list[File] = []
    others: list[File] = []
    manifest = None
    for file in files:
        if file.path == MANIFEST_NAME:
            manifest = read_manifest(file.content) if file.complete else None
        elif is_figure(file.path) and file.content.startswith(PNG_SIGNATURE):
            figures.append(file)
        elif LOST_FIGURE_PATTERN.fullmatch(file.path):
            if file.path.removesuffix(PARTIAL_SUFFIX) not in paths:
                lost.append(file)
        else:
            others.append(file)
    figures.sort(key=lambda f: figure_number(f.path))
    lost.sort(key=lambda f: figure_number(f.path))
    return ReturnedFiles(figures, lost, manifest, others)
