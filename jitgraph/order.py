"""Execution order: the nodes a set of results needs, sources before consumers
(ggml_build_forward_expand).  An iterative post-order DFS whose visited set is
the typed-array hash set."""
import numpy as np
from numba import njit

from ._hashtable import INSERTED, hs_add, ht_new
from .ir import MAX_SRC
from .status import ERR_BAD_NODE, OK


@njit(cache=True)
def extend_order(src, n_nodes, prefix, roots):
    """(status, order): ``prefix`` (an order already valid on its own), then every
    ancestor of ``roots`` not in it, each after its sources, each node's unvisited
    sources in slot order right before it (post-order DFS).

    status 0 is OK; ERR_BAD_NODE if a root or source id is outside [0, n_nodes)
    (then ``order[0]`` is that id).  Sources need not have smaller ids than their
    consumers: the checkpoint rewrite points backward nodes at later-appended copies.
    """
    order = np.empty(n_nodes, np.int64)
    stack = np.empty(n_nodes, np.int64)       # each node is pushed at most once
    child = np.empty(n_nodes, np.int64)       # next source slot to look at
    visited = ht_new(n_nodes)                 # sized for every node: never FULL
    count = 0
    for n in prefix:
        hs_add(visited, n)
        order[count] = n
        count += 1
    for r in roots:
        if r < 0 or r >= n_nodes:
            order[0] = r
            return ERR_BAD_NODE, order[:1]
        if hs_add(visited, r) != INSERTED:
            continue
        stack[0] = r
        child[0] = 0
        sp = 1
        while sp > 0:
            node = stack[sp - 1]
            c = child[sp - 1]
            pushed = False
            while c < MAX_SRC:
                s = src[node, c]
                c += 1
                if s < 0:
                    break
                if s >= n_nodes:
                    order[0] = s
                    return ERR_BAD_NODE, order[:1]
                if hs_add(visited, s) == INSERTED:
                    child[sp - 1] = c
                    stack[sp] = s
                    child[sp] = 0
                    sp += 1
                    pushed = True
                    break
            if not pushed:
                sp -= 1
                order[count] = node
                count += 1
    return OK, order[:count]


@njit(cache=True)
def topo_order(src, n_nodes, roots):
    """(status, order): every ancestor of ``roots`` once, each after its sources."""
    return extend_order(src, n_nodes, np.empty(0, np.int64), roots)


@njit(cache=True)
def needed_backward(src, flags, n_nodes, grad_roots, is_forward, recomputed_flag):
    """The backward nodes (not forward, not recomputed copies) the gradient roots
    need, ascending.  A backward node's sources are older backward nodes, forward
    nodes or copies, and a copy's sources are older copies or forward nodes, so two
    sweeps down the ids mark everything (no DFS needed)."""
    mark = np.zeros(n_nodes, np.uint8)
    for r in grad_roots:
        mark[r] = 1
    for phase in range(2):                    # 0: backward nodes, 1: recomputed copies
        for n in range(n_nodes - 1, -1, -1):
            if not mark[n] or is_forward[n] or (phase == 0) == bool(flags[n] & recomputed_flag):
                continue
            for k in range(MAX_SRC):
                s = src[n, k]
                if s < 0:
                    break
                mark[s] = 1
    count = 0
    for n in range(n_nodes):
        if mark[n] and not is_forward[n] and not (flags[n] & recomputed_flag):
            count += 1
    out = np.empty(count, np.int64)
    k = 0
    for n in range(n_nodes):
        if mark[n] and not is_forward[n] and not (flags[n] & recomputed_flag):
            out[k] = n
            k += 1
    return out


@njit(cache=True)
def sink_order(src, n_nodes, order, start, immortal):
    """``order`` with each node from position ``start`` on moved down to right before its
    first consumer, as far as that shortens its own lifetime without lengthening a
    source's: never past a source's last other reader (``immortal`` sources, the
    leaves, never die and do not hold a node back).  No buffer lives longer, so no
    step's live set grows: a gradient made early and read after a recomputed stretch
    (the backward of a layer whose forward is recomputed) is made after it instead."""
    m = order.size
    last = np.full(n_nodes, -1, np.int64)       # the latest position reading each node
    prev = np.full(n_nodes, -1, np.int64)       # the latest before that
    for t in range(m):
        n = order[t]
        for k in range(MAX_SRC):
            s = src[n, k]
            if s < 0:
                break
            if last[s] != t:
                prev[s] = last[s]
                last[s] = t
    first_use = np.full(n_nodes, m, np.int64)   # the earliest (new) position of a consumer
    target = np.arange(m)
    for t in range(m - 1, -1, -1):
        n = order[t]
        if t >= start and last[n] >= 0:
            to = first_use[n]
            for k in range(MAX_SRC):
                s = src[n, k]
                if s < 0:
                    break
                if not immortal[s]:
                    to = min(to, t if last[s] == t else last[s])
            target[t] = max(to, t)
        for k in range(MAX_SRC):
            s = src[n, k]
            if s < 0:
                break
            first_use[s] = min(first_use[s], target[t])
    # stable counting sort by target (in [0, m]): ties keep their order; no sort template to compile
    count = np.zeros(m + 2, np.int64)
    for t in range(m):
        count[target[t] + 1] += 1
    for v in range(1, m + 2):
        count[v] += count[v - 1]
    out = np.empty(m, order.dtype)
    for t in range(m):
        out[count[target[t]]] = order[t]
        count[target[t]] += 1
    return out
