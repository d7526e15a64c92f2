"""The derivative ops gradient rules append: step, sign, relu_d, gelu_d, gelu_grad, gelu_dd,
silu_d, silu_dd -- unary ops in ops/unary.py's calling convention, and the fused gradient
nodes ``g * f'(x)`` (``times``: one pass where a derivative and a mul took two, with their
bits).  None is public: a graph gets them from ``jg.grad``.
"""
from numba import njit

from .. import vmath
from ..graph import Tensor
from ..native import chunk_operand, operand, output, run_view, same_data, span
from ..registry import (ELEMENTWISE, GELU_D, GELU_DD, GELU_GRAD, RELU_D, SIGN, SILU_D, SILU_DD, STEP, ZERO_GRAD,
                        defop)
from ..rules import op
from ..status import OK
from ..vmath import like
from .common import need_pair
from .unary import _unary, unary, unary_chunk


# ---- step -----------------------------------------------------------------------------------------
def step(t: Tensor) -> Tensor:
    """1 where t > 0, else 0 (relu')."""
    return _unary(STEP, "step", t)


@njit(cache=True, error_model="numpy")
def _step(a, p0, p1):
    return like(a, 1.0) if a > like(a, 0.0) else like(a, 0.0)


def _run_step(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _step, lo, hi)


def _chunk_step(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _step, hi)


defop(STEP, "step", step, _run_step, ZERO_GRAD, arity=1, kind=ELEMENTWISE, chunk=_chunk_step, public=False)


@njit(cache=True, error_model="numpy", inline="always")   # f a function argument (see _map)
def _times_map(f, y, g, x, p0, p1):
    """y[i] = g[i] * f(x[i], p0, p1); in place over g or x, one array (see _map)."""
    if same_data(y, g):
        for i in range(y.size):
            y[i] = y[i] * f(x[i], p0, p1)
    elif same_data(y, x):
        for i in range(y.size):
            y[i] = g[i] * f(y[i], p0, p1)
    else:
        for i in range(y.size):
            y[i] = g[i] * f(x[i], p0, p1)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def times(v, n, f, lo, hi):
    """Run node n over elements [lo, hi): out[i] = g[i] * f(x[i], p0, p1) for its sources
    (g, x) of one shape, f a derivative op's element function: a gradient through an
    elementwise op in one pass, with the bits of mul(g, f(x)) (f's value is rounded to
    the dtype first, as that node's output was)."""
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    _times_map(f, out[lo:hi], operand(v, n, 0)[lo:hi], operand(v, n, 1)[lo:hi], v.fp[n, 0], v.fp[n, 1])
    return OK


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see unary)
def times_chunk(v, n, f, m):
    """A group's chunk of ``times`` (see unary_chunk)."""
    _times_map(f, chunk_operand(v, 0, m), chunk_operand(v, 1, m), chunk_operand(v, 2, m), v.fp[n, 0], v.fp[n, 1])
    return OK


def relu_d(g: Tensor, out: Tensor) -> Tensor:
    """g * step(out): relu's gradient from its output in one node (one compile and one
    pass where mul and step took two of each)."""
    g, out = need_pair("relu_d", g, out)
    return g.graph._node(RELU_D, (g.id, out.id), g.shape)


def _run_relu_d(n, lo, hi, ctx, mem, store):
    return times(run_view(ctx, mem, store), n, _step, lo, hi)


def _chunk_relu_d(n, lo, hi, ctx, mem, store):
    return times_chunk(run_view(ctx, mem, store), n, _step, hi)


defop(RELU_D, "relu_d", relu_d, _run_relu_d, arity=2, kind=ELEMENTWISE, chunk=_chunk_relu_d, public=False,
      sources=("g", "y"),
      vjp=lambda h, y: (op.relu_d(h, y), None))          # linear in g; step's own derivative is 0


def sign(t: Tensor) -> Tensor:
    """-1, 0 or 1 (abs'); sign(0) = 0."""
    return _unary(SIGN, "sign", t)


@njit(cache=True, error_model="numpy")
def _sign(a, p0, p1):
    return like(a, 1.0) if a > like(a, 0.0) else (like(a, -1.0) if a < like(a, 0.0) else a * like(a, 0.0))


def _run_sign(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sign, lo, hi)


def _chunk_sign(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _sign, hi)


defop(SIGN, "sign", sign, _run_sign, ZERO_GRAD, arity=1, kind=ELEMENTWISE, chunk=_chunk_sign, public=False)


