"""batch_norm: numpy references in training and evaluation, float64 finite differences,
running statistics updated exactly once per run under every checkpoint strategy (bit
for bit against plain runs, against PyTorch's rule in numpy, and against
torch.nn.functional.batch_norm when torch is installed), failed runs that update
nothing, save/load, thread-count independence, and argument errors."""
import numpy as np
import pytest

import jitgraph as jg

from .naive import batch_norm_ref, bn_axes

try:
    import torch
except ImportError:             # the numpy reference of PyTorch's rule always runs; torch only when present
    torch = None

SHAPES = [(6, 4), (3, 2, 5), (2, 3, 3, 2)]


def consts(g, C, seed=0):
    """Running mean and variance consts, not at their defaults (so the rule's both terms count)."""
    rng = np.random.default_rng(seed)
    return g.const(rng.uniform(-0.5, 0.5, C), name="running_mean"), g.const(rng.uniform(0.5, 2, C), name="running_var")


def rule(rm, rv, x, momentum=0.1):
    """PyTorch's running-statistics update, in float64."""
    m = x.size // x.shape[1]
    mean, var = x.mean(bn_axes(x)), x.var(bn_axes(x)) * m / (m - 1)
    return (1 - momentum) * rm + momentum * mean, (1 - momentum) * rv + momentum * var


# ---- forward and gradients --------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES + [(2, 20000)], ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_forward_matches_numpy(shape, training, affine, dtype):
    rng = np.random.default_rng(1)
    C = shape[1]
    xv = rng.normal(0.5, 2.0, shape)
    g = jg.Graph(dtype)
    x = g.input(shape, name="x")
    w = g.param(rng.uniform(0.5, 1.5, C), name="w") if affine else None
    b = g.param(rng.uniform(-1, 1, C), name="b") if affine else None
    rm, rv = consts(g, C)
    y = jg.batch_norm(x, w, b, rm, rv, training=training)
    fwd = jg.build_forward(y)
    got, again = fwd.run({x: xv}), fwd.run({x: xv}, debug=True)
    want = batch_norm_ref(xv.astype(dtype).astype(np.float64), None if w is None else w.value, None if b is None
                          else b.value, training, 1e-5, rm.value, rv.value)
    # float32: the mean is rounded to float32 before x - mean (as in PyTorch), which a channel of two
    # close values (N = 2) magnifies by 1 / sqrt(var + eps)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, want, **tol)
    assert np.array_equal(got, again)         # debug runs poison freed memory: nothing read after it was freed
    if shape == (2, 20000) and not training:  # the output overwrites the (2, C) statistics: one call does all
        assert fwd.n_in_place >= 1


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_training_gradients_through_the_batch_statistics(shape, affine):
    rng = np.random.default_rng(2)
    C = shape[1]
    args = [rng.uniform(-2, 2, shape)] + ([rng.uniform(0.5, 1.5, C), rng.uniform(-0.2, 0.2, C)] if affine else [])
    res = jg.check_grads(lambda x, *wb: jg.batch_norm(x, *wb, momentum=0.3), args, atol=1e-8)
    assert res.ok and res.n_checked == sum(a.size for a in args), res


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_evaluation_gradients_reach_x_weight_and_bias(shape):
    rng = np.random.default_rng(3)
    C = shape[1]
    args = [rng.uniform(-2, 2, shape), rng.uniform(0.5, 1.5, C), rng.uniform(-1, 1, C)]

    def fn(x, w, b):
        rm, rv = consts(x.graph, C, seed=4)
        return jg.batch_norm(x, w, b, rm, rv, training=False)
    res = jg.check_grads(fn, args, atol=1e-8)
    assert res.ok and res.n_checked == sum(a.size for a in args), res
    # evaluation is an affine map per channel: the analytic gradient of x is w / sqrt(rv + eps) times the weights
    weights = np.random.default_rng(0).uniform(0.5, 1.5, shape)
    rv = consts(jg.Graph(np.float64), C, seed=4)[1].value
    scale = (args[1] / np.sqrt(rv + 1e-5)).reshape((1, C) + (1,) * (len(shape) - 2))
    np.testing.assert_allclose(res.analytic[0], weights * scale, rtol=1e-12)


