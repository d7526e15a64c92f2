"""sin, cos, pow, clip, maximum / minimum, comparison masks and layer_norm's affine:
the operators, the edge cases numpy defines, gradients and bad arguments.  (Values
against naive.py and finite differences for every op: test_ops.py, test_gradients.py.)"""
import numpy as np
import pytest

import jitgraph as jg

RNG = np.random.default_rng(3)


def run(fn, *arrays, dtype=np.float64):
    g = jg.Graph(dtype)
    xs = [g.input(np.shape(a), name=f"x{i}") for i, a in enumerate(arrays)]
    return jg.build_forward(fn(*xs)).run({x: a for x, a in zip(xs, arrays)})


def test_operators_build_masks_and_powers():
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal(4)
    np.testing.assert_array_equal(run(lambda x, y: x < y, a, b), (a < b) * 1.0)
    np.testing.assert_array_equal(run(lambda x, y: x <= y, a, b), (a <= b) * 1.0)
    np.testing.assert_array_equal(run(lambda x, y: x > y, a, b), (a > b) * 1.0)
    np.testing.assert_array_equal(run(lambda x: x >= 0.5, a), (a >= 0.5) * 1.0)
    np.testing.assert_array_equal(run(lambda x, y: jg.equal(x, y), np.round(a), np.round(b)),
                                  (np.round(a) == np.round(b)) * 1.0)
    np.testing.assert_allclose(run(lambda x: abs(x) ** 1.5, a), np.abs(a) ** 1.5, rtol=1e-15)
    np.testing.assert_allclose(run(lambda x: x ** 2, a), a * a, rtol=0)


def test_tensor_equality_still_means_the_same_tensor():
    g = jg.Graph(np.float64)
    x = g.input((2,), name="x")
    again = jg.Tensor(g, x.id)
    assert (x == again) is True and (x != again) is False and hash(x) == hash(again)
    y = x * 2.0
    assert jg.build_forward(y).run({again: np.ones(2)}).tolist() == [2.0, 2.0]    # a feed dict key


def test_scalars_are_constants_not_folded_into_affine():
    """maximum(t, 3) is not t / 3 (the scalar folding of + - * / must not catch the others)."""
    a = np.array([1.0, 5.0, -2.0])
    np.testing.assert_array_equal(run(lambda x: jg.maximum(x, 3.0), a), [3.0, 5.0, 3.0])
    np.testing.assert_array_equal(run(lambda x: jg.minimum(2.0, x), a), [1.0, 2.0, -2.0])
    np.testing.assert_array_equal(run(lambda x: jg.less(x, 0.0), a), [0.0, 0.0, 1.0])


def test_numpy_edge_cases():
    a = np.array([np.nan, 1.0, -np.inf, 0.0])
    b = np.array([1.0, np.nan, 2.0, -0.0])
    np.testing.assert_array_equal(run(jg.maximum, a, b), np.maximum(a, b))
    np.testing.assert_array_equal(run(jg.minimum, a, b), np.minimum(a, b))
    c = np.array([-8.0, -1.0, 0.0, 4.0])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run(lambda x: x ** 0.5, c), np.power(c, 0.5))
        np.testing.assert_array_equal(run(lambda x: x ** -1.0, c), np.power(c, -1.0))
    np.testing.assert_allclose(run(jg.sin, c, dtype=np.float32), np.sin(c.astype(np.float32)), rtol=1e-6)
    np.testing.assert_array_equal(run(lambda x: jg.clip(x, None, 1.0), c), np.clip(c, None, 1.0))
    np.testing.assert_array_equal(run(lambda x: jg.clip(x, -2.0), c), np.clip(c, -2.0, None))


def gradients(fn, *values):
    g = jg.Graph(np.float64)
    ps = [g.param(v, name=f"p{i}") for i, v in enumerate(values)]
    bwd = jg.build_backward(jg.build_forward(jg.sum(fn(*ps))))
    bwd.run()
    return [p.grad for p in ps]


