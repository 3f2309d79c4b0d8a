"""Runs at every start of Snekbox's interpreter in the sandbox (user site, /snekbox/user_base).

The sandbox's home is a fresh tmpfs each run, so matplotlib would rebuild its font list on every
first import (and a read-only cache directory is refused). The image built the list once, in the
same file-system view; this copies it into the fresh, writable MPLCONFIGDIR (about 0.1 ms).

Every run pays for what this imports, so it imports nothing the interpreter has not loaded
already: ``shutil`` pulled in ``re``, ``fnmatch``, ``bz2`` and ``lzma``, several milliseconds.
"""

import os

_FONTLIST_DIR = "/snekbox/user_base/share/matplotlib-fontlist"


def _seed_matplotlib_cache() -> None:
    try:
        names = os.listdir(_FONTLIST_DIR)
        target = os.environ.setdefault(
            "MPLCONFIGDIR", os.path.join(os.environ.get("HOME", "/home"), ".config", "matplotlib")
        )
        os.makedirs(target, exist_ok=True)
        for name in names:
            copy = os.path.join(target, name)
            if not os.path.exists(copy):
                with open(os.path.join(_FONTLIST_DIR, name), "rb") as source:
                    data = source.read()
                with open(copy, "xb") as out:
                    out.write(data)
    except OSError:
        pass  # never break the user's program over a cache


_seed_matplotlib_cache()
