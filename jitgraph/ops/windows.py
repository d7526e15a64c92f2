"""Windows of an image: im2col (every kernel tap's view of the input as rows) and its
adjoint col2im, for the convolutions (ops/conv.py).

``im2col(x)`` of an (N, C, H, W) input is (N, C*kh*kw, OH, OW): row (c, i, j) holds
channel c at tap (i, j) for every output position, 0 where the window leaves the input.
Three uses: a 1x1 kernel with stride 1 is a **zero padding** (``pad_node``); a kernel
equal to its stride splits the padded input into stride x stride **phases** (a
space-to-depth, no copy bigger than the input); any other kernel lays out every window
(C*kh*kw times the input).  ``col2im`` adds rows back into the (image, channel) planes.
Units of work are planes (split CUSTOM): a plane is always summed by one thread in one
fixed order.  ip = (kh, kw, sh, sw, ph, pw, dh, dw).
"""
import numbers
from typing import Any, Sequence, Tuple, Union

from numba import njit

from .._sigs import G as G_T, ST, i64, on_first_use
from ..emit import grad_node
from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, operand, output, rule_view, run_view, span
from ..registry import CUSTOM, defop
from ..status import OK
from .common import need_tensor


IM2COL, COL2IM = 81, 82

Pair = Union[int, Sequence[int]]


def int_pair(value: Any, what: str, name: str, least: int) -> Tuple[int, int]:
    v = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(v) != 2 or not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) and int(a) >= least
                              for a in v):
        raise GraphError(f"{what}: {name} must be an int >= {least} or a pair of them, got {value!r}")
    return int(v[0]), int(v[1])


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def im2col(x: Tensor, kernel_size: Pair, stride: Pair = 1, padding: Pair = 0, dilation: Pair = 1) -> Tensor:
    """(N, C, H, W) -> (N, C*kh*kw, OH, OW): row (c, i, j) holds input channel c at kernel
    tap (i, j) for every output position (0 outside the input).  A 1x1 kernel with
    stride 1 is a zero padding of x."""
    x = need_tensor(x, "im2col")
    k, s, p, d = (int_pair(v, "im2col", n, m) for v, n, m in ((kernel_size, "kernel_size", 1), (stride, "stride", 1),
                                                           (padding, "padding", 0), (dilation, "dilation", 1)))
    if x.ndim != 4:
        raise GraphError(f"im2col: input {x.label!r} {x.shape} must be 4-D (N, C, H, W)")
    N, C, H, W = x.shape
    OH, OW = out_size(H, k[0], s[0], p[0], d[0]), out_size(W, k[1], s[1], p[1], d[1])
    if min(OH, OW) < 1:
        raise GraphError(f"im2col: the kernel {k} (dilation {d}) is larger than the padded input {x.label!r} "
                         f"{x.shape} (padding {p})")
    return x.graph._node(IM2COL, (x.id,), (N, C * k[0] * k[1], OH, OW), ip=k + s + p + d)