def test_gradients_match_torch_and_the_fused_formula():
    """fwd+bwd of a (N, C, H, W) layer in float64 equals PyTorch's (or, without torch, the
    three-term formula evaluated in numpy)."""
    rng = np.random.default_rng(5)
    xv, wv, bv = rng.normal(1, 2, (4, 3, 5, 5)), rng.uniform(0.5, 1.5, 3), rng.uniform(-1, 1, 3)
    r = rng.standard_normal(xv.shape)
    g = jg.Graph(np.float64)
    x, w, b = g.param(xv, name="x"), g.param(wv, name="w"), g.param(bv, name="b")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.batch_norm(x, w, b) * g.const(r))))
    loss = bwd.run()
    ax = bn_axes(xv)
    mean, var = xv.mean(ax, keepdims=True), xv.var(ax, keepdims=True)
    xhat = (xv - mean) / np.sqrt(var + 1e-5)
    want = {"loss": (batch_norm_ref(xv, wv, bv) * r).sum(), "w": (r * xhat).sum(ax), "b": r.sum(ax),
            "x": wv.reshape(1, 3, 1, 1) / np.sqrt(var + 1e-5) * (r - r.mean(ax, keepdims=True)
                                                                  - xhat * (r * xhat).mean(ax, keepdims=True))}
    if torch is not None:
        tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xv, wv, bv))
        out = (torch.nn.functional.batch_norm(tx, None, None, tw, tb, training=True) * torch.tensor(r)).sum()
        out.backward()
        want = {"loss": out.item(), "w": tw.grad.numpy(), "b": tb.grad.numpy(), "x": tx.grad.numpy()}
    np.testing.assert_allclose(loss, want["loss"], rtol=1e-12)
    for t, key in ((x, "x"), (w, "w"), (b, "b")):
        np.testing.assert_allclose(t.grad, want[key], rtol=1e-10, atol=1e-12)


# ---- running statistics: exactly once per run, whatever is recomputed ----------------------------------
N, CIN, C1, HW = 4, 3, 4, 6
LAYERS = ("bn0", "bn1", "bn2", "bn3")


def model(dtype=np.float32, segments=False, running=True):
    """A small residual CNN with four training-mode batch norms (4-D with and without affine,
    and a 2-D one after global pooling); returns (graph, x, loss, params, running consts by
    layer, the tensors each layer normalizes)."""
    rng = np.random.default_rng(7)
    g = jg.Graph(dtype)
    x = g.input((N, CIN, HW, HW), name="x")
    W1 = g.param(rng.standard_normal((C1, CIN, 3, 3)) * 0.3, name="W1")
    W2 = g.param(rng.standard_normal((C1, C1, 3, 3)) * 0.3, name="W2")
    Wf = g.param(rng.standard_normal((C1, 2)) * 0.5, name="Wf")
    affine = {name: (g.param(rng.uniform(0.5, 1.5, C1), name=f"{name}_w"),
                     g.param(rng.uniform(-0.5, 0.5, C1), name=f"{name}_b")) for name in LAYERS[1:]}
    stats = {name: (g.const(np.zeros(C), name=f"{name}_mean"), g.const(np.ones(C), name=f"{name}_var"))
             for name, C in zip(LAYERS, (CIN, C1, C1, C1))} if running else {}
    target = g.const(rng.standard_normal((N, 2)), name="target")
    inputs = {}

    def bn(t, name):
        inputs[name] = t
        w, b = affine.get(name, (None, None))
        rm, rv = stats.get(name, (None, None))
        return jg.batch_norm(t, w, b, rm, rv, momentum=0.2)

    def block1(t):
        return jg.relu(bn(jg.conv2d(t, W1, padding=1), "bn1"))

    def block2(t):
        return jg.relu(bn(jg.conv2d(t, W2, padding=1), "bn2") + t)

    h0 = bn(x, "bn0").named("h0")
    h1 = (jg.checkpoint(block1, h0) if segments else block1(h0)).named("h1")
    h2 = (jg.checkpoint(block2, h1) if segments else block2(h1)).named("h2")
    h3 = bn(jg.mean(h2, axis=(2, 3)), "bn3")
    loss = jg.mean(jg.sqr(h3 @ Wf - target))
    params = [W1, W2, Wf] + [p for name in LAYERS[1:] for p in affine[name]]
    return g, x, loss, params, stats, inputs


