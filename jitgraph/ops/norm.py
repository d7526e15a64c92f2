"""layer_norm (with or without its affine weight and bias) and rms_norm over the last
axis, their fused backward kernels, and norm_rstd (the per-row 1/std that second
derivatives need).

Calling convention: units of work are rows of the last axis (split ROWS); eps is
fp[n, 0].  A row's mean and variance are computed in two passes with eight running
partials (vmath), in the graph's dtype.  The gradient of a norm is one node,
``layer_norm_d(g, x) = rstd (g - mean(g) - y mean(g y))`` (rms_norm_d without the
mean(g) term), recomputing the row statistics from x; its own rule gives second
order: the Jacobian J of a norm is symmetric, so through g it is ``norm_d(h, x)``,
and through x it is ``-(r^2/D)(h.a - m h.y) y - r m J h - (r/D)(h.y) J g`` (a the
centred g, m = mean(g y), r = rstd), written with the family's ops.
"""
import math
import numbers
from enum import IntEnum
from typing import Optional

import numpy as np
from numba import njit

from ..errors import GraphError
from ..graph import Tensor
from ..native import output, operand, run_view, span
from ..registry import (COMPUTE, ELEMENTS, LAYER_NORM, LAYER_NORM_AFFINE, LAYER_NORM_D, NORM_RSTD, RMS_NORM,
                        RMS_NORM_D, ROWS, defop, slots)
from ..rules import either, op
from ..status import OK
from ..reductions import dotdev8, sqdev8, sum8
from ..vmath import in_dtype_of
from .binary import add, mul
from .common import need_pair, need_tensor
from .reduce import rowmean, rowsum


class EpsFP(IntEnum):            # every op of the family
    eps = 0


class NormRstdIP(IntEnum):
    center = 0                   # 1: layer norm's 1/std; 0: rms norm's 1/rms


