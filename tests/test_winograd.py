"""Winograd F(2x2, 3x3) convolutions (ops/winograd.py): exact in float64, within float32 rounding of
the direct product, gradients (first and second) against finite differences, the same bits at 1
and 2 threads, checkpointed and fused, and chosen where conv.py says."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.ops import conv as conv_module
from jitgraph.ops.conv import WINOGRAD, ConvIP
from jitgraph.registry import CONV2D, WINOGRAD_WEIGHTS

from .naive import conv2d_ref
from .test_threads import assert_same_bits, at_each_thread_count


@pytest.fixture
def everywhere(monkeypatch):
    """Winograd for every 3x3 stride-1 product, whatever its channels (the kernel takes any)."""
    monkeypatch.setattr(conv_module, "WINOGRAD_MIN_CHANNELS", 1)


def winograd_convs(program):
    """(FWD, FLIP) counts of the Winograd products in the program's graph (one program a graph
    here; a fused program runs some of them inside epilogues), and of its U nodes."""
    graph = program.graph
    nodes = graph.nodes
    every = range(len(graph))
    convs = [n for n in every if nodes.op[n] == CONV2D and nodes.ip[n, ConvIP.source] == WINOGRAD]
    modes = [int(nodes.ip[n, ConvIP.mode]) for n in convs]
    return modes.count(conv_module.FWD), modes.count(conv_module.FLIP), \
        sum(1 for n in every if nodes.op[n] == WINOGRAD_WEIGHTS)


def conv_loss(x0, w0, t0, padding, dtype):
    g = jg.Graph(dtype)
    x, w = g.param(x0, name="x"), g.param(w0, name="w")
    y = jg.conv2d(x, w, padding=padding)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * g.const(t0))))
    return bwd, x, w


def reference_grads(x0, w0, t0, p):
    """loss = sum(conv(x, w) * t): its value and gradients from the reference loops."""
    y = conv2d_ref(x0, w0, padding=p)
    xp = np.pad(t0, ((0, 0), (0, 0), (2 - p, 2 - p), (2 - p, 2 - p)))
    gx = conv2d_ref(xp, np.flip(w0, (2, 3)).transpose(1, 0, 2, 3))
    xpad = np.pad(x0, ((0, 0), (0, 0), (p, p), (p, p)))
    gw = np.einsum("nohw,ncijhw->ocij", t0, np.lib.stride_tricks.sliding_window_view(xpad, t0.shape[2:], axis=(2, 3)))
    return float((y * t0).sum()), gx, gw


SHAPES = [(2, 3, 5, 6, 7, 1), (3, 4, 13, 5, 9, 0), (2, 17, 12, 7, 6, 2), (2, 5, 3, 4, 4, 1), (1, 2, 20, 9, 8, 1),
          (2, 6, 7, 33, 17, 1), (1, 16, 16, 8, 8, 1), (2, 5, 6, 34, 33, 1), (1, 4, 5, 32, 32, 0)]


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_gradients_equal_the_reference_in_float64(shape, everywhere):
    """Every tile path: output channels below 4, 4 to 11 and 12 or more; odd sizes (a last tile
    half outside the output); paddings 0, 1, 2; planes of one image and blocks of several; rows
    of tiles compact (narrower than COMPACT_BELOW) and with a column that is not a tile."""
    N, Ci, Co, H, W, p = shape
    rng = np.random.default_rng(sum(shape))
    x0, w0 = rng.standard_normal((N, Ci, H, W)), rng.standard_normal((Co, Ci, 3, 3)) / 3
    t0 = rng.standard_normal((N, Co, H + 2 * p - 2, W + 2 * p - 2))
    bwd, x, w = conv_loss(x0, w0, t0, p, np.float64)
    assert winograd_convs(bwd) == (1, 1, 2)           # the product and its input gradient, each with its U
    loss = bwd.run()
    want, gx, gw = reference_grads(x0, w0, t0, p)
    assert abs(loss - want) <= 1e-12 * np.abs(conv2d_ref(x0, w0, padding=p) * t0).sum()
    np.testing.assert_allclose(x.grad, gx, rtol=1e-11, atol=1e-12 * np.abs(gx).max())
    np.testing.assert_allclose(w.grad, gw, rtol=1e-11, atol=1e-12 * np.abs(gw).max())


def test_float32_is_within_rounding_of_the_direct_product(monkeypatch):
    """The default choice (12 channels and more) in float32: within a few units in the last
    place of the float64 reference, as the direct product is."""
    rng = np.random.default_rng(2)
    x0, w0 = rng.standard_normal((4, 16, 16, 16)), rng.standard_normal((24, 16, 3, 3)) / 12
    t0 = rng.standard_normal((4, 24, 16, 16))
    errors = {}
    for least in (12, 0):                            # Winograd, then the direct product
        monkeypatch.setattr(conv_module, "WINOGRAD_MIN_CHANNELS", least)
        bwd, x, w = conv_loss(x0.astype(np.float32), w0.astype(np.float32), t0.astype(np.float32), 1, np.float32)
        assert winograd_convs(bwd) == ((1, 1, 2) if least else (0, 0, 0))
        bwd.run()
        _, gx, gw = reference_grads(x0.astype(np.float32).astype(np.float64), w0.astype(np.float32).astype(np.float64),
                                     t0.astype(np.float32).astype(np.float64), 1)
        errors[least] = (np.abs(x.grad - gx).max() / np.abs(gx).max(), np.abs(w.grad - gw).max() / np.abs(gw).max())
    assert max(errors[12]) < 2e-6 and max(errors[0]) < 2e-6, errors
    assert errors[12][0] < 8 * max(errors[0][0], 1e-7), errors      # input gradients through two transforms


@pytest.mark.parametrize("padding", [0, 1, 2])
def test_gradients_match_finite_differences(padding, everywhere):
    rng = np.random.default_rng(padding)
    x, w = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((4, 3, 3, 3))
    res = jg.check_grads(lambda a, b: jg.conv2d(a, b, padding=padding), [x, w])
    assert res.ok and res.n_checked == x.size + w.size, res


def test_second_derivatives_through_winograd_products(everywhere):
    """d/d(x, w) of |grad_x|^2 + |grad_w|^2: the FLIP product's own input gradient is a FWD
    Winograd product with U of the weights as stored."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 2, 5, 6)) / 2, rng.standard_normal((3, 2, 3, 3)) / 2

    def fn(a, b):
        gx, gw = jg.grad(jg.sum(jg.sqr(jg.conv2d(a, b, padding=1))), [a, b])
        return jg.sum(jg.sqr(gx)) + jg.sum(jg.sqr(gw))
    res = jg.check_grads(fn, [x, w])
    assert res.ok and res.n_checked == x.size + w.size, res


