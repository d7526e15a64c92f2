"""What a node costs to recompute, from the op table: flops and cost classes.

An op declares ``flops`` per element of its output (or of its input, if larger),
or ``DOT`` for a contraction, which records its contracted length in
``ip[DOT_K]`` (2 * output elements * that length).  Its cost class says whether
its result is worth keeping (``compute``) or cheap to recompute (``memory``).
"""
import numpy as np
from numba import njit

from . import registry
from .ir import F_LEAF, MAX_SRC, numel
from .registry import DOT, DOT_K


@njit(cache=True)
def node_flops(G, n, flops):
    """Recompute-cost estimate of node n (``flops``: registry.table("flops"))."""
    out = numel(G.shape, n)
    f = flops[G.op[n]]
    if f == DOT:
        return 2 * out * G.ip[n, DOT_K]
    s = G.src[n, 0]
    if s >= 0:
        inp = numel(G.shape, s)
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
            size[t] = numel(G.shape, n)
            flops[t] = node_flops(G, n, flops_table)
    return saved, cut, size, flops


MAX_REMAT_DEPTH = 3       # a value not worth saving is remade through at most this many unsaved ones
REMAT_MIN_ELEMENTS = 1 << 16   # remat="auto": only tensors this big (256 KiB of float32) are worth it;
                               # smaller savings would only add nodes to the backward graph
REMAKE_FLOPS = 16         # a row kernel that maps rows to rows at most this dear per element (a layer
                          # norm, a softmax) costs what gelu does: measured, ns per element alike
COPY, MAP = 1, 2          # remake_table: memory-bound (any shape); a cheap row kernel (same size as source 0)


def remake_table() -> np.ndarray:
    """Per opcode: COPY for the memory-bound cost class, MAP for the compute-bound ops that are
    no contraction and cost at most REMAKE_FLOPS per element (cheap when they map source 0's
    elements one to one: not_worth_saving checks the sizes), else 0."""
    memory, compute, flops = registry.table("memory"), registry.table("compute"), registry.table("flops")
    return np.where(memory == 1, COPY, np.where((compute == 1) & (flops != DOT) & (flops <= REMAKE_FLOPS), MAP, 0))


@njit(cache=True)
def _cheap(G, n, remake):
    """Is computed node n cheap to make twice: memory-bound, or a cheap row kernel mapping its
    first source's elements one to one?"""
    return remake[G.op[n]] == COPY or (remake[G.op[n]] == MAP and G.src[n, 0] >= 0 and
                                       numel(G.shape, n) == numel(G.shape, G.src[n, 0]))


@njit(cache=True)
def _depth_from(G, n, alive, depth):
    """Cheap steps (``depth``) to remake node n's sources from ``alive`` tensors: the deepest
    over the sources not alive, 0 if all are, -1 if one cannot be remade."""
    d = 0
    for k in range(MAX_SRC):
        u = G.src[n, k]
        if u < 0:
            break
        if not alive[u]:
            if depth[u] < 0:
                return -1
            d = max(d, depth[u])
    return d


AGAIN, ON_THE_WAY = 1, 2   # copied_again: copied afresh for backward; copied afresh to make one of those


@njit(cache=True)
def copied_again(G, order, saved, keep, remake, kinds, view_kind, min_elements):
    """Per node id: AGAIN for the recomputed tensors worth a second copy for their backward
    reads (rewrite.py's ``remake``) -- not kept, read by backward (``saved``), of
    ``min_elements`` or more, cheap (``remake``: remake_table's), and made from what stays
    alive for backward anyway (leaves, kept tensors, tensors backward reads) through at most
    MAX_REMAT_DEPTH cheap steps, which are ON_THE_WAY (the batch norm between a convolution
    and its relu) -- so a second copy holds no source longer than its own readers would."""
    n_ids = keep.size
    live = np.zeros(n_ids, np.uint8)           # alive for backward anyway
    depth = np.full(n_ids, -1, np.int64)       # cheap steps to make it from live tensors; -1: never
    out = np.zeros(n_ids, np.uint8)
    for n in order:
        leaf = G.flags[n] & F_LEAF
        view = kinds[G.op[n]] == view_kind
        live[n] = 1 if leaf or keep[n] or saved[n] or (view and live[G.src[n, 0]]) else 0
        if leaf or keep[n] or not (view or _cheap(G, n, remake)):
            continue
        d = _depth_from(G, n, live, depth)
        if d < 0:
            continue
        depth[n] = d if view else d + 1
        if saved[n] and not view and depth[n] <= MAX_REMAT_DEPTH and numel(G.shape, n) >= min_elements:
            out[n] = AGAIN
    for t in range(order.size - 1, -1, -1):   # what making them again goes through
        n = order[t]
        if out[n] == 0:
            continue
        for k in range(MAX_SRC):
            u = G.src[n, k]
            if u < 0:
                break
            if not live[u] and out[u] == 0:
                out[u] = ON_THE_WAY
    return out


@njit(cache=True)
def not_worth_saving(G, n_nodes, order, saved, keep, remake, kinds, view_kind, min_elements):
    """Mask of the forward nodes a plan keeping ``keep`` should recompute instead: cheap
    (``remake``: an elementwise op, a copy, a padding, a norm), read by the backward pass, and remade from what
    the backward pass keeps anyway (leaves, kept tensors it reads) through at most
    MAX_REMAT_DEPTH memory-bound steps -- recomputed where the backward pass reads it, such a
    node's bytes leave the saved set and nothing new stays alive, for a few memory-bound
    passes (torch.compile's partitioner makes the same trade).  A view follows its source.
    Only a saved tensor of ``min_elements`` or more is dropped (the unsaved ones a remake goes
    through are dropped whatever their size).  ``saved``: analyze_forward's."""
    live = np.zeros(n_nodes, np.uint8)          # kept and read by backward, views followed to their buffers
    for t in range(order.size - 1, -1, -1):
        n = order[t]
        if keep[n] and (saved[n] or live[n]):
            live[n] = 1
            if kinds[G.op[n]] == view_kind and G.src[n, 0] >= 0:
                live[G.src[n, 0]] = 1
    depth = np.full(n_nodes, -1, np.int64)      # memory-bound steps to remake it from live tensors; -1: never
    drop = np.zeros(n_nodes, np.uint8)
    alive = ((G.flags[:n_nodes] & F_LEAF) != 0).astype(np.uint8)   # leaves, and live tensors not dropped
    for t in range(order.size):
        n = order[t]
        if G.flags[n] & F_LEAF:
            continue
        alive[n] = live[n]                   # drops are final: a reader sees its sources' verdicts
        view = kinds[G.op[n]] == view_kind
        if not (view or _cheap(G, n, remake)):
            continue
        d = _depth_from(G, n, alive, depth)
        if d < 0:
            continue
        depth[n] = d if view else d + 1
        if depth[n] <= MAX_REMAT_DEPTH and (not live[n] or numel(G.shape, n) >= min_elements):
            drop[n] = 1                      # unsaved ones too: a remake must not read the forward copy
            alive[n] = 0
    return drop


@njit(cache=True)
def node_costs_flops(G, n_nodes, order, flops):
    """Per node id: the recompute flops of the computed nodes of ``order`` (views and leaves 0)."""
    out = np.zeros(n_nodes, np.int64)
    for n in order:
        if not (G.flags[n] & F_LEAF):
            out[n] = node_flops(G, n, flops)
    return out
