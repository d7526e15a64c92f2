"""jitgraph: computation graphs compiled with Numba -- build, run, differentiate,
checkpoint.  See README.md for a tour."""
from .errors import GraphError
from .graph import Graph, Tensor
from .ops import (abs_ as abs, add, broadcast_to, concat, copy, cross_entropy, div, dropout,
                  embedding, exp, gelu, layer_norm, log, log_softmax, matmul, max_ as max, mean,
                  mul, neg, pad_axis, relu, reshape, rms_norm, scale, sigmoid, silu, slice_axis,
                  softmax, sqr, sqrt, sub, sum_ as sum, tanh, transpose)
from .program import ForwardGraph, build_forward

__version__ = "0.1.0"

__all__ = [
    "GraphError", "Graph", "Tensor", "ForwardGraph", "build_forward",
    "abs", "add", "broadcast_to", "concat", "copy", "cross_entropy", "div", "dropout",
    "embedding", "exp", "gelu", "layer_norm", "log", "log_softmax", "matmul", "max", "mean",
    "mul", "neg", "pad_axis", "relu", "reshape", "rms_norm", "scale", "sigmoid", "silu",
    "slice_axis", "softmax", "sqr", "sqrt", "sub", "sum", "tanh", "transpose",
]