def test_choices_and_masks_route_gradients():
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([2.0, 2.0, 1.0])
    ga, gb = gradients(jg.maximum, a, b)
    assert ga.tolist() == [0.0, 1.0, 1.0] and gb.tolist() == [1.0, 0.0, 0.0]     # tie: to a
    ga, gb = gradients(jg.minimum, a, b)
    assert ga.tolist() == [1.0, 1.0, 0.0] and gb.tolist() == [0.0, 0.0, 1.0]
    (gc,) = gradients(lambda x: jg.clip(x, 1.5, 3.0) * 2.0, np.array([1.0, 1.5, 2.0, 3.0, 4.0]))
    assert gc.tolist() == [0.0, 2.0, 2.0, 2.0, 0.0]                                 # bounds included
    ga, gb = gradients(lambda x, y: (x < y) * x, a, b)                              # no gradient through a mask
    assert ga.tolist() == [1.0, 0.0, 0.0] and not gb.any()
    (gp,) = gradients(lambda x: x ** 0.0 + x ** 1.0 + x ** 3.0, a)
    np.testing.assert_allclose(gp, 1.0 + 3.0 * a ** 2, rtol=1e-15)


def test_layer_norm_affine_matches_numpy_and_finite_differences():
    x = RNG.standard_normal((3, 5))
    w = RNG.standard_normal(5)
    b = RNG.standard_normal(5)

    def ln(t, weight, bias):
        return jg.layer_norm(t, 1e-5, weight=weight, bias=bias)

    res = jg.check_grads(ln, [x, w, b])
    assert res.ok and res.n_checked == 25, res
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(run(lambda t: ln(t, t.graph.const(w), t.graph.const(b)), x),
                               (x - mu) / np.sqrt(var + 1e-5) * w + b, rtol=1e-12)
    np.testing.assert_allclose(run(lambda t: jg.layer_norm(t, bias=t.graph.const(b)), x),
                               (x - mu) / np.sqrt(var + 1e-5) + b, rtol=1e-12)


def _ln_graph(fused):
    """A loss through layer_norm with weight and bias: one fused node, or norm, mul and add."""
    rng = np.random.default_rng(7)                      # the same values for both graphs
    g = jg.Graph(np.float64)
    x = g.param(rng.standard_normal((4, 6, 8)), name="x")
    w, b = g.param(rng.standard_normal(8), name="w"), g.param(rng.standard_normal(8), name="b")
    y = jg.layer_norm(x, 1e-5, weight=w, bias=b) if fused else jg.layer_norm(x, 1e-5) * w + b
    return jg.build_forward(jg.sum(jg.sqr(jg.tanh(y @ g.const(rng.standard_normal((8, 8))))))), (x, w, b)


def test_layer_norm_with_weight_and_bias_is_one_node_equal_to_the_composition():
    fused, params = _ln_graph(True)
    names = [n["op"] for n in fused.nodes()]
    assert names.count("layer_norm_affine") == 1 and "layer_norm" not in names, names
    fused_bwd = jg.build_backward(fused)
    fused_bwd.run()
    fused_grads = [p.grad.copy() for p in params]
    composed, params = _ln_graph(False)
    composed_bwd = jg.build_backward(composed)
    composed_bwd.run()
    np.testing.assert_allclose(fused.run(), composed.run(), rtol=1e-14)
    for a, p in zip(fused_grads, params):
        np.testing.assert_allclose(a, p.grad, rtol=1e-12, atol=1e-13, err_msg=p.label)
    # the fused node's backward keeps x only: the normalized rows are not stored
    assert fused_bwd.stats()["peak_bytes"] < composed_bwd.stats()["peak_bytes"]


def test_second_order_through_layer_norm_affine():
    """A Hessian-vector product through the fused node's three gradients."""
    xb, v = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 5))

    def hvp_fn(x, w, b):
        gx, gw, gb = jg.grad(jg.sum(jg.sin(jg.layer_norm(x, 1e-5, weight=w, bias=b)) * x), [x, w, b])
        return jg.sum(gx * x.graph.const(v)) + jg.sum(gw * gw) + jg.sum(gb * w)
    res = jg.check_grads(hvp_fn, [xb, RNG.standard_normal(5), RNG.standard_normal(5)])
    assert res.ok, res


