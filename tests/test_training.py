"""Optimizers against hand-computed updates, the training loop, and the demo."""
import sys
import types

import numpy as np
import pytest

import jitgraph as jg


def quadratic(w0, target, dtype=np.float64):
    """loss = sum((w - target)^2 * c) with a per-element weight: gradient 2 c (w - target)."""
    g = jg.Graph(dtype)
    W = g.param(w0, name="W")
    c = np.linspace(0.5, 2.0, w0.size).reshape(w0.shape)
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.sqr(W - target) * c)))
    return g, W, bwd, lambda w: 2 * c * (w - target)


def test_sgd_plain_momentum_nesterov_weight_decay_against_formulas():
    w0, target = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.1, -0.2])
    for momentum, nesterov, wd, damp in ((0.0, False, 0.0, 0.0), (0.9, False, 0.0, 0.0), (0.9, True, 0.01, 0.0),
                                        (0.5, False, 0.1, 0.3)):
        g, W, bwd, grad = quadratic(w0, target)
        opt = jg.optim.SGD([W], lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd, dampening=damp)
        w, buf = w0.copy(), None
        for step in range(5):
            bwd.run()
            opt.step()
            d = grad(w) + wd * w
            if momentum:
                buf = d if buf is None else momentum * buf + (1 - damp) * d
                d = d + momentum * buf if nesterov else buf
            w = w - 0.1 * d
            np.testing.assert_allclose(W.value, w, rtol=1e-14, atol=1e-15)


def test_adamw_against_formulas():
    w0, target = np.array([[1.0, -2.0], [0.5, 4.0]]), np.array([[0.3, 0.1], [-0.2, 0.0]])
    g, W, bwd, grad = quadratic(w0, target)
    lr, b1, b2, eps, wd = 0.05, 0.8, 0.95, 1e-6, 0.1
    opt = jg.optim.AdamW([W], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for t in range(1, 8):
        bwd.run()
        opt.step()
        gr = grad(w)
        w = w * (1 - lr * wd)
        m = b1 * m + (1 - b1) * gr
        v = b2 * v + (1 - b2) * gr * gr
        w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        np.testing.assert_allclose(W.value, w, rtol=1e-13, atol=1e-15)


def test_clipping_by_global_norm_over_all_params():
    g = jg.Graph(np.float64)
    A = g.param(np.array([3.0, 0.0]), name="A")
    B = g.param(np.array([[4.0]]), name="B")
    bwd = jg.build_backward(jg.build_forward(0.5 * (jg.sum(jg.sqr(A)) + jg.sum(jg.sqr(B)))))   # grads = values
    opt = jg.optim.SGD([A, B], lr=1.0, clip_norm=1.0)
    bwd.run()
    opt.step()
    assert opt.last_grad_norm == pytest.approx(5.0)
    np.testing.assert_allclose(A.value, [3.0 - 3.0 / 5, 0.0])
    np.testing.assert_allclose(B.value, [[4.0 - 4.0 / 5]])
    opt2 = jg.optim.SGD([A, B], lr=1.0, clip_norm=100.0)     # no clipping below the threshold
    before = A.value
    bwd.run()
    opt2.step()
    np.testing.assert_allclose(A.value, before - before)


def test_step_updates_what_the_next_run_uses_and_skips_params_without_gradients():
    g = jg.Graph(np.float64)
    x = g.input((2,), name="x")
    W = g.param(np.array([1.0, 1.0]), name="W")
    V = g.param(np.array([5.0]), name="V")             # not used by this loss: no gradient
    bwd = jg.build_backward(jg.build_forward(jg.sum(W * x)))
    opt = jg.optim.SGD([W, V], lr=0.5)
    with pytest.raises(jg.GraphError, match="none of the params has a gradient yet"):
        opt.step()
    l1 = bwd.run({x: np.array([1.0, 2.0])})
    opt.step()
    l2 = bwd.run({x: np.array([1.0, 2.0])})
    np.testing.assert_allclose(W.value, [0.5, 0.0])
    np.testing.assert_allclose(V.value, [5.0])
    assert float(l2) == pytest.approx(float(l1) - 0.5 * (1 + 4))


def test_optimizer_argument_errors():
    g = jg.Graph(np.float64)
    W = g.param(np.ones(2), name="W")
    x = g.input((2,), name="x")
    other = jg.Graph(np.float64).param(np.ones(2), name="W2")
    with pytest.raises(jg.GraphError, match="'x' is not a param"):
        jg.optim.SGD([x])
    with pytest.raises(jg.GraphError, match="at least one param"):
        jg.optim.AdamW([])
    with pytest.raises(jg.GraphError, match="belong to different graphs"):
        jg.optim.AdamW([W, other])
    with pytest.raises(jg.GraphError, match="listed twice"):
        jg.optim.AdamW([W, W])
    with pytest.raises(jg.GraphError, match="lr must be a non-negative number"):
        jg.optim.SGD([W], lr=-1)
    with pytest.raises(jg.GraphError, match="betas must lie in"):
        jg.optim.AdamW([W], betas=(0.9, 1.0))
    with pytest.raises(jg.GraphError, match="clip_norm must be a positive number"):
        jg.optim.AdamW([W], clip_norm=0)
    with pytest.raises(jg.GraphError, match="nesterov needs momentum"):
        jg.optim.SGD([W], nesterov=True)


def test_state_dict_round_trip_continues_identically():
    w0, target = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.1, -0.2])
    g, W, bwd, _ = quadratic(w0, target)
    opt = jg.optim.AdamW([W], lr=0.1)
    for _ in range(3):
        bwd.run()
        opt.step()
    state, w_mid = opt.state_dict(), W.value
    for _ in range(3):
        bwd.run()
        opt.step()
    want = W.value
    g2, W2, bwd2, _ = quadratic(w_mid, target)
    opt2 = jg.optim.AdamW([W2], lr=0.5)
    opt2.load_state_dict(state)
    assert opt2.lr == 0.1 and opt2.step_count == 3
    for _ in range(3):
        bwd2.run()
        opt2.step()
    np.testing.assert_array_equal(W2.value, want)
    with pytest.raises(jg.GraphError, match="expects a SGD state, got 'AdamW'"):
        jg.optim.SGD([W2]).load_state_dict(state)
    g3 = jg.Graph(np.float64)
    with pytest.raises(jg.GraphError, match="params of shapes"):
        jg.optim.AdamW([g3.param(np.ones(4), name="Z")]).load_state_dict(state)


