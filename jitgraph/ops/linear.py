"""Matrix product with numpy's @ semantics (batched, broadcast batch dims).

ip[0], ip[1] say whether the stored operand is transposed (its last two axes
swapped).  Forward graphs never set them; gradient rules do, so a gradient needs
no transpose node and BLAS reads the operand as it lies (F-order view).
"""
import numpy as np
from numba import njit

from ..emit import grad_node
from ..errors import GraphError
from ..graph import Graph, Operand, Tensor
from ..native import operand, output, rule_view, run_view
from ..registry import COMPUTE, DOT, DOT_K, defop
from ..status import OK
from .common import as_tensor, graph_of
from .shape import reshape

__all__ = ["matmul"]

MATMUL = 37


def _params(ta: int, tb: int, k: int) -> tuple:
    """ip: transpose flags, then the contracted length in ip[DOT_K] (the cost model reads it)."""
    ip = [0] * (DOT_K + 1)
    ip[0], ip[1], ip[DOT_K] = ta, tb, k
    return tuple(ip)


def matmul(a: Operand, b: Operand) -> Tensor:
    """a @ b: 1-D operands are promoted like numpy (and the added axis removed)."""
    g = graph_of("matmul", a, b)
    return _matmul(g, as_tensor(a, g, "matmul"), as_tensor(b, g, "matmul"))


def _matmul(g: Graph, a: Tensor, b: Tensor) -> Tensor:
    sa, sb = a.shape, b.shape
    na, nb = len(sa), len(sb)
    if na == 2 and nb == 2:                           # the common case, kept short
        if sa[1] != sb[0]:
            raise GraphError(f"matmul: inner dims differ: {a.label!r} {sa} @ {b.label!r} {sb} "
                             f"({sa[1]} != {sb[0]})")
        return g._node(MATMUL, (a.id, b.id), (sa[0], sb[1]), ip=_params(0, 0, sa[1]))
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
    nd = max(len(ba), len(bb))
    pa = (1,) * (nd - len(ba)) + ba
    pb = (1,) * (nd - len(bb)) + bb
    batch = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise GraphError(f"matmul: batch dims of {a.label!r} {sa} and {b.label!r} {sb} "
                             "do not broadcast")
        batch.append(max(x, y))
    out = g._node(MATMUL, (a2.id, b2.id), tuple(batch) + (sa2[-2], sb2[-1]), ip=_params(0, 0, sa2[-1]))
    if na == 1 and nb == 1:
        return reshape(out, ())
    if na == 1:
        return reshape(out, out.shape[:-2] + (out.shape[-1],))
    if nb == 1:
        return reshape(out, out.shape[:-1])
    return out


# ---- kernel -----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def matmul_kernel(out, a, b, so, sa, sb, ta, tb):
    m = so[2]
    n = so[3]
    k = sa[2] if ta else sa[3]
    size_a = sa[2] * sa[3]
    size_b = sb[2] * sb[3]
    o = 0
    for i0 in range(so[0]):
        for i1 in range(so[1]):
            ja = (i0 if sa[0] > 1 else 0) * sa[1] + (i1 if sa[1] > 1 else 0)
            jb = (i0 if sb[0] > 1 else 0) * sb[1] + (i1 if sb[1] > 1 else 0)
            A = a[ja * size_a:(ja + 1) * size_a]
            B = b[jb * size_b:(jb + 1) * size_b]
            C = out[o:o + m * n].reshape((m, n))
            if ta:
                if tb:
                    np.dot(A.reshape((k, m)).T, B.reshape((n, k)).T, C)
                else:
                    np.dot(A.reshape((k, m)).T, B.reshape((k, n)), C)
            elif tb:
                np.dot(A.reshape((m, k)), B.reshape((n, k)).T, C)
            else:
                np.dot(A.reshape((m, k)), B.reshape((k, n)), C)
            o += m * n
    return OK


def _run_matmul(n, ctx, mem, store):
    v = run_view(ctx, mem, store)
    s0 = v.src[n, 0]
    s1 = v.src[n, 1]
    return matmul_kernel(output(v, n), operand(v, n, 0), operand(v, n, 1), v.shape[n], v.shape[s0],
                         v.shape[s1], v.ip[n, 0], v.ip[n, 1])


def _vjp_matmul(n, k, g, ctx):
    """C = op(A) op(B), op = transpose-if-flagged.  With A' = op(A), B' = op(B):
    dA' = g B'^T and dB' = A'^T g, written back in each operand's stored layout
    by flipping the transpose flags -- no transpose node, BLAS reads views.
    The batch dims are n's; the backward pass sums broadcast ones away."""
    G, st = rule_view(ctx)
    src, shape, ip = G.src, G.shape, G.ip
    a = src[n, 0]
    b = src[n, 1]
    ta = ip[n, 0]
    tb = ip[n, 1]
    if k == 0:
        if ta:      # A stored as A'^T:  dA = B' g^T
            t = grad_node(G, st, MATMUL, b, g, n, n, k)
            ip[t, 0] = tb
            ip[t, 1] = 1
        else:       # dA = g B'^T
            t = grad_node(G, st, MATMUL, g, b, n, n, k)
            ip[t, 0] = 0
            ip[t, 1] = 1 - tb
        shape[t, 2] = shape[a, 2]
        shape[t, 3] = shape[a, 3]
    else:
        if tb:      # B stored as B'^T:  dB = g^T A'
            t = grad_node(G, st, MATMUL, g, a, n, n, k)
            ip[t, 0] = 1
            ip[t, 1] = ta
        else:       # dB = A'^T g
            t = grad_node(G, st, MATMUL, a, g, n, n, k)
            ip[t, 0] = 1 - ta
            ip[t, 1] = 0
        shape[t, 2] = shape[b, 2]
        shape[t, 3] = shape[b, 3]
    ip[t, DOT_K] = shape[n, 3] if k == 0 else shape[n, 2]      # dA contracts over N, dB over M
    return t


defop(MATMUL, "matmul", matmul, _run_matmul, _vjp_matmul, arity=2, cost=COMPUTE, flops=DOT)
