"""Elementary functions that vectorize.

A loop that calls libm (``math.exp``) stays scalar: LLVM cannot vectorize the call.
For float32 these are written as range reductions, polynomials and bit moves, which
LLVM turns into SIMD code; they are accurate to a few ulp (tests/test_vmath.py
measures them on dense sweeps).  float64 -- the dtype of gradient checks -- keeps
libm, exact to the last bit.  Each function is one name with a float32 and a
float64 body, chosen at compile time by the argument's type.

Coefficients: exp's, log's and tanh's are Taylor's; erfc's were fitted here (minimax of
the relative error, weighted 3x on |x| < 0.75, then rounded to float32 one at a time) to
``erfc(z) e^{z^2} / t`` with ``t = 1 / (1 + z/2)``, as a polynomial in ``s = 2.4 t - 1.4``
(small coefficients, so float32 Horner loses little).  One fit serves the whole line: the
normal CDF is within 5.3 ulp everywhere (4.9 near 0, where t's rounding sets a floor of
4.75 even for an exact fit) without a separate series for the centre, which cost 17% of gelu.
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

F = np.float32


@intrinsic
def _pow2(typingctx, n):
    """2^n as float32 for a float32 n holding an integer in [-126, 127], made from its bits
    in 32-bit integers: a float -> int64 conversion has no AVX2 instruction (only
    AVX-512's), and it kept every loop around exp from vectorizing there (3 ns an element
    for gelu on Zen 3)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        k = builder.add(builder.fptosi(args[0], i32), i32(127))
        return builder.bitcast(builder.shl(k, i32(23)), ir.FloatType())
    return types.float32(types.float32), codegen


@intrinsic
def _split32(typingctx, x):
    """(biased exponent as a float32, mantissa in [1, 2)) of a normal float32, in 32-bit
    integers (an int64 <-> float conversion has no AVX2 instruction, see _pow2)."""
    def codegen(context, builder, signature, args):
        i32, f32 = ir.IntType(32), ir.FloatType()
        bits = builder.bitcast(args[0], i32)
        exponent = builder.sitofp(builder.and_(builder.lshr(bits, i32(23)), i32(255)), f32)
        mantissa = builder.bitcast(builder.or_(builder.and_(bits, i32(0x007FFFFF)), i32(0x3F800000)), f32)
        return context.make_tuple(builder, signature.return_type, (exponent, mantissa))
    return types.UniTuple(types.float32, 2)(types.float32), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c for float32, fused where the CPU has FMA (``llvm.fmuladd``: one rounding
    and one instruction; a multiply and an add elsewhere).  Numba does not contract
    ``a * b + c`` by itself; a polynomial's Horner steps are ~25% faster fused."""
    def codegen(context, builder, signature, args):
        t = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), "llvm.fmuladd.f32")
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _fma_exact(typingctx, a, b, c):
    """a * b + c rounded once, always (``llvm.fma``): what makes x * x - (x * x)_rounded exact.
    One instruction on every x86-64 CPU since Haswell and Zen; a libm call elsewhere."""
    def codegen(context, builder, signature, args):
        t = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), "llvm.fma.f32")
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=True)
def _horner(x, c):
    """c[0] x^k + c[1] x^(k-1) + ... + c[k] by Horner's rule, each step one _fma; c a
    tuple of float32 coefficients, highest power first."""
    p = c[0]
    for i in range(1, len(c)):
        p = _fma(p, x, c[i])
    return p


_LOG2E = F(1.4426950408889634)
_LN2_HI = F(0.693145751953125)          # ln 2 split so that n * _LN2_HI is exact
_LN2_LO = F(1.4286068203094173e-06)
_EXP_MAX = F(88.72283)                  # above: +inf
_EXP_MIN = F(-87.33654)                 # below: 0 (no subnormal results)
_EXP_TAYLOR = tuple(F(1.0 / math.factorial(k)) for k in range(7, -1, -1))     # 1/7!, ..., 1/1!, 1/0!
_LOG_ATANH = tuple(F(2.0 / k) for k in range(11, 0, -2))                    # 2/11, 2/9, ..., 2/1


@njit(cache=True)
def _exp_reduced(x, n):
    """e^r for r = x - n ln 2 (|r| <= ln 2 / 2)."""
    return _exp_poly((x - n * _LN2_HI) - n * _LN2_LO)


