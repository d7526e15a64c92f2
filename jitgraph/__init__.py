"""jitgraph: computation graphs compiled with Numba -- build, run, differentiate,
checkpoint.  See README.md for a tour."""
from typing import Callable

from . import _target  # noqa: F401  -- first: the vector width, before Numba sets up its code generator
from . import _blas_probe  # noqa: F401  -- Numba's BLAS check without importing scipy.linalg (0.2 s)
from . import _cache  # noqa: F401  -- the compiled-code cache folder, before anything is jitted
from . import ops, optim  # noqa: F401  -- importing ops declares every op in the op table
from . import nn  # noqa: F401  -- layers with PyTorch's names (jitgraph.nn)
from .autodiff import build_backward, grad, pareto, plans
from .segments import checkpoint
from .errors import GraphError
from .gradcheck import GradCheckResult, GradientCheckError, check_grads
from .graph import Graph, Tensor, public_builders
from .importer import Imported, from_torch
from .io import load, save
from .program import BackwardGraph, ForwardGraph, build_forward
from .threads import get_num_threads, set_num_threads
from . import schedules  # noqa: F401  -- learning-rate schedules for train(lr=...)
from .train import EarlyStopping, History, batches, evaluate, train
from .viz import plot_memory, plot_pareto

__version__ = "0.2.0.dev0"

__all__ = [
    "Graph", "Tensor", "GraphError", "build_forward", "build_backward", "grad", "ForwardGraph", "BackwardGraph",
    "checkpoint", "pareto", "plans", "check_grads", "GradCheckResult", "GradientCheckError", "save", "load", "optim", "nn", "from_torch", "Imported",
    "train", "batches", "evaluate", "EarlyStopping", "History", "schedules", "plot_memory", "plot_pareto", "set_num_threads", "get_num_threads",
]
globals().update(public_builders())     # jitgraph.relu, jitgraph.matmul ...: read from the op table
__all__ += sorted(public_builders())


def __getattr__(name: str) -> Callable[..., Tensor]:
    """Only for type checkers: the op builders above are set from the op table at import,
    so mypy sees them as callables returning a Tensor.  At run time an unknown name is an
    AttributeError as usual."""
    raise AttributeError(f"module 'jitgraph' has no attribute {name!r}")
