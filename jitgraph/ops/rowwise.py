"""Row kernels: softmax and log_softmax (along any axis), layer_norm and rms_norm
(last axis), and cross_entropy (mean over rows of the last axis).

Calling convention: a row op reads node n's source 0 with its padded shape and
the row axis ip[n, 0] (softmax) or the last axis; eps lives in fp[n, 0].
"""
import math
import numbers

import numpy as np
from numba import njit

from .._sigs import G as G_T, ST, f64, i64
from ..emit import grad_node, grad_node_fp
from ..errors import GraphError
from ..graph import Operand, Tensor
from ..ir import MAX_DIMS
from ..native import operand, output, rule_view, run_view
from ..registry import COMPUTE, defop
from ..status import OK
from .binary import AFFINE, MUL, SUB
from .common import as_tensor, graph_of, need_tensor, normalize_axis
from .reduce import MEAN, SUM
from .shape import outer_inner
from .unary import EXP, SQR

__all__ = ["softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm"]

SOFTMAX, LOG_SOFTMAX, CROSS_ENTROPY, LAYER_NORM, RMS_NORM, NORM_RSTD = 38, 39, 40, 41, 42, 43


# ---- the family's calling convention ------------------------------------------------------------
def _along_axis(code: int, what: str, t: Tensor, axis: int) -> Tensor:
    t = need_tensor(t, what)
    if t.ndim == 0:
        raise GraphError(f"{what} of {t.label!r}: needs at least 1 dim")
    ax = normalize_axis(axis, t.ndim, f"{what} of {t.label!r}")
    return t.graph._node(code, (t.id,), t.shape, ip=(ax + MAX_DIMS - t.ndim,))


