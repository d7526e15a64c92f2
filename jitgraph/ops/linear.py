"""Matrix product with numpy's @ semantics (batched, broadcast batch dims), lowered
to as few BLAS calls as the layout allows.

Params (MatmulIP): trans_a, trans_b say whether the stored operand is transposed (its
last two axes swapped), so a transpose of either operand is read as it lies -- never
copied; mode = FLAT folds every leading axis of both operands into their rows;
contracted is the contracted length (the cost model's).

* ``(..., M, K) @ (K, N)`` -- a 2-D right operand -- is one GEMM over all leading
  rows (they are contiguous);
* the gradient of that 2-D operand is one FLAT GEMM contracting over all rows
  (``X^T G``), not a GEMM per batch and a sum;
* batched products (attention's ``q @ k^T``) call the GEMM once per matrix, on
  pointers into the operands (no copies, no allocation).

The GEMM is the host's fastest BLAS (blas.py), called directly (blas.natives).
"""
import numpy as np
from numba import njit

from enum import IntEnum

from ..errors import GraphError
from ..graph import Graph, Operand, Tensor
from ..native import (RUN_EXTENT, RUN_TILES, data_pointer, gemm, gemm_for, operand, output,
                      run_view, span)
from ..registry import COMPUTE, CUSTOM, DOT, DOT_K, MATMUL, TRANSPOSE, defop, slots
from ..rules import either, lays_out_products, op
from ..status import OK
from .common import as_tensor, graph_of
from .shape import TransposeIP, reshape


class MatmulIP(IntEnum):
    trans_a = 0               # the stored a is transposed: the product reads op(a) = a^T
    trans_b = 1
    mode = 2                  # FLAT: both operands are read as 2-D (all leading axes fold into rows)
    contracted = DOT_K        # the contracted length (the cost model's)


FLAT = 1
TILE_WORK = 8_000_000         # least flops in a tile of a product cut for several threads


def _params(ta: int, tb: int, k: int) -> tuple:
    return slots(MatmulIP, trans_a=ta, trans_b=tb, contracted=k)


def _lies_transposed(t: Tensor) -> tuple:
    """(tensor to read, 1) if ``t`` is a transpose swapping only its last two axes -- the
    product reads its source with the transpose flag instead -- else (t, 0)."""
    nodes = t.graph.nodes
    if nodes._m_op[t.id] == TRANSPOSE and t.ndim >= 2:       # memoryview: a Python int, fast
        perm = [int(nodes.ip[t.id, p]) for p in TransposeIP]
        if perm == [0, 1, 3, 2]:
            return Tensor(t.graph, int(nodes.src[t.id, 0])), 1
    return t, 0


def matmul(a: Operand, b: Operand) -> Tensor:
    """a @ b: 1-D operands are promoted like numpy (and the added axis removed)."""
    g = graph_of("matmul", a, b)
    return _matmul(g, as_tensor(a, g, "matmul"), as_tensor(b, g, "matmul"))


def _matmul(g: Graph, a: Tensor, b: Tensor) -> Tensor:
    sa, sb = a.shape, b.shape
    na, nb = len(sa), len(sb)
    if na == 2 and nb == 2 and sa[1] == sb[0]:        # the common case, kept short
        ra, ta = _lies_transposed(a)
        rb, tb = _lies_transposed(b)
        return g._node(MATMUL, (ra.id, rb.id), (sa[0], sb[1]), ip=_params(ta, tb, sa[1]))
    if na == 0 or nb == 0:
        s = a if na == 0 else b
        raise GraphError(f"matmul: {s.label!r} is a scalar; use * to scale")
    a2 = a if na >= 2 else reshape(a, (1, sa[0]))
    b2 = b if nb >= 2 else reshape(b, (sb[0], 1))
    sa2, sb2 = a2.shape, b2.shape
    if sa2[-1] != sb2[-2]:
        raise GraphError(f"matmul: inner dims differ: {a.label!r} {sa} @ {b.label!r} {sb} "
                         f"({sa2[-1]} != {sb2[-2]})")
    ba, bb = sa2[:-2], sb2[:-2]
    batch = []
    if ba or bb:
        nd = max(len(ba), len(bb))
        pa = (1,) * (nd - len(ba)) + ba
        pb = (1,) * (nd - len(bb)) + bb
        for x, y in zip(pa, pb):
            if x != y and x != 1 and y != 1:
                raise GraphError(f"matmul: batch dims of {a.label!r} {sa} and {b.label!r} {sb} "
                                 "do not broadcast")
            batch.append(max(x, y))
    ra, ta = _lies_transposed(a2)
    rb, tb = _lies_transposed(b2)
    out = g._node(MATMUL, (ra.id, rb.id), tuple(batch) + (sa2[-2], sb2[-1]), ip=_params(ta, tb, sa2[-1]))
    if na == 1 and nb == 1:
        return reshape(out, ())
    if na == 1:
        return reshape(out, out.shape[:-2] + (out.shape[-1],))
    if nb == 1:
        return reshape(out, out.shape[:-1])
    return out


