"""What the evaluation service's Python offers, learned by running a probe there.

The tool's description must not promise what the backend lacks (a Snekbox image without pandas
fails ``import pandas``), so the gateway runs :data:`PROBE` on the service at start, and again
from time to time: the interpreter's version and the distributions it can import, with their
versions. The answer comes from sandboxed code and is read as hostile: bounded, and every name
and version checked against what a real one looks like.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CORE", "ENVIRONMENT_URI", "NOTABLE", "PROBE", "Environment", "ProbeFailed"]

#: The resource that answers what the probe found (the tool's description names it).
ENVIRONMENT_URI = "python://environment"

#: Prints one JSON line: the interpreter's version and every installed distribution's.
PROBE = """\
import json, sys
from importlib import metadata
found = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        found.setdefault(name, dist.version)
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "packages": found}))
"""

#: The packages a data or plot script needs: the description says when one is missing.
CORE = ("numpy", "pandas", "matplotlib")
#: The packages a model reaches for first, named in the description when the probe finds them.
NOTABLE = (
    *CORE,
    "scipy",
    "sympy",
    "scikit-learn",
    "statsmodels",
    "seaborn",
    "polars",
    "pyarrow",
    "pillow",
    "networkx",
)

#: Distributions read from an answer at most.
_MAX_PACKAGES = 2000
_PYTHON = re.compile(r"\d{1,2}\.\d{1,3}\.\d{1,3}")
# PEP 508 names, and versions as PEP 440 writes them (with local labels), bounded.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9!+._-]{1,64}")


class ProbeFailed(ValueError):
    """The probe's answer is not what :data:`PROBE` prints."""


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Environment:
    """The service's Python: its version and its packages (normalized name: version)."""

    python: str
    packages: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, stdout: str) -> Environment:
        """Read the probe's output.

        Raises:
            ProbeFailed: it is not one JSON object of the probe's shape.
        """
        try:
            data: Any = json.loads(stdout)
        except ValueError as exc:
            raise ProbeFailed(f"the probe printed what is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ProbeFailed("the probe printed JSON that is not an object")
        python, packages = data.get("python"), data.get("packages")
        if not isinstance(python, str) or not _PYTHON.fullmatch(python):
            raise ProbeFailed("the probe's Python version is missing or malformed")
        if not isinstance(packages, dict) or len(packages) > _MAX_PACKAGES:
            raise ProbeFailed("the probe's packages are missing or too many")
        found: dict[str, str] = {}
        for name, version in packages.items():
            if not _NAME.fullmatch(name) or not (
                isinstance(version, str) and _VERSION.fullmatch(version)
            ):
                raise ProbeFailed("the probe named a package or version that cannot be real")
            found.setdefault(normalize(name), version)
        return cls(python, dict(sorted(found.items())))

    @property
    def minor(self) -> str:
        """``3.11`` of ``3.11.7``."""
        return ".".join(self.python.split(".")[:2])

    def notable(self) -> list[str]:
        """``name version`` of each :data:`NOTABLE` package installed, in that order."""
        return [f"{name} {self.packages[name]}" for name in NOTABLE if name in self.packages]

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "packages": self.packages}
