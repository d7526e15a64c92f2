"""conv2d, conv1d, max_pool2d and avg_pool2d against direct numpy loops, float64 finite
differences, bit-identical checkpointing, and their argument errors; every tile shape of
the direct and the windows lowering (ops/conv.py), their gradients against numpy,
second derivatives, thread-count independence and the memory plan of the windows."""
import numpy as np
import pytest
from numba import njit

import jitgraph as jg
import jitgraph.registry  # noqa: F401 -- jg.registry
from jitgraph.native import data_pointer
from jitgraph.ops import conv as conv_module
from jitgraph.ops.windows import col2im, im2col, out_size, phases_kernel
from jitgraph.ops.conv import TILE_SHAPES, _fma, lanes, pick_tile
from jitgraph.ops.conv_weight import conv2d_weight, weight_tile
from jitgraph.simd import VECTOR_BYTES, WIDE, WIDE_BYTES

from .naive import col2im_ref, conv2d_weight_ref, im2col_ref
from .test_threads import assert_same_bits, at_each_thread_count

RNG = np.random.default_rng(11)


def pairs(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d_ref(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Direct loops over output positions (PyTorch's cross-correlation)."""
    (sh, sw), (ph, pw), (dh, dw) = pairs(stride), pairs(padding), pairs(dilation)
    N, C, H, W = x.shape
    C_out, Cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    OH = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((N, C_out, OH, OW))
    Og = C_out // groups
    for o in range(C_out):
        gi = o // Og
        for i in range(OH):
            for j in range(OW):
                patch = xp[:, gi * Cg:(gi + 1) * Cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                           j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    return out


def pool_ref(x, k, stride, padding, how):
    kh, kw = pairs(k)
    sh, sw = pairs(stride if stride is not None else k)
    ph, pw = pairs(padding)
    fill = -np.inf if how == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    OH = (x.shape[2] + 2 * ph - kh) // sh + 1
    OW = (x.shape[3] + 2 * pw - kw) // sw + 1
    out = np.zeros(x.shape[:2] + (OH, OW))
    for i in range(OH):
        for j in range(OW):
            win = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            out[:, :, i, j] = win.max(axis=(2, 3)) if how == "max" else win.mean(axis=(2, 3))
    return out


def forward(fn, *arrays, dtype=np.float64):
    g = jg.Graph(dtype)
    ts = [g.input(a.shape, name=f"a{i}") for i, a in enumerate(arrays)]
    return jg.build_forward(fn(*ts)).run({t: a for t, a in zip(ts, arrays)})


CONFIGS = [dict(), dict(stride=2), dict(padding=1), dict(padding=(2, 0), stride=(1, 2)), dict(dilation=2, padding=2),
           dict(groups=2), dict(groups=4, stride=2, padding=1)]


@pytest.mark.parametrize("kw", CONFIGS)
def test_conv2d_matches_direct_loops(kw):
    groups = kw.get("groups", 1)
    x = RNG.standard_normal((2, 4, 7, 6))
    w = RNG.standard_normal((6 if groups != 4 else 8, 4 // groups, 3, 2))
    got = forward(lambda a, b: jg.conv2d(a, b, **kw), x, w)
    np.testing.assert_allclose(got, conv2d_ref(x, w, **kw), rtol=1e-12, atol=1e-12)
    got32 = forward(lambda a, b: jg.conv2d(a, b, **kw), x, w, dtype=np.float32)
    np.testing.assert_allclose(got32, conv2d_ref(x, w, **kw), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(groups=2, dilation=2, padding=3)])
def test_conv2d_gradients_match_finite_differences(kw):
    groups = kw.get("groups", 1)
    x = RNG.standard_normal((2, 2, 5, 5))
    w = RNG.standard_normal((4, 2 // groups, 2, 3))
    res = jg.check_grads(lambda a, b: jg.conv2d(a, b, **kw), [x, w])
    assert res.ok and res.n_checked == x.size + w.size, res


def test_conv1d_matches_direct_loops_and_finite_differences():
    x = RNG.standard_normal((2, 3, 9))
    w = RNG.standard_normal((4, 3, 3))
    got = forward(lambda a, b: jg.conv1d(a, b, stride=2, padding=1, dilation=2), x, w)
    want = conv2d_ref(x[:, :, None], w[:, :, None], (1, 2), (0, 1), (1, 2))[:, :, 0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    res = jg.check_grads(lambda a, b: jg.conv1d(a, b, padding=1), [x, w])
    assert res.ok, res


@pytest.mark.parametrize("how", ["max", "avg"])
@pytest.mark.parametrize("k,stride,padding", [(2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0))])
def test_pooling_matches_numpy_and_finite_differences(how, k, stride, padding):
    x = RNG.permutation(2 * 3 * 6 * 5).reshape(2, 3, 6, 5) / 10.0        # distinct: no ties for max
    fn = jg.max_pool2d if how == "max" else jg.avg_pool2d
    got = forward(lambda a: fn(a, k, stride, padding), x)
    np.testing.assert_allclose(got, pool_ref(x, k, stride, padding, how), rtol=1e-13)
    res = jg.check_grads(lambda a: fn(a, k, stride, padding), [x])
    assert res.ok, res


def test_a_small_cnn_trains_bit_identically_with_checkpointing():
    """conv -> relu -> pool -> conv -> global mean -> linear; sqrt checkpointing gives the
    same loss and gradients bit for bit, and the planned peak counts the padded input."""
    def build(checkpoints):
        rng = np.random.default_rng(0)
        g = jg.Graph(np.float32)
        x = g.input((4, 3, 12, 12), name="x")
        t = g.input((4, 5), name="t")
        w1 = g.param(rng.standard_normal((8, 3, 3, 3)) * 0.3, name="w1")
        w2 = g.param(rng.standard_normal((8, 8, 3, 3)) * 0.2, name="w2")
        W = g.param(rng.standard_normal((8, 5)) * 0.3, name="W")
        h = jg.max_pool2d(jg.relu(jg.conv2d(x, w1, padding=1)), 2)
        h = jg.relu(jg.conv2d(h, w2, padding=1))
        logits = jg.mean(h, axis=(2, 3)) @ W
        bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(logits, t)), checkpoints=checkpoints)
        return bwd, x, t, [w1, w2, W]
    xv = np.random.default_rng(1).standard_normal((4, 3, 12, 12))
    tv = np.eye(5)[[0, 3, 1, 4]]
    runs = []
    for cp in (None, "sqrt"):
        bwd, x, t, ps = build(cp)
        loss = bwd.run({x: xv, t: tv})
        runs.append((np.asarray(loss).tobytes(), [p.grad.tobytes() for p in ps], bwd.peak_bytes))
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert runs[0][2] >= 4 * 3 * 14 * 14 * 4            # the first layer's padded input: (4, 3, 14, 14) float32


def test_bad_arguments_name_the_tensors():
    g = jg.Graph(np.float32)
    x = g.input((1, 4, 5, 5), name="img")
    with pytest.raises(jg.GraphError, match=r"conv2d: the kernel \(7, 7\).*larger than the padded input 'img'"):
        jg.conv2d(x, g.param(np.zeros((2, 4, 7, 7)), name="big"))
    with pytest.raises(jg.GraphError, match=r"weight 'w3' \(2, 3, 3, 3\) expects 3 input channels.*'img' has 4"):
        jg.conv2d(x, g.param(np.zeros((2, 3, 3, 3)), name="w3"))
    with pytest.raises(jg.GraphError, match=r"groups 3 must divide the input channels of 'img' \(4\)"):
        jg.conv2d(x, g.param(np.zeros((3, 1, 3, 3)), name="wg"), groups=3)
    with pytest.raises(jg.GraphError, match="stride must be an int >= 1"):
        jg.conv2d(x, g.param(np.zeros((2, 4, 3, 3)), name="w"), stride=0)
    with pytest.raises(jg.GraphError, match="must be 4-D"):
        jg.conv2d(g.input((4, 5, 5), name="flat"), g.param(np.zeros((2, 4, 3, 3)), name="w4"))
    with pytest.raises(jg.GraphError, match=r"max_pool2d: padding \(2, 2\) of 'img' must be at most half"):
        jg.max_pool2d(x, 3, padding=2)
    with pytest.raises(jg.GraphError, match="conv1d: padding must be an int >= 0"):
        jg.conv1d(g.input((1, 2, 8), name="seq"), g.param(np.zeros((2, 2, 3)), name="k"), padding=-1)


# ---- the lowerings, tile by tile ------------------------------------------------------------------------
def conv2d_grads_ref(x, w, g, stride=1, padding=0, dilation=1, groups=1):
    """(dx, dw) of sum(conv2d(x, w) * g), from the windows: dw = g . cols^T, dx = col2im(w^T g)."""
    cols = im2col_ref(x, w.shape[2:], stride, padding, dilation)
    N, K, OH, OW = cols.shape
    wg = w.reshape(groups, w.shape[0] // groups, -1)
    cg = cols.reshape(N, groups, K // groups, OH * OW)
    gg = g.reshape(N, groups, w.shape[0] // groups, OH * OW)
    dw = np.einsum("ngop,ngkp->gok", gg, cg).reshape(w.shape)
    dcols = np.einsum("gok,ngop->ngkp", wg, gg).reshape(N, K, OH, OW)
    return col2im_ref(dcols, x.shape[2:], w.shape[2:], stride, padding, dilation), dw


def conv_program(x, w, g, dtype, **kw):
    graph = jg.Graph(dtype)
    xt, wt = graph.param(x, name="x"), graph.param(w, name="w")
    y = jg.conv2d(xt, wt, **kw)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * graph.const(g))))
    return bwd, xt, wt, y


# (input, weight, kwargs): each of the direct product's tiles, the windows path, groups and depthwise
LOWERINGS = {
    "4 ch x 3 rows x 1 vector, padded": ((2, 3, 6, 40), (8, 3, 3, 3), dict(padding=1)),
    "4 ch x 2 rows x 1 vector": ((2, 4, 4, 20), (5, 4, 3, 1), dict()),
    "4 ch x 4 wide vectors": ((1, 3, 1, 70), (5, 3, 1, 3), dict()),
    "4 ch x 2 rows x 2 wide vectors": ((1, 2, 3, 34), (4, 2, 2, 3), dict(padding=(1, 0))),
    "4 ch x 4 rows x 1 wide vector": ((2, 3, 6, 18), (4, 3, 3, 3), dict(padding=1)),
    "depthwise: 1 ch x 4 wide vectors": ((1, 2, 2, 66), (2, 1, 1, 3), dict(groups=2)),
    "8 ch x 4 rows, two rows a wide vector": ((2, 3, 10, 10), (9, 3, 3, 3), dict(padding=1)),
    "4 ch x 2 rows x 2 vectors": ((2, 4, 5, 20), (5, 4, 3, 1), dict(padding=(1, 0))),
    "4 ch x 4 rows x 1 vector, dilated": ((1, 2, 12, 14), (6, 2, 2, 3), dict(padding=2, dilation=2)),
    "4 ch x 1 vector": ((2, 3, 3, 12), (4, 3, 2, 2), dict()),
    "1x1 on all positions as a row": ((2, 6, 3, 5), (7, 6, 1, 1), dict()),
    "windows: stride 2": ((2, 5, 9, 11), (6, 5, 3, 3), dict(stride=2, padding=1)),
    "phases: stride 2": ((2, 3, 16, 32), (5, 3, 3, 3), dict(stride=2, padding=1)),
    "phases: 1x1, stride 2": ((2, 6, 8, 32), (7, 6, 1, 1), dict(stride=2)),
    "phases: stride (2, 3), kernel 3x4": ((1, 3, 10, 52), (8, 3, 3, 4), dict(stride=(2, 3), padding=1)),
    "phases: groups of 2": ((2, 4, 16, 34), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
    "windows: narrow rows, scalars": ((1, 3, 4, 4), (4, 3, 3, 3), dict(padding=1, stride=(2, 1))),
    "windows: padding beyond the kernel's reach": ((2, 3, 5, 5), (4, 3, 1, 1), dict(padding=1)),
    "groups of 2": ((2, 4, 6, 34), (6, 2, 3, 3), dict(padding=1, groups=2)),
    "depthwise: 1 ch x 4 vectors": ((1, 3, 5, 36), (3, 1, 3, 3), dict(padding=1, groups=3)),
    "depthwise: 1 ch x 1 vector": ((1, 2, 4, 9), (4, 1, 2, 2), dict(groups=2)),
    "depthwise: scalars": ((2, 2, 3, 3), (2, 1, 2, 2), dict(groups=2, padding=1)),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", list(LOWERINGS))
def test_each_lowering_matches_numpy_forward_and_gradients(case, dtype):
    xs, ws, kw = LOWERINGS[case]
    rng = np.random.default_rng(len(case))
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    want = conv2d_ref(x, w, **kw)
    g = rng.standard_normal(want.shape)
    bwd, xt, wt, y = conv_program(x, w, g, dtype, **kw)
    loss = bwd.run()
    dx, dw = conv2d_grads_ref(x, w, g, **kw)
    tol = dict(rtol=1e-11, atol=1e-11) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(loss, np.sum(want * g), **tol)
    np.testing.assert_allclose(xt.grad, dx, **tol)
    np.testing.assert_allclose(wt.grad, dw, **tol)
    fwd = jg.build_forward(y)
    np.testing.assert_allclose(fwd.run(), want, **tol)


def test_the_lowerings_reach_every_tile_shape():
    """The shapes above pick every tile of the direct product (float32 lanes): every 256-bit
    and scalar tile without AVX-512, and every 512-bit tile with it."""
    picked = {False: set(), True: set()}
    for xs, ws, kw in LOWERINGS.values():
        graph = jg.Graph(np.float32)
        y = jg.conv2d(graph.input(xs), graph.input(ws), **kw)
        (read,) = [s for s in y.sources[2:]]
        Og = ws[0] // kw.get("groups", 1)
        for wide in (False, True):
            if ws[2:] == (1, 1) and read.shape[2:] == y.shape[2:]:
                picked[wide].add(pick_tile(Og, 1, y.shape[2] * y.shape[3], lanes(graph), wide))
            else:
                picked[wide].add(pick_tile(Og, y.shape[2], y.shape[3], lanes(graph), wide))
    wide_tiles = {f for f, shape in enumerate(TILE_SHAPES) if shape[3] == WIDE_BYTES}
    assert picked[False] == set(range(len(TILE_SHAPES))) - wide_tiles
    assert wide_tiles <= picked[True]


@njit(cache=True)
def _tile_at(f, x, w, o, xat, oat, wat, n_i, n_j, n_c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow):
    """One tile of kind f whose input starts ``xat``, output ``oat`` and weights ``wat`` elements in."""
    _fma(f, data_pointer(x[xat:]), data_pointer(w[wat:]), data_pointer(o[oat:]), n_i, n_j, n_c, xi, xj, xc, wi, wj,
         wc, wm, xr, om, orow, 0)


def _covers(f, itemsize):
    """(output rows, columns) of a tile of kind f."""
    MR, down, V, vbytes, per = TILE_SHAPES[f]
    return down * per, V * vbytes // itemsize // per


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("narrow,wide", [(3, 8), (3, 9), (3, 10), (5, 11), (3, 12)])
def test_a_512_bit_tile_gives_the_bits_of_the_256_bit_tiles_it_replaces(dtype, narrow, wide):
    """Each output element is one fixed sequence of fused multiply-adds whatever the
    vector width: a 512-bit tile (F12: 8 channels, two rows a vector) equals the 256-bit
    tiles that cover the same outputs and channels, bit for bit, and both equal the sum in
    numpy up to rounding."""
    rng = np.random.default_rng(5)
    size = np.dtype(dtype).itemsize
    (rw, cw), (rn, cn) = _covers(wide, size), _covers(narrow, size)
    MR, MRn = TILE_SHAPES[wide][0], TILE_SHAPES[narrow][0]
    assert rw % rn == 0 and cw % cn == 0 and MR % MRn == 0
    n_i, n_j, n_c = 3, 2, 5
    xr, orow = cw + 5, cw + 3                                   # row strides of the input and the output
    xi, xj, xc = xr, 1, (rw + n_i) * xr + 2                     # taps down, across; channels
    x = rng.standard_normal(n_c * xc).astype(dtype)
    w = rng.standard_normal(MR * n_i * n_j * n_c).astype(dtype)
    wi, wj, wc, wm = n_j, 1, n_i * n_j, n_i * n_j * n_c
    om = rw * orow + 1
    args = (n_i, n_j, n_c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    one, many = np.zeros(MR * om, dtype), np.zeros(MR * om, dtype)
    _tile_at(wide, x, w, one, 0, 0, 0, *args)
    for m0 in range(0, MR, MRn):
        for r0 in range(0, rw, rn):
            for c0 in range(0, cw, cn):
                _tile_at(narrow, x, w, many, r0 * xr + c0, m0 * om + r0 * orow + c0, m0 * wm, *args)
    assert one.tobytes() == many.tobytes()
    want = np.zeros((MR, om))
    for m in range(MR):
        for r in range(rw):
            for i in range(n_i):
                for j in range(n_j):
                    for c in range(n_c):
                        s0 = i * xi + j * xj + c * xc + r * xr
                        want[m, r * orow:r * orow + cw] += (float(w[m * wm + i * wi + j * wj + c * wc])
                                                            * x[s0:s0 + cw].astype(np.float64))
    np.testing.assert_allclose(one.reshape(MR, om), want, rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-4)


@pytest.mark.parametrize("shape,kw", [((2, 2, 5, 6), dict(padding=1)), ((2, 2, 5, 6), dict(stride=2, padding=1)),
                                      ((2, 2, 6, 10), dict(stride=2, padding=1))])
def test_second_derivatives_through_conv2d(shape, kw):
    """The gradients are conv2d / conv2d_weight / im2col / col2im nodes with rules of their
    own: d/d(x, w) of |grad_x|^2 + |grad_w|^2 against finite differences (direct, windows
    and phases)."""
    rng = np.random.default_rng(5)       # values of O(1/2): a degree-4 polynomial's differences stay accurate
    x, w = rng.standard_normal(shape) / 2, rng.standard_normal((3, 2, 3, 2)) / 2

    def fn(a, b):
        gx, gw = jg.grad(jg.sum(jg.sqr(jg.conv2d(a, b, **kw))), [a, b])
        return jg.sum(jg.sqr(gx)) + jg.sum(jg.sqr(gw))
    res = jg.check_grads(fn, [x, w])
    assert res.ok and res.n_checked == x.size + w.size, res


@pytest.mark.parametrize("flip", [False, True])
def test_weight_gradient_op_matches_numpy(flip):
    rng = np.random.default_rng(3)
    xp = rng.standard_normal((2, 4, 7, 12))
    g = rng.standard_normal((2, 6, 5, 10) if not flip else (2, 6, 5, 10))
    graph = jg.Graph(np.float64)
    gt, xt = graph.input(g.shape), graph.input(xp.shape)
    out = conv2d_weight(gt, xt, (3, 3), 1, 2, flip)
    got = jg.build_forward(out).run({gt: g, xt: xp})
    np.testing.assert_allclose(got, conv2d_weight_ref(g, xp, (3, 3), 1, 2, flip), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flip", [False, True])
def test_every_weight_gradient_tile_matches_numpy(dtype, flip):
    """Planes of every width class: half a 512-bit vector with an even and an odd number of rows
    (two rows a vector, or 256-bit lanes), one and two vectors, a tail, scalars; 6 gradient
    rows (a partial block of 4) and 5 x 9 taps (a partial step)."""
    half = 32 // np.dtype(dtype).itemsize
    rng = np.random.default_rng(4)
    shapes = [(6, half), (7, half), (4, 2 * half), (3, 4 * half), (5, 2 * half + 3), (4, 3)]
    for OH, OW in shapes:
        xp = rng.standard_normal((3, 5, OH + 2, OW + 2))
        g = rng.standard_normal((3, 6, OH, OW))
        graph = jg.Graph(dtype)
        gt, xt = graph.input(g.shape), graph.input(xp.shape)
        got = jg.build_forward(conv2d_weight(gt, xt, (3, 3), flip=flip)).run({gt: g, xt: xp})
        want = conv2d_weight_ref(g.astype(dtype).astype(np.float64), xp.astype(dtype).astype(np.float64), (3, 3),
                                 1, 1, flip)
        tol = 1e-12 if dtype == np.float64 else 2e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=f"{OH}x{OW}")
    size = np.dtype(dtype).itemsize       # which tiles those planes take with 512-bit tiles (run above on such a host)
    assert [weight_tile(h, w, size, True) for h, w in shapes] == [3, 0, 2, 2, 2, 1]
    assert [weight_tile(h, w, size, False) for h, w in shapes] == [0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_channel_vector_weight_gradient_matches_numpy(dtype):
    """g laid out channels last (channel_blocks): channel blocks, tap ranges that end in a
    partial block (5 x 9 taps), position chunks that start mid-row and mid-image, a 1x1
    kernel and dilation (572 positions: chunks of 256 or 128 start mid-row and mid-image)."""
    rng = np.random.default_rng(6)
    for N, Ci, Co, OH, OW, k, d in [(5, 5, 32, 6, 7, 3, 1), (2, 3, 64, 5, 9, 3, 1), (3, 4, 32, 4, 4, 1, 1),
                                    (2, 2, 32, 5, 6, 3, 2), (4, 3, 32, 11, 13, 3, 1)]:
        xp = rng.standard_normal((N, Ci, OH + d * (k - 1), OW + d * (k - 1)))
        g = rng.standard_normal((N, Co, OH, OW))
        graph = jg.Graph(dtype)
        gt, xt = graph.input((N, OH, OW, Co)), graph.input(xp.shape)
        got = jg.build_forward(conv2d_weight(gt, xt, (k, k), d, channels_last=True)).run(
            {gt: g.transpose(0, 2, 3, 1), xt: xp})
        want = conv2d_weight_ref(g.astype(dtype).astype(np.float64), xp.astype(dtype).astype(np.float64), (k, k),
                                 d, 1, False)
        tol = 1e-12 if dtype == np.float64 else 2e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=f"{N, Ci, Co, OH, OW}")
    graph = jg.Graph(dtype)
    with pytest.raises(jg.GraphError, match="channels last"):
        conv2d_weight(graph.input((2, 4, 4, 24)), graph.input((2, 3, 6, 6)), (3, 3), channels_last=True)


def _wide_channels_loss(dtype, checkpoints=None):
    """Convolutions of 32 channels on 8 x 8 planes, whose weight gradients take the
    channel-vector kernel."""
    rng = np.random.default_rng(7)
    graph = jg.Graph(dtype)
    x = graph.input((3, 4, 8, 8), name="x")
    ws = [graph.param(rng.standard_normal(s) * 0.2, name=f"w{i}") for i, s in
          enumerate([(32, 4, 3, 3), (32, 32, 3, 3), (32, 32, 1, 1)])]
    h = jg.relu(jg.conv2d(x, ws[0], padding=1))
    h = jg.relu(jg.conv2d(jg.relu(jg.conv2d(h, ws[1], padding=1)), ws[2]) + h)
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.sqr(h)) * 1e-3), checkpoints=checkpoints)
    return bwd, {x: rng.standard_normal((3, 4, 8, 8))}, ws


def test_channel_vector_weight_gradients_are_exact_and_bit_identical():
    """Float64 gradients against finite differences; float32 bits equal at 1 and 2 threads and
    with sqrt checkpointing; the program uses the channel-vector kernel (on every host)."""
    bwd, feeds, ws = _wide_channels_loss(np.float32)
    layouts = [int(bwd.graph.nodes.ip[n, conv_module.ConvWeightIP.layout]) for n in bwd.order
               if bwd.graph.nodes.op[n] == jg.registry.CONV2D_WEIGHT]
    assert len(layouts) == 3 and layouts.count(conv_module.CHANNELS_LAST) == 3
    got = at_each_thread_count(lambda: [bwd.run(feeds)] + [p.grad for p in ws])
    assert_same_bits(got[1], got[2], "channel-vector weight gradients")
    cp, cfeeds, cws = _wide_channels_loss(np.float32, "sqrt")
    again = [np.asarray(cp.run(cfeeds))] + [p.grad for p in cws]
    assert_same_bits(got[1], again, "channel-vector weight gradients, sqrt checkpointing")

    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 6, 6))
    w = rng.standard_normal((32, 3, 3, 3)) * 0.3
    r = rng.standard_normal((2, 32, 6, 6))
    graph = jg.Graph(np.float64)
    xt, wt = graph.param(x, "x"), graph.param(w, "w")
    jg.build_backward(jg.build_forward(jg.sum(jg.conv2d(xt, wt, padding=1) * r))).run()
    want = conv2d_weight_ref(r, np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), 1, 1, False)
    np.testing.assert_allclose(wt.grad, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())

    def fn(a, b):                  # linear in each: finite differences without kinks or curvature
        return jg.sum(jg.conv2d(a, b, padding=1) * r)
    res = jg.check_grads(fn, [x, w])
    assert res.ok and res.n_checked == x.size + w.size, res

    def second(a, b):              # through the channel-vector node's own rule
        gx, gw = jg.grad(jg.sum(jg.conv2d(a, b, padding=1) * r[:1, :, :5, :5]), [a, b])
        return jg.sum(jg.sqr(gw))
    res = jg.check_grads(second, [x[:1, :2, :5, :5], w[:, :2]])
    assert res.ok, res


def _resnet_block_loss(dtype, checkpoints=None):
    """Two residual blocks (the second strided, with a 1x1 projection), max and avg pooling."""
    rng = np.random.default_rng(0)
    graph = jg.Graph(dtype)
    x = graph.input((4, 3, 18, 18), name="x")
    t = graph.input((4,), dtype=np.int64, name="t")
    ws = [graph.param(rng.standard_normal(s) * 0.3, name=f"w{i}") for i, s in enumerate(
        [(8, 3, 3, 3), (8, 8, 3, 3), (8, 8, 3, 3), (16, 8, 3, 3), (16, 16, 3, 3), (16, 8, 1, 1)])]
    fc = graph.param(rng.standard_normal((16, 5)) * 0.3, name="fc")
    h = jg.relu(jg.conv2d(x, ws[0], padding=1))
    h = jg.relu(jg.conv2d(jg.relu(jg.conv2d(h, ws[1], padding=1)), ws[2], padding=1) + h)
    h = jg.max_pool2d(h, 2)
    a = jg.relu(jg.conv2d(h, ws[3], stride=2, padding=1))
    h = jg.relu(jg.conv2d(a, ws[4], padding=1) + jg.conv2d(h, ws[5], stride=2))
    h = jg.avg_pool2d(h, 3, stride=1, padding=1)
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(jg.mean(h, axis=(2, 3)) @ fc, t)),
                            checkpoints=checkpoints)
    feeds = {x: np.random.default_rng(1).standard_normal((4, 3, 18, 18)), t: np.array([0, 3, 1, 4])}
    return bwd, feeds, ws + [fc]