@njit(cache=True)
def _exp_poly(r):
    """e^r for |r| <= ln 2 / 2 (a little more is fine): Taylor to degree 7."""
    return _horner(r, _EXP_TAYLOR)


@njit(cache=True)
def _exp32(x):
    t = x * _LOG2E
    n = np.floor(t + F(0.5))
    n = min(max(n, F(-126.0)), F(128.0))
    p = _exp_reduced(x, n)
    big = n > F(127.0)                                 # 2^128 has no float32: scale by 2^127, then 2
    y = p * _pow2(n - F(1.0) if big else n)
    y = y * F(2.0) if big else y
    y = F(np.inf) if x > _EXP_MAX else y
    y = F(0.0) if x < _EXP_MIN else y
    return x if x != x else y             # NaN stays NaN


@njit(cache=True)
def _exp32_nonpositive(x):
    """_exp32 for x <= 0 -- bit for bit, without its overflow and NaN selects (~35% faster in
    a softmax's loop; a NaN still gives NaN, through r)."""
    n = max(np.floor(x * _LOG2E + F(0.5)), F(-126.0))
    y = _exp_reduced(x, n) * _pow2(n)
    return F(0.0) if x < _EXP_MIN else y


_SQRT_HALF = F(0.70710678118654752)


_TINY = F(1.1754943508222875e-38)       # smallest normal float32


@njit(cache=True)
def _log32(x):
    sub = x < _TINY                                            # subnormal: scale up by 2**23 first
    xs = x * F(8388608.0) if sub else x
    biased, m = _split32(xs)                                  # mantissa in [1, 2)
    big = m > F(1.4142135623730951)
    m = m * F(0.5) if big else m                              # now in [sqrt(1/2), sqrt(2))
    fe = biased - (F(150.0) if sub else F(127.0)) + (F(1.0) if big else F(0.0))   # small integers: exact
    s = (m - F(1.0)) / (m + F(1.0))                           # log m = 2 atanh s
    s2 = s * s
    p = _horner(s2, _LOG_ATANH)
    y = fe * _LN2_HI + (s * p + fe * _LN2_LO)
    y = F(-np.inf) if x == F(0.0) else y
    y = F(np.nan) if x < F(0.0) else y
    y = x if x == F(np.inf) else y
    return x if x != x else y


# tanh(x)/x on |x| < 0.625 as a polynomial in x^2 (fitted here, like erfc's below)
_TANH = (0.9999999998993981, -0.3333333059853887, 0.1333321250130512, -0.05394824008061744,
         0.021710729312141845, -0.00820527300544239, 0.002170495320989423)
_TANH32 = tuple(F(c) for c in reversed(_TANH))       # for _horner: highest power first


@njit(cache=True)
def _tanh32(x):
    a = abs(x)
    x2 = x * x
    p = _horner(x2, _TANH32)
    small = x * p                         # x * (...): tanh(-0) stays -0
    big = F(1.0) - F(2.0) / (_exp32(F(2.0) * a) + F(1.0))
    big = big if x >= F(0.0) else -big
    return small if a < F(0.625) else big


@njit(cache=True)
def _sigmoid32(x):
    return F(1.0) / (F(1.0) + _exp32(-x))


# erfc(z) = t Q(s) e^{-z^2}, t = 1 / (1 + z/2), s = 2.4 t - 1.4 (t in [1/6, 1] -> s in [-1, 1]);
# Q approximates erfcx(z) / t (erfcx(z) = e^{z^2} erfc(z)), smooth and between 0.28 and 1
_ERFCX = (0.5720119476318359, 0.3262224495410919, 0.10202930867671967, 0.005962933413684368,
          -0.006150288041681051, -0.0006197632756084204, 0.0005851491587236524, 4.5890433284512255e-06,
          -5.3202486014924943e-05, 6.80673292663414e-06)
_ERFCX32 = tuple(F(c) for c in reversed(_ERFCX))


