"""Elementary functions that vectorize.

A loop that calls libm (``math.exp``) stays scalar: LLVM cannot vectorize the call.
For float32 these are written as range reductions, polynomials and bit moves, which
LLVM turns into SIMD code; they are accurate to a few ulp (tests/test_vmath.py
measures them on dense sweeps).  float64 -- the dtype of gradient checks -- keeps
libm, exact to the last bit.  Each function is one name with a float32 and a
float64 body, chosen at compile time by the argument's type.

Coefficients: exp's, log's and tanh's are Taylor's; erfc's were fitted here (least
squares in a Chebyshev basis, z in [0, 10]) to ``erfc(z) e^{z^2} / t`` with
``t = 1 / (1 + z/2)``, as a polynomial in ``s = 2.4 t - 1.4`` (small coefficients,
so float32 Horner loses little).
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
def _high_half(typingctx, x):
    """x with the low 12 bits of its mantissa cleared (in 32-bit integers, as _pow2)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.and_(builder.bitcast(args[0], i32), i32(-4096))      # 0xFFFFF000
        return builder.bitcast(bits, ir.FloatType())
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
_ERFCX = (0.5720119813342145, 0.32622244111768683, 0.10202944792599328, 0.005963686027814269,
          -0.0061510533159921535, -0.0006230153617300622, 0.0005864795772324044, 9.448284960456546e-06,
          -5.391053064047889e-05, 4.442073883584901e-06)
_ERFCX32 = tuple(F(c) for c in reversed(_ERFCX))
# erf(z)/z on |z| < 0.55 as a polynomial in z^2, for the CDF near 0 (no erfc cancellation)
_ERF = (1.1283791670674093, -0.37612638176169666, 0.11283761491607566, -0.026861616769858723,
        0.005192979050803424, -0.0007569806635277428)
_ERF32 = tuple(F(c) for c in reversed(_ERF))


@njit(cache=True)
def _exp_half_sq32(x):
    """exp(-x^2 / 2) to a few ulp: x^2 rounded to float32 would cost ~x^2 ulp, so x is
    split in two halves whose square's leading part is exact."""
    hi = _high_half(x)
    lo = x - hi
    a = F(-0.5) * hi * hi                  # exact
    b = F(-0.5) * lo * (hi + hi + lo)      # the small rest of -x^2/2, added after the reduction
    n = max(np.floor((a + b) * _LOG2E + F(0.5)), F(-126.0))
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
    z = x * F(0.7071067811865476)         # |x| < 0.75: 0.5 + erf(z) / 2 with erf's odd series
    z2 = z * z
    r = _horner(z2, _ERF32)
    centre = _fma(F(0.5) * z, r, F(0.5))
    cdf = h if x < F(0.0) else F(1.0) - h
    return (centre if abs(x) < F(0.75) else cdf), e * F(0.3989422804014327)


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