def test_residual_blocks_are_bit_identical_at_1_and_2_threads_and_checkpointed():
    bwd, feeds, ps = _resnet_block_loss(np.float32)
    got = at_each_thread_count(lambda: [bwd.run(feeds)] + [p.grad for p in ps])
    assert_same_bits(got[1], got[2], "residual blocks")
    cp, cfeeds, cps = _resnet_block_loss(np.float32, "sqrt")
    assert cp.stats()["n_recomputed"] > 0
    again = [np.asarray(cp.run(cfeeds))] + [p.grad for p in cps]
    assert_same_bits(got[1], again, "residual blocks, sqrt checkpointing")
    assert cp.peak_bytes < bwd.peak_bytes


@pytest.mark.parametrize("stride", [2, 3])
def test_phases_and_their_adjoint_are_im2col_and_col2im_on_every_size(stride):
    """The phases kernel (a kernel equal to its stride) against the naive im2col / col2im on
    even and odd sizes and paddings up to the stride: stride 2's branch-free middle columns
    and its edges, rows the phases do not reach, every element written (the outputs start
    as NaN)."""
    for H, W in ((5, 6), (7, 9), (8, 8), (9, 33), (16, 17), (32, 32)):
        for p in range(stride + 1):
            OH, OW = out_size(H, stride, stride, p, 1), out_size(W, stride, stride, p, 1)
            x = RNG.standard_normal((2, 3, H, W)).astype(np.float32)
            want = im2col_ref(x, stride, stride, p)
            cols = np.full(want.size, np.nan, np.float32)
            phases_kernel(cols, x.ravel(), H, W, OH, OW, stride, stride, p, p, 0, 6, False)
            assert np.array_equal(cols, want.ravel()), (H, W, p)
            back = np.full(x.size, np.nan, np.float32)
            phases_kernel(cols, back, H, W, OH, OW, stride, stride, p, p, 0, 6, True)
            assert np.array_equal(back, col2im_ref(want, (H, W), stride, stride, p).ravel()), (H, W, p)


