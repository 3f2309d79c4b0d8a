"""Wheels and an sdist made in the test: the package tests use no outside index.

A wheel is a zip of its files and their RECORD; uv installs it from a folder
(``--no-index --find-links``), as ``EVALUATOR_PACKAGE_INDEX=<folder>`` makes the evaluator do.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

__all__ = ["sdist", "wheel", "wheels"]


def wheel(folder: Path, name: str, version: str, code: str, *, requires: str = "") -> Path:
    """A pure-Python wheel of one module, ``name``, holding ``code``."""
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires:
        metadata += f"Requires-Dist: {requires}\n"
    files = {
        f"{name}/__init__.py": code.encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return out


def sdist(folder: Path, name: str, version: str) -> Path:
    """A source distribution only: installing it would run its build on the host."""
    out = folder / f"{name}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as archive:
        pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
        member = tarfile.TarInfo(f"{name}-{version}/PKG-INFO")
        member.size = len(pkg_info)
        archive.addfile(member, io.BytesIO(pkg_info))
    return out


def wheels(folder: Path) -> Path:
    """A folder of the test packages: tinypkg 1.0 and 1.1, withdep (needs tinypkg), bulky
    (300 kB), and sourceonly (an sdist, no wheel)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel(folder, "tinypkg", "1.0", "VALUE = 1\n")
    wheel(folder, "tinypkg", "1.1", "VALUE = 11\n")
    wheel(folder, "withdep", "2.0", "from tinypkg import VALUE\n", requires="tinypkg>=1")
    wheel(folder, "bulky", "1.0", "DATA = " + repr("x" * 300_000) + "\n")
    sdist(folder, "sourceonly", "1.0")
    return folder
