"""Matrix product with numpy's @ semantics (batched, broadcast batch dims).

ip[0], ip[1] say whether the stored operand is transposed (its last two axes
swapped).  Forward graphs never set them; gradient rules do, so a gradient needs
no transpose node and BLAS reads the operand as it lies (F-order view).
"""
import numpy as np
from numba import njit

from ..errors import GraphError
from .common import KERNEL, as_tensor, graph_of
from ..registry import COMPUTE, OTHER, defop
from .shape import reshape

MATMUL = defop("matmul", 2, OTHER, COMPUTE)


# ---- Python shape rule ----------------------------------------------------------------
def matmul(a, b):
    """a @ b: 1-D operands are promoted like numpy (and the added axis removed)."""
    g = graph_of("matmul", a, b)
    a = as_tensor(a, g, "matmul")
    b = as_tensor(b, g, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        s = a if a.ndim == 0 else b
        raise GraphError(f"matmul: {s.label!r} is a scalar; use * to scale")
    a2 = a if a.ndim >= 2 else reshape(a, (1, a.shape[0]))
    b2 = b if b.ndim >= 2 else reshape(b, (b.shape[0], 1))
    sa, sb = a2.shape, b2.shape
    if sa[-1] != sb[-2]:
        raise GraphError(f"matmul: inner dims differ: {a.label!r} {a.shape} @ {b.label!r} {b.shape} "
                         f"({sa[-1]} != {sb[-2]})")
    ba, bb = sa[:-2], sb[:-2]
    nd = max(len(ba), len(bb))
    pa = (1,) * (nd - len(ba)) + ba
    pb = (1,) * (nd - len(bb)) + bb
    batch = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise GraphError(f"matmul: batch dims of {a.label!r} {a.shape} and {b.label!r} {b.shape} "
                             "do not broadcast")
        batch.append(max(x, y))
    out = g._node(MATMUL, (a2.id, b2.id), tuple(batch) + (sa[-2], sb[-1]), ip=(0, 0))
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return reshape(out, out.shape[:-2] + (out.shape[-1],))
    if b.ndim == 1:
        return reshape(out, out.shape[:-1])
    return out


# ---- kernel -----------------------------------------------------------------------------------
@njit(**KERNEL)
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


def matmul_flops(so, sa, ta):
    """2 m n k per batch element (Python; planners use it)."""
    k = sa[2] if ta else sa[3]
    return 2 * int(np.prod(so)) * int(k)
