"""What a node costs to recompute, from the op table: flops and cost classes.

An op declares ``flops`` per element of its output (or of its input, if larger),
or ``DOT`` for a contraction, which records its contracted length in
``ip[DOT_K]`` (2 * output elements * that length).  Its cost class says whether
its result is worth keeping (``compute``) or cheap to recompute (``memory``).
"""
import numpy as np
from numba import njit

from . import registry
from .ir import F_LEAF, MAX_SRC
from .registry import DOT, DOT_K


@njit(cache=True)
def node_flops(G, n, flops):
    """Recompute-cost estimate of node n (``flops``: registry.table("flops"))."""
    out = G.shape[n, 0] * G.shape[n, 1] * G.shape[n, 2] * G.shape[n, 3]
    f = flops[G.op[n]]
    if f == DOT:
        return 2 * out * G.ip[n, DOT_K]
    s = G.src[n, 0]
    if s >= 0:
        inp = G.shape[s, 0] * G.shape[s, 1] * G.shape[s, 2] * G.shape[s, 3]
        if inp > out:
            out = inp
    return out * f


@njit(cache=True)
def sum_flops(G, ids, flops):
    total = 0
    for n in ids:
        total += node_flops(G, n, flops)
    return total


def total_flops(G, ids: np.ndarray) -> int:
    """Recompute flops of nodes ``ids``."""
    return int(sum_flops(G, np.asarray(ids, np.int64), registry.table("flops")))


def compute_bound(ops: np.ndarray) -> np.ndarray:
    """Mask over opcodes ``ops``: the ones in the compute-bound cost class."""
    return registry.table("compute")[ops] == 1


@njit(cache=True)
def analyze_forward(G, n_nodes, order, first_backward, end_backward, flops_table, kinds, view_kind):
    """Per forward node: saved (read by the plain backward pass), narrow point
    (every earlier computed node is last read at or before it), size in elements,
    and recompute flops."""
    m = order.size
    saved = np.zeros(n_nodes, np.uint8)
    for n in range(first_backward, end_backward):
        for k in range(MAX_SRC):
            s = G.src[n, k]
            if s < 0:
                break
            if s < n_nodes:
                saved[s] = 1
    pos = np.full(n_nodes, -1, np.int64)
    for t in range(m):
        pos[order[t]] = t
    last = np.full(m, -1, np.int64)          # by position: last forward reader
    for t in range(m):
        n = order[t]
        for k in range(MAX_SRC):
            s = G.src[n, k]
            if s < 0:
                break
            if pos[s] >= 0 and last[pos[s]] < t:
                last[pos[s]] = t
    cut = np.zeros(m, np.uint8)
    size = np.zeros(m, np.int64)
    flops = np.zeros(m, np.int64)
    reach = -1
    for t in range(m):
        n = order[t]
        computed = not (G.flags[n] & F_LEAF) and kinds[G.op[n]] != view_kind
        if computed and reach <= t:
            cut[t] = 1
        if computed and last[t] > reach:
            reach = last[t]
        if computed:
            size[t] = G.shape[n, 0] * G.shape[n, 1] * G.shape[n, 2] * G.shape[n, 3]
            flops[t] = node_flops(G, n, flops_table)
    return saved, cut, size, flops
