"""Execution order: the nodes a set of results needs, sources before consumers
(ggml_build_forward_expand).  An iterative post-order DFS whose visited set is
the typed-array hash set."""
import numpy as np
from numba import njit

from ._hashtable import INSERTED, hs_add, ht_new
from .ir import MAX_SRC

ERR_BAD_NODE = 2


@njit(cache=True)
def topo_order(src, n_nodes, roots):
    """(status, order): every ancestor of ``roots`` once, each after its sources,
    each node's unvisited sources in slot order right before it.

    status 0 is OK; ERR_BAD_NODE if a root or source id is outside [0, n_nodes)
    (then ``order[0]`` is that id).  Sources need not have smaller ids than their
    consumers: the checkpoint rewrite points backward nodes at later-appended copies.
    """
    order = np.empty(n_nodes, np.int64)
    stack = np.empty(n_nodes, np.int64)       # each node is pushed at most once
    child = np.empty(n_nodes, np.int64)       # next source slot to look at
    visited = ht_new(n_nodes)                 # sized for every node: never FULL
    count = 0
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
    return 0, order[:count]


@njit(cache=True)
def backward_order(src, flags, n_nodes, loss, grad_roots, is_forward, recomputed_flag):
    """(status, order) of a backward program: the forward part first (DFS from the
    loss), then the backward nodes the param gradients need, in the order the
    expansion created them -- each accumulation right after its contribution, so
    gradient temporaries die at once (params shared by many layers) -- with
    recomputed copies pulled in by the DFS right before their first consumer.
    The alternative is ``topo_order`` from [loss] + gradient roots (a DFS per
    gradient); the planner keeps whichever peaks lower."""
    roots = np.empty(grad_roots.size + 1, np.int64)
    roots[0] = loss
    roots[1:] = grad_roots
    status, needed = topo_order(src, n_nodes, roots)
    if status:
        return status, needed
    mark = np.zeros(n_nodes, np.uint8)
    count = 0
    for t in range(needed.size):
        n = needed[t]
        if not is_forward[n] and not (flags[n] & recomputed_flag):
            mark[n] = 1
            count += 1
    roots2 = np.empty(count + 1, np.int64)
    roots2[0] = loss
    k = 1
    for n in range(n_nodes):
        if mark[n]:
            roots2[k] = n
            k += 1
    return topo_order(src, n_nodes, roots2)
