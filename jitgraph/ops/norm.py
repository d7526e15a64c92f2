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
from typing import Optional

import numpy as np
from numba import njit

from ..emit import grad_node
from ..errors import GraphError
from ..graph import Tensor
from ..native import output, operand, rule_view, run_view, span
from ..registry import COMPUTE, ELEMENTS, ROWS, defop
from ..status import OK
from ..vmath import dotdev8, in_dtype_of, sqdev8, sum8
from .binary import MUL, SUB, add, mul, scaled
from .common import need_pair, need_tensor
from .reduce import MEAN, SUM, row_reduce
from .unary import SQR


LAYER_NORM, RMS_NORM, NORM_RSTD = 41, 42, 43
LAYER_NORM_D, RMS_NORM_D = 51, 52
LAYER_NORM_AFFINE = 87


def _eps(eps: float, what: str) -> float:
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps >= 0 or math.isinf(eps):
        raise GraphError(f"{what}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _normed(code: int, what: str, t: Tensor, eps: float) -> Tensor:
    t = need_tensor(t, what)
    if t.ndim == 0:
        raise GraphError(f"{what} of {t.label!r}: needs at least 1 dim")
    return t.graph._node(code, (t.id,), t.shape, fp=(_eps(eps, f"{what} of {t.label!r}"),))


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
                         fp=(_eps(eps, f"layer_norm of {t.label!r}"),))


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
    return norm_rows(out, operand(v, n, 0), d, v.fp[n, 0], center, lo, hi)


def _run_layer_norm(n, lo, hi, ctx, mem, store):
    return _norm(run_view(ctx, mem, store), n, lo, hi, True)


@njit(cache=True)
def norm_grad_node(G, st, op, g, x, eps, n, k):
    t = grad_node(G, st, op, g, x, x, n, k)
    G.fp[t, 0] = eps
    return t


