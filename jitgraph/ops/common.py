"""Shared pieces of the op families: operand coercion and axis handling."""
import numbers

import numpy as np

from ..errors import GraphError
from ..graph import Tensor, as_numeric_array
from ..ir import MAX_DIMS

KEEP_BLOCK = 256    # elements an in-place loop of a value-keeping op computes before storing them (unary._map_keeping)


def is_scalar(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def as_tensor(x, g, what):
    """A Tensor of graph ``g`` for an operand: tensors pass, numbers/arrays become consts."""
    if isinstance(x, Tensor):
        if x.graph is not g:
            raise GraphError(f"{what}: {x.label!r} belongs to a different graph")
        return x
    if isinstance(x, (numbers.Number, np.ndarray, list, tuple, np.generic)):
        return g.const(as_numeric_array(x, f"{what}: constant operand"))
    raise GraphError(f"{what}: operand of type {type(x).__name__} is not a Tensor, number or array")


def graph_of(what, *xs):
    """The graph of the tensor operands (all must share it)."""
    g = None
    for x in xs:
        if isinstance(x, Tensor):
            if g is None:
                g = x.graph
            elif x.graph is not g:
                first = next(t for t in xs if isinstance(t, Tensor))
                raise GraphError(f"{what}: {first.label!r} and {x.label!r} belong to different graphs")
    if g is None:
        raise GraphError(f"{what}: needs at least one Tensor operand, got "
                         + ", ".join(type(x).__name__ for x in xs))
    return g


def need_tensor(x, what):
    if not isinstance(x, Tensor):
        raise GraphError(f"{what}: expected a Tensor, got {type(x).__name__}")
    return x


def need_pair(what, g, x, min_ndim=0):
    """(g, x), two Tensors of one graph and one shape (of >= min_ndim dims): the operands
    of a fused gradient node, an incoming gradient and the tensor it is taken at."""
    g = need_tensor(g, what)
    x = need_tensor(x, what)
    if g.shape != x.shape or g.graph is not x.graph or x.ndim < min_ndim:
        raise GraphError(f"{what}: {g.label!r} {g.shape} and {x.label!r} {x.shape} must share graph and shape")
    return g, x


def broadcast_shapes(what, a, b):
    """numpy's broadcasting rule, with an error naming both tensors."""
    sa, sb = a.shape, b.shape
    nd = max(len(sa), len(sb))
    pa = (1,) * (nd - len(sa)) + sa
    pb = (1,) * (nd - len(sb)) + sb
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise GraphError(f"{what}: shapes of {a.label!r} {sa} and {b.label!r} {sb} do not broadcast")
    return tuple(out)


def normalize_axis(axis, ndim, what):
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool):
        raise GraphError(f"{what}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise GraphError(f"{what}: axis {axis} is out of range for {ndim} dims")
    return int(axis) % ndim


def normalize_axes(axis, ndim, what):
    """``None`` (all axes), an int, or a tuple of distinct ints -> sorted tuple."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(normalize_axis(a, ndim, what) for a in axis)
        if len(set(axes)) != len(axes):
            raise GraphError(f"{what}: axis {tuple(axis)} repeats an axis")
        return tuple(sorted(axes))
    return (normalize_axis(axis, ndim, what),)


def padded_mask(axes, ndim):
    """Bit mask of ``axes`` in the kernels' left-padded MAX_DIMS-dim space."""
    m = 0
    for a in axes:
        m |= 1 << (a + MAX_DIMS - ndim)
    return m


def broadcast_mask(small, big):
    """Bit mask (padded space) of the axes along which ``small`` is broadcast to ``big``."""
    m = 0
    off = len(big) - len(small)
    for i, d in enumerate(big):
        s = small[i - off] if i >= off else None
        if s is None or (s == 1 and d != 1):
            m |= 1 << (i + MAX_DIMS - len(big))
    return m
