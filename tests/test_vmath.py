"""vmath: the float32 elementary functions measured in ulp on dense sweeps against float64
numpy/scipy (called inside jitted loops, as the kernels call them), their special values
against numpy's float32, the float64 versions against libm bit for bit, the row
reductions against exact sums, and the exp loop's vectorization."""
import math
import re

import numpy as np
import pytest
from numba import njit
from scipy.special import expit, ndtr

from jitgraph import reductions, vmath

F = np.float32
FLT_MIN = float(np.finfo(F).tiny)           # smallest normal float32
FLT_MAX = float(np.finfo(F).max)
SUB_MIN = 2.0 ** -149                       # smallest subnormal float32
NAMES = ("exp", "log", "tanh", "sigmoid", "phi_cdf", "phi_pdf")


def _mapper(fn):
    @njit(error_model="numpy", cache=False)      # not cached: vmath is inlined, a cache would go stale
    def apply(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = fn(x[i])
        return out
    return apply


APPLY = {name: _mapper(getattr(vmath, name)) for name in NAMES}


@njit(error_model="numpy", cache=False)
def apply_normal(x):
    cdf = np.empty_like(x)
    pdf = np.empty_like(x)
    for i in range(x.size):
        cdf[i], pdf[i] = vmath.normal(x[i])
    return cdf, pdf


def phi_pdf64(x):
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


REF64 = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": expit, "phi_cdf": ndtr, "phi_pdf": phi_pdf64}


def ulp_error(got, ref):
    """|got - ref| in units of the float32 spacing at ref (subnormal spacing below FLT_MIN)."""
    ref = np.asarray(ref, np.float64)
    _, e = np.frexp(np.abs(ref))
    unit = np.maximum(np.ldexp(1.0, e - 24), SUB_MIN)
    return np.abs(got.astype(np.float64) - ref) / unit


def linear(lo, hi, n=2_000_001):
    """float32 points evenly spread over [lo, hi]."""
    return np.unique(np.linspace(lo, hi, n).astype(F))


def by_bits(lo, hi, n=2_000_000):
    """n positive float32s evenly spread by bit pattern between lo and hi: every binade alike."""
    b0, b1 = (int(np.array(v, F).view(np.uint32)) for v in (lo, hi))
    return np.unique(np.linspace(b0, b1, n).astype(np.uint32)).view(F)


def every_float(lo, hi):
    """Every float32 in [lo, hi] (0 < lo < hi)."""
    b0, b1 = (int(np.array(v, F).view(np.uint32)) for v in (lo, hi))
    return np.arange(b0, b1 + 1, dtype=np.uint32).view(F)


def both_signs(x):
    return np.concatenate([x, -x])


# ---- accuracy on dense sweeps ---------------------------------------------------------------------
SWEEPS = {
    # name: (points, max ulp)
    "exp": (lambda: np.concatenate([linear(-87.0, 88.0), both_signs(by_bits(1e-30, 1.0, 1_000_000))]), 2.0),
    "log": (lambda: np.concatenate([by_bits(FLT_MIN, FLT_MAX), by_bits(SUB_MIN, FLT_MIN, 1_000_000),
                                    linear(0.5, 2.0), every_float(1 - 2 ** -8, 1 + 2 ** -8)]), 3.0),
    "tanh": (lambda: np.concatenate([linear(-10.0, 10.0), both_signs(by_bits(SUB_MIN, FLT_MAX))]), 2.0),
    "sigmoid": (lambda: np.concatenate([linear(-88.72, 30.0), both_signs(by_bits(1e-30, 1.0, 1_000_000))]), 3.0),
    "phi_cdf": (lambda: np.concatenate([linear(-12.0, 12.0), both_signs(by_bits(1e-30, 1.0, 1_000_000))]), 8.0),
    "phi_pdf": (lambda: np.concatenate([linear(-13.2, 13.2), both_signs(by_bits(1e-30, 1.0, 1_000_000))]), 4.0),
}


@pytest.mark.parametrize("name", NAMES)
def test_float32_accuracy_in_ulp_on_dense_sweeps(name):
    make, limit = SWEEPS[name]
    x = make()
    assert x.dtype == F and x.size >= 1_000_000 and np.all(np.isfinite(x))
    got = APPLY[name](x)
    assert got.dtype == F
    ref = REF64[name](x.astype(np.float64))
    err = ulp_error(got, ref)
    assert not np.any(np.isnan(err)), f"{name}: NaN at x = {x[np.isnan(err)][:5]}"
    worst = int(np.argmax(err))
    assert err[worst] <= limit, (f"{name}: {err[worst]:.3f} ulp at x = {x[worst]!r} (float32 {got[worst]!r}, "
                                 f"float64 {ref[worst]!r}); limit {limit}")


def _max_ulp_over_every_float(name, lo, hi, sign):
    """The worst ulp error over every float32 of sign * [lo, hi], in chunks; (error, x)."""
    b0, b1 = (int(np.array(v, F).view(np.uint32)) for v in (lo, hi))
    worst = (0.0, None)
    for start in range(b0, b1 + 1, 1 << 22):
        x = np.arange(start, min(start + (1 << 22), b1 + 1), dtype=np.uint32).view(F) * F(sign)
        err = ulp_error(APPLY[name](x), REF64[name](x.astype(np.float64)))
        i = int(np.argmax(err))
        if not err[i] <= worst[0]:
            worst = (float(err[i]), x[i])
    return worst


@pytest.mark.parametrize("name", NAMES)
def test_float32_accuracy_on_every_float_of_the_central_binades(name):
    """Every float32 with 1/4 <= |x| <= 4 (33.5 million per sign): the binades where the range
    reductions turn over, tanh switches formula (|x| = 0.4) and the normal CDF's fit is used
    most -- where a spike between the sweep's points would hide."""
    limit = SWEEPS[name][1]
    for sign in ((1,) if name == "log" else (1, -1)):
        err, at = _max_ulp_over_every_float(name, 0.25, 4.0, sign)
        assert err <= limit, f"{name}: {err:.3f} ulp at x = {at!r}; limit {limit}"


def test_phi_cdf_tails_are_complementary():
    """Both tails: Phi(x) + Phi(-x) = 1 to within 2 ulp of the upper value, and the lower tail
    (down to 1e-33 at -12) is accurate relatively."""
    x = linear(0.0, 12.0, 1_000_001)[1:]                                # x > 0
    hi = APPLY["phi_cdf"](x).astype(np.float64)
    lo = APPLY["phi_cdf"](-x).astype(np.float64)
    assert np.all(np.abs(hi + lo - 1.0) <= 2.0 ** -23)
    assert np.all(lo <= 0.5) and np.all(hi >= 0.5)
    ulp_lo = ulp_error(lo.astype(F), ndtr(-x.astype(np.float64)))
    assert ulp_lo.max() <= 8.0


def test_normal_is_phi_cdf_and_phi_pdf_together():
    x = linear(-14.0, 14.0, 1_000_001)
    cdf, pdf = apply_normal(x)
    assert cdf.tobytes() == APPLY["phi_cdf"](x).tobytes()
    assert pdf.tobytes() == APPLY["phi_pdf"](x).tobytes()
    x64 = x.astype(np.float64)
    cdf64, pdf64 = apply_normal(x64)
    assert cdf64.tobytes() == APPLY["phi_cdf"](x64).tobytes()
    assert pdf64.tobytes() == APPLY["phi_pdf"](x64).tobytes()


# ---- special values -------------------------------------------------------------------------------
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, SUB_MIN, -SUB_MIN, 1e-40, -1e-40, FLT_MIN,
                    -FLT_MIN, 1e-30, -1e-30, 1.0, -1.0, 20.0, -20.0, 40.0, -40.0, FLT_MAX, -FLT_MAX], F)