def strategy_program(strategy):
    g, x, loss, params, stats, inputs = model(segments=strategy == "segments")
    fwd = jg.build_forward(loss)
    if strategy in ("plain", "segments"):
        bwd = jg.build_backward(fwd)
    elif strategy == "sqrt":
        bwd = jg.build_backward(fwd, checkpoints="sqrt")
    elif strategy == "list":
        bwd = jg.build_backward(fwd, checkpoints=[g.tensor("h1")])
    elif strategy == "revolve":                     # multi-level: recomputed states seed recomputations
        bwd = jg.build_backward(fwd, checkpoints="revolve", slots=1)
    else:
        plain_peak = jg.build_backward(jg.build_forward(model()[2])).peak_bytes
        bwd = jg.build_backward(fwd, memory_budget=int(0.8 * plain_peak))
        assert bwd.peak_bytes < plain_peak
    return g, x, bwd, params, stats, inputs


def batches(k, seed=8):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.5, 1.5, (N, CIN, HW, HW)).astype(np.float32) for _ in range(k)]


def train(strategy, k=3):
    """k SGD steps; returns (losses, running statistics by layer, final params, the program, the
    tensors the layers normalize)."""
    g, x, bwd, params, stats, inputs = strategy_program(strategy)
    opt = jg.optim.SGD(params, lr=0.1)
    losses = []
    for xb in batches(k):
        losses.append(bwd.run({x: xb}))
        opt.step()
    return losses, {k_: (rm.value, rv.value) for k_, (rm, rv) in stats.items()}, [p.value for p in params], bwd, inputs


@pytest.mark.parametrize("strategy", ["sqrt", "list", "segments", "budget", "revolve"])
def test_running_statistics_after_checkpointed_steps_equal_plain_bit_for_bit(strategy):
    losses, stats, params, _, _ = train("plain")
    got_losses, got_stats, got_params, bwd, inputs = train(strategy)
    assert bwd.stats()["n_recomputed"] > 0, f"{strategy}: nothing was recomputed, the test would prove nothing"
    nodes = bwd.graph.nodes
    copies = [n for n in bwd.order if nodes.flags[n] & jg.ir.F_RECOMPUTED]
    assert "batch_stats" not in {jg.registry.OPS[int(nodes.op[n])].name for n in copies}   # kept, never recomputed
    if strategy != "sqrt":                          # ... while what a layer normalizes is recomputed
        assert {int(nodes.origin[n]) for n in copies} & {t.id for name in ("bn1", "bn2") for t in (inputs[name], inputs[name].sources[0])}
    assert [a.tobytes() for a in got_losses] == [a.tobytes() for a in losses]
    for name in LAYERS:
        for a, b in zip(got_stats[name], stats[name]):
            assert a.tobytes() == b.tobytes(), f"{strategy}: running statistics of {name} differ from plain"
    for a, b in zip(got_params, params):
        assert a.tobytes() == b.tobytes()


def test_running_statistics_follow_pytorchs_rule():
    """k = 3 training steps: each layer's running statistics equal PyTorch's rule applied to
    the batches that layer saw (in numpy; and torch.nn.functional.batch_norm if installed)."""
    k = 3
    g, x, loss, params, stats, _ = model()
    bwd = jg.build_backward(jg.build_forward(loss), checkpoints="sqrt")
    opt = jg.optim.SGD(params, lr=0.1)
    # a twin without running statistics shows what each layer normalized at each step
    g2, x2, _, params2, _, inputs2 = model(running=False)
    probe = jg.build_forward([inputs2[name] for name in LAYERS])
    want = {name: (np.zeros(t.shape[1]), np.ones(t.shape[1])) for name, t in inputs2.items()}
    ref_torch = {name: (torch.zeros(t.shape[1], dtype=torch.float64), torch.ones(t.shape[1], dtype=torch.float64))
                 for name, t in inputs2.items()} if torch is not None else {}
    for xb in batches(k):
        for p, p2 in zip(params, params2):
            p2.value = p.value
        seen = dict(zip(LAYERS, probe.run({x2: xb})))
        for name, v in seen.items():
            v = v.astype(np.float64)
            want[name] = rule(*want[name], v, momentum=0.2)
            if torch is not None:
                torch.nn.functional.batch_norm(torch.from_numpy(v), *ref_torch[name], training=True, momentum=0.2)
        bwd.run({x: xb})
        opt.step()
    for name, (rm, rv) in stats.items():
        for got, ref in ((rm.value, want[name][0]), (rv.value, want[name][1])):
            np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6, err_msg=name)
        for got, ref in zip((rm.value, rv.value), ref_torch.get(name, ())):
            np.testing.assert_allclose(got, ref.numpy(), rtol=2e-5, atol=2e-6, err_msg=f"{name} vs torch")
    assert all(np.any(rm.value != 0) and np.any(rv.value != 1) for rm, rv in stats.values())


