"""The jitted interpreter: one loop over the execution order, calling each node's
runner through the runner table (see native.py).

Every node's data is a contiguous slice of the program's run buffer
([arena | io]) or of the graph's value store, at the offset the memory plan gave
it.  Original and recomputed nodes run the same runners, which is why a
checkpointed backward pass is bit-identical to a plain one.

Threads: a node of at least ``PARALLEL_MIN`` elements whose op can be split
(registry ``split``) is cut into blocks of a fixed number of units -- about
``threads.BLOCK`` elements each, a function of the node's shape only -- and Numba's
threads run the blocks, through the block runner: a parallel C callback compiled
(or loaded) only for programs that have such a node, so a small graph's first run
does not wait for Numba's parallel machinery (~1.5 s to compile).  Every unit is computed by one runner call whatever the
thread count, so results do not depend on it.  The loop holds no Python objects
and runs without the GIL: programs run concurrently from several Python threads,
each with its own run buffer.
"""
import threading

import numpy as np
from numba import cfunc, from_dtype, njit, prange, types

from .compiler import SKIP
from .ir import numel
from .native import RUN_DETAIL, RUN_EXTENT, call_blocks, call_runner, data_pointer, run_context
from .registry import CUSTOM, ELEMENTS, NONE, ROWS, SPLITS
from .status import ERR_NOT_COMPILED, OK
from .threads import BLOCK

PARALLEL_MIN = 2 * BLOCK          # smaller nodes run in one call
S_NONE, S_ELEMENTS, S_ROWS, S_CUSTOM = (SPLITS.index(s) for s in (NONE, ELEMENTS, ROWS, CUSTOM))


def _in_blocks(fn, n, extent, per_block, ctx_p, mem_p, store_p):
    """Units [0, extent) of node n in blocks of ``per_block``, over the threads; the
    worst status of any block."""
    n_blocks = (extent + per_block - 1) // per_block
    status = np.zeros(n_blocks, np.int64)
    for b in prange(n_blocks):
        lo = b * per_block
        status[b] = call_runner(fn, n, lo, min(lo + per_block, extent), ctx_p, mem_p, store_p)
    return status.max()


_block_runners: dict = {}        # dtype name -> the compiled CFunc
_block_lock = threading.Lock()


def block_runner(dtype) -> int:
    """The address of the block runner for ``dtype`` (compiled or loaded on first use)."""
    dtype = np.dtype(dtype)
    with _block_lock:
        if dtype.name not in _block_runners:
            i64, t = types.int64, from_dtype(dtype)
            sig = i64(i64, i64, i64, i64, types.CPointer(i64), types.CPointer(t), types.CPointer(t))
            _block_runners[dtype.name] = cfunc(sig, cache=True, parallel=True)(_in_blocks)
        return _block_runners[dtype.name].address


def needs_blocks(G, order, split) -> bool:
    """Has the program ``order`` a node the interpreter splits into blocks?  The test
    run_nodes makes, over all nodes at once."""
    shape = G.shape
    size = shape[order].prod(axis=1)
    s0 = G.src[order, 0]
    size = np.maximum(size, np.where(s0 >= 0, shape[np.maximum(s0, 0)].prod(axis=1), 0))
    return bool(np.any((split[G.op[order]] != S_NONE) & (size >= PARALLEL_MIN)))


@njit(cache=True, nogil=True)
def run_nodes(G, order, loc, off, mem, store, salt, runners, natives, split, blocks, groups, chunks):
    """Run nodes ``order`` in sequence.  Returns (status, node, detail); status 0 is OK.
    ``salt`` is added to every dropout seed (fresh masks per training step, the same
    for a node and its recomputed copy within one run); ``runners`` and ``natives`` come
    from compiler.py, ``split`` is registry.table("split"), ``blocks`` is the address of
    the block runner (0 if ``needs_blocks`` said no), ``groups`` the program's group code
    (fuse.py) and ``chunks`` the chunk runners its groups call (compiler.tables)."""
    ctx = run_context(G, loc, off, mem, store, salt, natives, runners, chunks, groups)
    ctx_p = data_pointer(ctx)
    mem_p = data_pointer(mem)
    store_p = data_pointer(store)
    for t in range(order.size):
        n = order[t]
        code = G.op[n]
        fn = runners[code]
        if fn == SKIP:                   # leaves and views: no kernel
            continue
        if fn == 0:
            return ERR_NOT_COMPILED, n, code
        size = numel(G.shape, n)
        s0 = G.src[n, 0]
        if s0 >= 0:
            size = max(size, numel(G.shape, s0))     # a reduction's work is its input's size
        how = split[code]
        if how == S_NONE or size < PARALLEL_MIN:
            status = call_runner(fn, n, 0, -1, ctx_p, mem_p, store_p)
        elif blocks == 0:                # never: the program asks for the block runner when it has such a node
            return ERR_NOT_COMPILED, n, code
        else:
            if how == S_ELEMENTS:
                extent = numel(G.shape, n)
            elif how == S_ROWS:
                extent = numel(G.shape, n) // G.shape[n, 3]
            else:                        # the runner says how many units it has
                call_runner(fn, n, -1, -1, ctx_p, mem_p, store_p)
                extent = ctx[RUN_EXTENT]
            per_block = max(1, BLOCK * extent // size)
            status = call_blocks(blocks, fn, n, extent, per_block, ctx_p, mem_p, store_p)
        if status != OK:
            return status, n, ctx[RUN_DETAIL]
    return OK, -1, 0


@njit(cache=True, nogil=True)
def run_nodes_debug(G, order, loc, off, mem, store, salt, runners, natives, split, blocks, groups, chunks,
                    arena_elems, free_at, free_off, free_size):
    """run_nodes, poisoning memory: the arena starts as NaN and every block the
    plan frees is refilled with NaN right away, so a read after free shows up."""
    for i in range(arena_elems):
        mem[i] = np.nan
    for t in range(order.size):
        status, node, detail = run_nodes(G, order[t:t + 1], loc, off, mem, store, salt, runners, natives, split,
                                         blocks, groups, chunks)
        if status:
            return status, node, detail
        for e in range(free_at[t], free_at[t + 1]):
            for i in range(free_off[e], free_off[e] + free_size[e]):
                mem[i] = np.nan
    return OK, -1, 0
