"""Appending nodes from jitted passes.

``G`` is the node table (``ir.Nodes``) and ``st`` an int64[2] state array:
st[0] = node count, st[1] = capacity.  A pass checks that a step's worst case fits
before taking it and otherwise returns to Python, which doubles the table and
resumes the pass -- arrays are never rebound inside a hot loop.
"""
from ._sigs import G as G_T, ST, i64, on_first_use
from .ir import MAX_DIMS, N_FP, N_IP

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