def test_forward_runs_update_too_and_evaluation_never_does():
    """As PyTorch's forward in train mode: every successful run of a program holding a training
    batch_norm -- a ForwardGraph's too -- updates once; an evaluation graph reads the statistics."""
    rng = np.random.default_rng(9)
    g = jg.Graph(np.float64)
    x = g.input((5, 3, 4), name="x")
    rm, rv = consts(g, 3)
    fwd = jg.build_forward(jg.batch_norm(x, running_mean=rm, running_var=rv, momentum=0.25))
    ev = jg.build_forward(jg.batch_norm(x, running_mean=rm, running_var=rv, training=False))
    want = (rm.value, rv.value)
    for _ in range(2):
        xb = rng.standard_normal(x.shape)
        fwd.run({x: xb})
        want = rule(*want, xb, momentum=0.25)
        np.testing.assert_allclose(rm.value, want[0], rtol=1e-13)
        np.testing.assert_allclose(rv.value, want[1], rtol=1e-13)
        y = ev.run({x: xb})
        np.testing.assert_allclose(y, batch_norm_ref(xb, training=False, mean=want[0], var=want[1]), rtol=1e-12)
    before = (rm.value, rv.value)
    ev.run({x: rng.standard_normal(x.shape)})
    assert np.array_equal(rm.value, before[0]) and np.array_equal(rv.value, before[1])


def test_layers_sharing_running_statistics_update_in_turn():
    """One module applied twice (its consts shared): two updates, in execution order."""
    g = jg.Graph(np.float64)
    x = g.input((6, 2), name="x")
    rm, rv = consts(g, 2)
    start = (rm.value, rv.value)
    first = jg.batch_norm(x, running_mean=rm, running_var=rv)
    xb = np.random.default_rng(10).random((6, 2))
    jg.build_forward(jg.batch_norm(first * 3.0, running_mean=rm, running_var=rv)).run({x: xb})
    want = rule(*rule(*start, xb), 3 * batch_norm_ref(xb))
    np.testing.assert_allclose(rm.value, want[0], rtol=1e-12)
    np.testing.assert_allclose(rv.value, want[1], rtol=1e-12)


def test_a_run_that_raises_updates_nothing():
    g = jg.Graph(np.float32)
    x = g.input((4, 3, 2), name="x")
    idx = g.input((2,), name="idx", dtype=np.int64)
    T = g.param(np.ones((3, 2)), name="T")
    rm, rv = consts(g, 3)
    loss = jg.sum(jg.batch_norm(x, running_mean=rm, running_var=rv)) + jg.sum(jg.embedding(T, idx))
    fwd = jg.build_forward(loss)
    bwd = jg.build_backward(fwd, checkpoints="sqrt")
    xb = np.random.default_rng(11).standard_normal(x.shape)
    before = (rm.value, rv.value)
    for prog in (fwd, bwd):
        with pytest.raises(jg.GraphError, match="embedding"):
            prog.run({x: xb, idx: np.array([0, 7])})          # index 7 is out of range: the run stops there
        with pytest.raises(jg.GraphError, match="missing feed"):
            prog.run({x: xb})
        assert rm.value.tobytes() == before[0].tobytes() and rv.value.tobytes() == before[1].tobytes()
    bwd.run({x: xb, idx: np.array([0, 2])})
    assert np.any(rm.value != before[0])


