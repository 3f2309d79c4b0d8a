"""Settings read from ``EVALUATOR_*`` variables and ``--flags``, both made from one declaration.

A settings class (an :class:`ExplicitSettings`, pydantic-settings' ``BaseSettings``) declares
each field once, with its type and bounds; the fields an operator sets are marked :class:`Env`,
and each of those is the variable ``EVALUATOR_<NAME>`` and the flag ``--<name>``. Built in code,
such a class takes only its arguments. :func:`load` builds it from a mapping of variables (the
process environment, read at the entry point) and the flags given, flags first, and words a
value it refuses in one line naming the variable or flag, the value and what is allowed.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar, get_args

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

__all__ = [
    "PREFIX",
    "Env",
    "EnvironmentSource",
    "ExplicitSettings",
    "SettingsError",
    "add_flags",
    "env_fields",
    "flag",
    "load",
    "shown_default",
    "variable",
]

PREFIX = "EVALUATOR_"

S = TypeVar("S", bound="ExplicitSettings")


@dataclass(frozen=True)
class Env:
    """Marks a setting an operator sets (``Annotated[..., Env(...)]``).

    Args:
        help: What it is, for ``--help``.
        default: The default in words, when it is computed or absent (``"CPU count"``).

    A field validator that refuses a value raises ``ValueError`` saying what is allowed
    ("exactly ..."); otherwise the field's type and bounds say it.
    """

    help: str
    default: str | None = None


class SettingsError(ValueError):
    """A setting's value is not allowed (one line: the variable or flag, the value, the rule)."""


class ExplicitSettings(BaseSettings):
    """Settings taken from the arguments alone, validated, immutable.

    The process environment is never read here: the entry point reads it once and passes it
    to :func:`load`, so that building settings in code (tests, the gateway) depends on nothing
    around it.
    """

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, validate_default=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Not the process environment, which pydantic-settings reads by default (TIME_LIMIT,
        # CONCURRENCY, ...): the entry point reads it once, through load().
        return (init_settings,)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied, validated like new settings (pydantic's is not)."""
        copied = super().model_copy(update=update, deep=deep)
        return self.model_validate(copied.model_dump())


class EnvironmentSource(PydanticBaseSettingsSource):
    """The ``EVALUATOR_*`` variables of ``environ`` that set a field marked :class:`Env`.

    Values are stripped; an empty one is unset (the default holds).
    """

    def __init__(self, settings_cls: type[ExplicitSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = self._environ.get(variable(field_name), "").strip()
        return value or None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, (field, _) in env_fields(self.settings_cls).items():
            value, key, _ = self.get_field_value(field, name)
            if value is not None:
                values[key] = value
        return values


def variable(name: str) -> str:
    """The environment variable of field ``name``."""
    return PREFIX + name.upper()


def flag(name: str) -> str:
    """The command-line flag of field ``name``."""
    return "--" + name.replace("_", "-")


def env_fields(settings_cls: type[BaseSettings]) -> dict[str, tuple[FieldInfo, Env]]:
    """The fields of ``settings_cls`` marked :class:`Env`, with their marks, in their order."""
    marked = {}
    for name, field in settings_cls.model_fields.items():
        marker = next((m for m in field.metadata if isinstance(m, Env)), None)
        if marker is not None:
            marked[name] = (field, marker)
    return marked


def shown_default(field: FieldInfo, marker: Env) -> str:
    """The default as ``--help`` and the README show it: the value, or in words."""
    if marker.default is not None:
        return marker.default
    value = field.default
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_flags(parser: argparse.ArgumentParser, settings_cls: type[ExplicitSettings]) -> None:
    """Add ``--<name>`` for each :class:`Env` field; a flag not given leaves no attribute.

    The values stay strings: :func:`load` validates them as it does the variables.
    """
    for name, (field, marker) in env_fields(settings_cls).items():
        parser.add_argument(
            flag(name),
            dest=name,
            metavar=name.upper(),
            default=argparse.SUPPRESS,
            help=f"{marker.help} (env {variable(name)}; default: {shown_default(field, marker)})",
        )


def load(
    settings_cls: type[S], environ: Mapping[str, str], flags: argparse.Namespace | None = None
) -> S:
    """``settings_cls`` from the flags given (see :func:`add_flags`), else the variables of
    ``environ``, else the defaults.

    Raises:
        SettingsError: a value is not allowed (see the module's docstring).
    """
    marked = env_fields(settings_cls)
    given = {k: v for k, v in vars(flags or argparse.Namespace()).items() if k in marked}
    values = {**EnvironmentSource(settings_cls, environ)(), **given}
    try:
        return settings_cls(**values)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error["loc"] else ""
            if error["type"] == "value_error":
                rule = error["msg"].removeprefix("Value error, ")
            else:
                rule = _allowed(marked[name][0]) if name in marked else error["msg"]
            source = flag(name) if name in given else variable(name)
            lines.append(f"{source}={values.get(name)!r} is not allowed: it must be {rule}")
        raise SettingsError("; ".join(lines)) from None


_KINDS: dict[object, str] = {int: "an integer", float: "a finite number", str: "a string"}
# The attributes of pydantic's bound metadata (annotated_types' Gt, Ge, Lt, Le).
_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _allowed(field: FieldInfo) -> str:
    """What a field accepts, in words: its type and bounds."""
    kinds = [t for t in get_args(field.annotation) or (field.annotation,) if t is not type(None)]
    words = _KINDS.get(kinds[0], "a value") if len(kinds) == 1 else "a value"
    bounds = [
        f"{sign} {_number(bound)}"
        for item in field.metadata
        for attribute, sign in _BOUNDS
        if (bound := getattr(item, attribute, None)) is not None
    ]
    if bounds:
        words += " " + " and ".join(bounds)
    return words


def _number(value: float) -> str:
    return f"{value:,g}" if isinstance(value, float) else f"{value:,}"
