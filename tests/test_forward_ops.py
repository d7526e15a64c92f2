"""Every forward op against a naive numpy reference: random shapes, broadcasting,
edge shapes (size-1 dims, scalars, 4-D), float32 and float64."""
import itertools
import math

import numpy as np
import pytest
from scipy.special import erf

import jitgraph as jg
from jitgraph.ops.shape import transpose_kernel
from jitgraph.registry import BY_NAME

from .conftest import tol
from .helpers import rand, run_fn
from .naive import REF


def random_shape(rng, ndim, high=5):
    return tuple(int(d) for d in rng.integers(1, high + 1, size=ndim))


def broadcast_pair(rng):
    """Two shapes that broadcast: random ndim 0..4, some dims set to 1 or dropped."""
    nd = int(rng.integers(0, 5))
    out = random_shape(rng, nd)
    a = [d if rng.random() > 0.3 else 1 for d in out]
    b = [d if rng.random() > 0.3 else 1 for d in out]
    a = tuple(a[int(rng.integers(0, nd + 1)):]) if nd else ()
    b = tuple(b[int(rng.integers(0, nd + 1)):]) if nd else ()
    return a, b


BINARY = sorted(n for n, c in REF.items() if c.fuzz == "binary")
OPERATOR = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "div": lambda a, b: a / b}


def binary(name):
    """(how to build it, numpy reference) of binary op ``name``: its operator where it has one."""
    return OPERATOR.get(name, BY_NAME[name].builder), REF[name].ref


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("seed", range(12))
def test_binary_broadcasting(name, seed, dtype):
    rng = np.random.default_rng(seed)
    sa, sb = broadcast_pair(rng)
    a = rand(rng, sa, dtype)
    b = rand(rng, sb, dtype, 0.5, 2.0)        # keep divisors away from 0
    f, ref = binary(name)
    got = run_fn(f, [a, b], dtype)
    want = ref(a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.parametrize("name", BINARY)
def test_binary_with_python_scalars_and_arrays(name, dtype):
    rng = np.random.default_rng(1)
    a = rand(rng, (3, 4), dtype, 0.5, 2)
    c = rand(rng, (4,), dtype, 0.5, 2)
    f, ref = binary(name)
    np.testing.assert_allclose(run_fn(lambda t: f(t, 2.5), [a], dtype), ref(a, 2.5), **tol(dtype))
    np.testing.assert_allclose(run_fn(lambda t: f(2.5, t), [a], dtype), ref(2.5, a), **tol(dtype))
    np.testing.assert_allclose(run_fn(lambda t: f(t, c), [a], dtype), ref(a, c), **tol(dtype))
    np.testing.assert_allclose(run_fn(lambda t: f(c, t), [a], dtype), ref(c, a), **tol(dtype))


def test_operators_build_the_right_ops(dtype):
    rng = np.random.default_rng(2)
    a, b = rand(rng, (2, 3), dtype, 0.5, 2), rand(rng, (3,), dtype, 0.5, 2)
    got = run_fn(lambda x, y: -(x + y) * (x - y) / y, [a, b], dtype)
    np.testing.assert_allclose(got, -(a + b) * (a - b) / b, **tol(dtype))
    got = run_fn(lambda x, y: 1.0 - x / 4 + 3 * y - abs(x), [a, b], dtype)
    np.testing.assert_allclose(got, 1.0 - a / 4 + 3 * b - np.abs(a), **tol(dtype))


def gelu_ref(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def sigmoid_ref(x):
    return 1 / (1 + np.exp(-x))


UNARY = sorted(n for n, c in REF.items() if c.fuzz == "unary" and not c.kw and not c.node)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 1), (2, 3, 4), (2, 1, 3, 5), (33, 17)])
def test_unary(name, shape, dtype):
    """Each unary op at many shapes, on values drawn like its reference example (its domain)."""
    rng = np.random.default_rng(len(shape))
    pool = np.concatenate([np.ravel(REF[name].args(rng)[0]) for _ in range(4)])
    x = rng.choice(pool, size=shape).astype(dtype)
    got = run_fn(BY_NAME[name].builder, [x], dtype)
    assert got.shape == x.shape and got.dtype == dtype
    np.testing.assert_allclose(got, REF[name].ref(x.astype(np.float64)).astype(dtype), **tol(dtype))


