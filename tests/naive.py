"""The numpy reference of every op: one line per op.

``REF[name]`` is a :class:`Case`: the naive float64 reference (called like the op's
builder, with numpy arrays for tensors), how to draw an example, the fuzz family
that draws it into random programs (graphgen.py), and whether it has a gradient.
The forward tests, the gradient checks, the fuzzer and the save/load model all
read this table, and test_registry.py fails when an op of the registry has no
line here -- so adding an op means one family file and one line below.
"""
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from scipy.special import erf

from jitgraph.ops.stochastic import dropout_uniform


@dataclass
class Case:
    ref: Callable                       # numpy reference: ref(*arrays, **kw)
    args: Callable                      # rng -> list of arguments (float arrays become tensors)
    fuzz: str                           # graphgen family: unary binary ... loss select window (FUZZ_FAMILIES)
    kw: dict = field(default_factory=dict)   # keyword arguments for examples and fuzzing
    grad: bool = True                   # has a gradient to check (False: no rule, or piecewise constant)
    call: Optional[Callable] = None     # call(builder, *tensors, **kw) when not builder(*tensors, **kw)
    domain: str = "any"                 # fuzz operand domain: any, positive (log, sqrt), bounded (exp)
    node: bool = False                  # ref needs the jitgraph node (dropout: its mask)
    fuzz_kw: Optional[Callable] = None  # shape ops: fuzz_kw(*operand shapes) -> kw, or None if not applicable
    wrt: Optional[tuple] = None         # the arguments a gradient check differentiates (default: every float one)


def u(*shape, lo=-2.0, hi=2.0):
    return lambda rng: rng.uniform(lo, hi, shape)


def away0(*shape):
    """Values at least 0.2 from 0 (kinks of relu, abs, sign)."""
    return lambda rng: rng.uniform(0.2, 2.0, shape) * np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def distinct(*shape):
    """A permutation of distinct values (no ties for max)."""
    return lambda rng: rng.permutation(np.arange(int(np.prod(shape)), dtype=float)).reshape(shape) / 7.0


def probs(*shape):
    def draw(rng):
        t = rng.random(shape) + 0.1
        return t / t.sum(-1, keepdims=True)
    return draw


def ce_classes(x, t, ignore_index=None):
    """Cross entropy of rows of x against class ids t, rows with ignore_index left out."""
    keep = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    logp = np.log(softmax(x))
    picked = np.take_along_axis(logp, np.where(keep, t, 0)[..., None], -1)[..., 0]
    return -(picked * keep).sum() / max(int(keep.sum()), 1)


def ce_classes_d(x, t, g, ignore_index=None):
    keep = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    onehot = np.eye(x.shape[-1])[np.where(keep, t, 0)]
    return (softmax(x) - onehot) * keep[..., None] * g / max(int(keep.sum()), 1)


def masses(*shape):
    """Targets that are not probabilities: rows of any sum, the first row all zero (a masked row)."""
    def draw(rng):
        t = rng.random(shape) * 0.8
        t[0] = 0.0
        return t
    return draw


def away_from(lo, hi, *shape):
    """Values at least 0.1 from the bounds lo and hi (clip's kinks)."""
    def draw(rng):
        x = rng.uniform(-2.0, 2.0, shape)
        for b in (lo, hi):
            near = np.abs(x - b) < 0.1
            x[near] = b + np.where(x[near] < b, -0.1, 0.1)
        return x
    return draw


def one(draw):
    return lambda rng: [draw(rng)]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def norm(x, eps, center):
    mu = x.mean(-1, keepdims=True) if center else 0.0
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def norm_vjp(g, x, eps, center):
    """The vector-Jacobian product of layer_norm (center) / rms_norm at x, by the formula."""
    mu = x.mean(-1, keepdims=True) if center else 0.0
    r = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    y = (x - mu) * r
    mg = g.mean(-1, keepdims=True) if center else 0.0
    return r * (g - mg - y * (g * y).mean(-1, keepdims=True))


