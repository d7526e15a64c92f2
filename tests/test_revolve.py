"""Multi-level recomputation: Revolve's binomial schedules (checkpoints="revolve"),
budgets below what one level reaches, the frontier's multi-level rows, and that
every such plan stays bit-identical to no checkpointing."""
import functools
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitgraph as jg
from jitgraph.backward import differentiate
from jitgraph.checkpoint import Planner
from jitgraph.strategies import apply
from jitgraph.ir import F_RECOMPUTED
from jitgraph.revolve import default_slots, optimal_steps, repetitions

from .conftest import examples
from .graphgen import instance, programs
from .test_checkpoint import assert_bit_identical, chain, run


@functools.lru_cache(maxsize=None)
def brute_force_steps(l, s):
    """Fewest step evaluations beyond the first sweep that reverse l steps with s slots
    (the start's included), over every place to store the next state."""
    if l <= 1:
        return 0
    if s == 1:                                  # every reversal recomputes from the start
        return l * (l - 1) // 2
    return min(m + brute_force_steps(l - m, s - 1) + brute_force_steps(m, s) for m in range(1, l))


def binomial(n, k):
    out = 1
    for i in range(k):
        out = out * (n - i) // (i + 1)
    return out


def test_the_formula_is_the_brute_force_optimum():
    for s in range(1, 11):
        for l in range(1, 61):
            r = next(r for r in range(l + 1) if binomial(s + r, s) >= l)
            assert repetitions(l, s)[0] == r
            want = 0 if l == 1 else r * l - binomial(s + r, s + 1)
            assert brute_force_steps(l, s) == want == optimal_steps(l, s), (l, s)


def tiny_chain(n, **kw):
    """An n-layer relu chain: n steps between n - 1 narrow points backward reads."""
    return chain(n, B=2, D=2, **kw)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20, 64, 200])
def test_recomputed_steps_equal_revolves_optimum(n):
    for s in range(1, 11):                      # Griewank's slots: the input holds the first
        g, x, loss, hs, Ws = tiny_chain(n)
        bwd = jg.build_backward(jg.build_forward(loss), checkpoints="revolve", slots=s - 1)
        st_ = bwd.stats()
        assert st_["recompute_steps"] == optimal_steps(n, s), (n, s)
        # each step evaluation recomputes both of the layer's nodes (matmul, relu)
        assert st_["n_recomputed"] == 2 * optimal_steps(n, s)
        assert st_["max_recomputations"] == repetitions(n, s)[0]


@pytest.mark.parametrize("slots", [0, 1, 3, None])
@pytest.mark.parametrize("p_drop", [0.0, 0.3])
def test_revolve_is_bit_identical_to_none(slots, p_drop):
    xb = np.random.default_rng(7).standard_normal((16, 16))
    g, x, loss, hs, Ws = chain(30, dtype=np.float32, p_drop=p_drop)
    none = jg.build_backward(jg.build_forward(loss))
    ref = run(none, {x: xb}, Ws)
    g2, x2, loss2, hs2, Ws2 = chain(30, dtype=np.float32, p_drop=p_drop)
    bwd = jg.build_backward(jg.build_forward(loss2), checkpoints="revolve", slots=slots)
    assert_bit_identical(run(bwd, {x2: xb}, Ws2), ref)
    assert np.array_equal(bwd.run({x2: xb}, debug=True), ref[0])          # nothing read after it was freed
    assert bwd.stats()["max_recomputations"] > 1
    # the stored states are flagged checkpoints, and copies of one tensor keep its origin and op
    nodes = g2.nodes
    rec = bwd.order[(nodes.flags[bwd.order] & F_RECOMPUTED) != 0]
    assert (nodes.op[rec] == nodes.op[nodes.origin[rec]]).all()
    assert all(int(o) in set(bwd.forward.order.tolist()) for o in nodes.origin[rec])


def test_default_slots_recompute_each_step_at_most_three_times():
    for n in (5, 30, 100):
        s = default_slots(n)
        assert repetitions(n, s)[0] <= 3 < repetitions(n, s - 1)[0]
        g, x, loss, hs, Ws = tiny_chain(n)
        bwd = jg.build_backward(jg.build_forward(loss), checkpoints="revolve")
        assert bwd.stats()["max_recomputations"] <= 3
        assert bwd.stats()["recompute_steps"] == optimal_steps(n, s)


