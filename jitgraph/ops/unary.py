"""Unary elementwise ops: out[i] = f(x[i]) over node n's one source.

Calling convention: each op has an element function ``_name(a, p0, p1)`` (params
fp[n, 0:2]) and a runner that hands it to :func:`unary`, which maps it over the
elements, in fixed blocks over the threads when the tensor is big.  Each op's runner
compiles its own loop with its own math only.  float32 math stays float32 and
vectorizes (vmath.py, ``like`` types the constants); float64 uses libm.
The derivative ops gradient rules append (step, gelu_d, relu_d ...) are ops/derivatives.py's.
"""
from enum import IntEnum

import numpy as np
from numba import njit

from .. import vmath
from ..errors import GraphError
from ..graph import Tensor
from ..native import chunk_operand, operand, output, run_view, same_data, span
from ..registry import (ABS, COPY, ELEMENTWISE, EXP, GELU, LEAKY_RELU, LOG, NEG, RELU, SIGMOID, SILU, SQR, SQRT, TANH,
                        defop, slots)
from ..rules import op
from ..status import OK
from ..vmath import like
from .common import KEEP_BLOCK, is_scalar, need_tensor


class LeakyReluFP(IntEnum):
    slope = 0


# ---- the family's calling convention ------------------------------------------------------------
def _unary(code: int, what: str, t: Tensor, fp: tuple = ()) -> Tensor:
    """The node ``code(t)``; ``fp``: its float parameters, in its declaration's slot order."""
    t = need_tensor(t, what)
    return t.graph._node(code, (t.id,), t.shape, fp=fp)


@njit(cache=True, error_model="numpy", inline="always")   # f a function argument: inlined, or uncacheable
def _map(f, y, x, p0, p1):
    """y[i] = f(x[i], p0, p1) over arrays indexed from 0 (no wraparound test, so the loops
    vectorize); in place, one array (LLVM's overlap check would pick its scalar loop)."""
    if same_data(y, x):
        for i in range(y.size):
            y[i] = f(y[i], p0, p1)
    else:
        for i in range(y.size):
            y[i] = f(x[i], p0, p1)


@njit(cache=True, error_model="numpy", inline="always")   # f a function argument: inlined, or uncacheable
def _map_keeping(f, y, x, p0, p1):
    """_map for an f that returns its argument on some branch (relu: x or 0).  In place,
    LLVM then stores only where the value changes -- masked stores (vmaskmovps), which
    AMD's Zen 3 runs ~4x slower than plain ones -- so blocks of KEEP_BLOCK go through a
    buffer in cache and are stored whole: the same values, 0.14 instead of 0.47-0.68 ns an
    element.  Its own function, not a flag of _map: Numba compiles both branches of a flag."""
    if same_data(y, x):
        block = np.empty(min(KEEP_BLOCK, y.size), y.dtype)
        for s in range(0, y.size, KEEP_BLOCK):
            part = y[s:s + KEEP_BLOCK]
            for i in range(part.size):
                block[i] = f(part[i], p0, p1)
            for i in range(part.size):
                part[i] = block[i]
    else:
        for i in range(y.size):
            y[i] = f(x[i], p0, p1)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def unary(v, n, f, lo, hi):
    """Run node n over elements [lo, hi): out[i] = f(x[i], p0, p1), with f an op's
    element function (njit, inlined: a distinct function makes a distinct loop, so an
    op's runner compiles its own math only)."""
    # the family's convention: an element function takes the node's two float parameters in
    # slot order (its op's fp declaration names them)
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    _map(f, out[lo:hi], operand(v, n, 0)[lo:hi], v.fp[n, 0], v.fp[n, 1])
    return OK


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see unary)
def unary_keeping(v, n, f, lo, hi):
    """unary for an f that returns its argument on some branch (see _map_keeping)."""
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    _map_keeping(f, out[lo:hi], operand(v, n, 0)[lo:hi], v.fp[n, 0], v.fp[n, 1])
    return OK


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see unary)
def unary_chunk(v, n, f, m):
    """A group's chunk of node n (ops/group.py): y[i] = f(x[i], p0, p1) for the m elements at
    the chunk's addresses.  An op's chunk runner, compiled only for programs that fuse it."""
    _map(f, chunk_operand(v, 0, m), chunk_operand(v, 1, m), v.fp[n, 0], v.fp[n, 1])
    return OK


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see unary)
def unary_chunk_keeping(v, n, f, m):
    """unary_chunk for an f that returns its argument (see _map_keeping)."""
    _map_keeping(f, chunk_operand(v, 0, m), chunk_operand(v, 1, m), v.fp[n, 0], v.fp[n, 1])
    return OK


