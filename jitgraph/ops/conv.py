"""Convolutions and pooling, lowered to nodes the engine already has.

The input is seen as a column of scalars (a reshape: no copy), plus one extra row
holding the padding value when a window leaves the input (0, or -inf for max
pooling).  An im2col *gather* (``embedding`` with a constant index of every
window's positions) lays the windows out as rows; a convolution is then one GEMM
over all output positions of the batch (per group), a pooling a ``max`` or
``mean`` over the window axis.  The gathered windows are an arena tensor like any
other, so the memory plan counts them and checkpointing can drop and recompute
them; the gradients are the parts' (scatter_add, matmul, max, mean), so they need
no rule of their own and stay bit-identical under checkpointing.  Index values
are stored in the graph's dtype: a float32 graph's input may have at most 2**24
elements per convolution.
"""
import numbers
from typing import Any, Sequence, Tuple, Union

import numpy as np

from ..errors import GraphError
from ..graph import Tensor
from .common import need_tensor
from .gather import MAX_EXACT_INDEX, embedding
from .linear import matmul
from .reduce import max as max_, mean
from .shape import concat, reshape, slice_axis, transpose

__all__ = ["conv2d", "conv1d", "max_pool2d", "avg_pool2d"]

Pair = Union[int, Sequence[int]]


def _pair(value: Any, what: str, name: str, least: int) -> Tuple[int, int]:
    v = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(v) != 2 or not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) and int(a) >= least
                              for a in v):
        raise GraphError(f"{what}: {name} must be an int >= {least} or a pair of them, got {value!r}")
    return int(v[0]), int(v[1])


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def window_index(N, C, H, W, k, stride, padding, dilation, pad_row):
    """int64 (N, OH * OW, C * kh * kw): for each image, output position and (channel, kernel
    row, kernel column), the flat position in an (N, C, H, W) input, or ``pad_row`` where the
    window is outside it."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, stride, padding, dilation
    OH, OW = _out_size(H, kh, sh, ph, dh), _out_size(W, kw, sw, pw, dw)
    r = (np.arange(OH)[:, None] * sh - ph + np.arange(kh)[None, :] * dh)[None, :, None, None, :, None]
    c = (np.arange(OW)[:, None] * sw - pw + np.arange(kw)[None, :] * dw)[None, None, :, None, None, :]
    n = np.arange(N)[:, None, None, None, None, None]
    ch = np.arange(C)[None, None, None, :, None, None]
    flat = ((n * C + ch) * H + r) * W + c
    idx = np.where((r >= 0) & (r < H) & (c >= 0) & (c < W), flat, pad_row)
    return np.broadcast_to(idx, (N, OH, OW, C, kh, kw)).reshape(N, OH * OW, C * kh * kw), OH, OW


def _windows(x: Tensor, C: int, k, stride, padding, dilation, fill: float, what: str):
    """(gathered windows (N', OH * OW, C * kh * kw), OH, OW) of x seen as (N', C, H, W)."""
    N, H, W = x.shape[0] * x.shape[1] // C, x.shape[-2], x.shape[-1]
    g = x.graph
    size = int(np.prod(x.shape))
    if size + 1 > MAX_EXACT_INDEX[g.dtype]:
        raise GraphError(f"{what}: input {x.label!r} has {size} elements, more than {g.dtype} indexes exactly")
    if min(_out_size(H, k[0], stride[0], padding[0], dilation[0]), _out_size(W, k[1], stride[1], padding[1],
                                                                             dilation[1])) < 1:
        raise GraphError(f"{what}: the kernel {k} (dilation {dilation}) is larger than the padded input "
                         f"{x.label!r} {x.shape} (padding {padding})")
    idx, OH, OW = window_index(N, C, H, W, k, stride, padding, dilation, size)
    table = reshape(x, (size, 1))
    if padding != (0, 0):
        table = concat([table, g.const(np.full((1, 1), fill))], axis=0)
    return reshape(embedding(table, idx), idx.shape), OH, OW


def conv2d(x: Tensor, w: Tensor, stride: Pair = 1, padding: Pair = 0, dilation: Pair = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation as PyTorch's conv2d (no bias: add one yourself): ``x`` (N, C_in,
    H, W), ``w`` (C_out, C_in / groups, kh, kw) -> (N, C_out, OH, OW).  Lowered to an im2col
    gather and one GEMM per group (see the module docstring)."""
    x = need_tensor(x, "conv2d")
    w = need_tensor(w, "conv2d")
    if x.ndim != 4 or w.ndim != 4:
        raise GraphError(f"conv2d: input {x.label!r} {x.shape} and weight {w.label!r} {w.shape} must be 4-D "
                         "(N, C, H, W) and (C_out, C_in / groups, kh, kw)")
    if w.graph is not x.graph:
        raise GraphError(f"conv2d: weight {w.label!r} belongs to another graph than {x.label!r}")
    s, p, d = (_pair(v, "conv2d", n, m) for v, n, m in ((stride, "stride", 1), (padding, "padding", 0),
                                                         (dilation, "dilation", 1)))
    if not isinstance(groups, numbers.Integral) or groups < 1:
        raise GraphError(f"conv2d: groups must be an int >= 1, got {groups!r}")
    N, C, H, W = x.shape
    C_out, Cg, kh, kw = w.shape
    if C % groups or C_out % groups:
        raise GraphError(f"conv2d: groups {groups} must divide the input channels of {x.label!r} ({C}) and the "
                         f"output channels of {w.label!r} ({C_out})")
    if Cg * groups != C:
        raise GraphError(f"conv2d: weight {w.label!r} {w.shape} expects {Cg * groups} input channels "
                         f"(C_in / groups = {Cg}), input {x.label!r} has {C}")
    cols, OH, OW = _windows(x, C, (kh, kw), s, p, d, 0.0, "conv2d")
    step, Og = Cg * kh * kw, C_out // groups
    outs = []
    for gi in range(groups):
        part = cols if groups == 1 else slice_axis(cols, 2, gi * step, (gi + 1) * step)
        wg = w if groups == 1 else slice_axis(w, 0, gi * Og, (gi + 1) * Og)
        outs.append(matmul(part, transpose(reshape(wg, (Og, step)))))       # (N, OH*OW, Og)
    y = outs[0] if groups == 1 else concat(outs, axis=2)
    return reshape(transpose(y, (0, 2, 1)), (N, C_out, OH, OW))


def conv1d(x: Tensor, w: Tensor, stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1) -> Tensor:
    """1-D cross-correlation as PyTorch's conv1d: ``x`` (N, C_in, L), ``w`` (C_out, C_in / groups,
    k) -> (N, C_out, L_out); conv2d on a height of 1."""
    x = need_tensor(x, "conv1d")
    w = need_tensor(w, "conv1d")
    if x.ndim != 3 or w.ndim != 3:
        raise GraphError(f"conv1d: input {x.label!r} {x.shape} and weight {w.label!r} {w.shape} must be 3-D "
                         "(N, C, L) and (C_out, C_in / groups, k)")
    for name, v, least in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < least:
            raise GraphError(f"conv1d: {name} must be an int >= {least}, got {v!r}")
    N, C, L = x.shape
    y = conv2d(reshape(x, (N, C, 1, L)), reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2])),
               (1, stride), (0, padding), (1, dilation), groups)
    return reshape(y, (N, y.shape[1], y.shape[3]))


