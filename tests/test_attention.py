"""jg.attention: the fused op against numpy and against the unfused composition (matmul,
scale, causal mask, softmax, matmul) -- forward, gradients to 1e-12 in float64, finite
differences -- with the kernels' block sizes shrunk so that small shapes cross every block
boundary; checkpointing and thread counts bit for bit; bad arguments; second order refused;
and the memory plan at T = 1024 holds no (T, T) tensor per head, where the unfused one does."""
import importlib
import math

import numpy as np
import pytest
from numba import njit

import jitgraph as jg
from jitgraph import vmath
from jitgraph.interpreter import PARALLEL_MIN

from .naive import attention_ref

A = importlib.import_module("jitgraph.ops.attention")   # the module (jitgraph.ops.attention is the op)


@pytest.fixture(params=["default blocks", "small blocks"])
def blocks(request, monkeypatch):
    """The kernels' block sizes, read when a node is built: the defaults, or blocks of 3 query
    rows (2 when causal) and 5 keys, so a few rows make many blocks, several key blocks
    (online rescaling, the backward's recomputing path) and partial last blocks."""
    if request.param == "small blocks":
        monkeypatch.setattr(A, "BLOCK_ROWS", 3)
        monkeypatch.setattr(A, "BLOCK_ROWS_CAUSAL", 2)
        monkeypatch.setattr(A, "BLOCK_KEYS", 5)
    return request.param


def unfused(q, k, v, causal=False, scale=None):
    """The composition jg.attention replaces, with a -inf mask above the diagonal."""
    nd = k.ndim
    s = (q @ jg.transpose(k, tuple(range(nd - 2)) + (nd - 1, nd - 2))) * (
        1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        s = s + q.graph.const(np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), bool)), 0.0, -np.inf))
    return jg.softmax(s) @ v


# (q shape, k and v shape, causal, scale)
CASES = [((2, 3, 7, 5), (2, 3, 9, 5), False, None),
         ((2, 3, 9, 5), (2, 3, 9, 5), True, None),
         ((1, 2, 13, 4), (1, 2, 13, 4), True, 0.7),
         ((1, 11, 3), (1, 17, 3), False, -0.4),
         ((7, 4), (5, 4), True, None),             # Tq > Tk: PyTorch's top-left alignment
         ((4, 2), (12, 2), True, None)]            # Tq < Tk: the last keys are seen by no query


def _arrays(qs, ks, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(ks)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_matches_numpy(case, blocks):
    qs, ks, causal, scale = CASES[case]
    qa, ka, va = _arrays(qs, ks)
    want = attention_ref(qa, ka, va, causal, scale)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        g = jg.Graph(dtype)
        q, k, v = (g.const(a) for a in (qa, ka, va))
        out = jg.attention(q, k, v, causal=causal, scale=scale)
        got = jg.build_forward(out).run()
        assert got.shape == qs and got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _gradients(make, qa, ka, va, causal, scale):
    g = jg.Graph(np.float64)
    q, k, v = g.param(qa, name="q"), g.param(ka, name="k"), g.param(va, name="v")
    out = make(q, k, v, causal, scale)
    weights = np.cos(np.arange(out.size)).reshape(out.shape)
    bwd = jg.build_backward(jg.build_forward(jg.sum(out * g.const(weights))))
    loss = bwd.run()
    return [loss, q.grad, k.grad, v.grad], bwd


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gradients_match_the_unfused_graph(case, blocks):
    qs, ks, causal, scale = CASES[case]
    arrays = _arrays(qs, ks, seed=1)
    fused, bwd = _gradients(jg.attention, *arrays, causal, scale)
    plain, _ = _gradients(unfused, *arrays, causal, scale)
    for got, want, what in zip(fused, plain, ("loss", "dq", "dk", "dv")):
        assert np.any(want != 0), what
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=what)
    ops = [t["op"] for t in bwd.nodes()]
    assert ops.count("attention_d") == 1, "the three gradients come from one packed node"
    assert "softmax" not in ops and "matmul" not in ops


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_finite_differences(causal, blocks):
    qa, ka, va = _arrays((1, 2, 7, 3), (1, 2, 8, 3), seed=2)
    res = jg.check_grads(lambda q, k, v: jg.attention(q, k, v, causal=causal), [qa, ka, va])
    assert res.ok and res.n_checked == qa.size + ka.size + va.size, res


