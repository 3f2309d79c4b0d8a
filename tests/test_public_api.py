"""Each package's public surface: what ``__all__`` names exists, and nothing is left out."""

from __future__ import annotations

import importlib
import inspect

import pytest


@pytest.mark.parametrize(
    "name", ["python_mcp_server", "gateway", "snekbox_client", "plotting", "evaluator", "serving"]
)
def test_all_names_exist_and_public_classes_are_listed(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, item) for item in exported)
    defined_here = {
        item
        for item, value in vars(module).items()
        # isidentifier: pydantic registers parametrized generics such as "Context[Any, Any]"
        # in the namespace of the module that first uses them.
        if item.isidentifier()
        and not item.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and (value.__module__ or "").startswith(name)
    }
    assert defined_here <= exported, defined_here - exported
