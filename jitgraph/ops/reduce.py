"""Reductions over axes (sum, mean, max) and their dual, broadcast.

A reduction carries a bit mask of reduced axes in the kernels' padded 4-dim
space (ip[0]).  Its output is contiguous over the kept axes in order, so the same
node serves ``keepdims`` either way and a sum back to a broadcast operand's
shape is just a SUM whose output shape is that operand's.  BROADCAST is the
exact inverse mapping (same mask, over the *output's* axes).
"""
import math

import numpy as np
from numba import njit

from .._sigs import G as G_T, ST, i64
from ..emit import new_node
from ..errors import GraphError
from ..graph import check_shape
from ..ir import F_GRAD
from ..registry import COMPUTE, MEMORY, OTHER, defop
from .common import KERNEL, broadcast_mask, need_tensor, normalize_axes, padded_mask
from .elementwise import AFFINE, MUL, NO_CONTRIBUTION, NO_RULE

SUM = defop("sum", 1, OTHER, COMPUTE)
MEAN = defop("mean", 1, OTHER, COMPUTE)
MAX = defop("max", 1, OTHER, COMPUTE)
BROADCAST = defop("broadcast", 1, OTHER, MEMORY)
MAX_MASK = defop("max_mask", 1, OTHER, COMPUTE)   # 1 at the first max of each group (max')
FIRST_OP, LAST_OP = SUM, MAX_MASK


# ---- Python shape rules -----------------------------------------------------------
def _reduce(code, what, t, axis, keepdims):
    t = need_tensor(t, what)
    shape = t.shape
    axes = normalize_axes(axis, len(shape), f"{what} of {t.label!r}")
    if keepdims:
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    count = 1
    for a in axes:
        count *= shape[a]
    fp = (1.0 / count,) if code == MEAN else ()
    return t.graph._node(code, (t.id,), out, ip=(padded_mask(axes, len(shape)),), fp=fp)


def sum_(t, axis=None, keepdims=False):
    """Sum over ``axis`` (None: all; int or tuple), like numpy."""
    return _reduce(SUM, "sum", t, axis, keepdims)


def mean(t, axis=None, keepdims=False):
    return _reduce(MEAN, "mean", t, axis, keepdims)


def max_(t, axis=None, keepdims=False):
    """Max over ``axis``.  Its gradient goes to the first maximal element (row-major)."""
    return _reduce(MAX, "max", t, axis, keepdims)


def broadcast_to(t, shape):
    """``t`` repeated along new or size-1 axes to ``shape`` (numpy rules)."""
    t = need_tensor(t, "broadcast_to")
    shape = check_shape(shape, f"broadcast_to of {t.label!r}")
    src = t.shape
    if len(src) > len(shape) or any(s not in (1, d) for s, d in zip(src[::-1], shape[::-1])):
        raise GraphError(f"broadcast_to: {t.label!r} of shape {src} cannot broadcast to {shape}")
    if src == shape:
        return t
    return t.graph._node(BROADCAST, (t.id,), shape, ip=(broadcast_mask(src, shape),))


# ---- kernels ------------------------------------------------------------------------
@njit(**KERNEL)
def reduce_strides(s, mask):
    """Strides into the reduced tensor for each axis of padded big shape s (0 if reduced)."""
    r = 1
    s3 = 0
    if not (mask >> 3) & 1:
        s3 = r
        r *= s[3]
    s2 = 0
    if not (mask >> 2) & 1:
        s2 = r
        r *= s[2]
    s1 = 0
    if not (mask >> 1) & 1:
        s1 = r
        r *= s[1]
    s0 = 0
    if not mask & 1:
        s0 = r
    return s0, s1, s2, s3


@njit(**KERNEL)
def sum_kernel(out, x, sx, mask, scale):
    """out = scale * sum of x over the masked axes (float64 accumulation within rows)."""
    if out.size == 1:
        acc = 0.0
        for i in range(x.size):
            acc += x[i]
        out[0] = acc * scale
        return
    for i in range(out.size):
        out[i] = 0.0
    t0, t1, t2, t3 = reduce_strides(sx, mask)
    n3 = sx[3]
    i = 0
    for i0 in range(sx[0]):
        for i1 in range(sx[1]):
            for i2 in range(sx[2]):
                o = i0 * t0 + i1 * t1 + i2 * t2
                if t3 == 0:
                    acc = 0.0
                    for j in range(n3):
                        acc += x[i + j]
                    out[o] += acc
                else:
                    for j in range(n3):
                        out[o + j] += x[i + j]
                i += n3
    if scale != 1.0:
        for k in range(out.size):
            out[k] *= scale


