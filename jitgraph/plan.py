"""Memory plan: where each node's data lives at run time (ggml's graph
allocator, without its fixed limits).

Over the execution order:

* params and consts stay in the graph's value store; inputs and param
  gradients get persistent io slots after the arena (never overwritten);
* a view (reshape) aliases its source, and keeps the source alive as long as
  the view is read;
* every other node gets an offset in one arena, chosen best-fit from a free
  list whose neighbouring blocks merge; a buffer returns to the free list right
  after its last reader; then the same buffers, with the same lifetimes, are packed
  again largest first (``_pack``), and that packing is kept when its high-water mark is
  lower (best fit in execution order can leave holes a later, larger buffer cannot use);
* an elementwise node (or a row kernel that reads a row before writing it, such
  as softmax: ``defop(overwrites=True)``) may write in place over a source that
  dies at that node and has its size.

The arena's high-water mark is ``peak_bytes``, and ``run()`` allocates exactly
that.  The plan is a pure function of the graph and the order, so the same
network always gets the same plan.
"""
import numpy as np
from numba import njit, types

from . import registry
from ._sigs import ST, i64, on_first_use
from .ir import F_RECOMPUTED, LOC_ARENA, LOC_IO, LOC_STORE, MAX_SRC, numel
from .order import extend_order, needed_backward, sink_order
from .registry import INPUT, LeafIP

ALIGN = 16      # elements: arena offsets are 64-byte aligned in float32
NEVER = np.iinfo(np.int64).max
K_LEAF, K_VIEW = registry.KINDS.index(registry.LEAF), registry.KINDS.index(registry.VIEW)