@pytest.mark.parametrize("n", [30, 100])
def test_a_step_whose_backward_reads_nothing_still_stores_its_state(n):
    """A dropout's rule reads no tensor, so no backward node of a dropout step asks for the
    state Revolve stores while reversing it: the rewrite makes it when it leaves that step's
    segment, and every later step finds it stored -- each step evaluated at most the
    schedule's repetitions (3 with the default slots), not once per later step (before: a
    tensor copied 8 times at 30 layers, 13 at 100, 74 at 1000)."""
    xb = np.random.default_rng(3).standard_normal((16, 16))
    g, x, loss, hs, Ws = chain(n, dtype=np.float32, p_drop=0.1)
    ref = run(jg.build_backward(jg.build_forward(loss)), {x: xb}, Ws)
    g2, x2, loss2, hs2, Ws2 = chain(n, dtype=np.float32, p_drop=0.1)
    bwd = jg.build_backward(jg.build_forward(loss2), checkpoints="revolve")
    st_ = bwd.stats()
    steps = 2 * n                                 # two states a layer: the relu's and the dropout's
    assert st_["max_recomputations"] <= repetitions(steps, default_slots(steps))[0] <= 3
    assert st_["recompute_steps"] <= optimal_steps(steps, default_slots(steps))
    assert_bit_identical(run(bwd, {x2: xb}, Ws2), ref)
    assert np.array_equal(bwd.run({x2: xb}, debug=True), ref[0])          # nothing read after it was freed


def test_the_planned_peak_is_a_saw_tooth_of_slots_plus_a_few_activations():
    n, B, D = 60, 16, 16
    act = B * D * 4
    g, x, loss, hs, Ws = chain(n, B=B, D=D, dtype=np.float32)
    none = jg.build_backward(jg.build_forward(loss))
    peaks = []
    for slots in (0, 2, 4, 8):
        g, x, loss, hs, Ws = chain(n, B=B, D=D, dtype=np.float32)
        bwd = jg.build_backward(jg.build_forward(loss, fuse=False), checkpoints="revolve", slots=slots, fuse=False)
        peaks.append(bwd.peak_bytes)
        # at most `slots` stored states, the state a step is reversed from, its tape and gradients
        assert bwd.peak_bytes <= (slots + 5) * act
        live = bwd.memory_timeline()
        assert live.max() == bwd.peak_bytes
        # fused (each relu_d with its neighbours): no higher; the timeline may show a hole of
        # one activation at the peak (the arena's extent, not its live bytes, is the peak)
        fused = jg.build_backward(jg.build_forward(loss), checkpoints="revolve", slots=slots, fuse=True)
        assert fused.stats()["n_groups"] > 0 and fused.peak_bytes <= bwd.peak_bytes
        assert fused.peak_bytes - act <= fused.memory_timeline().max() <= fused.peak_bytes
        back = live[bwd.forward.order.size:]
        rises = np.count_nonzero((back[1:-1] > back[:-2]) & (back[1:-1] >= back[2:]))
        assert rises >= n // 2                   # recompute, free, recompute ...: a saw-tooth
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1] < none.peak_bytes / 5


def test_revolve_works_over_the_narrow_points_of_residual_blocks():
    def build(use_dropout):
        rng = np.random.default_rng(0)
        g = jg.Graph(np.float64)
        x = g.input((4, 8), name="x")
        Ws = [g.param(rng.standard_normal((8, 8)) * 0.3, name="Win")]
        h = jg.tanh(x @ Ws[0])                  # narrow points: tanh's output and each block's
        for i in range(6):
            W = g.param(rng.standard_normal((8, 8)) * 0.3, name=f"W{i}")
            Ws.append(W)
            y = jg.gelu(jg.layer_norm(h) @ W)
            h = h + (jg.dropout(y, 0.2, seed=i) if use_dropout else y)
        return g, x, Ws, jg.mean(jg.sqr(h))

    xb = np.random.default_rng(3).standard_normal((4, 8))
    for use_dropout in (False, True):
        g, x, Ws, loss = build(use_dropout)
        ref = run(jg.build_backward(jg.build_forward(loss)), {x: xb}, Ws)
        for slots in (0, 1, 2):
            g, x, Ws, loss = build(use_dropout)
            bwd = jg.build_backward(jg.build_forward(loss), checkpoints="revolve", slots=slots)
            assert_bit_identical(run(bwd, {x: xb}, Ws), ref)
            assert bwd.stats()["recompute_steps"] == optimal_steps(7, slots + 1)   # tanh, then a step per block


