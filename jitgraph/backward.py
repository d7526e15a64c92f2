"""Backward expansion (ggml_build_backward_expand), jitted.

One pass over the forward order in reverse appends gradient nodes to the same
node table.  Gradients live in a hash map node -> gradient node.  The first
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
from ._hashtable import INSERTED, hs_add, ht_get_or, ht_insert, ht_new
from .emit import RULE_ACCUMULATE, RULE_COPY, RULE_ZERO, new_node, reduce_mask_to, same_shape
from .errors import GraphError
from .graph import Graph
from .ir import F_GRAD, F_LEAF, F_PARAM, F_PARAM_GRAD, MAX_DIMS, MAX_SRC
from .ops.linear import product_node
from .ops.reduce import ReduceIP
from .registry import ADD, COPY, OPS, RESHAPE, SUM
from .rules import (BCAST, GRAD, I_DIMS, I_FP, I_FROM, I_IP, I_KIND, I_LIKE, I_OP, I_SRC, MAX_DEPS,
                    MAX_INSTRUCTIONS, NONE, OUT, PRODUCT, PROGRAM, S_ADD, S_AND, S_CONST, S_DIV, S_EQ, S_FLOORDIV,
                    S_FP, S_GE, S_GT, S_ID, S_IP, S_LE, S_LT, S_MOD, S_MUL, S_NDIM, S_NE, S_NEG, S_NOT, S_OPCODE,
                    S_OR, S_SELECT, S_SHAPE, S_SHAPE_AT, S_SUB, SELECT, SKIP, SOURCE, SRC)
from .status import ERR_NO_RULE, NEED_SPACE, OK

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
def _node_of(G, n, g, res, ref):
    """The node id a ref of node n's rule stands for (-1: none)."""
    if ref >= 0:
        return res[ref]
    if ref == GRAD:
        return g
    if ref == OUT:
        return n
    if ref <= SRC and ref > SRC - MAX_SRC:
        return G.src[n, SRC - ref]
    return NONE


