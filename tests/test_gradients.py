"""Every op's gradient against central finite differences in float64
(jg.check_grads), on at least three shapes each, broadcasting included."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.registry import BY_NAME

from .naive import REF, build

RNG = np.random.default_rng(1234)


def r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape)


def away_from_zero(*shape):
    x = r(*shape, lo=0.2, hi=2.0)
    return x * np.where(RNG.random(shape) < 0.5, -1.0, 1.0)


def check(fn, args, **kw):
    res = jg.check_grads(fn, args, **kw)      # each coordinate within 1e-9 + 1e-6 x its magnitude
    assert res.ok and res.n_checked > 0, res
    return res


BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((), (2, 3)), ((2, 3, 1, 2), (1, 3, 4, 1))]


@pytest.mark.parametrize("op", sorted(n for n, c in REF.items() if c.fuzz == "binary" and c.grad))
@pytest.mark.parametrize("sa,sb", BINARY_SHAPES)
def test_binary(op, sa, sb):
    a = r(*sa)
    b = away_from_zero(*sb) if REF[op].domain == "positive" else r(*sb)
    check(BY_NAME[op].builder, [a, b])


def test_same_tensor_in_both_slots():
    check(lambda x: x * x + x / (x * x + 1.0) - x, [r(3, 2)])


UNARY = sorted(n for n, c in REF.items() if c.fuzz == "unary" and c.grad)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 2, 2)])
def test_unary(name, shape):
    """Each differentiable unary op at several shapes, on values drawn like its example."""
    case = REF[name]
    pool = np.ravel(case.args(RNG)[0])
    x = RNG.choice(pool, size=shape, replace=pool.size < max(1, int(np.prod(shape))))
    check(lambda t: build(name, BY_NAME[name].builder, [t], case.kw), [x])


def test_affine_expressions():
    check(lambda t: 3.0 - t * 0.5 + 1.0, [r(3, 4)])


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@pytest.mark.parametrize("shape,axis,keepdims", [((4,), None, False), ((3, 4), 1, True), ((2, 3, 4), (0, 2), False),
                                                 ((2, 3, 4, 5), (1, 3), True), ((3, 4), 0, False)])
def test_reductions(name, shape, axis, keepdims):
    x = RNG.permutation(np.arange(np.prod(shape), dtype=float)).reshape(shape) / 7.0   # no ties for max
    check(lambda t: getattr(jg, name)(t, axis=axis, keepdims=keepdims), [x])


def test_max_gradient_goes_to_the_first_tie():
    g = jg.Graph(np.float64)
    W = g.param(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]]), name="W")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.max(W, axis=1))))
    bwd.run()
    np.testing.assert_array_equal(W.grad, [[0, 1, 0], [1, 0, 0]])


def test_kinks_get_the_documented_one_sided_choice():
    g = jg.Graph(np.float64)
    W = g.param(np.array([-1.0, 0.0, 2.0]), name="W")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.relu(W) + jg.abs(W))))
    bwd.run()
    np.testing.assert_array_equal(W.grad, [0 - 1, 0 + 0, 1 + 1])


@pytest.mark.parametrize("src,dst", [((3,), (2, 3)), ((2, 1), (2, 5)), ((), (3, 2)), ((4, 1, 3), (2, 4, 5, 3))])
def test_broadcast_to(src, dst):
    check(lambda t: jg.broadcast_to(t, dst), [r(*src)])


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 3)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 2)), ((2, 1, 3, 4), (3, 4, 2)),
                                   ((1, 1), (1, 1))])
def test_matmul(sa, sb):
    check(lambda a, b: a @ b, [r(*sa), r(*sb)])


def test_matmul_chains_and_transposed_operands():
    # gradients of gradients exercise the transposed-flag rules: checked via second order below;
    # here a chain with a transpose in the middle
    check(lambda a, b, c: (a @ b.T) @ c, [r(3, 4), r(5, 4), r(5, 2)])


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (6, 4)), ((6,), (2, 1, 3)), ((3, 1), (3,))])
def test_reshape(shape, new):
    check(lambda t: jg.tanh(jg.reshape(t, new)), [r(*shape)])


@pytest.mark.parametrize("shape,axes", [((3, 4), None), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (1, 3, 0, 2)),
                                        ((3, 1, 4), (1, 0, 2))])
def test_transpose(shape, axes):
    w = r(*np.transpose(np.zeros(shape), axes).shape)
    check(lambda t: jg.transpose(t, axes) * w, [r(*shape)])


@pytest.mark.parametrize("n,axis", [(2, 0), (3, 1), (6, -1)])
def test_concat(n, axis):
    shapes = []
    for i in range(n):
        s = [2, 3, 2]
        s[axis] = 1 + i % 3
        shapes.append(tuple(s))
    total = sum(s[axis] for s in shapes)
    out_shape = list(shapes[0])
    out_shape[axis] = total
    w = r(*out_shape)
    check(lambda *ts: jg.concat(list(ts), axis) * w, [r(*s) for s in shapes])


def test_concat_same_tensor_twice():
    check(lambda t: jg.sqr(jg.concat([t, t, jg.tanh(t)], 0)), [r(2, 3)])


@pytest.mark.parametrize("shape,axis,a,b", [((5,), 0, 1, 4), ((3, 6), 1, 0, 2), ((2, 3, 4), 2, 1, 3)])
def test_slice_and_pad(shape, axis, a, b):
    check(lambda t: jg.sqr(jg.slice_axis(t, axis, a, b)), [r(*shape)])
    check(lambda t: jg.sqr(jg.pad_axis(t, axis, a, b) + 1.0), [r(*shape)])


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,axis", [((5,), -1), ((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1)])
def test_softmax_family(name, shape, axis):
    w = r(*shape)
    check(lambda t: getattr(jg, name)(t, axis) * w, [r(*shape)])


@pytest.mark.parametrize("shape", [(4, 5), (7,), (2, 3, 4)])
def test_cross_entropy_both_arguments(shape):
    t = RNG.random(shape)
    t /= t.sum(-1, keepdims=True)
    check(jg.cross_entropy, [r(*shape), t])


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4)])
def test_cross_entropy_targets_that_are_not_probabilities(shape):
    """Rows of targets summing to anything (the first one all zero: a masked row): the
    logits' gradient carries sum(target), which the rule once assumed to be 1."""
    t = RNG.random(shape) * 0.8
    t.reshape(-1, shape[-1])[0] = 0.0
    check(jg.cross_entropy, [r(*shape), t])


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape", [(6,), (3, 5), (2, 2, 4)])
def test_norms(name, shape):
    w = r(*shape)
    check(lambda t: getattr(jg, name)(t, 1e-5) * w, [r(*shape)])


