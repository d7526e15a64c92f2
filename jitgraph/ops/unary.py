"""Unary elementwise ops: out[i] = f(x[i]) over node n's one source.

Calling convention: a runner hands its op code to :func:`unary`, which reads the
output and operand slices and the float params fp[n, 0:2]; Numba compiles that
loop for the literal code, so each op's runner holds its own loop and nothing else.
Derivative ops (step, sign, gelu_d ...) live here too: gradient rules append them.
"""
import math

from numba import njit

from ..emit import grad_node, grad_node_fp
from ..errors import GraphError
from ..graph import Tensor
from ..native import operand, output, rule_view, run_view
from ..registry import ELEMENTWISE, ZERO_GRAD, defop
from ..status import OK
from .binary import AFFINE, DIV, MUL
from .common import is_scalar, need_tensor

__all__ = ["neg", "sqr", "sqrt", "exp", "log", "abs", "relu", "gelu", "silu", "tanh", "sigmoid", "copy",
           "leaky_relu"]

NEG = 8
SQR, SQRT, EXP, LOG, ABS, RELU, GELU, SILU, TANH, SIGMOID, COPY = range(10, 21)
STEP, SIGN, GELU_D, GELU_DD, SILU_D, SILU_DD = range(21, 27)
LEAKY_RELU = 48

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


# ---- the family's calling convention ------------------------------------------------------------
def _unary(code: int, what: str, t: Tensor, fp: tuple = ()) -> Tensor:
    t = need_tensor(t, what)
    return t.graph._node(code, (t.id,), t.shape, fp=fp)


@njit(cache=True, error_model="numpy")
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def unary(v, n, code):
    """Run unary op ``code`` (a literal: one loop per op) for node n."""
    out = output(v, n)
    x = operand(v, n, 0)
    p0 = v.fp[n, 0]
    p1 = v.fp[n, 1]
    size = out.size
    if code == NEG:
        for i in range(size):
            out[i] = -x[i]
    elif code == SQR:
        for i in range(size):
            out[i] = x[i] * x[i]
    elif code == SQRT:
        for i in range(size):
            out[i] = math.sqrt(x[i])
    elif code == EXP:
        for i in range(size):
            out[i] = math.exp(x[i])
    elif code == LOG:
        for i in range(size):
            out[i] = math.log(x[i])
    elif code == ABS:
        for i in range(size):
            out[i] = math.fabs(x[i])
    elif code == RELU:
        for i in range(size):
            a = x[i]
            out[i] = 0.0 if a <= 0.0 else a          # NaN passes through, like numpy
    elif code == GELU:
        for i in range(size):
            a = x[i]
            out[i] = 0.5 * a * (1.0 + math.erf(a * _INV_SQRT2))
    elif code == SILU:
        for i in range(size):
            a = x[i]
            out[i] = a * _sigmoid(a)
    elif code == TANH:
        for i in range(size):
            out[i] = math.tanh(x[i])
    elif code == SIGMOID:
        for i in range(size):
            out[i] = _sigmoid(x[i])
    elif code == COPY:
        for i in range(size):
            out[i] = x[i]
    elif code == STEP:
        for i in range(size):
            out[i] = 1.0 if x[i] > 0.0 else 0.0
    elif code == SIGN:
        for i in range(size):
            a = x[i]
            out[i] = 1.0 if a > 0.0 else (-1.0 if a < 0.0 else a * 0.0)
    elif code == GELU_D:      # Phi(x) + x phi(x)
        for i in range(size):
            a = x[i]
            out[i] = 0.5 * (1.0 + math.erf(a * _INV_SQRT2)) + a * _INV_SQRT_2PI * math.exp(-0.5 * a * a)
    elif code == GELU_DD:     # phi(x) (2 - x^2)
        for i in range(size):
            a = x[i]
            out[i] = _INV_SQRT_2PI * math.exp(-0.5 * a * a) * (2.0 - a * a)
    elif code == SILU_D:      # s (1 + x (1 - s))
        for i in range(size):
            a = x[i]
            s = _sigmoid(a)
            out[i] = s * (1.0 + a * (1.0 - s))
    elif code == SILU_DD:     # s (1 - s) (2 + x (1 - 2 s))
        for i in range(size):
            a = x[i]
            s = _sigmoid(a)
            out[i] = s * (1.0 - s) * (2.0 + a * (1.0 - 2.0 * s))
    elif code == LEAKY_RELU:  # x if x > 0 else slope x
        for i in range(size):
            a = x[i]
            out[i] = a if a > 0.0 else p0 * a
    return OK


@njit(cache=True)
def times_derivative(G, st, g, d_op, d_src, n, k):
    """g * d_op(d_src): a gradient through a derivative op of the same shape."""
    return grad_node(G, st, MUL, g, grad_node(G, st, d_op, d_src, -1, d_src, n, k), n, n, k)


# ---- neg ------------------------------------------------------------------------------------------
def neg(t: Tensor) -> Tensor:
    """-t."""
    return _unary(NEG, "neg", t)


def _run_neg(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, NEG)


