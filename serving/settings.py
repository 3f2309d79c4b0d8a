"""Settings read from environment variables and ``--flags``, both made from one declaration.

A settings class (an :class:`ExplicitSettings`, pydantic-settings' ``BaseSettings``) declares
each field once, with its type and bounds. A field is the variable ``<prefix><NAME>`` (the
class's ``env_prefix``: ``EVALUATOR_``, ``MCP_``) when :meth:`~ExplicitSettings.variables` names
it, and the flag ``--<name>`` when it is marked :class:`Flag`. Built in code, such a class takes
only its arguments. :func:`load` builds it from a mapping of variables (the process environment,
read at the entry point) and the flags given, flags first, and words each value it refuses as
``<VARIABLE or --flag>=<value> is not allowed: <reason>``, all in one line.

The reason is a field validator's own message, a whole clause ("it must be exactly ..."), or
else "it must be " and the field's type and bounds ("an integer >= 1 and <= 65535"). A field
declared ``repr=False`` is a secret: its value is shown as ``(hidden)``.
"""

from __future__ import annotations

import argparse
import logging
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar, Union, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = [
    "EnvironmentSource",
    "ExplicitSettings",
    "Flag",
    "SettingsError",
    "add_flags",
    "comma_separated",
    "flag",
    "load",
    "shown_default",
]

S = TypeVar("S", bound="ExplicitSettings")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Flag:
    """Marks a setting that is also the flag ``--<name>`` (``Annotated[..., Flag(...)]``).

    Args:
        help: What it is, for ``--help``.
        default: The default in words, when it is computed or absent (``"CPU count"``).
        metavar: What the flag takes, in ``--help`` (default: the NAME). A bool flag takes
            nothing and sets true, unless it has one.
        empty: An empty variable is the empty value (a list of nothing), not unset.
    """

    help: str
    default: str | None = None
    metavar: str | None = None
    empty: bool = False


class SettingsError(ValueError):
    """Values that are not allowed, in one line: for each, the variable or flag, the value and
    the reason."""


