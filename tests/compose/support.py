"""Reading the compose files as Compose would: YAML plus ${VAR:-default} interpolation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = {"snekbox": ROOT / "compose.yaml", "builtin": ROOT / "compose.builtin.yaml"}
# The evaluation service of each stack: the one the gateway's SNEKBOX_URL names.
EVALUATION_SERVICE = {"snekbox": "snekbox", "builtin": "evaluator"}

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?::-(?P<default>[^}]*))?\}")


def variables(text: str) -> set[str]:
    """Names of the variables a compose file interpolates."""
    return {m.group("name") for m in _VARIABLE.finditer(text)}


def interpolate(value: Any, environ: dict[str, str] | None = None) -> Any:
    """Substitute ${VAR:-default} as Compose does (environment first, else the default)."""
    environ = environ or {}
    if isinstance(value, str):
        return _VARIABLE.sub(
            lambda m: environ.get(m.group("name"), m.group("default") or ""), value
        )
    if isinstance(value, list):
        return [interpolate(v, environ) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, environ) for k, v in value.items()}
    return value


def load(which: str, environ: dict[str, str] | None = None) -> dict[str, Any]:
    data = interpolate(yaml.safe_load(COMPOSE_FILES[which].read_text()), environ)
    assert isinstance(data, dict)
    return data