@njit(cache=True)
def _exp_half_sq32(x):
    """exp(-x^2 / 2) to a few ulp: x^2 rounded to float32 would cost ~x^2 ulp, so the square
    is kept as two floats, its rounded value and the exact rest one FMA gives."""
    sq = x * x
    a = F(-0.5) * sq                       # exact (a power of two)
    b = F(-0.5) * _fma_exact(x, x, -sq)    # the small rest of -x^2/2, added after the reduction
    n = max(np.floor(a * _LOG2E + F(0.5)), F(-126.0))
    y = _exp_poly(((a - n * _LN2_HI) - n * _LN2_LO) + b) * _pow2(n)
    y = F(0.0) if a < _EXP_MIN else y
    return F(0.0) if abs(x) == F(np.inf) else y        # inf - inf would make lo NaN


@njit(cache=True)
def _normal32(x):
    """(CDF, density) of the standard normal at x: Phi = 0.5 erfc(-x / sqrt 2), with
    erfc(z) = t Q(s) e^{-z^2}, and phi = e^{-x^2/2} / sqrt(2 pi), sharing e^{-x^2/2}."""
    t = F(1.0) / (F(1.0) + F(0.5) * (abs(x) * F(0.7071067811865476)))
    s = _fma(F(2.4), t, F(-1.4))
    q = _horner(s, _ERFCX32)
    e = _exp_half_sq32(x)
    h = F(0.5) * t * q * e
    cdf = h if x < F(0.0) else F(1.0) - h
    return cdf, e * F(0.3989422804014327)


# ---- the dispatching names ------------------------------------------------------------------------
def exp(x):
    """e ** x."""
    return math.exp(x)


def exp_nonpositive(x):
    """e ** x for x <= 0 (a max-shifted score): exp's result, faster in float32."""
    return math.exp(x)


def log(x):
    return math.log(x)


def tanh(x):
    return math.tanh(x)


def sigmoid(x):
    """1 / (1 + e^-x), overflow-free."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def phi_cdf(x):
    """The standard normal CDF: 0.5 erfc(-x / sqrt 2), accurate in both tails."""
    return 0.5 * math.erfc(-x * 0.7071067811865476)


def phi_pdf(x):
    """The standard normal density exp(-x^2 / 2) / sqrt(2 pi)."""
    return math.exp(-0.5 * x * x) * 0.3989422804014327


def normal(x):
    """(phi_cdf(x), phi_pdf(x)) together (they share an exponential)."""
    return phi_cdf(x), phi_pdf(x)


@overload(exp)
def _ov_exp(x):
    if x == types.float32:
        return _exp32.py_func
    return lambda x: math.exp(x)


@overload(exp_nonpositive)
def _ov_exp_nonpositive(x):
    if x == types.float32:
        return _exp32_nonpositive.py_func
    return lambda x: exp(x)                  # float64: exp itself


@overload(log)
def _ov_log(x):
    if x == types.float32:
        return _log32.py_func
    return lambda x: math.log(x)


@overload(tanh)
def _ov_tanh(x):
    if x == types.float32:
        return _tanh32.py_func
    return lambda x: math.tanh(x)


@overload(sigmoid)
def _ov_sigmoid(x):
    if x == types.float32:
        return _sigmoid32.py_func

    def impl(x):
        if x >= 0:
            return 1.0 / (1.0 + math.exp(-x))
        e = math.exp(x)
        return e / (1.0 + e)
    return impl


@overload(phi_cdf)
def _ov_phi_cdf(x):
    if x == types.float32:
        return lambda x: _normal32(x)[0]
    return lambda x: 0.5 * math.erfc(-x * 0.7071067811865476)


@overload(phi_pdf)
def _ov_phi_pdf(x):
    if x == types.float32:
        return lambda x: _exp_half_sq32(x) * F(0.3989422804014327)
    return lambda x: math.exp(-0.5 * x * x) * 0.3989422804014327


@overload(normal)
def _ov_normal(x):
    if x == types.float32:
        return _normal32.py_func
    return lambda x: (0.5 * math.erfc(-x * 0.7071067811865476), math.exp(-0.5 * x * x) * 0.3989422804014327)


def like(a, c):
    """The number c in a's float type, so float32 arithmetic stays float32."""
    return c


@overload(like)
def _ov_like(a, c):
    if a == types.float32:
        return lambda a, c: np.float32(c)
    return lambda a, c: np.float64(c)


def in_dtype_of(arr, c):
    """The number c in the element type of array ``arr``."""
    return c


@overload(in_dtype_of)
def _ov_in_dtype_of(arr, c):
    if arr.dtype == types.float32:
        return lambda arr, c: np.float32(c)
    return lambda arr, c: np.float64(c)