def _numpy32(name, x):
    """numpy's / scipy's float32 answer, or float64 rounded once to float32."""
    with np.errstate(all="ignore"):
        if name in ("exp", "log", "tanh"):
            return getattr(np, name)(x)
        if name == "sigmoid":
            return expit(x)
        if name == "phi_cdf":
            return ndtr(x.astype(np.float64)).astype(F)
        return phi_pdf64(x.astype(np.float64)).astype(F)


def _same_special(got, want, name, x, max_ulp=3.0):
    bad = []
    for xi, g, w in zip(x, got, want):
        if np.isnan(w) or np.isinf(w) or w == 0 or abs(w) == 1 and abs(xi) > 1:
            ok = (np.isnan(g) and np.isnan(w)) or (g == w and np.signbit(g) == np.signbit(w))
        elif abs(w) < FLT_MIN:                 # a subnormal result: see the underflow test
            ok = abs(float(g) - float(w)) < FLT_MIN
        else:
            ok = ulp_error(np.array([g]), np.array([float(w)]))[0] <= max_ulp
        if not ok:
            bad.append(f"{name}({xi!r}) = {g!r}, numpy float32 {w!r}")
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("name", NAMES)
def test_special_values_behave_like_numpy_float32(name):
    """NaN in, NaN out (any sign); infinities, signed zeros, subnormals and the extremes
    give numpy's float32 answer: exp(-inf) = 0, log(0) = -inf, log(-1) = NaN,
    tanh(-0) = -0, tanh(+-inf) = +-1, phi_cdf(+-inf) = 1, 0, phi_pdf(+-inf) = 0 ..."""
    extra = {"log": [-1.0, -np.inf, 0.5, 2.0, 1e30]}.get(name, [])
    x = np.concatenate([SPECIAL, np.array(extra, F)])
    got = APPLY[name](x)
    assert got.dtype == F
    _same_special(got, _numpy32(name, x), name, x)
    assert np.all(np.isnan(got[np.isnan(x)]))