def gelu_d(t: Tensor) -> Tensor:
    """gelu'(t) = Phi(t) + t phi(t)."""
    return _unary(GELU_D, "gelu_d", t)


@njit(cache=True, error_model="numpy")
def _gelu_d(a, p0, p1):
    # Phi(x) + x phi(x)
    cdf, pdf = vmath.normal(a)
    return cdf + a * pdf


def _run_gelu_d(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _gelu_d, lo, hi)


def _chunk_gelu_d(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _gelu_d, hi)


defop(GELU_D, "gelu_d", gelu_d, _run_gelu_d, arity=1, kind=ELEMENTWISE, chunk=_chunk_gelu_d, flops=16, public=False,
      vjp=lambda g, x: g * op.gelu_dd(x))


def gelu_grad(g: Tensor, x: Tensor) -> Tensor:
    """g * gelu'(x): gelu's gradient in one node, with the bits of mul(g, gelu_d(x)) (one pass
    where the two took two, and no gelu_d tensor in the plan)."""
    g, x = need_pair("gelu_grad", g, x)
    return g.graph._node(GELU_GRAD, (g.id, x.id), g.shape)


def _run_gelu_grad(n, lo, hi, ctx, mem, store):
    return times(run_view(ctx, mem, store), n, _gelu_d, lo, hi)


def _chunk_gelu_grad(n, lo, hi, ctx, mem, store):
    return times_chunk(run_view(ctx, mem, store), n, _gelu_d, hi)


defop(GELU_GRAD, "gelu_grad", gelu_grad, _run_gelu_grad, arity=2, kind=ELEMENTWISE, chunk=_chunk_gelu_grad, flops=17,
      public=False, sources=("g", "x"),
      vjp=lambda h, g, x: (op.gelu_grad(h, x), h * g * op.gelu_dd(x)))     # mul's and gelu_d's rules, composed


def gelu_dd(t: Tensor) -> Tensor:
    """gelu''(t) = phi(t) (2 - t^2); it has no gradient rule (third order is not offered)."""
    return _unary(GELU_DD, "gelu_dd", t)


@njit(cache=True, error_model="numpy")
def _gelu_dd(a, p0, p1):
    # phi(x) (2 - x^2)
    return vmath.phi_pdf(a) * (like(a, 2.0) - a * a)


def _run_gelu_dd(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _gelu_dd, lo, hi)


def _chunk_gelu_dd(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _gelu_dd, hi)


defop(GELU_DD, "gelu_dd", gelu_dd, _run_gelu_dd, arity=1, kind=ELEMENTWISE, chunk=_chunk_gelu_dd, flops=16,
      public=False)


def silu_d(t: Tensor) -> Tensor:
    """silu'(t) = s (1 + t (1 - s)), s = sigmoid(t)."""
    return _unary(SILU_D, "silu_d", t)


@njit(cache=True, error_model="numpy")
def _silu_d(a, p0, p1):
    # s (1 + x (1 - s))
    s = vmath.sigmoid(a)
    return s * (like(a, 1.0) + a * (like(a, 1.0) - s))


def _run_silu_d(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _silu_d, lo, hi)


def _chunk_silu_d(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _silu_d, hi)


defop(SILU_D, "silu_d", silu_d, _run_silu_d, arity=1, kind=ELEMENTWISE, chunk=_chunk_silu_d, flops=12, public=False,
      vjp=lambda g, x: g * op.silu_dd(x))


def silu_dd(t: Tensor) -> Tensor:
    """silu''(t); it has no gradient rule (third order is not offered)."""
    return _unary(SILU_DD, "silu_dd", t)


@njit(cache=True, error_model="numpy")
def _silu_dd(a, p0, p1):
    # s (1 - s) (2 + x (1 - 2 s))
    s = vmath.sigmoid(a)
    return s * (like(a, 1.0) - s) * (like(a, 2.0) + a * (like(a, 1.0) - like(a, 2.0) * s))


def _run_silu_dd(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _silu_dd, lo, hi)


def _chunk_silu_dd(n, lo, hi, ctx, mem, store):
    return unary_chunk(run_view(ctx, mem, store), n, _silu_dd, hi)


defop(SILU_DD, "silu_dd", silu_dd, _run_silu_dd, arity=1, kind=ELEMENTWISE, chunk=_chunk_silu_dd, flops=12,
      public=False)