def _vjp_neg(n, k, g, ctx):
    G, st = rule_view(ctx)
    return grad_node(G, st, NEG, g, -1, g, n, k)


defop(NEG, "neg", neg, _run_neg, _vjp_neg, arity=1, kind=ELEMENTWISE)


# ---- sqr ------------------------------------------------------------------------------------------
def sqr(t: Tensor) -> Tensor:
    """t * t."""
    return _unary(SQR, "sqr", t)


def _run_sqr(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SQR)


def _vjp_sqr(n, k, g, ctx):                    # g * 2x
    G, st = rule_view(ctx)
    x = G.src[n, 0]
    return grad_node(G, st, MUL, g, grad_node_fp(G, st, AFFINE, x, 2.0, 0.0, n, k), n, n, k)


defop(SQR, "sqr", sqr, _run_sqr, _vjp_sqr, arity=1, kind=ELEMENTWISE)


# ---- sqrt -----------------------------------------------------------------------------------------
def sqrt(t: Tensor) -> Tensor:
    """The square root of t (NaN below 0, as numpy)."""
    return _unary(SQRT, "sqrt", t)


def _run_sqrt(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SQRT)


def _vjp_sqrt(n, k, g, ctx):                   # 0.5 g / out
    G, st = rule_view(ctx)
    return grad_node(G, st, DIV, grad_node_fp(G, st, AFFINE, g, 0.5, 0.0, n, k), n, n, n, k)


defop(SQRT, "sqrt", sqrt, _run_sqrt, _vjp_sqrt, arity=1, kind=ELEMENTWISE, flops=4)


# ---- exp ------------------------------------------------------------------------------------------
def exp(t: Tensor) -> Tensor:
    """e ** t."""
    return _unary(EXP, "exp", t)


def _run_exp(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, EXP)


def _vjp_exp(n, k, g, ctx):                    # g * out
    G, st = rule_view(ctx)
    return grad_node(G, st, MUL, g, n, n, n, k)


defop(EXP, "exp", exp, _run_exp, _vjp_exp, arity=1, kind=ELEMENTWISE, flops=8)


# ---- log ------------------------------------------------------------------------------------------
def log(t: Tensor) -> Tensor:
    """The natural logarithm of t (-inf at 0, NaN below, as numpy)."""
    return _unary(LOG, "log", t)


def _run_log(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, LOG)


def _vjp_log(n, k, g, ctx):                    # g / x
    G, st = rule_view(ctx)
    return grad_node(G, st, DIV, g, G.src[n, 0], n, n, k)


defop(LOG, "log", log, _run_log, _vjp_log, arity=1, kind=ELEMENTWISE, flops=8)


# ---- abs ------------------------------------------------------------------------------------------
def abs(t: Tensor) -> Tensor:                  # noqa: A001 -- jg.abs, like numpy's
    """|t|; its gradient at 0 is 0."""
    return _unary(ABS, "abs", t)


def _run_abs(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, ABS)


def _vjp_abs(n, k, g, ctx):                    # g * sign(x); 0 at x = 0
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, SIGN, G.src[n, 0], n, k)


defop(ABS, "abs", abs, _run_abs, _vjp_abs, arity=1, kind=ELEMENTWISE)


# ---- relu -----------------------------------------------------------------------------------------
def relu(t: Tensor) -> Tensor:
    """max(t, 0); its gradient at 0 is 0."""
    return _unary(RELU, "relu", t)


def _run_relu(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, RELU)


def _vjp_relu(n, k, g, ctx):                   # g * [out > 0]: reads the output, so x can die
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, STEP, n, n, k)


defop(RELU, "relu", relu, _run_relu, _vjp_relu, arity=1, kind=ELEMENTWISE)


# ---- gelu -----------------------------------------------------------------------------------------
def gelu(t: Tensor) -> Tensor:
    """Exact (erf) GELU, as torch.nn.functional.gelu's default."""
    return _unary(GELU, "gelu", t)


def _run_gelu(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, GELU)


def _vjp_gelu(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, GELU_D, G.src[n, 0], n, k)


defop(GELU, "gelu", gelu, _run_gelu, _vjp_gelu, arity=1, kind=ELEMENTWISE, flops=16)