def test_tiny_model_overfits_a_tiny_batch():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 5)).astype(np.float32)
    labels = np.arange(8) % 3
    Y = np.eye(3, dtype=np.float32)[labels]
    g = jg.Graph(np.float32)
    x, t = g.input((8, 5), name="x"), g.input((8, 3), name="t")
    W1 = g.param(rng.standard_normal((5, 32)) * 0.5, name="W1")
    b1 = g.param(np.zeros(32), name="b1")
    W2 = g.param(rng.standard_normal((32, 3)) * 0.3, name="W2")
    logits = jg.gelu(x @ W1 + b1) @ W2
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(logits, t)), checkpoints="sqrt")
    opt = jg.optim.AdamW([W1, b1, W2], lr=0.05, weight_decay=0.0)
    losses = jg.train(bwd, opt, {x: X, t: Y}, epochs=150, batch_size=8, progress=False)
    assert losses[0] > 0.8 and losses[-1] < 0.01
    pred = jg.build_forward(logits).run({x: X}).argmax(1)
    np.testing.assert_array_equal(pred, labels)


def test_batches_and_train_loop():
    g = jg.Graph(np.float64)
    x = g.input((4, 2), name="x")
    data = {x: np.arange(22.0).reshape(11, 2)}
    got = list(jg.batches(data, 4, shuffle=False))
    assert len(got) == 2 and np.array_equal(got[1][x], np.arange(8.0, 16.0).reshape(4, 2))   # 11 rows: 2 full
    shuffled = np.concatenate([b[x] for b in jg.batches(data, 4, seed=3)])
    assert len(np.unique(shuffled[:, 0])) == 8
    with pytest.raises(jg.GraphError, match="batch_size must be an int"):
        list(jg.batches(data, 20))
    with pytest.raises(jg.GraphError, match="different numbers of rows"):
        list(jg.batches({x: np.zeros((4, 2)), g.input((4,), name="y"): np.zeros(5)}, 2))
    W = g.param(np.ones((2,)), name="W")
    bwd = jg.build_backward(jg.build_forward(jg.mean(jg.sqr(x @ W))))
    losses = jg.train(bwd, jg.optim.SGD([W], lr=0.001), data, epochs=3, progress=True)
    assert len(losses) == 6 and losses[-1] < losses[0]