def _eps(eps: float, what: str) -> float:
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps >= 0 or math.isinf(eps):
        raise GraphError(f"{what}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64), cache=True)
def row_reduce(G, st, op, a, like, axis, n, k):
    """sum or mean of ``a`` over padded ``axis``, keeping it as size 1."""
    t = grad_node(G, st, op, a, -1, like, n, k)
    G.shape[t, axis] = 1
    G.ip[t, 0] = 1 << axis
    if op == MEAN:
        G.fp[t, 0] = 1.0 / G.shape[like, axis]
    return t


@njit(i64(G_T, ST, i64, f64, i64, i64), cache=True)
def scaled(G, st, a, s, n, k):
    return grad_node_fp(G, st, AFFINE, a, s, 0.0, n, k)


# ---- softmax and log_softmax ----------------------------------------------------------------------
def softmax(t: Tensor, axis: int = -1) -> Tensor:
    """exp(t) / sum(exp(t)) along ``axis`` (max-shifted, so large logits are safe)."""
    return _along_axis(SOFTMAX, "softmax", t, axis)


def log_softmax(t: Tensor, axis: int = -1) -> Tensor:
    """t - logsumexp(t) along ``axis``."""
    return _along_axis(LOG_SOFTMAX, "log_softmax", t, axis)


@njit(cache=True, error_model="numpy")
def softmax_kernel(out, x, sx, axis, log):
    outer, inner = outer_inner(sx, axis)
    n = sx[axis]
    for o in range(outer):
        for q in range(inner):
            base = o * n * inner + q
            m = -np.inf
            for j in range(n):
                v = x[base + j * inner]
                if v > m or v != v:
                    m = v
            if m == -np.inf:      # a row of -inf: uniform rather than NaN
                m = 0.0
            s = 0.0
            for j in range(n):
                s += math.exp(x[base + j * inner] - m)
            if log:
                ls = math.log(s)
                for j in range(n):
                    out[base + j * inner] = x[base + j * inner] - m - ls
            else:
                r = 1.0 / s
                for j in range(n):
                    out[base + j * inner] = math.exp(x[base + j * inner] - m) * r
    return OK


def _run_softmax(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return softmax_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.ip[n, 0], False)


def _vjp_softmax(n, k, g, ctx):                # out * (g - sum(g * out))
    G, st = rule_view(ctx)
    axis = G.ip[n, 0]
    t = row_reduce(G, st, SUM, grad_node(G, st, MUL, g, n, n, n, k), n, axis, n, k)
    return grad_node(G, st, MUL, n, grad_node(G, st, SUB, g, t, n, n, k), n, n, k)


defop(SOFTMAX, "softmax", softmax, _run_softmax, _vjp_softmax, arity=1, cost=COMPUTE, flops=12)


def _run_log_softmax(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return softmax_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.ip[n, 0], True)


def _vjp_log_softmax(n, k, g, ctx):            # g - exp(out) * sum(g)
    G, st = rule_view(ctx)
    axis = G.ip[n, 0]
    t = row_reduce(G, st, SUM, g, n, axis, n, k)
    t = grad_node(G, st, MUL, grad_node(G, st, EXP, n, -1, n, n, k), t, n, n, k)
    return grad_node(G, st, SUB, g, t, n, n, k)


defop(LOG_SOFTMAX, "log_softmax", log_softmax, _run_log_softmax, _vjp_log_softmax, arity=1, cost=COMPUTE,
      flops=12)


# ---- cross_entropy --------------------------------------------------------------------------------
def cross_entropy(logits: Operand, target_probs: Operand) -> Tensor:
    """mean over rows of -sum(target * log_softmax(logits), axis=-1); a scalar."""
    g = graph_of("cross_entropy", logits, target_probs)
    lg = as_tensor(logits, g, "cross_entropy")
    target = as_tensor(target_probs, g, "cross_entropy")
    if lg.ndim == 0:
        raise GraphError(f"cross_entropy: logits {lg.label!r} need at least 1 dim")
    if target.shape != lg.shape:
        raise GraphError(f"cross_entropy: target {target.label!r} {target.shape} must have the shape "
                         f"of logits {lg.label!r} {lg.shape}")
    return g._node(CROSS_ENTROPY, (lg.id, target.id), ())


@njit(cache=True, error_model="numpy")
def cross_entropy_kernel(out, logits, target, sx):
    c = sx[3]
    rows = logits.size // c
    total = 0.0
    for r in range(rows):
        b = r * c
        m = -np.inf
        for j in range(c):
            if logits[b + j] > m:
                m = logits[b + j]
        s = 0.0
        tl = 0.0
        ts = 0.0
        for j in range(c):
            s += math.exp(logits[b + j] - m)
            tl += target[b + j] * logits[b + j]
            ts += target[b + j]
        total += tl - (m + math.log(s)) * ts
    out[0] = -total / rows
    return OK


def _run_cross_entropy(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return cross_entropy_kernel(output(v, n), operand(v, n, 0), operand(v, n, 1), v.shape[v.src[n, 0]])


def _vjp_cross_entropy(n, k, g, ctx):          # (softmax(l) - t) g / rows ;  -log_softmax(l) g / rows
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    rows = G.shape[x, 0] * G.shape[x, 1] * G.shape[x, 2]
    if k == 0:
        s = grad_node(G, st, SOFTMAX, x, -1, x, n, k)
        G.ip[s, 0] = 3
        d = grad_node(G, st, SUB, s, G.src[n, 1], x, n, k)
        return grad_node(G, st, MUL, d, scaled(G, st, g, 1.0 / rows, n, k), x, n, k)
    s = grad_node(G, st, LOG_SOFTMAX, x, -1, x, n, k)
    G.ip[s, 0] = 3
    return grad_node(G, st, MUL, s, scaled(G, st, g, -1.0 / rows, n, k), x, n, k)


defop(CROSS_ENTROPY, "cross_entropy", cross_entropy, _run_cross_entropy, _vjp_cross_entropy, arity=2,
      cost=COMPUTE, flops=12)


# ---- layer_norm and rms_norm ----------------------------------------------------------------------
def layer_norm(t: Tensor, eps: float = 1e-5) -> Tensor:
    """(t - mean) / sqrt(var + eps) over the last axis (no affine part: multiply and add yourself)."""
    t = need_tensor(t, "layer_norm")
    if t.ndim == 0:
        raise GraphError(f"layer_norm of {t.label!r}: needs at least 1 dim")
    return t.graph._node(LAYER_NORM, (t.id,), t.shape, fp=(_eps(eps, f"layer_norm of {t.label!r}"),))


def rms_norm(t: Tensor, eps: float = 1e-6) -> Tensor:
    """t / sqrt(mean(t^2) + eps) over the last axis."""
    t = need_tensor(t, "rms_norm")
    if t.ndim == 0:
        raise GraphError(f"rms_norm of {t.label!r}: needs at least 1 dim")
    return t.graph._node(RMS_NORM, (t.id,), t.shape, fp=(_eps(eps, f"rms_norm of {t.label!r}"),))


def norm_rstd(t: Tensor, eps: float, center: bool) -> Tensor:
    """Per row of the last axis: 1/std (``center``, layer norm) or 1/rms; shape (..., 1)."""
    t = need_tensor(t, "norm_rstd")
    return t.graph._node(NORM_RSTD, (t.id,), t.shape[:-1] + (1,), ip=(int(bool(center)),),
                         fp=(_eps(eps, f"norm_rstd of {t.label!r}"),))


@njit(cache=True, error_model="numpy")
def _row_rstd(x, b, d, eps, center):
    mu = 0.0
    if center:
        for j in range(d):
            mu += x[b + j]
        mu /= d
    v = 0.0
    for j in range(d):
        c = x[b + j] - mu
        v += c * c
    return mu, 1.0 / math.sqrt(v / d + eps)


@njit(cache=True, error_model="numpy")
def norm_kernel(out, x, sx, eps, center):
    """layer_norm (center=True) or rms_norm over the last axis."""
    d = sx[3]
    for r in range(x.size // d):
        b = r * d
        mu, rstd = _row_rstd(x, b, d, eps, center)
        for j in range(d):
            out[b + j] = (x[b + j] - mu) * rstd
    return OK


@njit(cache=True, error_model="numpy")
def norm_rstd_kernel(out, x, sx, eps, center):
    d = sx[3]
    for r in range(x.size // d):
        out[r] = _row_rstd(x, r * d, d, eps, center)[1]
    return OK


@njit(cache=True)
def norm_vjp(G, st, n, k, g, center):
    """layer: rstd (g - mean(g) - out mean(g out));  rms: rrms (g - out mean(g out))."""
    x = G.src[n, 0]
    r = grad_node(G, st, NORM_RSTD, x, -1, x, n, k)
    G.shape[r, 3] = 1
    G.ip[r, 0] = 1 if center else 0
    G.fp[r, 0] = G.fp[n, 0]
    m = row_reduce(G, st, MEAN, grad_node(G, st, MUL, g, n, n, n, k), n, 3, n, k)
    v = grad_node(G, st, SUB, g, grad_node(G, st, MUL, n, m, n, n, k), n, n, k)
    if center:
        v = grad_node(G, st, SUB, v, row_reduce(G, st, MEAN, g, n, 3, n, k), n, n, k)
    return grad_node(G, st, MUL, v, r, n, n, k)


def _run_layer_norm(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return norm_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.fp[n, 0], True)


def _vjp_layer_norm(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_vjp(G, st, n, k, g, True)


defop(LAYER_NORM, "layer_norm", layer_norm, _run_layer_norm, _vjp_layer_norm, arity=1, cost=COMPUTE, flops=8)


def _run_rms_norm(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return norm_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.fp[n, 0], False)


def _vjp_rms_norm(n, k, g, ctx):
    G, st = rule_view(ctx)
    return norm_vjp(G, st, n, k, g, False)


defop(RMS_NORM, "rms_norm", rms_norm, _run_rms_norm, _vjp_rms_norm, arity=1, cost=COMPUTE, flops=6)


def _run_norm_rstd(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return norm_rstd_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.fp[n, 0], v.ip[n, 0] != 0)


def _vjp_norm_rstd(n, k, g, ctx):              # d rstd / dx = -rstd^2 * norm(x) / D
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    t = grad_node(G, st, MUL, g, grad_node(G, st, SQR, n, -1, n, n, k), n, n, k)
    t = scaled(G, st, t, -1.0 / G.shape[x, 3], n, k)
    y = grad_node(G, st, LAYER_NORM if G.ip[n, 0] else RMS_NORM, x, -1, x, n, k)
    G.fp[y, 0] = G.fp[n, 0]
    return grad_node(G, st, MUL, y, t, x, n, k)


defop(NORM_RSTD, "norm_rstd", norm_rstd, _run_norm_rstd, _vjp_norm_rstd, arity=1, cost=COMPUTE, flops=4,
      public=False)
