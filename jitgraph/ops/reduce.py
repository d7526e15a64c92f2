"""Reductions over axes (sum, mean, max, argmax) and their dual, broadcast.

A reduction carries a bit mask of reduced axes in the kernels' padded 4-dim
space (ip[0]).  Its output is contiguous over the kept axes in order, so the same
node serves ``keepdims`` either way and a sum back to a broadcast operand's
shape is just a SUM whose output shape is that operand's.  BROADCAST is the
exact inverse mapping (same mask, over the *output's* axes).
"""
import math
from enum import IntEnum
from typing import Any, Optional, Sequence, Union

import numpy as np
from numba import njit

from ..errors import GraphError
from ..graph import Tensor, check_shape
from ..ir import MAX_DIMS
from ..native import RUN_EXTENT, operand, output, run_view, span
from ..registry import ARGMAX, BROADCAST, COMPUTE, CUSTOM, MAX, MAX_MASK, MEAN, ROWS, SUM, ZERO_GRAD, defop, slots
from ..rules import Sym, op
from ..status import OK
from ..reductions import sum8_f64
from ..vmath import in_dtype_of
from .common import broadcast_mask, need_tensor, normalize_axes, normalize_axis, padded_mask
from .shape import outer_inner

Axis = Optional[Union[int, Sequence[int]]]


class ReduceIP(IntEnum):        # sum, mean, max, broadcast, max_mask
    axes = 0                    # bit mask of the reduced (broadcast's: repeated) axes, padded space


class MeanFP(IntEnum):
    scale = 0                   # 1 / the number of values a mean sums


class ArgmaxIP(IntEnum):
    axis = 0                    # padded


def rowsum(t: Sym, like: Sym, axis: Any) -> Sym:
    """In a rule: the sum of ``t`` over padded ``axis``, kept as size 1 (shaped like ``like``)."""
    return op.sum(t, like=like, dims={axis: 1}, axes=1 << axis)


def rowmean(t: Sym, like: Sym, axis: Any) -> Sym:
    """In a rule: the mean of ``t`` over padded ``axis``, kept as size 1."""
    return op.mean(t, like=like, dims={axis: 1}, axes=1 << axis, scale=1.0 / like.shape[axis])


# ---- the family's calling convention: ip[n, ReduceIP.axes] = mask of reduced axes (padded space) ----
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
    fp = slots(MeanFP, scale=1.0 / count) if code == MEAN else ()
    return t.graph._node(code, (t.id,), out, ip=slots(ReduceIP, axes=padded_mask(axes, len(shape))), fp=fp)


# ---- kernels ------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
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


LAYOUT_OTHER, LAYOUT_LEADING, LAYOUT_TRAILING = 0, 1, 2
# A sum over leading axes (a bias gradient: x (R, C) down its columns) adds whole rows of x
# into the output; split into strips of a few columns, each strip reads x at a stride and
# ran 2-5x slower than one pass (measured at C = 128 and 512), so it splits only into strips
# this wide.  Every column is still summed by one call in row order: the bits never change.
LEADING_COLS = 1024


@njit(cache=True, error_model="numpy")
def layout(sx, mask):
    """How the reduced axes lie in padded shape sx (size-1 axes count as either):
    LEADING -- all before the kept ones (x is (R, C), sums down columns: a bias
    gradient); TRAILING -- all after (x is (C, R), sums along rows); else OTHER."""
    last_reduced = -1
    first_kept = 4
    last_kept = -1
    first_reduced = 4
    for d in range(4):
        if sx[d] == 1:
            continue
        if (mask >> d) & 1:
            last_reduced = d
            first_reduced = min(first_reduced, d)
        else:
            first_kept = min(first_kept, d)
            last_kept = d
    if last_reduced < first_kept:
        return LAYOUT_LEADING
    if last_kept < first_reduced:
        return LAYOUT_TRAILING
    return LAYOUT_OTHER


