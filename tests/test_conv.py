"""conv2d, conv1d, max_pool2d and avg_pool2d against direct numpy loops, float64 finite
differences, bit-identical checkpointing, and their argument errors."""
import numpy as np
import pytest

import jitgraph as jg

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
    same loss and gradients bit for bit, and the planned peak counts the im2col windows."""
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
    assert runs[0][2] >= 4 * 144 * 27 * 4               # the first layer's windows: (4, 144, 27) float32


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
