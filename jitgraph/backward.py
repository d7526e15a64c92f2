"""Backward expansion (ggml_build_backward_expand), jitted.

One pass over the forward order in reverse appends gradient nodes to the same
node table.  Each node's gradient node is held in an array indexed by node id
(ids are dense: ggml's hash map, without the hashing).  The first
contribution to a node's gradient is *set*; only a second one creates an add
(ggml's add-or-set with its zero table), so the backward graph never holds a
``g + 0``.  Each op's rule is a program (rules.py) this pass interprets: it gives
the contributions of all the node's sources at once, each in the consumer's
broadcast shape, and the pass sums each down to its source's shape, once, for
every rule.  Nothing here names an op, and nothing is compiled per rule.
"""
import numpy as np
from numba import njit

from . import compiler, rules
from .emit import RULE_ACCUMULATE, RULE_COPY, RULE_ZERO, new_node
from .errors import GraphError
from .graph import Graph
from .ir import F_GRAD, F_LEAF, F_PARAM, F_PARAM_GRAD, MAX_DIMS, MAX_SRC, N_FP, N_IP
from .native import borrowed, borrowed_nodes
from .ops.reduce import ReduceIP
from .registry import ADD, COPY, OPS, RESHAPE, SUM
from .rules import BCAST, I_DIMS, I_FP, I_FROM, I_IP, I_KIND, I_LIKE, I_OP, I_SRC, MAX_DEPS, MAX_INSTRUCTIONS, NONE, \
    PROGRAM, SELECT, SKIP, SOURCE
from .status import ERR_BAD_RULE, ERR_NO_RULE, NEED_SPACE, OK

MAX_NODES_PER_STEP = MAX_INSTRUCTIONS + 4 * MAX_SRC   # worst case appended for one node: a rule and its fits and adds
UNSET = -99                  # an instruction not run yet (NONE, -1, is a result: no gradient)


@njit(cache=True)
def needs_grad(G, n_nodes, order):
    """1 for params and for every node that depends on one; consts and inputs never."""
    need = np.zeros(n_nodes, np.uint8)
    for t in range(order.size):
        n = order[t]
        if G.flags[n] & F_PARAM:
            need[n] = 1
        elif not G.flags[n] & F_LEAF:
            for k in range(MAX_SRC):
                s = G.src[n, k]
                if s < 0:
                    break
                if need[s]:
                    need[n] = 1
                    break
    return need


# ---- the rule interpreter -------------------------------------------------------------------------
@njit(cache=True)
def _ref(base, res, ref):
    """The node id a ref of the running rule stands for (-1: none): ``base`` holds what
    g, out and the sources stand for (rules.py: at -2 - ref), ``res`` the results."""
    if ref >= 0:
        return res[ref]
    return -1 if ref == NONE else base[-2 - ref]


@njit(cache=True)
def _fit(G, st, c, s, n, k):
    """Contribution c brought to source s's shape: summed over the axes s is broadcast along."""
    differ, axes = False, 0
    for d in range(MAX_DIMS):
        if G.shape[s, d] != G.shape[c, d]:
            differ = True
            if G.shape[s, d] == 1:
                axes |= 1 << d
    if differ:
        t = new_node(G, st, SUM, c, -1, s, F_GRAD, n, k)
        G.ip[t, ReduceIP.axes] = axes
        return t
    if G.ndim[c] != G.ndim[s]:           # same layout, other rank: a free view
        return new_node(G, st, RESHAPE, c, -1, s, F_GRAD, n, k)
    return c