@njit(**KERNEL)
def max_kernel(out, x, sx, mask):
    """out = max of x over the masked axes; NaN propagates."""
    for i in range(out.size):
        out[i] = -np.inf
    t0, t1, t2, t3 = reduce_strides(sx, mask)
    n3 = sx[3]
    i = 0
    for i0 in range(sx[0]):
        for i1 in range(sx[1]):
            for i2 in range(sx[2]):
                o = i0 * t0 + i1 * t1 + i2 * t2
                for j in range(n3):
                    v = x[i + j]
                    k = o + j * t3
                    m = out[k]
                    if v > m or (v != v and m == m):
                        out[k] = v
                i += n3


@njit(**KERNEL)
def broadcast_kernel(out, x, so, mask):
    """out (padded shape so) = x repeated along the masked axes of so."""
    t0, t1, t2, t3 = reduce_strides(so, mask)
    n3 = so[3]
    i = 0
    for i0 in range(so[0]):
        for i1 in range(so[1]):
            for i2 in range(so[2]):
                o = i0 * t0 + i1 * t1 + i2 * t2
                if t3 == 0:
                    v = x[o]
                    for j in range(n3):
                        out[i + j] = v
                else:
                    for j in range(n3):
                        out[i + j] = x[o + j]
                i += n3


@njit(**KERNEL)
def max_mask_kernel(out, x, sx, mask):
    """1.0 at the first (row-major) maximal element of each reduced group, else 0."""
    for i in range(out.size):
        out[i] = 0.0
    c3 = 1
    c2 = sx[3]
    c1 = c2 * sx[2]
    c0 = c1 * sx[1]
    n_kept = 1
    n_red = 1
    for d in range(4):
        if (mask >> d) & 1:
            n_red *= sx[d]
        else:
            n_kept *= sx[d]
    for gk in range(n_kept):
        base = 0
        rem = gk
        for d in range(3, -1, -1):
            if not (mask >> d) & 1:
                idx = rem % sx[d]
                rem //= sx[d]
                base += idx * (c3 if d == 3 else (c2 if d == 2 else (c1 if d == 1 else c0)))
        best = -math.inf
        best_at = -1
        for gr in range(n_red):
            off = base
            rem = gr
            for d in range(3, -1, -1):
                if (mask >> d) & 1:
                    idx = rem % sx[d]
                    rem //= sx[d]
                    off += idx * (c3 if d == 3 else (c2 if d == 2 else (c1 if d == 1 else c0)))
            v = x[off]
            if best_at < 0 or v > best or (v != v and best == best):
                best = v
                best_at = off
        out[best_at] = 1.0


# ---- gradient rules (see elementwise.vjp) -------------------------------------------
@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64), cache=True)
def _masked(G, st, op, a, like, mask, n, k):
    t = new_node(G, st, op, a, -1, like, F_GRAD, n, k)
    G[4][t, 0] = mask
    return t


@njit(cache=True)
def vjp(G, st, n, k, g):
    code = G[0][n]
    x = G[1][n, 0]
    mask = G[4][n, 0]
    if code == SUM:                                   # g repeated over the reduced axes
        return _masked(G, st, BROADCAST, g, x, mask, n, k)
    if code == MEAN:                                  # (g / count) repeated
        t = new_node(G, st, AFFINE, g, -1, g, F_GRAD, n, k)
        G[5][t, 0] = G[5][n, 0]
        return _masked(G, st, BROADCAST, t, x, mask, n, k)
    if code == MAX:                                   # g to the first maximal element of each group
        b = _masked(G, st, BROADCAST, g, x, mask, n, k)
        m = _masked(G, st, MAX_MASK, x, x, mask, n, k)
        return new_node(G, st, MUL, b, m, x, F_GRAD, n, k)
    if code == BROADCAST:                             # summed back over the repeated axes
        return _masked(G, st, SUM, g, x, mask, n, k)
    if code == MAX_MASK:
        return NO_CONTRIBUTION
    return NO_RULE
