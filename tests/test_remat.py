"""Rematerialization (build_backward's ``remat``, cost.not_worth_saving): a cheap forward
value the backward pass reads is recomputed where it is read, instead of saved, when what
it is made from is saved anyway.  The gradients keep their bits, the plan never saves
more, and what is dropped is exactly the cheap tensors remade through at most
MAX_REMAT_DEPTH cheap steps."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitgraph as jg
from jitgraph import registry
from jitgraph.cost import AGAIN, MAX_REMAT_DEPTH, ON_THE_WAY, REMAT_MIN_ELEMENTS, analyze_forward, copied_again, remake_table
from jitgraph.errors import GraphError
from jitgraph.ir import F_RECOMPUTED
from jitgraph.plan import K_VIEW

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


# ---- inside a recomputed segment: cheap copies made again for their backward readers ---------

def gelu_blocks(D, dtype, B=8, layers=3):
    """mlp's residual blocks, with the block outputs (the checkpoints a plan keeps) too."""
    rng = np.random.default_rng(4)
    g = jg.Graph(dtype)
    x = g.input((B, D), name="x")
    params, h, outs = [], x, []
    for i in range(layers):
        W1 = g.param((rng.standard_normal((D, 4 * D)) / np.sqrt(D)).astype(dtype), name=f"W1_{i}")
        W2 = g.param((rng.standard_normal((4 * D, D)) / np.sqrt(4 * D)).astype(dtype), name=f"W2_{i}")
        h = h + jg.gelu(h @ W1) @ W2
        params += [W1, W2]
        outs.append(h)
    return g, jg.mean(jg.sqr(h)), params, outs, {x: rng.standard_normal((B, D)).astype(dtype)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_recomputed_gelu_is_copied_again_for_its_gradient(dtype):
    """Only the first block's output is kept: the backward pass reads blocks 2's and 3's
    outputs first (sqr's rule, the residual), and remaking them recomputes those blocks whole
    -- each gelu read by its product -- long before the W2 gradients read the gelus.  remat
    copies those two gelus again right before that read (from the products gelu_d reads
    anyway), so the first copies die with the recomputation: a gelu fewer at the peak, the
    same bits as the plan without copies and as no checkpoints at all."""
    g, loss, params, outs, feeds = gelu_blocks(32, dtype)
    fwd = jg.build_forward(loss)
    plain = grads_bits(jg.build_backward(fwd, remat=False), params, feeds)
    again = jg.build_backward(fwd, checkpoints=[outs[0]], remat=True)
    once = jg.build_backward(fwd, checkpoints=[outs[0]], remat=False)
    assert "cheap values copied again for backward" in again.stats()["plan"]
    assert "copied again" not in once.stats()["plan"]
    assert recomputed_ops(again).count("gelu") == recomputed_ops(once).count("gelu") + 2
    assert [op for op in recomputed_ops(again) if op != "gelu"] == [op for op in recomputed_ops(once) if op != "gelu"]
    gelu_bytes = 8 * 4 * 32 * np.dtype(dtype).itemsize
    assert again.peak_bytes <= once.peak_bytes - gelu_bytes
    assert grads_bits(again, params, feeds) == grads_bits(once, params, feeds) == plain
    for prog in (again, once):
        check_no_overlap(prog)


def test_copies_again_only_what_is_made_from_what_backward_holds():
    """cost.copied_again on a chain like a convolution's: p = x @ W (read by the mul's rule, so
    alive for backward), n = p * p + c (the mul and the add: read by no rule, steps on the way),
    r = tanh(n) (its rule reads r): r is copied again, the mul and the add on its way; the
    product never (not cheap)."""
    rng = np.random.default_rng(5)
    g = jg.Graph(np.float64)
    x = g.input((4, 6), name="x")
    W = g.param(rng.standard_normal((6, 6)), name="W")
    c = g.const(rng.standard_normal((4, 6)))
    p = x @ W
    sq = p * p
    n = sq + c
    r = jg.tanh(n)
    loss = jg.sum(r)
    fwd = jg.build_forward(loss)
    first = g.nodes.n
    jg.build_backward(fwd, remat=False)                    # the plain backward pass: nodes [first, end)
    saved = analyze_forward(g.nodes.arrays(), first, fwd.order, first, g.nodes.n, registry.table("flops"),
                            registry.table("kind"), K_VIEW)[0]
    keep = np.zeros(first, np.uint8)
    keep[[x.id, W.id, c.id]] = 1
    out = copied_again(g.nodes.arrays(), fwd.order, saved, keep, remake_table(), registry.table("kind"), K_VIEW, 0)
    assert saved[p.id] and saved[r.id] and not saved[n.id]
    assert out[r.id] == AGAIN and out[n.id] == ON_THE_WAY and out[p.id] == 0
    assert out[sq.id] == ON_THE_WAY   # read by no rule either: the first of r's MAX_REMAT_DEPTH steps


@given(programs(), st.integers(0, 3))
@settings(max_examples=examples(40))
def test_random_checkpointed_programs_copied_again_keep_bits_and_never_peak_higher(program, seed):
    g, ps, vals, loss, params, weights = instance(program, seed)
    fwd = jg.build_forward(loss)
    plain = jg.build_backward(fwd, remat=False)
    ps = [p for p in ps if p.id in plain.params]
    want = grads_bits(plain, ps)
    for checkpoints in ("sqrt", []):
        again = jg.build_backward(fwd, checkpoints=checkpoints, remat=True)
        once = jg.build_backward(fwd, checkpoints=checkpoints, remat=False)
        check_no_overlap(again)
        assert grads_bits(again, ps) == grads_bits(once, ps) == want
        assert again.peak_bytes <= once.peak_bytes


def test_a_checkpoint_segment_copies_its_gelus_again_too():
    """jg.checkpoint over two blocks: recomputing the segment for the second block's backward
    makes the first block's gelu long before W2_0's gradient reads it -- copied again there,
    with the bits of the plan that saves everything."""
    rng = np.random.default_rng(6)
    g = jg.Graph(np.float64)
    x = g.input((8, 32), name="x")
    Ws = [g.param(rng.standard_normal(shape) / np.sqrt(shape[0]), name=f"W{i}")
          for i, shape in enumerate([(32, 128), (128, 32)] * 2)]

    def two_blocks(h):
        for W1, W2 in (Ws[:2], Ws[2:]):
            h = h + jg.gelu(h @ W1) @ W2
        return h
    loss = jg.mean(jg.sqr(jg.checkpoint(two_blocks, x)))
    feeds = {x: rng.standard_normal((8, 32))}
    fwd = jg.build_forward(loss)
    again, once = jg.build_backward(fwd, remat=True), jg.build_backward(fwd, remat=False)
    assert again.stats()["plan"] == "jg.checkpoint segments, cheap values copied again for backward"
    assert once.stats()["plan"] == "jg.checkpoint segments"
    assert again.peak_bytes < once.peak_bytes
    plain = jg.build_backward(jg.build_forward(jg.mean(jg.sqr(two_blocks(x)))), remat=False)   # no segment
    assert grads_bits(again, Ws, feeds) == grads_bits(once, Ws, feeds) == grads_bits(plain, Ws, feeds)
