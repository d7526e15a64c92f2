"""jitgraph: computation graphs compiled with Numba -- build, run, differentiate,
checkpoint.  See README.md for a tour."""
import gc
import importlib
import os
from typing import TYPE_CHECKING, Any, Callable

# Numba's typing tables are about a million objects that live as long as the process, and
# every full collection walks them all (~40 ms): during this import, in a long training run,
# and at exit, where Python collects several times (0.2 s of a small script's wall time on
# a 2-core AMD EPYC Zen 4).  So the collector is off while jitgraph imports, and what exists
# then is frozen out of later collections (gc.freeze, Python's pattern for long-lived
# state; objects made afterwards are collected as usual).  JITGRAPH_GC_FREEZE=0 leaves the
# collector alone.
_FREEZE = os.environ.get("JITGRAPH_GC_FREEZE", "1").strip() != "0"
_COLLECTING = gc.isenabled()
if _FREEZE:
    gc.disable()
try:
    from . import _target  # noqa: F401  -- first: the vector width, before Numba sets up its code generator
    from . import _blas_probe  # noqa: F401  -- Numba's BLAS check without importing scipy.linalg (0.2 s)
    from . import _cache  # noqa: F401  -- the compiled-code cache folder, before anything is jitted
    from . import ops, optim  # noqa: F401  -- importing ops declares every op in the op table
    from .autodiff import build_backward, grad, pareto, plans
    from .segments import checkpoint
    from .errors import GraphError
    from .gradcheck import GradCheckResult, GradientCheckError, check_grads
    from .graph import Graph, Tensor, public_builders
    from .io import load, save
    from .program import BackwardGraph, ForwardGraph, build_forward
    from .threads import get_num_threads, set_num_threads
    from . import schedules  # noqa: F401  -- learning-rate schedules for train(lr=...)
    from .train import EarlyStopping, History, batches, evaluate, train
    from .viz import plot_memory, plot_pareto
finally:
    if _FREEZE:
        gc.freeze()
        if _COLLECTING:
            gc.enable()

# Imported on first use (PEP 562), so a process that only builds and runs graphs does not
# pay for them: the layers and the PyTorch importer.  (Not the training loop: its module is
# named like its function, and importing jitgraph.train would rebind jg.train to the module.)
if TYPE_CHECKING:
    from . import nn
    from .importer import Imported, from_torch
_LAZY = {"nn": (".nn", None), "Imported": (".importer", "Imported"), "from_torch": (".importer", "from_torch")}

__version__ = "0.2.0.dev0"

__all__ = [
    "Graph", "Tensor", "GraphError", "build_forward", "build_backward", "grad", "ForwardGraph", "BackwardGraph",
    "checkpoint", "pareto", "plans", "check_grads", "GradCheckResult", "GradientCheckError", "save", "load", "optim", "nn", "from_torch", "Imported",
    "train", "batches", "evaluate", "EarlyStopping", "History", "schedules", "plot_memory", "plot_pareto", "set_num_threads", "get_num_threads",
]
globals().update(public_builders())     # jitgraph.relu, jitgraph.matmul ...: read from the op table
__all__ += sorted(public_builders())


def __getattr__(name: str) -> Callable[..., Tensor]:
    """The lazily imported names above, on first use.  For type checkers: the op builders
    are set from the op table at import, so mypy sees any other name as a callable
    returning a Tensor; at run time an unknown name is an AttributeError as usual."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        found: Any = importlib.import_module(module, __name__)
        if attr is not None:
            found = getattr(found, attr)
        globals()[name] = found
        return found
    raise AttributeError(f"module 'jitgraph' has no attribute {name!r}")
