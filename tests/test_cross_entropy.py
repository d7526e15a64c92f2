"""cross_entropy with probability targets and with integer class targets (ignore_index):
values and gradients against numpy, the two forms against each other, bad targets."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.registry import BY_NAME

from .naive import ce_classes, ce_classes_d, softmax

RNG = np.random.default_rng(7)


def model(dtype, shape, classes=None, ignore_index=None):
    """loss = cross_entropy(x @ W, targets) with an index input (classes) or a prob input."""
    g = jg.Graph(dtype)
    x = g.input(shape[:-1] + (6,), name="x")
    W = g.param(RNG.standard_normal((6, shape[-1])) * 0.5, name="W")
    if classes:
        t = g.input(shape[:-1], name="t", dtype=np.int64)
        loss = jg.cross_entropy(x @ W, t, ignore_index=ignore_index)
    else:
        t = g.input(shape, name="t")
        loss = jg.cross_entropy(x @ W, t)
    return g, x, W, t, loss


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 7)])
@pytest.mark.parametrize("ignore_index", [None, 1, -100])
def test_class_targets_match_numpy_and_one_hot(shape, ignore_index):
    """float64: the loss and W's gradient equal numpy's, and (without ignored rows) the
    one-hot probability form's."""
    C = shape[-1]
    ids = RNG.integers(0, C, shape[:-1])
    if ignore_index is not None:
        ids.reshape(-1)[::3] = ignore_index
    xv = RNG.standard_normal(shape[:-1] + (6,))
    g, x, W, t, loss = model(np.float64, shape, classes=True, ignore_index=ignore_index)
    bwd = jg.build_backward(jg.build_forward(loss))
    got = float(bwd.run({x: xv, t: ids}))
    logits = xv @ W.value
    assert got == pytest.approx(ce_classes(logits, ids, ignore_index), rel=1e-12, abs=1e-14)
    dlogits = ce_classes_d(logits, ids, 1.0, ignore_index)
    want = np.tensordot(xv, dlogits, axes=(list(range(xv.ndim - 1)), list(range(xv.ndim - 1))))
    np.testing.assert_allclose(W.grad, want, rtol=1e-10, atol=1e-13)
    if ignore_index is None:
        g2, x2, W2, t2, loss2 = model(np.float64, shape)
        W2.value = W.value
        bwd2 = jg.build_backward(jg.build_forward(loss2))
        got2 = float(bwd2.run({x2: xv, t2: np.eye(C)[ids]}))
        assert got2 == pytest.approx(got, rel=1e-12)
        np.testing.assert_allclose(W2.grad, W.grad, rtol=1e-10, atol=1e-13)


def test_every_row_ignored_gives_zero_loss_and_gradient():
    g, x, W, t, loss = model(np.float64, (3, 4), classes=True, ignore_index=-1)
    bwd = jg.build_backward(jg.build_forward(loss))
    assert float(bwd.run({x: RNG.standard_normal((3, 6)), t: np.full(3, -1)})) == 0.0
    assert not W.grad.any()


def test_no_one_hot_is_built():
    """The program's only logits-sized tensors are the logits and their gradient."""
    g, x, W, t, loss = model(np.float32, (64, 1000), classes=True)
    bwd = jg.build_backward(jg.build_forward(loss))
    big = [int(n) for n in bwd.order if np.prod(g.shape_of(int(n))) >= 64 * 1000]
    ops = sorted(g.label(n).split("#")[0] for n in big)
    assert ops == ["cross_entropy_index_d", "matmul"], ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_checkpointed_and_threaded_runs_are_bit_identical(dtype):
    ids = RNG.integers(0, 9, (16,))
    ids[::4] = 3
    xv = RNG.standard_normal((16, 6))
    results = []
    for kw, threads in (({}, 1), ({"checkpoints": "sqrt"}, 2), ({}, 2)):
        jg.set_num_threads(threads)
        try:
            g, x, W, t, loss = model(dtype, (16, 9), classes=True, ignore_index=3)
            W.value = np.linspace(-1, 1, 54).reshape(6, 9)
            bwd = jg.build_backward(jg.build_forward(loss), **kw)
            results.append((np.asarray(bwd.run({x: xv, t: ids})).tobytes(), W.grad.tobytes()))
        finally:
            jg.set_num_threads()
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("bad,match", [(7, r"index 7 at position 2 of 't' is not an integer in \[0, 5\)"),
                                       (-100, r"index -100 at position 2 .* nor ignore_index -1")])
def test_bad_fed_class_raises_naming_the_targets(bad, match):
    g, x, W, t, loss = model(np.float64, (4, 5), classes=True, ignore_index=-1)
    ids = np.array([0, 1, bad, 2])        # (a float feed is refused before it runs)
    fwd = jg.build_forward(loss)
    with pytest.raises(jg.GraphError, match="cross_entropy_index .*" + match):
        fwd.run({x: np.zeros((4, 6)), t: ids})
    bwd = jg.build_backward(fwd)
    with pytest.raises(jg.GraphError, match=match):
        bwd.run({x: np.zeros((4, 6)), t: ids})


def test_bad_arguments_raise_at_build():
    g = jg.Graph(np.float64)
    logits = g.input((4, 5), name="logits")
    with pytest.raises(jg.GraphError, match=r"class targets for 'logits' must lie in \[0, 5\), got 5"):
        jg.cross_entropy(logits, np.array([0, 1, 5, 2]))
    with pytest.raises(jg.GraphError, match="ignore_index needs integer class targets"):
        jg.cross_entropy(logits, np.full((4, 5), 0.2), ignore_index=0)
    with pytest.raises(jg.GraphError, match=r"shape of logits 'logits' \(4, 5\) \(probabilities\), or \(4,\)"):
        jg.cross_entropy(logits, np.zeros((3,), dtype=np.int64) + 0.5)
    with pytest.raises(jg.GraphError, match="ignore_index must be an int or None"):
        jg.cross_entropy(logits, np.array([0, 1, 2, 3]), ignore_index=1.5)
    assert jg.cross_entropy(logits, np.array([0, -7, 2, 3]), ignore_index=-7).op == "cross_entropy_index"
    # integer one-hot rows shaped like the logits stay probabilities
    assert jg.cross_entropy(logits, np.eye(5, dtype=np.int64)[[0, 1, 2, 3]]).op == "cross_entropy"


def test_second_order_through_class_targets_says_it_is_not_supported():
    g, x, W, t, loss = model(np.float64, (4, 5), classes=True)
    (dW,) = jg.grad(loss, [W])
    with pytest.raises(jg.GraphError, match="cross_entropy_index_d.*no gradient rule"):
        jg.build_backward(jg.build_forward(jg.sum(dW * dW)))


def test_probability_rows_of_any_sum_match_numpy():
    """The logits' gradient is (softmax sum(t) - t) / rows: masked (zero) rows add nothing."""
    x = RNG.standard_normal((4, 5))
    tv = RNG.random((4, 5))
    tv[1] = 0.0
    g = jg.Graph(np.float64)
    L = g.param(x, name="L")
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(L, g.const(tv))))
    loss = float(bwd.run())
    assert loss == pytest.approx(-(tv * np.log(softmax(x))).sum(-1).mean(), rel=1e-13)
    np.testing.assert_allclose(L.grad, (softmax(x) * tv.sum(-1, keepdims=True) - tv) / 4, rtol=1e-12, atol=1e-15)
    assert not L.grad[1].any()
    assert BY_NAME["cross_entropy_d"].code == 53