def first_max_mask(x, axis):
    """1 at the first (row-major) maximal element of each group reduced over ``axis``."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0)))
    flat = moved.reshape(moved.shape[:moved.ndim - len(axes)] + (-1,))
    mask = np.zeros_like(flat)
    np.put_along_axis(mask, flat.argmax(-1)[..., None], 1.0, -1)
    return np.moveaxis(mask.reshape(moved.shape), tuple(range(-len(axes), 0)), axes)


def dropout_ref(x, p, seed=0, *, node):
    u_ = np.array([dropout_uniform(seed, node.id, i) for i in range(x.size)]).reshape(x.shape)
    return np.where(u_ >= p, x / (1 - p), 0.0)


def scatter_add_ref(rows, idx, n_rows):
    out = np.zeros((n_rows, rows.shape[-1]))
    np.add.at(out, idx.reshape(-1), rows.reshape(-1, rows.shape[-1]))
    return out


def bn_axes(x):
    """The axes batch norm reduces: all but the channels (axis 1)."""
    return (0,) + tuple(range(2, x.ndim))


def per_channel(v, x):
    return np.reshape(v, (1, -1) + (1,) * (x.ndim - 2))


def batch_norm_ref(x, w=None, b=None, training=True, eps=1e-5, mean=None, var=None):
    """PyTorch's F.batch_norm: batch statistics in training, the given mean / var otherwise."""
    if training:
        mean, var = x.mean(bn_axes(x)), x.var(bn_axes(x))
    y = (x - per_channel(mean, x)) / np.sqrt(per_channel(var, x) + eps)
    return y * (1.0 if w is None else per_channel(w, x)) + (0.0 if b is None else per_channel(b, x))


def batch_norm_sums_ref(g, x, p, eps):
    xhat = (x - per_channel(p[0], x)) / np.sqrt(per_channel(p[1], x) + eps)
    return np.stack([p[0], p[1], (g * xhat).sum(bn_axes(x)), g.sum(bn_axes(x))])


def batch_norm_dx_ref(g, x, q, w, eps):
    m = x.size // x.shape[1]
    rstd = 1 / np.sqrt(per_channel(q[1], x) + eps)
    xhat = (x - per_channel(q[0], x)) * rstd
    return per_channel(w, x) * rstd * (g - per_channel(q[3], x) / m - xhat * per_channel(q[2], x) / m)


def bn_statistics(c):
    """A (2, c) mean and positive variance."""
    return lambda rng: np.stack([rng.uniform(-1, 1, c), rng.uniform(0.5, 2, c)])