def test_run_seed_changes_dropout_masks_and_keeps_replay_exact():
    g = jg.Graph(np.float64)
    x = g.input((1000,), name="x")
    W = g.param(np.ones(1000), name="W")
    h = jg.dropout(x * W, 0.5, seed=1)
    fwd = jg.build_forward(h)
    ones = np.ones(1000)
    a, b, a2 = fwd.run({x: ones}, seed=0), fwd.run({x: ones}, seed=1), fwd.run({x: ones}, seed=0)
    assert np.array_equal(a, a2) and not np.array_equal(a, b)
    loss = jg.sum(jg.sqr(jg.tanh(h)))
    plain = jg.build_backward(jg.build_forward(loss))
    ck = jg.build_backward(jg.build_forward(loss), checkpoints=[])
    for s in (0, 7):
        assert np.array_equal(plain.run({x: ones}, seed=s), ck.run({x: ones}, seed=s))
        assert np.array_equal(plain.grad(W), ck.grad(W))
    with pytest.raises(jg.GraphError, match="seed must be an int"):
        fwd.run({x: ones}, seed=1.5)


def test_demo_runs_end_to_end():
    from jitgraph.demo import main
    lines = []
    args = types.SimpleNamespace(epochs=2, depth=3, width=16, batch=64, lr=2e-3, dropout=0.1, strategy="sqrt",
                                 seed=0, no_progress=True)
    assert main(args, out=lines.append) == 0
    text = "\n".join(lines)
    assert "bit-identical: yes" in text
    row = [ln for ln in lines if ln.startswith("sqrt")][0].split()
    assert 0.0 <= float(row[-1]) <= 1.0


def test_the_demos_digits_are_scikit_learns():
    """The demo's data ships with the package (no scikit-learn needed to run it): the same
    1797 images and labels as sklearn.datasets.load_digits, split and standardized as before."""
    from sklearn.datasets import load_digits
    from jitgraph.demo import load_data
    X, y = load_digits(return_X_y=True)
    Xtr, Ytr, Xte, yte = load_data()
    perm = np.random.default_rng(0).permutation(len(X))
    assert Xtr.shape == (1437, 64) and Xte.shape == (360, 64)
    np.testing.assert_array_equal(yte, y[perm[:360]])
    np.testing.assert_array_equal(Ytr.argmax(1), y[perm[360:]])
    raw = X.astype(np.float32) / 16.0
    mu, sd = raw[perm[360:]].mean(0), raw[perm[360:]].std(0) + 1e-3
    np.testing.assert_array_equal(Xte, ((raw[perm[:360]] - mu) / sd).astype(np.float32))


def test_plots_without_matplotlib_say_how_to_get_it(monkeypatch):
    g = jg.Graph(np.float32)
    x = g.input((4,), name="x")
    fwd = jg.build_forward(jg.sum(jg.relu(x)))
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)       # as if it were not installed
    with pytest.raises(ImportError, match=r"jitgraph\[plot\]"):
        jg.plot_memory([fwd])


def test_cli_demo_small(capsys):
    from jitgraph.cli import main
    assert main(["demo", "--epochs", "1", "--depth", "2", "--width", "8", "--no-progress"]) == 0
    assert "bit-identical: yes" in capsys.readouterr().out
    assert main(["tour"]) == 0


def test_grads_and_steps_follow_the_backward_program_that_ran_last():
    g = jg.Graph(np.float64)
    W = g.param(np.array([1.0, 2.0]), name="W")
    b1 = jg.build_backward(jg.build_forward(jg.sum(W * 3.0)))        # dW = 3
    b2 = jg.build_backward(jg.build_forward(jg.sum(jg.sqr(W))))      # dW = 2W
    opt = jg.optim.SGD([W], lr=0.1)
    b1.run()
    np.testing.assert_allclose(W.grad, [3.0, 3.0])
    opt.step()
    np.testing.assert_allclose(W.value, [0.7, 1.7])
    b2.run()
    np.testing.assert_allclose(W.grad, [1.4, 3.4])                   # the cache of b1's offsets is not reused
    opt.step()
    np.testing.assert_allclose(W.value, [0.7 - 0.14, 1.7 - 0.34])
    b1.run()
    opt.step()
    np.testing.assert_allclose(W.value, [0.56 - 0.3, 1.36 - 0.3])
    np.testing.assert_allclose(b2.grad(W), [1.4, 3.4])              # b2's own buffer still holds its result