def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_fn(jg.relu, [x]), np.maximum(x, 0))
        np.testing.assert_array_equal(run_fn(jg.sqrt, [x]), np.sqrt(x))
        np.testing.assert_array_equal(run_fn(jg.log, [x]), np.log(x))
        np.testing.assert_array_equal(run_fn(jg.exp, [x]), np.exp(x))
        np.testing.assert_array_equal(run_fn(jg.abs, [x]), np.abs(x))
        np.testing.assert_array_equal(run_fn(lambda t: t / jg.scale(t, 0.0), [x]), x / (x * 0.0))
    s = run_fn(jg.sigmoid, [np.array([-1000.0, 1000.0])])
    np.testing.assert_array_equal(s, [0.0, 1.0])


AXES = [None, 0, -1, (0, 1), (1,), (0, 2), (-1, -3)]


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("mean", np.mean), ("max", np.max)])
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_3d(name, ref, axis, keepdims, dtype):
    x = rand(np.random.default_rng(3), (4, 3, 5), dtype)
    fn = getattr(jg, name)
    got = run_fn(lambda t: fn(t, axis=axis, keepdims=keepdims), [x], dtype)
    want = ref(x.astype(np.float64), axis=axis, keepdims=keepdims)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("mean", np.mean), ("max", np.max)])
@pytest.mark.parametrize("shape,axis", [((), None), ((1,), 0), ((6,), None), ((2, 1, 3, 4), (1, 3)),
                                        ((2, 3, 4, 5), (0, 3)), ((2, 3, 4, 5), (1, 2)), ((5, 1), 1),
                                        ((3, 4, 5, 2), None), ((1000,), 0)])
def test_reductions_edge_shapes(name, ref, shape, axis, dtype):
    x = rand(np.random.default_rng(4), shape, dtype)
    got = run_fn(lambda t: getattr(jg, name)(t, axis=axis), [x], dtype)
    np.testing.assert_allclose(got, ref(x.astype(np.float64), axis=axis), **tol(dtype))


def test_max_propagates_nan_like_numpy():
    x = np.array([[1.0, np.nan, 3.0], [2.0, 5.0, -1.0]])
    got = run_fn(lambda t: jg.max(t, axis=1), [x])
    np.testing.assert_array_equal(got, np.max(x, axis=1))


def test_sum_is_accurate_on_long_float32_rows():
    x = np.full(1_000_000, 0.1, np.float32)
    got = run_fn(jg.sum, [x], np.float32)
    assert abs(float(got) - 0.1 * 1e6) / 1e5 < 1e-6 * 1e6 / 1e5 + 1e-6   # float64 accumulation


@pytest.mark.parametrize("src,dst", [((2, 3), (3, 2)), ((3,), (4, 3)), ((1, 4), (5, 4)), ((2, 1, 3), (2, 4, 3)),
                                     ((), (2, 2)), ((4, 1), (2, 4, 6))])
def test_broadcast_to(src, dst, dtype):
    if src == (2, 3):
        with pytest.raises(jg.GraphError, match="cannot broadcast"):
            run_fn(lambda t: jg.broadcast_to(t, dst), [np.zeros(src)], dtype)
        return
    x = rand(np.random.default_rng(5), src, dtype)
    np.testing.assert_array_equal(run_fn(lambda t: jg.broadcast_to(t, dst), [x], dtype), np.broadcast_to(x, dst))


MATMUL_SHAPES = [
    ((3, 4), (4, 5)), ((1, 4), (4, 1)), ((4,), (4, 3)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((2, 3, 4), (2, 4, 6)),
    ((1, 3, 4), (2, 4, 2)), ((64, 32), (32, 16)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul(sa, sb, dtype):
    rng = np.random.default_rng(6)
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    got = run_fn(lambda x, y: x @ y, [a, b], dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-4 if dtype == np.float32 else 1e-12)


def test_matmul_with_param_operands(dtype):
    rng = np.random.default_rng(7)
    a, b = rand(rng, (5, 3), dtype), rand(rng, (3, 2), dtype)
    got = run_fn(lambda x, y: jg.matmul(x, y), [a, b], dtype, params=True)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5)


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((6,), (1, 6, 1)), ((), (1, 1)),
                                       ((4, 1), (4,)), ((2, 3, 4, 5), (5, -1, 2))])
def test_reshape(shape, new, dtype):
    x = rand(np.random.default_rng(8), shape, dtype)
    got = run_fn(lambda t: jg.relu(jg.reshape(t, new)) + 0.0, [x], dtype)
    np.testing.assert_array_equal(got, np.maximum(x.reshape(new), 0))


