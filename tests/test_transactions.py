"""Graph building is all or nothing at the boundaries a user sees: a ``jg.checkpoint``
segment (at any depth), ``jg.grad`` / ``build_backward`` or an op builder that raises
leaves the graph exactly as it was -- nodes, names, params, consts and the value store,
segment depth, what ``jg.save`` writes and the picture of the whole graph -- and the
exception propagates unchanged; building and running go on normally afterwards."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.ir import FIELDS


class Boom(RuntimeError):
    pass


def graph():
    g = jg.Graph(np.float64)
    x = g.input((4, 3), name="x")
    W = g.param(np.random.default_rng(0).standard_normal((3, 3)), name="W")
    h = jg.tanh(x @ W).named("h")
    return g, x, W, h


def state(g, tmp_path, tag):
    """Everything a user can see of graph g."""
    path = tmp_path / f"{tag}.npz"
    jg.save(path, g)
    with np.load(path) as f:
        saved = {k: f[k].copy() for k in f.files}
    n = g.nodes.n
    return dict(n=n, nodes={f: getattr(g.nodes, f)[:n].copy() for f in FIELDS}, names=dict(g.names),
                ids=dict(g._ids_by_name), params=list(g.params), store=g.store[:g.store_used].copy(),
                store_used=g.store_used, depth=g._segment_depth, saved=saved, dot=g.to_dot(),
                rows=g.node_rows(), shapes={m: g.shape_of(m) for m in range(n)})


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if key in ("nodes", "saved"):
            assert a[key].keys() == b[key].keys(), key
            for f in a[key]:
                np.testing.assert_array_equal(a[key][f], b[key][f], err_msg=f"{key}.{f}")
        elif key == "store":
            np.testing.assert_array_equal(a[key], b[key])
        else:
            assert a[key] == b[key], key


def failing_segment(W, depth):
    """A segment function that builds (names, a param, a const) and raises at ``depth``."""
    def fn(t):
        g = t.graph
        u = jg.relu(t @ W).named(f"u{depth}")
        V = g.param(np.ones(3), name=f"V{depth}")
        u = u * V + np.arange(3.0)
        if depth > 0:
            return jg.checkpoint(failing_segment(W, depth - 1), u)
        raise Boom("boom")
    return fn


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_failing_segment_leaves_the_graph_as_it_was(tmp_path, depth):
    g, x, W, h = graph()
    before = state(g, tmp_path, "before")
    with pytest.raises(Boom, match="boom"):
        jg.checkpoint(failing_segment(W, depth), h)
    assert_same(state(g, tmp_path, "after"), before)
    # names made inside are free again; building, checkpointing and running go on
    out = jg.checkpoint(lambda t: jg.relu(jg.sin(t @ W)).named("u0"), h)     # sin reads t @ W: recomputed
    V = g.param(np.ones(3), name="V0")
    loss = jg.sum(out * V)
    bwd = jg.build_backward(jg.build_forward(loss))
    plain = jg.build_backward(jg.build_forward(jg.sum(jg.relu(jg.sin(jg.tanh(x @ W) @ W)) * V)))
    xb = np.random.default_rng(1).standard_normal((4, 3))
    assert bwd.run({x: xb}) == plain.run({x: xb})
    assert bwd.stats()["n_recomputed"] > 0


def test_a_segment_failing_inside_a_good_outer_segment_is_undone_alone(tmp_path):
    g, x, W, h = graph()

    def outer(t):
        u = jg.sigmoid(t @ W).named("kept")
        before = state(g, tmp_path, "inner")
        with pytest.raises(Boom):
            jg.checkpoint(failing_segment(W, 1), u)
        assert_same(state(g, tmp_path, "inner-after"), before)
        return u * 2.0

    out = jg.checkpoint(outer, h)
    assert g.tensor("kept").op == "sigmoid" and out.graph is g
    assert "u0" not in g._ids_by_name and "V1" not in g._ids_by_name
    assert g._segment_depth == 0


def test_renames_inside_a_failing_segment_are_undone(tmp_path):
    g, x, W, h = graph()
    before = state(g, tmp_path, "before")

    def fn(t):
        h.name = "renamed"                  # an older tensor renamed ...
        x.name = "h"                        # ... and its old name given to another one
        jg.exp(t).name = "x"
        raise Boom("boom")

    with pytest.raises(Boom):
        jg.checkpoint(fn, h)
    assert_same(state(g, tmp_path, "after"), before)
    assert g.tensor("h").id == h.id and g.tensor("x").id == x.id


def test_a_failing_grad_and_build_backward_leave_the_graph_as_it_was(tmp_path):
    g, x, W, h = graph()
    loss = jg.sum(jg.sqr(h))
    before = state(g, tmp_path, "before")
    with pytest.raises(jg.GraphError, match="not a param"):
        jg.grad(loss, [x])                  # an input: the gradient nodes were already built
    assert_same(state(g, tmp_path, "after"), before)
    fwd = jg.build_forward(loss)
    before = state(g, tmp_path, "before-budget")
    with pytest.raises(jg.GraphError, match="budget"):
        jg.build_backward(fwd, memory_budget=1)
    assert_same(state(g, tmp_path, "after-budget"), before)
    (gW,) = jg.grad(loss, [W])
    bwd = jg.build_backward(fwd)
    bwd.run({x: np.ones((4, 3))})
    assert gW.shape == W.shape and np.isfinite(W.grad).all()


@pytest.mark.parametrize("build", [
    lambda x, W: x + np.ones(5),                         # a const is made, then the shapes do not broadcast
    lambda x, W: jg.matmul(np.ones(3), x),              # a const and its reshape made, then inner dims differ
    lambda x, W: jg.where(np.ones((4, 3)), x, np.ones((2, 2))),
    lambda x, W: jg.concat([x, np.ones((4, 2)), np.ones((5, 3))], axis=0),
])
def test_an_op_builder_that_raises_leaves_the_graph_as_it_was(tmp_path, build):
    g, x, W, h = graph()
    before = state(g, tmp_path, "before")
    with pytest.raises(jg.GraphError):
        build(x, W)
    assert_same(state(g, tmp_path, "after"), before)


def test_a_leaf_with_a_taken_name_adds_nothing(tmp_path):
    g, x, W, h = graph()
    before = state(g, tmp_path, "before")
    for make in (lambda: g.param(np.ones(2), name="W"), lambda: g.const(np.ones(2), name="x"),
                 lambda: g.input((2,), name="h")):
        with pytest.raises(jg.GraphError, match="already used"):
            make()
    assert_same(state(g, tmp_path, "after"), before)
