"""Memory plan: where each node's data lives at run time.

Leaves live in the graph's value store (params, consts); inputs and param
gradients in the program's persistent io slots; views alias their source; every other node gets an offset in
the arena.  (This first planner gives each node its own region; the liveness
planner replaces it.)
"""
import numpy as np
from numba import njit

from .ir import LOC_ARENA, LOC_IO, LOC_STORE
from .registry import INPUT, LAST_LEAF
from .ops.shape import RESHAPE

ALIGN = 16      # elements; arena offsets are 64-byte aligned in float32


@njit(cache=True)
def _aligned(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


@njit(cache=True)
def plan_memory(G, n_nodes, order, io_nodes):
    """(loc, off, arena_elems, io_elems) for the nodes of ``order``.

    ARENA and IO offsets index the run buffer [arena | io]; STORE offsets the
    graph's value store."""
    op, src, ndim, shape, ip, fp, flags, origin, rule = G
    loc = np.zeros(n_nodes, np.int8)
    off = np.zeros(n_nodes, np.int64)
    persistent = np.zeros(n_nodes, np.uint8)
    for n in io_nodes:
        persistent[n] = 1
    arena = 0
    io = 0
    for t in range(order.size):
        n = order[t]
        code = op[n]
        size = shape[n, 0] * shape[n, 1] * shape[n, 2] * shape[n, 3]
        if code == INPUT or persistent[n]:
            loc[n] = LOC_IO
            off[n] = io
            io = _aligned(io + size)
        elif code <= LAST_LEAF:
            loc[n] = LOC_STORE
            off[n] = ip[n, 0]
        elif code == RESHAPE:
            s = src[n, 0]
            loc[n] = loc[s]
            off[n] = off[s]
        else:
            loc[n] = LOC_ARENA
            off[n] = arena
            arena = _aligned(arena + size)
    for t in range(order.size):       # io slots follow the arena in the run buffer
        n = order[t]
        if loc[n] == LOC_IO and op[n] != RESHAPE:
            off[n] += arena
    for t in range(order.size):
        n = order[t]
        if op[n] == RESHAPE:
            off[n] = off[src[n, 0]]
    return loc, off, arena, io
