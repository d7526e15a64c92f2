"""Binary arithmetic with numpy broadcasting: + - * /, and affine (a*x + b with
Python numbers a, b), which ``x * 2.0``, ``x + 1.0``, ``1.0 - x``, ``x / 4.0`` and
``jg.scale`` fold into.

Calling convention: each op has an element function ``_name(x, y)`` and a runner that
hands it to :func:`binary`, which broadcasts node n's two sources to n's shape
(strides 0 along broadcast dims); each op compiles its own loops.
"""
import numpy as np
from numba import njit

from enum import IntEnum

from ..errors import GraphError
from ..graph import Operand, Tensor
from ..native import chunk_operand, operand, output, run_view, same_data, span
from ..registry import ADD, AFFINE, DIV, ELEMENTWISE, MUL, SUB, WHERE, defop, export, slots
from ..rules import either, op
from ..status import OK
from ..vmath import in_dtype_of
from .common import KEEP_BLOCK, as_tensor, broadcast_shapes, graph_of, is_scalar, need_tensor


class AffineFP(IntEnum):
    scale = 0                # out = scale * x + shift
    shift = 1


# ---- the family's calling convention ------------------------------------------------------------
def _binary(code: int, what: str, a: Operand, b: Operand) -> Tensor:
    g = graph_of(what, a, b)
    if code not in (ADD, SUB, MUL, DIV):
        pass                                          # the other binary ops take a scalar as a const
    elif isinstance(a, Tensor) and is_scalar(b):     # fold x op c into one affine node
        c = float(b)  # type: ignore[arg-type]
        if code == ADD:
            return affine(a, 1.0, c)
        if code == SUB:
            return affine(a, 1.0, -c)
        if code == MUL:
            return affine(a, c, 0.0)
        if c != 0.0:
            return affine(a, 1.0 / c, 0.0)
    elif isinstance(b, Tensor) and is_scalar(a):
        c = float(a)  # type: ignore[arg-type]
        if code == ADD:
            return affine(b, 1.0, c)
        if code == SUB:
            return affine(b, -1.0, c)
        if code == MUL:
            return affine(b, c, 0.0)
    ta = as_tensor(a, g, what)
    tb = as_tensor(b, g, what)
    return g._node(code, (ta.id, tb.id), broadcast_shapes(what, ta, tb))


@njit(cache=True, error_model="numpy", inline="always")   # f a function argument: inlined, or uncacheable
def _kept(f, y, xa, xb, c, which):
    """In place for an f that returns an argument on some branch (maximum: a or b): through a
    block in cache, stored whole, not LLVM's masked stores (see unary._map_keeping).  which: 0
    f(xa, xb), 1 f(xa, c), 2 f(c, xb); y is xa or xb."""
    m = y.size
    block = np.empty(min(KEEP_BLOCK, m), y.dtype)
    for s in range(0, m, KEEP_BLOCK):
        e = min(s + KEEP_BLOCK, m)
        part = y[s:e]
        if which == 0:
            pa, pb = xa[s:e], xb[s:e]
            for j in range(e - s):
                block[j] = f(pa[j], pb[j])
        elif which == 1:
            pa = xa[s:e]
            for j in range(e - s):
                block[j] = f(pa[j], c)
        else:
            pb = xb[s:e]
            for j in range(e - s):
                block[j] = f(c, pb[j])
        for j in range(e - s):
            part[j] = block[j]


@njit(cache=True, error_model="numpy", inline="always")   # f a function argument: inlined, or uncacheable
def _run(f, out, o, a, ia, sa, b, ib, sb, m):
    """out[o+j] = f(a[ia+j*sa], b[ib+j*sb]) for j < m (f: an op's element function);
    strides are 0 (broadcast) or 1.  Each case is its own loop over slices indexed from 0 (an index LLVM cannot prove
    non-negative keeps Numba's wraparound test and stops vectorization), and running in
    place reads and writes one array (LLVM's overlap check would pick its scalar loop)."""
    y = out[o:o + m]
    if sa == 1 and sb == 1:
        xa = a[ia:ia + m]
        xb = b[ib:ib + m]
        if same_data(y, xa):
            for j in range(m):
                y[j] = f(y[j], xb[j])
        elif same_data(y, xb):
            for j in range(m):
                y[j] = f(xa[j], y[j])
        else:
            for j in range(m):
                y[j] = f(xa[j], xb[j])
    elif sa == 1:
        xa = a[ia:ia + m]
        c = b[ib]
        if same_data(y, xa):
            for j in range(m):
                y[j] = f(y[j], c)
        else:
            for j in range(m):
                y[j] = f(xa[j], c)
    elif sb == 1:
        xb = b[ib:ib + m]
        c = a[ia]
        if same_data(y, xb):
            for j in range(m):
                y[j] = f(c, y[j])
        else:
            for j in range(m):
                y[j] = f(c, xb[j])
    else:
        c = f(a[ia], b[ib])
        for j in range(m):
            y[j] = c


