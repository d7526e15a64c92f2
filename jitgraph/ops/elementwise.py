"""Elementwise ops: + - * / with numpy broadcasting, and the unary math ops.

Each op: declaration (kind, cost class), Python shape rule, kernel, gradient
rule.  Binary kernels handle broadcasting with per-dim strides (0 along a
broadcast dim); unary kernels are one flat loop per op so LLVM vectorizes them.
"""
import math

from numba import njit

from .._sigs import G as G_T, ST, f64, i64
from ..emit import new_node
from ..errors import GraphError
from ..graph import Tensor
from ..ir import F_GRAD
from .common import KERNEL, as_tensor, broadcast_shapes, graph_of, is_scalar, need_tensor
from ..registry import ELEMENTWISE, MEMORY, defop

# ---- declarations -------------------------------------------------------------
ADD = defop("add", 2, ELEMENTWISE, MEMORY)
SUB = defop("sub", 2, ELEMENTWISE, MEMORY)
MUL = defop("mul", 2, ELEMENTWISE, MEMORY)
DIV = defop("div", 2, ELEMENTWISE, MEMORY)
BINARY_FIRST, BINARY_LAST = ADD, DIV

NEG = defop("neg", 1, ELEMENTWISE, MEMORY)
AFFINE = defop("affine", 1, ELEMENTWISE, MEMORY)   # a*x + b  (scale, x+c, c-x, ...)
SQR = defop("sqr", 1, ELEMENTWISE, MEMORY)
SQRT = defop("sqrt", 1, ELEMENTWISE, MEMORY, 4)
EXP = defop("exp", 1, ELEMENTWISE, MEMORY, 8)
LOG = defop("log", 1, ELEMENTWISE, MEMORY, 8)
ABS = defop("abs", 1, ELEMENTWISE, MEMORY)
RELU = defop("relu", 1, ELEMENTWISE, MEMORY)
GELU = defop("gelu", 1, ELEMENTWISE, MEMORY, 16)
SILU = defop("silu", 1, ELEMENTWISE, MEMORY, 10)
TANH = defop("tanh", 1, ELEMENTWISE, MEMORY, 10)
SIGMOID = defop("sigmoid", 1, ELEMENTWISE, MEMORY, 10)
COPY = defop("copy", 1, ELEMENTWISE, MEMORY)
# derivative ops, appended by gradient rules
STEP = defop("step", 1, ELEMENTWISE, MEMORY)        # 1 where x > 0 (relu')
SIGN = defop("sign", 1, ELEMENTWISE, MEMORY)        # abs'; sign(0) = 0
GELU_D = defop("gelu_d", 1, ELEMENTWISE, MEMORY, 16)    # gelu'
GELU_DD = defop("gelu_dd", 1, ELEMENTWISE, MEMORY, 16, differentiable=False)  # gelu''
SILU_D = defop("silu_d", 1, ELEMENTWISE, MEMORY, 12)    # silu'
SILU_DD = defop("silu_dd", 1, ELEMENTWISE, MEMORY, 12, differentiable=False)  # silu''
UNARY_FIRST, UNARY_LAST = NEG, SILU_DD
FIRST_OP, LAST_OP = ADD, SILU_DD

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


# ---- Python shape rules -----------------------------------------------------------
def _affine(t, a, b):
    return t.graph._node(AFFINE, (t.id,), t.shape, fp=(float(a), float(b)))


def _binary(code, what, a, b):
    g = graph_of(what, a, b)
    if isinstance(a, Tensor) and is_scalar(b):       # fold x op c into one affine node
        c = float(b)
        if code == ADD:
            return _affine(a, 1.0, c)
        if code == SUB:
            return _affine(a, 1.0, -c)
        if code == MUL:
            return _affine(a, c, 0.0)
        if c != 0.0:
            return _affine(a, 1.0 / c, 0.0)
    elif isinstance(b, Tensor) and is_scalar(a):
        c = float(a)
        if code == ADD:
            return _affine(b, 1.0, c)
        if code == SUB:
            return _affine(b, -1.0, c)
        if code == MUL:
            return _affine(b, c, 0.0)
    a = as_tensor(a, g, what)
    b = as_tensor(b, g, what)
    return g._node(code, (a.id, b.id), broadcast_shapes(what, a, b))