@pytest.mark.parametrize("shape,axes", [((2, 3), None), ((2, 3, 4), (1, 0, 2)), ((2, 3, 4), (2, 0, 1)),
                                        ((2, 3, 4, 5), (3, 1, 0, 2)), ((1, 3, 1), (2, 1, 0)), ((5,), None),
                                        ((2, 3, 4, 5), (0, 1, 3, 2)), ((3, 1, 4), (1, 0, 2))])
def test_transpose(shape, axes, dtype):
    x = rand(np.random.default_rng(9), shape, dtype)
    got = run_fn(lambda t: jg.transpose(t, axes) * 1.0, [x], dtype)
    np.testing.assert_array_equal(got, np.transpose(x, axes))


@pytest.mark.parametrize("shape,axes", [((32, 16, 32, 32), (0, 2, 3, 1)), ((3, 5, 9, 13), (0, 2, 3, 1)),
                                        ((2, 7, 8, 8), (0, 2, 3, 1)), ((4, 33, 17, 10), (0, 2, 3, 1)),
                                        ((100, 37), (1, 0)), ((2, 3, 40, 24), (0, 3, 1, 2)), ((5, 6, 7, 8), (3, 2, 1, 0))])
def test_transposes_by_tiles_at_every_thread_count(shape, axes, dtype):
    """Batches of 2-D transposes (channels first -> last, .T) go by vector tiles, 8 x 8 or 4 x 4:
    whole tiles, the rows and columns past the last one, and tiles cut by a thread's range of
    rows, at 1 and 2 threads."""
    x = rand(np.random.default_rng(19), shape, dtype)
    g = jg.Graph(dtype)
    t = g.input(shape, name="x")
    fwd = jg.build_forward(jg.transpose(t, axes))
    for n in (1, 2):
        jg.set_num_threads(min(n, jg.threads.max_threads()))
        try:
            np.testing.assert_array_equal(fwd.run({t: x}), np.transpose(x, axes), err_msg=f"{n} threads")
        finally:
            jg.set_num_threads()


@pytest.mark.parametrize("axes", list(itertools.permutations(range(4))))
def test_the_transpose_kernel_over_any_range_of_rows(axes, dtype):
    """transpose_kernel counts its rows' indices from the first row of its range (one division,
    not one a row): every permutation of a 4-D shape with odd sizes (and one wide enough for
    tiles), cut into ranges at every kind of boundary, gives numpy's transpose."""
    rng = np.random.default_rng(23)
    for shape in ((3, 5, 7, 9), (2, 9, 8, 17)):
        x = rand(rng, shape, dtype)
        want = np.ascontiguousarray(np.transpose(x, axes)).ravel()
        rows = int(np.prod(want.shape)) // shape[axes[3]]
        for cuts in ([0, rows], [0, 1, rows], [0, 5, 6, 37, rows], list(range(0, rows, 7)) + [rows]):
            out = np.full(want.size, np.nan, dtype)
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                assert transpose_kernel(out, x.ravel(), np.array(shape, np.int64), np.array(axes, np.int64), lo,
                                        min(hi, rows)) == 0
            np.testing.assert_array_equal(out, want, err_msg=f"{shape} {axes} {cuts}")


@pytest.mark.parametrize("log", [False, True])
def test_softmax_and_its_gradient_in_place_are_what_they_are_out_of_place(log, dtype):
    """softmax may write over its dying source (and softmax_d over g or y): the one-array loops
    of the in-place path give the out-of-place path's bits, in a program whose plan really puts
    the output on the source (checked), and numpy's values."""
    rng = np.random.default_rng(21)
    x = rand(rng, (6, 5, 37), dtype)
    w = rand(rng, (6, 5, 37), dtype)
    f = jg.log_softmax if log else jg.softmax

    g = jg.Graph(dtype)
    t = g.param(x, name="x")
    src = t * 2.0                                         # an intermediate that dies at the softmax
    y = f(src, -1)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * g.const(w))), fuse=False)
    if not log:                                           # log_softmax reads x after writing: never in place
        assert bwd.off[y.id] == bwd.off[src.id], "the plan did not put softmax on its source"
    loss = np.asarray(bwd.run())
    grad = np.array(t.grad)
    ref_x = 2 * x
    want = ref_x - ref_x.max(-1, keepdims=True)
    want = want - np.log(np.exp(want).sum(-1, keepdims=True)) if log else \
        np.exp(want) / np.exp(want).sum(-1, keepdims=True)
    np.testing.assert_allclose(loss, (want * w).sum(), **tol(dtype))
    # the same program out of place, on the doubled input: its bits
    g2 = jg.Graph(dtype)
    t2 = g2.param(ref_x, name="x")
    b2 = jg.build_backward(jg.build_forward(jg.sum(f(t2, -1) * g2.const(w))), fuse=False)
    np.testing.assert_array_equal(np.asarray(b2.run()), loss)
    np.testing.assert_array_equal(2 * np.array(t2.grad), grad)


