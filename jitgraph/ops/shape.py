"""Ops that move data without arithmetic: reshape (a view), transpose, concat,
slice and pad (slice's gradient).  Axis parameters live in the padded 4-dim space.
"""
import numbers
from enum import IntEnum
from typing import Optional, Sequence, Union

from numba import njit, uint64 as U

from ..errors import GraphError
from ..graph import Tensor, check_shape
from ..ir import MAX_DIMS, MAX_SRC
from ..native import data_pointer, operand, output, run_view, span
from ..simd import VECTOR_BYTES, transpose_tile
from ..registry import CONCAT, FREE, PAD, RESHAPE, ROWS, SLICE, TRANSPOSE, VIEW, defop, slots
from ..rules import op
from ..status import OK
from .common import graph_of, need_tensor, normalize_axis


class TransposeIP(IntEnum):     # output axis d is source axis axis<d> (padded)
    axis0 = 0
    axis1 = 1
    axis2 = 2
    axis3 = 3


class ConcatIP(IntEnum):
    axis = 0                    # padded


class SliceIP(IntEnum):
    axis = 0                    # padded
    start = 1


class PadIP(IntEnum):
    axis = 0                    # padded
    before = 1                  # zeros before the source's first element along axis


def _inverse_permutation(perm):
    """In a rule: the slots of the transpose that undoes ``perm`` (four scalars)."""
    return {f"axis{j}": sum(d * (p == j) for d, p in enumerate(perm)) for j in range(MAX_DIMS)}