@njit(cache=True, error_model="numpy")
def _gemm(fn, kind, tx, ty, m, n, K, X, ldx, Y, ldy, C, ldc):
    """Column-major C (m x n, leading dim ldc) = op(X) op(Y), X, Y, C typed pointers."""
    gemm(fn, kind, tx, ty, m, n, K, 1.0, X, ldx, Y, ldy, 0.0, C, ldc)


@njit(cache=True, error_model="numpy")
def swaps(ta, tb, rows, cols, K):
    """Compute a tile as its transpose?  OpenBLAS multiplies ``x @ W.T`` with few rows
    (a linear layer's input gradient, or a forward pass with weights stored (out, in))
    at 40 - 85 GFLOP/s where the transposed product ``W @ x.T`` runs at 78 - 101 (one
    thread, rows 16 - 128, K and N 256 - 2048, measured); the transpose back costs
    ~0.6 ns per element."""
    return ta == 0 and tb == 1 and rows < 256 and cols >= 256 and K >= 256


@njit(cache=True, error_model="numpy")
def _tile(fn, kind, C, A, B, ta, tb, N, K, lda, ldb, r0, r1, c0, c1):
    """Rows [r0, r1) x columns [c0, c1) of row-major C (N columns) = op(A) op(B), as the
    column-major C^T = op(B)^T op(A)^T, on pointers offset into C, op(A)'s rows and
    op(B)'s columns (offsets along the other axis when an operand is stored transposed),
    with C's leading dim kept -- or, where ``swaps`` says so, as the column-major tile
    op(A) op(B) into a scratch that is then transposed into C."""
    a0 = r0 if ta else r0 * lda
    b0 = c0 * ldb if tb else c0
    rows, cols = r1 - r0, c1 - c0
    if swaps(ta, tb, rows, cols, K):
        S = np.empty(rows * cols, C.dtype)
        _gemm(fn, kind, 1 - ta, 1 - tb, rows, cols, K, data_pointer(A[a0:]), lda, data_pointer(B[b0:]), ldb,
              data_pointer(S), rows)
        for i in range(rows):
            row = C[(r0 + i) * N + c0:(r0 + i) * N + c1]
            for j in range(cols):
                row[j] = S[j * rows + i]
    else:
        _gemm(fn, kind, tb, ta, cols, rows, K, data_pointer(B[b0:]), ldb, data_pointer(A[a0:]), lda,
              data_pointer(C[r0 * N + c0:]), N)