# ---- reductions of contiguous runs ---------------------------------------------------------------
# Eight running partials in a fixed order: partial k sums the terms j = k (mod 8) in turn, the
# last m % 8 terms go to partial 0, and the partials are combined pairwise.  Deterministic, and
# cheaper than one running sum: but LLVM leaves eight scalar chains scalar (seen in the machine
# code on Zen 4: vaddss, ~2.3 cycles an element for a row's mean and variance), so a run that is
# contiguous takes _partials8, which keeps the eight partials as the lanes of one vector -- the
# same additions in the same order, the same bits, one vector step per eight terms.  Others (a
# strided run, mixed dtypes) take the scalar loops, which say the order in plain code.
def _partials8(term, fold="add"):
    """The intrinsic ``partials(a, b, mu, z)``: the sum over j < a.size of ``term(a[j], b[j], mu)``
    (an expression over values of a's dtype, widened to z's type before it is added) in the order
    above, starting from z.  a and b are 1-d contiguous arrays of one dtype, mu of that dtype.
    With ``fold="max"``: the largest term instead, each partial ``p = t if t > p else p`` as
    Numba's ``max(p, t)`` is, and NaN if any term is NaN."""
    @intrinsic
    def partials(typingctx, a, b, mu, z):
        arrays = all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" for t in (a, b))
        if not (arrays and b.dtype == a.dtype == mu and isinstance(z, types.Float) and z.bitwidth >= mu.bitwidth):
            return None
        sig = z(a, b, mu, z)

        def codegen(context, builder, signature, args):
            from .simd import I32, I64, _at, _loop, _splat       # the IR helpers of the tile kernels
            a_ary = context.make_array(signature.args[0])(context, builder, args[0])
            b_ary = context.make_array(signature.args[1])(context, builder, args[1])
            et, at = context.get_value_type(mu), context.get_value_type(z)
            ve, va = ir.VectorType(et, 8), ir.VectorType(at, 8)
            size = mu.bitwidth // 8

            def widened(value, to):
                return value if to == et or to == ve else builder.fpext(value, to)

            def combine(p, t):
                if fold == "add":
                    return builder.fadd(p, t)
                return builder.select(builder.fcmp_ordered(">", t, p), t, p)

            def nan_in(t, seen):                        # seen | (t is NaN), lane by lane
                return builder.or_(seen, builder.fcmp_unordered("uno", t, t)) if fold == "max" else seen

            n = a_ary.nitems
            steps = builder.udiv(n, I64(8))
            mu_v = _splat(builder, args[2], ve)
            no_nan = ir.Constant(ir.VectorType(ir.IntType(1), 8), [0] * 8)

            def step(i, carried):
                j = builder.mul(i, I64(8))
                x = builder.load(_at(builder, a_ary.data, j, ve), align=size)
                y = builder.load(_at(builder, b_ary.data, j, ve), align=size)
                t = widened(term(builder, x, y, mu_v), va)
                return [combine(carried[0], t), nan_in(t, carried[1])]
            acc, seen = _loop(builder, steps, [_splat(builder, args[3], va), no_nan], step)
            lanes = [builder.extract_element(acc, I32(k)) for k in range(8)]
            nan = builder.extract_element(seen, I32(0))
            for k in range(1, 8):
                nan = builder.or_(nan, builder.extract_element(seen, I32(k)))
            first = builder.mul(steps, I64(8))

            def rest(i, carried):
                j = builder.add(first, i)
                x = builder.load(builder.gep(a_ary.data, [j]), align=size)
                y = builder.load(builder.gep(b_ary.data, [j]), align=size)
                t = widened(term(builder, x, y, args[2]), at)
                return [combine(carried[0], t), nan_in(t, carried[1])]
            lanes[0], nan = _loop(builder, builder.sub(n, first), [lanes[0], nan], rest)
            s = [combine(lanes[k], lanes[k + 1]) for k in range(0, 8, 2)]
            total = combine(combine(s[0], s[1]), combine(s[2], s[3]))
            return builder.select(nan, ir.Constant(at, float("nan")), total) if fold == "max" else total
        return sig, codegen
    return partials


_sum_v = _partials8(lambda b, x, y, mu: x)                                  # x
_dot_v = _partials8(lambda b, x, y, mu: b.fmul(x, y))                       # x y
_sqdev_v = _partials8(lambda b, x, y, mu: b.fmul(b.fsub(x, mu), b.fsub(x, mu)))   # (x - mu)^2
_dotdev_v = _partials8(lambda b, x, y, mu: b.fmul(x, b.fsub(y, mu)))        # x (y - mu)
_max_v = _partials8(lambda b, x, y, mu: x, fold="max")                      # max x


def _contiguous(*arrays):
    return all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and isinstance(t.dtype, types.Float)
               and t.dtype == arrays[0].dtype
               for t in arrays)


def sum8(x):
    """The sum of x (eight partials, in x's dtype)."""
    return _sum8(x, in_dtype_of(x, 0.0))


def sum8_f64(x):
    """sum8 accumulated in float64 whatever x's dtype."""
    return _sum8(x, 0.0)


def dot8(x, y):
    """sum of x[j] * y[j]."""
    return _dot8(x, y, in_dtype_of(x, 0.0))


def dot8_f64(x, y):
    """dot8 accumulated in float64 whatever x's dtype (the products in x's)."""
    return _dot8(x, y, 0.0)


def sqdev8(x, mu):
    """sum of (x[j] - mu)^2."""
    return _sqdev8(x, mu)


def dotdev8(g, x, mu):
    """sum of g[j] * (x[j] - mu)."""
    return _dotdev8(g, x, mu)


@overload(sum8)
def _ov_sum8(x):
    if _contiguous(x):
        return lambda x: _sum_v(x, x, in_dtype_of(x, 0.0), in_dtype_of(x, 0.0))
    return lambda x: _sum8(x, in_dtype_of(x, 0.0))


@overload(sum8_f64)
def _ov_sum8_f64(x):
    if _contiguous(x):
        return lambda x: _sum_v(x, x, in_dtype_of(x, 0.0), 0.0)
    return lambda x: _sum8(x, 0.0)


@overload(dot8)
def _ov_dot8(x, y):
    if _contiguous(x, y):
        return lambda x, y: _dot_v(x, y, in_dtype_of(x, 0.0), in_dtype_of(x, 0.0))
    return lambda x, y: _dot8(x, y, in_dtype_of(x, 0.0))


@overload(dot8_f64)
def _ov_dot8_f64(x, y):
    if _contiguous(x, y):
        return lambda x, y: _dot_v(x, y, in_dtype_of(x, 0.0), 0.0)
    return lambda x, y: _dot8(x, y, 0.0)


