"""Elementary functions with numpy semantics: sin, cos, pow with a scalar exponent
(``t ** p``) and clip.  Unary elementwise ops in the calling convention of unary.py
(element functions ``_name(a, p0, p1)``, params in fp[n, 0:2]); they compute with
libm in the graph's dtype (no vectorized float32 forms: models spend little time here).
"""
import math
from typing import Optional

from numba import njit

from ..emit import grad_node, grad_node_fp
from ..errors import GraphError
from ..graph import Tensor
from ..native import rule_view, run_view
from ..registry import ELEMENTWISE, ZERO_GRAD, defop
from ..status import NO_CONTRIBUTION
from ..vmath import like
from .binary import AFFINE, MUL, scaled
from .common import is_scalar, need_tensor
from .unary import _unary, unary


SIN, COS, POW, CLIP, CLIP_MASK = 56, 57, 58, 59, 60


# ---- sin and cos ----------------------------------------------------------------------------------
def sin(t: Tensor) -> Tensor:
    """sin(t), t in radians."""
    return _unary(SIN, "sin", t)


@njit(cache=True, error_model="numpy")
def _sin(a, p0, p1):
    return math.sin(a)


def _run_sin(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sin, lo, hi)


def _vjp_sin(n, k, g, ctx):                    # g cos(x)
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    return grad_node(G, st, MUL, g, grad_node(G, st, COS, x, -1, x, n, k), n, n, k)


defop(SIN, "sin", sin, _run_sin, _vjp_sin, arity=1, kind=ELEMENTWISE, flops=8)


def cos(t: Tensor) -> Tensor:
    """cos(t), t in radians."""
    return _unary(COS, "cos", t)


@njit(cache=True, error_model="numpy")
def _cos(a, p0, p1):
    return math.cos(a)


def _run_cos(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _cos, lo, hi)


def _vjp_cos(n, k, g, ctx):                    # -g sin(x)
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    return scaled(G, st, grad_node(G, st, MUL, g, grad_node(G, st, SIN, x, -1, x, n, k), n, n, k), -1.0, n, k)


defop(COS, "cos", cos, _run_cos, _vjp_cos, arity=1, kind=ELEMENTWISE, flops=8)


# ---- pow ------------------------------------------------------------------------------------------
def pow(t: Tensor, exponent: float) -> Tensor:    # noqa: A001  -- jg.pow, as numpy's power with a scalar
    """t ** exponent for a real number ``exponent`` (numpy's rules: a negative base with a
    non-integer exponent gives NaN, 0 ** -1 gives inf).  ``t ** p`` is the same."""
    t = need_tensor(t, "pow")
    if not is_scalar(exponent):
        raise GraphError(f"pow of {t.label!r}: the exponent must be a real number, got {exponent!r} "
                         "(tensor exponents: jg.exp(b * jg.log(t)))")
    return _unary(POW, "pow", t, (float(exponent),))


@njit(cache=True, error_model="numpy")
def _pow(a, p0, p1):
    if p0 == 2.0:                      # the common square: exact and fast
        return a * a
    return a ** like(a, p0)


def _run_pow(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _pow, lo, hi)


def _vjp_pow(n, k, g, ctx):                    # g p x^(p-1); nothing for p = 0
    G, st = rule_view(ctx)
    p = G.fp[n, 0]
    if p == 0.0:
        return NO_CONTRIBUTION
    if p == 1.0:
        return g
    x = G.src[n, 0]
    d = grad_node_fp(G, st, AFFINE, x, 2.0, 0.0, n, k) if p == 2.0 else \
        scaled(G, st, grad_node_fp(G, st, POW, x, p - 1.0, 0.0, n, k), p, n, k)
    return grad_node(G, st, MUL, g, d, n, n, k)


defop(POW, "pow", pow, _run_pow, _vjp_pow, arity=1, kind=ELEMENTWISE, flops=8)


# ---- clip -----------------------------------------------------------------------------------------
def clip(t: Tensor, lo: Optional[float] = None, hi: Optional[float] = None) -> Tensor:
    """t limited to [lo, hi] (None: no bound on that side), as numpy.clip; the gradient
    passes where lo <= t <= hi (both bounds included, as PyTorch's clamp)."""
    t = need_tensor(t, "clip")
    for name, b in (("lo", lo), ("hi", hi)):
        if b is not None and not is_scalar(b):
            raise GraphError(f"clip of {t.label!r}: {name} must be a real number or None, got {b!r}")
    low = -math.inf if lo is None else float(lo)
    high = math.inf if hi is None else float(hi)
    if low > high:
        raise GraphError(f"clip of {t.label!r}: lo {low} is above hi {high}")
    return _unary(CLIP, "clip", t, (low, high))


@njit(cache=True, error_model="numpy")
def _clip(a, p0, p1):
    lo = like(a, p0)
    hi = like(a, p1)
    return lo if a < lo else (hi if a > hi else a)


def _run_clip(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _clip, lo, hi)


def _vjp_clip(n, k, g, ctx):                   # g [lo <= x <= hi]
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    m = grad_node_fp(G, st, CLIP_MASK, x, G.fp[n, 0], G.fp[n, 1], n, k)
    return grad_node(G, st, MUL, g, m, n, n, k)


defop(CLIP, "clip", clip, _run_clip, _vjp_clip, arity=1, kind=ELEMENTWISE, flops=2)


def clip_mask(t: Tensor, lo: float, hi: float) -> Tensor:
    """1 where lo <= t <= hi, else 0 (clip's derivative)."""
    t = need_tensor(t, "clip_mask")
    return _unary(CLIP_MASK, "clip_mask", t, (float(lo), float(hi)))


@njit(cache=True, error_model="numpy")
def _clip_mask(a, p0, p1):
    return like(a, 1.0) if like(a, p0) <= a <= like(a, p1) else like(a, 0.0)


def _run_clip_mask(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _clip_mask, lo, hi)


defop(CLIP_MASK, "clip_mask", clip_mask, _run_clip_mask, ZERO_GRAD, arity=1, kind=ELEMENTWISE, public=False)