def add(a, b):
    """a + b with numpy broadcasting."""
    return _binary(ADD, "add", a, b)


def sub(a, b):
    """a - b with numpy broadcasting."""
    return _binary(SUB, "sub", a, b)


def mul(a, b):
    """a * b with numpy broadcasting."""
    return _binary(MUL, "mul", a, b)


def div(a, b):
    """a / b with numpy broadcasting."""
    return _binary(DIV, "div", a, b)


def _unary(code, what, t, fp=()):
    t = need_tensor(t, what)
    return t.graph._node(code, (t.id,), t.shape, fp=fp)


def neg(t):
    return _unary(NEG, "neg", t)


def sqr(t):
    return _unary(SQR, "sqr", t)


def sqrt(t):
    return _unary(SQRT, "sqrt", t)


def exp(t):
    return _unary(EXP, "exp", t)


def log(t):
    return _unary(LOG, "log", t)


def abs_(t):
    """|t|; its gradient at 0 is 0."""
    return _unary(ABS, "abs", t)


def relu(t):
    """max(t, 0); its gradient at 0 is 0."""
    return _unary(RELU, "relu", t)


def gelu(t):
    """Exact (erf) GELU, as torch.nn.functional.gelu's default."""
    return _unary(GELU, "gelu", t)


def silu(t):
    return _unary(SILU, "silu", t)


def tanh(t):
    return _unary(TANH, "tanh", t)


def sigmoid(t):
    return _unary(SIGMOID, "sigmoid", t)


def copy(t):
    """An identity op that owns its own buffer."""
    return _unary(COPY, "copy", t)


def scale(t, s):
    """s * t for a Python number s."""
    t = need_tensor(t, "scale")
    if not is_scalar(s):
        raise GraphError(f"scale: factor for {t.label!r} must be a real number, got {s!r}")
    return _affine(t, float(s), 0.0)


# ---- kernels ------------------------------------------------------------------------
@njit(**KERNEL)
def _binary_run(code, out, o, a, ia, sa, b, ib, sb, n):
    """out[o+j] = a[ia+j*sa] (op) b[ib+j*sb] for j < n; strides are 0 or 1."""
    if sa == 1 and sb == 1:
        if code == ADD:
            for j in range(n):
                out[o + j] = a[ia + j] + b[ib + j]
        elif code == SUB:
            for j in range(n):
                out[o + j] = a[ia + j] - b[ib + j]
        elif code == MUL:
            for j in range(n):
                out[o + j] = a[ia + j] * b[ib + j]
        else:
            for j in range(n):
                out[o + j] = a[ia + j] / b[ib + j]
    else:
        if code == ADD:
            for j in range(n):
                out[o + j] = a[ia + j * sa] + b[ib + j * sb]
        elif code == SUB:
            for j in range(n):
                out[o + j] = a[ia + j * sa] - b[ib + j * sb]
        elif code == MUL:
            for j in range(n):
                out[o + j] = a[ia + j * sa] * b[ib + j * sb]
        else:
            for j in range(n):
                out[o + j] = a[ia + j * sa] / b[ib + j * sb]


@njit(**KERNEL)
def bcast_strides(shape, n):
    """Contiguous strides of node n's padded shape, 0 along size-1 dims."""
    s3 = 0 if shape[n, 3] == 1 else 1
    r = shape[n, 3]
    s2 = 0 if shape[n, 2] == 1 else r
    r *= shape[n, 2]
    s1 = 0 if shape[n, 1] == 1 else r
    r *= shape[n, 1]
    s0 = 0 if shape[n, 0] == 1 else r
    return s0, s1, s2, s3


