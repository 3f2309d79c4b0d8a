"""The support module's import hooks: matplotlib gets the capturing backend, ``linecache``
the user's source, whenever they are imported.

Part of the support module (see ``_support.py``): the prelude's ``sys.meta_path`` finder hands
the names it watches to :func:`find_spec`.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.
# ruff: noqa: SIM105

import sys

from ._figures import BACKEND_MODULE, define_backend
from ._tracebacks import register_source

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
else:
    Loader = object  # importlib.abc may not be loaded: the type matters to mypy only


def find_spec(
    finder: object, fullname: str, path: "Sequence[str] | None", target: "ModuleType | None"
) -> "ModuleSpec | None":
    """The prelude's ``sys.meta_path`` finder, for the names it watches.

    * ``_mcp_backend``: the figure-capturing backend, built in memory;
    * ``matplotlib``: once loaded, that backend becomes its default, before anything could
      resolve the default to another backend (unless the user chose one: ``MPLBACKEND``);
    * ``matplotlib.pyplot``: just before it loads, the same again (it overrides the user's
      ``matplotlib.use("Agg")``, the usual way of saying "there is no display"), and once
      loaded, a later switch to Agg is a switch to that backend (see :func:`_guard_agg`);
    * ``linecache``: once loaded, it learns the user's source.

    What was imported before the prelude ran gets the same from :func:`adopt_matplotlib` and
    the prelude's own call of :func:`register_source`.
    """
    if fullname == BACKEND_MODULE:
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _BackendLoader(), origin="<mcp>")
    if fullname == "matplotlib":
        return _spec_then(finder, fullname, path, target, _select_backend)
    if fullname == "matplotlib.pyplot":
        _select_backend(sys.modules.get("matplotlib"))
        return _spec_then(finder, fullname, path, target, _guard_agg)
    if fullname == "linecache":
        return _spec_then(finder, fullname, path, target, register_source)
    return None


def adopt_matplotlib() -> None:
    """What the import hooks would have done, for a matplotlib imported before the prelude ran.

    An interpreter kept warm imports matplotlib (and pyplot, after ``matplotlib.use("Agg")``)
    before it is given the run: the capturing backend becomes the default as if the hooks had
    seen those imports, and a pyplot that already resolved its backend switches to it (it has
    no figure yet: the code has not run).
    """
    matplotlib = sys.modules.get("matplotlib")
    _select_backend(matplotlib)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return  # the hook on its import will do the rest
    _guard_agg(pyplot)
    backend = "module://" + BACKEND_MODULE
    try:
        rc = getattr(matplotlib, "rcParams", None)
        if pyplot._backend_mod is not None and rc is not None and rc._get("backend") == backend:
            pyplot.switch_backend(backend)
    except Exception:  # then figures are still saved when the run ends
        pass


def _spec_then(
    finder: object,
    fullname: str,
    path: "Sequence[str] | None",
    target: "ModuleType | None",
    hook: "Callable[[ModuleType], None]",
) -> "ModuleSpec | None":
    """The spec the other finders give, with ``hook(module)`` run after loading it."""
    for other in sys.meta_path:
        other_find_spec = getattr(other, "find_spec", None)
        if other is finder or other_find_spec is None:
            continue
        spec: ModuleSpec | None = other_find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None:
                spec.loader = _LoaderThen(spec.loader, hook)
            return spec
    return None


class _LoaderThen(Loader):
    """Delegates to ``loader``, runs ``hook`` after ``exec_module``, then steps aside."""

    def __init__(self, loader: "Loader", hook: "Callable[[ModuleType], None]") -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self._loader.create_module(spec)

    def exec_module(self, module: "ModuleType") -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        try:
            self._hook(module)
        except Exception:  # a hook must never break the user's import
            pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


class _BackendLoader(Loader):
    def create_module(self, spec: "ModuleSpec") -> None:
        return None

    def exec_module(self, module: "ModuleType") -> None:
        define_backend(module)


def _select_backend(matplotlib: "ModuleType | None") -> None:
    """Make the capturing backend matplotlib's unless the user chose another one than Agg."""
    rc = getattr(matplotlib, "rcParams", None)
    if rc is None:
        return
    try:
        current = rc._get("backend")  # read without triggering the default's resolution
        # Not a str: the "auto" sentinel. Agg is what scripts pick to say "no display".
        if not isinstance(current, str) or current.lower() == "agg":
            rc["backend"] = "module://" + BACKEND_MODULE
    except Exception:  # then pyplot picks a backend itself; open figures are saved at exit
        pass


def _guard_agg(pyplot: "ModuleType") -> None:
    """Make pyplot's switches to Agg switches to the capturing backend.

    ``matplotlib.use("Agg")`` once pyplot is loaded, or a backend set to Agg and resolved on the
    first figure, both go through ``pyplot.switch_backend()``: Agg there is also what scripts
    pick to say "there is no display", and the capturing backend draws with Agg. Any other
    backend is the user's choice, and switched to.
    """
    switch = pyplot.switch_backend
    if getattr(switch, "_mcp_guard", False):
        return

    def switch_backend(newbackend: str) -> None:
        if isinstance(newbackend, str) and newbackend.lower() == "agg":
            newbackend = "module://" + BACKEND_MODULE
        switch(newbackend)

    switch_backend._mcp_guard = True  # type: ignore[attr-defined]
    switch_backend.__wrapped__ = switch  # type: ignore[attr-defined]
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(switch_backend, name, getattr(switch, name, None))
    setattr(pyplot, "switch_backend", switch_backend)  # noqa: B010 (a module's, untyped)