def col2im(cols: Tensor, size: Pair, kernel_size: Pair, stride: Pair = 1, padding: Pair = 0,
           dilation: Pair = 1) -> Tensor:
    """im2col's adjoint: (N, C*kh*kw, OH, OW) windows added back into (N, C, H, W) planes
    of ``size`` (H, W)."""
    cols = need_tensor(cols, "col2im")
    hw = int_pair(size, "col2im", "size", 1)
    k, s, p, d = (int_pair(v, "col2im", n, m) for v, n, m in ((kernel_size, "kernel_size", 1), (stride, "stride", 1),
                                                           (padding, "padding", 0), (dilation, "dilation", 1)))
    want = (out_size(hw[0], k[0], s[0], p[0], d[0]), out_size(hw[1], k[1], s[1], p[1], d[1]))
    if cols.ndim != 4 or cols.shape[1] % (k[0] * k[1]) or cols.shape[2:] != want:
        raise GraphError(f"col2im: windows {cols.label!r} {cols.shape} do not fit a {hw} input with kernel {k}, "
                         f"stride {s}, padding {p}, dilation {d} (expected (N, C*{k[0] * k[1]}, {want[0]}, {want[1]}))")
    N, K = cols.shape[:2]
    return cols.graph._node(COL2IM, (cols.id,), (N, K // (k[0] * k[1])) + hw, ip=k + s + p + d)


@njit(cache=True, error_model="numpy")
def valid_columns(OW, W, sw, off):
    """The output columns ow whose input column ow*sw + off lies in [0, W)."""
    lo = 0 if off >= 0 else (sw - 1 - off) // sw
    hi = (W - off + sw - 1) // sw if W - off > 0 else 0
    return min(lo, OW), max(min(hi, OW), min(lo, OW))


@njit(cache=True, error_model="numpy")
def windows_kernel(cols, x, C, H, W, OH, OW, p, lo, hi, back):
    """im2col (back = False) or col2im (back = True) of planes [lo, hi) ((image, channel) pairs).
    Loops run over slices indexed from 0, which LLVM vectorizes (no negative-index checks)."""
    kh, kw, sh, sw, ph, pw, dh, dw = p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]
    if not back and kh * kw * sh * sw == 1 and ph >= 0 and pw >= 0 and OW == W + 2 * pw:    # a zero padding
        for u in range(lo, hi):
            out = cols[u * OH * OW:(u + 1) * OH * OW]
            for t in range(OH * OW):
                out[t] = 0.0
            for h in range(H):
                dst = out[(h + ph) * OW + pw:]
                src = x[(u * H + h) * W:(u * H + h + 1) * W]
                for t in range(W):
                    dst[t] = src[t]
        return OK
    for u in range(lo, hi):
        plane = x[u * H * W:(u + 1) * H * W]
        if back:
            for t in range(H * W):
                plane[t] = 0.0
        for i in range(kh):
            for j in range(kw):
                off = j * dw - pw
                c0, c1 = valid_columns(OW, W, sw, off)
                for oh in range(OH):
                    h = oh * sh - ph + i * dh
                    r = (((u * kh + i) * kw + j) * OH + oh) * OW       # the window row's start
                    row = cols[r:r + OW]
                    if h < 0 or h >= H:
                        if not back:
                            for t in range(OW):
                                row[t] = 0.0
                        continue
                    inside = row[c0:c1]
                    src = plane[h * W + c0 * sw + off:]                # input of output column c0
                    if back:
                        if sw == 1:
                            for t in range(c1 - c0):
                                src[t] += inside[t]
                        elif sw == 2:                                  # a constant stride: vectorized
                            for t in range(c1 - c0):
                                src[2 * t] += inside[t]
                        else:
                            for t in range(c1 - c0):
                                src[t * sw] += inside[t]
                        continue
                    for t in range(c0):
                        row[t] = 0.0
                    if sw == 1:
                        for t in range(c1 - c0):
                            inside[t] = src[t]
                    elif sw == 2:
                        for t in range(c1 - c0):
                            inside[t] = src[2 * t]
                    else:
                        for t in range(c1 - c0):
                            inside[t] = src[t * sw]
                    tail = row[c1:]
                    for t in range(OW - c1):
                        tail[t] = 0.0
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _windows(v, n, lo, hi, back):
    img = n if back else v.src[n, 0]           # the (N, C, H, W) side
    win = v.src[n, 0] if back else n           # the (N, C*kh*kw, OH, OW) side
    s, w = v.shape[img], v.shape[win]
    planes = s[0] * s[1]
    if lo < 0:
        v.ctx[RUN_EXTENT] = planes
        return OK
    lo, hi = span(lo, hi, planes)
    if back:
        return windows_kernel(operand(v, n, 0), output(v, n), s[1], s[2], s[3], w[2], w[3], v.ip[n], lo, hi, True)
    return windows_kernel(output(v, n), operand(v, n, 0), s[1], s[2], s[3], w[2], w[3], v.ip[n], lo, hi, False)


def _run_im2col(n, lo, hi, ctx, mem, store):
    return _windows(run_view(ctx, mem, store), n, lo, hi, False)


def _run_col2im(n, lo, hi, ctx, mem, store):
    return _windows(run_view(ctx, mem, store), n, lo, hi, True)


@njit(cache=True)
def windows_node(G, st, op, a, like, p, n, k):
    """An im2col / col2im node of ``a`` with node p's params, shaped like ``like``."""
    t = grad_node(G, st, op, a, -1, like, n, k)
    for q in range(8):
        G.ip[t, q] = G.ip[p, q]
    return t


def _vjp_im2col(n, k, g, ctx):
    G, st = rule_view(ctx)
    return windows_node(G, st, COL2IM, g, G.src[n, 0], n, n, k)


def _vjp_col2im(n, k, g, ctx):
    G, st = rule_view(ctx)
    return windows_node(G, st, IM2COL, g, G.src[n, 0], n, n, k)


defop(IM2COL, "im2col", im2col, _run_im2col, _vjp_im2col, arity=1, public=False, split=CUSTOM)
defop(COL2IM, "col2im", col2im, _run_col2im, _vjp_col2im, arity=1, public=False, split=CUSTOM)


@on_first_use(i64(G_T, ST, i64, i64, i64, i64, i64))
def pad_node(G, st, a, ph, pw, n, k):
    """a zero-padded by (ph, pw): an im2col with a 1x1 kernel (a itself when there is no padding)."""
    if ph == 0 and pw == 0:
        return a
    t = grad_node(G, st, IM2COL, a, -1, a, n, k)
    G.shape[t, 2] += 2 * ph
    G.shape[t, 3] += 2 * pw
    for q in range(8):
        G.ip[t, q] = 1
    G.ip[t, 4] = ph
    G.ip[t, 5] = pw
    return t
