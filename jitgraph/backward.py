"""Backward expansion (ggml_build_backward_expand), jitted.

One pass over the forward order in reverse appends gradient nodes to the same
node table.  Gradients live in a hash map node -> gradient node.  The first
contribution to a node's gradient is *set*; only a second one creates an add
(ggml's add-or-set with its zero table), so the backward graph never holds a
``g + 0``.  Each op's rule (its ``vjp``, called through the rule table, see
native.py) gives a contribution in the consumer's broadcast shape; this pass sums
it down to the source's shape, once, for every rule.
"""
import numpy as np
from numba import njit

from . import compiler
from .compiler import MISSING, SKIP
from ._hashtable import INSERTED, hs_add, ht_get_or, ht_insert, ht_new
from .emit import RULE_ACCUMULATE, RULE_COPY, RULE_ZERO, new_node, reduce_mask_to, same_shape
from .errors import GraphError
from .graph import Graph
from .ir import F_GRAD, F_LEAF, F_PARAM, F_PARAM_GRAD, MAX_SRC
from .native import call_rule, data_pointer, rule_context
from .ops.binary import ADD
from .ops.reduce import SUM
from .ops.shape import RESHAPE
from .ops.unary import COPY
from .registry import OPS
from .status import ERR_NO_RULE, NEED_SPACE, NO_CONTRIBUTION, NO_RULE, OK

MAX_NODES_PER_STEP = 64  # worst case appended while differentiating one node (rules + adds)


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


@njit(cache=True)
def vjp(G, st, rules, ctx_p, n, k, g):
    """Node n's rule for source slot k, given n's gradient g."""
    fn = rules[G.op[n]]
    if fn == SKIP:
        return NO_CONTRIBUTION
    if fn == MISSING:
        return NO_RULE
    return call_rule(fn, n, k, g, ctx_p)


@njit(cache=True)
def _fit(G, st, c, s, n, k):
    """Contribution c brought to source s's shape: summed over broadcast axes."""
    if not same_shape(G, c, s):
        t = new_node(G, st, SUM, c, -1, s, F_GRAD, n, k)
        G.ip[t, 0] = reduce_mask_to(G, c, s)
        return t
    if G.ndim[c] != G.ndim[s]:           # same layout, other rank: a free view
        return new_node(G, st, RESHAPE, c, -1, s, F_GRAD, n, k)
    return c


@njit(cache=True)
def expand_backward(G, st, order, need, grads, position, rules):
    """Differentiate order[::-1] from ``position`` on.  Returns (status, position, node)."""
    ctx = rule_context(G, st)
    ctx_p = data_pointer(ctx)
    for p in range(position, order.size):
        n = order[order.size - 1 - p]
        g = ht_get_or(grads, n, -1)
        if g < 0 or G.flags[n] & F_LEAF:
            continue
        if st[0] + MAX_NODES_PER_STEP > st[1]:
            return NEED_SPACE, p, n
        for k in range(MAX_SRC):
            s = G.src[n, k]
            if s < 0:
                break
            if not need[s]:
                continue
            c = vjp(G, st, rules, ctx_p, n, k, g)
            if c == NO_RULE:
                return ERR_NO_RULE, p, n
            if c == NO_CONTRIBUTION:
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
    rules = compiler.rules(nodes.op[order])
    nodes.reserve(3 * order.size)        # typical rules add ~1-3 nodes per forward node: grow once
    st = np.array([nodes.n, nodes.capacity], np.int64)
    position = 0
    while True:
        status, position, node = expand_backward(nodes.arrays(), st, order, need, grads, position, rules)
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