def test_save_and_load_keep_the_running_statistics(tmp_path):
    g, x, bwd, params, stats, _ = strategy_program("sqrt")
    opt = jg.optim.SGD(params, lr=0.1)
    xs = batches(4, seed=12)
    for xb in xs[:2]:
        bwd.run({x: xb})
        opt.step()
    jg.save(tmp_path / "m.npz", {"bwd": bwd, "opt": opt, "x": x})
    jg.save(tmp_path / "g.npz", g)
    d, g2 = jg.load(tmp_path / "m.npz"), jg.load(tmp_path / "g.npz")
    for name, (rm, rv) in stats.items():
        for other in (d["bwd"].graph, g2):
            assert other.tensor(f"{name}_mean").value.tobytes() == rm.value.tobytes()
            assert other.tensor(f"{name}_var").value.tobytes() == rv.value.tobytes()
    for xb in xs[2:]:                          # both continue identically, updates included
        assert bwd.run({x: xb}).tobytes() == d["bwd"].run({d["x"]: xb}).tobytes()
        opt.step()
        d["opt"].step()
    for name, (rm, rv) in stats.items():
        assert d["bwd"].graph.tensor(f"{name}_mean").value.tobytes() == rm.value.tobytes()
        assert d["bwd"].graph.tensor(f"{name}_var").value.tobytes() == rv.value.tobytes()


def test_results_and_updates_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(13)
    wv, bv = rng.uniform(0.5, 1.5, 16), rng.uniform(-1, 1, 16)
    got = []
    for n in (1, 2):
        jg.set_num_threads(n)
        g = jg.Graph(np.float32)
        x = g.input((8, 16, 16, 16), name="x")                 # 32768 elements: nodes are split over threads
        w, b = g.param(wv, name="w"), g.param(bv, name="b")
        rm, rv = consts(g, 16)
        y = jg.batch_norm(jg.relu(x * w.reshape(1, 16, 1, 1)), w, b, rm, rv)
        bwd = jg.build_backward(jg.build_forward(jg.sum(jg.sqr(y))), checkpoints=[y])
        xb = np.random.default_rng(14).standard_normal(x.shape)
        got.append([bwd.run({x: xb}), w.grad, b.grad, rm.value, rv.value])
    jg.set_num_threads()
    for a, b_ in zip(*got):
        assert np.all(np.isfinite(a)) and a.tobytes() == b_.tobytes()