@pytest.mark.parametrize("shape,p", [((10,), 0.3), ((4, 6), 0.5), ((2, 3, 4), 0.1)])
def test_dropout(shape, p):
    res = check(lambda t: jg.sqr(jg.dropout(t, p, seed=7)), [r(*shape)])
    assert res.n_checked == np.prod(shape)


@pytest.mark.parametrize("idx", [np.array([0, 2, 2, 4]), np.array([[1, 0], [1, 1], [3, 4]]), np.array([3])])
def test_embedding_table_gradient_with_repeats(idx):
    check(lambda T, i: jg.sqr(jg.embedding(T, i)), [r(5, 3), idx])


def test_embedding_with_index_input():
    g = jg.Graph(np.float64)
    T = g.param(r(6, 2), name="T")
    i = g.input((4,), name="i", dtype=np.int32)
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.embedding(T, i) * 2.0)))
    bwd.run({i: np.array([5, 0, 5, 1])})
    want = np.zeros((6, 2))
    np.add.at(want, [5, 0, 5, 1], 2.0)
    np.testing.assert_array_equal(T.grad, want)


# ---- naive numpy references ------------------------------------------------------------
def test_two_layer_mlp_against_hand_written_numpy_backward():
    x, t = r(8, 5), r(8, 3)
    g = jg.Graph(np.float64)
    X, T = g.input((8, 5), name="x"), g.input((8, 3), name="t")
    W1, b1 = g.param(r(5, 7), name="W1"), g.param(r(7), name="b1")
    W2 = g.param(r(7, 3), name="W2")
    h = jg.relu(X @ W1 + b1)
    loss = jg.mean(jg.sqr(h @ W2 - T))
    bwd = jg.build_backward(jg.build_forward(loss))
    val = bwd.run({X: x, T: t})
    # numpy, by hand
    a = x @ W1.value + b1.value
    hh = np.maximum(a, 0)
    y = hh @ W2.value
    d = 2 * (y - t) / y.size
    gW2 = hh.T @ d
    dh = d @ W2.value.T
    da = dh * (a > 0)
    np.testing.assert_allclose(val, ((y - t) ** 2).mean(), rtol=1e-13)
    np.testing.assert_allclose(W2.grad, gW2, rtol=1e-12)
    np.testing.assert_allclose(W1.grad, x.T @ da, rtol=1e-12)
    np.testing.assert_allclose(b1.grad, da.sum(0), rtol=1e-12)
    np.testing.assert_array_equal(bwd.grad(W1), W1.grad)


def test_softmax_cross_entropy_against_numpy_formula():
    logits, t = r(6, 4), np.eye(4)[RNG.integers(0, 4, 6)]
    g = jg.Graph(np.float64)
    L = g.param(logits, name="L")
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(L, t)))
    bwd.run()
    e = np.exp(logits - logits.max(1, keepdims=True))
    sm = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(L.grad, (sm - t) / 6, rtol=1e-12, atol=1e-15)


def test_layer_norm_against_numpy_formula():
    x, w = r(4, 6), r(4, 6)
    g = jg.Graph(np.float64)
    X = g.param(x, name="X")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.layer_norm(X, 1e-5) * w)))
    bwd.run()
    mu = x.mean(1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    y = (x - mu) * rstd
    want = rstd * (w - w.mean(1, keepdims=True) - y * (w * y).mean(1, keepdims=True))
    np.testing.assert_allclose(X.grad, want, rtol=1e-10, atol=1e-13)