def _vjp_layer_norm(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_grad_node(G, st, LAYER_NORM_D, g, G.src[n, 0], G.fp[n, 0], n, k)


defop(LAYER_NORM, "layer_norm", layer_norm, _run_layer_norm, _vjp_layer_norm, arity=1, cost=COMPUTE, flops=8,
      split=ROWS)


def _run_rms_norm(n, lo, hi, ctx, mem, store):
    return _norm(run_view(ctx, mem, store), n, lo, hi, False)


def _vjp_rms_norm(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_grad_node(G, st, RMS_NORM_D, g, G.src[n, 0], G.fp[n, 0], n, k)


defop(RMS_NORM, "rms_norm", rms_norm, _run_rms_norm, _vjp_rms_norm, arity=1, cost=COMPUTE, flops=6, split=ROWS)


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
    return norm_affine_rows(out, operand(v, n, 0), operand(v, n, 1), operand(v, n, 2), d, v.fp[n, 0], lo, hi)


@njit(cache=True)
def norm_affine_vjp(G, st, n, k, g):
    """x: layer_norm_d(g * weight, x); weight: g * layer_norm(x) (recomputed from x, so the
    forward keeps no normalized rows); bias: g.  Weight and bias are summed down to (D,) by
    the backward pass, as every broadcast operand is."""
    x = G.src[n, 0]
    eps = G.fp[n, 0]
    if k == 2:
        return g
    if k == 1:
        y = grad_node(G, st, LAYER_NORM, x, -1, x, n, k)
        G.fp[y, 0] = eps
        return grad_node(G, st, MUL, g, y, n, n, k)
    return norm_grad_node(G, st, LAYER_NORM_D, grad_node(G, st, MUL, g, G.src[n, 1], n, n, k), x, eps, n, k)


def _vjp_layer_norm_affine(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_affine_vjp(G, st, n, k, g)


defop(LAYER_NORM_AFFINE, "layer_norm_affine", layer_norm_affine, _run_layer_norm_affine, _vjp_layer_norm_affine,
      arity=3, cost=COMPUTE, flops=10, split=ROWS, public=False)


# ---- the fused gradients --------------------------------------------------------------------------
def _norm_d(code: int, what: str, g: Tensor, x: Tensor, eps: float) -> Tensor:
    g, x = need_pair(what, g, x, min_ndim=1)
    return x.graph._node(code, (g.id, x.id), x.shape, fp=(_eps(eps, f"{what} of {x.label!r}"),))


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
    return norm_d_rows(out, operand(v, n, 0), operand(v, n, 1), d, v.fp[n, 0], center, lo, hi)


@njit(cache=True)
def norm_d_vjp(G, st, n, k, h, center):
    """See the module docstring; n = norm_d(a, x), h the incoming gradient."""
    a = G.src[n, 0]
    x = G.src[n, 1]
    eps = G.fp[n, 0]
    jh = norm_grad_node(G, st, LAYER_NORM_D if center else RMS_NORM_D, h, x, eps, n, k)
    if k == 0:
        return jh
    d = G.shape[x, 3]
    y = grad_node(G, st, LAYER_NORM if center else RMS_NORM, x, -1, x, n, k)
    G.fp[y, 0] = eps
    r = grad_node(G, st, NORM_RSTD, x, -1, x, n, k)
    G.shape[r, 3] = 1
    G.ip[r, 0] = 1 if center else 0
    G.fp[r, 0] = eps
    ac = grad_node(G, st, SUB, a, row_reduce(G, st, MEAN, a, x, 3, n, k), x, n, k) if center else a
    ha = row_reduce(G, st, SUM, grad_node(G, st, MUL, h, ac, x, n, k), x, 3, n, k)
    hy = row_reduce(G, st, SUM, grad_node(G, st, MUL, h, y, x, n, k), x, 3, n, k)
    m = row_reduce(G, st, MEAN, grad_node(G, st, MUL, a, y, x, n, k), x, 3, n, k)
    r2 = grad_node(G, st, SQR, r, -1, r, n, k)
    c1 = grad_node(G, st, MUL, grad_node(G, st, SUB, ha, grad_node(G, st, MUL, m, hy, m, n, k), m, n, k), r2, m, n, k)
    t1 = grad_node(G, st, MUL, scaled(G, st, c1, -1.0 / d, n, k), y, x, n, k)
    t2 = grad_node(G, st, MUL, grad_node(G, st, MUL, r, m, m, n, k), jh, x, n, k)
    t3 = grad_node(G, st, MUL, scaled(G, st, grad_node(G, st, MUL, r, hy, m, n, k), 1.0 / d, n, k), n, x, n, k)
    return grad_node(G, st, SUB, grad_node(G, st, SUB, t1, t2, x, n, k), t3, x, n, k)


def _run_layer_norm_d(n, lo, hi, ctx, mem, store):
    return _norm_d_run(run_view(ctx, mem, store), n, lo, hi, True)


def _vjp_layer_norm_d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_d_vjp(G, st, n, k, g, True)


defop(LAYER_NORM_D, "layer_norm_d", layer_norm_d, _run_layer_norm_d, _vjp_layer_norm_d, arity=2, cost=COMPUTE,
      flops=10, split=ROWS, public=False)


def _run_rms_norm_d(n, lo, hi, ctx, mem, store):
    return _norm_d_run(run_view(ctx, mem, store), n, lo, hi, False)


def _vjp_rms_norm_d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_d_vjp(G, st, n, k, g, False)


defop(RMS_NORM_D, "rms_norm_d", rms_norm_d, _run_rms_norm_d, _vjp_rms_norm_d, arity=2, cost=COMPUTE, flops=8,
      split=ROWS, public=False)


# ---- norm_rstd: 1/std or 1/rms per row --------------------------------------------------------------
def norm_rstd(t: Tensor, eps: float, center: bool) -> Tensor:
    """Per row of the last axis: 1/std (``center``, layer norm) or 1/rms; shape (..., 1)."""
    t = need_tensor(t, "norm_rstd")
    return t.graph._node(NORM_RSTD, (t.id,), t.shape[:-1] + (1,), ip=(int(bool(center)),),
                         fp=(_eps(eps, f"norm_rstd of {t.label!r}"),))


@njit(cache=True, error_model="numpy")
def norm_rstd_rows(out, x, d, eps, center, lo, hi):
    for r in range(lo, hi):
        out[r] = row_stats(x[r * d:(r + 1) * d], eps, center)[1]
    return OK


def _run_norm_rstd(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    return norm_rstd_rows(out, operand(v, n, 0), v.shape[v.src[n, 0], 3], v.fp[n, 0], v.ip[n, 0] != 0, lo, hi)


def _vjp_norm_rstd(n, k, g, ctx):              # d rstd / dx = -rstd^2 * norm(x) / D
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    t = grad_node(G, st, MUL, g, grad_node(G, st, SQR, n, -1, n, n, k), n, n, k)
    t = scaled(G, st, t, -1.0 / G.shape[x, 3], n, k)
    y = grad_node(G, st, LAYER_NORM if G.ip[n, 0] else RMS_NORM, x, -1, x, n, k)
    G.fp[y, 0] = G.fp[n, 0]
    return grad_node(G, st, MUL, y, t, x, n, k)


defop(NORM_RSTD, "norm_rstd", norm_rstd, _run_norm_rstd, _vjp_norm_rstd, arity=1, cost=COMPUTE, flops=4,
      split=ELEMENTS, public=False)
