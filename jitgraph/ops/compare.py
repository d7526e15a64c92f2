"""maximum and minimum, and comparisons giving 0/1 masks, with numpy broadcasting:
binary elementwise ops in the calling convention of binary.py (element functions
``_name(x, y)`` handed to :func:`binary`).

``t < u``, ``t <= u``, ``t > u`` and ``t >= u`` build masks; elementwise equality is
``jg.equal(t, u)``, because ``t == u`` must keep meaning "the same tensor" (tensors
are the keys of feed dicts).  A mask's gradient is zero: the ops are piecewise constant.
"""
from numba import njit

from ..emit import grad_node
from ..graph import Operand, Tensor
from ..native import rule_view, run_view
from ..registry import ELEMENTWISE, ZERO_GRAD, defop
from ..vmath import like
from .binary import MUL, _binary, binary


MAXIMUM, MINIMUM, LESS, LESS_EQUAL, GREATER, GREATER_EQUAL, EQUAL = range(61, 68)


@njit(cache=True)
def _masked(G, st, g, mask_op, n, k):
    """g * mask_op(a, b): the gradient reaches the operand that was chosen."""
    return grad_node(G, st, MUL, g, grad_node(G, st, mask_op, G.src[n, 0], G.src[n, 1], n, n, k), n, n, k)


# ---- maximum and minimum ----------------------------------------------------------------------------
def maximum(a: Operand, b: Operand) -> Tensor:
    """The larger of a and b, elementwise (NaN if either is NaN); the gradient goes to a
    where a >= b (ties: to a), else to b."""
    return _binary(MAXIMUM, "maximum", a, b)


@njit(cache=True, error_model="numpy")
def _maximum(x, y):
    return x if x >= y or x != x else y


def _run_maximum(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _maximum, lo, hi)


def _vjp_maximum(n, k, g, ctx):
    G, st = rule_view(ctx)
    return _masked(G, st, g, GREATER_EQUAL if k == 0 else LESS, n, k)


defop(MAXIMUM, "maximum", maximum, _run_maximum, _vjp_maximum, arity=2, kind=ELEMENTWISE)


def minimum(a: Operand, b: Operand) -> Tensor:
    """The smaller of a and b, elementwise (NaN if either is NaN); the gradient goes to a
    where a <= b (ties: to a), else to b."""
    return _binary(MINIMUM, "minimum", a, b)


@njit(cache=True, error_model="numpy")
def _minimum(x, y):
    return x if x <= y or x != x else y


def _run_minimum(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _minimum, lo, hi)


def _vjp_minimum(n, k, g, ctx):
    G, st = rule_view(ctx)
    return _masked(G, st, g, LESS_EQUAL if k == 0 else GREATER, n, k)


defop(MINIMUM, "minimum", minimum, _run_minimum, _vjp_minimum, arity=2, kind=ELEMENTWISE)


# ---- comparisons: 0/1 masks -------------------------------------------------------------------------
def less(a: Operand, b: Operand) -> Tensor:
    """1 where a < b, else 0 (``a < b``)."""
    return _binary(LESS, "less", a, b)


@njit(cache=True, error_model="numpy")
def _less(x, y):
    return like(x, 1.0) if x < y else like(x, 0.0)


def _run_less(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _less, lo, hi)


defop(LESS, "less", less, _run_less, ZERO_GRAD, arity=2, kind=ELEMENTWISE, label="<")


def less_equal(a: Operand, b: Operand) -> Tensor:
    """1 where a <= b, else 0 (``a <= b``)."""
    return _binary(LESS_EQUAL, "less_equal", a, b)


@njit(cache=True, error_model="numpy")
def _less_equal(x, y):
    return like(x, 1.0) if x <= y else like(x, 0.0)


def _run_less_equal(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _less_equal, lo, hi)


defop(LESS_EQUAL, "less_equal", less_equal, _run_less_equal, ZERO_GRAD, arity=2, kind=ELEMENTWISE, label="<=")


def greater(a: Operand, b: Operand) -> Tensor:
    """1 where a > b, else 0 (``a > b``)."""
    return _binary(GREATER, "greater", a, b)


@njit(cache=True, error_model="numpy")
def _greater(x, y):
    return like(x, 1.0) if x > y else like(x, 0.0)


def _run_greater(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _greater, lo, hi)


defop(GREATER, "greater", greater, _run_greater, ZERO_GRAD, arity=2, kind=ELEMENTWISE, label=">")


def greater_equal(a: Operand, b: Operand) -> Tensor:
    """1 where a >= b, else 0 (``a >= b``)."""
    return _binary(GREATER_EQUAL, "greater_equal", a, b)


@njit(cache=True, error_model="numpy")
def _greater_equal(x, y):
    return like(x, 1.0) if x >= y else like(x, 0.0)


def _run_greater_equal(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _greater_equal, lo, hi)


defop(GREATER_EQUAL, "greater_equal", greater_equal, _run_greater_equal, ZERO_GRAD, arity=2, kind=ELEMENTWISE,
      label=">=")


def equal(a: Operand, b: Operand) -> Tensor:
    """1 where a == b, else 0 (``t == u`` compares the tensors themselves, not their values)."""
    return _binary(EQUAL, "equal", a, b)


@njit(cache=True, error_model="numpy")
def _equal(x, y):
    return like(x, 1.0) if x == y else like(x, 0.0)


def _run_equal(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _equal, lo, hi)


defop(EQUAL, "equal", equal, _run_equal, ZERO_GRAD, arity=2, kind=ELEMENTWISE, label="==")