def _pool(x: Tensor, kernel_size: Pair, stride, padding: Pair, what: str, fill: float):
    x = need_tensor(x, what)
    if x.ndim != 4:
        raise GraphError(f"{what}: input {x.label!r} {x.shape} must be 4-D (N, C, H, W)")
    k = _pair(kernel_size, what, "kernel_size", 1)
    s = k if stride is None else _pair(stride, what, "stride", 1)
    p = _pair(padding, what, "padding", 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise GraphError(f"{what}: padding {p} of {x.label!r} must be at most half the kernel {k}")
    N, C, H, W = x.shape
    cols, OH, OW = _windows(x, 1, k, s, p, (1, 1), fill, what)             # (N * C, OH * OW, kh * kw)
    return cols, (N, C, OH, OW)


def max_pool2d(x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None, padding: Pair = 0) -> Tensor:
    """The max of each kh x kw window (stride defaults to the kernel; padding counts as
    -inf), as PyTorch's max_pool2d; the gradient goes to each window's first maximum."""
    cols, shape = _pool(x, kernel_size, stride, padding, "max_pool2d", -np.inf)
    return reshape(max_(cols, axis=2), shape)


def avg_pool2d(x: Tensor, kernel_size: Pair, stride: Union[None, Pair] = None, padding: Pair = 0) -> Tensor:
    """The mean of each kh x kw window (stride defaults to the kernel; padding counts as 0
    and is counted, PyTorch's default count_include_pad=True)."""
    cols, shape = _pool(x, kernel_size, stride, padding, "avg_pool2d", 0.0)
    return reshape(mean(cols, axis=2), shape)