def test_the_memory_plan_counts_the_windows_the_phases_and_the_padding():
    """A strided convolution's phases (N, C*s*s, H/s, W/s) or windows (N, C*kh*kw, OH, OW) are
    arena tensors of the plan, live from their conv2d to the weight gradient that reads them;
    the padded input a stride-1 product's weight gradient reads (the product itself pads as it
    reads) is one too, made in the backward pass."""
    graph = jg.Graph(np.float32)
    x = graph.input((4, 6, 16, 16), name="x")
    w1 = graph.param(np.ones((8, 6, 3, 3)), name="w1")
    w2 = graph.param(np.ones((8, 8, 3, 3)), name="w2")
    w3 = graph.param(np.ones((4, 8, 3, 3)), name="w3")
    h = jg.conv2d(jg.relu(jg.conv2d(x, w1, stride=2, padding=1)), w2, padding=1)
    y = jg.conv2d(jg.relu(h), w3, stride=2, padding=1)            # 4x4 outputs: narrower than a vector
    bwd = jg.build_backward(jg.build_forward(jg.sum(y)))
    rows = {r["op"] + str(r["shape"]): r for r in bwd.nodes()}
    phases, padded, windows = rows["im2col(4, 24, 9, 9)"], rows["im2col(4, 8, 10, 10)"], rows["im2col(4, 72, 4, 4)"]
    for r, size in ((phases, 24 * 81), (padded, 8 * 100), (windows, 72 * 16)):
        assert r["loc"] == "arena" and r["bytes"] == 4 * size * 4
    assert bwd.peak_bytes >= bwd.memory_timeline().max() >= max(r["bytes"] for r in (phases, padded, windows))


