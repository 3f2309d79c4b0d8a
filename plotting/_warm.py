"""Run by a warm sandbox's interpreter before its first run (the built-in evaluator's agent),
from the directory the prelude is kept resident in (see ``_bundle.write_resident``).

It loads the resident prelude of this interpreter's bytecode and makes its support module, as a
run's first file would (``_boot.py``, then the prelude's ``warm()``), so that a session's first
cell does not: it runs as the session's later cells do. Without one for this interpreter, it
does nothing. Standard library only, and only what a bare interpreter has loaded.
"""

import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _warm() -> None:
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
    here = os.path.dirname(__file__)
    names = [name for name in os.listdir(here) if name.endswith(f"-{magic.hex()}.bin")]
    if len(names) != 1:
        return
    with open(os.path.join(here, names[0]), "rb") as file:
        bundle = file.read()
    head = marshal.loads(bundle)
    if head[0] == magic:  # compiled by an interpreter of this one's bytecode
        prelude: dict[str, Any] = {"__name__": "_mcp_prelude"}
        exec(marshal.loads(head[1]), prelude)
        prelude["warm"](head, bundle)


_warm()