@njit(cache=True)
def expand_backward(G_, st, order, need, grad, position, first, stride, ivals, fvals, kind, start, count, result, ins,
                    deps):
    """Differentiate order[::-1] from ``position`` on, node n's rule for every source that
    needs a gradient: the instructions its result needs that no earlier source ran, in
    program order (a SELECT's branch is chosen before what it needs is marked).  The
    scalars of the rule of the node at position p are ivals / fvals[first[p] + i * stride[p]]
    (rules.Tables.scalars).  Returns (status, position, node)."""
    res_ = np.empty(MAX_INSTRUCTIONS, np.int64)          # each instruction's node (UNSET: not run)
    mark = np.empty(MAX_INSTRUCTIONS, np.int64)          # needed by this source; a SELECT's choice
    base_ = np.empty(2 + MAX_SRC, np.int64)              # what the refs g, out and the sources stand for
    # what the loop hands to calls, as borrowed views: a call that takes owned arrays counts
    # references with atomic operations, which were 60% of the pass's time.  (Splicing the
    # appends into the loop instead, inline="always", made it 2x slower.)
    res, base, G = borrowed(res_), borrowed(base_), borrowed_nodes(G_)
    for p in range(position, order.size):
        n = order[order.size - 1 - p]
        g = grad[n]
        if g < 0 or G.flags[n] & F_LEAF:
            continue
        op = G.op[n]
        if kind[op] == SKIP:
            continue
        if kind[op] != PROGRAM:
            return ERR_NO_RULE, p, n
        if st[0] + MAX_NODES_PER_STEP > st[1]:
            return NEED_SPACE, p, n
        base[0] = g
        base[1] = n
        for i in range(MAX_SRC):
            base[2 + i] = G.src[n, i]
        b0, v0, w = start[op], first[p], stride[p]
        for j in range(count[op]):
            res[j] = UNSET
        for k in range(MAX_SRC):
            s = G.src[n, k]
            if s < 0:
                break
            if not need[s]:
                continue
            r = result[op, k]
            if r >= 0 and res[r] == UNSET:
                for j in range(r):
                    mark[j] = 0
                mark[r] = 1
                for j in range(r, -1, -1):        # what the result needs
                    if mark[j] == 0 or res[j] != UNSET:
                        continue
                    row = b0 + j
                    if ins[row, I_KIND] == SELECT:
                        take = 0 if fvals[v0 + ins[row, I_OP] * w] != 0.0 else 1
                        mark[j] = 2 + take
                        if ins[row, I_SRC + take] >= 0:
                            mark[ins[row, I_SRC + take]] = 1
                    else:
                        for i in range(MAX_DEPS):
                            d = deps[row, i]
                            if d < 0:
                                break
                            mark[d] = 1
                for j in range(r + 1):            # run it, in program order
                    if mark[j] == 0 or res[j] != UNSET:
                        continue
                    row = b0 + j
                    what = ins[row, I_KIND]
                    s0 = _ref(base, res, ins[row, I_SRC])
                    if what == SELECT:
                        res[j] = s0 if mark[j] == 2 else _ref(base, res, ins[row, I_SRC + 1])
                        continue
                    if what == SOURCE:
                        res[j] = G.src[s0, ins[row, I_OP]]
                        continue
                    bcast = ins[row, I_LIKE] == BCAST
                    t = new_node(G, st, ins[row, I_OP], s0, _ref(base, res, ins[row, I_SRC + 1]),
                                 s0 if bcast else _ref(base, res, ins[row, I_LIKE]), F_GRAD, n, k)
                    G.src[t, 2] = _ref(base, res, ins[row, I_SRC + 2])
                    G.src[t, 3] = _ref(base, res, ins[row, I_SRC + 3])
                    if bcast:                     # the broadcast of the sources' shapes
                        for d in range(MAX_DIMS):
                            for i in range(1, MAX_SRC):
                                m = G.src[t, i]
                                if m >= 0 and G.shape[m, d] != 1:
                                    G.shape[t, d] = G.shape[m, d]
                        for i in range(1, MAX_SRC):
                            m = G.src[t, i]
                            if m >= 0 and G.ndim[m] > G.ndim[t]:
                                G.ndim[t] = G.ndim[m]
                    for q in range(MAX_DIMS):
                        e = ins[row, I_DIMS + 2 * q]
                        if e >= 0:
                            axis = ivals[v0 + e * w]
                            if axis < 0 or axis >= MAX_DIMS:
                                return ERR_BAD_RULE, p, n
                            G.shape[t, axis] = ivals[v0 + ins[row, I_DIMS + 2 * q + 1] * w]
                    if ins[row, I_FROM] != NONE:
                        m = _ref(base, res, ins[row, I_FROM])
                        for q in range(N_IP):     # loops, not row assignments: those compile an error path
                            G.ip[t, q] = G.ip[m, q]           # with formatted shapes (seconds of a cold start)
                        for q in range(N_FP):
                            G.fp[t, q] = G.fp[m, q]
                    for q in range(N_IP):
                        if ins[row, I_IP + q] >= 0:
                            G.ip[t, q] = ivals[v0 + ins[row, I_IP + q] * w]
                    for q in range(N_FP):
                        if ins[row, I_FP + q] >= 0:
                            G.fp[t, q] = fvals[v0 + ins[row, I_FP + q] * w]
                    res[j] = t
            c = _ref(base, res, r)
            if c < 0:
                continue
            c = _fit(G, st, c, s, n, k)
            old = grad[s]                    # first contribution: set, never add to zero
            grad[s] = c if old < 0 else new_node(G, st, ADD, old, c, s, F_GRAD, s, RULE_ACCUMULATE)
    return OK, order.size, -1