@pytest.mark.parametrize("C, S", [(21, 64), (5, 3), (3, 100), (2, 1024), (2, 1500)], ids=str)
def test_reduction_kernels_by_channel_blocks_and_by_plane(C, S, dtype):
    """The statistics and the gradient sums, against float64 numpy, for planes that go a block
    of channels at a time (S <= WIDTH; C = 21 with 8 x 8 planes ends in a part block) and a
    plane at a time (S > WIDTH); any split of the channels into units gives the same bits."""
    from jitgraph.ops.batchnorm import WIDTH, stats_kernel, sums_kernel
    assert (S <= WIDTH) == (S < 1500)
    rng = np.random.default_rng(C * S)
    N = 6
    x = rng.normal(0.7, 3.0, N * C * S).astype(dtype)
    g = rng.standard_normal(N * C * S).astype(dtype)
    x3, g3 = x.reshape(N, C, S).astype(np.float64), g.reshape(N, C, S).astype(np.float64)
    stats, sums = np.full(2 * C, np.nan, dtype), np.full(4 * C, np.nan, dtype)
    assert stats_kernel(stats, x, C, S, 0, C) == 0 and sums_kernel(sums, g, x, stats, C, S, 1e-5, 0, C) == 0
    mean, var = x3.mean((0, 2)), x3.var((0, 2))
    xhat = (x3 - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-5)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(stats, np.concatenate([mean, var]), **tol)
    np.testing.assert_allclose(sums, np.concatenate([mean, var, (g3 * xhat).sum((0, 2)), g3.sum((0, 2))]),
                               rtol=tol["rtol"] * 10, atol=tol["atol"] * 10 * np.sqrt(N * S))
    for cut in sorted({1, C // 2, C - 1} - {0, C}):
        parts, psums = np.full(2 * C, np.nan, dtype), np.full(4 * C, np.nan, dtype)
        for lo, hi in ((0, cut), (cut, C)):
            stats_kernel(parts, x, C, S, lo, hi)
            sums_kernel(psums, g, x, stats, C, S, 1e-5, lo, hi)
        assert parts.tobytes() == stats.tobytes() and psums.tobytes() == sums.tobytes()


# ---- errors -------------------------------------------------------------------------------------------
def test_bad_arguments_raise_naming_the_tensor():
    g = jg.Graph()
    x = g.input((4, 3, 2), name="x")
    rm, rv = consts(g, 3)
    wrong = g.const(np.zeros(4), name="wrong")
    p = g.param(np.zeros(3), name="p")
    cases = [
        (lambda: jg.batch_norm(x, running_mean=wrong, running_var=rv), "running_mean 'wrong' has shape"),
        (lambda: jg.batch_norm(x, running_mean=rm, running_var=wrong), "running_var 'wrong' has shape"),
        (lambda: jg.batch_norm(x, running_mean=rm), "both running_mean and running_var"),
        (lambda: jg.batch_norm(x, running_var=rv), "both running_mean and running_var"),
        (lambda: jg.batch_norm(x, running_mean=rm, running_var=rm), "the same tensor"),
        (lambda: jg.batch_norm(x, running_mean=p, running_var=rv), "running_mean 'p' must be a const"),
        (lambda: jg.batch_norm(x, rm, rv, momentum=1.5), "momentum must be a finite number in \\[0.0, 1.0\\]"),
        (lambda: jg.batch_norm(x, running_mean=rm, running_var=rv, momentum=-0.1), "momentum"),
        (lambda: jg.batch_norm(x, momentum=None), "momentum"),           # type: ignore[arg-type]
        (lambda: jg.batch_norm(x, eps=-1.0), "eps"),
        (lambda: jg.batch_norm(x, wrong), "weight 'wrong' has shape"),
        (lambda: jg.batch_norm(x, None, wrong), "bias 'wrong' has shape"),
        (lambda: jg.batch_norm(g.input((5,), name="v")), "'v'.*\\(N, C\\) or \\(N, C, \\*spatial\\)"),
        (lambda: jg.batch_norm(g.input((1, 3), name="one")), "'one'.*more than one value per channel"),
        (lambda: jg.batch_norm(g.input((1, 3, 1, 1), name="one4")), "'one4'.*more than one value per channel"),
        (lambda: jg.batch_norm(x, training=False), "'x'.*needs running_mean and running_var"),
        (lambda: jg.batch_norm(x, training=1), "training must be True or False"),   # type: ignore[arg-type]
        (lambda: jg.batch_norm(x, jg.Graph().param(np.ones(3), name="other")), "weight must be a tensor of its graph"),
    ]
    for make, message in cases:
        with pytest.raises(jg.GraphError, match=message):
            make()
    y = jg.batch_norm(g.input((1, 3), name="one_row"), running_mean=rm, running_var=rv, training=False)
    assert y.shape == (1, 3)                  # evaluation needs no batch statistics


def test_a_corrupted_file_cannot_point_the_update_elsewhere(tmp_path):
    g = jg.Graph()
    x = g.input((4, 3), name="x")
    rm, rv = consts(g, 3)
    y = jg.batch_norm(x, running_mean=rm, running_var=rv)
    stats = y.sources[1]
    g.nodes.ip[stats.id, 1] = x.id             # the variance "const" is now the input
    with pytest.raises(jg.GraphError, match="running statistics"):
        jg.build_forward(y)


def test_without_the_zero_table_and_second_order():
    """zero_table=False gives the statistics node a (zero) gradient: its own rule adds nothing;
    a second derivative through batch_norm says it is not supported."""
    rng = np.random.default_rng(15)
    xv, wv = rng.standard_normal((5, 3, 2)), rng.uniform(0.5, 1.5, 3)
    grads = []
    for zero_table in (True, False):
        g = jg.Graph(np.float64)
        x, w = g.param(xv, name="x"), g.param(wv, name="w")
        bwd = jg.build_backward(jg.build_forward(jg.sum(jg.sqr(jg.batch_norm(x, w) - 0.3 * x))), zero_table=zero_table)
        bwd.run()
        grads.append((x.grad, w.grad))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    (gw,) = jg.grad(jg.sum(jg.sqr(jg.batch_norm(x, w))), [w])
    with pytest.raises(jg.GraphError, match="no gradient rule"):
        jg.grad(jg.sum(gw), [w])
