"""Gradient checkpointing: the rewrite, every strategy bit-identical to none,
counter-based dropout, the segment API, budgets and the Pareto frontier."""
import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitgraph as jg

from .conftest import examples
from jitgraph.ops.stochastic import dropout_uniform

from .graphgen import instance, programs


def chain(n_layers, B=16, D=16, dtype=np.float64, seed=0, p_drop=0.0):
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((B, D), name="x")
    h, hs, Ws = x, [], []
    for i in range(n_layers):
        W = g.param(rng.standard_normal((D, D)) * np.sqrt(2 / D), name=f"W{i}")
        Ws.append(W)
        h = jg.relu(h @ W)
        if p_drop:
            h = jg.dropout(h, p_drop, seed=100 + i)
        hs.append(h)
    return g, x, jg.mean(jg.sqr(h)), hs, Ws


def run(bwd, feeds, params):
    loss = bwd.run(feeds)
    return loss, [bwd.grad(p) for p in params]


def assert_bit_identical(a, b):
    (la, ga), (lb, gb) = a, b
    assert np.array_equal(la, lb)
    for x, y in zip(ga, gb):
        assert np.array_equal(x, y)


STRATEGIES = {
    "every layer": lambda hs, none: dict(checkpoints=hs),
    "every third": lambda hs, none: dict(checkpoints=hs[::3]),
    "sqrt": lambda hs, none: dict(checkpoints="sqrt"),
    "save_matmuls": lambda hs, none: dict(policy="save_matmuls"),
    "sqrt + save_matmuls": lambda hs, none: dict(checkpoints="sqrt", policy="save_matmuls"),
    "budget 60%": lambda hs, none: dict(memory_budget=int(none.peak_bytes * 0.6)),
    "nothing kept": lambda hs, none: dict(checkpoints=[]),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("p_drop", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_strategy_is_bit_identical_to_none(name, p_drop, dtype):
    xb = np.random.default_rng(7).standard_normal((16, 16))
    g, x, loss, hs, Ws = chain(12, dtype=dtype, p_drop=p_drop)
    none = jg.build_backward(jg.build_forward(loss))
    ref = run(none, {x: xb}, Ws)
    g2, x2, loss2, hs2, Ws2 = chain(12, dtype=dtype, p_drop=p_drop)
    bwd = jg.build_backward(jg.build_forward(loss2), **STRATEGIES[name](hs2, none))
    assert_bit_identical(run(bwd, {x2: xb}, Ws2), ref)
    st_ = bwd.stats()
    if name not in ("every layer",):
        assert st_["n_recomputed"] > 0 and st_["recompute_flops"] > 0
    if name in ("sqrt", "budget 60%", "every third"):
        assert bwd.peak_bytes < none.peak_bytes


@given(programs(max_steps=10), st.integers(0, 2), st.data())
@settings(max_examples=examples(40))
def test_random_graphs_checkpointed_equal_plain_bit_for_bit(program, seed, data):
    g, ps, vals, loss, params, weights = instance(program, seed)
    fwd = jg.build_forward(loss)
    plain = jg.build_backward(fwd)
    used = [p for p in ps if p.id in plain.params]
    ref = run(plain, {}, used)
    computed = [v for v in vals if v.id in set(fwd.order.tolist()) and v.op not in ("param",)]
    picks = data.draw(st.lists(st.sampled_from(computed), max_size=4)) if computed else []
    for kw in (dict(checkpoints=picks), dict(checkpoints="sqrt"), dict(policy="save_matmuls")):
        bwd = jg.build_backward(jg.build_forward(loss), **kw)
        assert_bit_identical(run(bwd, {}, used), ref)
        bwd2 = jg.build_backward(jg.build_forward(loss), **kw)
        assert np.array_equal(bwd2.run(debug=True), ref[0])


def test_recomputed_copies_are_flagged_carry_origin_and_appear_once():
    g, x, loss, hs, Ws = chain(8)
    fwd = jg.build_forward(loss)
    bwd = jg.build_backward(fwd, checkpoints=[hs[3]])
    nodes = g.nodes
    rec = [n for n in bwd.order.tolist() if "recomputed" in jg.Tensor(g, n).flags]
    assert rec and len(rec) == bwd.stats()["n_recomputed"]
    origins = [int(nodes.origin[n]) for n in rec]
    assert len(set(origins)) == len(origins)                  # each forward node copied at most once
    fwd_ids = set(fwd.order.tolist())
    for n, o in zip(rec, origins):
        assert o in fwd_ids and nodes.op[n] == nodes.op[o]
        assert o != hs[3].id                                   # the checkpoint itself is kept
    # the copies come right before their first consumer: after every original forward node
    pos = {n: i for i, n in enumerate(bwd.order.tolist())}
    assert min(pos[n] for n in rec) > pos[loss.id]
    # no backward node reads a recomputed-away original any more
    for n in bwd.order.tolist():
        if n not in fwd_ids:
            for s in nodes.sources(n):
                assert s in rec or s not in fwd_ids or s == hs[3].id or "param" in jg.Tensor(g, s).flags \
                    or s == loss.id or jg.Tensor(g, s).op in ("input", "const")


def test_sqrt_cuts_the_peak_of_a_deep_chain():
    g, x, loss, hs, Ws = chain(100, B=64, D=64, dtype=np.float32)
    none = jg.build_backward(jg.build_forward(loss))
    g2, x2, loss2, hs2, Ws2 = chain(100, B=64, D=64, dtype=np.float32)
    sq = jg.build_backward(jg.build_forward(loss2), checkpoints="sqrt")
    assert sq.peak_bytes <= 0.25 * none.peak_bytes
    n_ck = sum(1 for h in hs2 if "checkpoint" in h.flags)
    assert 7 <= n_ck <= 14                                     # about sqrt(100) checkpoints


def test_dropout_masks_are_counter_based():
    n = 20000
    u1 = np.array([dropout_uniform(1, 50, i) for i in range(n)])
    u2 = np.array([dropout_uniform(2, 50, i) for i in range(n)])
    u3 = np.array([dropout_uniform(1, 51, i) for i in range(n)])
    assert np.array_equal(u1, [dropout_uniform(1, 50, i) for i in range(n)])   # a pure function
    for u in (u1, u2, u3):
        assert 0.0 <= u.min() and u.max() < 1.0
        assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    m1, m2, m3 = u1 >= 0.3, u2 >= 0.3, u3 >= 0.3
    for a, b in ((m1, m2), (m1, m3), (m2, m3)):               # independent masks
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
    # the graph op draws exactly these masks
    g = jg.Graph(np.float64)
    x = g.input((n,), name="x")
    d = jg.dropout(x, 0.3, seed=1)
    out = jg.build_forward(d).run({x: np.ones(n)})
    keep = np.array([dropout_uniform(1, d.id, i) for i in range(n)]) >= 0.3
    np.testing.assert_array_equal(out != 0, keep)
    np.testing.assert_allclose(out[keep], 1 / 0.7)


def test_segment_api_matches_plain_gradients_and_recomputes():
    xb = np.random.default_rng(3).standard_normal((8, 16))

    def build(use_segments):
        rng = np.random.default_rng(0)
        g = jg.Graph(np.float64)
        x = g.input((8, 16), name="x")
        Ws = [g.param(rng.standard_normal((16, 16)) * 0.3, name=f"W{i}") for i in range(6)]
        h = x
        for W in Ws:                        # closing over the loop variable W is safe
            block = lambda t: jg.layer_norm(jg.gelu(jg.dropout(t @ W, 0.2, seed=5)) + t)   # noqa: E731
            h = jg.checkpoint(block, h) if use_segments else block(h)
        return g, x, Ws, jg.mean(jg.sqr(h))

    g, x, Ws, loss = build(False)
    plain = jg.build_backward(jg.build_forward(loss))
    ref = run(plain, {x: xb}, Ws)
    g2, x2, Ws2, loss2 = build(True)
    seg = jg.build_backward(jg.build_forward(loss2))
    assert_bit_identical(run(seg, {x2: xb}, Ws2), ref)
    assert seg.stats()["n_recomputed"] > 0
    assert seg.peak_bytes < plain.peak_bytes


def test_segments_nest_and_return_tuples():
    g = jg.Graph(np.float64)
    x = g.input((4, 4), name="x")
    W = g.param(np.eye(4) * 0.5 + 0.1, name="W")

    def inner(t):
        return jg.tanh(t @ W)

    def outer(t):
        a = jg.checkpoint(inner, t)
        return jg.sigmoid(a) * 2.0, jg.exp(a)

    a, b = jg.checkpoint(outer, x)
    loss = jg.mean(a) + jg.mean(b)
    flags = {t: jg.Tensor(g, t.id).flags for t in (a, b)}
    assert all("checkpoint" in f for f in flags.values())
    inner_out = [n for n in range(len(g)) if g.nodes.op[n] == jg.registry.BY_NAME["tanh"].code][0]
    assert "checkpoint" not in jg.Tensor(g, inner_out).flags    # the outer segment owns it
    xb = np.random.default_rng(0).standard_normal((4, 4))
    seg = jg.build_backward(jg.build_forward(loss))
    got = run(seg, {x: xb}, [W])
    want = jg.check_grads(lambda W_: jg.mean(jg.sigmoid(jg.tanh(g_const(W_, xb) @ W_)) * 2.0)
                          + jg.mean(jg.exp(jg.tanh(g_const(W_, xb) @ W_))), [W.value])
    np.testing.assert_allclose(got[1][0], want.analytic[0], rtol=1e-12)


def g_const(t, value):
    return t.graph.const(value)


def test_segment_errors_leave_the_graph_usable():
    g = jg.Graph(np.float64)
    x = g.input((3,), name="x")
    with pytest.raises(ZeroDivisionError):
        jg.checkpoint(lambda t: jg.exp(t) * (1 / 0), x)
    with pytest.raises(jg.GraphError, match="must return a Tensor or a tuple of Tensors, got int"):
        jg.checkpoint(lambda t: 3, x)
    with pytest.raises(jg.GraphError, match="got an empty sequence"):
        jg.checkpoint(lambda t: (), x)
    with pytest.raises(jg.GraphError, match="segment function"):
        jg.checkpoint(x, x)
    with pytest.raises(jg.GraphError, match="needs at least one Tensor"):
        jg.checkpoint(lambda: 1)
    W = g.param(np.ones(3), name="W")
    assert g._segment_depth == 0
    y = jg.checkpoint(lambda t: jg.tanh(t * W), x)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y)))
    bwd.run({x: np.array([0.1, 0.2, 0.3])})
    np.testing.assert_allclose(W.grad, (1 - np.tanh([0.1, 0.2, 0.3]) ** 2) * [0.1, 0.2, 0.3])