def test_transpose_of_size_one_axes_is_a_view():
    g = jg.Graph()
    x = g.input((3, 1, 4))
    assert jg.transpose(x, (1, 0, 2)).op == "reshape"
    assert jg.transpose(x, (2, 1, 0)).op == "transpose"
    assert x.T.shape == (4, 1, 3)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(n, axis, dtype):
    rng = np.random.default_rng(10 + n)
    arrays = []
    for i in range(n):
        shape = [2, 3, 4]
        shape[axis] = int(rng.integers(1, 4))
        arrays.append(rand(rng, tuple(shape), dtype))
    got = run_fn(lambda *ts: jg.concat(list(ts), axis=axis), arrays, dtype)
    np.testing.assert_array_equal(got, np.concatenate(arrays, axis=axis))


def test_slice_and_pad(dtype):
    x = rand(np.random.default_rng(11), (3, 5, 2), dtype)
    np.testing.assert_array_equal(run_fn(lambda t: jg.slice_axis(t, 1, 1, 4), [x], dtype), x[:, 1:4])
    np.testing.assert_array_equal(run_fn(lambda t: jg.slice_axis(t, 0, -2, 3), [x], dtype), x[1:3])
    np.testing.assert_array_equal(run_fn(lambda t: jg.pad_axis(t, 2, 1, 3), [x], dtype),
                                  np.pad(x, [(0, 0), (0, 0), (1, 3)]))


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape,axis", [((5,), -1), ((3, 7), -1), ((3, 7), 0), ((2, 3, 4), 1), ((2, 3, 4, 5), 2),
                                        ((1, 1), -1), ((4, 1000), -1)])
def test_softmax_and_log_softmax(shape, axis, dtype):
    x = rand(np.random.default_rng(12), shape, dtype, -10, 10)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(run_fn(lambda t: jg.softmax(t, axis), [x], dtype), softmax_ref(x64, axis), **tol(dtype))
    np.testing.assert_allclose(run_fn(lambda t: jg.log_softmax(t, axis), [x], dtype),
                               np.log(softmax_ref(x64, axis)), **tol(dtype))


def test_softmax_is_stable_for_large_logits():
    x = np.array([[1000.0, 1001.0, 999.0], [-1e4, 0.0, 1e4]])
    got = run_fn(jg.softmax, [x])
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, softmax_ref(x, -1))


@pytest.mark.parametrize("shape", [(4, 10), (7,), (2, 3, 5), (1, 1)])
def test_cross_entropy(shape, dtype):
    rng = np.random.default_rng(13)
    logits = rand(rng, shape, dtype, -5, 5)
    t = rng.random(shape)
    t = (t / t.sum(axis=-1, keepdims=True)).astype(dtype)
    got = run_fn(jg.cross_entropy, [logits, t], dtype)
    l64 = logits.astype(np.float64)
    lsm = np.log(softmax_ref(l64, -1))
    want = -(t * lsm).sum(axis=-1).mean()
    assert got.shape == ()
    np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.parametrize("shape", [(4, 16), (7,), (2, 3, 5), (2, 2, 2, 9), (3, 1)])
