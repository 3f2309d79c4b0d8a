"""The docstrings matplotlib's import makes, as code a child interpreter runs.

Shared by ``test_artist_docs.py`` (an interpreter outside any sandbox) and
``test_matplotlib_caches.py`` (a warm sandbox and a cold one): both compare what a plain
import of pyplot makes with what an import answered from the artist tables makes.
"""

from __future__ import annotations

#: Defines ``matplotlib_docs()``: for each module of matplotlib's loaded, the docstring (and
#: signature, where one is set) of the module, of each function, class and property it holds
#: and of each of those classes' members, by dotted name. Not pyplot's functions of its backend,
#: which ``switch_backend`` sets (the prelude's, in a sandbox), nor the values modules keep,
#: whose "docstring" is their type's; addresses blanked.
DOCSTRINGS = r"""
def matplotlib_docs():
    import re, sys
    backend = ("show", "new_figure_manager", "draw_if_interactive")
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(("matplotlib", "mpl_toolkits")):
            continue
        docs = found[name] = {name: str(module.__doc__)}
        for key, value in list(vars(module).items()):
            if name == "matplotlib.pyplot" and key in backend:
                continue
            items = [(f"{name}.{key}", value)]
            if isinstance(value, type):
                items += [(f"{name}.{key}.{m}", i) for m, i in list(vars(value).items())]
            for path, item in items:
                if callable(item) or isinstance(item, property):
                    docs[path] = re.sub(r"0x[0-9a-f]+", "0x", str(item.__doc__))
                    signature = getattr(item, "__signature__", None)
                    if signature is not None:
                        docs[f"{path}()"] = re.sub(r"0x[0-9a-f]+", "0x", str(signature))
    return found
"""
