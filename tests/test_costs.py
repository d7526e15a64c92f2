"""The checkpoint planners' prices (jitgraph/timing.py): recomputing a node costs its kernel's
time measured on this host (costs="measured", cached per host) or its FLOPs (costs="flops",
the suite's default: tests/conftest.py); stats() says what a strategy chose."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph import timing
from jitgraph.cost import node_flops
from jitgraph.registry import table


def chain(n_layers=12, B=64, D=32, dropout=True, seed=0):
    rng = np.random.default_rng(seed)
    g = jg.Graph(np.float32)
    x = g.input((B, D), name="x")
    h = x
    for i in range(n_layers):
        h = jg.relu(h @ g.param(rng.standard_normal((D, D)) * 1.4 / np.sqrt(D), name=f"W{i}"))
        if dropout:
            h = jg.dropout(h, 0.1, seed=i)
    return jg.build_forward(jg.mean(h)), {x: rng.standard_normal((B, D)).astype(np.float32)}


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cost cache of the test's own, empty."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(timing, "_memo", {})
    return tmp_path


def test_measured_costs_time_each_computed_node_once_per_host(own_cache, monkeypatch):
    fwd, _ = chain()
    g = fwd.graph
    calls = []
    measure = timing._measure
    monkeypatch.setattr(timing, "_measure", lambda graph, f: calls.append(1) or measure(graph, f))
    ns = timing.node_costs(g, fwd, "measured")
    ops = {jg.registry.OPS[int(g.nodes.op[n])].name: n for n in fwd.order}
    assert all(ns[ops[name]] > 0 for name in ("matmul", "relu", "dropout", "mean"))
    leaves = fwd.order[(g.nodes.flags[fwd.order] & jg.ir.F_LEAF) != 0]
    assert leaves.size and not ns[leaves].any()
    assert calls == [1] and list((own_cache / "jitgraph" / "costs").glob("k-*.json"))
    again, _ = chain(seed=1)                      # the same shapes: every figure from the cache
    monkeypatch.setattr(timing, "_memo", {})     # as a new process would read it
    assert timing.node_costs(again.graph, again, "measured")[again.order].sum() > 0 and calls == [1]
    wider, _ = chain(D=48)                         # new shapes: measured
    timing.node_costs(wider.graph, wider, "measured")
    assert calls == [1, 1]


def test_one_figure_per_kind_of_node(own_cache):
    """Nodes that differ only in a dropout's seed (each layer's its own) do the same work:
    one cache entry, one figure; another shape or p is another kind."""
    fwd, _ = chain(n_layers=6)
    g = fwd.graph
    ns = timing.node_costs(g, fwd, "measured")
    by_op = {}
    for n in fwd.order:
        by_op.setdefault(jg.registry.OPS[int(g.nodes.op[n])].name, set()).add(int(ns[n]))
    assert len(by_op["dropout"]) == 1 and len(by_op["matmul"]) == 1 and len(by_op["relu"]) == 1
    table = timing._table(timing._path())
    assert sum(k.startswith("dropout|") for k in table) == 1
    h = jg.dropout(fwd.outputs[0].graph.input((64, 32), name="y"), 0.2, seed=3)
    timing.node_costs(h.graph, jg.build_forward(jg.mean(h)), "measured")
    assert sum(k.startswith("dropout|") for k in timing._table(timing._path())) == 2


def test_flop_costs_are_the_flop_model():
    fwd, _ = chain(3)
    G = fwd.graph.nodes.arrays()
    got = timing.node_costs(fwd.graph, fwd, "flops")
    want = [0 if fwd.graph.nodes.flags[n] & jg.ir.F_LEAF else node_flops(G, n, table("flops")) for n in fwd.order]
    assert got[fwd.order].tolist() == want


def test_a_budget_priced_in_time_fits_and_keeps_the_bits(own_cache):
    fwd, feeds = chain(24)
    plain = jg.build_backward(fwd)
    want = [np.asarray(plain.run(feeds))] + [plain.grad(jg.Tensor(plain.graph, p)).copy() for p in plain.params]
    budget = plain.peak_bytes // 4
    b = jg.build_backward(jg.build_forward(fwd.outputs[0]), memory_budget=budget, costs="measured")
    assert b.peak_bytes <= budget
    got = [np.asarray(b.run(feeds))] + [b.grad(jg.Tensor(b.graph, p)) for p in b.params]
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    st = b.stats()
    assert st["costs"] == "measured" and st["plan"].startswith("memory_budget: ")
    assert st["n_recomputed"] > 0 and 0 < st["predicted_recompute_seconds"] < 1.0


def test_the_frontier_in_time(own_cache):
    fwd, _ = chain(16)
    rows = jg.pareto(fwd, costs="measured")
    assert len(rows) >= 3
    for a, b in zip(rows, rows[1:]):
        assert a["peak_bytes"] <= b["peak_bytes"] and a["recompute_cost"] > b["recompute_cost"]
    assert all(r["recompute_seconds"] == pytest.approx(r["recompute_cost"] * 1e-9) for r in rows)
    flops = jg.pareto(fwd, costs="flops")
    assert all("recompute_seconds" not in r and r["recompute_cost"] == r["recompute_flops"] for r in flops)


def test_costs_are_named(monkeypatch):
    fwd, _ = chain(2)
    with pytest.raises(jg.GraphError, match="costs must be one of 'measured', 'flops', got 'time'"):
        jg.build_backward(fwd, memory_budget=10_000, costs="time")
    monkeypatch.setenv("JITGRAPH_COSTS", "seconds")
    with pytest.raises(jg.GraphError, match="got 'seconds'"):
        jg.pareto(fwd)


def test_stats_say_what_the_strategy_chose():
    def plan(**kw):
        fwd, _ = chain(16)
        return jg.build_backward(fwd, **kw).stats()["plan"]
    assert plan() == "none" and plan(remat=True).endswith("(remat)")
    assert plan(checkpoints="sqrt").startswith("sqrt: ") and plan(policy="save_matmuls") == "policy save_matmuls"
    assert plan(checkpoints="revolve", slots=3).startswith("revolve, 3 slots over ")
    fwd, _ = chain(16)
    plain = jg.build_backward(fwd)
    assert plan(memory_budget=plain.peak_bytes) == "memory_budget: none (the plain plan fits)"
    assert plan(memory_budget=plain.peak_bytes // 3).startswith("memory_budget: ")