def _eps(eps: float, what: str) -> float:
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps >= 0 or math.isinf(eps):
        raise GraphError(f"{what}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _normed(code: int, what: str, t: Tensor, eps: float) -> Tensor:
    t = need_tensor(t, what)
    if t.ndim == 0:
        raise GraphError(f"{what} of {t.label!r}: needs at least 1 dim")
    return t.graph._node(code, (t.id,), t.shape, fp=slots(EpsFP, eps=_eps(eps, f"{what} of {t.label!r}")))


@njit(cache=True, error_model="numpy")
def row_stats(row, eps, center):
    """(mean, 1/std) of a row (mean 0 and 1/rms when not ``center``)."""
    d = in_dtype_of(row, row.size)
    mu = sum8(row) / d if center else in_dtype_of(row, 0.0)
    return mu, in_dtype_of(row, 1.0) / np.sqrt(sqdev8(row, mu) / d + in_dtype_of(row, eps))


# ---- layer_norm and rms_norm ----------------------------------------------------------------------
def layer_norm(t: Tensor, eps: float = 1e-5, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> Tensor:
    """(t - mean) / sqrt(var + eps) over the last axis, then ``* weight + bias`` when given
    (tensors of shape (last dim,), PyTorch's elementwise affine).  With both, one fused node
    (its backward keeps only t, not the normalized rows); with one, a mul or an add node."""
    t = need_tensor(t, "layer_norm")
    d = t.shape[-1:]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (not isinstance(p, Tensor) or p.shape != d or p.graph is not t.graph):
            raise GraphError(f"layer_norm of {t.label!r}: {name} must be a tensor of its graph with shape {d}, "
                             f"got {getattr(p, 'label', p)!r} {getattr(p, 'shape', '')}")
    if weight is not None and bias is not None:
        return layer_norm_affine(t, weight, bias, eps)
    y = _normed(LAYER_NORM, "layer_norm", t, eps)
    if weight is not None:
        y = mul(y, weight)
    if bias is not None:
        y = add(y, bias)
    return y


def layer_norm_affine(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """layer_norm(t, eps) * weight + bias as one node; weight and bias of shape (last dim,)."""
    t = need_tensor(t, "layer_norm_affine")
    for name, p in (("weight", weight), ("bias", bias)):
        p = need_tensor(p, f"layer_norm_affine of {t.label!r}")
        if t.ndim == 0 or p.shape != t.shape[-1:] or p.graph is not t.graph:
            raise GraphError(f"layer_norm_affine of {t.label!r} {t.shape}: {name} {p.label!r} {p.shape} must be "
                             f"a tensor of its graph shaped like its last axis")
    return t.graph._node(LAYER_NORM_AFFINE, (t.id, weight.id, bias.id), t.shape,
                         fp=slots(EpsFP, eps=_eps(eps, f"layer_norm of {t.label!r}")))


def rms_norm(t: Tensor, eps: float = 1e-6) -> Tensor:
    """t / sqrt(mean(t^2) + eps) over the last axis."""
    return _normed(RMS_NORM, "rms_norm", t, eps)


@njit(cache=True, error_model="numpy")
def norm_rows(out, x, d, eps, center, lo, hi):
    """layer_norm (center) or rms_norm of rows [lo, hi)."""
    for r in range(lo, hi):
        y = out[r * d:(r + 1) * d]            # slices indexed from 0 vectorize (see binary._run)
        xs = x[r * d:(r + 1) * d]
        mu, rstd = row_stats(xs, eps, center)
        for j in range(d):
            y[j] = (xs[j] - mu) * rstd
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _norm(v, n, lo, hi, center):
    out = output(v, n)
    d = v.shape[n, 3]
    lo, hi = span(lo, hi, out.size // d)
    return norm_rows(out, operand(v, n, 0), d, v.fp[n, EpsFP.eps], center, lo, hi)


def _run_layer_norm(n, lo, hi, ctx, mem, store):
    return _norm(run_view(ctx, mem, store), n, lo, hi, True)


defop(LAYER_NORM, "layer_norm", layer_norm, _run_layer_norm, arity=1, cost=COMPUTE, flops=8, split=ROWS, fp=EpsFP,
      vjp=lambda g, x, eps: op.layer_norm_d(g, x, like=x, eps=eps))


def _run_rms_norm(n, lo, hi, ctx, mem, store):
    return _norm(run_view(ctx, mem, store), n, lo, hi, False)


defop(RMS_NORM, "rms_norm", rms_norm, _run_rms_norm, arity=1, cost=COMPUTE, flops=6, split=ROWS, fp=EpsFP,
      vjp=lambda g, x, eps: op.rms_norm_d(g, x, like=x, eps=eps))


# ---- layer_norm with its affine, fused --------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def norm_affine_rows(out, x, w, b, d, eps, lo, hi):
    for r in range(lo, hi):
        y = out[r * d:(r + 1) * d]
        xs = x[r * d:(r + 1) * d]
        mu, rstd = row_stats(xs, eps, True)
        for j in range(d):
            y[j] = (xs[j] - mu) * rstd * w[j] + b[j]
    return OK


def _run_layer_norm_affine(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    d = v.shape[n, 3]
    lo, hi = span(lo, hi, out.size // d)
    return norm_affine_rows(out, operand(v, n, 0), operand(v, n, 1), operand(v, n, 2), d, v.fp[n, EpsFP.eps], lo, hi)


def _norm_affine_vjp(g, x, weight, eps):
    """x: layer_norm_d(g * weight, x); weight: g * layer_norm(x) (recomputed from x, so the
    forward keeps no normalized rows); bias: g.  Weight and bias are summed down to (D,) by
    the backward pass, as every broadcast operand is."""
    return op.layer_norm_d(g * weight, x, like=x, eps=eps), g * op.layer_norm(x, like=x, eps=eps), g


defop(LAYER_NORM_AFFINE, "layer_norm_affine", layer_norm_affine, _run_layer_norm_affine, _norm_affine_vjp,
      arity=3, cost=COMPUTE, flops=10, split=ROWS, public=False, sources=("x", "weight", "bias"), fp=EpsFP)


# ---- the fused gradients --------------------------------------------------------------------------
def _norm_d(code: int, what: str, g: Tensor, x: Tensor, eps: float) -> Tensor:
    g, x = need_pair(what, g, x, min_ndim=1)
    return x.graph._node(code, (g.id, x.id), x.shape, fp=slots(EpsFP, eps=_eps(eps, f"{what} of {x.label!r}")))


def layer_norm_d(g: Tensor, x: Tensor, eps: float = 1e-5) -> Tensor:
    """layer_norm's vector-Jacobian product at x: rstd (g - mean(g) - y mean(g y))."""
    return _norm_d(LAYER_NORM_D, "layer_norm_d", g, x, eps)


def rms_norm_d(g: Tensor, x: Tensor, eps: float = 1e-6) -> Tensor:
    """rms_norm's vector-Jacobian product at x: rrms (g - y mean(g y))."""
    return _norm_d(RMS_NORM_D, "rms_norm_d", g, x, eps)


@njit(cache=True, error_model="numpy")
def norm_d_rows(out, g, x, d, eps, center, lo, hi):
    dd = in_dtype_of(x, d)
    for r in range(lo, hi):
        o = out[r * d:(r + 1) * d]
        gs = g[r * d:(r + 1) * d]
        xs = x[r * d:(r + 1) * d]
        mu, rstd = row_stats(xs, eps, center)
        mg = sum8(gs) / dd if center else in_dtype_of(x, 0.0)
        mgy = dotdev8(gs, xs, mu) * rstd / dd          # mean(g y), y = (x - mu) rstd
        for j in range(d):
            o[j] = rstd * (gs[j] - mg - (xs[j] - mu) * rstd * mgy)
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _norm_d_run(v, n, lo, hi, center):
    out = output(v, n)
    d = v.shape[n, 3]
    lo, hi = span(lo, hi, out.size // d)
    return norm_d_rows(out, operand(v, n, 0), operand(v, n, 1), d, v.fp[n, EpsFP.eps], center, lo, hi)


def _norm_d_vjp(center):
    """The rule of norm_d(g, x), see the module docstring: through g, norm_d(h, x); through
    x, -(r^2/D)(h.a - m h.y) y - r m J h - (r/D)(h.y) J g, each slot building its own J h."""
    def rule(h, g, x, out, eps):
        norm_d, norm = (op.layer_norm_d, op.layer_norm) if center else (op.rms_norm_d, op.rms_norm)
        jh = norm_d(h, x, like=x, eps=eps)
        jh_x = norm_d(h, x, like=x, eps=eps)
        y = norm(x, like=x, eps=eps)
        r = op.norm_rstd(x, like=x, dims={3: 1}, center=int(center), eps=eps)
        a = g - rowmean(g, x, 3) if center else g
        ha = rowsum(h * a, x, 3)
        hy = rowsum(h * y, x, 3)
        m = rowmean(g * y, x, 3)
        r2 = op.sqr(r)
        t1 = (-1.0 / x.shape[3]) * ((ha - m * hy) * r2) * y
        t2 = r * m * jh_x
        t3 = (1.0 / x.shape[3]) * (r * hy) * out
        return jh, t1 - t2 - t3
    return rule


def _run_layer_norm_d(n, lo, hi, ctx, mem, store):
    return _norm_d_run(run_view(ctx, mem, store), n, lo, hi, True)


defop(LAYER_NORM_D, "layer_norm_d", layer_norm_d, _run_layer_norm_d, _norm_d_vjp(True), arity=2, cost=COMPUTE,
      flops=10, split=ROWS, public=False, sources=("g", "x"), fp=EpsFP)


def _run_rms_norm_d(n, lo, hi, ctx, mem, store):
    return _norm_d_run(run_view(ctx, mem, store), n, lo, hi, False)


defop(RMS_NORM_D, "rms_norm_d", rms_norm_d, _run_rms_norm_d, _norm_d_vjp(False), arity=2, cost=COMPUTE, flops=8,
      split=ROWS, public=False, sources=("g", "x"), fp=EpsFP)


# ---- norm_rstd: 1/std or 1/rms per row --------------------------------------------------------------
def norm_rstd(t: Tensor, eps: float, center: bool) -> Tensor:
    """Per row of the last axis: 1/std (``center``, layer norm) or 1/rms; shape (..., 1)."""
    t = need_tensor(t, "norm_rstd")
    return t.graph._node(NORM_RSTD, (t.id,), t.shape[:-1] + (1,), ip=slots(NormRstdIP, center=int(bool(center))),
                         fp=slots(EpsFP, eps=_eps(eps, f"norm_rstd of {t.label!r}")))


@njit(cache=True, error_model="numpy")
def norm_rstd_rows(out, x, d, eps, center, lo, hi):
    for r in range(lo, hi):
        out[r] = row_stats(x[r * d:(r + 1) * d], eps, center)[1]
    return OK


def _run_norm_rstd(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    return norm_rstd_rows(out, operand(v, n, 0), v.shape[v.src[n, 0], 3], v.fp[n, EpsFP.eps],
                          v.ip[n, NormRstdIP.center] != 0, lo, hi)


def _norm_rstd_vjp(g, x, out, center, eps):
    """d rstd / dx = -rstd^2 norm(x) / D."""
    t = (-1.0 / x.shape[3]) * (g * op.sqr(out))
    return either(center, op.layer_norm(x, like=x, eps=eps), op.rms_norm(x, like=x, eps=eps)) * t


defop(NORM_RSTD, "norm_rstd", norm_rstd, _run_norm_rstd, _norm_rstd_vjp, arity=1, cost=COMPUTE, flops=4,
      split=ELEMENTS, public=False, ip=NormRstdIP, fp=EpsFP)
