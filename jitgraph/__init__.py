"""jitgraph: computation graphs compiled with Numba -- build, run, differentiate,
checkpoint.  See README.md for a tour."""
from .checkpoint import checkpoint, pareto
from .errors import GraphError
from .gradcheck import GradCheckResult, GradientCheckError, check_grads
from .graph import Graph, Tensor
from .io import load, save
from .ops import (abs_ as abs, add, broadcast_to, concat, copy, cross_entropy, div, dropout,
                  embedding, exp, gelu, layer_norm, log, log_softmax, matmul, max_ as max, mean,
                  mul, neg, pad_axis, relu, reshape, rms_norm, scale, sigmoid, silu, slice_axis,
                  softmax, sqr, sqrt, sub, sum_ as sum, tanh, transpose)
from . import optim
from .viz import plot_memory, plot_pareto
from .train import batches, train
from .program import BackwardGraph, ForwardGraph, build_backward, build_forward, grad

__version__ = "0.1.0"

__all__ = [
    "GraphError", "Graph", "Tensor", "save", "load", "optim", "plot_memory", "plot_pareto", "train", "batches", "checkpoint", "pareto", "check_grads", "GradCheckResult", "GradientCheckError", "ForwardGraph", "BackwardGraph", "build_forward", "build_backward", "grad",
    "abs", "add", "broadcast_to", "concat", "copy", "cross_entropy", "div", "dropout",
    "embedding", "exp", "gelu", "layer_norm", "log", "log_softmax", "matmul", "max", "mean",
    "mul", "neg", "pad_axis", "relu", "reshape", "rms_norm", "scale", "sigmoid", "silu",
    "slice_axis", "softmax", "sqr", "sqrt", "sub", "sum", "tanh", "transpose",
]
