"""Fused scaled dot-product attention: ``attention(q, k, v, causal, scale)`` is one node,
its gradient one node, and neither ever holds a (Tq, Tk) score matrix.

Shapes: q (..., Tq, d), k and v (..., Tk, d), the same leading axes (B, H) on all three; the
kernels see B * H heads of row-major (T, d) matrices.  Or, layout TOKENS_FIRST: (B, T, H, d),
the heads side by side in each row (a head's rows H d apart) -- what a model's projections
write; ``attention`` builds it when q, k and v are transposes (0, 2, 1, 3) of such tensors, so
neither the split nor the merge of the heads is a copy.  Params (AttentionIP, AttentionFP):
causal, block_rows (BR, query rows per block), block_keys (KB, keys per block), layout,
contracted (the cost model's contracted length); scale.  The block sizes are fixed when the node is built (module constants), so a
result depends on the shapes only -- never on the thread count.

A block's scores live in a KB x BR scratch, allocated once per runner call: transposed, a key
per row (see ``_scores``: the products run faster so, and the softmax's loops run across
queries, vectorized, with no reductions).

**Forward** (``attention``).  A unit of work is one block of BR query rows of one head
(split CUSTOM).  For each block of KB keys: the scores by one GEMM, keys after the query set
to 0 when causal, and an online softmax -- running row maxima m and sums l; when m grows, the
partial sums and output rows are rescaled by exp(m_old - m_new) -- then O_i += P V_j by a
GEMM; at the end O_i /= l.  Causal blocks skip the keys no row of the block sees.

**Backward** (``attention_d``).  D = rowsum(dO * O) (a mul and a sum node) is packed beside
dO as ``gd = [dO | D]`` (a concat), since a node has at most four sources: the gradient node
is ``attention_d(q, k, v, gd)`` and its output packs the three gradients along the T axis,
(..., Tq + 2 Tk, d) = [dq; dk; dv]; each source's gradient is a ``slice`` of it (a copy of
its own size: under 1% of the node's time at T = 1024).  A unit is one head (dk and dv sum over
all query blocks; one unit accumulates them in a fixed order).  Per block of BR query rows,
the row statistics are recomputed from q and k -- scores by GEMM, their exps, m and l: the
log-sum-exp is recomputed, not saved, because a node has one output (O, which the user
reads), and saving it would take a second forward node computing the scores again or an
output wider than O sliced by a copy.  Then per key block, with P = exp(S - lse):
dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P (dP - D), dQ_i += scale dS K_j and
dK_j += scale dS^T Q_i (five GEMMs).  When the keys a block sees fit one key block (Tk <= KB,
the common case), the statistics pass's exps are P up to 1 / l (folded into dO and D) and
nothing is computed twice: the backward does 5 GEMMs and one exp per score, as
FlashAttention-2's.  Longer key ranges compute the scores and exps once more per block.

``attention_d`` has no gradient rule: second order through attention is not supported
(``build_backward`` of a gradient that flows through it raises, naming the op).
"""
import math
import numbers
from enum import IntEnum
from typing import Optional

import numpy as np
from numba import njit, uint64 as U

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, data_pointer, gemm, gemm_for, operand, output, run_view, span
from ..registry import ATTENTION, ATTENTION_D, COMPUTE, CUSTOM, DOT, DOT_K, TRANSPOSE, defop, slots
from ..rules import either, op
from ..status import OK
from .. import vmath
from ..vmath import in_dtype_of
from .reduce import rowsum
from .shape import TransposeIP, transpose


class AttentionIP(IntEnum):      # attention and attention_d
    causal = 0
    block_rows = 1               # query rows per block (BR)
    block_keys = 2               # keys per block (KB)
    layout = 3                   # HEADS_FIRST (..., H, T, d) or TOKENS_FIRST (B, T, H, d)
    contracted = DOT_K           # the cost model's contracted length


HEADS_FIRST, TOKENS_FIRST = 0, 1


class AttentionFP(IntEnum):
    scale = 0