def test_layer_norm_and_rms_norm(shape, dtype):
    x = rand(np.random.default_rng(14), shape, dtype, -3, 3)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(run_fn(lambda t: jg.layer_norm(t, 1e-5), [x], dtype),
                               (x64 - mu) / np.sqrt(var + 1e-5), **tol(dtype))
    ms = (x64 ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(run_fn(lambda t: jg.rms_norm(t, 1e-6), [x], dtype),
                               x64 / np.sqrt(ms + 1e-6), **tol(dtype))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_or_scales(p, dtype):
    x = rand(np.random.default_rng(15), (200, 50), dtype, 0.5, 2)
    got = run_fn(lambda t: jg.dropout(t, p, seed=3), [x], dtype)
    kept = got != 0
    np.testing.assert_allclose(got[kept], (x / (1 - p))[kept], **tol(dtype))
    frac = kept.mean()
    n = x.size
    assert abs(frac - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


def test_dropout_zero_p_is_identity():
    g = jg.Graph()
    x = g.input((3,))
    assert jg.dropout(x, 0.0) is x


@pytest.mark.parametrize("idx_shape", [(5,), (2, 3), (1,), (2, 2, 2)])
def test_embedding(idx_shape, dtype):
    rng = np.random.default_rng(16)
    table = rand(rng, (7, 4), dtype)
    idx = rng.integers(0, 7, size=idx_shape)
    g = jg.Graph(dtype)
    T = g.param(table, name="T")
    i = g.input(idx_shape, name="i", dtype=np.int64)
    out = jg.build_forward(jg.embedding(T, i)).run({i: idx})
    np.testing.assert_array_equal(out, table[idx])
    out2 = jg.build_forward(jg.embedding(T, idx)).run()     # a constant index array
    np.testing.assert_array_equal(out2, table[idx])


def test_scalar_graph_and_4d_chain(dtype):
    rng = np.random.default_rng(17)
    x = rand(rng, (2, 3, 4, 5), dtype)
    s = rand(rng, (), dtype)
    got = run_fn(lambda a, b: jg.sum(jg.tanh(a * b + 1.0), axis=(1, 3)) / 2.0, [x, s], dtype)
    want = np.tanh(x.astype(np.float64) * s + 1.0).sum(axis=(1, 3)) / 2.0
    np.testing.assert_allclose(got, want, **tol(dtype))


def test_multiple_outputs_and_leaf_output(dtype):
    g = jg.Graph(dtype)
    x = g.input((3,), name="x")
    W = g.param(np.arange(3.0), name="W")
    y = x * W
    fwd = jg.build_forward([y, jg.sum(y), W])
    xb = np.array([1.0, 2.0, 3.0])
    a, b, c = fwd.run({x: xb})
    np.testing.assert_allclose(a, xb * np.arange(3.0))
    np.testing.assert_allclose(b, (xb * np.arange(3.0)).sum())
    np.testing.assert_array_equal(c, np.arange(3.0))


def test_results_are_fresh_copies_and_params_are_read_at_run_time():
    g = jg.Graph(np.float64)
    x = g.input((2,), name="x")
    W = g.param(np.ones(2), name="W")
    fwd = jg.build_forward(x * W)
    r1 = fwd.run({x: [1.0, 2.0]})
    W.value = np.array([3.0, 4.0])
    r2 = fwd.run({x: [1.0, 2.0]})
    np.testing.assert_array_equal(r1, [1.0, 2.0])
    np.testing.assert_array_equal(r2, [3.0, 8.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_grad_has_the_bits_of_gelu_d_times_g(dtype):
    """gelu_grad(g, x) = g * gelu_d(x) in one pass: the same bits as the two nodes, over a dense
    range, the tails and the special values."""
    from jitgraph.ops.derivatives import gelu_d, gelu_grad
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-12.0, 12.0, 20001), rng.standard_normal(5000) * 3,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 40.0, -40.0]]).astype(dtype)
    g = rng.standard_normal(x.size).astype(dtype)
    g[:3] = (0.0, np.inf, -1.0)
    with np.errstate(all="ignore"):
        one = run_fn(gelu_grad, [g, x], dtype)
        two = run_fn(lambda a, b: a * gelu_d(b), [g, x], dtype)
    assert one.dtype == dtype and one.tobytes() == two.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_gradients_are_one_node_with_the_two_nodes_bits(dtype, monkeypatch):
    """gelu's rule emits gelu_grad (no gelu_d, no mul); first and second order gradients have the
    bits the rule of two nodes gave."""
    from jitgraph import rules
    from jitgraph.ops import unary
    rng = np.random.default_rng(3)
    xs, ws = rng.standard_normal((8, 16)).astype(dtype), rng.standard_normal((8, 16)).astype(dtype)

    def grads():
        g = jg.Graph(dtype)
        x, w = g.param(xs, name="x"), g.param(ws, name="w")
        (gx,) = jg.grad(jg.sum(jg.gelu(x) * w), [x])
        (gxx,) = jg.grad(jg.sum(gx * w), [x])
        prog = jg.build_forward([gx, gxx])
        return [n["op"] for n in prog.nodes()], [a.tobytes() for a in prog.run({})]

    ops_one, one = grads()
    monkeypatch.setattr(unary, "GRAD_IN_ONE_NODE", False)
    monkeypatch.setattr(rules, "_tables", {})
    ops_two, two = grads()
    monkeypatch.undo()
    rules._tables.clear()
    assert "gelu_grad" in ops_one and "gelu_d" not in ops_one and ops_one.count("mul") < ops_two.count("mul")
    assert "gelu_grad" not in ops_two and "gelu_d" in ops_two
    assert one == two