def _padded_convs(dtype, fold, monkeypatch, checkpoints=None):
    """A stack of stride-1 padded convolutions (3x3, 1-by-0 padding, dilated 5x5, grouped),
    built with the padding folded into the products' reads or as im2col copies."""
    monkeypatch.setattr(conv_module, "FOLD_PADDING", fold)
    rng = np.random.default_rng(5)
    g = jg.Graph(dtype)
    x = g.input((3, 8, 12, 11), name="x")
    ws = [g.param(rng.standard_normal(s) * 0.2, name=f"w{i}")
          for i, s in enumerate(((8, 4, 3, 3), (6, 8, 3, 3), (6, 6, 5, 5)))]
    h = jg.relu(jg.conv2d(x, ws[0], padding=1, groups=2))
    h = jg.tanh(jg.conv2d(h, ws[1], padding=(1, 0)))
    h = jg.conv2d(h, ws[2], padding=2, dilation=(2, 1))
    bwd = jg.build_backward(jg.build_forward(jg.sum(h * h)), checkpoints=checkpoints)
    feeds = {x: rng.standard_normal((3, 8, 12, 11)).astype(dtype)}
    return bwd, feeds, ws


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_folded_padding_gives_the_bits_of_the_padded_copy(dtype, monkeypatch):
    """A stride-1 product pads its input as it reads it (FOLD_PADDING): the same values in the
    same order as from an im2col copy, so the loss and every gradient have the copy's bits, at
    1 and 2 threads and checkpointed; the copies leave the forward pass and the plan shrinks."""
    copied, cfeeds, cws = _padded_convs(dtype, False, monkeypatch)
    want = [np.asarray(copied.run(cfeeds))] + [p.grad.copy() for p in cws]
    folded, feeds, ws = _padded_convs(dtype, True, monkeypatch)
    got = at_each_thread_count(lambda: [folded.run(feeds)] + [p.grad for p in ws])
    assert_same_bits(got[1], want, "folded padding")
    assert_same_bits(got[2], want, "folded padding, 2 threads")
    sqrt, sfeeds, sws = _padded_convs(dtype, True, monkeypatch, "sqrt")
    assert_same_bits([np.asarray(sqrt.run(sfeeds))] + [p.grad for p in sws], want, "folded padding, sqrt")
    im2col = jg.registry.BY_NAME["im2col"].code
    forward = folded.forward.order
    assert not np.any(folded.graph.nodes.op[forward] == im2col)
    assert np.count_nonzero(copied.graph.nodes.op[copied.forward.order] == im2col) == 3
    assert folded.peak_bytes < copied.peak_bytes