def residual_net(checkpoints=None, fuse="auto"):
    """Two 16-channel 3x3 layers and a residual add over 4 x 16 x 32 x 32 (big enough to be
    split over threads), their products Winograd's by the default choice."""
    rng = np.random.default_rng(3)
    g = jg.Graph(np.float32)
    x = g.param(rng.standard_normal((4, 16, 32, 32)), name="x")
    w1 = g.param(rng.standard_normal((16, 16, 3, 3)) * 0.1, name="w1")
    w2 = g.param(rng.standard_normal((16, 16, 3, 3)) * 0.1, name="w2")
    h = jg.relu(jg.conv2d(jg.relu(x), w1, padding=1))
    h = jg.relu(jg.conv2d(h, w2, padding=1) + x)
    bwd = jg.build_backward(jg.build_forward(jg.mean(jg.sqr(h))), checkpoints=checkpoints, fuse=fuse)
    return bwd, [x, w1, w2]


def test_bits_are_the_same_at_1_and_2_threads_checkpointed_and_unfused():
    bwd, ps = residual_net()
    assert winograd_convs(bwd) == (2, 2, 4)
    assert any("conv2d" in " ".join(r["op"].split()) and r["op"].startswith("epilogue")
               for r in bwd.profile(repeats=1))                 # a Winograd product as an epilogue's producer
    got = at_each_thread_count(lambda: [bwd.run()] + [p.grad for p in ps])
    assert_same_bits(got[1], got[2], "Winograd products")
    cp, cps = residual_net("sqrt")
    assert cp.stats()["n_recomputed"] > 0
    assert_same_bits(got[1], [np.asarray(cp.run())] + [p.grad for p in cps], "Winograd, sqrt checkpointing")
    plain, pps = residual_net(fuse=False)
    assert_same_bits(got[1], [np.asarray(plain.run())] + [p.grad for p in pps], "Winograd, unfused")


@pytest.mark.parametrize("what, kw, channels, used", [
    ("16 -> 16, 3x3, padding 1", dict(padding=1), (16, 16), True),
    ("no padding", dict(), (16, 32), True),
    ("a stem of 3 channels", dict(padding=1), (3, 16), False),
    ("11 output channels", dict(padding=1), (16, 11), False),
    ("12 in, 12 out", dict(padding=1), (12, 12), True),
    ("stride 2", dict(stride=2, padding=1), (16, 16), False),
    ("dilation 2", dict(dilation=2, padding=2), (16, 16), False),
    ("two groups", dict(groups=2, padding=1), (16, 16), False),
])
def test_winograd_is_chosen_for_3x3_stride_1_products_of_12_channels_or_more(what, kw, channels, used):
    ci, co = channels
    g = jg.Graph(np.float32)
    x = g.input((2, ci, 16, 16), name="x")
    w = g.param(np.zeros((co, ci // kw.get("groups", 1), 3, 3)), name="w")
    y = jg.conv2d(x, w, **kw)
    is_winograd = int(g.nodes.ip[y.id, ConvIP.source]) == WINOGRAD and g.nodes.op[y.id] == CONV2D
    assert is_winograd == used, what


def test_a_5x5_or_1x1_kernel_is_not_winograd():
    g = jg.Graph(np.float32)
    x = g.input((2, 16, 16, 16), name="x")
    for k, p in ((5, 2), (1, 0)):
        y = jg.conv2d(x, g.param(np.zeros((16, 16, k, k)), name=f"w{k}"), padding=p)
        assert int(g.nodes.ip[y.id, ConvIP.source]) != WINOGRAD
