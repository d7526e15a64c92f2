"""Pooling: max_pool2d and avg_pool2d, each with a fused backward op.

Calling convention: NCHW; params PoolIP (kernel, stride, padding); units of work are (image,
channel) planes (split CUSTOM), so a plane's gradient is always summed by one thread
in one fixed order (windows in row-major order, taps in row-major order within a
window) and results do not depend on the thread count.  Padding counts as -inf for
max and as 0 for avg (which divides by kh*kw: PyTorch's count_include_pad=True); the
builders keep padding at most half the kernel, so every window holds an input element.

* ``max_pool2d`` has two sources, values and keys (both x when a user calls it): each
  output is the value at its window's first maximal key (a NaN key wins).  Its
  gradient ``max_pool2d_d(g, keys)`` adds g to that position, found again from the
  keys -- no index tensor is stored; the gradient of max_pool2d_d through g is
  max_pool2d(h, keys), so second derivatives work.
* ``avg_pool2d`` and ``avg_pool2d_d`` (windows of g / (kh*kw) added back) are each
  other's adjoints.
"""
from enum import IntEnum
from typing import Sequence, Tuple, Union

import numpy as np
from numba import njit, uint64 as U

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, operand, output, run_view, span
from ..registry import AVG_POOL2D, AVG_POOL2D_D, CUSTOM, MAX_POOL2D, MAX_POOL2D_D, defop, slots
from ..rules import op
from ..status import OK
from .common import need_tensor
from .windows import int_pair, out_size, valid_columns


class PoolIP(IntEnum):           # every op of the family
    kernel_h = 0
    kernel_w = 1
    stride_h = 2
    stride_w = 3
    pad_h = 4
    pad_w = 5


MAX, MAX_D, AVG, AVG_D = 0, 1, 2, 3       # the kernel's modes

Pair = Union[int, Sequence[int]]


def _window(x: Tensor, kernel_size: Pair, stride: Union[None, Pair], padding: Pair, what: str) -> Tuple[tuple, tuple]:
    """(ip, output shape) of a pooling of x."""
    x = need_tensor(x, what)
    if x.ndim != 4:
        raise GraphError(f"{what}: input {x.label!r} {x.shape} must be 4-D (N, C, H, W)")
    return _windows(x.shape, x.label, kernel_size, stride, padding, what)