def test_checkpoint_argument_errors():
    g, x, loss, hs, Ws = chain(3)
    fwd = jg.build_forward(loss)
    other = jg.Graph(np.float64).input((2,), name="stranger")
    unrelated = jg.exp(x).named("unrelated")
    with pytest.raises(jg.GraphError, match="checkpoint 'stranger' belongs to a different graph"):
        jg.build_backward(fwd, checkpoints=[other])
    with pytest.raises(jg.GraphError, match="checkpoint 'unrelated' is not in the forward graph"):
        jg.build_backward(fwd, checkpoints=[unrelated])
    with pytest.raises(jg.GraphError, match="unknown checkpoint strategy 'log'"):
        jg.build_backward(fwd, checkpoints="log")
    with pytest.raises(jg.GraphError, match="unknown policy 'save_all'"):
        jg.build_backward(fwd, policy="save_all")
    with pytest.raises(jg.GraphError, match="memory_budget must be positive"):
        jg.build_backward(fwd, memory_budget=-5)
    with pytest.raises(jg.GraphError, match="must be a number of bytes"):
        jg.build_backward(fwd, memory_budget="1MB")
    with pytest.raises(jg.GraphError, match="give memory_budget alone"):
        jg.build_backward(fwd, memory_budget=1000, checkpoints="sqrt")
    with pytest.raises(jg.GraphError, match=r"memory_budget of 10 bytes cannot be met: the smallest planned peak found is \d+ bytes"):
        jg.build_backward(fwd, memory_budget=10)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.7, 1.0])