def test_exp_overflow_boundary_like_numpy():
    """exp is finite and accurate up to the largest float32 whose exp is finite, and inf
    just above it (numpy float32 gives 3.4027985e38 at 88.72283)."""
    top = F(88.72283)                              # the largest x with exp(x) <= FLT_MAX
    assert np.exp(np.float64(top)) <= FLT_MAX < np.exp(np.float64(np.nextafter(top, F(np.inf))))
    x = every_float(88.0, float(top))              # all ~95 000 floats of the last stretch
    got = APPLY["exp"](x)
    assert np.all(np.isfinite(got))
    err = ulp_error(got, np.exp(x.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, \
        f"exp({x[worst]!r}) = {got[worst]!r}: {err[worst]:.2f} ulp from {np.exp(float(x[worst]))!r}"
    above = np.array([np.nextafter(top, F(np.inf)), 88.8, 89.0, 100.0, 1e10], F)
    assert np.all(APPLY["exp"](above) == np.inf)


@pytest.mark.parametrize("name,lo,hi", [("exp", -110.0, -87.33), ("sigmoid", -110.0, -88.7),
                                        ("phi_pdf", 13.2, 15.0), ("phi_pdf", -15.0, -13.2),
                                        ("phi_cdf", -15.0, -12.0)])
def test_underflow_is_within_the_smallest_normal(name, lo, hi):
    """Where the true result is subnormal, vmath may flush it to 0 (exp's documented choice,
    no subnormal results): the error stays below FLT_MIN, results are never negative, and
    they are 0 exactly where numpy's float32 underflows to 0."""
    x = linear(lo, hi, 200_001)
    got = APPLY[name](x).astype(np.float64)
    ref = REF64[name](x.astype(np.float64))
    assert np.all(got >= 0) and np.all(np.isfinite(got))
    assert np.max(np.abs(got - ref)) < FLT_MIN
    assert np.all(got[ref < SUB_MIN / 2] == 0)
    normal = ref >= FLT_MIN * 1.001                # where the answer is a normal float, full accuracy
    assert np.all(ulp_error(got[normal].astype(F), ref[normal]) <= SWEEPS[name][1])


def test_exact_points():
    assert APPLY["exp"](np.array([0.0, -0.0, SUB_MIN, -SUB_MIN], F)).tolist() == [1.0] * 4
    log1 = APPLY["log"](np.array([1.0], F))[0]
    assert log1 == 0.0 and not np.signbit(log1)
    k = np.arange(-149, 128)
    p2 = np.ldexp(np.float64(1.0), k).astype(F)                          # powers of two: log = k ln 2
    assert np.all(p2 > 0) and np.all(np.isfinite(p2))
    assert ulp_error(APPLY["log"](p2), k * math.log(2)).max() <= 1.0
    assert APPLY["sigmoid"](np.array([0.0], F))[0] == 0.5
    assert APPLY["tanh"](np.array([1e-30], F))[0] == F(1e-30)


# ---- float64: libm, bit for bit -------------------------------------------------------------------
def _points64():
    rng = np.random.default_rng(0)
    return np.concatenate([rng.uniform(-40, 40, 100_000), rng.uniform(-745, 709, 20_000),
                           np.exp(rng.uniform(-700, 700, 20_000)) * rng.choice([-1.0, 1.0], 20_000),
                           [0.0, -0.0, 1.0, -1.0, 5e-324, -5e-324, 1e-310, 709.78, -745.1, 1e300, -1e300]])


# exp, log, tanh are libm's; the others are vmath's Python definitions, made of libm calls
LIBM = {"exp": math.exp, "log": math.log, "tanh": math.tanh, "sigmoid": vmath.sigmoid, "phi_cdf": vmath.phi_cdf,
        "phi_pdf": vmath.phi_pdf}


@pytest.mark.parametrize("name", NAMES)
def test_float64_is_libm_exactly(name):
    x = _points64()
    if name == "log":
        x = np.abs(x[x != 0])
    if name == "exp":
        x = x[x < 709.78]                           # math.exp raises OverflowError above
    got = APPLY[name](x)
    assert got.dtype == np.float64
    want = np.array([LIBM[name](float(v)) for v in x])
    diff = got.view(np.int64) != want.view(np.int64)
    assert not diff.any(), \
        f"{name}: {diff.sum()} differ, e.g. x = {x[diff][:3]!r}: {got[diff][:3]!r} vs {want[diff][:3]!r}"


SPECIAL64 = {        # (x, f(x)) pairs (a dict would merge 0.0 and -0.0)
    "exp": [(np.inf, np.inf), (-np.inf, 0.0), (0.0, 1.0), (-0.0, 1.0), (710.0, np.inf), (-746.0, 0.0)],
    "log": [(0.0, -np.inf), (-0.0, -np.inf), (-1.0, np.nan), (np.inf, np.inf), (-np.inf, np.nan), (1.0, 0.0)],
    "tanh": [(np.inf, 1.0), (-np.inf, -1.0), (-0.0, -0.0), (0.0, 0.0), (30.0, 1.0), (-30.0, -1.0)],
    "sigmoid": [(np.inf, 1.0), (-np.inf, 0.0), (0.0, 0.5), (800.0, 1.0), (-800.0, 0.0)],
    "phi_cdf": [(np.inf, 1.0), (-np.inf, 0.0), (0.0, 0.5), (40.0, 1.0), (-40.0, 0.0)],
    "phi_pdf": [(np.inf, 0.0), (-np.inf, 0.0), (40.0, 0.0), (-40.0, 0.0)],
}


@pytest.mark.parametrize("name", NAMES)
def test_float64_special_values(name):
    cases = SPECIAL64[name]
    x = np.array([np.nan] + [c[0] for c in cases], np.float64)
    got = APPLY[name](x)
    assert np.isnan(got[0])
    for xi, g, w in zip(x[1:], got[1:], [c[1] for c in cases]):
        assert (np.isnan(g) and np.isnan(w)) or (g == w and np.signbit(g) == np.signbit(w)), \
            f"{name}({xi!r}) = {g!r}, expected {w!r}"


# ---- the row reductions ---------------------------------------------------------------------------
@njit(error_model="numpy", cache=False)
def rows_sum8(flat, m, out):
    for r in range(out.size):                      # rows as slices of one flat buffer, like the kernels
        out[r] = reductions.sum8(flat[r * m:(r + 1) * m])


@njit(error_model="numpy", cache=False)
def rows_dot8(a, b, m, out):
    for r in range(out.size):
        out[r] = reductions.dot8(a[r * m:(r + 1) * m], b[r * m:(r + 1) * m])


@njit(error_model="numpy", cache=False)
def rows_sqdev8(flat, m, mu, out):
    for r in range(out.size):
        out[r] = reductions.sqdev8(flat[r * m:(r + 1) * m], mu[r])


@njit(error_model="numpy", cache=False)
def rows_dotdev8(g, x, m, mu, out):
    for r in range(out.size):
        out[r] = reductions.dotdev8(g[r * m:(r + 1) * m], x[r * m:(r + 1) * m], mu[r])


@njit(error_model="numpy", cache=False)
def rows_max8(flat, m, out):
    for r in range(out.size):
        out[r] = reductions.max8(flat[r * m:(r + 1) * m])


LENGTHS = list(range(0, 34)) + [63, 64, 65, 127, 200, 1000, 4099]
ROWS = 6


def _rows(rng, m, dtype, offset=1.0):
    return (rng.standard_normal(ROWS * m) * 3 + offset).astype(dtype)


def _reduce_all(dtype, m, a, b, mu):
    out = {k: np.empty(ROWS, dtype) for k in ("sum", "dot", "sqdev", "dotdev", "max")}
    rows_sum8(a, m, out["sum"])
    rows_dot8(a, b, m, out["dot"])
    rows_sqdev8(a, m, mu, out["sqdev"])
    rows_dotdev8(b, a, m, mu, out["dotdev"])
    rows_max8(a, m, out["max"])
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_row_reductions_against_exact_sums(dtype):
    u = 2.0 ** -24 if dtype == np.float32 else 2.0 ** -53
    rng = np.random.default_rng(5)
    for m in LENGTHS:
        a, b = _rows(rng, m, dtype), _rows(rng, m, dtype, offset=-0.5)
        mu = np.array([a[r * m:(r + 1) * m].mean() if m else 0.0 for r in range(ROWS)], dtype)
        out = _reduce_all(dtype, m, a, b, mu)
        for r in range(ROWS):
            x = a[r * m:(r + 1) * m].astype(np.float64)
            y = b[r * m:(r + 1) * m].astype(np.float64)
            c = float(mu[r])
            n = m // 8 + 12                           # 8 partials: each error bound is gamma_n * sum of |terms|
            d = (x - c)                               # exact for float32 data; the sqdev/dotdev budget covers f64
            terms = {"sum": x, "dot": x * y, "sqdev": d * d, "dotdev": y * d}
            extra = {"sum": 0, "dot": 1, "sqdev": 3, "dotdev": 2}
            for k, t in terms.items():
                exact = math.fsum(t.tolist())
                got = float(out[k][r])
                tol = (n + extra[k]) * u * float(np.sum(np.abs(t)))
                assert abs(got - exact) <= tol, f"{k}8 m={m} row {r} {dtype.__name__}: {got!r} vs {exact!r}"
            want_max = x.max() if m else -np.inf
            assert float(out["max"][r]) == want_max, f"max8 m={m}: {out['max'][r]!r} vs {want_max!r}"
        if m == 0:
            assert all(float(out[k][0]) == 0.0 for k in ("sum", "dot", "sqdev", "dotdev"))
            assert out["max"][0] == -np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_row_reductions_match_numpy_on_ordinary_rows(dtype):
    """Against numpy's own sums, with the tolerances of the kernels' dtype."""
    rng = np.random.default_rng(6)
    m = 777
    a, b = _rows(rng, m, dtype), _rows(rng, m, dtype, offset=-0.5)
    A, Bm = a.reshape(ROWS, m), b.reshape(ROWS, m)
    mu = A.mean(1).astype(dtype)
    out = _reduce_all(dtype, m, a, b, mu)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    x64, y64, mu64 = A.astype(np.float64), Bm.astype(np.float64), mu.astype(np.float64)[:, None]
    np.testing.assert_allclose(out["sum"], x64.sum(1), rtol=rtol, atol=rtol * np.abs(x64).sum(1).max())
    np.testing.assert_allclose(out["dot"], (x64 * y64).sum(1), rtol=rtol, atol=rtol * np.abs(x64 * y64).sum(1).max())
    np.testing.assert_allclose(out["sqdev"], ((x64 - mu64) ** 2).sum(1), rtol=rtol)
    np.testing.assert_allclose(out["dotdev"], (y64 * (x64 - mu64)).sum(1), rtol=rtol,
                               atol=rtol * np.abs(y64 * (x64 - mu64)).sum(1).max())
    assert np.array_equal(out["max"], A.max(1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_max8_propagates_nan_from_any_position(dtype):
    rng = np.random.default_rng(7)
    for m in (1, 2, 7, 8, 9, 15, 16, 17, 40, 1001):
        for pos in sorted({p for p in (0, 1, m // 2, m - 9, m - 8, m - 1) if 0 <= p < m}):
            for nan in (np.nan, -np.nan):
                row = rng.standard_normal(m).astype(dtype)
                row[pos] = nan
                out = np.empty(1, dtype)
                rows_max8(row, m, out)
                assert np.isnan(out[0]), f"max8 missed a NaN at {pos} of {m}"
                row[(pos + 1) % m] = np.inf                          # NaN beats inf too
                rows_max8(row, m, out)
                assert np.isnan(out[0]) or m == 1
    special = {(-np.inf, -np.inf): -np.inf, (-np.inf, 3.0): 3.0, (np.inf, -1.0): np.inf, (-0.0, -5.0): 0.0}
    for vals, want in special.items():
        for m in (2, 9, 24):
            row = np.full(m, vals[1], dtype)
            row[m // 2] = vals[0]
            out = np.empty(1, dtype)
            rows_max8(row, m, out)
            assert out[0] == want


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_row_reductions_are_deterministic(dtype):
    """The same row gives the same bits every time, wherever it lies in memory (any
    alignment) and whatever rows surround it."""
    rng = np.random.default_rng(8)
    for m in (5, 8, 13, 64, 100, 1027):
        a, b = _rows(rng, m, dtype), _rows(rng, m, dtype, offset=-0.5)
        mu = np.full(ROWS, 0.75, dtype)
        first = _reduce_all(dtype, m, a, b, mu)
        again = _reduce_all(dtype, m, a.copy(), b.copy(), mu)
        for k in first:
            assert first[k].tobytes() == again[k].tobytes()
        for shift in range(1, 9):                  # row 0 at every offset of a bigger buffer
            pad_a = np.concatenate([rng.standard_normal(shift).astype(dtype), a])
            pad_b = np.concatenate([rng.standard_normal(shift).astype(dtype), b])
            out = {k: np.empty(1, dtype) for k in first}
            rows_sum8(pad_a[shift:shift + m], m, out["sum"])
            rows_dot8(pad_a[shift:shift + m], pad_b[shift:shift + m], m, out["dot"])
            rows_sqdev8(pad_a[shift:shift + m], m, mu, out["sqdev"])
            rows_dotdev8(pad_b[shift:shift + m], pad_a[shift:shift + m], m, mu, out["dotdev"])
            rows_max8(pad_a[shift:shift + m], m, out["max"])
            for k in first:
                assert out[k][0].tobytes() == first[k][0].tobytes(), f"{k}8 m={m} shifted by {shift}"
        # the sum depends on the values only through their fixed order: reversing a row may change
        # the last bits, but the same reversed row again gives the same bits
        rev = a[::-1].copy()
        o1, o2 = np.empty(ROWS, dtype), np.empty(ROWS, dtype)
        rows_sum8(rev, m, o1)
        rows_sum8(rev.copy(), m, o2)
        assert o1.tobytes() == o2.tobytes()


# ---- vectorization --------------------------------------------------------------------------------
@njit(error_model="numpy", cache=False)          # not cached, so inspect_llvm has the IR
def exp_loop(x, out):
    for i in range(x.size):
        out[i] = vmath.exp(x[i])


def test_float32_exp_loop_vectorizes():
    x = np.linspace(-5, 5, 64).astype(F)
    out = np.empty_like(x)
    exp_loop(x, out)
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)), rtol=3e-7)
    ir = "\n".join(exp_loop.inspect_llvm().values())
    vector_ops = re.findall(r"\b(?:fmul|fadd|fsub)\b[^\n]*<(?:8|16) x float>", ir)
    assert vector_ops, "no <8 x float> / <16 x float> arithmetic in the float32 exp loop: it stays scalar"
    assert "@expf" not in ir and "llvm.exp.f32" not in ir, "the loop calls libm's expf"


@njit(error_model="numpy", cache=False)
def _exp_loop(x, o):
    for i in range(x.size):
        o[i] = vmath.exp(x[i])


@njit(error_model="numpy", cache=False)
def _cdf_loop(x, o):
    for i in range(x.size):
        o[i] = vmath.phi_cdf(x[i])


@njit(error_model="numpy", cache=False)
def _log_loop(x, o):
    for i in range(x.size):
        o[i] = vmath.log(x[i])


@pytest.mark.parametrize("loop, conversion", [(_exp_loop, "vcvttps2dq"), (_cdf_loop, "vcvttps2dq"),
                                              (_log_loop, "vcvtdq2ps")], ids=["exp", "phi_cdf", "log"])
def test_float32_math_loops_vectorize_on_avx2(loop, conversion):
    """A loop over the float32 functions compiles to packed 256/512-bit code, its float <->
    integer step included: exp's 2^n once went through float -> int64 conversions, which have
    no AVX2 instruction, and the loop ran scalar conversions one element at a time."""
    from llvmlite import binding
    if not binding.get_host_cpu_features().get("avx2", False):
        pytest.skip("the host has no AVX2: nothing to vectorize into")
    x = np.linspace(0.1, 4.0, 64, dtype=np.float32)
    o = np.empty_like(x)
    loop(x, o)
    asm = "\n".join(loop.inspect_asm().values())
    assert re.search(r"vfmadd\w*ps\s[^\n]*%[yz]mm", asm), "no packed float32 FMA: the loop did not vectorize"
    assert re.search(conversion + r"\s[^\n]*%[yz]mm", asm), f"no packed {conversion}: the conversion is scalar"


@njit(error_model="numpy", cache=False)
def _partials_both_ways(a, b, mu, out):
    """Each row reduction of a contiguous run (the vector lanes of reductions._partials8) and the
    scalar loop that spells out its order."""
    z = vmath.in_dtype_of(a, 0.0)
    out[0, 0], out[1, 0] = reductions.sum8(a), reductions._sum8(a, z)
    out[0, 1], out[1, 1] = reductions.sum8_f64(a), reductions._sum8(a, 0.0)
    out[0, 2], out[1, 2] = reductions.dot8(a, b), reductions._dot8(a, b, z)
    out[0, 3], out[1, 3] = reductions.dot8_f64(a, b), reductions._dot8(a, b, 0.0)
    out[0, 4], out[1, 4] = reductions.sqdev8(a, mu), reductions._sqdev8(a, mu)
    out[0, 5], out[1, 5] = reductions.dotdev8(b, a, mu), reductions._dotdev8(b, a, mu)
    out[0, 6], out[1, 6] = reductions.max8(a), reductions._max8(a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_vector_partials_give_the_scalar_orders_bits(dtype):
    """The eight partials kept as vector lanes add the same terms in the same order as the
    scalar loops: the same bits for every length (whole vectors, a tail, none), on values
    spread over twelve decades (where a different order would show in the last bits); max8
    the same value, NaN, sign of zero and infinity."""
    rng = np.random.default_rng(11)
    for m in list(range(0, 35)) + [127, 128, 129, 1000, 4099]:
        for _ in range(4):
            a = (rng.standard_normal(m) * 10.0 ** rng.uniform(-6, 6, m)).astype(dtype)
            b = rng.standard_normal(m).astype(dtype)
            mu = dtype(a.mean() if m else 0.0)
            out = np.empty((2, 7), np.float64)
            _partials_both_ways(a, b, mu, out)
            assert out[0].tobytes() == out[1].tobytes(), f"m={m}: {out[0] - out[1]}"
        for special in (np.nan, -0.0, np.inf, -np.inf):     # max's NaN, its ties of zeros, infinities
            a = np.where(rng.random(m) < 0.2, dtype(special), rng.standard_normal(m).astype(dtype))
            _partials_both_ways(a, a, dtype(0.0), out)
            assert np.array_equal(out[0, 6:], out[1, 6:], equal_nan=True) and \
                np.signbit(out[0, 6]) == np.signbit(out[1, 6]), f"max8 m={m} with {special}"
    ir = "\n".join(_partials_both_ways.inspect_llvm().values())
    lanes = "float" if dtype == np.float32 else "double"
    assert re.search(rf"\bfadd\b[^\n]*<8 x {lanes}>", ir), "the partials are not a vector: the sums run scalar"