@overload(sqdev8)
def _ov_sqdev8(x, mu):
    if _contiguous(x) and mu == x.dtype:
        return lambda x, mu: _sqdev_v(x, x, mu, in_dtype_of(x, 0.0))
    return lambda x, mu: _sqdev8(x, mu)


@overload(dotdev8)
def _ov_dotdev8(g, x, mu):
    if _contiguous(g, x) and mu == x.dtype:
        return lambda g, x, mu: _dotdev_v(g, x, mu, in_dtype_of(x, 0.0))
    return lambda g, x, mu: _dotdev8(g, x, mu)


# the scalar loops: the order in plain code, for the runs _partials8 does not take
@njit(cache=True, error_model="numpy")
def _sum8(x, z):
    """The sum of x with eight running partials starting from z (its type is the
    accumulator's), combined pairwise at the end."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z
    m = x.size
    j = 0
    while j + 8 <= m:
        s0 += x[j]
        s1 += x[j + 1]
        s2 += x[j + 2]
        s3 += x[j + 3]
        s4 += x[j + 4]
        s5 += x[j + 5]
        s6 += x[j + 6]
        s7 += x[j + 7]
        j += 8
    while j < m:
        s0 += x[j]
        j += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(cache=True, error_model="numpy")
def _dot8(x, y, z):
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z
    m = x.size
    j = 0
    while j + 8 <= m:
        s0 += x[j] * y[j]
        s1 += x[j + 1] * y[j + 1]
        s2 += x[j + 2] * y[j + 2]
        s3 += x[j + 3] * y[j + 3]
        s4 += x[j + 4] * y[j + 4]
        s5 += x[j + 5] * y[j + 5]
        s6 += x[j + 6] * y[j + 6]
        s7 += x[j + 7] * y[j + 7]
        j += 8
    while j < m:
        s0 += x[j] * y[j]
        j += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(cache=True, error_model="numpy")
def _sqdev8(x, mu):
    z = in_dtype_of(x, 0.0)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z
    m = x.size
    j = 0
    while j + 8 <= m:
        d0 = x[j] - mu
        d1 = x[j + 1] - mu
        d2 = x[j + 2] - mu
        d3 = x[j + 3] - mu
        d4 = x[j + 4] - mu
        d5 = x[j + 5] - mu
        d6 = x[j + 6] - mu
        d7 = x[j + 7] - mu
        s0 += d0 * d0
        s1 += d1 * d1
        s2 += d2 * d2
        s3 += d3 * d3
        s4 += d4 * d4
        s5 += d5 * d5
        s6 += d6 * d6
        s7 += d7 * d7
        j += 8
    while j < m:
        d = x[j] - mu
        s0 += d * d
        j += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(cache=True, error_model="numpy")
def _dotdev8(g, x, mu):
    z = in_dtype_of(x, 0.0)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z
    m = x.size
    j = 0
    while j + 8 <= m:
        s0 += g[j] * (x[j] - mu)
        s1 += g[j + 1] * (x[j + 1] - mu)
        s2 += g[j + 2] * (x[j + 2] - mu)
        s3 += g[j + 3] * (x[j + 3] - mu)
        s4 += g[j + 4] * (x[j + 4] - mu)
        s5 += g[j + 5] * (x[j + 5] - mu)
        s6 += g[j + 6] * (x[j + 6] - mu)
        s7 += g[j + 7] * (x[j + 7] - mu)
        j += 8
    while j < m:
        s0 += g[j] * (x[j] - mu)
        j += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


def max8(x):
    """max of x; NaN if any element is NaN."""
    return _max8(x)


@overload(max8)
def _ov_max8(x):
    if _contiguous(x):
        return lambda x: _max_v(x, x, in_dtype_of(x, 0.0), in_dtype_of(x, -np.inf))
    return lambda x: _max8(x)


@njit(cache=True, error_model="numpy")
def _max8(x):
    lo = in_dtype_of(x, -np.inf)
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = lo
    m = x.size
    j = 0
    while j + 8 <= m:
        m0 = max(m0, x[j])
        m1 = max(m1, x[j + 1])
        m2 = max(m2, x[j + 2])
        m3 = max(m3, x[j + 3])
        m4 = max(m4, x[j + 4])
        m5 = max(m5, x[j + 5])
        m6 = max(m6, x[j + 6])
        m7 = max(m7, x[j + 7])
        j += 8
    while j < m:
        m0 = max(m0, x[j])
        j += 1
    nan = False
    for k in range(m):
        nan = nan or x[k] != x[k]
    r = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return in_dtype_of(x, np.nan) if nan else r