def test_budget_plans_fit_and_use_the_budget(fraction):
    g, x, loss, hs, Ws = chain(40, B=32, D=32, dtype=np.float32)
    fwd = jg.build_forward(loss)
    rows = jg.pareto(fwd)
    lo, none = rows[0]["peak_bytes"], rows[-1]["peak_bytes"]
    budget = int(lo + fraction * (none - lo))
    bwd = jg.build_backward(fwd, memory_budget=budget)
    assert bwd.peak_bytes <= budget
    if fraction == 1.0:
        assert bwd.stats()["n_recomputed"] == 0
    else:
        assert bwd.peak_bytes >= budget - 2 * 32 * 32 * 4        # within two activations of it
    if fraction == 0.0:        # the smallest peak the planner names is achievable, and nothing below it
        with pytest.raises(jg.GraphError, match="smallest planned peak found is") as err:
            jg.build_backward(jg.build_forward(loss), memory_budget=64)
        floor = int(re.search(r"found is (\d+) bytes", str(err.value)).group(1))
        assert jg.build_backward(jg.build_forward(loss), memory_budget=floor).peak_bytes <= floor
        with pytest.raises(jg.GraphError, match=f"smallest planned peak found is {floor} bytes"):
            jg.build_backward(jg.build_forward(loss), memory_budget=floor - 1)