@njit(cache=True, error_model="numpy")
def sum_kernel(out, x, sx, mask, scale, lo, hi):
    """out = scale * sum of x over the masked axes, for output elements [lo, hi) when
    the layout is LEADING or TRAILING (each output element is summed by one call, so
    splitting them over threads changes nothing); float64 sums along rows."""
    how = layout(sx, mask) if out.size > 1 else LAYOUT_TRAILING
    C = out.size
    R = x.size // C
    if how == LAYOUT_LEADING:                 # columns: vectorized over [lo, hi)
        y = out[lo:hi]                        # slices from 0 (see binary._run)
        m = hi - lo
        first = x[lo:hi]
        for c in range(m):
            y[c] = first[c]
        for r in range(1, R):
            row = x[r * C + lo:r * C + hi]
            for c in range(m):
                y[c] += row[c]
        if scale != 1.0:
            sc = in_dtype_of(out, scale)
            for c in range(m):
                y[c] *= sc
        return OK
    if how == LAYOUT_TRAILING:
        for c in range(lo, hi):
            out[c] = sum8_f64(x[c * R:(c + 1) * R]) * scale
        return OK
    for i in range(out.size):                 # anything else: one call does it all
        out[i] = 0.0
    t0, t1, t2, t3 = reduce_strides(sx, mask)
    n3 = sx[3]
    i = 0
    for i0 in range(sx[0]):
        for i1 in range(sx[1]):
            for i2 in range(sx[2]):
                o = i0 * t0 + i1 * t1 + i2 * t2
                if t3 == 0:
                    out[o] += sum8_f64(x[i:i + n3])
                else:
                    for j in range(n3):
                        out[o + j] += x[i + j]
                i += n3
    if scale != 1.0:
        for k in range(out.size):
            out[k] *= scale
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def run_sum(v, n, lo, hi, scale):
    """The runner of sum and mean (split CUSTOM: units are output elements, when the
    layout lets each be summed on its own)."""
    out = output(v, n)
    s0 = v.src[n, 0]
    sx = v.shape[s0]
    mask = v.ip[n, ReduceIP.axes]
    how = layout(sx, mask) if out.size > 1 else LAYOUT_OTHER
    if how == LAYOUT_LEADING:             # strips of columns, each at least LEADING_COLS wide
        units = out.size // LEADING_COLS if out.size >= 2 * LEADING_COLS else 1
    else:
        units = out.size if how == LAYOUT_TRAILING else 1
    if lo < 0:
        v.ctx[RUN_EXTENT] = units
        return OK
    if units == 1:
        lo, hi = 0, out.size
    else:
        lo, hi = span(lo, hi, units)
        if how == LAYOUT_LEADING:         # strip k holds columns [k C / units, (k + 1) C / units)
            lo, hi = lo * out.size // units, hi * out.size // units
    return sum_kernel(out, operand(v, n, 0), sx, mask, scale, lo, hi)


@njit(cache=True, error_model="numpy")
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
    return OK


