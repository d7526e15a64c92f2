"""maximum and minimum, and comparisons giving 0/1 masks, with numpy broadcasting:
binary elementwise ops in the calling convention of binary.py (element functions
``_name(x, y)`` handed to :func:`binary`).

``t < u``, ``t <= u``, ``t > u`` and ``t >= u`` build masks; elementwise equality is
``jg.equal(t, u)``, because ``t == u`` must keep meaning "the same tensor" (tensors
are the keys of feed dicts).  A mask's gradient is zero: the ops are piecewise constant.
"""
from numba import njit

from ..graph import Operand, Tensor
from ..native import run_view
from ..registry import (ELEMENTWISE, EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, MAXIMUM, MINIMUM, ZERO_GRAD,
                        defop)
from ..rules import op
from ..vmath import like
from .binary import _binary, binary, binary_chunk, binary_chunk_keeping, binary_keeping


# ---- maximum and minimum ----------------------------------------------------------------------------
def maximum(a: Operand, b: Operand) -> Tensor:
    """The larger of a and b, elementwise (NaN if either is NaN); the gradient goes to a
    where a >= b (ties: to a), else to b."""
    return _binary(MAXIMUM, "maximum", a, b)


@njit(cache=True, error_model="numpy")
def _maximum(x, y):
    return x if x >= y or x != x else y


def _run_maximum(n, lo, hi, ctx, mem, store):
    return binary_keeping(run_view(ctx, mem, store), n, _maximum, lo, hi)     # returns an input (unary._map_keeping)


def _chunk_maximum(n, lo, hi, ctx, mem, store):
    return binary_chunk_keeping(run_view(ctx, mem, store), n, _maximum, hi)


defop(MAXIMUM, "maximum", maximum, _run_maximum, arity=2, kind=ELEMENTWISE, chunk=_chunk_maximum,
      vjp=lambda g, a, b: (g * op.greater_equal(a, b), g * op.less(a, b)))      # to the chosen one; ties to a


def minimum(a: Operand, b: Operand) -> Tensor:
    """The smaller of a and b, elementwise (NaN if either is NaN); the gradient goes to a
    where a <= b (ties: to a), else to b."""
    return _binary(MINIMUM, "minimum", a, b)


@njit(cache=True, error_model="numpy")
def _minimum(x, y):
    return x if x <= y or x != x else y


def _run_minimum(n, lo, hi, ctx, mem, store):
    return binary_keeping(run_view(ctx, mem, store), n, _minimum, lo, hi)     # returns an input (unary._map_keeping)


def _chunk_minimum(n, lo, hi, ctx, mem, store):
    return binary_chunk_keeping(run_view(ctx, mem, store), n, _minimum, hi)


defop(MINIMUM, "minimum", minimum, _run_minimum, arity=2, kind=ELEMENTWISE, chunk=_chunk_minimum,
      vjp=lambda g, a, b: (g * op.less_equal(a, b), g * op.greater(a, b)))


# ---- comparisons: 0/1 masks -------------------------------------------------------------------------
def less(a: Operand, b: Operand) -> Tensor:
    """1 where a < b, else 0 (``a < b``)."""
    return _binary(LESS, "less", a, b)


@njit(cache=True, error_model="numpy")
def _less(x, y):
    return like(x, 1.0) if x < y else like(x, 0.0)


def _run_less(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _less, lo, hi)


def _chunk_less(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _less, hi)


defop(LESS, "less", less, _run_less, ZERO_GRAD, arity=2, kind=ELEMENTWISE, chunk=_chunk_less, label="<")


def less_equal(a: Operand, b: Operand) -> Tensor:
    """1 where a <= b, else 0 (``a <= b``)."""
    return _binary(LESS_EQUAL, "less_equal", a, b)


@njit(cache=True, error_model="numpy")
def _less_equal(x, y):
    return like(x, 1.0) if x <= y else like(x, 0.0)


def _run_less_equal(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _less_equal, lo, hi)


def _chunk_less_equal(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _less_equal, hi)


defop(LESS_EQUAL, "less_equal", less_equal, _run_less_equal, ZERO_GRAD, arity=2, kind=ELEMENTWISE,
      chunk=_chunk_less_equal,
      label="<=")


def greater(a: Operand, b: Operand) -> Tensor:
    """1 where a > b, else 0 (``a > b``)."""
    return _binary(GREATER, "greater", a, b)


@njit(cache=True, error_model="numpy")
def _greater(x, y):
    return like(x, 1.0) if x > y else like(x, 0.0)


def _run_greater(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _greater, lo, hi)


def _chunk_greater(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _greater, hi)


defop(GREATER, "greater", greater, _run_greater, ZERO_GRAD, arity=2, kind=ELEMENTWISE, chunk=_chunk_greater, label=">")


def greater_equal(a: Operand, b: Operand) -> Tensor:
    """1 where a >= b, else 0 (``a >= b``)."""
    return _binary(GREATER_EQUAL, "greater_equal", a, b)


@njit(cache=True, error_model="numpy")
def _greater_equal(x, y):
    return like(x, 1.0) if x >= y else like(x, 0.0)


def _run_greater_equal(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _greater_equal, lo, hi)


def _chunk_greater_equal(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _greater_equal, hi)


defop(GREATER_EQUAL, "greater_equal", greater_equal, _run_greater_equal, ZERO_GRAD, arity=2, kind=ELEMENTWISE,
      chunk=_chunk_greater_equal, label=">=")


def equal(a: Operand, b: Operand) -> Tensor:
    """1 where a == b, else 0 (``t == u`` compares the tensors themselves, not their values)."""
    return _binary(EQUAL, "equal", a, b)


@njit(cache=True, error_model="numpy")
def _equal(x, y):
    return like(x, 1.0) if x == y else like(x, 0.0)


def _run_equal(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _equal, lo, hi)


def _chunk_equal(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _equal, hi)


defop(EQUAL, "equal", equal, _run_equal, ZERO_GRAD, arity=2, kind=ELEMENTWISE, chunk=_chunk_equal, label="==")