@njit(cache=True)
def _aligned(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


@njit(cache=True)
def _size(shape, n):
    """Elements node n occupies in the arena (aligned)."""
    return _aligned(numel(shape, n))


# ---- the free list: blocks sorted by offset, neighbours always merged -------------------
@on_first_use(types.UniTuple(i64, 3)(ST, ST, i64, i64, i64))
def _take(fl_off, fl_size, nfree, top, size):
    """Best fit of ``size``; returns (offset, nfree, top).  Without a fitting
    block, a free block touching the top is extended, else the top grows."""
    best = -1
    for i in range(nfree):
        if fl_size[i] >= size and (best < 0 or fl_size[i] < fl_size[best]):
            best = i
    if best >= 0:
        off = fl_off[best]
        if fl_size[best] == size:
            for j in range(best, nfree - 1):
                fl_off[j] = fl_off[j + 1]
                fl_size[j] = fl_size[j + 1]
            nfree -= 1
        else:
            fl_off[best] += size
            fl_size[best] -= size
        return off, nfree, top
    if nfree > 0 and fl_off[nfree - 1] + fl_size[nfree - 1] == top:
        off = fl_off[nfree - 1]          # the last block grows into fresh space
        nfree -= 1
        return off, nfree, off + size
    return top, nfree, top + size


@on_first_use(types.UniTuple(i64, 2)(ST, ST, i64, i64, i64, i64))
def _give(fl_off, fl_size, nfree, top, off, size):
    """Return a block; merges with its neighbours and gives back the top."""
    i = 0
    while i < nfree and fl_off[i] < off:
        i += 1
    for j in range(nfree, i, -1):
        fl_off[j] = fl_off[j - 1]
        fl_size[j] = fl_size[j - 1]
    fl_off[i] = off
    fl_size[i] = size
    nfree += 1
    if i + 1 < nfree and fl_off[i] + fl_size[i] == fl_off[i + 1]:      # merge right
        fl_size[i] += fl_size[i + 1]
        for j in range(i + 1, nfree - 1):
            fl_off[j] = fl_off[j + 1]
            fl_size[j] = fl_size[j + 1]
        nfree -= 1
    if i > 0 and fl_off[i - 1] + fl_size[i - 1] == fl_off[i]:           # merge left
        fl_size[i - 1] += fl_size[i]
        for j in range(i, nfree - 1):
            fl_off[j] = fl_off[j + 1]
            fl_size[j] = fl_size[j + 1]
        nfree -= 1
    if nfree > 0 and fl_off[nfree - 1] + fl_size[nfree - 1] == top:    # the top recedes
        top = fl_off[nfree - 1]
        nfree -= 1
    return nfree, top


MAX_PACKED = 4096          # buffers: above it the packing's pairwise scan costs more than it saves


@njit(cache=True)
def _pack(start, end, size):
    """Offsets for buffers alive over steps [start, end] (inclusive: one freed after step t
    and one taken at step t overlap), placed largest first, each in the smallest gap the
    buffers placed already leave in its lifetime (else above them): "greedy by size"
    (Pisarchyk & Lee, 2020), which leaves fewer holes than best fit in execution order.
    Returns (offsets, high-water mark).

    Both orders are kept by insertion (nb <= MAX_PACKED, and the placement scan is
    quadratic anyway): a general sort is a template Numba compiles for a second on a cold start."""
    nb = size.size
    # largest first; among equal sizes the longer-lived first; then by index (insert after equals)
    by_size = np.empty(nb, np.int64)
    for b in range(nb):
        i = b
        while i > 0:
            a = by_size[i - 1]
            if size[a] > size[b] or (size[a] == size[b] and end[a] - start[a] >= end[b] - start[b]):
                break
            by_size[i] = a
            i -= 1
        by_size[i] = b
    offs = np.zeros(nb, np.int64)
    placed = np.empty(nb, np.int64)           # by offset, equal offsets in placement order
    n_placed = 0
    high = 0
    for b in by_size:
        best, best_gap, top = -1, np.iinfo(np.int64).max, 0
        for j in range(n_placed):
            p = placed[j]
            if start[p] <= end[b] and start[b] <= end[p]:      # alive together
                gap = offs[p] - top
                if gap >= size[b] and gap < best_gap:
                    best, best_gap = top, gap
                if offs[p] + size[p] > top:
                    top = offs[p] + size[p]
        offs[b] = best if best >= 0 else top
        if offs[b] + size[b] > high:
            high = offs[b] + size[b]
        i = n_placed
        while i > 0 and offs[placed[i - 1]] > offs[b]:
            placed[i] = placed[i - 1]
            i -= 1
        placed[i] = b
        n_placed += 1
    return offs, high


@njit(cache=True)
def plan_memory(G, n_nodes, order, io_nodes, keep_nodes, in_place, kinds, overwrites):
    """Plan ``order`` (``kinds``, ``overwrites``: registry.table("kind"), table("overwrites")).  ``io_nodes`` get persistent io slots (param gradients);
    ``keep_nodes`` stay alive to the end (outputs).  Returns
    (loc, off, arena_elems, io_elems, n_in_place, free_at, free_off, free_size, alloc_size)
    where free_at[t]..free_at[t+1] index the arena blocks freed after step t and
    alloc_size[t] is what step t took from the arena (0 for in-place and views)."""
    op, src, shape, ip = G.op, G.src, G.shape, G.ip
    m = order.size
    loc = np.zeros(n_nodes, np.int8)
    off = np.zeros(n_nodes, np.int64)
    root = np.empty(n_nodes, np.int64)        # the node owning the buffer (views alias)
    last = np.full(n_nodes, -1, np.int64)     # position of the last read of each owner
    persist = np.zeros(n_nodes, np.uint8)
    for n in io_nodes:
        persist[n] = 1
    # 1. owners and last readers
    for t in range(m):
        n = order[t]
        root[n] = root[src[n, 0]] if kinds[op[n]] == K_VIEW else n
        for k in range(MAX_SRC):
            s = src[n, k]
            if s < 0:
                break
            r = root[s]
            if last[r] < t:
                last[r] = t
    for n in keep_nodes:
        last[root[n]] = NEVER
    # 2. walk the order, allocating and freeing
    fl_off = np.empty(m + 2, np.int64)        # at most one free block per allocation, plus one
    fl_size = np.empty(m + 2, np.int64)
    nfree = 0
    top = 0
    peak = 0
    io = 0
    n_in_place = 0
    free_at = np.zeros(m + 1, np.int64)
    free_off = np.empty(m, np.int64)
    free_size = np.empty(m, np.int64)
    alloc_size = np.zeros(m, np.int64)
    nev = 0
    # each arena buffer: its first and last step and size (for the packing below); an
    # in-place node shares its source's buffer
    buf = np.full(n_nodes, -1, np.int64)
    b_start = np.empty(m, np.int64)
    b_end = np.full(m, m, np.int64)             # never freed: alive to the end
    b_size = np.empty(m, np.int64)
    free_buf = np.empty(m, np.int64)
    nbuf = 0
    for t in range(m):
        n = order[t]
        code = op[n]
        kind = kinds[code]
        size = _size(shape, n)
        reused = -1
        if code == INPUT or persist[n]:
            loc[n] = LOC_IO
            off[n] = io
            io += size
        elif kind == K_LEAF:
            loc[n] = LOC_STORE
            off[n] = ip[n, LeafIP.offset]
        elif kind == K_VIEW:
            s = src[n, 0]
            loc[n] = loc[s]
            off[n] = off[s]
        else:
            loc[n] = LOC_ARENA
            if in_place and overwrites[code]:
                for k in range(MAX_SRC):
                    s = src[n, k]
                    if s < 0:
                        break
                    r = root[s]
                    # the exact element count: a broadcast source can share an aligned size
                    if last[r] == t and loc[r] == LOC_ARENA and numel(shape, r) == numel(shape, n):
                        reused = r
                        break
            if reused >= 0:
                off[n] = off[reused]
                buf[n] = buf[reused]
                n_in_place += 1
            else:
                off[n], nfree, top = _take(fl_off, fl_size, nfree, top, size)
                alloc_size[t] = size
                buf[n] = nbuf
                b_start[nbuf] = t
                b_size[nbuf] = size
                nbuf += 1
                if top > peak:
                    peak = top
        # free the owners whose last reader this is (once each, unless n took the buffer)
        for k in range(MAX_SRC):
            s = src[n, k]
            if s < 0:
                break
            r = root[s]
            if last[r] != t or loc[r] != LOC_ARENA or r == reused:
                continue
            seen = False
            for j in range(k):
                if root[src[n, j]] == r:
                    seen = True
            if not seen:
                nfree, top = _give(fl_off, fl_size, nfree, top, off[r], _size(shape, r))
                free_off[nev] = off[r]
                free_size[nev] = _size(shape, r)
                free_buf[nev] = buf[r]
                b_end[buf[r]] = t
                nev += 1
        if last[n] == -1 and loc[n] == LOC_ARENA and kind != K_VIEW:      # nobody reads it
            nfree, top = _give(fl_off, fl_size, nfree, top, off[n], size)
            free_off[nev] = off[n]
            free_size[nev] = size
            free_buf[nev] = buf[n]
            b_end[buf[n]] = t
            nev += 1
        free_at[t + 1] = nev
    if 1 < nbuf <= MAX_PACKED:
        packed, packed_peak = _pack(b_start[:nbuf], b_end[:nbuf], b_size[:nbuf])
        if packed_peak < peak:                # fewer holes than the walk's best fit left: take it
            peak = packed_peak
            for t in range(m):
                n = order[t]
                if loc[n] == LOC_ARENA and kinds[op[n]] != K_VIEW:
                    off[n] = packed[buf[n]]
            for e in range(nev):
                free_off[e] = packed[free_buf[e]]
    for t in range(m):                        # io slots follow the arena in the run buffer
        n = order[t]
        if loc[n] == LOC_IO and kinds[op[n]] != K_VIEW:
            off[n] += peak
    for t in range(m):
        n = order[t]
        if kinds[op[n]] == K_VIEW:
            off[n] = off[src[n, 0]]
    return loc, off, peak, io, n_in_place, free_at, free_off[:nev], free_size[:nev], alloc_size


def backward_orders(G, n_nodes, fwd_order, grad_roots, is_forward):
    """The candidate execution orders of a backward program, both starting with the
    forward order: (1) the backward nodes the gradients need in the order the
    expansion created them -- each accumulation right after its contribution, so
    gradient temporaries die at once (params shared by many layers) -- and (2) a
    DFS from each gradient root in turn.  In both, recomputed copies are pulled in
    by the DFS right before their first consumer -- and (3) the first with each backward
    node sunk to its first consumer where that shortens a lifetime (``sink_order``).
    None if a node id is bad."""
    created = needed_backward(G.src, G.flags, n_nodes, grad_roots, is_forward, F_RECOMPUTED)
    status_a, by_creation = extend_order(G.src, n_nodes, fwd_order, created)
    status_b, by_roots = extend_order(G.src, n_nodes, fwd_order, grad_roots)
    if status_a or status_b:
        return None
    leaves = (registry.table("kind")[G.op[:n_nodes]] == K_LEAF).astype(np.uint8)
    return [by_creation, by_roots, sink_order(G.src, n_nodes, by_creation, fwd_order.size, leaves)]