def multi_level(loss, slots, group, fine):
    """A BackwardGraph of the multi-level plan variant (group, fine) the budget planner weighs."""
    fwd = jg.build_forward(loss)
    g = fwd.graph
    first = g.nodes.n
    params, grads = differentiate(g, fwd.order, loss.id)
    planner = Planner(g, fwd, first, g.nodes.n, grads, True)
    apply(g, fwd, first, g.nodes.n, planner.revolve(slots, group, fine))
    return jg.BackwardGraph(fwd, params, grads)


@given(programs(max_steps=10), st.integers(0, 3), st.data())
@settings(max_examples=examples(15))
def test_random_graphs_multi_level_equal_plain_bit_for_bit(program, slots, data):
    g, ps, vals, loss, params, weights = instance(program, 0)
    plain = jg.build_backward(jg.build_forward(loss))
    used = [p for p in ps if p.id in plain.params]
    ref = run(plain, {}, used)
    bwd = jg.build_backward(jg.build_forward(loss), checkpoints="revolve", slots=slots)
    assert_bit_identical(run(bwd, {}, used), ref)
    # the other multi-level variants the budget planner weighs: coarser steps, fine tapes
    group, fine = data.draw(st.sampled_from([(1, True), (2, False), (2, True)]))
    g2, ps2, _, loss2, _, _ = instance(program, 0)
    other = multi_level(loss2, slots, group, fine)
    assert_bit_identical(run(other, {}, [p for p in ps2 if p.id in other.params]), ref)
    assert np.array_equal(other.run(debug=True), ref[0])


def one_level_floor(fwd):
    return min(r["peak_bytes"] for r in jg.pareto(fwd) if r["max_recomputations"] <= 1)


