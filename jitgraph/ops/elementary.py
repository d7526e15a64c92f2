"""Elementary functions with numpy semantics: sin, cos, pow with a scalar exponent
(``t ** p``), clip and softplus.  Unary elementwise ops in the calling convention of unary.py
(element functions ``_name(a, p0, p1)``, params in fp[n, 0:2]); they compute with
libm in the graph's dtype (no vectorized float32 forms: models spend little time here).
"""
import math
from typing import Optional

from enum import IntEnum

from numba import njit

from ..errors import GraphError
from ..graph import Tensor
from ..native import run_view
from ..registry import CLIP, CLIP_MASK, COS, ELEMENTWISE, POW, SIN, SOFTPLUS, ZERO_GRAD, defop, slots
from ..rules import either, op
from ..vmath import like
from .common import is_scalar, need_tensor
from .unary import _unary, unary, unary_chunk, unary_chunk_keeping, unary_keeping


class PowFP(IntEnum):
    exponent = 0


class ClipFP(IntEnum):          # clip and clip_mask
    lo = 0
    hi = 1


# ---- sin and cos ----------------------------------------------------------------------------------
def sin(t: Tensor) -> Tensor:
    """sin(t), t in radians."""
    return _unary(SIN, "sin", t)


@njit(cache=True, error_model="numpy")
def _sin(a, p0, p1):
    return math.sin(a)


def _run_sin(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sin, lo, hi)


def _chunk_sin(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _sin, hi)


defop(SIN, "sin", sin, _run_sin, arity=1, kind=ELEMENTWISE, chunk=_chunk_sin, flops=8,
      vjp=lambda g, x: g * op.cos(x))


def cos(t: Tensor) -> Tensor:
    """cos(t), t in radians."""
    return _unary(COS, "cos", t)


@njit(cache=True, error_model="numpy")
def _cos(a, p0, p1):
    return math.cos(a)


def _run_cos(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _cos, lo, hi)


def _chunk_cos(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _cos, hi)


defop(COS, "cos", cos, _run_cos, arity=1, kind=ELEMENTWISE, chunk=_chunk_cos, flops=8,
      vjp=lambda g, x: -1.0 * (g * op.sin(x)))


# ---- pow ------------------------------------------------------------------------------------------
def pow(t: Tensor, exponent: float) -> Tensor:    # noqa: A001  -- jg.pow, as numpy's power with a scalar
    """t ** exponent for a real number ``exponent`` (numpy's rules: a negative base with a
    non-integer exponent gives NaN, 0 ** -1 gives inf).  ``t ** p`` is the same."""
    t = need_tensor(t, "pow")
    if not is_scalar(exponent):
        raise GraphError(f"pow of {t.label!r}: the exponent must be a real number, got {exponent!r} "
                         "(tensor exponents: jg.exp(b * jg.log(t)))")
    return _unary(POW, "pow", t, slots(PowFP, exponent=float(exponent)))


@njit(cache=True, error_model="numpy")
def _pow(a, p0, p1):
    if p0 == 2.0:                      # the common square: exact and fast
        return a * a
    return a ** like(a, p0)


def _run_pow(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _pow, lo, hi)


def _chunk_pow(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _pow, hi)


defop(POW, "pow", pow, _run_pow, arity=1, kind=ELEMENTWISE, chunk=_chunk_pow, flops=8, fp=PowFP,
      vjp=lambda g, x, exponent: either(exponent == 0.0, None, either(      # g p x^(p-1); nothing for p = 0
          exponent == 1.0, g, g * either(exponent == 2.0, 2.0 * x, exponent * op.pow(x, exponent=exponent - 1.0)))))


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
    return _unary(CLIP, "clip", t, slots(ClipFP, lo=low, hi=high))


@njit(cache=True, error_model="numpy")
def _clip(a, p0, p1):
    lo = like(a, p0)
    hi = like(a, p1)
    return lo if a < lo else (hi if a > hi else a)


def _run_clip(n, lo, hi, ctx, mem, store):
    return unary_keeping(run_view(ctx, mem, store), n, _clip, lo, hi)     # returns its input (unary._map_keeping)


def _chunk_clip(n, lo, hi, ctx, mem, store):
    return unary_chunk_keeping(run_view(ctx, mem, store), n, _clip, hi)


defop(CLIP, "clip", clip, _run_clip, arity=1, kind=ELEMENTWISE, chunk=_chunk_clip, flops=2, fp=ClipFP,
      vjp=lambda g, x, lo, hi: g * op.clip_mask(x, lo=lo, hi=hi))              # g [lo <= x <= hi]


def clip_mask(t: Tensor, lo: float, hi: float) -> Tensor:
    """1 where lo <= t <= hi, else 0 (clip's derivative)."""
    t = need_tensor(t, "clip_mask")
    return _unary(CLIP_MASK, "clip_mask", t, slots(ClipFP, lo=float(lo), hi=float(hi)))


@njit(cache=True, error_model="numpy")
def _clip_mask(a, p0, p1):
    return like(a, 1.0) if like(a, p0) <= a <= like(a, p1) else like(a, 0.0)


def _run_clip_mask(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _clip_mask, lo, hi)


def _chunk_clip_mask(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _clip_mask, hi)


defop(CLIP_MASK, "clip_mask", clip_mask, _run_clip_mask, ZERO_GRAD, arity=1, kind=ELEMENTWISE, chunk=_chunk_clip_mask,
      public=False, fp=ClipFP)


# ---- softplus -------------------------------------------------------------------------------------
def softplus(t: Tensor) -> Tensor:
    """log(1 + e^t), PyTorch's softplus (beta 1), without overflow; its gradient is sigmoid(t)."""
    return _unary(SOFTPLUS, "softplus", t)


@njit(cache=True, error_model="numpy")
def _softplus(a, p0, p1):
    # max(x, 0) + log(1 + e^-|x|)
    return (a if a > like(a, 0.0) else like(a, 0.0)) + math.log1p(math.exp(-abs(a)))


def _run_softplus(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _softplus, lo, hi)


def _chunk_softplus(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _softplus, hi)


defop(SOFTPLUS, "softplus", softplus, _run_softplus, arity=1, kind=ELEMENTWISE, chunk=_chunk_softplus, flops=12,
      vjp=lambda g, x: g * op.sigmoid(x))
