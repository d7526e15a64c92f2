"""Appending nodes from jitted passes and gradient rules.

``G`` is the node table (``ir.Nodes``) and ``st`` an int64[2] state array:
st[0] = node count, st[1] = capacity.  A pass checks that a step's worst case fits
before taking it and otherwise returns to Python, which doubles the table and
resumes the pass -- arrays are never rebound inside a hot loop.
"""
from numba import njit

from ._sigs import G as G_T, ST, f64, i64, on_first_use
from .ir import F_GRAD, MAX_DIMS, N_FP, N_IP

RULE_ACCUMULATE = -2     # rule of an add summing two gradient contributions
RULE_COPY = -3           # rule of the copy that gives a param gradient its own buffer
RULE_ZERO = -4           # an explicit zero a gradient starts from (build_backward(zero_table=False))


@on_first_use(i64(G_T, ST, i64, i64, i64, i64, i64, i64, i64))
def new_node(G, st, op, s0, s1, like, flags, origin, rule):
    """Append a node with up to two sources and the shape of node ``like``; returns its id."""
    n = st[0]
    st[0] = n + 1
    G.op[n] = op
    G.src[n, 0] = s0
    G.src[n, 1] = s1
    G.src[n, 2] = -1
    G.src[n, 3] = -1
    G.ndim[n] = G.ndim[like]
    for d in range(MAX_DIMS):
        G.shape[n, d] = G.shape[like, d]
    for k in range(N_IP):
        G.ip[n, k] = 0
    for k in range(N_FP):
        G.fp[n, k] = 0.0
    G.flags[n] = flags
    G.origin[n] = origin
    G.rule[n] = rule
    return n


@on_first_use(i64(G_T, ST, i64, i64, i64, i64, i64, i64))
def grad_node(G, st, op, a, b, like, n, k):
    """A gradient node ``op(a, b)`` shaped like ``like``, made by the rule of node n for slot k."""
    return new_node(G, st, op, a, b, like, F_GRAD, n, k)


@on_first_use(i64(G_T, ST, i64, i64, f64, f64, i64, i64))
def grad_node_fp(G, st, op, a, p0, p1, n, k):
    """A unary gradient node ``op(a)`` shaped like ``a`` with float params (p0, p1)."""
    t = new_node(G, st, op, a, -1, a, F_GRAD, n, k)
    G.fp[t, 0] = p0
    G.fp[t, 1] = p1
    return t


@on_first_use(i64(G_T, ST, i64, i64, i64, i64, i64, i64, i64))
def grad_node_ip(G, st, op, a, like, p0, p1, n, k):
    """A unary gradient node ``op(a)`` shaped like ``like`` with int params (p0, p1)."""
    t = new_node(G, st, op, a, -1, like, F_GRAD, n, k)
    G.ip[t, 0] = p0
    G.ip[t, 1] = p1
    return t


@on_first_use(i64(G_T, ST, i64, i64, i64, i64))
def copy_node(G, st, n, flags, origin, rule):
    """Append an exact copy of node n (op, sources, shape, params) with new flags/origin."""
    m = new_node(G, st, G.op[n], G.src[n, 0], G.src[n, 1], n, flags, origin, rule)
    G.src[m, 2] = G.src[n, 2]
    G.src[m, 3] = G.src[n, 3]
    for k in range(N_IP):
        G.ip[m, k] = G.ip[n, k]
    for k in range(N_FP):
        G.fp[m, k] = G.fp[n, k]
    return m


@njit(cache=True)
def same_shape(G, a, b):
    for d in range(MAX_DIMS):
        if G.shape[a, d] != G.shape[b, d]:
            return False
    return True


@njit(cache=True)
def reduce_mask_to(G, big, small):
    """Mask of the padded axes along which ``small`` is broadcast inside ``big``."""
    m = 0
    for d in range(MAX_DIMS):
        if G.shape[small, d] == 1 and G.shape[big, d] != 1:
            m |= 1 << d
    return m