def test_budgets_below_one_level_choose_multi_level_plans():
    xb = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    g, x, loss, hs, Ws = chain(40, B=8, D=8, dtype=np.float32)
    fwd = jg.build_forward(loss)
    rows = jg.pareto(fwd)
    multi = [r for r in rows if r["max_recomputations"] > 1]
    assert multi and all(r["strategy"] == "revolve" and r["slots"] is not None for r in multi)
    floor_one = min(r["peak_bytes"] for r in rows if r["max_recomputations"] <= 1)
    assert rows[0]["peak_bytes"] < floor_one                     # the frontier goes below one level
    for key in ("recompute_steps", "max_recomputations", "slots", "group", "fine"):
        assert all(key in r for r in rows)
    ref = run(jg.build_backward(jg.build_forward(loss)), {x: xb}, Ws)
    for budget in (rows[0]["peak_bytes"], (rows[0]["peak_bytes"] + floor_one) // 2, floor_one - 1):
        g2, x2, loss2, hs2, Ws2 = chain(40, B=8, D=8, dtype=np.float32)
        bwd = jg.build_backward(jg.build_forward(loss2), memory_budget=budget)
        assert bwd.peak_bytes <= budget
        if budget == rows[0]["peak_bytes"]:        # the leanest plan found: several levels
            assert bwd.stats()["max_recomputations"] > 1
        assert_bit_identical(run(bwd, {x2: xb}, Ws2), ref)
    # the leanest multi-level plan is the floor the error names, and it is met
    g3, x3, loss3, hs3, Ws3 = chain(40, B=8, D=8, dtype=np.float32)
    with pytest.raises(jg.GraphError, match="smallest planned peak found is") as err:
        jg.build_backward(jg.build_forward(loss3), memory_budget=64)
    floor = int(re.search(r"found is (\d+) bytes", str(err.value)).group(1))
    assert floor < floor_one
    g4, x4, loss4, hs4, Ws4 = chain(40, B=8, D=8, dtype=np.float32)
    assert jg.build_backward(jg.build_forward(loss4), memory_budget=floor).peak_bytes <= floor


def test_budget_prefers_one_level_where_it_fits_and_recomputes_less():
    g, x, loss, hs, Ws = chain(40, B=8, D=8, dtype=np.float32)
    fwd = jg.build_forward(loss)
    rows = jg.pareto(fwd)
    one = [r for r in rows if r["max_recomputations"] <= 1 and r["recompute_flops"] > 0]
    for r in one:
        g2, x2, loss2, hs2, Ws2 = chain(40, B=8, D=8, dtype=np.float32)
        bwd = jg.build_backward(jg.build_forward(loss2), memory_budget=r["peak_bytes"])
        assert bwd.peak_bytes <= r["peak_bytes"]
        assert bwd.stats()["recompute_flops"] <= r["recompute_flops"]


def test_a_residual_stack_meets_half_of_sqrts_peak():
    def build():
        rng = np.random.default_rng(0)
        g = jg.Graph(np.float32)
        B, T, D = 2, 8, 8
        x = g.input((B, T, D), name="x")
        h, Ps = x, []

        def P(*s):
            Ps.append(g.param(rng.standard_normal(s) / np.sqrt(s[0])))
            return Ps[-1]

        for layer in range(4):
            a = jg.layer_norm(h)
            q, k, v = a @ P(D, D), a @ P(D, D), a @ P(D, D)
            s = jg.dropout(jg.softmax((q @ jg.transpose(k, (0, 2, 1))) * (1 / np.sqrt(D))), 0.1, seed=layer)
            h = h + (s @ v) @ P(D, D)
            h = h + jg.gelu(jg.layer_norm(h) @ P(D, 4 * D)) @ P(4 * D, D)
        return g, x, Ps, jg.mean(jg.sqr(h))

    xb = np.random.default_rng(1).standard_normal((2, 8, 8)).astype(np.float32)
    g, x, Ps, loss = build()
    ref = run(jg.build_backward(jg.build_forward(loss)), {x: xb}, Ps)
    g, x, Ps, loss = build()
    sqrt_peak = jg.build_backward(jg.build_forward(loss), checkpoints="sqrt").peak_bytes
    g, x, Ps, loss = build()
    assert one_level_floor(jg.build_forward(loss)) > sqrt_peak // 2       # one level cannot
    g, x, Ps, loss = build()
    bwd = jg.build_backward(jg.build_forward(loss), memory_budget=sqrt_peak // 2)
    assert bwd.peak_bytes <= sqrt_peak // 2
    assert bwd.stats()["max_recomputations"] > 1
    assert_bit_identical(run(bwd, {x: xb}, Ps), ref)


def test_revolve_arguments():
    g, x, loss, hs, Ws = tiny_chain(4)
    fwd = jg.build_forward(loss)
    with pytest.raises(jg.GraphError, match="slots= goes with checkpoints='revolve'"):
        jg.build_backward(fwd, slots=2)
    with pytest.raises(jg.GraphError, match="slots= goes with checkpoints='revolve'"):
        jg.build_backward(fwd, checkpoints="sqrt", slots=2)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(jg.GraphError, match="slots must be a number of stored states"):
            jg.build_backward(fwd, checkpoints="revolve", slots=bad)
    with pytest.raises(jg.GraphError, match="give no policy"):
        jg.build_backward(fwd, checkpoints="revolve", policy="save_matmuls")
    with pytest.raises(jg.GraphError, match="give memory_budget alone"):
        jg.build_backward(fwd, checkpoints="revolve", memory_budget=10 ** 6)
    with pytest.raises(jg.GraphError, match="use 'sqrt', 'revolve'"):
        jg.build_backward(fwd, checkpoints="binomial")


def test_stats_survive_save_and_load(tmp_path):
    g, x, loss, hs, Ws = tiny_chain(12)
    bwd = jg.build_backward(jg.build_forward(loss), checkpoints="revolve", slots=1)
    jg.save(tmp_path / "b.jg", bwd)
    back = jg.load(tmp_path / "b.jg")
    for key in ("recompute_steps", "max_recomputations", "n_recomputed", "peak_bytes"):
        assert back.stats()[key] == bwd.stats()[key]
    xb = np.random.default_rng(0).standard_normal((2, 2))
    assert np.array_equal(back.run({"x": xb}), bwd.run({x: xb}))
