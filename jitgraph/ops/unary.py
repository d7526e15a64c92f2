"""Unary elementwise ops: out[i] = f(x[i]) over node n's one source.

Calling convention: each op has an element function ``_name(a, p0, p1)`` (params
fp[n, 0:2]) and a runner that hands it to :func:`unary`, which maps it over the
elements, in fixed blocks over the threads when the tensor is big.  Each op's runner
compiles its own loop with its own math only.  float32 math stays float32 and
vectorizes (vmath.py, ``like`` types the constants); float64 uses libm.
Derivative ops (step, sign, gelu_d ...) live here too: gradient rules append them.
"""
import numpy as np
from numba import njit

from .. import vmath

from ..emit import grad_node, grad_node_fp
from ..errors import GraphError
from ..graph import Tensor
from ..native import operand, output, rule_view, run_view, same_data, span
from ..registry import ELEMENTWISE, ZERO_GRAD, defop
from ..status import NO_CONTRIBUTION, OK
from .binary import AFFINE, DIV, MUL
from ..vmath import like
from .common import is_scalar, need_pair, need_tensor


NEG = 8
SQR, SQRT, EXP, LOG, ABS, RELU, GELU, SILU, TANH, SIGMOID, COPY = range(10, 21)
STEP, SIGN, GELU_D, GELU_DD, SILU_D, SILU_DD = range(21, 27)
LEAKY_RELU = 48
RELU_D = 88


# ---- the family's calling convention ------------------------------------------------------------
def _unary(code: int, what: str, t: Tensor, fp: tuple = ()) -> Tensor:
    t = need_tensor(t, what)
    return t.graph._node(code, (t.id,), t.shape, fp=fp)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def unary(v, n, f, lo, hi):
    """Run node n over elements [lo, hi): out[i] = f(x[i], p0, p1), with f an op's
    element function (njit, inlined: a distinct function makes a distinct loop, so an
    op's runner compiles its own math only)."""
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    y = out[lo:hi]                    # slices indexed from 0: no wraparound test, so the loops vectorize
    x = operand(v, n, 0)[lo:hi]
    p0 = v.fp[n, 0]
    p1 = v.fp[n, 1]
    if same_data(y, x):               # in place: one array, or LLVM's overlap check picks its scalar loop
        for i in range(y.size):
            y[i] = f(y[i], p0, p1)
    else:
        for i in range(y.size):
            y[i] = f(x[i], p0, p1)
    return OK


@njit(cache=True)
def times_derivative(G, st, g, d_op, d_src, n, k):
    """g * d_op(d_src): a gradient through a derivative op of the same shape."""
    return grad_node(G, st, MUL, g, grad_node(G, st, d_op, d_src, -1, d_src, n, k), n, n, k)


# ---- neg ------------------------------------------------------------------------------------------
def neg(t: Tensor) -> Tensor:
    """-t."""
    return _unary(NEG, "neg", t)


@njit(cache=True, error_model="numpy")
def _neg(a, p0, p1):
    return -a


def _run_neg(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _neg, lo, hi)


def _vjp_neg(n, k, g, ctx):
    G, st = rule_view(ctx)
    return grad_node(G, st, NEG, g, -1, g, n, k)


defop(NEG, "neg", neg, _run_neg, _vjp_neg, arity=1, kind=ELEMENTWISE)


# ---- sqr ------------------------------------------------------------------------------------------
def sqr(t: Tensor) -> Tensor:
    """t * t."""
    return _unary(SQR, "sqr", t)


@njit(cache=True, error_model="numpy")
def _sqr(a, p0, p1):
    return a * a


def _run_sqr(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sqr, lo, hi)


def _vjp_sqr(n, k, g, ctx):                    # g * 2x
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    return grad_node(G, st, MUL, g, grad_node_fp(G, st, AFFINE, x, 2.0, 0.0, n, k), n, n, k)


defop(SQR, "sqr", sqr, _run_sqr, _vjp_sqr, arity=1, kind=ELEMENTWISE)


