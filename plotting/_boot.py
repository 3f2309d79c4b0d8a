"""The first file of every run: loads the prelude and starts it (see ``plotting/__init__.py``).

The interpreter compiles this file on every run, so it is kept to a few lines. The prelude and
its support module come in the bundle (see ``prelude_files()``) compiled by the gateway's
interpreter: the prelude is loaded here, the support module only when a run needs it. An
interpreter with another bytecode format (magic number) compiles their sources instead. Both
files are removed before the user's code runs.

Names are imported from modules, not the modules: a namespace that outlives the run (this one
does, the prelude's functions use it) holding ``os`` would make the interpreter's exit clear
``os`` and what it imports one name at a time, where it can otherwise free them whole.
"""

import marshal
import sys
from os import remove

if __name__ == "__main__":
    # The prelude runs in this namespace: these names must not be among its own.
    with open("_mcp_prelude.bin", "rb") as _boot_file:
        _boot = marshal.loads(_boot_file.read())
    remove("_mcp_prelude.bin")
    remove("_mcp_prelude.py")
    _boot_compiled = _boot[0] == getattr(
        sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None
    )
    exec(marshal.loads(_boot[1]) if _boot_compiled else _boot[3], globals())
    main(_boot[2 if _boot_compiled else 4], _boot_compiled)  # type: ignore[name-defined]  # noqa: F821
