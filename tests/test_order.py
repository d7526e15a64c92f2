"""build_forward's execution order: invariants on random DAGs, and a 100k-node chain."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jitgraph as jg
from jitgraph.order import sink_order, topo_order
from jitgraph.status import ERR_BAD_NODE


def ancestors(src_lists, roots):
    seen, stack = set(), list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(src_lists[n])
    return seen


@st.composite
def random_dag(draw):
    """A graph of random binary/unary ops over a few inputs; returns (graph, tensors)."""
    g = jg.Graph(np.float64)
    ts = [g.input((3,), name=f"x{i}") for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.integers(0, 3))
        a = ts[draw(st.integers(0, len(ts) - 1))]
        b = ts[draw(st.integers(0, len(ts) - 1))]
        ts.append([lambda: a + b, lambda: a * b, lambda: jg.tanh(a), lambda: a - b][kind]())
    return g, ts


@given(random_dag(), st.data())
def test_order_invariants_on_random_dags(dag, data):
    g, ts = dag
    roots = data.draw(st.lists(st.sampled_from(ts), min_size=1, max_size=4))
    fwd = jg.build_forward(roots)
    order = fwd.order.tolist()
    src_lists = [g.nodes.sources(n) for n in range(len(g))]
    # each node once, exactly the ancestors of the roots
    assert len(order) == len(set(order))
    assert set(order) == ancestors(src_lists, [t.id for t in roots])
    # every source before its consumer
    pos = {n: i for i, n in enumerate(order)}
    for n in order:
        for s in src_lists[n]:
            assert pos[s] < pos[n]
    # DFS from each root in turn: the first root's ancestors come first
    first = ancestors(src_lists, [roots[0].id])
    assert set(order[:len(first)]) == first


def intervals(order, src_lists, immortal):
    """{node: (first step, last step)} of each node's buffer: made at its step, alive to its
    last reader (to the end for a node nobody reads, an output, or an immortal leaf)."""
    pos = {n: i for i, n in enumerate(order)}
    last = {}
    for n in order:
        for s in src_lists[n]:
            last[s] = max(last.get(s, -1), pos[n])
    end = len(order)
    return {n: (pos[n], end if immortal[n] or n not in last else last[n]) for n in order}


@given(random_dag(), st.data())
def test_sinking_moves_nodes_down_without_making_two_buffers_live_together(dag, data):
    """sink_order: still a valid order with the prefix in place, and no two buffers are alive
    at one step that were not alive together before (so no plan's peak can grow)."""
    g, ts = dag
    order = jg.build_forward(ts[-1]).order
    src_lists = [g.nodes.sources(n) for n in range(len(g))]
    immortal = np.array([jg.Tensor(g, n).op == "input" for n in range(len(g))], np.uint8)
    start = data.draw(st.integers(0, order.size))
    sunk = sink_order(g.nodes.src, len(g), order, start, immortal).tolist()
    assert sorted(sunk) == sorted(order.tolist()) and sunk[:start] == order.tolist()[:start]
    pos = {n: i for i, n in enumerate(sunk)}
    assert all(pos[s] < pos[n] for n in sunk for s in src_lists[n])
    old, new = intervals(order.tolist(), src_lists, immortal), intervals(sunk, src_lists, immortal)
    for a in sunk:
        for b in sunk:
            if new[a][0] <= new[b][1] and new[b][0] <= new[a][1]:
                assert old[a][0] <= old[b][1] and old[b][0] <= old[a][1], (a, b)


def test_sinking_makes_an_early_gradient_after_the_recomputed_stretch_it_waits_for():
    """The case it is for: a big result (b = f(a)) read only at the end of a long stretch
    that does not need it is made right before its reader, while a, read later anyway,
    is held back by nothing."""
    g = jg.Graph(np.float64)
    x, w = g.input((4, 4), name="x"), g.input((4, 4), name="w")
    a = jg.tanh(x)
    b = a @ w                      # made early in DFS order; read only by the last node
    h = x
    for _ in range(5):
        h = jg.sin(h)
    out = b + h + a
    order = jg.build_forward(out).order
    leaves = np.array([jg.Tensor(g, n).op == "input" for n in range(len(g))], np.uint8)
    sunk = sink_order(g.nodes.src, len(g), order, 0, leaves).tolist()
    assert order.tolist().index(b.id) < order.tolist().index(h.id)
    assert sunk.index(h.id) < sunk.index(b.id)


def test_order_is_dfs_post_order():
    g = jg.Graph()
    a, b = g.input((2,), name="a"), g.input((2,), name="b")
    c = a * b
    d = jg.tanh(b)
    e = c + d
    order = jg.build_forward(e).order.tolist()
    # sources of e in slot order: all of c's subtree, then d's
    assert order == [a.id, b.id, c.id, d.id, e.id]


def test_order_skips_unrelated_nodes():
    g = jg.Graph()
    x = g.input((2,), name="x")
    y = g.input((2,), name="y")
    unused = jg.exp(y)
    out = jg.relu(x)
    order = jg.build_forward(out).order.tolist()
    assert unused.id not in order and y.id not in order
    with pytest.raises(jg.GraphError, match="does not read"):
        jg.build_forward(out).run({x: np.zeros(2), y: np.zeros(2)})


def test_topo_order_reports_bad_ids():
    src = np.full((3, 4), -1, np.int64)
    src[2, 0] = 5                               # a source outside the table
    status, order = topo_order(src, 3, np.array([2], np.int64))
    assert status == ERR_BAD_NODE and order[0] == 5
    status, order = topo_order(src, 3, np.array([7], np.int64))
    assert status == ERR_BAD_NODE and order[0] == 7


def test_100k_node_chain_builds_and_runs():
    g = jg.Graph(np.float32)
    x = g.input((16,), name="x")
    y = g.input((16,), name="y")
    h = x
    n = 100_000
    for i in range(n):
        k = i % 3
        h = h * 1.0001 if k == 0 else (h + y if k == 1 else h * y)
    fwd = jg.build_forward(h)
    assert fwd.order.size == n + 2
    xb = np.linspace(-1, 1, 16).astype(np.float32)
    yb = np.full(16, 0.5, np.float32)
    got = fwd.run({x: xb, y: yb})
    ref = xb.copy()
    for i in range(n):                          # the same chain in numpy, float32 throughout
        k = i % 3
        ref = ref * np.float32(1.0001) if k == 0 else (ref + yb if k == 1 else ref * yb)
    np.testing.assert_array_equal(got, ref)