def brute_force_frontier(n_layers):
    """{exact peak: least recompute flops} over every subset of kept tensors, of unfused
    programs: the budget search's model of a plan's peak (fused programs' peaks it
    measures, and fits, but a group's lifetimes are outside its dynamic program)."""
    from jitgraph.backward import differentiate
    from jitgraph.checkpoint import Planner
    g, x, loss, hs, Ws = chain(n_layers, B=8, D=8)
    fwd = jg.build_forward(loss)
    first = g.nodes.n
    _, grads = differentiate(g, fwd.order, loss.id)
    planner = Planner(g, fwd, first, g.nodes.n, grads, True, fuse=False)
    computed = [n for n in fwd.order.tolist() if jg.Tensor(g, n).op in ("matmul", "relu", "sqr")]
    best = {}
    for r in range(len(computed) + 1):
        for kept in itertools.combinations(computed, r):
            peak, flops, _ = planner.trial.run(planner.keep(kept_ids=list(kept)))
            best[peak] = min(best.get(peak, flops), flops)
    return best


@pytest.mark.parametrize("n_layers", [3, 4, 6])
def test_budget_plan_is_optimal_on_chains(n_layers):
    """Against every subset of kept tensors: for each budget, no plan that fits
    recomputes fewer flops than memory_budget's choice."""
    frontier = brute_force_frontier(n_layers)
    budgets = sorted(frontier)
    for budget in budgets + [b + 100 for b in budgets[:-1]]:
        optimum = min(f for p, f in frontier.items() if p <= budget)
        g, x, loss, hs, Ws = chain(n_layers, B=8, D=8)
        bwd = jg.build_backward(jg.build_forward(loss, fuse=False), memory_budget=budget, fuse=False)
        assert bwd.peak_bytes <= budget
        assert bwd.stats()["recompute_flops"] == optimum, (budget, frontier)
        fused = jg.build_backward(jg.build_forward(loss), memory_budget=budget)   # priced fused: fits too
        assert fused.peak_bytes <= budget


def test_pareto_frontier():
    g, x, loss, hs, Ws = chain(30, B=32, D=32, dtype=np.float32)
    fwd = jg.build_forward(loss)
    n_before = len(g)
    rows = jg.pareto(fwd)
    assert len(g) == n_before                                  # a scratch copy did the work
    assert len(rows) >= 3
    peaks = [r["peak_bytes"] for r in rows]
    flops = [r["recompute_flops"] for r in rows]
    assert peaks == sorted(peaks) and flops == sorted(flops, reverse=True)
    assert rows[-1]["recompute_flops"] == 0 and rows[-1]["strategy"] == "none"
    none = jg.build_backward(fwd)
    assert rows[-1]["peak_bytes"] == none.peak_bytes
    # each point is a real plan: asking for its peak as a budget gets at most that flops count
    mid = rows[len(rows) // 2]
    g2, x2, loss2, hs2, Ws2 = chain(30, B=32, D=32, dtype=np.float32)
    bwd = jg.build_backward(jg.build_forward(loss2), memory_budget=mid["peak_bytes"])
    assert bwd.peak_bytes <= mid["peak_bytes"]
    assert bwd.stats()["recompute_flops"] <= mid["recompute_flops"]


def test_pareto_measured_on_request():
    """feeds= runs every row's plan and the plain one (on scratch copies) and reports measured
    time beside the prediction; the graph is left as it was; bad feeds name the problem."""
    g, x, loss, hs, Ws = chain(12, B=64, D=32, dtype=np.float32)
    fwd = jg.build_forward(loss)
    n_before = len(g)
    xv = np.random.default_rng(5).standard_normal((64, 32)).astype(np.float32)
    rows = jg.pareto(fwd, n_budgets=4, costs="measured", feeds={x: xv}, repeats=2)
    assert len(g) == n_before
    assert len(rows) >= 2
    plain = rows[0]["plain_seconds"]
    for r in rows:
        assert r["measured_seconds"] > 0 and r["plain_seconds"] == plain
        assert r["measured_recompute_seconds"] == pytest.approx(r["measured_seconds"] - plain)
        assert "recompute_seconds" in r                           # the prediction, beside it
    assert rows[-1]["strategy"] == "none"
    by_name = jg.pareto(fwd, n_budgets=4, costs="flops", feeds={"x": xv}, repeats=1)
    assert [r["peak_bytes"] for r in by_name] == [r["peak_bytes"] for r in jg.pareto(fwd, n_budgets=4, costs="flops")]
    with pytest.raises(jg.GraphError, match="repeats"):
        jg.pareto(fwd, feeds={x: xv}, repeats=0)
    with pytest.raises(jg.GraphError, match="feeds"):
        jg.pareto(fwd, feeds=[xv])
    other = chain(12, B=64, D=32, dtype=np.float32)[1]                # another graph's input
    with pytest.raises(jg.GraphError, match="input tensors"):
        jg.pareto(fwd, feeds={other: xv})
    with pytest.raises(jg.GraphError, match="x"):
        jg.pareto(fwd, n_budgets=2, feeds={x: xv[:3]})
    assert len(g) == n_before