# ---- sqrt -----------------------------------------------------------------------------------------
def sqrt(t: Tensor) -> Tensor:
    """The square root of t (NaN below 0, as numpy)."""
    return _unary(SQRT, "sqrt", t)


@njit(cache=True, error_model="numpy")
def _sqrt(a, p0, p1):
    return np.sqrt(a)


def _run_sqrt(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sqrt, lo, hi)


def _vjp_sqrt(n, k, g, ctx):                   # 0.5 g / out
    G, st = rule_view(ctx)
    return grad_node(G, st, DIV, grad_node_fp(G, st, AFFINE, g, 0.5, 0.0, n, k), n, n, n, k)


defop(SQRT, "sqrt", sqrt, _run_sqrt, _vjp_sqrt, arity=1, kind=ELEMENTWISE, flops=4)


# ---- exp ------------------------------------------------------------------------------------------
def exp(t: Tensor) -> Tensor:
    """e ** t."""
    return _unary(EXP, "exp", t)


@njit(cache=True, error_model="numpy")
def _exp(a, p0, p1):
    return vmath.exp(a)


def _run_exp(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _exp, lo, hi)


def _vjp_exp(n, k, g, ctx):                    # g * out
    G, st = rule_view(ctx)
    return grad_node(G, st, MUL, g, n, n, n, k)


defop(EXP, "exp", exp, _run_exp, _vjp_exp, arity=1, kind=ELEMENTWISE, flops=8)


# ---- log ------------------------------------------------------------------------------------------
def log(t: Tensor) -> Tensor:
    """The natural logarithm of t (-inf at 0, NaN below, as numpy)."""
    return _unary(LOG, "log", t)


@njit(cache=True, error_model="numpy")
def _log(a, p0, p1):
    return vmath.log(a)


def _run_log(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _log, lo, hi)


def _vjp_log(n, k, g, ctx):                    # g / x
    G, st = rule_view(ctx)
    return grad_node(G, st, DIV, g, G.src[n, 0], n, n, k)


defop(LOG, "log", log, _run_log, _vjp_log, arity=1, kind=ELEMENTWISE, flops=8)


# ---- abs ------------------------------------------------------------------------------------------
def abs(t: Tensor) -> Tensor:                  # noqa: A001 -- jg.abs, like numpy's
    """|t|; its gradient at 0 is 0."""
    return _unary(ABS, "abs", t)


@njit(cache=True, error_model="numpy")
def _abs(a, p0, p1):
    return np.abs(a)


def _run_abs(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _abs, lo, hi)


def _vjp_abs(n, k, g, ctx):                    # g * sign(x); 0 at x = 0
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, SIGN, G.src[n, 0], n, k)


defop(ABS, "abs", abs, _run_abs, _vjp_abs, arity=1, kind=ELEMENTWISE)


# ---- relu -----------------------------------------------------------------------------------------
def relu(t: Tensor) -> Tensor:
    """max(t, 0); its gradient at 0 is 0."""
    return _unary(RELU, "relu", t)


@njit(cache=True, error_model="numpy")
def _relu(a, p0, p1):
    return like(a, 0.0) if a <= like(a, 0.0) else a        # NaN passes through, like numpy


def _run_relu(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _relu, lo, hi)


def _vjp_relu(n, k, g, ctx):                   # g * [out > 0]: reads the output, so x can die
    G, st = rule_view(ctx)
    return grad_node(G, st, RELU_D, g, n, n, n, k)


defop(RELU, "relu", relu, _run_relu, _vjp_relu, arity=1, kind=ELEMENTWISE)


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


def _vjp_gelu(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, GELU_D, G.src[n, 0], n, k)


defop(GELU, "gelu", gelu, _run_gelu, _vjp_gelu, arity=1, kind=ELEMENTWISE, flops=16)