def test_bad_arguments_name_the_tensor():
    g = jg.Graph(np.float64)
    t = g.input((2, 3), name="t")
    with pytest.raises(jg.GraphError, match=r"pow of 't': the exponent must be a real number"):
        t ** t
    with pytest.raises(jg.GraphError, match=r"clip of 't': lo 2.0 is above hi 1.0"):
        jg.clip(t, 2.0, 1.0)
    with pytest.raises(jg.GraphError, match=r"clip of 't': hi must be a real number or None"):
        jg.clip(t, 0.0, "1")
    with pytest.raises(jg.GraphError, match=r"layer_norm of .*: weight must be a tensor of its graph with shape \(3,\)"):
        jg.layer_norm(t, weight=g.const(np.ones(2)))
    with pytest.raises(jg.GraphError, match="broadcast"):
        jg.maximum(t, g.input((4,), name="u"))


def test_argmax_is_numpys():
    x = RNG.standard_normal((2, 3, 4))
    x[0, 1, 2] = x[0, 1, 0] = 9.0                      # a tie: the first wins
    x[1, 2, 3] = np.nan                                # a NaN: it wins
    for axis in (None, 0, 1, 2, -1):
        for keepdims in (False, True):
            want = np.argmax(x, axis=axis, keepdims=keepdims).astype(float)
            got = run(lambda t: jg.argmax(t, axis, keepdims=keepdims), x)
            assert got.shape == want.shape and np.array_equal(got, want), (axis, keepdims)
    (gx,) = gradients(lambda t: jg.sum(jg.argmax(t, 1) * 3.0) + jg.sum(t), RNG.standard_normal((3, 4)))
    assert (gx == 1.0).all()                           # argmax adds nothing to the gradient
    g = jg.Graph(np.float32)
    with pytest.raises(jg.GraphError, match="argmax of 's': needs at least 1 dim"):
        jg.argmax(g.input((), name="s"))
    with pytest.raises(jg.GraphError, match="axis must be an int or None"):
        jg.argmax(g.input((2, 3), name="m"), (0, 1))


@pytest.mark.parametrize("size", [7, 256, 1000, 70_001])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_value_keeping_ops_in_place_give_the_bits_of_a_fresh_buffer(size, dtype):
    """relu, leaky_relu, clip, maximum and minimum return an input on some branch; in place
    they run through a block in cache (unary._map: LLVM's masked stores are slow on AMD) --
    the same bits as when they write a buffer of their own, NaN, -0.0 and infinities too."""
    rng = np.random.default_rng(size)
    x = rng.standard_normal(size).astype(dtype)
    x[::5], x[1::7], x[2::11], x[3::13] = -0.0, np.nan, -np.inf, np.inf
    y = rng.standard_normal(size).astype(dtype)
    ops = {"relu": jg.relu, "leaky_relu": lambda t: jg.leaky_relu(t, 0.1), "clip": lambda t: jg.clip(t, -0.5, 0.5),
           "maximum": lambda t: jg.maximum(t, 0.25), "minimum": lambda t: jg.minimum(t, 0.25),
           "maximum of two": lambda t: jg.maximum(t, t * 0.5), "minimum, scalar first": lambda t: jg.minimum(0.1, t)}
    for name, fn in ops.items():
        g = jg.Graph(dtype)
        xi, yi = g.input((size,), name="x"), g.input((size,), name="y")
        dying = xi + yi                           # dies at the op: it writes over it
        kept = (xi + yi).named("kept")            # an output too: the op writes a buffer of its own
        in_place, fresh = fn(dying), fn(kept)
        prog = jg.build_forward([in_place, fresh, kept], fuse=False)
        assert prog.off[in_place.id] == prog.off[dying.id] and prog.loc[in_place.id] == prog.loc[dying.id], name
        assert prog.off[fresh.id] != prog.off[kept.id] or prog.loc[fresh.id] != prog.loc[kept.id], name
        a, b, _ = prog.run({xi: x, yi: y})
        assert np.array_equal(np.asarray(a).view(f"u{np.dtype(dtype).itemsize}"),
                              np.asarray(b).view(f"u{np.dtype(dtype).itemsize}")), name