@njit(cache=True)
def param_gradients(G, st, params, grad):
    """The gradient node of each param (-1: zero), each with a buffer of its own:
    a view, a leaf or a node shared with another param is copied first."""
    out = np.full(params.size, -1, np.int64)
    taken = np.zeros(st[1], np.uint8)         # gradient nodes already given to a param
    for i in range(params.size):
        p = params[i]
        g = grad[p]
        if g < 0:
            continue
        shared = taken[g]
        taken[g] = 1
        if shared or G.op[g] == RESHAPE or G.flags[g] & F_LEAF:
            g = new_node(G, st, COPY, g, -1, p, F_GRAD, p, RULE_COPY)
        G.flags[g] |= F_PARAM_GRAD
        out[i] = g
    return out


def differentiate(graph: Graph, order: np.ndarray, loss_id: int, zero_table: bool = True):
    """Run the expansion on ``graph`` for ``loss_id``; returns (params, grad nodes).

    Appends the seed (a const 1 shaped like the loss) and all gradient nodes.
    ``zero_table=False`` (for teaching) starts every gradient at an explicit zero
    const and adds every contribution to it -- the graph ggml built before its
    zero table.
    """
    nodes = graph.nodes
    seed = graph.const(np.ones(graph.shape_of(loss_id)))
    nodes.flags[seed.id] |= F_GRAD
    nodes.origin[seed.id] = loss_id
    need = needs_grad(nodes.arrays(), nodes.n, order)
    grad = np.full(nodes.n, -1, np.int64)    # each forward node's gradient node (-1: none yet); ids are dense
    grad[loss_id] = seed.id
    if not zero_table:
        for n in order[need[order] == 1].tolist():
            if n != loss_id:
                z = graph.const(np.zeros(graph.shape_of(n)))
                nodes.flags[z.id] |= F_GRAD
                nodes.origin[z.id] = n
                nodes.rule[z.id] = RULE_ZERO
                grad[n] = z.id
    tables = rules.tables()
    programs = tables.arrays()
    scalars = tables.scalars(nodes, order, need)
    nodes.reserve(3 * order.size)        # typical rules add ~1-3 nodes per forward node: grow once
    st = np.array([nodes.n, nodes.capacity], np.int64)
    position = 0
    while True:
        status, position, node = expand_backward(nodes.arrays(), st, order, need, grad, position, *scalars,
                                                 *programs)
        nodes.n = int(st[0])
        if status == OK:
            break
        if status == NEED_SPACE:
            nodes.reserve(nodes.capacity)        # double, then resume where it stopped
            st[1] = nodes.capacity
            continue
        node = int(node)
        if status == ERR_BAD_RULE:
            raise GraphError(f"build_backward: the gradient rule of op {OPS[int(nodes.op[node])].name!r} (tensor "
                             f"{graph.label(node)!r}) emits a node with an axis outside its {MAX_DIMS} padded axes")
        raise GraphError(f"build_backward: op {OPS[int(nodes.op[node])].name!r} of tensor "
                         f"{graph.label(node)!r} has no gradient rule, but a param's gradient "
                         "flows through it")
    compiler.prefetch(graph.dtype, nodes.op[:nodes.n])     # the gradient nodes' kernels, in the background
    params = order[(nodes.flags[order] & F_PARAM) != 0].astype(np.int64)
    nodes.reserve(params.size + 1)
    st[1] = nodes.capacity
    gnodes = param_gradients(nodes.arrays(), st, params, grad)
    nodes.n = int(st[0])
    return params, gnodes