# ---- silu -----------------------------------------------------------------------------------------
def silu(t: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return _unary(SILU, "silu", t)


@njit(cache=True, error_model="numpy")
def _silu(a, p0, p1):
    return a * vmath.sigmoid(a)


def _run_silu(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _silu, lo, hi)


def _vjp_silu(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, SILU_D, G.src[n, 0], n, k)


defop(SILU, "silu", silu, _run_silu, _vjp_silu, arity=1, kind=ELEMENTWISE, flops=10)


# ---- tanh -----------------------------------------------------------------------------------------
def tanh(t: Tensor) -> Tensor:
    """The hyperbolic tangent of t."""
    return _unary(TANH, "tanh", t)


@njit(cache=True, error_model="numpy")
def _tanh(a, p0, p1):
    return vmath.tanh(a)


def _run_tanh(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _tanh, lo, hi)


def _vjp_tanh(n, k, g, ctx):                   # g * (1 - out^2)
    G, st = rule_view(ctx)
    t = grad_node(G, st, SQR, n, -1, n, n, k)
    return grad_node(G, st, MUL, g, grad_node_fp(G, st, AFFINE, t, -1.0, 1.0, n, k), n, n, k)


defop(TANH, "tanh", tanh, _run_tanh, _vjp_tanh, arity=1, kind=ELEMENTWISE, flops=10)


# ---- sigmoid --------------------------------------------------------------------------------------
def sigmoid(t: Tensor) -> Tensor:
    """1 / (1 + exp(-t)), computed without overflow."""
    return _unary(SIGMOID, "sigmoid", t)


@njit(cache=True, error_model="numpy")
def _sigmoid(a, p0, p1):
    return vmath.sigmoid(a)


def _run_sigmoid(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sigmoid, lo, hi)


def _vjp_sigmoid(n, k, g, ctx):                # g * out (1 - out)
    G, st = rule_view(ctx)
    t = grad_node(G, st, MUL, n, grad_node_fp(G, st, AFFINE, n, -1.0, 1.0, n, k), n, n, k)
    return grad_node(G, st, MUL, g, t, n, n, k)


defop(SIGMOID, "sigmoid", sigmoid, _run_sigmoid, _vjp_sigmoid, arity=1, kind=ELEMENTWISE, flops=10)


# ---- copy -----------------------------------------------------------------------------------------
def copy(t: Tensor) -> Tensor:
    """An identity op that owns its own buffer."""
    return _unary(COPY, "copy", t)


@njit(cache=True, error_model="numpy")
def _copy(a, p0, p1):
    return a


def _run_copy(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _copy, lo, hi)


def _vjp_copy(n, k, g, ctx):
    return g


defop(COPY, "copy", copy, _run_copy, _vjp_copy, arity=1, kind=ELEMENTWISE)


# ---- derivative ops (appended by the rules above) -------------------------------------------------
def step(t: Tensor) -> Tensor:
    """1 where t > 0, else 0 (relu')."""
    return _unary(STEP, "step", t)


@njit(cache=True, error_model="numpy")
def _step(a, p0, p1):
    return like(a, 1.0) if a > like(a, 0.0) else like(a, 0.0)


def _run_step(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _step, lo, hi)


defop(STEP, "step", step, _run_step, ZERO_GRAD, arity=1, kind=ELEMENTWISE, public=False)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def times(v, n, f, lo, hi):
    """Run node n over elements [lo, hi): out[i] = g[i] * f(x[i], p0, p1) for its sources
    (g, x) of one shape, f a derivative op's element function: a gradient through an
    elementwise op in one pass, with the bits of mul(g, f(x)) (f's value is rounded to
    the dtype first, as that node's output was)."""
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    y = out[lo:hi]                    # slices from 0 and in-place cases apart: see unary
    g = operand(v, n, 0)[lo:hi]
    x = operand(v, n, 1)[lo:hi]
    p0 = v.fp[n, 0]
    p1 = v.fp[n, 1]
    if same_data(y, g):
        for i in range(y.size):
            y[i] = y[i] * f(x[i], p0, p1)
    elif same_data(y, x):
        for i in range(y.size):
            y[i] = g[i] * f(y[i], p0, p1)
    else:
        for i in range(y.size):
            y[i] = g[i] * f(x[i], p0, p1)
    return OK


def relu_d(g: Tensor, out: Tensor) -> Tensor:
    """g * step(out): relu's gradient from its output in one node (one compile and one
    pass where mul and step took two of each)."""
    g, out = need_pair("relu_d", g, out)
    return g.graph._node(RELU_D, (g.id, out.id), g.shape)


def _run_relu_d(n, lo, hi, ctx, mem, store):
    return times(run_view(ctx, mem, store), n, _step, lo, hi)


def _vjp_relu_d(n, k, g, ctx):                 # linear in g; step's own derivative is 0
    if k == 1:
        return NO_CONTRIBUTION
    G, st = rule_view(ctx)
    return grad_node(G, st, RELU_D, g, G.src[n, 1], n, n, k)


defop(RELU_D, "relu_d", relu_d, _run_relu_d, _vjp_relu_d, arity=2, kind=ELEMENTWISE, public=False)


def sign(t: Tensor) -> Tensor:
    """-1, 0 or 1 (abs'); sign(0) = 0."""
    return _unary(SIGN, "sign", t)


@njit(cache=True, error_model="numpy")
def _sign(a, p0, p1):
    return like(a, 1.0) if a > like(a, 0.0) else (like(a, -1.0) if a < like(a, 0.0) else a * like(a, 0.0))


def _run_sign(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _sign, lo, hi)


defop(SIGN, "sign", sign, _run_sign, ZERO_GRAD, arity=1, kind=ELEMENTWISE, public=False)


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


def _vjp_gelu_d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, GELU_DD, G.src[n, 0], n, k)


