"""Child processes that import *this* jitgraph, whatever their ``sys.path`` says.

jitgraph starts Python processes of its own (the compile helpers, compiler.py) and Ray
actors (the data-parallel workers, distributed.py).  They must load the very package
folder the parent loaded: a second copy has another cache key (its compiled code would go
to a folder the parent never reads) and may be another version.  ``sys.path`` cannot be
trusted for that: ``python -m`` and ``python -c`` put the current folder first, and Ray
puts the driver's current folder first in every worker, so from a clone's root a child
would import the clone's ``jitgraph/`` instead of the installed one.

So children never look jitgraph up on ``sys.path``: :func:`load_package` loads the
package from its folder by path, and everything imported from it afterwards resolves
through that package.  This module imports only the standard library, so that Ray can
ship its functions to a worker by value (``ship_by_value``) before any jitgraph exists
there.
"""
import importlib
import importlib.util
import os
import pickle
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def load_package(folder: str):
    """Import the jitgraph package held in ``folder`` as ``jitgraph``, or return it if it
    is already imported from there.  A jitgraph imported from elsewhere is dropped first;
    a folder that does not exist (a Ray worker on another machine) falls back to a plain
    import: that node's own jitgraph."""
    init = os.path.join(folder, "__init__.py")
    have = sys.modules.get("jitgraph")
    if have is not None and os.path.dirname(os.path.abspath(getattr(have, "__file__", "") or "")) == folder:
        return have
    if not os.path.isfile(init):
        return importlib.import_module("jitgraph")
    for name in [m for m in sys.modules if m == "jitgraph" or m.startswith("jitgraph.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location("jitgraph", init, submodule_search_locations=[folder])
    assert spec is not None and spec.loader is not None       # a .py file always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["jitgraph"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["jitgraph"]
        raise
    return module


def child_argv(entry: str, *args: str) -> list:
    """argv of a Python process that imports this jitgraph and exits with
    ``entry(list(args))``, ``entry`` a "module:function" of the package.  ``-P`` keeps
    this file's folder off sys.path (so nothing there shadows numpy or numba); the
    process runs this module as its script (below)."""
    return [sys.executable, "-P", os.path.abspath(__file__), entry, *args]


def actor_class(pickled_class: bytes, name: str, methods: tuple, folder: str = PACKAGE_DIR):
    """A stand-in, to hand to ``ray.remote``, for the class pickled in ``pickled_class``
    (by Ray's cloudpickle): its constructor loads the jitgraph at ``folder`` first, then
    unpickles the class -- so its references to jitgraph resolve to that package -- builds
    the real object and forwards ``methods`` to it.  Shipped by value (``ship_by_value``),
    the stand-in needs no jitgraph to unpickle."""
    def __init__(self, *args, **kwargs):
        load_package(folder)
        self._impl = pickle.loads(pickled_class)(*args, **kwargs)

    def forward(method):
        def call(self, *args, **kwargs):
            return getattr(self._impl, method)(*args, **kwargs)
        call.__name__ = call.__qualname__ = method
        return call

    body = {"__init__": __init__, "__doc__": f"{name}, loaded with the jitgraph of {folder}"}
    body.update((m, forward(m)) for m in methods)
    return type(name, (), body)


def ship_by_value(pickler) -> None:
    """Have ``pickler`` (Ray's cloudpickle) send this module's functions by value."""
    pickler.register_pickle_by_value(sys.modules[__name__])


if __name__ == "__main__":          # a child of child_argv: python -P _boot.py module:function ARGS...
    load_package(PACKAGE_DIR)
    target, _, function = sys.argv[1].partition(":")
    sys.exit(getattr(importlib.import_module(target), function)(sys.argv[2:]))
