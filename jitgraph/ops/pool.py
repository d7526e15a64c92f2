"""Pooling: max_pool2d and avg_pool2d, each with a fused backward op.

Calling convention: NCHW; ip = (kh, kw, sh, sw, ph, pw); units of work are (image,
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
from typing import Sequence, Tuple, Union

from numba import njit

from ..emit import grad_node
from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, operand, output, rule_view, run_view, span
from ..registry import CUSTOM, defop
from ..status import NO_CONTRIBUTION, OK
from .common import need_tensor
from .conv import _pair, out_size

__all__ = ["max_pool2d", "avg_pool2d"]

MAX_POOL2D, MAX_POOL2D_D, AVG_POOL2D, AVG_POOL2D_D = 83, 84, 85, 86
MAX, MAX_D, AVG, AVG_D = 0, 1, 2, 3       # the kernel's modes

Pair = Union[int, Sequence[int]]


def _window(x: Tensor, kernel_size: Pair, stride: Union[None, Pair], padding: Pair, what: str) -> Tuple[tuple, tuple]:
    """(ip, output shape) of a pooling of x."""
    x = need_tensor(x, what)
    if x.ndim != 4:
        raise GraphError(f"{what}: input {x.label!r} {x.shape} must be 4-D (N, C, H, W)")
    k = _pair(kernel_size, what, "kernel_size", 1)
    s = k if stride is None else _pair(stride, what, "stride", 1)
    p = _pair(padding, what, "padding", 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise GraphError(f"{what}: padding {p} of {x.label!r} must be at most half the kernel {k}")
    N, C, H, W = x.shape
    OH, OW = out_size(H, k[0], s[0], p[0], 1), out_size(W, k[1], s[1], p[1], 1)
    if min(OH, OW) < 1:
        raise GraphError(f"{what}: the kernel {k} is larger than the padded input {x.label!r} {x.shape} "
                         f"(padding {p})")
    return k + s + p, (N, C, OH, OW)


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


def _gradient(code, what, g, x, kernel_size, stride, padding, srcs):
    ip, shape = _window(x, kernel_size, stride, padding, what)
    g = need_tensor(g, what)
    if g.shape != shape:
        raise GraphError(f"{what}: gradient {g.label!r} {g.shape} must have the pooled shape {shape} of {x.label!r}")
    return g.graph._node(code, srcs, x.shape, ip=ip)


def max_pool2d_d(g: Tensor, x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None,
                 padding: Pair = 0) -> Tensor:
    """max_pool2d's gradient: g added at each window's first maximum of x."""
    return _gradient(MAX_POOL2D_D, "max_pool2d_d", g, x, kernel_size, stride, padding, (g.id, x.id))


def avg_pool2d_d(g: Tensor, x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None,
                 padding: Pair = 0) -> Tensor:
    """avg_pool2d's gradient: g / (kh*kw) added over each window (x gives the input's shape)."""
    return _gradient(AVG_POOL2D_D, "avg_pool2d_d", g, x, kernel_size, stride, padding, (g.id,))


@njit(cache=True, error_model="numpy")
def pool_kernel(mode, out, a, keys, H, W, OH, OW, p, lo, hi):
    """Planes [lo, hi) of a pooling (a: values) or of its gradient (a: the output's gradient,
    out: the input's), by ``mode``."""
    kh, kw, sh, sw, ph, pw = p[0], p[1], p[2], p[3], p[4], p[5]
    inv = 1.0 / (kh * kw)
    back = mode == MAX_D or mode == AVG_D
    for u in range(lo, hi):
        img = out[u * H * W:(u + 1) * H * W] if back else out[u * OH * OW:(u + 1) * OH * OW]
        src = a[u * OH * OW:(u + 1) * OH * OW] if back else a[u * H * W:(u + 1) * H * W]
        key = keys[u * H * W:(u + 1) * H * W]
        if back:
            for t in range(H * W):
                img[t] = 0.0
        for oh in range(OH):
            h0 = oh * sh - ph
            i0, i1 = max(0, -h0), min(kh, H - h0)
            for ow in range(OW):
                w0 = ow * sw - pw
                j0, j1 = max(0, -w0), min(kw, W - w0)
                o = oh * OW + ow
                if mode == AVG:
                    acc = 0.0
                    for i in range(i0, i1):
                        for j in range(j0, j1):
                            acc += src[(h0 + i) * W + w0 + j]
                    img[o] = acc * inv
                elif mode == AVG_D:
                    share = src[o] * inv
                    for i in range(i0, i1):
                        for j in range(j0, j1):
                            img[(h0 + i) * W + w0 + j] += share
                else:
                    at = (h0 + i0) * W + w0 + j0
                    best = key[at]
                    for i in range(i0, i1):
                        for j in range(j0, j1):
                            k = key[(h0 + i) * W + w0 + j]
                            if k > best or (k != k and best == best):
                                best = k
                                at = (h0 + i) * W + w0 + j
                    if mode == MAX:
                        img[o] = src[at]
                    else:
                        img[at] += src[o]
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
    return pool_kernel(mode, output(v, n), a, keys, s[2], s[3], so[2], so[3], v.ip[n], lo, hi)


def _run_max_pool2d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, MAX)


def _run_max_pool2d_d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, MAX_D)


def _run_avg_pool2d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, AVG)


def _run_avg_pool2d_d(n, lo, hi, ctx, mem, store):
    return _pool(run_view(ctx, mem, store), n, lo, hi, AVG_D)


@njit(cache=True)
def pool_node(G, st, op, a, keys, like, n, k):
    """A pooling node of ``a`` (and ``keys``) with node n's params, shaped like ``like``."""
    t = grad_node(G, st, op, a, keys, like, n, k)
    for q in range(6):
        G.ip[t, q] = G.ip[n, q]
    return t


def _vjp_max_pool2d(n, k, g, ctx):              # the keys only choose: no gradient through them
    if k != 0:
        return NO_CONTRIBUTION
    G, st = rule_view(ctx)
    return pool_node(G, st, MAX_POOL2D_D, g, G.src[n, 1], G.src[n, 0], n, k)


def _vjp_max_pool2d_d(n, k, h, ctx):            # linear in g: h picked at the same positions
    if k != 0:
        return NO_CONTRIBUTION
    G, st = rule_view(ctx)
    return pool_node(G, st, MAX_POOL2D, h, G.src[n, 1], G.src[n, 0], n, k)


def _vjp_avg_pool2d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return pool_node(G, st, AVG_POOL2D_D, g, -1, G.src[n, 0], n, k)


def _vjp_avg_pool2d_d(n, k, h, ctx):
    G, st = rule_view(ctx)
    return pool_node(G, st, AVG_POOL2D, h, -1, G.src[n, 0], n, k)


defop(MAX_POOL2D, "max_pool2d", max_pool2d, _run_max_pool2d, _vjp_max_pool2d, arity=2, split=CUSTOM)
defop(MAX_POOL2D_D, "max_pool2d_d", max_pool2d_d, _run_max_pool2d_d, _vjp_max_pool2d_d, arity=2, public=False,
      split=CUSTOM)
defop(AVG_POOL2D, "avg_pool2d", avg_pool2d, _run_avg_pool2d, _vjp_avg_pool2d, arity=1, split=CUSTOM)
defop(AVG_POOL2D_D, "avg_pool2d_d", avg_pool2d_d, _run_avg_pool2d_d, _vjp_avg_pool2d_d, arity=1, public=False,
      split=CUSTOM)