def test_folded_padding_matches_direct_loops_and_finite_differences():
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3))
    g = jg.Graph(np.float64)
    xi = g.input(x.shape, name="x")
    wp = g.param(w, name="w")
    np.testing.assert_allclose(jg.build_forward(jg.conv2d(xi, wp, padding=1)).run({xi: x}),
                               conv2d_ref(x, w, padding=1), rtol=1e-12, atol=1e-12)
    result = jg.check_grads(lambda a, b: jg.sum(jg.tanh(jg.conv2d(a, b, padding=(1, 2), dilation=(1, 2)))),
                            [x, w])
    assert result.ok, result


# (input, weight, kwargs, whether the input gradient is made as x's own phases): the stride divides x's
# size and the padded input's phases hold all of x -- else the 1x1 product onto the windows and col2im
OWN_PHASES = {
    "3x3, stride 2, padding 1": ((2, 3, 16, 32), (5, 3, 3, 3), dict(stride=2, padding=1), True),
    "4x4, stride 2, padding 1": ((2, 2, 16, 32), (3, 2, 4, 4), dict(stride=2, padding=1), True),
    "5x5, stride 2, padding 2: phases start in 2 rows": ((1, 2, 16, 32), (3, 2, 5, 5), dict(stride=2, padding=2), True),
    "padding (1, 0)": ((2, 3, 16, 32), (4, 3, 3, 3), dict(stride=2, padding=(1, 0)), True),
    "stride (2, 3), no padding": ((1, 3, 12, 54), (8, 3, 3, 4), dict(stride=(2, 3)), True),
    "groups of 2": ((2, 4, 16, 34), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2), True),
    "odd sizes": ((2, 3, 15, 33), (5, 3, 3, 3), dict(stride=2, padding=1), False),
    "stride 3, padding 1: the last row in no phase": ((1, 2, 12, 36), (3, 2, 3, 3), dict(stride=3, padding=1), False),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", list(OWN_PHASES))