def _windows(shape: tuple, label: str, kernel_size: Pair, stride: Union[None, Pair], padding: Pair,
             what: str) -> Tuple[tuple, tuple]:
    k = int_pair(kernel_size, what, "kernel_size", 1)
    s = k if stride is None else int_pair(stride, what, "stride", 1)
    p = int_pair(padding, what, "padding", 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise GraphError(f"{what}: padding {p} of {label!r} must be at most half the kernel {k}")
    N, C, H, W = shape
    OH, OW = out_size(H, k[0], s[0], p[0], 1), out_size(W, k[1], s[1], p[1], 1)
    if min(OH, OW) < 1:
        raise GraphError(f"{what}: the kernel {k} is larger than the padded input {label!r} {shape} "
                         f"(padding {p})")
    return slots(PoolIP, kernel_h=k[0], kernel_w=k[1], stride_h=s[0], stride_w=s[1], pad_h=p[0], pad_w=p[1]), \
        (N, C, OH, OW)


def max_pool2d(x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None, padding: Pair = 0) -> Tensor:
    """The max of each kh x kw window (stride defaults to the kernel; padding counts as
    -inf), as PyTorch's max_pool2d; the gradient goes to each window's first maximum."""
    ip, shape = _window(x, kernel_size, stride, padding, "max_pool2d")
    return x.graph._node(MAX_POOL2D, (x.id, x.id), shape, ip=ip)


def avg_pool2d(x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None, padding: Pair = 0) -> Tensor:
    """The mean of each kh x kw window (stride defaults to the kernel; padding counts as 0
    and is counted, PyTorch's default count_include_pad=True)."""
    ip, shape = _window(x, kernel_size, stride, padding, "avg_pool2d")
    return x.graph._node(AVG_POOL2D, (x.id,), shape, ip=ip)


def max_pool2d_d(g: Tensor, x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None,
                 padding: Pair = 0) -> Tensor:
    """max_pool2d's gradient: g added at each window's first maximum of x."""
    ip, shape = _window(x, kernel_size, stride, padding, "max_pool2d_d")
    g = need_tensor(g, "max_pool2d_d")
    if g.shape != shape:
        raise GraphError(f"max_pool2d_d: gradient {g.label!r} {g.shape} must have the pooled shape {shape} of "
                         f"{x.label!r}")
    return g.graph._node(MAX_POOL2D_D, (g.id, x.id), x.shape, ip=ip)


def avg_pool2d_d(g: Tensor, size: Pair, kernel_size: Pair, stride: Union[None, Pair] = None,
                 padding: Pair = 0) -> Tensor:
    """avg_pool2d's gradient: g / (kh*kw) added over each window of an input of ``size`` (H, W)."""
    g = need_tensor(g, "avg_pool2d_d")
    shape = g.shape[:2] + int_pair(size, "avg_pool2d_d", "size", 1) if g.ndim == 4 else g.shape
    ip, pooled = _windows(shape, g.label, kernel_size, stride, padding, "avg_pool2d_d")
    if g.shape != pooled:
        raise GraphError(f"avg_pool2d_d: gradient {g.label!r} {g.shape} must have the pooled shape {pooled} of "
                         f"a {shape} input")
    return g.graph._node(AVG_POOL2D_D, (g.id,), shape, ip=ip)


@njit(cache=True, error_model="numpy")
def _first_max_row(key, base, h0, i0, i1, kw, sw, pw, W, OW, best, at):
    """For a row of windows (top row h0, taps i0..i1-1 down): ``at[ow]``, the plane position of
    the first maximal key (row-major) of window ow (a NaN wins), and ``best[ow]`` its key.
    Tap by tap across the row, so the loops vectorize; taps in the window-by-window search's
    order (i, then j), keeping a maximum only when a later one is greater: the same pick."""
    for t in range(U(OW)):
        at[t] = -1
    for i in range(i0, i1):
        for j in range(kw):
            c0, c1 = valid_columns(OW, W, sw, j - pw)
            pos0 = (h0 + i) * W + c0 * sw + j - pw           # the plane position of window c0's tap
            first, step = U(base + pos0), U(sw)
            for q in range(U(c1 - c0)):                      # unsigned: no wraparound test (windows.py)
                t = U(c0) + q
                k, b = key[first + step * q], best[t]
                take = (at[t] < 0) | (k > b) | ((k != k) & (b == b))
                best[t] = k if take else b
                at[t] = pos0 + sw * np.int64(q) if take else at[t]


@njit(cache=True, error_model="numpy")
def pool_kernel(mode, out, a, keys, same, H, W, OH, OW, p, lo, hi):
    """Planes [lo, hi) of a pooling (a: values; ``same`` when they are the keys) or of its
    gradient (a: the output's gradient, out: the input's), by ``mode``.  A pooling of values
    by their own keys and the average run a row of windows at a time, tap by tap, over
    slices indexed from 0 (vectorized); the max of a tap keeps the first maximum of equal
    ones, as the window-by-window search."""
    kh, kw, sh, sw = p[PoolIP.kernel_h], p[PoolIP.kernel_w], p[PoolIP.stride_h], p[PoolIP.stride_w]
    ph, pw = p[PoolIP.pad_h], p[PoolIP.pad_w]
    inv = 1.0 / (kh * kw)
    back = mode == MAX_D or mode == AVG_D
    best, where = np.empty(OW, keys.dtype), np.empty(OW, np.int64)     # a row of windows' maxima (_first_max_row)
    for u in range(lo, hi):
        img = out[u * H * W:(u + 1) * H * W] if back else out[u * OH * OW:(u + 1) * OH * OW]
        src = a[u * OH * OW:(u + 1) * OH * OW] if back else a[u * H * W:(u + 1) * H * W]
        if back:
            for t in range(H * W):
                img[t] = 0.0
        for oh in range(OH):
            h0 = oh * sh - ph
            i0, i1 = max(0, -h0), min(kh, H - h0)
            if mode == MAX_D or (mode == MAX and not same):
                _first_max_row(keys, u * H * W, h0, i0, i1, kw, sw, pw, W, OW, best, where)
                for ow in range(OW):       # in window order: a plane's gradient sums in one fixed order
                    if mode == MAX:
                        img[oh * OW + ow] = src[U(where[ow])]
                    else:
                        img[U(where[ow])] += src[oh * OW + ow]
                continue
            orow = img[oh * OW:(oh + 1) * OW] if not back else src[oh * OW:(oh + 1) * OW]
            if mode != AVG_D:
                fill = -np.inf if mode == MAX else 0.0
                for t in range(OW):
                    orow[t] = fill
            for i in range(i0, i1):
                xrow = (img if back else src)[(h0 + i) * W:(h0 + i + 1) * W]
                for j in range(kw):
                    c0, c1 = valid_columns(OW, W, sw, j - pw)
                    at = xrow[c0 * sw + j - pw:]
                    part = orow[c0:c1]
                    if mode == MAX:
                        for t in range(c1 - c0):
                            k = at[t * sw]
                            b = part[t]
                            part[t] = k if (k > b) | ((k != k) & (b == b)) else b
                    elif mode == AVG:
                        for t in range(c1 - c0):
                            part[t] += at[t * sw]
                    else:
                        for t in range(c1 - c0):
                            at[t * sw] += part[t] * inv
            if mode == AVG:
                for t in range(OW):
                    orow[t] *= inv
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _pool(v, n, lo, hi, mode):
    back = mode == MAX_D or mode == AVG_D
    s = v.shape[n] if back else v.shape[v.src[n, 0]]        # the input's (N, C, H, W)
    so = v.shape[v.src[n, 0]] if back else v.shape[n]       # the pooled (N, C, OH, OW)
    if lo < 0:
        v.ctx[RUN_EXTENT] = s[0] * s[1]
        return OK
    lo, hi = span(lo, hi, s[0] * s[1])
    a = operand(v, n, 0)
    keys = operand(v, n, 1) if mode == MAX or mode == MAX_D else a
    same = mode == AVG or mode == AVG_D or v.src[n, 0] == v.src[n, 1]
    return pool_kernel(mode, output(v, n), a, keys, same, s[2], s[3], so[2], so[3], v.ip[n], lo, hi)


def _run_max_pool2d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, MAX)