@njit(cache=True, error_model="numpy")
def broadcast_kernel(out, x, so, mask, lo, hi):
    """Rows [lo, hi) of out (padded shape so): x repeated along the masked axes of so."""
    t0, t1, t2, t3 = reduce_strides(so, mask)
    n3 = so[3]
    for r in range(lo, hi):
        i2 = r % so[2]
        q = r // so[2]
        o = (q // so[1]) * t0 + (q % so[1]) * t1 + i2 * t2
        y = out[r * n3:(r + 1) * n3]
        if t3 == 0:
            c = x[o]
            for j in range(n3):
                y[j] = c
        else:
            xs = x[o:o + n3]
            for j in range(n3):
                y[j] = xs[j]
    return OK


@njit(cache=True, error_model="numpy")
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
    return OK


# ---- sum ------------------------------------------------------------------------------------------
def sum(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:    # noqa: A001
    """Sum over ``axis`` (None: all; int or tuple), like numpy."""
    return _reduce(SUM, "sum", t, axis, keepdims)


def _run_sum(n, lo, hi, ctx, mem, store):
    return run_sum(run_view(ctx, mem, store), n, lo, hi, 1.0)


defop(SUM, "sum", sum, _run_sum, arity=1, cost=COMPUTE, split=CUSTOM, ip=ReduceIP,
      vjp=lambda g, x, axes: op.broadcast(g, like=x, axes=axes))      # g repeated over the reduced axes


# ---- mean -----------------------------------------------------------------------------------------
def mean(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis`` (None: all; int or tuple), like numpy."""
    return _reduce(MEAN, "mean", t, axis, keepdims)


def _run_mean(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return run_sum(v, n, lo, hi, v.fp[n, MeanFP.scale])


defop(MEAN, "mean", mean, _run_mean, arity=1, cost=COMPUTE, split=CUSTOM, ip=ReduceIP, fp=MeanFP,
      vjp=lambda g, x, axes, scale: op.broadcast(scale * g, like=x, axes=axes))


# ---- max ------------------------------------------------------------------------------------------
def max(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:    # noqa: A001
    """Max over ``axis``.  Its gradient goes to the first maximal element (row-major)."""
    return _reduce(MAX, "max", t, axis, keepdims)


def _run_max(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return max_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.ip[n, ReduceIP.axes])


defop(MAX, "max", max, _run_max, arity=1, cost=COMPUTE, ip=ReduceIP,           # to the first maximum of each group
      vjp=lambda g, x, axes: op.broadcast(g, like=x, axes=axes) * op.max_mask(x, like=x, axes=axes))


# ---- broadcast: the inverse of sum ---------------------------------------------------------------
def broadcast_to(t: Tensor, shape: Sequence[int]) -> Tensor:
    """``t`` repeated along new or size-1 axes to ``shape`` (numpy rules)."""
    t = need_tensor(t, "broadcast_to")
    shape = check_shape(shape, f"broadcast_to of {t.label!r}")
    src = t.shape
    if len(src) > len(shape) or any(s not in (1, d) for s, d in zip(src[::-1], shape[::-1])):
        raise GraphError(f"broadcast_to: {t.label!r} of shape {src} cannot broadcast to {shape}")
    if src == shape:
        return t
    return t.graph._node(BROADCAST, (t.id,), shape, ip=slots(ReduceIP, axes=broadcast_mask(src, shape)))


def _run_broadcast(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    so = v.shape[n]
    lo, hi = span(lo, hi, so[0] * so[1] * so[2])
    return broadcast_kernel(output(v, n), operand(v, n, 0), so, v.ip[n, ReduceIP.axes], lo, hi)


defop(BROADCAST, "broadcast", broadcast_to, _run_broadcast, arity=1, split=ROWS, ip=ReduceIP,
      vjp=lambda g, x, axes: op.sum(g, like=x, axes=axes))      # summed back over the repeated axes


# ---- max_mask: max's derivative ------------------------------------------------------------------
def max_mask(t: Tensor, axis: Axis = None) -> Tensor:
    """1.0 at the first (row-major) maximal element of each group reduced by ``axis``, else 0."""
    t = need_tensor(t, "max_mask")
    axes = normalize_axes(axis, t.ndim, f"max_mask of {t.label!r}")
    return t.graph._node(MAX_MASK, (t.id,), t.shape, ip=slots(ReduceIP, axes=padded_mask(axes, t.ndim)))


def _run_max_mask(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return max_mask_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.ip[n, ReduceIP.axes])


defop(MAX_MASK, "max_mask", max_mask, _run_max_mask, ZERO_GRAD, arity=1, cost=COMPUTE, public=False, ip=ReduceIP)


# ---- argmax ------------------------------------------------------------------------------------------
def argmax(t: Tensor, axis: Optional[int] = None, keepdims: bool = False) -> Tensor:
    """Position of the first maximum along ``axis`` (None: in the flattened tensor), as
    numpy.argmax: a NaN counts as the maximum.  The positions are floats of the graph's
    dtype (exact below 2**24 in float32); no gradient flows through them."""
    t = need_tensor(t, "argmax")
    if t.ndim == 0:
        raise GraphError(f"argmax of {t.label!r}: needs at least 1 dim")
    if axis is None:
        flat = t.reshape(-1) if t.ndim > 1 else t
        out = argmax(flat, 0)
        return out.reshape((1,) * t.ndim) if keepdims else out
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise GraphError(f"argmax of {t.label!r}: axis must be an int or None, got {axis!r}")
    ax = normalize_axis(int(axis), t.ndim, f"argmax of {t.label!r}")
    shape = tuple(1 if i == ax else d for i, d in enumerate(t.shape)) if keepdims else \
        tuple(d for i, d in enumerate(t.shape) if i != ax)
    return t.graph._node(ARGMAX, (t.id,), shape, ip=slots(ArgmaxIP, axis=ax + MAX_DIMS - t.ndim))


@njit(cache=True, error_model="numpy")
def argmax_kernel(out, x, sx, axis):
    outer, inner = outer_inner(sx, axis)
    m = sx[axis]
    for line in range(outer * inner):
        b = (line // inner) * m * inner + line % inner
        best = x[b]
        k = 0
        j = 1
        while j < m and best == best:                # a NaN is the maximum: stop at the first
            v = x[b + j * inner]
            if v > best or v != v:
                best = v
                k = j
            j += 1
        out[line] = k
    return OK


def _run_argmax(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return argmax_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.ip[n, ArgmaxIP.axis])


defop(ARGMAX, "argmax", argmax, _run_argmax, ZERO_GRAD, arity=1, ip=ArgmaxIP)