# ---- neg ------------------------------------------------------------------------------------------
def neg(t: Tensor) -> Tensor:
    """-t."""
    return _unary(NEG, "neg", t)


@njit(cache=True, error_model="numpy")
def _neg(a, p0, p1):
    return -a


def _run_neg(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _neg, lo, hi)


def _chunk_neg(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _neg, hi)


defop(NEG, "neg", neg, _run_neg, arity=1, kind=ELEMENTWISE, chunk=_chunk_neg,
      vjp=lambda g: -g)


# ---- sqr ------------------------------------------------------------------------------------------
def sqr(t: Tensor) -> Tensor:
    """t * t."""
    return _unary(SQR, "sqr", t)


@njit(cache=True, error_model="numpy")
def _sqr(a, p0, p1):
    return a * a


def _run_sqr(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sqr, lo, hi)


def _chunk_sqr(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _sqr, hi)


defop(SQR, "sqr", sqr, _run_sqr, arity=1, kind=ELEMENTWISE, chunk=_chunk_sqr,
      vjp=lambda g, x: g * (2.0 * x))


# ---- sqrt -----------------------------------------------------------------------------------------
def sqrt(t: Tensor) -> Tensor:
    """The square root of t (NaN below 0, as numpy)."""
    return _unary(SQRT, "sqrt", t)


@njit(cache=True, error_model="numpy")
def _sqrt(a, p0, p1):
    return np.sqrt(a)


def _run_sqrt(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sqrt, lo, hi)


def _chunk_sqrt(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _sqrt, hi)


defop(SQRT, "sqrt", sqrt, _run_sqrt, arity=1, kind=ELEMENTWISE, chunk=_chunk_sqrt, flops=4,
      vjp=lambda g, out: 0.5 * g / out)


# ---- exp ------------------------------------------------------------------------------------------
def exp(t: Tensor) -> Tensor:
    """e ** t."""
    return _unary(EXP, "exp", t)


@njit(cache=True, error_model="numpy")
def _exp(a, p0, p1):
    return vmath.exp(a)


def _run_exp(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _exp, lo, hi)


def _chunk_exp(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _exp, hi)


defop(EXP, "exp", exp, _run_exp, arity=1, kind=ELEMENTWISE, chunk=_chunk_exp, flops=8,
      vjp=lambda g, out: g * out)


# ---- log ------------------------------------------------------------------------------------------
def log(t: Tensor) -> Tensor:
    """The natural logarithm of t (-inf at 0, NaN below, as numpy)."""
    return _unary(LOG, "log", t)


@njit(cache=True, error_model="numpy")
def _log(a, p0, p1):
    return vmath.log(a)


def _run_log(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _log, lo, hi)


def _chunk_log(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _log, hi)


defop(LOG, "log", log, _run_log, arity=1, kind=ELEMENTWISE, chunk=_chunk_log, flops=8,
      vjp=lambda g, x: g / x)


# ---- abs ------------------------------------------------------------------------------------------
def abs(t: Tensor) -> Tensor:                  # noqa: A001 -- jg.abs, like numpy's
    """|t|; its gradient at 0 is 0."""
    return _unary(ABS, "abs", t)


@njit(cache=True, error_model="numpy")
def _abs(a, p0, p1):
    return np.abs(a)


def _run_abs(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _abs, lo, hi)


def _chunk_abs(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _abs, hi)


defop(ABS, "abs", abs, _run_abs, arity=1, kind=ELEMENTWISE, chunk=_chunk_abs,
      vjp=lambda g, x: g * op.sign(x))


# ---- relu -----------------------------------------------------------------------------------------
def relu(t: Tensor) -> Tensor:
    """max(t, 0); its gradient at 0 is 0."""
    return _unary(RELU, "relu", t)


@njit(cache=True, error_model="numpy")
def _relu(a, p0, p1):
    return like(a, 0.0) if a <= like(a, 0.0) else a        # NaN passes through, like numpy


def _run_relu(n, lo, hi, ctx, mem, store):
    return unary_keeping(run_view(ctx, mem, store), n, _relu, lo, hi)    # returns its input (see _map_keeping)


def _chunk_relu(n, lo, hi, ctx, mem, store):
    return unary_chunk_keeping(run_view(ctx, mem, store), n, _relu, hi)


defop(RELU, "relu", relu, _run_relu, arity=1, kind=ELEMENTWISE, chunk=_chunk_relu,
      vjp=lambda g, out: op.relu_d(g, out))          # g * [out > 0]: reads the output, so x can die


# ---- gelu -----------------------------------------------------------------------------------------
def gelu(t: Tensor) -> Tensor:
    """Exact (erf) GELU, as torch.nn.functional.gelu's default."""
    return _unary(GELU, "gelu", t)


