"""Reductions of contiguous runs -- the row sums, dot products, deviations and maxima of
norms, softmaxes, batch statistics and the optimizers -- in a fixed order that does not
depend on where a run lies or which thread reads it.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .simd import I32, I64, _at, _loop, _splat     # the IR helpers of the tile kernels
from .vmath import in_dtype_of


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
        if not (_contiguous(a, b) and mu == a.dtype and isinstance(z, types.Float) and z.bitwidth >= mu.bitwidth):
            return None
        sig = z(a, b, mu, z)

        def codegen(context, builder, signature, args):
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
def _squared_deviation(b, x, y, mu):                                         # (x - mu)^2
    d = b.fsub(x, mu)
    return b.fmul(d, d)


_sqdev_v = _partials8(_squared_deviation)
_dotdev_v = _partials8(lambda b, x, y, mu: b.fmul(x, b.fsub(y, mu)))        # x (y - mu)
_max_v = _partials8(lambda b, x, y, mu: x, fold="max")                      # max x


def _contiguous(*arrays):
    """Are these Numba types 1-d C-contiguous float arrays of one dtype (the runs _partials8 takes)?"""
    return all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and isinstance(t.dtype, types.Float)
               and t.dtype == arrays[0].dtype for t in arrays)


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
