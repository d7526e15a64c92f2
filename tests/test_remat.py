"""Rematerialization (build_backward's ``remat``, cost.not_worth_saving): a cheap forward
value the backward pass reads is recomputed where it is read, instead of saved, when what
it is made from is saved anyway.  The gradients keep their bits, the plan never saves
more, and what is dropped is exactly the cheap tensors remade through at most
MAX_REMAT_DEPTH cheap steps."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitgraph as jg
from jitgraph.cost import MAX_REMAT_DEPTH, REMAT_MIN_ELEMENTS
from jitgraph.errors import GraphError
from jitgraph.ir import F_RECOMPUTED

from .conftest import examples
from .graphgen import instance, programs
from .naive import REF
from .test_fusion import bits, naive_model
from .test_plan import check_no_overlap


def grads_bits(bwd, params, feeds=None):
    value = bwd.run(feeds or {})
    return [bits(value)] + [bits(bwd.grad(p)) for p in params if p.id in bwd.params]


def recomputed_ops(bwd):
    nodes = bwd.graph.nodes
    return sorted(jg.Tensor(bwd.graph, int(n)).op for n in bwd.order if nodes.flags[n] & F_RECOMPUTED)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(n for n in REF if REF[n].grad))
def test_remat_keeps_the_bits_of_every_op(name, dtype):
    g, loss, params = naive_model(name, dtype)
    fwd = jg.build_forward(loss)
    remade = jg.build_backward(fwd, remat=True)
    saved = jg.build_backward(fwd, remat=False)
    assert grads_bits(remade, params) == grads_bits(saved, params), name
    assert remade.peak_bytes <= saved.peak_bytes, name
    assert saved.stats()["n_recomputed"] == 0


def mlp(D, dtype=np.float32, B=8, layers=3):
    """``layers`` residual blocks x + gelu(x @ W1) @ W2: every block's gelu output is read by
    its W2's gradient and remade from the product (gelu_d reads it)."""
    rng = np.random.default_rng(1)
    g = jg.Graph(dtype)
    x = g.input((B, D), name="x")
    params, h = [], x
    for i in range(layers):
        W1 = g.param((rng.standard_normal((D, 4 * D)) / np.sqrt(D)).astype(dtype), name=f"W1_{i}")
        W2 = g.param((rng.standard_normal((4 * D, D)) / np.sqrt(4 * D)).astype(dtype), name=f"W2_{i}")
        h = h + jg.gelu(h @ W1) @ W2
        params += [W1, W2]
    loss = jg.mean(jg.sqr(h))
    return g, x, loss, params, {x: rng.standard_normal((B, D)).astype(dtype)}


def test_gelu_is_remade_not_saved():
    g, x, loss, params, feeds = mlp(64)
    fwd = jg.build_forward(loss)
    remade = jg.build_backward(fwd, remat=True)
    saved = jg.build_backward(fwd, remat=False)
    assert recomputed_ops(remade) == ["gelu"] * 3 and recomputed_ops(saved) == []
    assert grads_bits(remade, params, feeds) == grads_bits(saved, params, feeds)
    gelu_bytes = 8 * 4 * 64 * 4
    assert remade.peak_bytes <= saved.peak_bytes - gelu_bytes    # two of three leave what backward holds
    for prog in (remade, saved):
        check_no_overlap(prog)


def test_auto_remakes_only_big_tensors():
    g, x, loss, params, feeds = mlp(32)                          # gelus: 8 x 128 elements
    assert recomputed_ops(jg.build_backward(jg.build_forward(loss))) == []
    B = REMAT_MIN_ELEMENTS // 128                                # gelus: exactly REMAT_MIN_ELEMENTS
    g, x, loss, params, feeds = mlp(32, B=B)
    fwd = jg.build_forward(loss)
    auto, saved = jg.build_backward(fwd), jg.build_backward(fwd, remat=False)
    assert recomputed_ops(auto) == ["gelu"] * 3
    assert auto.peak_bytes < saved.peak_bytes
    assert grads_bits(auto, params, feeds) == grads_bits(saved, params, feeds)