@njit(cache=True, error_model="numpy", inline="always")   # f a function argument: inlined, or uncacheable
def _run_keeping(f, out, o, a, ia, sa, b, ib, sb, m):
    """_run for an f that returns an argument on some branch (maximum, minimum): in place
    through _kept's block, otherwise _run.  Its own function, not a flag of _run: Numba
    compiles both branches of a flag, and every other op would pay for _kept's loops."""
    y = out[o:o + m]
    if sa == 1 and sb == 1 and m > 0 and (same_data(y, a[ia:ia + m]) or same_data(y, b[ib:ib + m])):
        _kept(f, y, a[ia:ia + m], b[ib:ib + m], a[ia], 0)
    elif sa == 1 and sb == 0 and same_data(y, a[ia:ia + m]):
        _kept(f, y, a[ia:ia + m], a[ia:ia + m], b[ib], 1)
    elif sa == 0 and sb == 1 and same_data(y, b[ib:ib + m]):
        _kept(f, y, b[ib:ib + m], b[ib:ib + m], a[ia], 2)
    else:
        _run(f, out, o, a, ia, sa, b, ib, sb, m)


@njit(cache=True, error_model="numpy")
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


@njit(cache=True, error_model="numpy")
def row_offset(shape, n, r, s0, s1, s2):
    """Offset in an operand (broadcast strides s0..s2) of row r of node n's padded shape."""
    i2 = r % shape[n, 2]
    q = r // shape[n, 2]
    return (q // shape[n, 1]) * s0 + (q % shape[n, 1]) * s1 + i2 * s2


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def _rows(v, n, f, lo, hi, run):
    """Run node n over elements [lo, hi): run(f, ...) (_run or _run_keeping) over each
    stretch of n's broadcast operands, f an op's element function (njit, inlined: each op
    compiles its own loops, with its own math only)."""
    out = output(v, n)
    a = operand(v, n, 0)
    b = operand(v, n, 1)
    size = out.size
    lo, hi = span(lo, hi, size)
    shape = v.shape
    a0, a1, a2, a3 = bcast_strides(shape, v.src[n, 0])
    b0, b1, b2, b3 = bcast_strides(shape, v.src[n, 1])
    inner = shape[n, 3]
    flat = (a.size == size or a.size == 1) and (b.size == size or b.size == 1)
    r0, r1 = (0, 1) if flat else (lo // inner, (hi + inner - 1) // inner)     # the rows [lo, hi) touches
    for r in range(r0, r1):                   # one call site: the loops are inlined once
        if flat:                              # same size or a scalar: one stretch
            o, m = lo, hi - lo
            sa = 1 if a.size == size else 0
            sb = 1 if b.size == size else 0
            ia, ib = lo * sa, lo * sb
        else:
            j0 = max(lo - r * inner, 0)
            o, m = r * inner + j0, min(hi - r * inner, inner) - j0
            sa, sb = a3, b3
            ia = row_offset(shape, n, r, a0, a1, a2) + j0 * a3
            ib = row_offset(shape, n, r, b0, b1, b2) + j0 * b3
        run(f, out, o, a, ia, sa, b, ib, sb, m)
    return OK


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see _rows)
def binary(v, n, f, lo, hi):
    """Node n over elements [lo, hi): f(a, b) with numpy broadcasting."""
    return _rows(v, n, f, lo, hi, _run)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see _rows)
