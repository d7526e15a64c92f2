"""Windows of an image: im2col (every kernel tap's view of the input as rows) and its
adjoint col2im, for the convolutions (ops/conv.py).

``im2col(x)`` of an (N, C, H, W) input is (N, C*kh*kw, OH, OW): row (c, i, j) holds
channel c at tap (i, j) for every output position, 0 where the window leaves the input.
Three uses: a 1x1 kernel with stride 1 is a **zero padding** (``pad_node``); a kernel
equal to its stride splits the padded input into stride x stride **phases** (a
space-to-depth, no copy bigger than the input); any other kernel lays out every window
(C*kh*kw times the input).  ``col2im`` adds rows back into the (image, channel) planes.
Units of work are planes (split CUSTOM): a plane is always summed by one thread in one
fixed order.  Params: WindowsIP (kernel, stride, padding, dilation).
"""
import numbers
from enum import IntEnum
from typing import Any, Sequence, Tuple, Union

from numba import njit, uint64 as U

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, operand, output, run_view, span
from ..registry import COL2IM, CUSTOM, IM2COL, defop, slots
from ..rules import Sym, either, op
from ..status import OK
from .common import need_tensor


class WindowsIP(IntEnum):        # im2col and col2im
    kernel_h = 0
    kernel_w = 1
    stride_h = 2
    stride_w = 3
    pad_h = 4
    pad_w = 5
    dilation_h = 6
    dilation_w = 7