def test_strided_input_gradients_as_x_own_phases(case, dtype):
    """The input gradient of a strided convolution on phases: x's own phases made by one FLIP
    product (each from row and column (a + p) // s of the padded input's phase (a + p) % s) and
    put in place by col2im, where they cover x -- against numpy, float64 and float32."""
    xs, ws, kw, own = OWN_PHASES[case]
    rng = np.random.default_rng(len(case))
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    want = conv2d_ref(x, w, **kw)
    g = rng.standard_normal(want.shape)
    bwd, xt, wt, _ = conv_program(x, w, g, dtype, **kw)
    nodes = bwd.graph.nodes
    ids = bwd.run_order
    stride = pairs(kw["stride"])
    # col2im of x's phases: kernel = stride, no padding (the windows' col2im has the kernel's size)
    by_phases = [n for n in ids if nodes.op[n] == jg.registry.COL2IM and tuple(nodes.ip[n, :2]) == stride
                 and tuple(nodes.ip[n, 4:6]) == (0, 0) and tuple(nodes.shape[n]) == xs]
    assert bool(by_phases) == own
    bwd.run()
    dx, dw = conv2d_grads_ref(x, w, g, **kw)
    tol = dict(rtol=1e-11, atol=1e-11) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(xt.grad, dx, **tol)
    np.testing.assert_allclose(wt.grad, dw, **tol)


