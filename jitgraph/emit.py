"""Appending nodes from jitted passes (backward expansion, checkpoint rewrite).

``G`` is the node table's tuple of arrays (see ir.py) and ``st`` an int64[2]
state array: st[0] = node count, st[1] = capacity.  A pass checks that a step's
worst case fits before taking it and otherwise returns to Python, which doubles
the table and resumes the pass -- arrays are never rebound inside a hot loop.
"""
from numba import njit

from ._sigs import G as G_T, ST, i64
from .ir import MAX_DIMS, N_FP, N_IP

RULE_ACCUMULATE = -2     # rule of an add summing two gradient contributions
RULE_COPY = -3           # rule of the copy that gives a param gradient its own buffer
RULE_ZERO = -4           # an explicit zero a gradient starts from (build_backward(zero_table=False))


@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64, i64), cache=True)
def new_node(G, st, op, s0, s1, like, flags, origin, rule):
    """Append a node with up to two sources and the shape of node ``like``; returns its id."""
    opa, src, ndim, shape, ip, fp, fl, org, rl = G
    n = st[0]
    st[0] = n + 1
    opa[n] = op
    src[n, 0] = s0
    src[n, 1] = s1
    src[n, 2] = -1
    src[n, 3] = -1
    ndim[n] = ndim[like]
    for d in range(MAX_DIMS):
        shape[n, d] = shape[like, d]
    for k in range(N_IP):
        ip[n, k] = 0
    for k in range(N_FP):
        fp[n, k] = 0.0
    fl[n] = flags
    org[n] = origin
    rl[n] = rule
    return n


@njit(i64(G_T, ST, i64, i64, i64, i64), cache=True)
def copy_node(G, st, n, flags, origin, rule):
    """Append an exact copy of node n (op, sources, shape, params) with new flags/origin."""
    opa, src, ndim, shape, ip, fp, fl, org, rl = G
    m = new_node(G, st, opa[n], src[n, 0], src[n, 1], n, flags, origin, rule)
    src[m, 2] = src[n, 2]
    src[m, 3] = src[n, 3]
    for k in range(N_IP):
        ip[m, k] = ip[n, k]
    for k in range(N_FP):
        fp[m, k] = fp[n, k]
    return m


@njit(cache=True)
def same_shape(G, a, b):
    shape = G[3]
    for d in range(MAX_DIMS):
        if shape[a, d] != shape[b, d]:
            return False
    return True


@njit(cache=True)
def reduce_mask_to(G, big, small):
    """Mask of the padded axes along which ``small`` is broadcast inside ``big``."""
    shape = G[3]
    m = 0
    for d in range(MAX_DIMS):
        if shape[small, d] == 1 and shape[big, d] != 1:
            m |= 1 << d
    return m
