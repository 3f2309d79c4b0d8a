"""The prelude that runs before the user's code in every sandboxed run, and what it promises.

The gateway does not send the user's code as ``python -c code``: it sends three files and runs
the first, which runs the code::

    from plotting import build_request, split_figures

    result = await client.eval(build_request("import matplotlib.pyplot as plt; plt.plot([1, 2])"))
    figures, other_files = split_figures(result.files)  # figure_001.png, ... in drawing order

Inside the sandbox the prelude (:data:`PRELUDE_NAME`, from ``_prelude.py``) reads the code from
:data:`CODE_NAME` and its support module from :data:`SUPPORT_NAME` (``_support.py``, compiled
only when a run needs it), removes all three files, and runs the code as ``__main__``:
tracebacks show only the user's frames (file :data:`CODE_FILENAME`) with the user's line
numbers, ``sys.exit(n)`` exits with n and an uncaught exception with 1. Every matplotlib figure
shown with ``plt.show()`` or still open at the end becomes ``figure_NNN.png`` in the working
directory (NNN = 001, 002, ... in drawing order; a name that already exists is skipped, so a
user's file is never overwritten) at :data:`FIGURE_DPI`, lowered so that no side exceeds
:data:`FIGURE_MAX_PIXELS`. The helper files' names start with ``_``, so Snekbox never returns
them; figure names do not, so it does.
"""

import functools
import importlib.resources
import re
from collections.abc import Iterable

from snekbox_client import EvalRequest, File

from ._prelude import CODE_FILENAME, CODE_NAME, SUPPORT_NAME
from ._support import FIGURE_DPI, FIGURE_MAX_PIXELS

__all__ = [
    "CODE_FILENAME",
    "CODE_NAME",
    "FIGURE_DPI",
    "FIGURE_MAX_PIXELS",
    "FIGURE_PATTERN",
    "PNG_SIGNATURE",
    "PRELUDE_NAME",
    "SUPPORT_NAME",
    "build_request",
    "figure_number",
    "is_figure",
    "prelude_files",
    "split_figures",
]

#: The name the prelude travels under, and the interpreter's only argument.
PRELUDE_NAME = "_mcp_prelude.py"
#: Names of the figures the prelude captures; group 1 is the figure's number.
FIGURE_PATTERN = re.compile(r"figure_(\d{3,})\.png")
#: The first bytes of every PNG file.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@functools.cache
def prelude_files() -> tuple[File, File]:
    """The prelude and its support module, as sent with every request (read once)."""
    package = importlib.resources.files(__name__)
    return (
        File(PRELUDE_NAME, package.joinpath("_prelude.py").read_bytes()),
        File(SUPPORT_NAME, package.joinpath("_support.py").read_bytes()),
    )


def build_request(code: str, *, executable_path: str | None = None) -> EvalRequest:
    """The ``POST /eval`` request that runs ``code`` under the prelude.

    The code travels as a file, not as an argument (an argument is limited to 128 KiB), encoded
    as UTF-8; lone surrogates pass through, and the prelude reports them as a syntax error, as
    ``python`` would for such a script.

    Args:
        code: The user's Python source.
        executable_path: The interpreter to run inside the service (``None``: its default).
    """
    return EvalRequest(
        args=[PRELUDE_NAME],
        files=(*prelude_files(), File(CODE_NAME, code.encode("utf-8", "surrogatepass"))),
        executable_path=executable_path,
    )


def is_figure(path: str) -> bool:
    """Whether a returned file's path is a name the prelude gives to captured figures."""
    return FIGURE_PATTERN.fullmatch(path) is not None


def figure_number(path: str) -> int:
    """The drawing-order number of a captured figure's path (``figure_012.png`` -> 12).

    Raises:
        ValueError: ``path`` is not a figure's name.
    """
    match = FIGURE_PATTERN.fullmatch(path)
    if match is None:
        raise ValueError(f"{path!r} is not the name of a captured figure")
    return int(match.group(1))


def split_figures(files: Iterable[File]) -> tuple[list[File], list[File]]:
    """Split returned files into captured figures, in drawing order, and all other files.

    A figure is a file with a figure's name whose content is a PNG; a file the user named
    ``figure_001.png`` that holds something else stays among the other files.
    """
    figures: list[File] = []
    others: list[File] = []
    for file in files:
        is_png = file.content.startswith(PNG_SIGNATURE)
        (figures if is_png and is_figure(file.path) else others).append(file)
    figures.sort(key=lambda f: figure_number(f.path))
    return figures, others