def test_x_own_phases_are_bit_identical_at_1_and_2_threads_and_checkpointed():
    """The FLIP product that makes x's own phases is big enough here to be split over threads
    (4 x 32 x 16 x 16 phase planes); its gradients are the same bits at 1 and 2 threads and with
    sqrt checkpointing."""
    def loss(checkpoints=None):
        rng = np.random.default_rng(3)
        graph = jg.Graph(np.float32)
        x = graph.param(rng.standard_normal((4, 8, 32, 32)), name="x")
        w1 = graph.param(rng.standard_normal((16, 8, 3, 3)) * 0.2, name="w1")
        w2 = graph.param(rng.standard_normal((16, 16, 3, 3)) * 0.2, name="w2")
        h = jg.relu(jg.conv2d(jg.relu(x), w1, stride=2, padding=1))
        h = jg.relu(jg.conv2d(h, w2, padding=1) + h)
        bwd = jg.build_backward(jg.build_forward(jg.mean(jg.sqr(h))), checkpoints=checkpoints)
        return bwd, [x, w1, w2]
    bwd, ps = loss()
    nodes = bwd.graph.nodes
    assert any(nodes.op[n] == jg.registry.COL2IM and tuple(nodes.ip[n, :6]) == (2, 2, 2, 2, 0, 0)
               for n in bwd.run_order)                          # x's own phases put in place
    got = at_each_thread_count(lambda: [bwd.run()] + [p.grad for p in ps])
    assert_same_bits(got[1], got[2], "x's own phases")
    cp, cps = loss("sqrt")
    again = [np.asarray(cp.run())] + [p.grad for p in cps]
    assert_same_bits(got[1], again, "x's own phases, sqrt checkpointing")