# ---- reshape: a view ------------------------------------------------------------------------------
def reshape(t: Tensor, shape: Union[int, Sequence[int]]) -> Tensor:
    """Same data, new shape (one dim may be -1).  A view: no copy, no buffer."""
    t = need_tensor(t, "reshape")
    dims: tuple = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)   # type: ignore[arg-type]
    size = t.size
    if sum(1 for d in dims if d == -1) > 1:
        raise GraphError(f"reshape of {t.label!r}: at most one dimension may be -1, got {dims}")
    if -1 in dims:
        known = 1
        for d in dims:
            if d != -1:
                known *= d
        if known <= 0 or size % known:
            raise GraphError(f"reshape of {t.label!r}: cannot reshape {t.shape} (size {size}) to {dims}")
        dims = tuple(size // known if d == -1 else d for d in dims)
    new = check_shape(dims, f"reshape of {t.label!r}")
    new_size = 1
    for d in new:
        new_size *= d
    if new_size != size:
        raise GraphError(f"reshape of {t.label!r}: cannot reshape {t.shape} (size {size}) to {new} (size {new_size})")
    if new == t.shape:
        return t
    return t.graph._node(RESHAPE, (t.id,), new)


defop(RESHAPE, "reshape", reshape, None, arity=1, kind=VIEW, cost=FREE, flops=0,
      vjp=lambda g, x: op.reshape(g, like=x))


# ---- transpose ------------------------------------------------------------------------------------
def transpose(t: Tensor, axes: Optional[Sequence[int]] = None) -> Tensor:
    """Permute axes (default: reverse them), as numpy.transpose."""
    t = need_tensor(t, "transpose")
    nd = t.ndim
    if axes is None:
        axes = tuple(range(nd - 1, -1, -1))
    try:
        axes = tuple(axes)
    except TypeError:
        raise GraphError(f"transpose of {t.label!r}: axes must be a sequence of ints, got {axes!r}") from None
    norm = tuple(normalize_axis(a, nd, f"transpose of {t.label!r}") for a in axes)
    if len(norm) != nd or sorted(norm) != list(range(nd)):
        raise GraphError(f"transpose of {t.label!r}: axes {axes} are not a permutation of {nd} axes")
    shape = tuple(t.shape[a] for a in norm)
    if norm == tuple(range(nd)):
        return t
    off = MAX_DIMS - nd
    nodes = t.graph.nodes
    if nodes._m_op[t.id] == TRANSPOSE:    # undoing a transpose: its source itself, no copy
        inner = [int(nodes.ip[t.id, off + a]) - off for a in range(nd)]
        if [inner[a] for a in norm] == list(range(nd)):
            return Tensor(t.graph, int(nodes.src[t.id, 0]))
    moved = [a for a in norm if t.shape[a] != 1]
    if moved == sorted(moved):            # only size-1 axes move: same memory order
        return reshape(t, shape)
    perm = tuple(range(off)) + tuple(a + off for a in norm)
    return t.graph._node(TRANSPOSE, (t.id,), shape, ip=perm)        # TransposeIP's slots in order


TILE = transpose_tile(VECTOR_BYTES)


@njit(cache=True, error_model="numpy")
def transpose_kernel(out, x, sx, perm, lo, hi):
    """Output rows [lo, hi) (all axes but the last) of x's axes permuted by perm.  Where the
    last output axis is strided and the one before it is x's last (a batch of 2-D transposes:
    channels first <-> channels last, a matrix's .T), L rows at a time go by L x L tiles."""
    c = (sx[1] * sx[2] * sx[3], sx[2] * sx[3], sx[3], 1)
    s0 = c[perm[0]]
    s1 = c[perm[1]]
    s2 = c[perm[2]]
    s3 = c[perm[3]]
    n1 = sx[perm[1]]
    n2 = sx[perm[2]]
    n3 = sx[perm[3]]
    step = U(s3)
    L = VECTOR_BYTES // out.itemsize
    tiled = s3 != 1 and s2 == 1 and n2 >= L and n3 >= L
    if lo >= hi:
        return OK
    r = lo
    i2 = lo % n2                   # row r = (i0 n1 + i1) n2 + i2: divided once, then counted
    i1 = (lo // n2) % n1           # (a division per row cost more than a row of 32 elements)
    i0 = lo // (n2 * n1)
    while r < hi:
        base = U(i0 * s0 + i1 * s1 + i2 * s2)
        y = U(r * n3)              # unsigned indices: no wraparound test, no slice per row (ops/windows.py)
        if tiled and i2 + L <= n2 and r + L <= hi:      # rows r .. r + L - 1: x's elements base + a
            i3 = 0
            while i3 + L <= n3:
                TILE(data_pointer(x[base + step * i3:]), s3, data_pointer(out[y + i3:]), n3)
                i3 += L
            for a in range(U(L)):
                for j in range(U(i3), U(n3)):
                    out[y + a * n3 + j] = x[base + a + step * j]
            r += L
            i2 += L                # at most to the end of axis 2
        else:
            if s3 == 1:
                for i3 in range(U(n3)):
                    out[y + i3] = x[base + i3]
            else:
                for i3 in range(U(n3)):
                    out[y + i3] = x[base + step * i3]
            r += 1
            i2 += 1
        if i2 == n2:
            i2 = 0
            i1 += 1
            if i1 == n1:
                i1 = 0
                i0 += 1
    return OK


def _run_transpose(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    so = v.shape[n]
    lo, hi = span(lo, hi, so[0] * so[1] * so[2])
    return transpose_kernel(output(v, n), operand(v, n, 0), v.shape[v.src[n, 0]], v.ip[n], lo, hi)


defop(TRANSPOSE, "transpose", transpose, _run_transpose, arity=1, split=ROWS, ip=TransposeIP,
      vjp=lambda g, x, axis0, axis1, axis2, axis3: op.transpose(g, like=x, **_inverse_permutation(
          (axis0, axis1, axis2, axis3))))


# ---- concat ---------------------------------------------------------------------------------------
def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors of equal shape but along ``axis``."""
    if isinstance(tensors, Tensor) or not hasattr(tensors, "__iter__"):
        raise GraphError("concat: expects a list of tensors")
    ts = list(tensors)
    if not ts:
        raise GraphError("concat: needs at least one tensor")
    g = graph_of("concat", *ts)
    for t in ts:
        need_tensor(t, "concat")
    first = ts[0]
    nd = first.ndim
    if nd == 0:
        raise GraphError(f"concat: {first.label!r} is a scalar; concat needs at least 1 dim")
    ax = normalize_axis(axis, nd, "concat")
    for t in ts[1:]:
        if t.ndim != nd or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax):
            raise GraphError(f"concat along axis {ax}: {t.label!r} {t.shape} does not match "
                             f"{first.label!r} {first.shape} off that axis")
    while len(ts) > 1:               # balanced tree of nodes with up to MAX_SRC sources
        ts = [_concat_node(g, ts[i:i + MAX_SRC], ax) for i in range(0, len(ts), MAX_SRC)]
    return ts[0]


def _concat_node(g, ts, ax):
    if len(ts) == 1:
        return ts[0]
    shape = list(ts[0].shape)
    shape[ax] = sum(t.shape[ax] for t in ts)
    return g._node(CONCAT, tuple(t.id for t in ts), tuple(shape), ip=slots(ConcatIP, axis=ax + MAX_DIMS - ts[0].ndim))


@njit(cache=True, error_model="numpy")
def outer_inner(s, axis):
    """Products of the padded dims before and after ``axis``."""
    outer = 1
    for d in range(axis):
        outer *= s[d]
    inner = 1
    for d in range(axis + 1, 4):
        inner *= s[d]
    return outer, inner


@njit(cache=True, error_model="numpy")
def block_copy(dst, dst_stride, dst_off, src, src_stride, src_off, outer, run):
    """dst[o*dst_stride + dst_off + j] = src[o*src_stride + src_off + j]."""
    for o in range(outer):
        d, s = U(o * dst_stride + dst_off), U(o * src_stride + src_off)     # unsigned: as transpose_kernel
        for j in range(U(run)):
            dst[d + j] = src[s + j]


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def _concat(v, n):
    out = output(v, n)
    axis = v.ip[n, ConcatIP.axis]
    outer, inner = outer_inner(v.shape[n], axis)
    total = v.shape[n, axis] * inner
    start = 0
    for k in range(MAX_SRC):
        s = v.src[n, k]
        if s < 0:
            break
        run = v.shape[s, axis] * inner
        block_copy(out, total, start, operand(v, n, k), run, 0, outer, run)
        start += run
    return OK


def _run_concat(n, lo, hi, ctx, mem, store):
    return _concat(run_view(ctx, mem, store), n)


defop(CONCAT, "concat", concat, _run_concat, arity=-1, ip=ConcatIP,          # each source's slice of g
      vjp=lambda g, x0, x1, x2, x3, axis: tuple(
          op.slice(g, like=x, axis=axis, start=sum(t.shape[axis] for t in (x0, x1, x2)[:k]))
          for k, x in enumerate((x0, x1, x2, x3))))


# ---- slice ----------------------------------------------------------------------------------------
def slice_axis(t: Tensor, axis: int, start: int, stop: int) -> Tensor:
    """Elements start:stop (step 1) along ``axis``."""
    t = need_tensor(t, "slice")
    ax = normalize_axis(axis, t.ndim, f"slice of {t.label!r}") if t.ndim else None
    if ax is None:
        raise GraphError(f"slice of {t.label!r}: a scalar has no axis to slice")
    n = t.shape[ax]
    if not (isinstance(start, numbers.Integral) and isinstance(stop, numbers.Integral)):
        raise GraphError(f"slice of {t.label!r}: start and stop must be ints")
    start, stop = int(start), int(stop)
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    if not 0 <= start < stop <= n:
        raise GraphError(f"slice of {t.label!r}: [{start}:{stop}] is empty or outside axis {ax} of size {n}")
    if stop - start == n:
        return t
    shape = list(t.shape)
    shape[ax] = stop - start
    return t.graph._node(SLICE, (t.id,), tuple(shape), ip=slots(SliceIP, axis=ax + MAX_DIMS - t.ndim, start=start))


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def _slice(v, n):
    axis = v.ip[n, SliceIP.axis]
    outer, inner = outer_inner(v.shape[n], axis)
    run = v.shape[n, axis] * inner
    block_copy(output(v, n), run, 0, operand(v, n, 0), v.shape[v.src[n, 0], axis] * inner, v.ip[n, SliceIP.start] * inner,
               outer, run)
    return OK


def _run_slice(n, lo, hi, ctx, mem, store):
    return _slice(run_view(ctx, mem, store), n)


defop(SLICE, "slice", slice_axis, _run_slice, arity=1, ip=SliceIP,
      vjp=lambda g, x, axis, start: op.pad(g, like=x, axis=axis, before=start))


# ---- pad: slice's adjoint -------------------------------------------------------------------------
def pad_axis(t: Tensor, axis: int, before: int, after: int) -> Tensor:
    """Zeros added before and after ``t`` along ``axis`` (slice's adjoint)."""
    t = need_tensor(t, "pad")
    if t.ndim == 0:
        raise GraphError(f"pad of {t.label!r}: a scalar has no axis to pad")
    ax = normalize_axis(axis, t.ndim, f"pad of {t.label!r}")
    if not (isinstance(before, numbers.Integral) and isinstance(after, numbers.Integral)) or before < 0 or after < 0:
        raise GraphError(f"pad of {t.label!r}: before and after must be ints >= 0")
    if before == 0 and after == 0:
        return t
    shape = list(t.shape)
    shape[ax] += int(before) + int(after)
    return t.graph._node(PAD, (t.id,), tuple(shape), ip=slots(PadIP, axis=ax + MAX_DIMS - t.ndim, before=int(before)))


@njit(cache=True, error_model="numpy", inline="always")   # takes the run view: inlined, or passing it costs ~40 ns
def _pad(v, n):
    out = output(v, n)
    axis = v.ip[n, PadIP.axis]
    outer, inner = outer_inner(v.shape[n], axis)
    for i in range(out.size):
        out[i] = 0.0
    run = v.shape[v.src[n, 0], axis] * inner
    block_copy(out, v.shape[n, axis] * inner, v.ip[n, PadIP.before] * inner, operand(v, n, 0), run, 0, outer, run)
    return OK


def _run_pad(n, lo, hi, ctx, mem, store):
    return _pad(run_view(ctx, mem, store), n)


defop(PAD, "pad", pad_axis, _run_pad, arity=1, ip=PadIP,
      vjp=lambda g, x, axis, before: op.slice(g, like=x, axis=axis, start=before))
