"""The prelude: runs the user's code as ``__main__`` (see ``plotting/__init__.py``).

Every run pays for compiling this file (a script has no cached bytecode), so it holds only what
every run needs and imports nothing a bare interpreter has not loaded. The rest is in the support
module (``_support.py``), compiled only when a run needs it. Standard-library only.
"""

# contextlib is not loaded at interpreter startup; importing it would cost every run.
# ruff: noqa: SIM105

import builtins
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

CODE_NAME = "_mcp_code.py"
SUPPORT_NAME = "_mcp_support.py"
# The name python -c gives its code: exec() of a string uses it, and compile() is avoided.
CODE_FILENAME = "<string>"
# Imports handed to the support module (see its find_spec()); all others cost one set lookup.
WATCHED_IMPORTS = frozenset({"_mcp_backend", "matplotlib", "matplotlib.pyplot", "linecache"})

# Set by main().
_self: object = None
_workdir = ""
_source = b""
_support_source = b""


def main() -> None:
    """Run the user's code as ``__main__``; exit the way ``python`` would have."""
    global _self, _workdir, _source, _support_source
    _self, _workdir = sys.modules[__name__], os.getcwd()
    with open(CODE_NAME, "rb") as f:
        _source = f.read()
    with open(SUPPORT_NAME, "rb") as f:
        _support_source = f.read()
    for name in (CODE_NAME, SUPPORT_NAME, __file__):  # the user's directory holds only its own
        try:
            os.remove(name)
        except OSError:
            pass
    sys.meta_path.insert(0, _self)  # this module is the finder: see find_spec()
    if "linecache" in sys.modules:  # a .pth file loaded it already
        _support().register_source(sys.modules["linecache"])
    module = type(sys)("__main__")
    # No __file__, as with python -c: no file holds the code, and multiprocessing's spawn and
    # forkserver start methods would try to re-run a __main__ that has one.
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv[:1] = [CODE_FILENAME]
    status: object = None
    interrupted = False
    try:
        # exec() of the bytes, not compile(): compile() first builds the ast module's types,
        # about 1.5 ms that every run would pay. Bytes are read as python reads a script (BOM,
        # coding cookie, bad UTF-8, NUL bytes); a compile error has no frame of the user's and
        # is reported as python reports one. This file has no __future__ imports to pass on.
        exec(_source, module.__dict__)
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:
        _support().report_uncaught(exc)
        status = 1
        interrupted = isinstance(exc, KeyboardInterrupt)
    if "matplotlib._pylab_helpers" in sys.modules:  # pyplot was imported: figures may be open
        _support().capture_open_figures()
    if interrupted:
        _support().die_of_sigint()
    if status is not None:
        try:
            sys.stdout.flush()  # before python prints a sys.exit() message on stderr
        except Exception:
            pass
        raise SystemExit(status)


def find_spec(
    fullname: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
) -> "ModuleSpec | None":
    """The ``sys.meta_path`` finder: this module is put first on it."""
    if fullname in WATCHED_IMPORTS:
        return _support().find_spec(_self, fullname, path, target)  # type: ignore[no-any-return]
    return None


def _support() -> "ModuleType":
    """The support module, compiled on first use."""
    module = sys.modules.get("_mcp_support")
    if module is None:
        module = sys.modules["_mcp_support"] = type(sys)("_mcp_support")
        exec(compile(_support_source, "<mcp-support>", "exec", dont_inherit=True), module.__dict__)
        module.configure(workdir=_workdir, source=_source, hide=main.__code__.co_filename)
    return module


if __name__ == "__main__":
    main()