@njit(cache=True)
def _scalar(G, n, g, res, code, index, consts, e):
    """Value of scalar expression e (stack code) of node n's rule, as a float64: parameters,
    shapes and node ids are integers well below 2**53, so they stay exact."""
    stack = np.empty(16, np.float64)
    top = 0
    start, count = index[e, 0], index[e, 1]
    for i in range(start, start + count):
        kind, a, b = code[i, 0], code[i, 1], code[i, 2]
        if kind == S_CONST:
            stack[top] = consts[a]
            top += 1
        elif kind <= S_OPCODE:                 # a leaf that reads a node
            m = _node_of(G, n, g, res, a)
            if kind == S_IP:
                v = np.float64(G.ip[m, b])
            elif kind == S_FP:
                v = G.fp[m, b]
            elif kind == S_SHAPE:
                v = np.float64(G.shape[m, b])
            elif kind == S_SHAPE_AT:
                top -= 1
                v = np.float64(G.shape[m, int(stack[top])])
            elif kind == S_NDIM:
                v = np.float64(G.ndim[m])
            elif kind == S_ID:
                v = np.float64(m)
            else:
                v = np.float64(G.op[m])
            stack[top] = v
            top += 1
        elif kind == S_NEG or kind == S_NOT:
            x = stack[top - 1]
            stack[top - 1] = -x if kind == S_NEG else (1.0 if x == 0.0 else 0.0)
        elif kind == S_SELECT:
            top -= 2
            stack[top - 1] = stack[top] if stack[top - 1] != 0.0 else stack[top + 1]
        else:
            top -= 1
            x, y = stack[top - 1], stack[top]
            if kind == S_ADD:
                v = x + y
            elif kind == S_SUB:
                v = x - y
            elif kind == S_MUL:
                v = x * y
            elif kind == S_DIV:
                v = x / y
            elif kind == S_FLOORDIV or kind == S_MOD:    # on integers, as Python's: exactly
                a, b = np.int64(x), np.int64(y)
                v = 0.0 if b == 0 else np.float64(a // b if kind == S_FLOORDIV else a % b)
            elif kind == S_EQ:
                v = 1.0 if x == y else 0.0
            elif kind == S_NE:
                v = 1.0 if x != y else 0.0
            elif kind == S_LT:
                v = 1.0 if x < y else 0.0
            elif kind == S_LE:
                v = 1.0 if x <= y else 0.0
            elif kind == S_GT:
                v = 1.0 if x > y else 0.0
            elif kind == S_GE:
                v = 1.0 if x >= y else 0.0
            elif kind == S_AND:
                v = 1.0 if x != 0.0 and y != 0.0 else 0.0
            elif kind == S_OR:
                v = 1.0 if x != 0.0 or y != 0.0 else 0.0
            else:                              # S_SHL
                v = np.float64(np.int64(x) << np.int64(y))
            stack[top - 1] = v
    return stack[0]


@njit(cache=True)
def _int_param(G, n, g, res, code, index, consts, e):
    """An int parameter's value: a copied int parameter exactly (a dropout seed may pass 2**53)."""
    i = index[e, 0]
    if index[e, 1] == 1 and code[i, 0] == S_IP:
        return G.ip[_node_of(G, n, g, res, code[i, 1]), code[i, 2]]
    return np.int64(_scalar(G, n, g, res, code, index, consts, e))


@njit(cache=True)
def _emit(G, st, n, k, g, res, row, code, index, consts):
    """Append the node instruction ``row`` of node n's rule describes (made for slot k)."""
    src = np.empty(MAX_SRC, np.int64)
    for i in range(MAX_SRC):
        src[i] = _node_of(G, n, g, res, row[I_SRC + i])
    if row[I_KIND] == PRODUCT:
        tx = _int_param(G, n, g, res, code, index, consts, row[I_IP])
        ty = _int_param(G, n, g, res, code, index, consts, row[I_IP + 1])
        return product_node(G, st, n, row[I_OP], src[0], tx, src[1], ty)
    like = src[0] if row[I_LIKE] == BCAST else _node_of(G, n, g, res, row[I_LIKE])
    t = new_node(G, st, row[I_OP], src[0], src[1], like, F_GRAD, n, k)
    G.src[t, 2] = src[2]
    G.src[t, 3] = src[3]
    if row[I_LIKE] == BCAST:                  # the broadcast of the sources' shapes
        for d in range(MAX_DIMS):
            size = 1
            for i in range(MAX_SRC):
                if src[i] >= 0 and G.shape[src[i], d] != 1:
                    size = G.shape[src[i], d]
            G.shape[t, d] = size
        for i in range(MAX_SRC):
            if src[i] >= 0 and G.ndim[src[i]] > G.ndim[t]:
                G.ndim[t] = G.ndim[src[i]]
    for q in range(MAX_DIMS):
        if row[I_DIMS + 2 * q] >= 0:
            axis = np.int64(_scalar(G, n, g, res, code, index, consts, row[I_DIMS + 2 * q]))
            G.shape[t, axis] = np.int64(_scalar(G, n, g, res, code, index, consts, row[I_DIMS + 2 * q + 1]))
    if row[I_FROM] != NONE:
        m = _node_of(G, n, g, res, row[I_FROM])
        G.ip[t] = G.ip[m]
        G.fp[t] = G.fp[m]
    for q in range(G.ip.shape[1]):
        if row[I_IP + q] >= 0:
            G.ip[t, q] = _int_param(G, n, g, res, code, index, consts, row[I_IP + q])
    for q in range(G.fp.shape[1]):
        if row[I_FP + q] >= 0:
            G.fp[t, q] = _scalar(G, n, g, res, code, index, consts, row[I_FP + q])
    return t


@njit(cache=True)
def run_rule(G, st, n, k, g, res, mark, start, result, ins, deps, code, index, consts):
    """The gradient node node n's rule gives source k (-1: none), running only the
    instructions it needs that no earlier slot ran (res holds their results)."""
    r = result[k]
    if r < 0:
        return _node_of(G, n, g, res, r)
    mark[:r + 1] = 0
    mark[r] = 1
    for j in range(r, -1, -1):                # which instructions this result needs
        if mark[j] == 0 or res[j] != UNSET:
            continue
        row = ins[start + j]
        if row[I_KIND] == SELECT:             # a condition reads only g, out and the sources
            take = row[I_SRC] if _scalar(G, n, g, res, code, index, consts, row[I_OP]) != 0.0 else row[I_SRC + 1]
            mark[j] = 2 + (0 if take == row[I_SRC] else 1)
            if take >= 0:
                mark[take] = 1
        else:
            for i in range(MAX_DEPS):
                d = deps[start + j, i]
                if d < 0:
                    break
                mark[d] = 1
    for j in range(r + 1):                    # run them in program order
        if mark[j] == 0 or res[j] != UNSET:
            continue
        row = ins[start + j]
        if row[I_KIND] == SELECT:
            res[j] = _node_of(G, n, g, res, row[I_SRC + mark[j] - 2])
        elif row[I_KIND] == SOURCE:
            res[j] = G.src[_node_of(G, n, g, res, row[I_SRC]), row[I_OP]]
        else:
            res[j] = _emit(G, st, n, k, g, res, row, code, index, consts)
    return res[r]


@njit(cache=True)
def _fit(G, st, c, s, n, k):
    """Contribution c brought to source s's shape: summed over broadcast axes."""
    if not same_shape(G, c, s):
        t = new_node(G, st, SUM, c, -1, s, F_GRAD, n, k)
        G.ip[t, ReduceIP.axes] = reduce_mask_to(G, c, s)
        return t
    if G.ndim[c] != G.ndim[s]:           # same layout, other rank: a free view
        return new_node(G, st, RESHAPE, c, -1, s, F_GRAD, n, k)
    return c


@njit(cache=True)
def expand_backward(G, st, order, need, grads, position, kind, start, count, result, ins, deps, code, index, consts):
    """Differentiate order[::-1] from ``position`` on.  Returns (status, position, node)."""
    res = np.empty(MAX_INSTRUCTIONS, np.int64)
    mark = np.empty(MAX_INSTRUCTIONS, np.int64)
    for p in range(position, order.size):
        n = order[order.size - 1 - p]
        g = ht_get_or(grads, n, -1)
        if g < 0 or G.flags[n] & F_LEAF:
            continue
        op = G.op[n]
        if kind[op] == SKIP:
            continue
        if kind[op] != PROGRAM:
            return ERR_NO_RULE, p, n
        if st[0] + MAX_NODES_PER_STEP > st[1]:
            return NEED_SPACE, p, n
        res[:count[op]] = UNSET
        for k in range(MAX_SRC):
            s = G.src[n, k]
            if s < 0:
                break
            if not need[s]:
                continue
            c = run_rule(G, st, n, k, g, res, mark, start[op], result[op], ins, deps, code, index, consts)
            if c < 0:
                continue
            c = _fit(G, st, c, s, n, k)
            old = ht_get_or(grads, s, -1)
            if old < 0:
                ht_insert(grads, s, c)       # first contribution: set, never add to zero
            else:
                ht_insert(grads, s, new_node(G, st, ADD, old, c, s, F_GRAD, s, RULE_ACCUMULATE))
    return OK, order.size, -1


@njit(cache=True)
def param_gradients(G, st, params, grads):
    """The gradient node of each param (-1: zero), each with a buffer of its own:
    a view, a leaf or a node shared with another param is copied first."""
    out = np.full(params.size, -1, np.int64)
    taken = ht_new(params.size)               # gradient nodes already given to a param
    for i in range(params.size):
        p = params[i]
        g = ht_get_or(grads, p, -1)
        if g < 0:
            continue
        if hs_add(taken, g) != INSERTED or G.op[g] == RESHAPE or G.flags[g] & F_LEAF:
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
    grads = ht_new(order.size)           # at most one entry per forward node: never full
    ht_insert(grads, loss_id, seed.id)
    if not zero_table:
        for n in order[need[order] == 1].tolist():
            if n != loss_id:
                z = graph.const(np.zeros(graph.shape_of(n)))
                nodes.flags[z.id] |= F_GRAD
                nodes.origin[z.id] = n
                nodes.rule[z.id] = RULE_ZERO
                ht_insert(grads, n, z.id)
    programs = rules.tables().arrays()
    nodes.reserve(3 * order.size)        # typical rules add ~1-3 nodes per forward node: grow once
    st = np.array([nodes.n, nodes.capacity], np.int64)
    position = 0
    while True:
        status, position, node = expand_backward(nodes.arrays(), st, order, need, grads, position, *programs)
        nodes.n = int(st[0])
        if status == OK:
            break
        if status == NEED_SPACE:
            nodes.reserve(nodes.capacity)        # double, then resume where it stopped
            st[1] = nodes.capacity
            continue
        node = int(node)
        raise GraphError(f"build_backward: op {OPS[int(nodes.op[node])].name!r} of tensor "
                         f"{graph.label(node)!r} has no gradient rule, but a param's gradient "
                         "flows through it")
    compiler.prefetch(graph.dtype, nodes.op[:nodes.n])     # the gradient nodes' kernels, in the background
    params = order[(nodes.flags[order] & F_PARAM) != 0].astype(np.int64)
    nodes.reserve(params.size + 1)
    st[1] = nodes.capacity
    gnodes = param_gradients(nodes.arrays(), st, params, grads)
    nodes.n = int(st[0])
    return params, gnodes