def test_second_derivatives_through_x_own_phases():
    """d/d(x, w) of |grad_x|^2 where grad_x is made as x's own phases (4x4 kernel, padding 1):
    the FLIP product's rule reads its gradient as the padded input's phases."""
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((1, 2, 6, 8)) / 2, rng.standard_normal((2, 2, 4, 4)) / 2

    def fn(a, b):
        gx = jg.grad(jg.sum(jg.sqr(jg.conv2d(a, b, stride=2, padding=1))), [a])[0]
        return jg.sum(jg.sqr(gx))
    res = jg.check_grads(fn, [x, w])
    assert res.ok and res.n_checked == x.size + w.size, res


@pytest.mark.parametrize("size, stride, padding", [((32, 32), 2, 1), ((7, 9), 2, 0), ((8, 7), 3, 1), ((9, 9), 3, 2),
                                                   ((5, 6), 2, 1), ((6, 11), (2, 3), (1, 2)), ((4, 4), 2, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_phase_split_and_its_adjoint_equal_the_definition(size, stride, padding, dtype):
    """im2col whose kernel is its stride (a strided convolution's phases: windows.phases_kernel,
    one padded input row at a time) and col2im back: exactly the windows of the definition and
    their sum into the input (each element gets at most one value: 0 + it), on every thread count."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3) + size).astype(dtype)
    g = jg.Graph(dtype)
    xt = g.input(x.shape, name="x")
    k = stride
    cols = im2col(xt, k, stride, padding)
    want = im2col_ref(x.astype(np.float64), k, stride, padding).astype(dtype)
    r = rng.standard_normal(cols.shape).astype(dtype)
    back = col2im(g.const(r), size, k, stride, padding)
    prog = jg.build_forward([cols, back])
    for got_cols, got_back in at_each_thread_count(lambda: prog.run({xt: x})).values():
        assert np.array_equal(got_cols, want)
        assert np.array_equal(got_back, col2im_ref(r, size, k, stride, padding).astype(dtype))


def _first_max_positions(x, k, s, p):
    """Each window's first maximal element (row-major; a NaN wins), as the plane position."""
    N, C, H, W = x.shape
    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    at = np.zeros((N, C, OH, OW), np.int64)
    for n, c, oh, ow in np.ndindex(N, C, OH, OW):
        best, pos = None, -1
        for i in range(k):
            for j in range(k):
                h, w = oh * s - p + i, ow * s - p + j
                if 0 <= h < H and 0 <= w < W:
                    v = x[n, c, h, w]
                    if pos < 0 or v > best or (np.isnan(v) and not np.isnan(best)):
                        best, pos = v, h * W + w
        at[n, c, oh, ow] = pos
    return at


@pytest.mark.parametrize("k, s, p", [(2, 2, 0), (3, 2, 1), (2, 1, 1), (3, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_picks_the_first_maximum_with_ties_infinities_and_nans(k, s, p, dtype):
    """max_pool2d and its gradient (pool.py: a row of windows searched tap by tap) pick each
    window's first maximal element, a NaN first, and add the gradient there in window order --
    as the window-by-window definition does, bit for bit."""
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 3, (2, 3, 9, 8)).astype(dtype)          # many ties
    x[0, 0, 1:3, 2:5] = -np.inf
    x[1, 2, 4, 4] = np.nan
    x[1, 1, :, :] = -np.inf                                      # a plane of -inf: the first of each window
    g = jg.Graph(dtype)
    xt = g.param(x, name="x")
    y = jg.max_pool2d(xt, k, s, p)
    r = rng.standard_normal(y.shape).astype(dtype)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * g.const(r))))
    bwd.run()
    at = _first_max_positions(x, k, s, p)
    planes = x.reshape(6, -1)
    want = np.take_along_axis(planes, at.reshape(6, -1), 1).reshape(y.shape)
    assert np.array_equal(jg.build_forward(y).run(), want, equal_nan=True)
    grad = np.zeros_like(planes)
    for q, (pos, v) in enumerate(zip(at.reshape(6, -1), r.reshape(6, -1))):
        for a, b in zip(pos, v):                                  # in window order, in the dtype
            grad[q, a] += b
    assert np.array_equal(xt.grad, grad.reshape(x.shape))