@njit(**KERNEL)
def binary_kernel(code, out, a, b, shape, no, na, nb):
    """out = a (op) b, broadcasting; shape rows no, na, nb of ``shape`` describe them."""
    n = out.size
    if a.size == n:
        if b.size == n:
            _binary_run(code, out, 0, a, 0, 1, b, 0, 1, n)
            return
        if b.size == 1:
            _binary_run(code, out, 0, a, 0, 1, b, 0, 0, n)
            return
    elif a.size == 1 and b.size == n:
        _binary_run(code, out, 0, a, 0, 0, b, 0, 1, n)
        return
    a0, a1, a2, a3 = bcast_strides(shape, na)
    b0, b1, b2, b3 = bcast_strides(shape, nb)
    inner = shape[no, 3]
    o = 0
    for i0 in range(shape[no, 0]):
        for i1 in range(shape[no, 1]):
            for i2 in range(shape[no, 2]):
                _binary_run(code, out, o, a, i0 * a0 + i1 * a1 + i2 * a2, a3,
                            b, i0 * b0 + i1 * b1 + i2 * b2, b3, inner)
                o += inner


@njit(**KERNEL)
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@njit(**KERNEL)
def unary_kernel(code, out, x, p0, p1):
    n = out.size
    if code == NEG:
        for i in range(n):
            out[i] = -x[i]
    elif code == AFFINE:
        if p1 == 0.0:                 # a pure scale: keep -0.0 as numpy's x * a does
            for i in range(n):
                out[i] = x[i] * p0
        else:
            for i in range(n):
                out[i] = x[i] * p0 + p1
    elif code == SQR:
        for i in range(n):
            out[i] = x[i] * x[i]
    elif code == SQRT:
        for i in range(n):
            out[i] = math.sqrt(x[i])
    elif code == EXP:
        for i in range(n):
            out[i] = math.exp(x[i])
    elif code == LOG:
        for i in range(n):
            out[i] = math.log(x[i])
    elif code == ABS:
        for i in range(n):
            out[i] = abs(x[i])
    elif code == RELU:
        for i in range(n):
            v = x[i]
            out[i] = 0.0 if v <= 0.0 else v          # NaN passes through, like numpy
    elif code == GELU:
        for i in range(n):
            v = x[i]
            out[i] = 0.5 * v * (1.0 + math.erf(v * _INV_SQRT2))
    elif code == SILU:
        for i in range(n):
            v = x[i]
            out[i] = v * _sigmoid(v)
    elif code == TANH:
        for i in range(n):
            out[i] = math.tanh(x[i])
    elif code == SIGMOID:
        for i in range(n):
            out[i] = _sigmoid(x[i])
    elif code == COPY:
        for i in range(n):
            out[i] = x[i]
    elif code == STEP:
        for i in range(n):
            out[i] = 1.0 if x[i] > 0.0 else 0.0
    elif code == SIGN:
        for i in range(n):
            v = x[i]
            out[i] = 1.0 if v > 0.0 else (-1.0 if v < 0.0 else v * 0.0)
    elif code == GELU_D:      # Phi(x) + x phi(x)
        for i in range(n):
            v = x[i]
            out[i] = 0.5 * (1.0 + math.erf(v * _INV_SQRT2)) + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v)
    elif code == GELU_DD:     # phi(x) (2 - x^2)
        for i in range(n):
            v = x[i]
            out[i] = _INV_SQRT_2PI * math.exp(-0.5 * v * v) * (2.0 - v * v)
    elif code == SILU_D:      # s (1 + x (1 - s))
        for i in range(n):
            v = x[i]
            s = _sigmoid(v)
            out[i] = s * (1.0 + v * (1.0 - s))
    elif code == SILU_DD:     # s (1 - s) (2 + x (1 - 2 s))
        for i in range(n):
            v = x[i]
            s = _sigmoid(v)
            out[i] = s * (1.0 - s) * (2.0 + v * (1.0 - 2.0 * s))


# ---- gradient rules -------------------------------------------------------------------
# vjp(G, st, n, k, g): the contribution of node n's gradient g to its source slot k,
# in n's (broadcast) shape -- the backward pass sums it down to the source's shape.
# Returns a node id, NO_CONTRIBUTION (zero derivative) or NO_RULE.
NO_CONTRIBUTION = -1
NO_RULE = -2


