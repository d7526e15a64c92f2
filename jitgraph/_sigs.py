"""Explicit Numba signatures for small helpers that jitted code calls with
constants.

Numba compiles a jitted callee once per *literal* argument value it is called
with from jitted code (every opcode constant passed to ``new_node`` was a fresh
compile: 31 of them, several seconds of cold start).  A declared signature
compiles each helper once; literal arguments are converted to it.
"""
from numba import types, typeof

from .ir import NodeTable

G = typeof(NodeTable(16).arrays())        # the node table tuple handed to jitted passes
i64 = types.int64
f64 = types.float64
ST = types.Array(types.int64, 1, "C")     # a pass's [count, capacity] state, or an int64 row

# Float kernels keep lazy compilation: a signature would compile them for both
# dtypes at import, and their few literal specializations (constant strides)
# are fast code worth having.