def _probs(q, k, causal, scale):
    """Attention probabilities (..., Tq, Tk): softmax of the scaled scores, keys j > i masked."""
    s = (q @ np.swapaxes(k, -1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    return softmax(s)


def attention_ref(q, k, v, causal=False, scale=None):
    return _probs(q, k, causal, scale) @ v


def attention_d_ref(q, k, v, gd, causal=False, scale=None):
    """[dq; dk; dv] along the T axis from gd = [dO | D] (D = rowsum(dO * O)), by the formulas."""
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    p, g, D = _probs(q, k, causal, scale), gd[..., :-1], gd[..., -1:]
    ds = p * (g @ np.swapaxes(v, -1, -2) - D)
    return np.concatenate([sc * ds @ k, sc * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g], axis=-2)


def attention_d_args(rng, causal=True):
    q, k, v, g = u(2, 2, 5, 4)(rng), u(2, 2, 6, 4)(rng), u(2, 2, 6, 4)(rng), u(2, 2, 5, 4)(rng)
    D = (g * attention_ref(q, k, v, causal)).sum(-1, keepdims=True)
    return [q, k, v, np.concatenate([g, D], axis=-1)]


# ---- convolutions and pooling (NCHW), by direct loops -----------------------------------------------
def _two(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _taps(shape, kernel_size, stride, padding, dilation):
    """(i, j, oh, ow, h, w) of every window tap inside an input of shape (H, W); and (OH, OW)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_two, (kernel_size, stride, padding, dilation))
    OH, OW = _out(shape[0], kh, sh, ph, dh), _out(shape[1], kw, sw, pw, dw)
    taps = [(i, j, oh, ow, oh * sh - ph + i * dh, ow * sw - pw + j * dw) for i in range(kh) for j in range(kw)
            for oh in range(OH) for ow in range(OW)]
    return [t for t in taps if 0 <= t[4] < shape[0] and 0 <= t[5] < shape[1]], (OH, OW)


def im2col_ref(x, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw) = _two(kernel_size)
    taps, (OH, OW) = _taps(x.shape[2:], kernel_size, stride, padding, dilation)
    out = np.zeros(x.shape[:2] + (kh, kw, OH, OW))
    for i, j, oh, ow, h, w in taps:
        out[:, :, i, j, oh, ow] = x[:, :, h, w]
    return out.reshape(x.shape[0], -1, OH, OW)


def col2im_ref(cols, size, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw) = _two(kernel_size)
    taps, _ = _taps(_two(size), kernel_size, stride, padding, dilation)
    c = cols.reshape(cols.shape[0], -1, kh, kw, cols.shape[2], cols.shape[3])
    out = np.zeros(c.shape[:2] + _two(size))
    for i, j, oh, ow, h, w in taps:
        out[:, :, h, w] += c[:, :, i, j, oh, ow]
    return out


def conv2d_ref(x, w, stride=1, padding=0, dilation=1, groups=1):
    """PyTorch's cross-correlation: the windows of each group times its weights."""
    cols = im2col_ref(x, w.shape[2:], stride, padding, dilation)
    N, _, OH, OW = cols.shape
    wg = w.reshape(groups, w.shape[0] // groups, -1)
    cg = cols.reshape(N, groups, wg.shape[2], OH * OW)
    return np.einsum("gok,ngkp->ngop", wg, cg).reshape(N, w.shape[0], OH, OW)


WINOGRAD_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def winograd_weights_ref(w, flip=False):
    """(16, O, C): G k G^T for each 3x3 kernel k of w (C_out, C_in, 3, 3), entry 4 i + j; ``flip``:
    the kernels turned by 180 degrees and transposed, (16, C_in, C_out)."""
    k = np.flip(w, (2, 3)).transpose(1, 0, 2, 3) if flip else w
    return np.einsum("ai,ocij,bj->aboc", WINOGRAD_G, k, WINOGRAD_G).reshape(16, k.shape[0], k.shape[1])


def conv2d_weight_ref(g, xp, kernel_size, dilation=1, groups=1, flip=False):
    """sum over images and positions of g[n, o, p] xp[n, c, p + tap]; ``flip``: the weight
    gradient of the flipped-kernel convolution (out[co, c, kh-1-i, kw-1-j], rows from xp)."""
    (kh, kw), (dh, dw) = _two(kernel_size), _two(dilation)
    OH, OW = g.shape[2:]
    Gc, Xc = g.shape[1] // groups, xp.shape[1] // groups
    out = np.zeros((xp.shape[1], Gc, kh, kw) if flip else (g.shape[1], Xc, kh, kw))
    for o in range(g.shape[1]):
        grp = o // Gc
        for c in range(Xc):
            for i in range(kh):
                for j in range(kw):
                    s = np.sum(g[:, o] * xp[:, grp * Xc + c, i * dh:i * dh + OH, j * dw:j * dw + OW])
                    if flip:
                        out[grp * Xc + c, o % Gc, kh - 1 - i, kw - 1 - j] = s
                    else:
                        out[o, c, i, j] = s
    return out


def _pool_windows(x, kernel_size, stride, padding):
    k = _two(kernel_size)
    taps, (OH, OW) = _taps(x.shape[2:], k, k if stride is None else stride, padding, 1)
    windows = {}
    for i, j, oh, ow, h, w in taps:
        windows.setdefault((oh, ow), []).append((i, j, h, w))
    return windows, (OH, OW), k[0] * k[1]


def pool_ref(x, kernel_size, stride=None, padding=0, how="max"):
    windows, shape, size = _pool_windows(x, kernel_size, stride, padding)
    out = np.zeros(x.shape[:2] + shape)
    for (oh, ow), taps in windows.items():
        vals = np.stack([x[:, :, h, w] for _, _, h, w in sorted(taps)], -1)
        out[:, :, oh, ow] = vals.max(-1) if how == "max" else vals.sum(-1) / size
    return out


def pool_d_ref(x, g, kernel_size, stride=None, padding=0, how="max"):
    """The gradient of a pooling of x for output gradient g: to each window's first maximum
    (row-major), or g / (kh*kw) to every tap."""
    windows, _, size = _pool_windows(x, kernel_size, stride, padding)
    out = np.zeros(x.shape)
    for (oh, ow), taps in windows.items():
        taps = sorted(taps)
        for n in range(x.shape[0]):
            for c in range(x.shape[1]):
                if how == "max":
                    best = int(np.argmax([x[n, c, h, w] for _, _, h, w in taps]))
                    out[n, c, taps[best][2], taps[best][3]] += g[n, c, oh, ow]
                else:
                    for _, _, h, w in taps:
                        out[n, c, h, w] += g[n, c, oh, ow] / size
    return out


def _window_kw(s, **kw):
    """A small kernel for a 2-D fuzz value seen as one (1, 1, H, W) image, plus ``kw``."""
    return dict(kernel_size=(min(2, s[0]), min(2, s[1])), **kw)


def _valid(s):
    """The output shape of a stride-1 unpadded _window_kw kernel on an (H, W) image."""
    return s[0] - min(2, s[0]) + 1, s[1] - min(2, s[1]) + 1


PHI = 1 / math.sqrt(2 * math.pi)

REF = {
    # binary
    "add": Case(np.add, lambda r: [u(3, 4)(r), u(4)(r)], "binary"),
    "sub": Case(np.subtract, lambda r: [u(2, 1, 3)(r), u(4, 1)(r)], "binary"),
    "mul": Case(np.multiply, lambda r: [u(3, 4)(r), u(3, 1)(r)], "binary"),
    "div": Case(np.divide, lambda r: [u(3, 4)(r), away0(4)(r)], "binary", domain="positive"),
    "where": Case(lambda c, a, b: np.where(c != 0, a, b), lambda r: [(r.random((3, 1)) < 0.5) * 1.0, u(3, 4)(r), u(4)(r)], "select", wrt=(1, 2)),
    "affine": Case(lambda x, a, b: a * x + b, one(u(3, 4)), "unary", dict(a=-1.5, b=0.5)),
    # unary
    "neg": Case(np.negative, one(u(3, 4)), "unary"),
    "sqr": Case(np.square, one(u(3, 4)), "unary"),
    "sqrt": Case(np.sqrt, one(u(3, 4, lo=0.3, hi=3)), "unary", domain="positive"),
    "exp": Case(np.exp, one(u(2, 3, 2)), "unary", domain="bounded"),
    "log": Case(np.log, one(u(3, 4, lo=0.3, hi=3)), "unary", domain="positive"),
    "abs": Case(np.abs, one(away0(3, 4)), "unary"),
    "relu": Case(lambda x: np.maximum(x, 0), one(away0(3, 4)), "unary"),
    "sin": Case(np.sin, one(u(3, 4)), "unary"),
    "softplus": Case(lambda x: np.logaddexp(0.0, x), one(u(3, 4, lo=-8, hi=8)), "unary"),
    "cos": Case(np.cos, one(u(3, 4)), "unary"),
    "pow": Case(lambda x, exponent: np.power(x, exponent), one(u(3, 4, lo=0.3, hi=2.0)), "unary",
                dict(exponent=1.7), domain="positive"),
    "clip": Case(lambda x, lo, hi: np.clip(x, lo, hi), one(away_from(-0.5, 0.8, 3, 4)), "unary", dict(lo=-0.5, hi=0.8)),
    "clip_mask": Case(lambda x, lo, hi: ((x >= lo) & (x <= hi)) * 1.0, one(u(3, 4)), "unary", dict(lo=-0.5, hi=0.8),
                      grad=False),
    "maximum": Case(np.maximum, lambda r: [u(3, 4)(r), u(4)(r)], "binary"),
    "minimum": Case(np.minimum, lambda r: [u(3, 4)(r), u(4)(r)], "binary"),
    "less": Case(lambda a, b: (a < b) * 1.0, lambda r: [u(3, 4)(r), u(4)(r)], "binary", grad=False),
    "less_equal": Case(lambda a, b: (a <= b) * 1.0, lambda r: [u(3, 4)(r), u(4)(r)], "binary", grad=False),
    "greater": Case(lambda a, b: (a > b) * 1.0, lambda r: [u(3, 4)(r), u(4)(r)], "binary", grad=False),
    "greater_equal": Case(lambda a, b: (a >= b) * 1.0, lambda r: [u(3, 4)(r), u(4)(r)], "binary", grad=False),
    "argmax": Case(lambda x, axis: np.argmax(x, axis).astype(float), one(distinct(3, 4)), "reduce", dict(axis=1),
                   grad=False),
    "equal": Case(lambda a, b: (a == b) * 1.0, lambda r: [np.round(u(3, 4)(r)), np.round(u(4)(r))], "binary",
                  grad=False),
    "leaky_relu": Case(lambda x, slope: np.where(x > 0, x, slope * x), one(away0(3, 4)), "unary", dict(slope=0.2)),
    "gelu": Case(lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), one(u(3, 4, lo=-4, hi=4)), "unary"),
    "silu": Case(lambda x: x * sigmoid(x), one(u(3, 4, lo=-6, hi=6)), "unary"),
    "tanh": Case(np.tanh, one(u(3, 4)), "unary"),
    "sigmoid": Case(sigmoid, one(u(3, 4, lo=-8, hi=8)), "unary"),
    "copy": Case(np.copy, one(u(5,)), "unary"),
    "step": Case(lambda x: (x > 0).astype(float), one(away0(3, 4)), "unary", grad=False),
    "relu_d": Case(lambda g, y: g * (y > 0), lambda r: [u(3, 4)(r), away0(3, 4)(r)], "rowpair", wrt=(0,)),
    "sign": Case(np.sign, one(away0(3, 4)), "unary", grad=False),
    "gelu_d": Case(lambda x: 0.5 * (1 + erf(x / math.sqrt(2))) + x * PHI * np.exp(-0.5 * x * x),
                   one(u(3, 4)), "unary"),
    "gelu_grad": Case(lambda g, x: g * (0.5 * (1 + erf(x / math.sqrt(2))) + x * PHI * np.exp(-0.5 * x * x)),
                      lambda r: [u(3, 4)(r), u(3, 4)(r)], "rowpair"),
    "gelu_dd": Case(lambda x: PHI * np.exp(-0.5 * x * x) * (2 - x * x), one(u(3, 4)), "unary", grad=False),
    "silu_d": Case(lambda x: sigmoid(x) * (1 + x * (1 - sigmoid(x))), one(u(3, 4)), "unary"),
    "silu_dd": Case(lambda x: sigmoid(x) * (1 - sigmoid(x)) * (2 + x * (1 - 2 * sigmoid(x))), one(u(3, 4)),
                    "unary", grad=False),
    # reductions
    "sum": Case(np.sum, one(u(2, 3, 4)), "reduce", dict(axis=(0, 2), keepdims=True)),
    "mean": Case(np.mean, one(u(3, 4)), "reduce", dict(axis=1, keepdims=False)),
    "max": Case(np.max, one(distinct(2, 3, 4)), "reduce", dict(axis=(1, 2), keepdims=True)),
    "broadcast": Case(np.broadcast_to, one(u(3, 1)), "shape", dict(shape=(2, 3, 4)),
                      fuzz_kw=lambda s: dict(shape=(3, s[1])) if s[0] == 1 else None),
    "max_mask": Case(first_max_mask, one(u(3, 4)), "reduce", dict(axis=1), grad=False),
    # shape
    "reshape": Case(np.reshape, one(u(2, 3, 4)), "shape", dict(shape=(6, 4)),
                    fuzz_kw=lambda s: dict(shape=(1, s[0] * s[1]))),
    "transpose": Case(np.transpose, one(u(2, 3, 4)), "shape", dict(axes=(2, 0, 1)), fuzz_kw=lambda s: dict(axes=(1, 0))),
    "concat": Case(lambda *xs, axis: np.concatenate(xs, axis), lambda r: [u(2, 3)(r), u(2, 1)(r), u(2, 2)(r)],
                   "shape", dict(axis=1), call=lambda f, *ts, axis: f(list(ts), axis),
                   fuzz_kw=lambda a, b: dict(axis=0) if a[1] == b[1] else None),
    "slice": Case(lambda x, axis, start, stop: np.take(x, range(start, stop), axis), one(u(3, 5)), "shape",
                  dict(axis=1, start=1, stop=4), fuzz_kw=lambda s: dict(axis=1, start=0, stop=s[1] - 1) if s[1] > 1
                  else None),
    "pad": Case(lambda x, axis, before, after: np.pad(x, [(before, after) if a == axis else (0, 0)
                                                        for a in range(x.ndim)]),
                one(u(3, 2)), "shape", dict(axis=0, before=1, after=2),
                fuzz_kw=lambda s: dict(axis=0, before=1, after=0)),
    # contraction
    "matmul": Case(np.matmul, lambda r: [u(2, 3, 4)(r), u(4, 5)(r)], "matmul"),
    # row kernels
    "softmax": Case(softmax, one(u(3, 5)), "rowwise", dict(axis=-1)),
    "log_softmax": Case(lambda x, axis: np.log(softmax(x, axis)), one(u(3, 5)), "rowwise", dict(axis=0)),
    "cross_entropy": Case(lambda x, t: -(t * np.log(softmax(x))).sum(-1).mean(), lambda r: [u(4, 5)(r),
                                                                                             probs(4, 5)(r)],
                          "loss"),
    "cross_entropy_index": Case(lambda x, t, ignore_index: ce_classes(x, t, ignore_index),
                                lambda r: [u(4, 5)(r), np.array([1, 0, 4, 2])], "loss", dict(ignore_index=4)),
    "cross_entropy_index_d": Case(lambda x, t, g, ignore_index: ce_classes_d(x, t, g, ignore_index),
                                  lambda r: [u(4, 5)(r), np.array([3, 2, 0, 2]), np.array(1.3)], "loss",
                                  dict(ignore_index=2), grad=False),
    "cross_entropy_d": Case(lambda x, t, g: (softmax(x) * t.sum(-1, keepdims=True) - t) * g * x.shape[-1] / x.size,
                            lambda r: [u(4, 5)(r), masses(4, 5)(r), np.array(0.7)], "loss"),
    "layer_norm": Case(lambda x, eps: norm(x, eps, True), one(u(3, 6)), "rowwise", dict(eps=1e-5)),
    "rms_norm": Case(lambda x, eps: norm(x, eps, False), one(u(3, 6)), "rowwise", dict(eps=1e-5)),
    "layer_norm_affine": Case(lambda x, w, b, eps: norm(x, eps, True) * w + b,
                              lambda r: [u(2, 3, 6)(r), u(6)(r), u(6)(r)], "rowwise", dict(eps=1e-5)),
    "softmax_d": Case(lambda g, y, axis: y * (g - (g * y).sum(axis, keepdims=True)),
                      lambda r: [u(3, 5)(r), softmax(u(3, 5)(r))], "rowpair", dict(axis=-1)),
    "log_softmax_d": Case(lambda g, y, axis: g - np.exp(y) * g.sum(axis, keepdims=True),
                          lambda r: [u(4, 3)(r), np.log(softmax(u(4, 3)(r), 0))], "rowpair", dict(axis=0)),
    "layer_norm_d": Case(lambda g, x, eps: norm_vjp(g, x, eps, True), lambda r: [u(3, 6)(r), u(3, 6)(r)],
                         "rowpair", dict(eps=1e-5)),
    "rms_norm_d": Case(lambda g, x, eps: norm_vjp(g, x, eps, False), lambda r: [u(3, 6)(r), u(3, 6)(r)],
                       "rowpair", dict(eps=1e-5)),
    "norm_rstd": Case(lambda x, eps, center: 1 / np.sqrt(((x - (x.mean(-1, keepdims=True) if center else 0)) ** 2)
                                                       .mean(-1, keepdims=True) + eps),
                      one(u(3, 6)), "rowwise", dict(eps=1e-5, center=True)),
    # attention
    "attention": Case(attention_ref, lambda r: [u(2, 2, 5, 4)(r), u(2, 2, 6, 4)(r), u(2, 2, 6, 4)(r)], "attention",
                      dict(causal=True)),
    "attention_d": Case(attention_d_ref, attention_d_args, "attention", dict(causal=True), grad=False),
    # gathers
    "embedding": Case(lambda T, i: T[i], lambda r: [u(5, 3)(r), np.array([[0, 2], [2, 4], [1, 1]])], "gather"),
    "scatter_add": Case(scatter_add_ref, lambda r: [u(4, 3)(r), np.array([1, 0, 1, 3])], "gather",
                        dict(n_rows=5)),
    # batch norm over axis 1; the examples' N (5) differs from C (3): test_threads stacks along N
    "batch_norm": Case(batch_norm_ref, lambda r: [u(5, 3, 4)(r), u(3, lo=0.5, hi=1.5)(r), u(3, lo=-0.2, hi=0.2)(r)],
                       "channels", dict(training=True)),
    "batch_stats": Case(lambda x: np.stack([x.mean(bn_axes(x)), x.var(bn_axes(x))]), one(u(5, 3, 4)), "channels"),
    "batch_norm_sums": Case(batch_norm_sums_ref, lambda r: [u(5, 3, 4)(r), u(5, 3, 4)(r), bn_statistics(3)(r)],
                            "channels", dict(eps=1e-5), grad=False),
    "batch_norm_dx": Case(batch_norm_dx_ref, lambda r: [u(5, 3, 4)(r), u(5, 3, 4)(r), np.concatenate(
        [bn_statistics(3)(r), u(2, 3)(r)]), u(3)(r)], "channels", dict(eps=1e-5), grad=False),
    # convolutions and pooling (NCHW): a fuzz value is one (1, 1, H, W) image, the weights params
    "conv2d": Case(conv2d_ref, lambda r: [u(2, 4, 5, 6)(r), u(6, 2, 3, 2)(r)], "window", dict(padding=1, groups=2),
                   fuzz_kw=lambda s: dict(padding=1, params=[(2, 1, min(2, s[0]), min(2, s[1]))])),
    # U = G w G^T of each 3x3 kernel (Winograd's products, ops/winograd.py): a weight, not an image
    "winograd_weights": Case(lambda w, flip: winograd_weights_ref(w, flip), one(u(3, 2, 3, 3)), "window",
                             dict(flip=True), grad=False, fuzz_kw=lambda s: None),
    "conv2d_weight": Case(lambda xp, g, **kw: conv2d_weight_ref(g, xp, **kw),
                          lambda r: [u(2, 4, 6, 5)(r), u(2, 8, 4, 4)(r)], "window", dict(kernel_size=(3, 2), groups=2),
                          call=lambda f, xp, g, **kw: f(g, xp, **kw),
                          fuzz_kw=lambda s: _window_kw(s, params=[(1, 2) + _valid(s)])),
    "im2col": Case(im2col_ref, one(u(2, 3, 6, 5)), "window",
                   dict(kernel_size=(3, 2), stride=(2, 1), padding=1, dilation=(1, 2)),
                   fuzz_kw=lambda s: _window_kw(s, padding=1)),
    "col2im": Case(col2im_ref, one(u(2, 18, 3, 5)), "window",
                   dict(size=(6, 5), kernel_size=(3, 2), stride=(2, 1), padding=1, dilation=(1, 2)),
                   fuzz_kw=lambda s: dict(size=(2 * s[0] - 1, 2 * s[1] - 1), kernel_size=1, stride=2)),
    "max_pool2d": Case(lambda x, **kw: pool_ref(x, how="max", **kw), one(distinct(2, 3, 6, 5)), "window",
                       dict(kernel_size=3, stride=2, padding=1), fuzz_kw=lambda s: _window_kw(s, stride=1)),
    "max_pool2d_d": Case(lambda x, g, **kw: pool_d_ref(x, g, how="max", **kw),
                         lambda r: [distinct(2, 3, 6, 5)(r), u(2, 3, 3, 3)(r)], "window",
                         dict(kernel_size=3, stride=2, padding=1), call=lambda f, x, g, **kw: f(g, x, **kw),
                         fuzz_kw=lambda s: _window_kw(s, stride=1, params=[(1, 1) + _valid(s)])),
    "avg_pool2d": Case(lambda x, **kw: pool_ref(x, how="avg", **kw), one(u(2, 3, 6, 5)), "window",
                       dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0)),
                       fuzz_kw=lambda s: _window_kw(s, stride=1)),
    "avg_pool2d_d": Case(lambda g, size, **kw: pool_d_ref(np.zeros(g.shape[:2] + size), g, how="avg", **kw),
                         one(u(2, 3, 6, 2)), "window", dict(size=(6, 5), kernel_size=(3, 2), stride=(1, 2),
                                                            padding=(1, 0)),
                         fuzz_kw=lambda s: dict(size=(2 * s[0], 2 * s[1]), kernel_size=2)),
    # randomness
    "dropout": Case(dropout_ref, one(u(6, 7)), "unary", dict(p=0.3, seed=5), node=True),
}

FUZZ_FAMILIES = ("unary", "binary", "select", "reduce", "rowwise", "rowpair", "shape", "matmul", "gather", "loss",
                 "channels", "attention", "window")


def build(op, builder: Callable, tensors: list, kw: dict) -> Any:
    """Apply the op's builder the way its Case says."""
    case = REF[op]
    return case.call(builder, *tensors, **kw) if case.call else builder(*tensors, **kw)


def reference(op, arrays: list, kw: dict, node=None) -> np.ndarray:
    case = REF[op]
    if case.node:
        kw = dict(kw, node=node)
    return np.asarray(case.ref(*arrays, **kw), dtype=np.float64)