@njit(i64(G_T, ST, i64, f64, f64, i64, i64), cache=True)
def _affine_node(G, st, x, a, b, n, k):
    t = new_node(G, st, AFFINE, x, -1, x, F_GRAD, n, k)
    G[5][t, 0] = a
    G[5][t, 1] = b
    return t


@njit(cache=True)
def vjp(G, st, n, k, g):
    op, src = G[0], G[1]
    code = op[n]
    x = src[n, 0]
    y = src[n, 1]
    if code == ADD:                                   # d(x+y) = dx + dy
        return g
    if code == SUB:
        return g if k == 0 else new_node(G, st, NEG, g, -1, g, F_GRAD, n, k)
    if code == MUL:                                   # g*y, g*x
        return new_node(G, st, MUL, g, y if k == 0 else x, n, F_GRAD, n, k)
    if code == DIV:                                   # g/y, -g*out/y
        if k == 0:
            return new_node(G, st, DIV, g, y, n, F_GRAD, n, k)
        t = new_node(G, st, MUL, g, n, n, F_GRAD, n, k)
        t = new_node(G, st, DIV, t, y, n, F_GRAD, n, k)
        return new_node(G, st, NEG, t, -1, n, F_GRAD, n, k)
    if code == NEG:
        return new_node(G, st, NEG, g, -1, g, F_GRAD, n, k)
    if code == AFFINE:                                # a*g (x + c passes g through)
        a = G[5][n, 0]
        if a == 1.0:
            return g
        return _affine_node(G, st, g, a, 0.0, n, k)
    if code == SQR:                                   # g * 2x
        return new_node(G, st, MUL, g, _affine_node(G, st, x, 2.0, 0.0, n, k), n, F_GRAD, n, k)
    if code == SQRT:                                  # 0.5 g / out
        return new_node(G, st, DIV, _affine_node(G, st, g, 0.5, 0.0, n, k), n, n, F_GRAD, n, k)
    if code == EXP:                                   # g * out
        return new_node(G, st, MUL, g, n, n, F_GRAD, n, k)
    if code == LOG:                                   # g / x
        return new_node(G, st, DIV, g, x, n, F_GRAD, n, k)
    if code == ABS:                                   # g * sign(x); 0 at x = 0
        return new_node(G, st, MUL, g, new_node(G, st, SIGN, x, -1, x, F_GRAD, n, k), n, F_GRAD, n, k)
    if code == RELU:                                  # g * [out > 0]: reads the output, so x can die
        return new_node(G, st, MUL, g, new_node(G, st, STEP, n, -1, n, F_GRAD, n, k), n, F_GRAD, n, k)
    if code == GELU:
        return new_node(G, st, MUL, g, new_node(G, st, GELU_D, x, -1, x, F_GRAD, n, k), n, F_GRAD, n, k)
    if code == SILU:
        return new_node(G, st, MUL, g, new_node(G, st, SILU_D, x, -1, x, F_GRAD, n, k), n, F_GRAD, n, k)
    if code == TANH:                                  # g * (1 - out^2)
        t = new_node(G, st, SQR, n, -1, n, F_GRAD, n, k)
        return new_node(G, st, MUL, g, _affine_node(G, st, t, -1.0, 1.0, n, k), n, F_GRAD, n, k)
    if code == SIGMOID:                               # g * out (1 - out)
        t = new_node(G, st, MUL, n, _affine_node(G, st, n, -1.0, 1.0, n, k), n, F_GRAD, n, k)
        return new_node(G, st, MUL, g, t, n, F_GRAD, n, k)
    if code == COPY:
        return g
    if code == STEP or code == SIGN:                  # piecewise constant
        return NO_CONTRIBUTION
    if code == GELU_D:
        return new_node(G, st, MUL, g, new_node(G, st, GELU_DD, x, -1, x, F_GRAD, n, k), n, F_GRAD, n, k)
    if code == SILU_D:
        return new_node(G, st, MUL, g, new_node(G, st, SILU_DD, x, -1, x, F_GRAD, n, k), n, F_GRAD, n, k)
    return NO_RULE                                    # gelu_dd, silu_dd: third order is not offered
