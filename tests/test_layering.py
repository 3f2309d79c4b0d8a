"""The layering of DESIGN.md, read from the source: imports run one way, downward.

::

    python_mcp_server (face) -> gateway -> snekbox_client (wire format)
                                   |  (evaluator injected at start, through a few modules)
                                   v
                               evaluator -> snekbox_client
                                   |  (keeps the prelude resident for the gateway's runs)
                                   v
                               plotting (RESIDENT_DIR, prelude_digest, write_resident)
    both services -> serving (shared plumbing: settings, h11/ASGI guards)
    plotting: runs in the sandbox, the standard library only

Every module of every package is parsed with :mod:`ast`, never imported (importing would run
code and could hide an import behind another that fails first); relative imports are resolved
to absolute names. Imports under ``if TYPE_CHECKING:`` and inside functions count too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("gateway", "evaluator", "snekbox_client", "plotting", "serving")
FACE = "python_mcp_server"
PROJECT = (*PACKAGES, FACE)

#: The gateway modules that may name the evaluator (the service is injected at start, so few
#: need to): only names ``evaluator/__init__.py`` exports, never its modules.
GATEWAY_MODULES_NAMING_THE_EVALUATOR = frozenset(
    {
        "gateway.connection",  # builds the service from the settings: in-process or HTTP
        # The gateway's settings hold the evaluator's own (EVALUATOR_*) declaration.
        "gateway.settings",
    }
)
#: What the prelude's modules, which run inside the sandbox before the user's code, may import
#: besides the standard library: matplotlib, whose figures they capture (loaded only when the
#: user's code has imported it).
SANDBOX_MAY_IMPORT = frozenset({"matplotlib"})
#: What the evaluator takes of plotting: it keeps the prelude resident for the gateway's runs,
#: and its warm sandboxes load it ahead.
EVALUATOR_TAKES_OF_PLOTTING = frozenset(
    {"RESIDENT_DIR", "WARM_PATH", "prelude_digest", "write_resident"}
)
#: plotting's own ``__init__`` runs in the gateway (it builds the request): the wire format too.
PLOTTING_HOST_MAY_IMPORT = frozenset({"snekbox_client"})


@dataclass(frozen=True)
class Import:
    """One import statement's target, in the module that holds it."""

    module: str  # the importing module, dotted
    target: str  # the module imported, dotted and absolute
    names: tuple[str, ...]  # for ``from target import a, b``: the names; else empty
    line: int

    @property
    def top(self) -> str:
        return self.target.partition(".")[0]

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.module}:{self.line} imports {self.target}{names}"


def modules(package: str) -> Iterator[tuple[str, Path]]:
    """Every module of ``package`` (or the face, a lone file), with its dotted name."""
    if package == FACE:
        yield FACE, ROOT / f"{FACE}.py"
        return
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(package: str) -> list[Import]:
    """Every import in ``package``'s modules, relative ones made absolute."""
    found = []
    for name, path in modules(package):
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [Import(name, alias.name, (), node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = name.split(".")
                base = parts[: len(parts) - node.level + is_package] if node.level else []
                names = tuple(alias.name for alias in node.names)
                if node.module is None:  # ``from .. import a, b``: modules a and b
                    found += [Import(name, ".".join([*base, n]), (), node.lineno) for n in names]
                else:
                    target = ".".join([*base, node.module])
                    found.append(Import(name, target, names, node.lineno))
    return found


def exported(package: str) -> frozenset[str]:
    """The names in ``package``'s ``__all__``, read from its ``__init__.py``."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def against(package: str, forbidden: set[str]) -> list[str]:
    return [str(i) for i in imports(package) if i.top in forbidden]


def test_every_package_is_parsed() -> None:
    for package in PROJECT:
        assert dict(modules(package)), package
    assert any(i.top == "serving" for i in imports("evaluator"))  # the parse finds imports


@pytest.mark.parametrize("package", PACKAGES)
def test_nothing_imports_the_face(package: str) -> None:
    assert against(package, {FACE}) == []


def test_the_evaluator_never_imports_the_gateway() -> None:
    assert against("evaluator", {"gateway", FACE}) == []


def test_the_evaluator_takes_of_plotting_only_the_resident_prelude() -> None:
    wrong = [
        str(i)
        for i in imports("evaluator")
        if i.top == "plotting"
        and (i.target != "plotting" or not set(i.names) <= EVALUATOR_TAKES_OF_PLOTTING)
    ]
    assert wrong == []
    assert any(i.top == "plotting" for i in imports("evaluator"))


def test_the_wire_format_imports_no_other_part() -> None:
    assert against("snekbox_client", set(PROJECT) - {"snekbox_client"}) == []


def test_the_shared_plumbing_imports_neither_service() -> None:
    assert against("serving", set(PROJECT) - {"serving"}) == []


def test_the_gateway_names_the_evaluator_through_its_exports_only() -> None:
    allowed = exported("evaluator")
    wrong = [
        str(i)
        for i in imports("gateway")
        if i.top == "evaluator"
        and (
            i.module not in GATEWAY_MODULES_NAMING_THE_EVALUATOR
            or i.target != "evaluator"
            or not set(i.names) <= allowed
        )
    ]
    assert wrong == []


def test_plotting_imports_the_standard_library_only() -> None:
    stdlib = sys.stdlib_module_names
    wrong = []
    for i in imports("plotting"):
        if i.top in stdlib or i.top == "plotting" or i.top == "__future__":
            continue
        allowed = PLOTTING_HOST_MAY_IMPORT if i.module == "plotting" else SANDBOX_MAY_IMPORT
        if i.top not in allowed:
            wrong.append(str(i))
    assert wrong == []


def test_relative_imports_are_resolved() -> None:
    # evaluator/__main__.py: ``from .config import EvaluatorConfig``; gateway/__init__.py:
    # ``from .app import ...``.
    targets = {(i.module, i.target) for i in imports("evaluator") + imports("gateway")}
    assert ("evaluator.__main__", "evaluator.config") in targets
    assert ("gateway", "gateway.app") in targets
