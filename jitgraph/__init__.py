"""jitgraph: computation graphs compiled with Numba -- build, run, differentiate,
checkpoint.  See README.md for a tour."""
from . import _cache  # noqa: F401  -- first: the compiled-code cache folder, before anything is jitted
from . import ops, optim
from .autodiff import build_backward, grad, pareto
from .checkpoint import checkpoint
from .errors import GraphError
from .gradcheck import GradCheckResult, GradientCheckError, check_grads
from .graph import Graph, Tensor
from .io import load, save
from .ops import *    # noqa: F401,F403  -- the op functions (jg.relu, jg.matmul ...), from the op table
from .program import BackwardGraph, ForwardGraph, build_forward
from .train import batches, train
from .viz import plot_memory, plot_pareto

__version__ = "0.2.0.dev0"

__all__ = [
    "Graph", "Tensor", "GraphError", "build_forward", "build_backward", "grad", "ForwardGraph", "BackwardGraph",
    "checkpoint", "pareto", "check_grads", "GradCheckResult", "GradientCheckError", "save", "load", "optim",
    "train", "batches", "plot_memory", "plot_pareto",
]
__all__ += ops.__all__