@pytest.mark.parametrize("steps", [1, MAX_REMAT_DEPTH, MAX_REMAT_DEPTH + 1])
def test_a_remake_goes_through_at_most_max_depth_cheap_steps(steps):
    """Three blocks: t = tanh(h @ W) is saved (tanh's rule reads it); u = ``steps`` cheap
    adds and muls of constant arrays on t (whose rules read no value), read by sin's rule:
    remade (those adds and muls recomputed) up to MAX_REMAT_DEPTH steps, else saved."""
    rng = np.random.default_rng(2)
    g = jg.Graph(np.float64)
    x = g.input((16, 12), name="x")
    Ws, h = [], x
    for _ in range(3):
        Ws.append(g.param(rng.standard_normal((12, 12)) / 4, name=f"W{len(Ws)}"))
        u = jg.tanh(h @ Ws[-1])
        for k in range(steps):
            c = g.const(rng.uniform(0.5, 1.5, (16, 12)))
            u = u * c if k % 2 else u + c
        h = jg.sin(u)
    loss = jg.sum(h)
    fwd = jg.build_forward(loss)
    remade, saved = jg.build_backward(fwd, remat=True), jg.build_backward(fwd, remat=False)
    cheap = [op for op in recomputed_ops(remade) if op in ("add", "mul")]
    want = (["add"] * ((steps + 1) // 2) + ["mul"] * (steps // 2)) * 3
    assert cheap == (sorted(want) if steps <= MAX_REMAT_DEPTH else [])
    assert remade.peak_bytes < saved.peak_bytes or steps > MAX_REMAT_DEPTH
    feeds = {x: rng.standard_normal((16, 12))}
    assert grads_bits(remade, Ws, feeds) == grads_bits(saved, Ws, feeds)


def test_a_value_whose_sources_die_in_the_forward_pass_is_saved():
    """relu(x @ W) read by W2's gradient: relu's source (the product) is not read by the
    backward pass (relu's rule reads the output), so remaking relu would keep the product
    alive instead -- it stays saved."""
    rng = np.random.default_rng(3)
    g = jg.Graph(np.float64)
    x = g.input((4, 6), name="x")
    W, W2 = g.param(rng.standard_normal((6, 6)), name="W"), g.param(rng.standard_normal((6, 3)), name="W2")
    loss = jg.sum(jg.relu(x @ W) @ W2)
    assert recomputed_ops(jg.build_backward(jg.build_forward(loss), remat=True)) == []


def test_remade_gradients_match_finite_differences():
    g, x, loss, params, feeds = mlp(6, dtype=np.float64, B=3)
    W1 = params[0]
    bwd = jg.build_backward(jg.build_forward(loss), remat=True)
    assert "gelu" in recomputed_ops(bwd)
    bwd.run(feeds)
    analytic = bwd.grad(W1).copy()
    fwd = jg.build_forward(loss)
    eps, base = 1e-6, W1.value.copy()
    numeric = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        for sign in (1, -1):
            w = base.copy()
            w[i] += sign * eps
            W1.value = w
            numeric[i] += sign * float(fwd.run(feeds)) / (2 * eps)
    W1.value = base
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("checkpoints", [None, "sqrt"])
@pytest.mark.parametrize("threads", [1, 2])
def test_remat_with_checkpoints_fusion_and_threads_keeps_the_bits(checkpoints, threads):
    g, x, loss, params, feeds = mlp(48, B=16)
    fwd = jg.build_forward(loss)
    want = grads_bits(jg.build_backward(fwd, remat=False, fuse=False), params, feeds)
    before = jg.get_num_threads()
    try:
        jg.set_num_threads(threads)
        for fuse in (True, False):
            bwd = jg.build_backward(fwd, checkpoints=checkpoints, remat=True, fuse=fuse)
            assert grads_bits(bwd, params, feeds) == want, (checkpoints, fuse)
    finally:
        jg.set_num_threads(before)


@given(programs(), st.integers(0, 3))
@settings(max_examples=examples(40))
def test_random_programs_remade_keep_bits_and_never_save_more(program, seed):
    g, ps, vals, loss, params, weights = instance(program, seed)
    fwd = jg.build_forward(loss)
    remade, saved = jg.build_backward(fwd, remat=True), jg.build_backward(fwd, remat=False)
    check_no_overlap(remade)
    ps = [p for p in ps if p.id in saved.params]
    assert grads_bits(remade, ps) == grads_bits(saved, ps)
    assert remade.peak_bytes <= saved.peak_bytes


def test_remat_must_be_a_known_choice():
    g, x, loss, params, feeds = mlp(8)
    for bad in ("yes", 1, None):
        with pytest.raises(GraphError, match="remat must be True, False or 'auto'"):
            jg.build_backward(jg.build_forward(loss), remat=bad)


def test_memory_budget_and_pareto_weigh_the_remade_plain_plan():
    """A budget the remade plain plan meets gets it (the least recompute: three gelus), not a
    checkpoint plan; pareto lists it as strategy "remat"."""
    g, x, loss, params, feeds = mlp(64)
    fwd = jg.build_forward(loss)
    remade, saved = jg.build_backward(fwd, remat=True), jg.build_backward(fwd, remat=False)
    assert remade.peak_bytes < saved.peak_bytes
    fit = jg.build_backward(fwd, memory_budget=remade.peak_bytes, remat=True)
    assert fit.peak_bytes <= remade.peak_bytes and recomputed_ops(fit) == ["gelu"] * 3
    assert grads_bits(fit, params, feeds) == grads_bits(saved, params, feeds)
    rows = jg.pareto(fwd, remat=True)
    row = next(r for r in rows if r["strategy"] == "remat")
    assert row["n_recomputed"] == 3 and row["peak_bytes"] < max(r["peak_bytes"] for r in rows)
    assert all(r["strategy"] != "remat" for r in jg.pareto(fwd, remat=False))
    with pytest.raises(GraphError, match="pareto: remat must be"):
        jg.pareto(fwd, remat="no")
