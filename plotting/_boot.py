"""The first file of every run: loads the prelude and starts it (see ``plotting/__init__.py``).

The interpreter compiles this file on every run that sends it, so it is kept to a few statements.
A run launched from the prelude the service keeps resident sends no file: its ``-c`` code (the
launcher, see ``plotting.build_request``) makes the bundle's head of its argument, the user's
code, and runs this file as kept beside that prelude, compiled. The bundle (see
``prelude_files()``) holds the user's code and the prelude and its support module compiled by the
gateway's interpreter (a resident one: by the service's): the prelude is loaded here, the support
module only when a run needs it. An interpreter with another bytecode format (magic number) compiles
their sources instead. A bundle without the prelude runs the one an earlier cell of its session, or
a warm interpreter (``_warm.py``), kept (``sys._mcp_prelude``) if it is the bundle's (its digest),
else the one resident in the service (``plotting._bundle.RESIDENT_DIR``) for this digest and magic
number; else the run ends before the code, and the gateway sends it again whole (when the answer
comes back with the run's end). The prelude removes the files sent before the user's code runs.
"""

import marshal
import sys

if __name__ == "__main__":
    _boot = sys.__dict__.pop("_mcp_launched", None)  # the launcher's head, of its argument
    if _boot is None or sys.argv[0] != "-c":  # (one an interrupt left is not this run's)
        with open("_mcp_prelude.bin", "rb") as _boot_file:
            _boot_data = _boot_file.read()
        _boot = marshal.loads(_boot_data)  # the head; the tail is read when needed
    elif sys.path[:1] == [""]:  # python -c's: the working directory, as a script's
        sys.path[0] = __import__("os").getcwd()
    _boot_magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
    _boot_prelude = getattr(sys, "_mcp_prelude", None)
    if not _boot[2] and (
        type(_boot_prelude) is not dict or _boot_prelude.get("_digest") != _boot[5]
    ):  # none sent, none kept (by a session, a warm interpreter): the one resident, if any
        try:
            with open(
                f"/snekbox/user_base/share/mcp-prelude/{_boot[5].hex()}-{_boot_magic.hex()}.bin",
                "rb",
            ) as _boot_file:
                _boot_data = _boot_file.read()
        except OSError:
            # The answer on which the gateway sends it (plotting.prelude_missing).
            print(
                "The prelude is not in this interpreter, nor resident in the service: "
                "the code did not run; call again.",
                file=sys.__stdout__,
                flush=True,
            )
            sys.exit(121)
        _boot_resident = marshal.loads(_boot_data)  # its head, with the request's code
        _boot = (*_boot_resident[:3], _boot[3], *_boot_resident[4:])
    _boot_compiled = _boot[0] == _boot_magic
    if _boot[2]:
        _boot_prelude = {"__name__": "_mcp_prelude"}
        exec(
            marshal.loads(_boot[1]) if _boot_compiled else __import__("zlib").decompress(_boot[2]),
            _boot_prelude,
        )
    # This namespace becomes the user's: whoever ran this file holds the user's module then.
    _boot_prelude["main"](_boot, _boot_data, _boot_compiled, globals())  # type: ignore[index]