def binary_keeping(v, n, f, lo, hi):
    """binary for an f that returns one of its arguments on some branch (see _run_keeping)."""
    return _rows(v, n, f, lo, hi, _run_keeping)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see _rows)
def binary_chunk(v, n, f, m):
    """A group's chunk of node n (ops/group.py): f over the m elements at the chunk's
    addresses, its operands already broadcast.  An op's chunk runner, compiled only for
    programs that fuse it."""
    _run(f, chunk_operand(v, 0, m), 0, chunk_operand(v, 1, m), 0, 1, chunk_operand(v, 2, m), 0, 1, m)
    return OK                                 # _run: one array when the group writes over a dying input


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined (see _rows)
def binary_chunk_keeping(v, n, f, m):
    """binary_chunk for an f that returns one of its arguments (see _run_keeping)."""
    _run_keeping(f, chunk_operand(v, 0, m), 0, chunk_operand(v, 1, m), 0, 1, chunk_operand(v, 2, m), 0, 1, m)
    return OK


# Rules give a contribution in n's (broadcast) shape; the backward pass sums it down to the
# source's shape, once, for every rule (see rules.py).

# ---- add ------------------------------------------------------------------------------------------
def add(a: Operand, b: Operand) -> Tensor:
    """a + b with numpy broadcasting."""
    return _binary(ADD, "add", a, b)


@njit(cache=True, error_model="numpy")
def _add(x, y):
    return x + y


def _run_add(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _add, lo, hi)


def _chunk_add(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _add, hi)


defop(ADD, "add", add, _run_add, arity=2, kind=ELEMENTWISE, chunk=_chunk_add,
      vjp=lambda g, a, b: (g, g))


# ---- sub ------------------------------------------------------------------------------------------
def sub(a: Operand, b: Operand) -> Tensor:
    """a - b with numpy broadcasting."""
    return _binary(SUB, "sub", a, b)


@njit(cache=True, error_model="numpy")
def _sub(x, y):
    return x - y


def _run_sub(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _sub, lo, hi)


def _chunk_sub(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _sub, hi)


defop(SUB, "sub", sub, _run_sub, arity=2, kind=ELEMENTWISE, chunk=_chunk_sub,
      vjp=lambda g, a, b: (g, -1.0 * g))


# ---- mul ------------------------------------------------------------------------------------------
def mul(a: Operand, b: Operand) -> Tensor:
    """a * b with numpy broadcasting."""
    return _binary(MUL, "mul", a, b)


@njit(cache=True, error_model="numpy")
def _mul(x, y):
    return x * y


def _run_mul(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _mul, lo, hi)


def _chunk_mul(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _mul, hi)


defop(MUL, "mul", mul, _run_mul, arity=2, kind=ELEMENTWISE, chunk=_chunk_mul,
      vjp=lambda g, a, b: (g * b, g * a))


# ---- div ------------------------------------------------------------------------------------------
def div(a: Operand, b: Operand) -> Tensor:
    """a / b with numpy broadcasting."""
    return _binary(DIV, "div", a, b)


@njit(cache=True, error_model="numpy")
def _div(x, y):
    return x / y


def _run_div(n, lo, hi, ctx, mem, store):
    return binary(run_view(ctx, mem, store), n, _div, lo, hi)


def _chunk_div(n, lo, hi, ctx, mem, store):
    return binary_chunk(run_view(ctx, mem, store), n, _div, hi)


defop(DIV, "div", div, _run_div, arity=2, kind=ELEMENTWISE, chunk=_chunk_div,
      vjp=lambda g, a, b, out: (g / b, -1.0 * (g * out / b)))


# ---- affine: a*x + b ----------------------------------------------------------------------------
def affine(t: Tensor, a: float, b: float) -> Tensor:
    """a * t + b for Python numbers a, b (what ``t * 2.0 + 1.0``-style expressions become)."""
    t = need_tensor(t, "affine")
    return t.graph._node(AFFINE, (t.id,), t.shape, fp=slots(AffineFP, scale=float(a), shift=float(b)))


