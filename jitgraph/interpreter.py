"""The jitted interpreter: one loop over the execution order, dispatching on the
opcode to the op families' kernels.  Every node's data is a contiguous slice of
the program's run buffer ([arena | io]) or of the graph's value store, at the
offset the memory plan gave it.  A computed node always writes to the run buffer,
so only sources need the two-way choice (each merge of two arrays costs a
reference count, which is most of the per-node overhead on tiny tensors).  Original and recomputed nodes run the same kernels, which is why a
checkpointed backward pass is bit-identical to a plain one.
"""
import numpy as np
from numba import njit

from .ir import LOC_STORE
from .ops.elementwise import BINARY_FIRST, BINARY_LAST, UNARY_FIRST, UNARY_LAST, binary_kernel, unary_kernel
from .ops.matmul import MATMUL, matmul_kernel
from .ops.nn import (CROSS_ENTROPY, DROPOUT, EMBEDDING, ERR_INDEX, LAYER_NORM, LOG_SOFTMAX, NORM_RSTD,
                     RMS_NORM, SCATTER_ADD, SOFTMAX, cross_entropy_kernel, dropout_kernel, embedding_kernel,
                     norm_kernel, norm_rstd_kernel, scatter_add_kernel, softmax_kernel)
from .ops.reduce import (BROADCAST, MAX, MAX_MASK, MEAN, SUM, broadcast_kernel, max_kernel, max_mask_kernel,
                         sum_kernel)
from .registry import LAST_LEAF
from .ops.shape import CONCAT, PAD, RESHAPE, SLICE, TRANSPOSE, block_copy, outer_inner, transpose_kernel

OK = 0
ERR_UNKNOWN_OP = 1


@njit(cache=True, inline="always")
def _data(mem, store, loc, off, shape, n):
    size = shape[n, 0] * shape[n, 1] * shape[n, 2] * shape[n, 3]
    o = off[n]
    if loc[n] == LOC_STORE:
        return store[o:o + size]
    return mem[o:o + size]


@njit(cache=True, error_model="numpy")
def run_nodes(G, order, loc, off, mem, store, salt):
    """Run nodes ``order`` in sequence.  Returns (status, node, detail); status 0 is OK.
    ``salt`` is added to every dropout seed (fresh masks per training step, the same
    for a node and its recomputed copy within one run)."""
    op, src, ndim, shape, ip, fp, flags, origin, rule = G
    for t in range(order.size):
        n = order[t]
        code = op[n]
        if code <= LAST_LEAF or code == RESHAPE:
            continue
        o = off[n]
        out = mem[o:o + shape[n, 0] * shape[n, 1] * shape[n, 2] * shape[n, 3]]
        s0 = src[n, 0]
        x = _data(mem, store, loc, off, shape, s0)
        if code >= UNARY_FIRST and code <= UNARY_LAST:
            unary_kernel(code, out, x, fp[n, 0], fp[n, 1])
        elif code >= BINARY_FIRST and code <= BINARY_LAST:
            s1 = src[n, 1]
            binary_kernel(code, out, x, _data(mem, store, loc, off, shape, s1), shape, n, s0, s1)
        elif code == MATMUL:
            s1 = src[n, 1]
            matmul_kernel(out, x, _data(mem, store, loc, off, shape, s1),
                          shape[n], shape[s0], shape[s1], ip[n, 0], ip[n, 1])
        elif code == SUM:
            sum_kernel(out, x, shape[s0], ip[n, 0], 1.0)
        elif code == MEAN:
            sum_kernel(out, x, shape[s0], ip[n, 0], fp[n, 0])
        elif code == MAX:
            max_kernel(out, x, shape[s0], ip[n, 0])
        elif code == BROADCAST:
            broadcast_kernel(out, x, shape[n], ip[n, 0])
        elif code == MAX_MASK:
            max_mask_kernel(out, x, shape[s0], ip[n, 0])
        elif code == SOFTMAX:
            softmax_kernel(out, x, shape[s0], ip[n, 0], False)
        elif code == LOG_SOFTMAX:
            softmax_kernel(out, x, shape[s0], ip[n, 0], True)
        elif code == CROSS_ENTROPY:
            cross_entropy_kernel(out, x, _data(mem, store, loc, off, shape, src[n, 1]), shape[s0])
        elif code == LAYER_NORM:
            norm_kernel(out, x, shape[s0], fp[n, 0], True)
        elif code == RMS_NORM:
            norm_kernel(out, x, shape[s0], fp[n, 0], False)
        elif code == NORM_RSTD:
            norm_rstd_kernel(out, x, shape[s0], fp[n, 0], ip[n, 0] != 0)
        elif code == DROPOUT:
            dropout_kernel(out, x, fp[n, 0], ip[n, 0] + salt, ip[n, 1])
        elif code == TRANSPOSE:
            transpose_kernel(out, x, shape[s0], ip[n])
        elif code == CONCAT:
            axis = ip[n, 0]
            outer, inner = outer_inner(shape[n], axis)
            total = shape[n, axis] * inner
            start = 0
            for k in range(4):
                s = src[n, k]
                if s < 0:
                    break
                run = shape[s, axis] * inner
                block_copy(out, total, start, _data(mem, store, loc, off, shape, s), run, 0, outer, run)
                start += run
        elif code == SLICE:
            axis = ip[n, 0]
            outer, inner = outer_inner(shape[n], axis)
            run = shape[n, axis] * inner
            block_copy(out, run, 0, x, shape[s0, axis] * inner, ip[n, 1] * inner, outer, run)
        elif code == PAD:
            axis = ip[n, 0]
            outer, inner = outer_inner(shape[n], axis)
            for i in range(out.size):
                out[i] = 0.0
            run = shape[s0, axis] * inner
            block_copy(out, shape[n, axis] * inner, ip[n, 1] * inner, x, run, 0, outer, run)
        elif code == EMBEDDING:
            s1 = src[n, 1]
            bad = embedding_kernel(out, x, _data(mem, store, loc, off, shape, s1),
                                   shape[s0, 2], shape[s0, 3])
            if bad >= 0:
                return ERR_INDEX, n, bad
        elif code == SCATTER_ADD:
            s1 = src[n, 1]
            bad = scatter_add_kernel(out, x, _data(mem, store, loc, off, shape, s1),
                                     shape[n, 2], shape[n, 3])
            if bad >= 0:
                return ERR_INDEX, n, bad
        else:
            return ERR_UNKNOWN_OP, n, code
    return OK, -1, 0


@njit(cache=True)
def run_nodes_debug(G, order, loc, off, mem, store, salt, arena_elems, free_at, free_off, free_size):
    """run_nodes, poisoning memory: the arena starts as NaN and every block the
    plan frees is refilled with NaN right away, so a read after free shows up."""
    for i in range(arena_elems):
        mem[i] = np.nan
    for t in range(order.size):
        status, node, detail = run_nodes(G, order[t:t + 1], loc, off, mem, store, salt)
        if status:
            return status, node, detail
        for e in range(free_at[t], free_at[t + 1]):
            for i in range(free_off[e], free_off[e] + free_size[e]):
                mem[i] = np.nan
    return OK, -1, 0