defop(GELU_D, "gelu_d", gelu_d, _run_gelu_d, _vjp_gelu_d, arity=1, kind=ELEMENTWISE, flops=16, public=False)


def gelu_dd(t: Tensor) -> Tensor:
    """gelu''(t) = phi(t) (2 - t^2); it has no gradient rule (third order is not offered)."""
    return _unary(GELU_DD, "gelu_dd", t)


@njit(cache=True, error_model="numpy")
def _gelu_dd(a, p0, p1):
    # phi(x) (2 - x^2)
    return vmath.phi_pdf(a) * (like(a, 2.0) - a * a)


def _run_gelu_dd(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _gelu_dd, lo, hi)


defop(GELU_DD, "gelu_dd", gelu_dd, _run_gelu_dd, arity=1, kind=ELEMENTWISE, flops=16, public=False)


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


def _vjp_silu_d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, SILU_DD, G.src[n, 0], n, k)


defop(SILU_D, "silu_d", silu_d, _run_silu_d, _vjp_silu_d, arity=1, kind=ELEMENTWISE, flops=12, public=False)


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


defop(SILU_DD, "silu_dd", silu_dd, _run_silu_dd, arity=1, kind=ELEMENTWISE, flops=12, public=False)


# ---- leaky_relu -----------------------------------------------------------------------------------
def leaky_relu(t: Tensor, slope: float = 0.01) -> Tensor:
    """t where t > 0, else slope * t; its gradient at 0 is ``slope`` (as relu's is 0)."""
    t = need_tensor(t, "leaky_relu")
    if not is_scalar(slope):
        raise GraphError(f"leaky_relu of {t.label!r}: slope must be a real number, got {slope!r}")
    return _unary(LEAKY_RELU, "leaky_relu", t, (float(slope),))


@njit(cache=True, error_model="numpy")
def _leaky_relu(a, p0, p1):
    # x if x > 0 else slope x
    return a if a > like(a, 0.0) else like(a, p0) * a


def _run_leaky_relu(n, lo, hi, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, _leaky_relu, lo, hi)


def _vjp_leaky_relu(n, k, g, ctx):             # g * (slope + (1 - slope) [x > 0])
    G, st = rule_view(ctx)
    slope = G.fp[n, 0]
    d = grad_node(G, st, STEP, G.src[n, 0], -1, n, n, k)
    return grad_node(G, st, MUL, g, grad_node_fp(G, st, AFFINE, d, 1.0 - slope, slope, n, k), n, n, k)


defop(LEAKY_RELU, "leaky_relu", leaky_relu, _run_leaky_relu, _vjp_leaky_relu, arity=1, kind=ELEMENTWISE, flops=2)