@njit(cache=True, error_model="numpy")
def _gelu(a, p0, p1):
    # x Phi(x), exact (erf) form
    return a * vmath.phi_cdf(a)


def _run_gelu(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _gelu, lo, hi)


def _chunk_gelu(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _gelu, hi)


# gelu's gradient in one node, gelu_grad(g, x) = g * gelu_d(x), which gives the same bits (False:
# the two nodes, as the rules were recorded before it: tests/test_rule_programs.py)
GRAD_IN_ONE_NODE = True


def _gelu_vjp(g, x):
    return op.gelu_grad(g, x) if GRAD_IN_ONE_NODE else g * op.gelu_d(x)


defop(GELU, "gelu", gelu, _run_gelu, arity=1, kind=ELEMENTWISE, chunk=_chunk_gelu, flops=16, vjp=_gelu_vjp)


# ---- silu -----------------------------------------------------------------------------------------
def silu(t: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return _unary(SILU, "silu", t)


@njit(cache=True, error_model="numpy")
def _silu(a, p0, p1):
    return a * vmath.sigmoid(a)


def _run_silu(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _silu, lo, hi)


def _chunk_silu(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _silu, hi)


defop(SILU, "silu", silu, _run_silu, arity=1, kind=ELEMENTWISE, chunk=_chunk_silu, flops=10,
      vjp=lambda g, x: g * op.silu_d(x))


# ---- tanh -----------------------------------------------------------------------------------------
def tanh(t: Tensor) -> Tensor:
    """The hyperbolic tangent of t."""
    return _unary(TANH, "tanh", t)


@njit(cache=True, error_model="numpy")
def _tanh(a, p0, p1):
    return vmath.tanh(a)


def _run_tanh(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _tanh, lo, hi)


def _chunk_tanh(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _tanh, hi)


defop(TANH, "tanh", tanh, _run_tanh, arity=1, kind=ELEMENTWISE, chunk=_chunk_tanh, flops=10,
      vjp=lambda g, out: g * (1.0 - op.sqr(out)))


# ---- sigmoid --------------------------------------------------------------------------------------
def sigmoid(t: Tensor) -> Tensor:
    """1 / (1 + exp(-t)), computed without overflow."""
    return _unary(SIGMOID, "sigmoid", t)


@njit(cache=True, error_model="numpy")
def _sigmoid(a, p0, p1):
    return vmath.sigmoid(a)


def _run_sigmoid(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sigmoid, lo, hi)


def _chunk_sigmoid(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _sigmoid, hi)


defop(SIGMOID, "sigmoid", sigmoid, _run_sigmoid, arity=1, kind=ELEMENTWISE, chunk=_chunk_sigmoid, flops=10,
      vjp=lambda g, out: g * (out * (1.0 - out)))


# ---- copy -----------------------------------------------------------------------------------------
def copy(t: Tensor) -> Tensor:
    """An identity op that owns its own buffer."""
    return _unary(COPY, "copy", t)


@njit(cache=True, error_model="numpy")
def _copy(a, p0, p1):
    return a


def _run_copy(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _copy, lo, hi)


def _chunk_copy(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _copy, hi)


defop(COPY, "copy", copy, _run_copy, arity=1, kind=ELEMENTWISE, chunk=_chunk_copy,
      vjp=lambda g: g)


# ---- leaky_relu -----------------------------------------------------------------------------------
def leaky_relu(t: Tensor, slope: float = 0.01) -> Tensor:
    """t where t > 0, else slope * t; its gradient at 0 is ``slope`` (as relu's is 0)."""
    t = need_tensor(t, "leaky_relu")
    if not is_scalar(slope):
        raise GraphError(f"leaky_relu of {t.label!r}: slope must be a real number, got {slope!r}")
    return _unary(LEAKY_RELU, "leaky_relu", t, slots(LeakyReluFP, slope=float(slope)))


@njit(cache=True, error_model="numpy")
def _leaky_relu(a, p0, p1):
    # x if x > 0 else slope x
    return a if a > like(a, 0.0) else like(a, p0) * a


def _run_leaky_relu(n, lo, hi, ctx, mem, store):
    return unary_keeping(run_view(ctx, mem, store), n, _leaky_relu, lo, hi)    # returns its input (see _map_keeping)


def _chunk_leaky_relu(n, lo, hi, ctx, mem, store):
    return unary_chunk_keeping(run_view(ctx, mem, store), n, _leaky_relu, hi)


defop(LEAKY_RELU, "leaky_relu", leaky_relu, _run_leaky_relu, arity=1, kind=ELEMENTWISE, chunk=_chunk_leaky_relu,
      flops=2, fp=LeakyReluFP, vjp=lambda g, x, slope: g * op.affine(op.step(x), scale=1.0 - slope, shift=slope))
