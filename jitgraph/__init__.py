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
from .ops import (binary as _binary, compare as _compare, conv as _conv, elementary as _elementary, gather as _gather, linear as _linear, norm as _norm, pool as _pool, reduce as _reduce,
                  shape as _shape, softmaxes as _softmaxes, stochastic as _stochastic, unary as _unary)
from .ops.attention import __all__ as _attention_all
from .ops.attention import *   # noqa: F401,F403
from .ops.binary import *      # noqa: F401,F403  -- the op functions (jg.relu ...): each family's __all__
from .ops.compare import *     # noqa: F401,F403
from .ops.conv import *        # noqa: F401,F403
from .ops.elementary import *  # noqa: F401,F403
from .ops.gather import *      # noqa: F401,F403
from .ops.linear import *      # noqa: F401,F403
from .ops.norm import *        # noqa: F401,F403
from .ops.pool import *        # noqa: F401,F403
from .ops.reduce import *      # noqa: F401,F403
from .ops.shape import *       # noqa: F401,F403
from .ops.softmaxes import *   # noqa: F401,F403
from .ops.stochastic import *  # noqa: F401,F403
from .ops.unary import *       # noqa: F401,F403
from .ops import batchnorm as _batchnorm
from .ops.batchnorm import *   # noqa: F401,F403
from .program import BackwardGraph, ForwardGraph, build_forward
from .threads import get_num_threads, set_num_threads
from .train import batches, train
from .viz import plot_memory, plot_pareto

__version__ = "0.2.0.dev0"

__all__ = [
    "Graph", "Tensor", "GraphError", "build_forward", "build_backward", "grad", "ForwardGraph", "BackwardGraph",
    "checkpoint", "pareto", "check_grads", "GradCheckResult", "GradientCheckError", "save", "load", "optim",
    "train", "batches", "plot_memory", "plot_pareto", "set_num_threads", "get_num_threads",
]
__all__ += _attention_all
__all__ += _binary.__all__
__all__ += _compare.__all__
__all__ += _conv.__all__
__all__ += _elementary.__all__
__all__ += _gather.__all__
__all__ += _linear.__all__
__all__ += _norm.__all__
__all__ += _pool.__all__
__all__ += _reduce.__all__
__all__ += _shape.__all__
__all__ += _softmaxes.__all__
__all__ += _stochastic.__all__
__all__ += _unary.__all__
__all__ += _batchnorm.__all__
