"""The jitted interpreter: one loop over the execution order, calling each node's
runner through the runner table (see native.py).

Every node's data is a contiguous slice of the program's run buffer
([arena | io]) or of the graph's value store, at the offset the memory plan gave
it.  Original and recomputed nodes run the same runners, which is why a
checkpointed backward pass is bit-identical to a plain one.  The loop holds no
Python objects, so it runs without the GIL: programs run concurrently from
several Python threads, each with its own run buffer.
"""
import numpy as np
from numba import njit

from .compiler import SKIP
from .native import RUN_DETAIL, call_runner, data_pointer, run_context
from .status import ERR_NOT_COMPILED, OK


@njit(cache=True, nogil=True)
def run_nodes(G, order, loc, off, mem, store, salt, runners, natives):
    """Run nodes ``order`` in sequence.  Returns (status, node, detail); status 0 is OK.
    ``salt`` is added to every dropout seed (fresh masks per training step, the same
    for a node and its recomputed copy within one run); ``runners`` and ``natives`` come
    from compiler.py."""
    ctx = run_context(G, loc, off, mem, store, salt, natives)
    ctx_p = data_pointer(ctx)
    mem_p = data_pointer(mem)
    store_p = data_pointer(store)
    for t in range(order.size):
        n = order[t]
        fn = runners[G.op[n]]
        if fn == SKIP:                   # leaves and views: no kernel
            continue
        if fn == 0:
            return ERR_NOT_COMPILED, n, G.op[n]
        status = call_runner(fn, n, ctx_p, mem_p, store_p)
        if status != OK:
            return status, n, ctx[RUN_DETAIL]
    return OK, -1, 0


@njit(cache=True, nogil=True)
def run_nodes_debug(G, order, loc, off, mem, store, salt, runners, natives, arena_elems, free_at, free_off,
                    free_size):
    """run_nodes, poisoning memory: the arena starts as NaN and every block the
    plan frees is refilled with NaN right away, so a read after free shows up."""
    for i in range(arena_elems):
        mem[i] = np.nan
    for t in range(order.size):
        status, node, detail = run_nodes(G, order[t:t + 1], loc, off, mem, store, salt, runners, natives)
        if status:
            return status, node, detail
        for e in range(free_at[t], free_at[t + 1]):
            for i in range(free_off[e], free_off[e] + free_size[e]):
                mem[i] = np.nan
    return OK, -1, 0
