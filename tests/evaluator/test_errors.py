"""Every exception the evaluator defines is an ``EvaluatorError``, drawn in errors.py's tree."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import evaluator
from evaluator import errors
from evaluator.errors import EvaluatorError


def _public_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.iter_modules(evaluator.__path__):
        if info.name in ("__main__", "_agent", "_launcher"):  # run as scripts, not imported
            continue
        module = importlib.import_module(f"evaluator.{info.name}")
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("evaluator.")
                and not name.startswith("_")
            ):
                found[name] = value
    return found


def test_every_exception_of_the_evaluator_is_an_evaluator_error() -> None:
    exceptions = _public_exceptions()
    assert {"WriteError", "CollectError", "PackageRefused", "QueueFull"} <= set(exceptions)
    for name, exception in exceptions.items():
        assert issubclass(exception, EvaluatorError), name
        assert exception.__module__ == "evaluator.errors", name  # defined in one place


def test_the_tree_in_the_docstring_names_every_error() -> None:
    assert errors.__doc__ is not None
    drawn = set(re.findall(r"^\s*(?:[│├└─ ]*)(\w+)\s", errors.__doc__, re.MULTILINE))
    assert set(errors.__all__) <= drawn