# ---- silu -----------------------------------------------------------------------------------------
def silu(t: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return _unary(SILU, "silu", t)


def _run_silu(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SILU)


def _vjp_silu(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, SILU_D, G.src[n, 0], n, k)


defop(SILU, "silu", silu, _run_silu, _vjp_silu, arity=1, kind=ELEMENTWISE, flops=10)


# ---- tanh -----------------------------------------------------------------------------------------
def tanh(t: Tensor) -> Tensor:
    """The hyperbolic tangent of t."""
    return _unary(TANH, "tanh", t)


def _run_tanh(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, TANH)


def _vjp_tanh(n, k, g, ctx):                   # g * (1 - out^2)
    G, st = rule_view(ctx)
    t = grad_node(G, st, SQR, n, -1, n, n, k)
    return grad_node(G, st, MUL, g, grad_node_fp(G, st, AFFINE, t, -1.0, 1.0, n, k), n, n, k)


defop(TANH, "tanh", tanh, _run_tanh, _vjp_tanh, arity=1, kind=ELEMENTWISE, flops=10)


# ---- sigmoid --------------------------------------------------------------------------------------
def sigmoid(t: Tensor) -> Tensor:
    """1 / (1 + exp(-t)), computed without overflow."""
    return _unary(SIGMOID, "sigmoid", t)


def _run_sigmoid(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SIGMOID)


def _vjp_sigmoid(n, k, g, ctx):                # g * out (1 - out)
    G, st = rule_view(ctx)
    t = grad_node(G, st, MUL, n, grad_node_fp(G, st, AFFINE, n, -1.0, 1.0, n, k), n, n, k)
    return grad_node(G, st, MUL, g, t, n, n, k)


defop(SIGMOID, "sigmoid", sigmoid, _run_sigmoid, _vjp_sigmoid, arity=1, kind=ELEMENTWISE, flops=10)


# ---- copy -----------------------------------------------------------------------------------------
def copy(t: Tensor) -> Tensor:
    """An identity op that owns its own buffer."""
    return _unary(COPY, "copy", t)


def _run_copy(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, COPY)


def _vjp_copy(n, k, g, ctx):
    return g


defop(COPY, "copy", copy, _run_copy, _vjp_copy, arity=1, kind=ELEMENTWISE)


# ---- derivative ops (appended by the rules above) -------------------------------------------------
def step(t: Tensor) -> Tensor:
    """1 where t > 0, else 0 (relu')."""
    return _unary(STEP, "step", t)


def _run_step(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, STEP)


defop(STEP, "step", step, _run_step, ZERO_GRAD, arity=1, kind=ELEMENTWISE, public=False)


def sign(t: Tensor) -> Tensor:
    """-1, 0 or 1 (abs'); sign(0) = 0."""
    return _unary(SIGN, "sign", t)


def _run_sign(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SIGN)


defop(SIGN, "sign", sign, _run_sign, ZERO_GRAD, arity=1, kind=ELEMENTWISE, public=False)


def gelu_d(t: Tensor) -> Tensor:
    """gelu'(t) = Phi(t) + t phi(t)."""
    return _unary(GELU_D, "gelu_d", t)


def _run_gelu_d(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, GELU_D)


def _vjp_gelu_d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, GELU_DD, G.src[n, 0], n, k)


defop(GELU_D, "gelu_d", gelu_d, _run_gelu_d, _vjp_gelu_d, arity=1, kind=ELEMENTWISE, flops=16, public=False)


def gelu_dd(t: Tensor) -> Tensor:
    """gelu''(t) = phi(t) (2 - t^2); it has no gradient rule (third order is not offered)."""
    return _unary(GELU_DD, "gelu_dd", t)


def _run_gelu_dd(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, GELU_DD)


defop(GELU_DD, "gelu_dd", gelu_dd, _run_gelu_dd, arity=1, kind=ELEMENTWISE, flops=16, public=False)


def silu_d(t: Tensor) -> Tensor:
    """silu'(t) = s (1 + t (1 - s)), s = sigmoid(t)."""
    return _unary(SILU_D, "silu_d", t)


def _run_silu_d(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SILU_D)


def _vjp_silu_d(n, k, g, ctx):
    G, st = rule_view(ctx)
    return times_derivative(G, st, g, SILU_DD, G.src[n, 0], n, k)


defop(SILU_D, "silu_d", silu_d, _run_silu_d, _vjp_silu_d, arity=1, kind=ELEMENTWISE, flops=12, public=False)


def silu_dd(t: Tensor) -> Tensor:
    """silu''(t); it has no gradient rule (third order is not offered)."""
    return _unary(SILU_DD, "silu_dd", t)


def _run_silu_dd(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, SILU_DD)


defop(SILU_DD, "silu_dd", silu_dd, _run_silu_dd, arity=1, kind=ELEMENTWISE, flops=12, public=False)


# ---- leaky_relu -----------------------------------------------------------------------------------
def leaky_relu(t: Tensor, slope: float = 0.01) -> Tensor:
    """t where t > 0, else slope * t; its gradient at 0 is ``slope`` (as relu's is 0)."""
    t = need_tensor(t, "leaky_relu")
    if not is_scalar(slope):
        raise GraphError(f"leaky_relu of {t.label!r}: slope must be a real number, got {slope!r}")
    return _unary(LEAKY_RELU, "leaky_relu", t, (float(slope),))


def _run_leaky_relu(n, ctx, mem, store):
    return unary(run_view(ctx, mem, store), n, LEAKY_RELU)


def _vjp_leaky_relu(n, k, g, ctx):             # g * (slope + (1 - slope) [x > 0])
    G, st = rule_view(ctx)
    slope = G.fp[n, 0]
    d = grad_node(G, st, STEP, G.src[n, 0], -1, n, n, k)
    return grad_node(G, st, MUL, g, grad_node_fp(G, st, AFFINE, d, 1.0 - slope, slope, n, k), n, n, k)


defop(LEAKY_RELU, "leaky_relu", leaky_relu, _run_leaky_relu, _vjp_leaky_relu, arity=1, kind=ELEMENTWISE, flops=2)