def _windows_params(k, s, p, d) -> tuple:
    return slots(WindowsIP, kernel_h=k[0], kernel_w=k[1], stride_h=s[0], stride_w=s[1], pad_h=p[0], pad_w=p[1],
                 dilation_h=d[0], dilation_w=d[1])

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
    return x.graph._node(IM2COL, (x.id,), (N, C * k[0] * k[1], OH, OW), ip=_windows_params(k, s, p, d))


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
    return cols.graph._node(COL2IM, (cols.id,), (N, K // (k[0] * k[1])) + hw, ip=_windows_params(k, s, p, d))


@njit(cache=True, error_model="numpy")
def valid_columns(OW, W, sw, off):
    """The output columns ow whose input column ow*sw + off lies in [0, W)."""
    lo = 0 if off >= 0 else (sw - 1 - off) // sw
    hi = (W - off + sw - 1) // sw if W - off > 0 else 0
    return min(lo, OW), max(min(hi, OW), min(lo, OW))


@njit(cache=True, error_model="numpy")
def phases_kernel(cols, x, H, W, OH, OW, sh, sw, ph, pw, lo, hi, back):
    """im2col / col2im when the kernel is the stride (dilation 1): the padded input's sh x sw
    phases, which do not overlap -- phase (i, j) row oh holds padded row oh*sh + i at columns
    ow*sw + j.  Walked one padded input row at a time (its phase rows are written, or read,
    together: stride 2's two in one loop); col2im writes 0 + value where the general
    kernel adds the one value into a zeroed plane (the same bits)."""
    size = sh * sw * OH * OW
    # stride 2's columns [a, b) whose two phase values both lie in the row: a branch-free loop
    # that (de)interleaves whole vectors; the one or two columns at the edges test each value
    a0, b0 = valid_columns(OW, W, 2, -pw)
    a1, b1 = valid_columns(OW, W, 2, 1 - pw)
    a = max(a0, a1)
    b = max(min(b0, b1), a)
    covered = OH * sh - ph >= H and OW * sw - pw >= W      # every input element in a phase
    for u in range(lo, hi):
        plane, phases = U(u * H * W), U(u * size)
        if back and not covered:
            for t in range(U(H * W)):
                x[plane + t] = 0.0
        for hp in range(OH * sh):
            h = hp - ph
            r = phases + U((hp % sh * sw * OH + hp // sh) * OW)     # phase (i, 0)'s row oh
            if h < 0 or h >= H:
                if not back:
                    for j in range(sw):
                        for t in range(U(OW)):
                            cols[r + U(j * OH * OW) + t] = 0.0
                continue
            row = plane + U(h * W)
            if sw == 2:
                e = r + U(OH * OW)                                   # phase (i, 1)'s row oh
                src, n = row + U(2 * a - pw), U(b - a)
                if back:
                    for t in range(n):
                        x[src + U(2) * t] = 0.0 + cols[r + U(a) + t]
                        x[src + U(2) * t + U(1)] = 0.0 + cols[e + U(a) + t]
                else:
                    for t in range(n):
                        cols[r + U(a) + t] = x[src + U(2) * t]
                        cols[e + U(a) + t] = x[src + U(2) * t + U(1)]
                for k in range(OW - (b - a)):                        # columns [0, a) and [b, OW)
                    ow = k if k < a else k + b - a
                    q = 2 * ow - pw
                    if back:
                        if 0 <= q < W:
                            x[row + U(q)] = 0.0 + cols[r + U(ow)]
                        if 0 <= q + 1 < W:
                            x[row + U(q + 1)] = 0.0 + cols[e + U(ow)]
                    else:
                        cols[r + U(ow)] = x[row + U(q)] if 0 <= q < W else 0.0
                        cols[e + U(ow)] = x[row + U(q + 1)] if 0 <= q + 1 < W else 0.0
                continue
            for j in range(sw):
                rj = r + U(j * OH * OW)
                for ow in range(OW):
                    q = ow * sw + j - pw
                    if back:
                        if 0 <= q < W:
                            x[row + U(q)] = 0.0 + cols[rj + U(ow)]
                    else:
                        cols[rj + U(ow)] = x[row + U(q)] if 0 <= q < W else 0.0
    return OK


@njit(cache=True, error_model="numpy")
def windows_kernel(cols, x, C, H, W, OH, OW, p, lo, hi, back):
    """im2col (back = False) or col2im (back = True) of planes [lo, hi) ((image, channel) pairs).
    Indices are unsigned (``U``): Numba then skips the negative-index wraparound, so the
    loops vectorize without a slice per row (rows are short: a slice's set-up cost ~2x the
    copy of a 16-element row)."""
    kh, kw, sh, sw = p[WindowsIP.kernel_h], p[WindowsIP.kernel_w], p[WindowsIP.stride_h], p[WindowsIP.stride_w]
    ph, pw, dh, dw = p[WindowsIP.pad_h], p[WindowsIP.pad_w], p[WindowsIP.dilation_h], p[WindowsIP.dilation_w]
    if kh == sh and kw == sw and kh * kw > 1 and dh == 1 and dw == 1 and ph >= 0 and pw >= 0:
        return phases_kernel(cols, x, H, W, OH, OW, sh, sw, ph, pw, lo, hi, back)
    if not back and kh * kw * sh * sw == 1 and ph >= 0 and pw >= 0 and OW == W + 2 * pw:    # a zero padding
        for u in range(lo, hi):
            out = U(u * OH * OW)
            for t in range(U(OH * OW)):
                cols[out + t] = 0.0
            for h in range(H):
                dst, src = out + U((h + ph) * OW + pw), U((u * H + h) * W)
                for t in range(U(W)):
                    cols[dst + t] = x[src + t]
        return OK
    for u in range(lo, hi):
        plane = U(u * H * W)
        if back:
            for t in range(U(H * W)):
                x[plane + t] = 0.0
        for i in range(kh):
            for j in range(kw):
                off = j * dw - pw
                c0, c1 = valid_columns(OW, W, sw, off)
                n = U(c1 - c0)
                for oh in range(OH):
                    h = oh * sh - ph + i * dh
                    r = U((((u * kh + i) * kw + j) * OH + oh) * OW)       # the window row's start
                    if h < 0 or h >= H:
                        if not back:
                            for t in range(U(OW)):
                                cols[r + t] = 0.0
                        continue
                    inside = r + U(c0)
                    src = plane + U(h * W + c0 * sw + off)                # input of output column c0
                    if back:
                        if sw == 1:
                            for t in range(n):
                                x[src + t] += cols[inside + t]
                        elif sw == 2:                                  # a constant stride: vectorized
                            for t in range(n):
                                x[src + U(2) * t] += cols[inside + t]
                        else:
                            for t in range(n):
                                x[src + U(sw) * t] += cols[inside + t]
                        continue
                    for t in range(U(c0)):
                        cols[r + t] = 0.0
                    if sw == 1:
                        for t in range(n):
                            cols[inside + t] = x[src + t]
                    elif sw == 2:
                        for t in range(n):
                            cols[inside + t] = x[src + U(2) * t]
                    else:
                        for t in range(n):
                            cols[inside + t] = x[src + U(sw) * t]
                    for t in range(U(c1), U(OW)):
                        cols[r + t] = 0.0
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


def pad(a: Sym, ph, pw) -> Sym:
    """In a rule: a zero-padded by (ph, pw) -- an im2col with a 1x1 kernel -- or a itself when
    there is no padding."""
    padded = op.im2col(a, like=a, dims={2: a.shape[2] + 2 * ph, 3: a.shape[3] + 2 * pw}, kernel_h=1, kernel_w=1,
                       stride_h=1, stride_w=1, pad_h=ph, pad_w=pw, dilation_h=1, dilation_w=1)
    return either((ph == 0) & (pw == 0), a, padded)


defop(IM2COL, "im2col", im2col, _run_im2col, arity=1, public=False, split=CUSTOM, ip=WindowsIP,
      vjp=lambda g, x, out: op.col2im(g, like=x, params_from=out))
defop(COL2IM, "col2im", col2im, _run_col2im, arity=1, public=False, split=CUSTOM, ip=WindowsIP,
      vjp=lambda g, x, out: op.im2col(g, like=x, params_from=out))