BLOCK_ROWS = 128         # query rows per block (the forward's unit of work)
BLOCK_ROWS_CAUSAL = 64   # causal: fewer wasted scores above the diagonal (B, H, T, d = 8, 6, 128, 32: 14% faster)
BLOCK_KEYS = 2048        # keys per block; the scores' scratch is BLOCK_KEYS x BLOCK_ROWS (T = 2048: 12% over 1024)
# q, k and v that are transposes (0, 2, 1, 3) of (B, T, H, d) tensors -- a model's heads split
# from its projections -- are read as they lie, by row strides (TOKENS_FIRST): no transpose
# copies forward or backward (4% of a char GPT's step, Intel Xeon).  Read when a node is built.
READ_HEADS_AS_THEY_LIE = True


# ---- building ------------------------------------------------------------------------------------
def _check(what: str, q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise GraphError(f"{what}: {name} must be a Tensor, got {type(t).__name__}")
        if not 2 <= t.ndim <= 4:
            raise GraphError(f"{what}: {name} {t.label!r} {t.shape} must have 2 to 4 dims, (B, H, T, d)")
    for name, t in (("k", k), ("v", v)):
        if t.graph is not q.graph:
            raise GraphError(f"{what}: {name} {t.label!r} belongs to another graph than q {q.label!r}")
        if t.shape[:-2] != q.shape[:-2] or t.shape[-1] != q.shape[-1]:
            raise GraphError(f"{what}: {name} {t.label!r} {t.shape} must match q {q.label!r} {q.shape} "
                             "in its leading (B, H) axes and its last axis d")
    if v.shape != k.shape:
        raise GraphError(f"{what}: v {v.label!r} {v.shape} must have the shape of k {k.label!r} {k.shape}")


def _scale(scale: Optional[float], d: int, what: str) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise GraphError(f"{what}: scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _params(causal: bool, contracted: int, layout: int = HEADS_FIRST) -> tuple:
    if not isinstance(causal, (bool, np.bool_)):
        raise GraphError(f"attention: causal must be True or False, got {causal!r}")
    rows = BLOCK_ROWS_CAUSAL if causal else BLOCK_ROWS
    return slots(AttentionIP, causal=int(causal), block_rows=rows, block_keys=BLOCK_KEYS, layout=layout,
                 contracted=contracted)


def _tokens_first(t: Tensor) -> Optional[Tensor]:
    """The (B, T, H, d) tensor that ``t`` (B, H, T, d) is the transpose (0, 2, 1, 3) of, else None."""
    nodes = t.graph.nodes
    if t.ndim != 4 or nodes._m_op[t.id] != TRANSPOSE or [int(nodes.ip[t.id, p]) for p in TransposeIP] != [0, 2, 1, 3]:
        return None
    return Tensor(t.graph, int(nodes.src[t.id, 0]))


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None) -> Tensor:
    """softmax(scale q k^T + mask) v, fused: q (B, H, Tq, d), k and v (B, H, Tk, d) (or fewer
    leading axes, the same on all three) -> (B, H, Tq, d).  ``scale`` defaults to 1 / sqrt(d);
    ``causal`` masks key j for query i when j > i (PyTorch's is_causal: the top-left
    alignment when Tq != Tk).  Never holds a (Tq, Tk) matrix, forward or backward; the
    gradient recomputes the probabilities block by block (see the module docstring)."""
    _check("attention", q, k, v)
    s = _scale(scale, q.shape[-1], "attention")
    tk = k.shape[-2]
    contracted = tk if causal else 2 * tk
    qt, kt, vt = (_tokens_first(t) for t in (q, k, v)) if READ_HEADS_AS_THEY_LIE else (None, None, None)
    if qt is not None and kt is not None and vt is not None:   # heads read where the projections wrote them
        out = q.graph._node(ATTENTION, (qt.id, kt.id, vt.id), qt.shape, ip=_params(causal, contracted, TOKENS_FIRST),
                            fp=slots(AttentionFP, scale=s))
        return transpose(out, (0, 2, 1, 3))     # a transpose back to (B, T, H, d) is out itself
    return q.graph._node(ATTENTION, (q.id, k.id, v.id), q.shape, ip=_params(causal, contracted),
                         fp=slots(AttentionFP, scale=s))


# ---- the kernels' pieces -------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def _mm(gemms, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
    """Row-major C (M x N, row stride ldc) = alpha op(A) op(B) + beta C, the matrices starting
    at the first elements of A, B, C (op: transposed when ta / tb is 1): the column-major
    C^T = op(B)^T op(A)^T of the BLAS, from the library of its bucket (``gemms``: the run's ctx)."""
    fn, kind = gemm_for(gemms, M, N, K, ta, tb)
    gemm(fn, kind, tb, ta, N, M, K, alpha, data_pointer(B), ldb, data_pointer(A), lda, beta, data_pointer(C), ldc)


@njit(cache=True, error_model="numpy")
def _first_seen(causal, key, q0, rows):
    """The first of query rows [q0, q0 + rows) that sees ``key`` (keys <= query when causal)."""
    return 0 if causal == 0 else min(rows, max(0, key - q0))


@njit(cache=True, error_model="numpy")
def _head(h, Hn, T, d):
    """Where head h's first row starts in a tensor of T rows a head: (B H, T, d) when Hn = 1,
    (B, T, Hn, d) -- rows Hn d apart, the heads side by side -- otherwise."""
    return (h // Hn) * T * Hn * d + (h % Hn) * d


@njit(cache=True, error_model="numpy")
def _scores(gemms, St, Q, K, q0, rows, k0, kb, d, rs, scale):
    """St (kb x rows) = scale K_blk Q_i^T: the scores of query rows [q0, q0 + rows) against keys
    [k0, k0 + kb), transposed -- a key per row of St.  Stored so, the products run faster (d = 64,
    128 query rows, 1024 keys: 93 GFLOP/s for K Q^T against 69 for Q K^T, and 95 against 85 for
    the gradients' products) and the softmax's work runs along St's rows, across queries, so its
    loops vectorize without reductions.  Q's and K's rows are ``rs`` apart."""
    _mm(gemms, 0, 1, kb, rows, d, scale, K[k0 * rs:], rs, Q[q0 * rs:], rs, 0.0, St, rows)
    return OK


@njit(cache=True, error_model="numpy")
def _online(St, rows, kb, q0, k0, causal, m, l, corr, mx):
    """One key block of the online softmax of query rows [q0, q0 + rows): St (kb x rows) holds
    the scores and gets exp(s - m_new) (0 where masked); m, l are the running maxima and sums,
    corr[r] = exp(m_old - m_new) the factor earlier partial results need; mx is scratch."""
    zero = in_dtype_of(St, 0.0)
    ninf = in_dtype_of(St, -np.inf)
    for r in range(rows):
        mx[r] = m[r]
    for i in range(kb):                  # unsigned indices: no slice per key row (ops/windows.py)
        r0, at = U(_first_seen(causal, k0 + i, q0, rows)), U(i * rows)
        for j in range(r0, U(rows)):
            mx[j] = max(mx[j], St[at + j])
    for r in range(rows):
        c = zero if m[r] == ninf else vmath.exp_nonpositive(m[r] - mx[r])
        corr[r] = c
        l[r] *= c
        m[r] = mx[r]
    for i in range(kb):
        r0, at = U(_first_seen(causal, k0 + i, q0, rows)), U(i * rows)
        for j in range(r0):
            St[at + j] = zero
        for j in range(r0, U(rows)):
            e = vmath.exp_nonpositive(St[at + j] - m[j])
            St[at + j] = e
            l[j] += e
    return OK


@njit(cache=True, error_model="numpy")
def _probabilities(St, rows, kb, q0, k0, causal, lse):
    """St (kb x rows) of scores -> exp(s - lse[r]), 0 where masked."""
    zero = in_dtype_of(St, 0.0)
    for i in range(kb):                  # unsigned indices, as in _online
        r0, at = U(_first_seen(causal, k0 + i, q0, rows)), U(i * rows)
        for j in range(r0):
            St[at + j] = zero
        for j in range(r0, U(rows)):
            St[at + j] = vmath.exp_nonpositive(St[at + j] - lse[j])
    return OK


@njit(cache=True, error_model="numpy")
def _stats(gemms, St, Q, K, q0, rows, kend, d, rs, KB, scale, causal, m, l, corr, mx):
    """Row maxima m and sums l of exp(scores) of query rows [q0, q0 + rows) over keys
    [0, kend); St holds the last key block's exps (relative to the final m when one block)."""
    for r in range(rows):
        m[r] = in_dtype_of(St, -np.inf)
        l[r] = in_dtype_of(St, 0.0)
    for k0 in range(0, kend, KB):
        kb = min(KB, kend - k0)
        _scores(gemms, St, Q, K, q0, rows, k0, kb, d, rs, scale)
        _online(St, rows, kb, q0, k0, causal, m, l, corr, mx)
    return OK


@njit(cache=True, error_model="numpy")
def _scratch(out, rows, keys):
    """A call's scratch: transposed scores (keys x rows), and per query row the maximum, sum,
    correction factor and a spare."""
    return (np.empty(rows * keys, out.dtype), np.empty(rows, out.dtype), np.empty(rows, out.dtype),
            np.empty(rows, out.dtype), np.empty(rows, out.dtype))


# ---- forward -------------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def attention_forward(out, Q, K, V, heads, Tq, Tk, d, Hn, scale, causal, BR, KB, lo, hi, gemms):
    """Units [lo, hi): unit u is query rows [BR b, BR b + BR) of head h, u = h * blocks + b;
    Hn heads side by side in a row (see _head)."""
    blocks = (Tq + BR - 1) // BR
    rs = Hn * d                                   # one row to the next of a head
    St, m, l, corr, mx = _scratch(out, min(BR, Tq), min(KB, Tk))
    for u in range(lo, hi):
        h = u // blocks
        q0 = (u % blocks) * BR
        rows = min(BR, Tq - q0)
        Qh = Q[_head(h, Hn, Tq, d):]
        Kh = K[_head(h, Hn, Tk, d):]
        Vh = V[_head(h, Hn, Tk, d):]
        acc = out[_head(h, Hn, Tq, d) + q0 * rs:]
        for r in range(rows):
            a = acc[r * rs:r * rs + d]
            for j in range(d):
                a[j] = 0.0
            m[r] = in_dtype_of(out, -np.inf)
            l[r] = in_dtype_of(out, 0.0)
        kend = min(Tk, q0 + rows) if causal else Tk
        for k0 in range(0, kend, KB):
            kb = min(KB, kend - k0)
            _scores(gemms, St, Qh, Kh, q0, rows, k0, kb, d, rs, scale)
            _online(St, rows, kb, q0, k0, causal, m, l, corr, mx)
            if k0 > 0:
                for r in range(rows):
                    c = corr[r]
                    a = acc[r * rs:r * rs + d]
                    for j in range(d):
                        a[j] *= c
            _mm(gemms, 1, 0, rows, d, kb, 1.0, St, rows, Vh[k0 * rs:], rs, 1.0, acc, rs)      # O += P V
        for r in range(rows):
            inv = in_dtype_of(out, 1.0) / l[r]
            a = acc[r * rs:r * rs + d]
            for j in range(d):
                a[j] *= inv
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def geometry(sq, sk, layout):
    """(heads, Tq, Tk, d, heads side by side in a row) of q's and k's padded shapes."""
    if layout == TOKENS_FIRST:                    # (B, T, H, d)
        return sq[0] * sq[2], sq[1], sk[1], sq[3], sq[2]
    return sq[0] * sq[1], sq[2], sk[2], sq[3], 1


def _run_attention(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    heads, Tq, Tk, d, Hn = geometry(v.shape[v.src[n, 0]], v.shape[v.src[n, 1]], v.ip[n, AttentionIP.layout])
    BR = v.ip[n, AttentionIP.block_rows]
    units = heads * ((Tq + BR - 1) // BR)
    if lo < 0:
        v.ctx[RUN_EXTENT] = units
        return OK
    lo, hi = span(lo, hi, units)
    status = attention_forward(output(v, n), operand(v, n, 0), operand(v, n, 1), operand(v, n, 2), heads, Tq, Tk, d,
                               Hn, v.fp[n, AttentionFP.scale], v.ip[n, AttentionIP.causal], BR,
                               v.ip[n, AttentionIP.block_keys], lo, hi, v.ctx)
    return status


@njit(cache=True)
def _d_contracted(Tq, Tk, causal):
    """The contracted length of attention_d: its ~5 (2.5 causal) Tq Tk d multiply-adds per packed element."""
    return max(1, (5 * Tq * Tk) // ((2 if causal else 1) * (Tq + 2 * Tk)))


def _attention_vjp(g, q, k, v, out, causal, block_rows, block_keys, layout, scale):
    """One attention_d node computes [dq; dk; dv] packed along T from q, k, v and
    gd = [dO | rowsum(dO * O)]; each source's gradient is its slice (along T: axis 2 of
    (B, H, T, d), axis 1 of TOKENS_FIRST's (B, T, H, d))."""
    tokens = layout == TOKENS_FIRST
    axis = either(tokens, 1, 2)
    Tq, Tk = either(tokens, q.shape[1], q.shape[2]), either(tokens, k.shape[1], k.shape[2])
    gd = op.concat(g, rowsum(g * out, out, 3), like=out, dims={3: out.shape[3] + 1}, axis=3)
    work = (5 * Tq * Tk) // (either(causal, 2, 1) * (Tq + 2 * Tk))          # _d_contracted, as scalars
    packed = op.attention_d(q, k, v, gd, like=q, dims={1: either(tokens, Tq + 2 * Tk, q.shape[1]),
                                                       2: either(tokens, q.shape[2], Tq + 2 * Tk)},
                            causal=causal, block_rows=block_rows, block_keys=block_keys, layout=layout,
                            contracted=either(work > 1, work, 1), scale=scale)
    return (op.slice(packed, like=q, axis=axis, start=0), op.slice(packed, like=k, axis=axis, start=Tq),
            op.slice(packed, like=v, axis=axis, start=Tq + Tk))


defop(ATTENTION, "attention", attention, _run_attention, _attention_vjp, arity=3, cost=COMPUTE, flops=DOT,
      split=CUSTOM, blas=True, sources=("q", "k", "v"), ip=AttentionIP, fp=AttentionFP)


# ---- backward ------------------------------------------------------------------------------------
def attention_d(q: Tensor, k: Tensor, v: Tensor, gd: Tensor, causal: bool = False,
                scale: Optional[float] = None) -> Tensor:
    """attention's gradients packed along the T axis, (..., Tq + 2 Tk, d) = [dq; dk; dv], from
    q, k, v and ``gd`` = [dO | D] (..., Tq, d + 1): the output's gradient dO beside
    D = rowsum(dO * O).  It has no gradient of its own (no second order through attention)."""
    _check("attention_d", q, k, v)
    if not isinstance(gd, Tensor) or gd.graph is not q.graph or gd.shape != q.shape[:-1] + (q.shape[-1] + 1,):
        raise GraphError(f"attention_d: gd {getattr(gd, 'label', gd)!r} must be a tensor of q's graph with shape "
                         f"{q.shape[:-1] + (q.shape[-1] + 1,)} ([dO | D]), got {getattr(gd, 'shape', None)}")
    s = _scale(scale, q.shape[-1], "attention_d")
    tq, tk = q.shape[-2], k.shape[-2]
    shape = q.shape[:-2] + (tq + 2 * tk, q.shape[-1])
    return q.graph._node(ATTENTION_D, (q.id, k.id, v.id, gd.id), shape,
                         ip=_params(causal, int(_d_contracted(tq, tk, int(causal)))), fp=slots(AttentionFP, scale=s))


@njit(cache=True, error_model="numpy")
def attention_backward(out, Q, K, V, GD, Tq, Tk, d, Hn, scale, causal, BR, KB, lo, hi, gemms):
    """Heads [lo, hi): each head's [dq; dk; dv] (see the module docstring); Hn heads side by
    side in a row (see _head)."""
    St, m, l, corr, mx = _scratch(out, min(BR, Tq), min(KB, Tk))
    dPt = np.empty(St.size, out.dtype)
    dO = np.empty(min(BR, Tq) * d, out.dtype)     # a block's dO rows, times 1 / l when one key block
    one = in_dtype_of(out, 1.0)
    w = d + 1                                     # gd's rows: dO, then D
    rs, rg = Hn * d, Hn * w                       # one row to the next of a head, in q, k, v, out and in gd
    for h in range(lo, hi):
        Qh = Q[_head(h, Hn, Tq, d):]
        Kh = K[_head(h, Hn, Tk, d):]
        Vh = V[_head(h, Hn, Tk, d):]
        Gh = GD[_head(h, Hn, Tq, w):]
        base = _head(h, Hn, Tq + 2 * Tk, d)
        dq = out[base:]
        dk = out[base + Tq * rs:]
        dv = out[base + (Tq + Tk) * rs:]
        for r in range(Tq + 2 * Tk):
            row = dq[r * rs:r * rs + d]
            for j in range(d):
                row[j] = 0.0
        for q0 in range(0, Tq, BR):
            rows = min(BR, Tq - q0)
            kend = min(Tk, q0 + rows) if causal else Tk
            _stats(gemms, St, Qh, Kh, q0, rows, kend, d, rs, KB, scale, causal, m, l, corr, mx)
            single = kend <= KB
            for r in range(rows):
                if single:                   # St holds exp(s - max) = l P: 1 / l goes into dO
                    inv = one / l[r]
                else:                        # P = exp(s - lse), recomputed per key block
                    m[r] = m[r] + vmath.log(l[r])
                    inv = one
                g = Gh[(q0 + r) * rg:(q0 + r) * rg + w]
                o = dO[r * d:(r + 1) * d]
                for j in range(d):
                    o[j] = g[j] * inv
                corr[r] = g[d] * inv         # D / l
            for k0 in range(0, kend, KB):
                kb = min(KB, kend - k0)
                if not single:
                    _scores(gemms, St, Qh, Kh, q0, rows, k0, kb, d, rs, scale)
                    _probabilities(St, rows, kb, q0, k0, causal, m)
                _mm(gemms, 0, 0, kb, d, rows, 1.0, St, rows, dO, d, 1.0, dv[k0 * rs:], rs)     # dV += P^T dO
                _mm(gemms, 0, 1, kb, rows, d, 1.0, Vh[k0 * rs:], rs, dO, d, 0.0, dPt, rows)    # dP^T = V dO^T
                for i in range(kb):                                                           # dS = P (dP - D)
                    at = U(i * rows)
                    for r in range(U(rows)):
                        dPt[at + r] = St[at + r] * (dPt[at + r] - corr[r])
                # dQ += scale dS K, dK += scale dS^T Q
                _mm(gemms, 1, 0, rows, d, kb, scale, dPt, rows, Kh[k0 * rs:], rs, 1.0, dq[q0 * rs:], rs)
                _mm(gemms, 0, 0, kb, d, rows, scale, dPt, rows, Qh[q0 * rs:], rs, 1.0, dk[k0 * rs:], rs)
    return OK


def _run_attention_d(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    heads, Tq, Tk, d, Hn = geometry(v.shape[v.src[n, 0]], v.shape[v.src[n, 1]], v.ip[n, AttentionIP.layout])
    if lo < 0:
        v.ctx[RUN_EXTENT] = heads
        return OK
    lo, hi = span(lo, hi, heads)
    status = attention_backward(output(v, n), operand(v, n, 0), operand(v, n, 1), operand(v, n, 2),
                                operand(v, n, 3), Tq, Tk, d, Hn, v.fp[n, AttentionFP.scale],
                                v.ip[n, AttentionIP.causal], v.ip[n, AttentionIP.block_rows],
                                v.ip[n, AttentionIP.block_keys], lo, hi, v.ctx)
    return status


defop(ATTENTION_D, "attention_d", attention_d, _run_attention_d, arity=4, cost=COMPUTE, flops=DOT, split=CUSTOM,
      public=False, blas=True, sources=("q", "k", "v", "gd"), ip=AttentionIP, fp=AttentionFP)
