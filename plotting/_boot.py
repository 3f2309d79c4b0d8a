"""The first file of every run: loads the prelude and starts it (see ``plotting/__init__.py``).

The interpreter compiles this file on every run, so it is kept to a few statements. The bundle
(see ``prelude_files()``) holds the user's code and the prelude and its support module compiled
by the gateway's interpreter: the prelude is loaded here, the support module only when a run
needs it. An interpreter with another bytecode format (magic number) compiles their sources
instead. A session's later cells run the prelude an earlier cell kept (``sys._mcp_prelude``),
if it is the bundle's (its digest); else they end, and the gateway sends it. The prelude removes
both files before the user's code runs.
"""

import marshal
import sys

if __name__ == "__main__":
    with open("_mcp_prelude.bin", "rb") as _boot_file:
        _boot_data = _boot_file.read()
    _boot = marshal.loads(_boot_data)  # the head; the tail is read when needed
    _boot_compiled = _boot[0] == getattr(
        sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None
    )
    if _boot[2]:
        _boot_prelude = {"__name__": "_mcp_prelude"}
        exec(
            marshal.loads(_boot[1]) if _boot_compiled else __import__("zlib").decompress(_boot[2]),
            _boot_prelude,
        )
    else:  # a later cell of a session: the prelude an earlier cell kept, if it is this one
        _boot_prelude = getattr(sys, "_mcp_prelude", None)  # type: ignore[assignment]
        if type(_boot_prelude) is not dict or _boot_prelude.get("_digest") != _boot[5]:
            # The answer on which the gateway sends it (plotting.prelude_missing).
            print(
                "The prelude is not in this session's interpreter: sent again.",
                file=sys.__stdout__,
                flush=True,
            )
            sys.exit(121)
    # This namespace becomes the user's: whoever ran this file holds the user's module then.
    _boot_prelude["main"](_boot, _boot_data, _boot_compiled, globals())  # type: ignore[operator]