def test_self_attention_sums_the_three_gradients():
    """q, k and v all one tensor: three slices of the packed gradient, added."""
    xa = np.random.default_rng(3).standard_normal((2, 6, 4))
    grads = []
    for make in (jg.attention, unfused):
        g = jg.Graph(np.float64)
        x = g.param(xa, name="x")
        jg.build_backward(jg.build_forward(jg.sum(jg.sqr(make(x, x, x, True, None))))).run()
        grads.append(x.grad)
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-12)
    res = jg.check_grads(lambda x: jg.attention(x, x, x, causal=True), [xa])
    assert res.ok, res


def _block(dtype, seed=0, B=2, T=9, D=8, H=2):
    """x -> q, k, v projections -> causal attention -> projection -> mean square: (graph, x, params, loss)."""
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((B, T, D), name="x")
    Ws = [g.param(rng.standard_normal((D, D)) / math.sqrt(D), name=n) for n in ("Wq", "Wk", "Wv", "Wo")]

    def heads(t):
        return jg.transpose(jg.reshape(t, (B, T, H, D // H)), (0, 2, 1, 3))
    h = jg.tanh(x @ Ws[0])
    q, k, v = heads(h @ Ws[1]), heads(x @ Ws[2]), heads(jg.relu(x @ Ws[3]))
    o = jg.reshape(jg.transpose(jg.attention(q, k, v, causal=True), (0, 2, 1, 3)), (B, T, D))
    loss = jg.mean(jg.sqr(o @ Ws[0] + h))
    return g, x, Ws, loss, q


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_checkpointed_gradients_are_bit_identical(dtype, blocks):
    g, x, Ws, loss, q = _block(dtype)
    xv = np.random.default_rng(5).standard_normal(x.shape)
    fwd = jg.build_forward(loss)
    results = []
    for checkpoints in (None, "sqrt", [q]):
        bwd = jg.build_backward(fwd, checkpoints=checkpoints)
        if checkpoints is not None:
            assert bwd.stats()["n_recomputed"] > 0, checkpoints
        value = bwd.run({x: xv})
        results.append([np.asarray(value)] + [bwd.grad(W) for W in Ws])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("causal", [False, True])
def test_results_do_not_depend_on_the_thread_count(causal, blocks):
    qs = (2, 4, 260, 16)                         # big enough for the interpreter to split the nodes
    assert np.prod(qs) >= PARALLEL_MIN
    qa, ka, va = (a.astype(np.float32) for a in _arrays(qs, qs, seed=4))
    g = jg.Graph(np.float32)
    q, k, v = g.param(qa, name="q"), g.param(ka, name="k"), g.param(va, name="v")
    out = jg.attention(q, k, v, causal=causal)
    loss = jg.sum(out * g.const(np.sin(np.arange(out.size)).reshape(out.shape)))
    fwd, bwd = jg.build_forward(out), jg.build_backward(jg.build_forward(loss))
    got = {}
    try:
        for n in (1, 2):
            jg.set_num_threads(n)
            got[n] = [fwd.run().copy(), np.asarray(bwd.run()).copy(), q.grad, k.grad, v.grad]
    finally:
        jg.set_num_threads()
    for a, b in zip(got[1], got[2]):
        assert np.all(np.isfinite(a)) and a.tobytes() == b.tobytes()
    np.testing.assert_allclose(got[1][0], attention_ref(qa.astype(np.float64), ka, va, causal), rtol=1e-4,
                               atol=1e-4)


def _split_heads_model(dtype, read_as_they_lie, B=2, T=9, Tk=11, H=3, d=4, causal=True, seed=6):
    """Heads split from (B, T, H d) projections by reshape + transpose (0, 2, 1, 3), attention,
    the transpose back: (bwd, params, its node table's ops)."""
    A.READ_HEADS_AS_THEY_LIE = read_as_they_lie
    try:
        rng = np.random.default_rng(seed)
        g = jg.Graph(dtype)
        x = g.param(rng.standard_normal((B, T, H * d)), name="x")
        m = g.param(rng.standard_normal((B, Tk, H * d)), name="m")
        split = lambda t, n: jg.transpose(jg.reshape(t, (B, n, H, d)), (0, 2, 1, 3))      # noqa: E731
        o = jg.attention(split(jg.tanh(x), T), split(m, Tk), split(jg.sqr(m), Tk), causal=causal)
        y = jg.reshape(jg.transpose(o, (0, 2, 1, 3)), (B, T, H * d))
        loss = jg.sum(jg.sqr(y + x) * g.const(np.cos(np.arange(y.size)).reshape(y.shape)))
        bwd = jg.build_backward(jg.build_forward(loss))
    finally:
        A.READ_HEADS_AS_THEY_LIE = True
    return bwd, (x, m), [r["op"] for r in bwd.nodes()]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_heads_are_read_as_they_lie_with_the_same_bits(dtype, causal, blocks):
    """Attention reads (B, T, H, d) heads by row strides: no transpose node forward or
    backward, and the loss and gradients of the transposing program, bit for bit."""
    results = {}
    for lie in (True, False):
        bwd, params, ops = _split_heads_model(dtype, lie, causal=causal)
        results[lie] = [np.asarray(bwd.run())] + [bwd.grad(p).copy() for p in params]
        assert ("transpose" in ops) is not lie, ops
        assert ops.count("attention") == ops.count("attention_d") == 1
    for a, b in zip(results[True], results[False]):
        assert np.any(a != 0) and a.tobytes() == b.tobytes()


def test_split_heads_gradients_match_finite_differences():
    B, T, H, d = 2, 5, 2, 3

    def f(x, m):
        split = lambda t: jg.transpose(jg.reshape(t, (B, T, H, d)), (0, 2, 1, 3))      # noqa: E731
        o = jg.attention(split(x), split(m), split(jg.tanh(m)), causal=True)
        return jg.reshape(jg.transpose(o, (0, 2, 1, 3)), (B, T, H * d))
    rng = np.random.default_rng(7)
    xa, ma = rng.standard_normal((B, T, H * d)), rng.standard_normal((B, T, H * d))
    res = jg.check_grads(f, [xa, ma])
    assert res.ok and res.n_checked == xa.size + ma.size, res


def test_split_heads_do_not_depend_on_the_thread_count():
    bwd, params, ops = _split_heads_model(np.float32, True, B=2, T=130, Tk=130, H=4, d=16)
    assert "transpose" not in ops
    got = {}
    try:
        for n in (1, 2):
            jg.set_num_threads(n)
            got[n] = [np.asarray(bwd.run()).copy()] + [bwd.grad(p).copy() for p in params]
    finally:
        jg.set_num_threads()
    for a, b in zip(got[1], got[2]):
        assert np.all(np.isfinite(a)) and a.tobytes() == b.tobytes()


def test_a_transpose_undone_is_its_source_and_a_checkpoint_on_a_split_head_works():
    g = jg.Graph(np.float64)
    x = g.param(np.arange(24.0).reshape(2, 3, 4), name="x")
    t = jg.transpose(x, (1, 2, 0))
    assert jg.transpose(t, (2, 0, 1)).id == x.id                  # the inverse: x, no copy
    other = jg.transpose(t, (1, 0, 2))                            # not the inverse: a transpose
    assert other.id != x.id and other.shape == (4, 3, 2)
    np.testing.assert_array_equal(jg.build_forward(other).run(), x.value.transpose(2, 1, 0))
    _, x_, _, loss, q = _block(np.float64)                        # q: a split head attention reads through
    plain = jg.build_backward(jg.build_forward(loss))
    kept = jg.build_backward(jg.build_forward(loss), checkpoints=[q])
    assert kept.stats()["n_recomputed"] > 0
    xv = np.random.default_rng(8).standard_normal(x_.shape)
    assert np.asarray(plain.run({x_: xv})).tobytes() == np.asarray(kept.run({x_: xv})).tobytes()


def _planned_sizes(fused, causal, B=1, H=4, T=1024, d=64):
    """(the most elements per head of a tensor in the fwd+bwd plan, its peak bytes)."""
    g = jg.Graph(np.float32)
    q, k, v = (g.param(np.zeros((B, H, T, d)), name=n) for n in "qkv")
    out = jg.attention(q, k, v, causal=causal) if fused else unfused(q, k, v, causal)
    bwd = jg.build_backward(jg.build_forward(jg.mean(jg.sqr(out))))
    rows = bwd.nodes()
    assert {"q", "k", "v"} <= {r["name"] for r in rows if "param_grad" in r["flags"] or r["name"]}
    return max(r["bytes"] // 4 for r in rows) // (B * H), bwd.peak_bytes


@pytest.mark.parametrize("causal", [False, True])
def test_the_plan_holds_no_t_by_t_tensor_per_head(causal):
    T = 1024
    biggest, peak = _planned_sizes(True, causal)
    assert biggest < T * T, f"a planned tensor has {biggest} elements per head"
    biggest_unfused, peak_unfused = _planned_sizes(False, causal)
    assert biggest_unfused >= T * T                       # the scores and probabilities
    assert peak * 8 < peak_unfused, (peak, peak_unfused)


def test_second_order_through_attention_is_refused():
    g = jg.Graph(np.float64)
    q = g.param(np.ones((3, 2)), name="q")
    dq, = jg.grad(jg.sum(jg.sqr(jg.attention(q, q, q))), [q])
    with pytest.raises(jg.GraphError, match="'attention_d'.*no gradient rule"):
        jg.build_backward(jg.build_forward(jg.sum(dq)))


def test_bad_arguments_name_the_tensor():
    g = jg.Graph(np.float32)
    q = g.input((2, 3, 5, 4), name="q")
    k = g.input((2, 3, 6, 4), name="k")
    v = g.input((2, 3, 6, 4), name="v")
    bad = {"vector": (g.input((4,), name="vec"), k, v, "'vec'.*2 to 4 dims"),
           "head count": (q, g.input((2, 2, 6, 4), name="k2"), v, "'k2'.*leading"),
           "width": (q, k, g.input((2, 3, 6, 5), name="v5"), "'v5'.*last axis d"),
           "key lengths": (q, k, g.input((2, 3, 7, 4), name="v7"), "'v7'.*shape of k 'k'"),
           "other graph": (q, jg.Graph(np.float32).input((2, 3, 6, 4), name="alien"), v, "'alien'.*another graph"),
           "not a tensor": (q, np.ones((2, 3, 6, 4)), v, "k must be a Tensor")}
    for what, (a, b, c, message) in bad.items():
        with pytest.raises(jg.GraphError, match=message):
            jg.attention(a, b, c)
    with pytest.raises(jg.GraphError, match="scale must be a finite number"):
        jg.attention(q, k, v, scale=float("nan"))
    with pytest.raises(jg.GraphError, match="causal must be True or False"):
        jg.attention(q, k, v, causal="yes")


@njit(cache=False)        # Numba's own cache would not see an edit of vmath.py
def _exps(x):
    a = np.empty_like(x)
    b = np.empty_like(x)
    for i in range(x.size):
        a[i] = vmath.exp(x[i])
        b[i] = vmath.exp_nonpositive(x[i])
    return a, b


def test_the_kernels_exp_is_exp_bit_for_bit_below_zero():
    """vmath.exp_nonpositive (the softmax's exps of the kernels: arguments are scores minus
    their maximum) gives vmath.exp's bits on every x <= 0 of a dense sweep, and NaN for NaN."""
    x = np.concatenate([-np.logspace(-30, 2, 400_000), np.linspace(-100, 0, 400_000), [-np.inf, -0.0, 0.0]])
    for dtype in (np.float32, np.float64):
        a, b = _exps(x.astype(dtype))
        assert a.tobytes() == b.tobytes(), dtype
        assert np.isnan(_exps(np.array([np.nan], dtype))[1][0])