class ExplicitSettings(BaseSettings):
    """Settings taken from the arguments alone, validated, immutable.

    The process environment is never read here: the entry point reads it once and passes it
    to :func:`load`, so that building settings in code (tests, the gateway) depends on nothing
    around it.
    """

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, validate_default=True
    )
    #: Variables renamed, still read for one release: old variable -> the field it sets now.
    #: Reading one logs a line naming the new variable; the new one wins if both are set.
    renamed: ClassVar[Mapping[str, str]] = {}

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
        # PORT, ...): the entry point reads it once, through load().
        return (init_settings,)

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of field ``name``: the class's ``env_prefix`` and NAME."""
        return cls.model_config.get("env_prefix", "") + name.upper()

    @classmethod
    def flags(cls) -> dict[str, tuple[FieldInfo, Flag]]:
        """The fields marked :class:`Flag`, with their marks, in their order."""
        marked = {}
        for name, field in cls.model_fields.items():
            marker = next((m for m in field.metadata if isinstance(m, Flag)), None)
            if marker is not None:
                marked[name] = (field, marker)
        return marked

    @classmethod
    def variables(cls) -> tuple[str, ...]:
        """The fields the environment sets: by default, those that are flags."""
        return tuple(cls.flags())

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied, validated like new settings (pydantic's is not)."""
        copied = super().model_copy(update=update, deep=deep)
        return self.model_validate(dict(copied))


class EnvironmentSource(PydanticBaseSettingsSource):
    """The variables of ``environ`` that set a field (see :meth:`ExplicitSettings.variables`).

    Values are stripped; an empty one is unset (the default holds), unless its field's
    :class:`Flag` says ``empty``.
    """

    def __init__(self, settings_cls: type[ExplicitSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._settings_cls = settings_cls
        self._environ = environ
        #: The variable each field was read from, where it is not the field's own (a renamed
        #: one), so that a value it refuses is named as it was given.
        self.origin: dict[str, str] = {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = self._settings_cls.variable(field_name)
        value = self._environ.get(variable)
        if value is None:
            value = self._renamed_value(field_name, variable)
        if value is None:
            return None, field_name, False
        value = value.strip()
        if not value and any(isinstance(m, Flag) and m.empty for m in field.metadata):
            return "", field_name, False
        return value or None, field_name, False

    def _renamed_value(self, field_name: str, variable: str) -> str | None:
        """The value of an old name of ``field_name``'s variable, if one is set."""
        for old, name in self._settings_cls.renamed.items():
            if name == field_name and old in self._environ:
                log.warning(
                    "%s is deprecated and will be read for this release only: set %s instead",
                    old,
                    variable,
                )
                self.origin[field_name] = old
                return self._environ[old]
        return None

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name in self._settings_cls.variables():
            value, key, _ = self.get_field_value(self._settings_cls.model_fields[name], name)
            if value is not None:
                values[key] = value
        return values


def comma_separated(value: Any) -> Any:
    """A ``before`` validator's step: a string is a tuple of its stripped, non-empty items."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def flag(name: str) -> str:
    """The command-line flag of field ``name``."""
    return "--" + name.replace("_", "-")


def shown_default(field: FieldInfo, marker: Flag) -> str:
    """The default as ``--help`` and the README show it: the value, or in words."""
    if marker.default is not None:
        return marker.default
    value = field.default
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_flags(parser: argparse.ArgumentParser, settings_cls: type[ExplicitSettings]) -> None:
    """Add ``--<name>`` for each :class:`Flag` field; a flag not given leaves no attribute.

    A bool is a switch (it sets true); a ``Literal`` shows its choices. The values stay
    strings: :func:`load` validates them as it does the variables.
    """
    for name, (field, marker) in settings_cls.flags().items():
        default = shown_default(field, marker)
        options: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": f"{marker.help} (env {settings_cls.variable(name)}; default: {default})",
        }
        if field.annotation is bool and marker.metavar is None:
            options.update(action="store_const", const=True)
        elif get_origin(field.annotation) is Literal:
            options.update(metavar="{" + ",".join(map(str, get_args(field.annotation))) + "}")
        else:
            options.update(metavar=marker.metavar or name.upper())
        parser.add_argument(flag(name), **options)


def load(
    settings_cls: type[S],
    environ: Mapping[str, str],
    flags: Mapping[str, Any] | argparse.Namespace | None = None,
    **values: Any,
) -> S:
    """``settings_cls`` from ``values`` (taken as they are), the flags of ``settings_cls`` in
    ``flags`` (see :func:`add_flags`; other entries are ignored), the variables of ``environ``,
    and the defaults, in that order.

    Raises:
        SettingsError: a value is not allowed (see the module's docstring).
    """
    given = vars(flags) if isinstance(flags, argparse.Namespace) else dict(flags or {})
    flagged = {k: v for k, v in given.items() if k in settings_cls.flags()}
    environment = EnvironmentSource(settings_cls, environ)
    merged = {**environment(), **flagged, **values}
    try:
        return settings_cls(**merged)
    except ValidationError as exc:
        refused: dict[str, str] = {}  # the first error of each field
        for error in exc.errors(include_url=False):
            name = str(error["loc"][0]) if error["loc"] else settings_cls.__name__
            field = settings_cls.model_fields.get(name)
            if name in flagged:
                source = flag(name)
            else:
                variable = environment.origin.get(name) or settings_cls.variable(name)
                source = variable if field is not None else name
            shown = repr(merged.get(name, error["input"]))
            if field is not None and not field.repr:
                shown = "(hidden)"
            if error["type"] == "value_error":
                reason = error["msg"].removeprefix("Value error, ")
            else:
                allowed = _allowed(field) if field is not None else None
                reason = f"it must be {allowed}" if allowed else error["msg"]
            refused.setdefault(name, f"{source}={shown} is not allowed: {reason}")
        raise SettingsError("; ".join(refused.values())) from None


_KINDS: dict[object, str] = {
    int: "an integer",
    float: "a finite number",
    str: "a string",
    bool: "true or false",
}
# The attributes of pydantic's bound metadata (annotated_types' Gt, Ge, Lt, Le; MinLen below).
_BOUNDS = (("gt", "> {}"), ("ge", ">= {}"), ("lt", "< {}"), ("le", "<= {}"))
_UNIONS = (Union, types.UnionType)


def _allowed(field: FieldInfo) -> str | None:
    """What a field accepts, in words (its type and bounds); ``None`` if its type is not one
    said in words."""
    metadata = list(field.metadata)
    kinds = []
    annotation = field.annotation
    for kind in get_args(annotation) if get_origin(annotation) in _UNIONS else (annotation,):
        if get_origin(kind) is Annotated:  # PositiveInt | None: the bound is inside
            kind, *more = get_args(kind)
            metadata += more
        if kind is not type(None):
            kinds.append(kind)
    if len(kinds) != 1:
        return None
    if get_origin(kinds[0]) is Literal:
        return "one of " + ", ".join(map(repr, get_args(kinds[0])))
    words = _KINDS.get(kinds[0])
    if words is None:
        return None
    bounds = [
        template.format(_number(bound))
        for item in metadata
        for attribute, template in _BOUNDS
        if (bound := getattr(item, attribute, None)) is not None
    ]
    if bounds:
        words += " " + " and ".join(bounds)
    for length in (n for item in metadata if (n := getattr(item, "min_length", None))):
        words += f" of at least {length} character" + "s" * (length != 1)
    return words


def _number(value: float) -> str:
    """A bound as an operator writes it: ``86400``, ``0.1``."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