@export
def scale(t: Tensor, s: float) -> Tensor:
    """s * t for a Python number s."""
    t = need_tensor(t, "scale")
    if not is_scalar(s):
        raise GraphError(f"scale: factor for {t.label!r} must be a real number, got {s!r}")
    return affine(t, float(s), 0.0)


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def _affine_loop(v, y, x, n):
    """y = scale * x + shift over the arrays y, x (node n's parameters)."""
    a = in_dtype_of(y, v.fp[n, AffineFP.scale])       # in the graph's dtype, as numpy's x * 2.0 is
    b = in_dtype_of(y, v.fp[n, AffineFP.shift])
    pure = v.fp[n, AffineFP.shift] == 0.0             # a pure scale: keep -0.0 as numpy's x * a does
    if same_data(y, x):                       # in place: one array (see _run)
        if pure:
            for i in range(y.size):
                y[i] = y[i] * a
        else:
            for i in range(y.size):
                y[i] = y[i] * a + b
    elif pure:
        for i in range(y.size):
            y[i] = x[i] * a
    else:
        for i in range(y.size):
            y[i] = x[i] * a + b
    return OK


def _run_affine(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    return _affine_loop(v, out[lo:hi], operand(v, n, 0)[lo:hi], n)     # slices from 0: see _run


def _chunk_affine(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return _affine_loop(v, chunk_operand(v, 0, hi), chunk_operand(v, 1, hi), n)


defop(AFFINE, "affine", affine, _run_affine, arity=1, kind=ELEMENTWISE, chunk=_chunk_affine, public=False, fp=AffineFP,
      vjp=lambda g, scale: either(scale == 1.0, g, scale * g))      # x + c passes g through


# ---- where: a where cond else b -----------------------------------------------------------------
def where(cond: Operand, a: Operand, b: Operand) -> Tensor:
    """``a`` where ``cond`` is nonzero, else ``b``; the three broadcast together (numpy's
    rules).  ``cond`` is a 0/1 mask (an input, a const, a comparison) and gets no
    gradient; ``a`` and ``b`` get the gradient where they were chosen."""
    g = graph_of("where", cond, a, b)
    tc, ta, tb = (as_tensor(x, g, "where") for x in (cond, a, b))
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(tc.shape, ta.shape, tb.shape))
    except ValueError:
        raise GraphError(f"where: shapes of cond {tc.label!r} {tc.shape}, {ta.label!r} {ta.shape} and "
                         f"{tb.label!r} {tb.shape} do not broadcast") from None
    return g._node(WHERE, (tc.id, ta.id, tb.id), shape)


@njit(cache=True, error_model="numpy")
def _where_run(out, o, c, ic, sc, a, ia, sa, b, ib, sb, n):
    y = out[o:o + n]
    for j in range(n):
        y[j] = a[ia + j * sa] if c[ic + j * sc] != 0.0 else b[ib + j * sb]


@njit(cache=True, error_model="numpy", inline="always")
def _where(v, n, lo, hi):
    out = output(v, n)
    c = operand(v, n, 0)
    a = operand(v, n, 1)
    b = operand(v, n, 2)
    lo, hi = span(lo, hi, out.size)
    shape = v.shape
    c0, c1, c2, c3 = bcast_strides(shape, v.src[n, 0])
    a0, a1, a2, a3 = bcast_strides(shape, v.src[n, 1])
    b0, b1, b2, b3 = bcast_strides(shape, v.src[n, 2])
    inner = shape[n, 3]
    for r in range(lo // inner, (hi + inner - 1) // inner):
        j0 = max(lo - r * inner, 0)
        j1 = min(hi - r * inner, inner)
        _where_run(out, r * inner + j0, c, row_offset(shape, n, r, c0, c1, c2) + j0 * c3, c3,
                   a, row_offset(shape, n, r, a0, a1, a2) + j0 * a3, a3,
                   b, row_offset(shape, n, r, b0, b1, b2) + j0 * b3, b3, j1 - j0)
    return OK


def _run_where(n, lo, hi, ctx, mem, store):
    return _where(run_view(ctx, mem, store), n, lo, hi)


defop(WHERE, "where", where, _run_where, arity=3, kind=ELEMENTWISE, sources=("cond", "a", "b"),
      vjp=lambda g, cond: (None, op.where(cond, g, 0.0 * g), op.where(cond, 0.0 * g, g)))   # the mask gets nothing