def _run_max_pool2d_d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, MAX_D)


def _run_avg_pool2d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, AVG)


def _run_avg_pool2d_d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, AVG_D)


defop(MAX_POOL2D, "max_pool2d", max_pool2d, _run_max_pool2d, arity=2, split=CUSTOM, sources=("x", "keys"), ip=PoolIP,
      vjp=lambda g, x, keys, out: (op.max_pool2d_d(g, keys, like=x, params_from=out), None))   # keys only choose
defop(MAX_POOL2D_D, "max_pool2d_d", max_pool2d_d, _run_max_pool2d_d, arity=2, public=False, split=CUSTOM,
      sources=("g", "keys"), ip=PoolIP,                       # linear in g: h picked at the same positions
      vjp=lambda h, g, keys, out: (op.max_pool2d(h, keys, like=g, params_from=out), None))
defop(AVG_POOL2D, "avg_pool2d", avg_pool2d, _run_avg_pool2d, arity=1, split=CUSTOM, ip=PoolIP,
      vjp=lambda g, x, out: op.avg_pool2d_d(g, like=x, params_from=out))
defop(AVG_POOL2D_D, "avg_pool2d_d", avg_pool2d_d, _run_avg_pool2d_d, arity=1, public=False, split=CUSTOM, ip=PoolIP,
      sources=("g",), vjp=lambda h, g, out: op.avg_pool2d(h, like=g, params_from=out))