@njit(cache=True, error_model="numpy")
def tiling(M, N, K, most):
    """(row tiles, column tiles) of an (M, N) product contracting K, at most ``most``
    tiles (the size of the thread pool, fixed for the process).  A GEMM's result depends
    on how it is cut (OpenBLAS picks kernels by size), so this never depends on the
    number of threads a run uses.  Few, large tiles: each tile repacks its operands,
    which costs ~5% at 4 tiles of a (64, 1024) x (1024, 1024) product; tiles of at
    least TILE_WORK flops, shaped to pack the least (smallest half-perimeter), never
    slivers under 32."""
    want = min(most, max(1, 2 * M * N * K // TILE_WORK))
    best_r, best_c, best = 1, 1, M + N
    for rt in range(1, want + 1):
        ct = want // rt
        if (rt > 1 and M < 32 * rt) or (ct > 1 and N < 32 * ct):
            continue
        cost = (M + rt - 1) // rt + (N + ct - 1) // ct
        if rt * ct > best_r * best_c or (rt * ct == best_r * best_c and cost < best):
            best_r, best_c, best = rt, ct, cost
    return best_r, best_c


@njit(cache=True, error_model="numpy", inline="always")
def _product(v, n, lo, hi):
    """Units of work: equal tiles of one GEMM's output (see ``tiling``), or the matrices
    of a batched product; each is one single-threaded BLAS call."""
    s0 = v.src[n, 0]
    s1 = v.src[n, 1]
    out = output(v, n)
    A = operand(v, n, 0)
    B = operand(v, n, 1)
    so, sa, sb = v.shape[n], v.shape[s0], v.shape[s1]
    ta = v.ip[n, MatmulIP.trans_a]
    tb = v.ip[n, MatmulIP.trans_b]
    N = so[3]
    lda = sa[3]                              # a stored row-major matrix's leading dim: its columns
    ldb = sb[3]
    flat = v.ip[n, MatmulIP.mode] == FLAT
    one_gemm = flat or so[0] * so[1] == 1 or (sb[0] * sb[1] == 1 and ta == 0 and sa[0] == so[0]
                                              and sa[1] == so[1])
    if flat:                                 # every leading axis folded into the rows
        K = A.size // sa[3] if ta else sa[3]
    else:
        K = sa[2] if ta else sa[3]
    rows = out.size // N if one_gemm else so[2]
    fn, kind = gemm_for(v.ctx, rows, N, K, ta, tb)       # the library of the product's bucket (blas.py)
    row_tiles, col_tiles = tiling(rows, N, K, v.ctx[RUN_TILES])
    row_step = (rows + row_tiles - 1) // row_tiles
    col_step = (N + col_tiles - 1) // col_tiles
    units = row_tiles * col_tiles if one_gemm else so[0] * so[1]
    if lo < 0:
        v.ctx[RUN_EXTENT] = units
        return OK
    lo, hi = span(lo, hi, units)
    if one_gemm:                             # (..., M, K) @ (K, N): all leading rows in one GEMM, by tiles
        for u in range(lo, hi):
            r0 = (u // col_tiles) * row_step
            c0 = (u % col_tiles) * col_step
            _tile(fn, kind, out, A, B, ta, tb, N, K, lda, ldb, r0, min(r0 + row_step, rows), c0,
                  min(c0 + col_step, N))
    else:
        M = so[2]
        size_a = sa[2] * sa[3]
        size_b = sb[2] * sb[3]
        for b in range(lo, hi):
            i0 = b // so[1]
            i1 = b % so[1]
            ja = (i0 if sa[0] > 1 else 0) * sa[1] + (i1 if sa[1] > 1 else 0)
            jb = (i0 if sb[0] > 1 else 0) * sb[1] + (i1 if sb[1] > 1 else 0)
            _tile(fn, kind, out[b * M * N:], A[ja * size_a:], B[jb * size_b:], ta, tb, N, K, lda, ldb, 0, M, 0, N)
    return OK


def _run_matmul(n, lo, hi, ctx, mem, store):
    return _product(run_view(ctx, mem, store), n, lo, hi)


@lays_out_products
def _gradient_product(x, tx, y, ty, k, out, sources):
    """op(x) @ op(y) in a rule (flags tx, ty), as the gradient of source k of product node
    ``out``, laid out as that source is stored: when it is stored transposed, the product
    computes the transpose, (X Y)^T = Y^T X^T -- operands swap, flags flip, no transpose
    node.  The gradient of a 2-D operand broadcast over a batch is one FLAT product over all
    the batch's rows; other batch dims are out's, summed away by the backward pass.  A FLAT
    product's gradients are FLAT products shaped like their operand."""
    a, b = sources
    target = sources[k]
    stored_transposed = out.ip(MatmulIP.trans_a if k == 0 else MatmulIP.trans_b)
    flat = out.ip(MatmulIP.mode) == FLAT
    if k == 1:                             # dB over all rows at once
        flat = flat | ((out.ip(MatmulIP.trans_a) == 0) & (b.shape[0] * b.shape[1] == 1)
                       & (out.shape[0] * out.shape[1] > 1) & (a.shape[0] == out.shape[0])
                       & (a.shape[1] == out.shape[1]))
    rows = out.shape[0] * out.shape[1] * out.shape[2]
    return op.matmul(either(stored_transposed, y, x), either(stored_transposed, x, y),
                     like=either(flat, target, out), dims={2: target.shape[2], 3: target.shape[3]},
                     trans_a=either(stored_transposed, 1 - ty, tx), trans_b=either(stored_transposed, 1 - tx, ty),
                     mode=either(flat, FLAT, 0),
                     contracted=out.shape[3] if k == 0 else either(flat, rows, out.shape[2]))   # dA over N, dB over M


def _matmul_vjp(g, a, b, trans_a, trans_b):
    """C = A' B', A' = op(a) and B' = op(b) as the flags say: dA' = g B'^T, dB' = A'^T g."""
    a, b = a.transposed(trans_a), b.transposed(trans_b)
    return g @ b.T, a.T @ g


defop(MATMUL, "matmul", matmul, _run_matmul, _matmul_vjp, arity=2, cost=COMPUTE, flops=DOT, split=CUSTOM,
      blas=True, ip=MatmulIP)
