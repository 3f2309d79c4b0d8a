"""Runs at every start of Snekbox's interpreter in the sandbox (user site, /snekbox/user_base).

The sandbox's home is a fresh tmpfs each run, so matplotlib would rebuild its font list on every
first import (and a read-only cache directory is refused). The image built the list once, in the
same file-system view; this copies it into the fresh, writable MPLCONFIGDIR (about 0.1 ms).
"""

import os
import shutil

_FONTLIST_DIR = "/snekbox/user_base/share/matplotlib-fontlist"


def _seed_matplotlib_cache() -> None:
    try:
        names = os.listdir(_FONTLIST_DIR)
        target = os.environ.setdefault(
            "MPLCONFIGDIR", os.path.join(os.environ.get("HOME", "/home"), ".config", "matplotlib")
        )
        os.makedirs(target, exist_ok=True)
        for name in names:
            if not os.path.exists(os.path.join(target, name)):
                shutil.copyfile(os.path.join(_FONTLIST_DIR, name), os.path.join(target, name))
    except OSError:
        pass  # never break the user's program over a cache


_seed_matplotlib_cache()
