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
