"""Convolutions: conv2d (and conv1d on it), lowered to register-tiled products.

How a ``conv2d(x, w)`` is computed (measured choices; README "Convolutions"):

* **stride 1** (padding at most the kernel's reach): a *direct* product.  x is
  zero-padded once (an ``im2col`` node with a 1x1 kernel: a copy 1.1-1.6x the size of
  x), then each tile of 4 output channels x 32 output positions of one image is 16
  vector accumulators that stay in registers while the contraction over input
  channels and kernel taps streams past (simd.fma_tile): the windows are read from the
  padded input as shifted rows, never copied.  A 1x1 stride-1 convolution without
  padding reads x itself, all of an image's positions as one row.
* **other strides**, and rows narrower than a vector: an ``im2col`` node lays every
  window out as rows ``(N, C*kh*kw, OH, OW)`` (an arena tensor: the plan counts it,
  checkpointing may drop and recompute it), then the same product runs as a 1x1
  convolution on it.
* The **weight gradient** is one ``conv2d_weight`` node: dW[co, c, i, j] summed over
  images and positions in one pass (simd.dot_tile: 4 channels x 4 taps of vector
  partial sums, images taken a cache-sized chunk at a time), never a product per
  image and a sum.
* The **input gradient** of a stride-1 convolution is a convolution too: the output
  gradient padded by ``dilation*(k-1) - padding`` and convolved with the weights
  flipped and transposed (the ``conv2d`` node's FLIP mode, which reads w that way: no
  flipped copy); of the im2col path it is the 1x1 product back onto the windows and a
  ``col2im`` node, which adds the windows into the input plane by plane in a fixed order.

A ``conv2d`` node has three sources: the input x (the gradient's target), the weight
and the tensor it reads (x, padded x or the windows); only the first two get a
gradient.  Every rule is made of these four ops, so second derivatives work too.
Units of work are fixed tiles (conv2d), channel blocks (conv2d_weight) or (image,
channel) planes (im2col, col2im): every output element is computed by one fixed
sequence of operations, so results do not depend on the thread count and a
checkpointed recomputation is bit-identical.
"""
import numbers
from typing import Any, Sequence, Tuple, Union

from numba import njit

from .._sigs import G as G_T, ST, i64
from ..emit import grad_node
from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, data_pointer, operand, output, rule_view, run_view, span
from ..registry import COMPUTE, CUSTOM, DOT, DOT_K, defop
from ..simd import VECTOR_BYTES, dot_tile, fma_tile
from ..status import ERR_BAD_NODE, NO_CONTRIBUTION, OK
from .common import need_tensor
from .shape import reshape

__all__ = ["conv2d", "conv1d"]

CONV2D, CONV2D_WEIGHT, IM2COL, COL2IM = 79, 80, 81, 82
FWD, FLIP = 0, 1          # conv2d / conv2d_weight ip[3]: the weights as stored, or flipped and transposed
# conv2d ip: 0 dh, 1 dw, 2 groups, 3 mode, 4 ph, 5 pw (the padding source 2 adds to source 0),
#            6 = 1 when source 2 is source 0's im2col windows, DOT_K the contracted length
# conv2d_weight ip: 0 dh, 1 dw, 2 groups, 3 mode, DOT_K
# im2col / col2im ip: kh, kw, sh, sw, ph, pw, dh, dw
CHUNK_BYTES = 1 << 21     # a weight gradient's images are taken in chunks of about this much input

Pair = Union[int, Sequence[int]]


def _pair(value: Any, what: str, name: str, least: int) -> Tuple[int, int]:
    v = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(v) != 2 or not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) and int(a) >= least
                              for a in v):
        raise GraphError(f"{what}: {name} must be an int >= {least} or a pair of them, got {value!r}")
    return int(v[0]), int(v[1])


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def lanes(g: Any) -> int:
    """Elements of a vector of the kernels in graph g's dtype."""
    return VECTOR_BYTES // g.dtype.itemsize


# ---- im2col and col2im: windows as rows, and the windows added back ------------------------------
def im2col(x: Tensor, kernel_size: Pair, stride: Pair = 1, padding: Pair = 0, dilation: Pair = 1) -> Tensor:
    """(N, C, H, W) -> (N, C*kh*kw, OH, OW): row (c, i, j) holds input channel c at kernel
    tap (i, j) for every output position (0 outside the input).  A 1x1 kernel with
    stride 1 is a zero padding of x."""
    x = need_tensor(x, "im2col")
    k, s, p, d = (_pair(v, "im2col", n, m) for v, n, m in ((kernel_size, "kernel_size", 1), (stride, "stride", 1),
                                                           (padding, "padding", 0), (dilation, "dilation", 1)))
    if x.ndim != 4:
        raise GraphError(f"im2col: input {x.label!r} {x.shape} must be 4-D (N, C, H, W)")
    N, C, H, W = x.shape
    OH, OW = out_size(H, k[0], s[0], p[0], d[0]), out_size(W, k[1], s[1], p[1], d[1])
    if min(OH, OW) < 1:
        raise GraphError(f"im2col: the kernel {k} (dilation {d}) is larger than the padded input {x.label!r} "
                         f"{x.shape} (padding {p})")
    return x.graph._node(IM2COL, (x.id,), (N, C * k[0] * k[1], OH, OW), ip=k + s + p + d)


def col2im(cols: Tensor, size: Pair, kernel_size: Pair, stride: Pair = 1, padding: Pair = 0,
           dilation: Pair = 1) -> Tensor:
    """im2col's adjoint: (N, C*kh*kw, OH, OW) windows added back into (N, C, H, W) planes
    of ``size`` (H, W)."""
    cols = need_tensor(cols, "col2im")
    hw = _pair(size, "col2im", "size", 1)
    k, s, p, d = (_pair(v, "col2im", n, m) for v, n, m in ((kernel_size, "kernel_size", 1), (stride, "stride", 1),
                                                           (padding, "padding", 0), (dilation, "dilation", 1)))
    want = (out_size(hw[0], k[0], s[0], p[0], d[0]), out_size(hw[1], k[1], s[1], p[1], d[1]))
    if cols.ndim != 4 or cols.shape[1] % (k[0] * k[1]) or cols.shape[2:] != want:
        raise GraphError(f"col2im: windows {cols.label!r} {cols.shape} do not fit a {hw} input with kernel {k}, "
                         f"stride {s}, padding {p}, dilation {d} (expected (N, C*{k[0] * k[1]}, {want[0]}, {want[1]}))")
    N, K = cols.shape[:2]
    return cols.graph._node(COL2IM, (cols.id,), (N, K // (k[0] * k[1])) + hw, ip=k + s + p + d)


@njit(cache=True, error_model="numpy", inline="always")
def valid_columns(OW, W, sw, off):
    """The output columns ow whose input column ow*sw + off lies in [0, W)."""
    lo = 0 if off >= 0 else (sw - 1 - off) // sw
    hi = (W - off + sw - 1) // sw if W - off > 0 else 0
    return min(lo, OW), max(min(hi, OW), min(lo, OW))


@njit(cache=True, error_model="numpy")
def windows_kernel(cols, x, C, H, W, OH, OW, p, lo, hi, back):
    """im2col (back = False) or col2im (back = True) of planes [lo, hi) ((image, channel) pairs).
    Loops run over slices indexed from 0, which LLVM vectorizes (no negative-index checks)."""
    kh, kw, sh, sw, ph, pw, dh, dw = p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]
    if not back and kh * kw * sh * sw == 1 and ph >= 0 and pw >= 0 and OW == W + 2 * pw:    # a zero padding
        for u in range(lo, hi):
            out = cols[u * OH * OW:(u + 1) * OH * OW]
            for t in range(OH * OW):
                out[t] = 0.0
            for h in range(H):
                dst = out[(h + ph) * OW + pw:]
                src = x[(u * H + h) * W:(u * H + h + 1) * W]
                for t in range(W):
                    dst[t] = src[t]
        return OK
    for u in range(lo, hi):
        plane = x[u * H * W:(u + 1) * H * W]
        if back:
            for t in range(H * W):
                plane[t] = 0.0
        for i in range(kh):
            for j in range(kw):
                off = j * dw - pw
                c0, c1 = valid_columns(OW, W, sw, off)
                for oh in range(OH):
                    h = oh * sh - ph + i * dh
                    r = (((u * kh + i) * kw + j) * OH + oh) * OW       # the window row's start
                    row = cols[r:r + OW]
                    if h < 0 or h >= H:
                        if not back:
                            for t in range(OW):
                                row[t] = 0.0
                        continue
                    inside = row[c0:c1]
                    src = plane[h * W + c0 * sw + off:]                # input of output column c0
                    if back:
                        if sw == 1:
                            for t in range(c1 - c0):
                                src[t] += inside[t]
                        elif sw == 2:                                  # a constant stride: vectorized
                            for t in range(c1 - c0):
                                src[2 * t] += inside[t]
                        else:
                            for t in range(c1 - c0):
                                src[t * sw] += inside[t]
                        continue
                    for t in range(c0):
                        row[t] = 0.0
                    if sw == 1:
                        for t in range(c1 - c0):
                            inside[t] = src[t]
                    elif sw == 2:
                        for t in range(c1 - c0):
                            inside[t] = src[2 * t]
                    else:
                        for t in range(c1 - c0):
                            inside[t] = src[t * sw]
                    tail = row[c1:]
                    for t in range(OW - c1):
                        tail[t] = 0.0
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _windows(v, n, lo, hi, back):
    img = n if back else v.src[n, 0]           # the (N, C, H, W) side
    win = v.src[n, 0] if back else n           # the (N, C*kh*kw, OH, OW) side
    s, w = v.shape[img], v.shape[win]
    planes = s[0] * s[1]
    if lo < 0:
        v.ctx[RUN_EXTENT] = planes
        return OK
    lo, hi = span(lo, hi, planes)
    if back:
        return windows_kernel(operand(v, n, 0), output(v, n), s[1], s[2], s[3], w[2], w[3], v.ip[n], lo, hi, True)
    return windows_kernel(output(v, n), operand(v, n, 0), s[1], s[2], s[3], w[2], w[3], v.ip[n], lo, hi, False)


def _run_im2col(n, lo, hi, ctx, mem, store):
    return _windows(run_view(ctx, mem, store), n, lo, hi, False)


def _run_col2im(n, lo, hi, ctx, mem, store):
    return _windows(run_view(ctx, mem, store), n, lo, hi, True)


@njit(cache=True)
def windows_node(G, st, op, a, like, p, n, k):
    """An im2col / col2im node of ``a`` with node p's params, shaped like ``like``."""
    t = grad_node(G, st, op, a, -1, like, n, k)
    for q in range(8):
        G.ip[t, q] = G.ip[p, q]
    return t


def _vjp_im2col(n, k, g, ctx):
    G, st = rule_view(ctx)
    return windows_node(G, st, COL2IM, g, G.src[n, 0], n, n, k)


def _vjp_col2im(n, k, g, ctx):
    G, st = rule_view(ctx)
    return windows_node(G, st, IM2COL, g, G.src[n, 0], n, n, k)


defop(IM2COL, "im2col", im2col, _run_im2col, _vjp_im2col, arity=1, public=False, split=CUSTOM)
defop(COL2IM, "col2im", col2im, _run_col2im, _vjp_col2im, arity=1, public=False, split=CUSTOM)


# ---- conv2d -------------------------------------------------------------------------------------
def conv2d(x: Tensor, w: Tensor, stride: Pair = 1, padding: Pair = 0, dilation: Pair = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation as PyTorch's conv2d (no bias: add one yourself): ``x`` (N, C_in,
    H, W), ``w`` (C_out, C_in / groups, kh, kw) -> (N, C_out, OH, OW).  Stride 1 is a direct
    register-tiled product over the padded input, other strides a product over im2col
    windows (see the module docstring)."""
    x = need_tensor(x, "conv2d")
    w = need_tensor(w, "conv2d")
    if x.ndim != 4 or w.ndim != 4:
        raise GraphError(f"conv2d: input {x.label!r} {x.shape} and weight {w.label!r} {w.shape} must be 4-D "
                         "(N, C, H, W) and (C_out, C_in / groups, kh, kw)")
    if w.graph is not x.graph:
        raise GraphError(f"conv2d: weight {w.label!r} belongs to another graph than {x.label!r}")
    s, p, d = (_pair(v, "conv2d", n, m) for v, n, m in ((stride, "stride", 1), (padding, "padding", 0),
                                                         (dilation, "dilation", 1)))
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
        raise GraphError(f"conv2d: groups must be an int >= 1, got {groups!r}")
    N, C, H, W = x.shape
    C_out, Cg, kh, kw = w.shape
    if C % groups or C_out % groups:
        raise GraphError(f"conv2d: groups {groups} must divide the input channels of {x.label!r} ({C}) and the "
                         f"output channels of {w.label!r} ({C_out})")
    if Cg * groups != C:
        raise GraphError(f"conv2d: weight {w.label!r} {w.shape} expects {Cg * groups} input channels "
                         f"(C_in / groups = {Cg}), input {x.label!r} has {C}")
    OH, OW = out_size(H, kh, s[0], p[0], d[0]), out_size(W, kw, s[1], p[1], d[1])
    if min(OH, OW) < 1:
        raise GraphError(f"conv2d: the kernel {(kh, kw)} (dilation {d}) is larger than the padded input "
                         f"{x.label!r} {x.shape} (padding {p})")
    g = x.graph
    K = Cg * kh * kw
    flat = (kh, kw) == (1, 1) and p == (0, 0)
    if s == (1, 1) and p[0] <= d[0] * (kh - 1) and p[1] <= d[1] * (kw - 1) and (OW >= lanes(g) or flat):
        xp = x if p == (0, 0) else im2col(x, 1, 1, p)
        return g._node(CONV2D, (x.id, w.id, xp.id), (N, C_out, OH, OW), ip=d + (groups, FWD) + p + (0, K))
    cols = im2col(x, (kh, kw), s, p, d)
    wv = reshape(w, (C_out, K, 1, 1))
    return g._node(CONV2D, (x.id, wv.id, cols.id), (N, C_out, OH, OW), ip=(1, 1, groups, FWD, 0, 0, 1, K))


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


# the tiles of the product: (rows of 4 channels or 1) x R rows x V vectors, or scalars
F0, F1, F2, F3 = fma_tile(4, 1, 4, True), fma_tile(4, 2, 2, True), fma_tile(4, 4, 1, True), fma_tile(4, 1, 1, True)
F4, F5, F6, F7 = fma_tile(4, 1, 1, False), fma_tile(1, 1, 4, True), fma_tile(1, 1, 1, True), fma_tile(1, 1, 1, False)
TILE_SHAPES = ((4, 1, 4, 1), (4, 2, 2, 1), (4, 4, 1, 1), (4, 1, 1, 1), (4, 1, 1, 0), (1, 1, 4, 1), (1, 1, 1, 1),
               (1, 1, 1, 0))     # (channels, rows, vectors, vector or scalar), as F0 ... F7


@njit(cache=True, error_model="numpy", inline="always")
def pick_tile(channels, OH, OW, L):
    """The largest tile of TILE_SHAPES that fits an output of OH x OW with ``channels`` per group."""
    if channels >= 4:
        if OW >= 4 * L:
            return 0
        if OW >= 2 * L and OH >= 2:
            return 1
        if OW >= L and OH >= 4:
            return 2
        return 3 if OW >= L else 4
    if OW >= 4 * L:
        return 5
    return 6 if OW >= L else 7


@njit(cache=True, error_model="numpy", inline="always")
def _fma(f, x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow):
    if f == 0:
        F0(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    elif f == 1:
        F1(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    elif f == 2:
        F2(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    elif f == 3:
        F3(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    elif f == 4:
        F4(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    elif f == 5:
        F5(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    elif f == 6:
        F6(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)
    else:
        F7(x, w, o, kh, kw, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow)


@njit(cache=True, error_model="numpy", inline="always")
def _geometry(v, n, xs):
    """(N, reduced channels, Hp, Wp, OH, OW, flat) of a product reading node xs: ``flat`` when a
    1x1 kernel reads every position of an unpadded input (then all of an image is one row)."""
    sx, so, sw = v.shape[xs], v.shape[n], v.shape[v.src[n, 1]]
    Hp, Wp, OH, OW = sx[2], sx[3], so[2], so[3]
    if sw[2] == 1 and sw[3] == 1 and Hp == OH and Wp == OW:
        return sx[0], sx[1], 1, Hp * Wp, 1, OH * OW
    return sx[0], sx[1], Hp, Wp, OH, OW


@njit(cache=True, error_model="numpy")
def conv_tiles(v, n, lo, hi):
    """conv2d: units are tiles (image, row block, channel block, column block)."""
    xs, ws = v.src[n, 2], v.src[n, 1]
    N, Ci, Hp, Wp, OH, OW = _geometry(v, n, xs)
    Co = v.shape[n, 1]
    kh, kw = v.shape[ws, 2], v.shape[ws, 3]
    dh, dw, groups, mode = v.ip[n, 0], v.ip[n, 1], v.ip[n, 2], v.ip[n, 3]
    T = kh * kw
    Cr, Og = Ci // groups, Co // groups
    rows, cols = (Co, Cr) if mode == FWD else (Ci, Og)
    if OH != Hp - dh * (kh - 1) or OW != Wp - dw * (kw - 1) or v.shape[ws, 0] != rows or v.shape[ws, 1] != cols \
            or Ci % groups or Co % groups or N != v.shape[n, 0]:
        return ERR_BAD_NODE                  # the builders never make one: no kernel reads out of bounds
    L = VECTOR_BYTES // v.mem.itemsize
    f = pick_tile(Og, OH, OW, L)
    MR, R, V, vec = TILE_SHAPES[f]
    width = V * L if vec else V
    n_r, n_c, n_v = (OH + R - 1) // R, (Og + MR - 1) // MR, (OW + width - 1) // width
    units = N * n_r * groups * n_c * n_v
    if lo < 0:
        v.ctx[RUN_EXTENT] = units
        return OK
    lo, hi = span(lo, hi, units)
    if mode == FWD:        # w[co, c, i, j]: rows co, channels c
        wm, wc, wi, wj, w0, wg = Cr * T, T, kw, 1, 0, Og * Cr * T
    else:                  # w[co, c, kh-1-i, kw-1-j] read as rows c, channels co
        wm, wc, wi, wj, w0, wg = T, Og * T, -kw, -1, T - 1, Cr * Og * T
    x, w, out = operand(v, n, 2), operand(v, n, 1), output(v, n)
    for u in range(lo, hi):
        b = u % n_v
        u //= n_v
        c = u % (groups * n_c)
        u //= groups * n_c
        r0 = min((u % n_r) * R, OH - R)
        img = u // n_r
        grp = c // n_c
        m0 = min((c % n_c) * MR, Og - MR)
        q0 = min(b * width, OW - width)
        _fma(f, data_pointer(x[((img * Ci + grp * Cr) * Hp + r0) * Wp + q0:]),
             data_pointer(w[grp * wg + m0 * wm + w0:]),
             data_pointer(out[((img * Co + grp * Og + m0) * OH + r0) * OW + q0:]),
             kh, kw, Cr, dh * Wp, dw, Hp * Wp, wi, wj, wc, wm, Wp, OH * OW, OW)
    return OK


def _run_conv2d(n, lo, hi, ctx, mem, store):
    return conv_tiles(run_view(ctx, mem, store), n, lo, hi)


@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64), cache=True)
def conv_node(G, st, a, w, xp, like, mode, dh, dw, groups, ph, pw, cols, n, k):
    """conv2d(a, w) reading xp, shaped like ``like``."""
    t = grad_node(G, st, CONV2D, a, w, like, n, k)
    G.src[t, 2] = xp
    G.ip[t, 0] = dh
    G.ip[t, 1] = dw
    G.ip[t, 2] = groups
    G.ip[t, 3] = mode
    G.ip[t, 4] = ph
    G.ip[t, 5] = pw
    G.ip[t, 6] = cols
    G.ip[t, DOT_K] = G.shape[xp, 1] // groups * G.shape[w, 2] * G.shape[w, 3]
    return t


@njit(i64(G_T, ST, i64, i64, i64, i64, i64), cache=True)
def pad_node(G, st, a, ph, pw, n, k):
    """a zero-padded by (ph, pw): an im2col with a 1x1 kernel (a itself when there is no padding)."""
    if ph == 0 and pw == 0:
        return a
    t = grad_node(G, st, IM2COL, a, -1, a, n, k)
    G.shape[t, 2] += 2 * ph
    G.shape[t, 3] += 2 * pw
    for q in range(8):
        G.ip[t, q] = 1
    G.ip[t, 4] = ph
    G.ip[t, 5] = pw
    return t


@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64, i64, i64), cache=True)
def weight_node(G, st, g, xp, like, mode, dh, dw, groups, n):
    t = grad_node(G, st, CONV2D_WEIGHT, g, xp, like, n, 1)
    G.ip[t, 0] = dh
    G.ip[t, 1] = dw
    G.ip[t, 2] = groups
    G.ip[t, 3] = mode
    G.ip[t, DOT_K] = G.shape[g, 0] * G.shape[g, 2] * G.shape[g, 3]
    return t


def _vjp_conv2d(n, k, g, ctx):
    """y = conv(x, w): dw = conv2d_weight(g, xp); dx = the FLIP convolution of g padded by
    d(k-1) - p (or col2im of the 1x1 FLIP product, for windows).  A FLIP node's own input
    gradient is the FWD convolution of its gradient with the padding it undid."""
    G, st = rule_view(ctx)
    x, w, xp = G.src[n, 0], G.src[n, 1], G.src[n, 2]
    dh, dw, groups, mode = G.ip[n, 0], G.ip[n, 1], G.ip[n, 2], G.ip[n, 3]
    if k == 2:
        return NO_CONTRIBUTION
    if k == 1:
        return weight_node(G, st, g, xp, w, mode, dh, dw, groups, n)
    if G.ip[n, 6] == 1:                                   # windows: back onto them, then col2im
        d = conv_node(G, st, g, w, g, xp, FLIP, 1, 1, groups, 0, 0, 0, n, k)
        return windows_node(G, st, COL2IM, d, x, xp, n, k)
    qh = dh * (G.shape[w, 2] - 1) - G.ip[n, 4]
    qw = dw * (G.shape[w, 3] - 1) - G.ip[n, 5]
    return conv_node(G, st, g, w, pad_node(G, st, g, qh, qw, n, k), x, 1 - mode, dh, dw, groups, qh, qw, 0, n, k)


defop(CONV2D, "conv2d", conv2d, _run_conv2d, _vjp_conv2d, arity=3, cost=COMPUTE, flops=DOT, split=CUSTOM)


# ---- conv2d_weight: the weight gradient ---------------------------------------------------------------
def conv2d_weight(g: Tensor, xp: Tensor, kernel_size: Pair, dilation: Pair = 1, groups: int = 1,
                  flip: bool = False) -> Tensor:
    """The weight gradient of ``conv2d(x, w)`` reading xp (padded x), stride 1:
    dw[co, c, i, j] = sum over images and positions of g[n, co, p] xp[n, c, p + (i, j) * dilation]
    (groups: c counts within co's group).  ``flip``: the gradient of a FLIP convolution
    (g has the input's channels, xp the output's; taps flipped)."""
    g, xp = need_tensor(g, "conv2d_weight"), need_tensor(xp, "conv2d_weight")
    k, d = _pair(kernel_size, "conv2d_weight", "kernel_size", 1), _pair(dilation, "conv2d_weight", "dilation", 1)
    if g.ndim != 4 or xp.ndim != 4 or g.shape[0] != xp.shape[0] or g.shape[1] % groups or xp.shape[1] % groups \
            or g.shape[2:] != (xp.shape[2] - d[0] * (k[0] - 1), xp.shape[3] - d[1] * (k[1] - 1)):
        raise GraphError(f"conv2d_weight: gradient {g.label!r} {g.shape} does not fit input {xp.label!r} {xp.shape} "
                         f"with kernel {k}, dilation {d}, groups {groups}")
    rows, cols = (xp.shape[1], g.shape[1] // groups) if flip else (g.shape[1], xp.shape[1] // groups)
    return g.graph._node(CONV2D_WEIGHT, (g.id, xp.id), (rows, cols) + k,
                         ip=d + (groups, FLIP if flip else FWD, 0, 0, 0, g.shape[0] * g.shape[2] * g.shape[3]))


D0, D1 = dot_tile(4, 4, True), dot_tile(4, 4, False)


@njit(cache=True, error_model="numpy", inline="always")
def _tap(t, kh, kw, dh, dw, Hp, Wp, T, mode, xc):
    """(input offset, output offset) of tap t = (channel, i, j) of a weight gradient."""
    c = t // T
    i = (t // kw) % kh
    j = t % kw
    if mode == FWD:
        return c * Hp * Wp + i * dh * Wp + j * dw, t
    return c * Hp * Wp + i * dh * Wp + j * dw, c * xc + T - 1 - i * kw - j


@njit(cache=True, error_model="numpy")
def weight_blocks(v, n, lo, hi):
    """conv2d_weight: units are blocks of 4 rows (output channels, or input channels for
    FLIP) of one group, each summed over every image and position in a fixed order."""
    gs, xs = v.src[n, 0], v.src[n, 1]
    N, Ci, Hp, Wp = v.shape[xs, 0], v.shape[xs, 1], v.shape[xs, 2], v.shape[xs, 3]
    Cg, OH, OW = v.shape[gs, 1], v.shape[gs, 2], v.shape[gs, 3]
    kh, kw = v.shape[n, 2], v.shape[n, 3]
    dh, dw, groups, mode = v.ip[n, 0], v.ip[n, 1], v.ip[n, 2], v.ip[n, 3]
    T = kh * kw
    Mg, Cr = Cg // groups, Ci // groups               # gradient rows and input channels per group
    if T == 1 and Hp == OH and Wp == OW:              # every position of an unpadded input: one row an image
        Hp, Wp, OH, OW = 1, Hp * Wp, 1, OH * OW
    rows, cols = (Cg, Cr) if mode == FWD else (Ci, Mg)
    if OH != Hp - dh * (kh - 1) or OW != Wp - dw * (kw - 1) or Cg % groups or Ci % groups or v.shape[gs, 0] != N \
            or v.shape[n, 0] != rows or v.shape[n, 1] != cols:
        return ERR_BAD_NODE
    n_m = (Mg + 3) // 4
    if lo < 0:
        v.ctx[RUN_EXTENT] = groups * n_m
        return OK
    lo, hi = span(lo, hi, groups * n_m)
    L = VECTOR_BYTES // v.mem.itemsize
    vec = OW >= L
    # FWD: out[co, c, i, j], row co (g's channel), taps (c, i, j) of the group;
    # FLIP: out[co, c, kh-1-i, kw-1-j], row c (g's channel), taps (co, i, j)
    om, xc = (Cr * T, 0) if mode == FWD else (T, Mg * T)
    chunk = max(1, CHUNK_BYTES // ((Cr * Hp * Wp + 4 * OH * OW) * v.mem.itemsize))
    g, x, out = operand(v, n, 0), operand(v, n, 1), output(v, n)
    K = Cr * T
    for u in range(lo, hi):
        grp = u // n_m
        m0 = (u % n_m) * 4
        mv = min(4, Mg - m0)
        if mode == FWD:
            base = (grp * Mg + m0) * om
            for q in range(mv * om):
                out[base + q] = 0.0
        else:
            base = grp * Cr * Mg * T + m0 * T
            for co in range(Cr):
                for q in range(mv * T):
                    out[base + co * Mg * T + q] = 0.0
        o = out[base:]
        for i0 in range(0, N, chunk):
            ni = min(chunk, N - i0)
            gp = data_pointer(g[((i0 * Cg) + grp * Mg + m0) * OH * OW:])
            xp = data_pointer(x[(i0 * Ci + grp * Cr) * Hp * Wp:])
            for t0 in range(0, K, 4):
                kv = min(4, K - t0)
                a0, b0 = _tap(t0, kh, kw, dh, dw, Hp, Wp, T, mode, xc)
                a1, b1 = _tap(min(t0 + 1, K - 1), kh, kw, dh, dw, Hp, Wp, T, mode, xc)
                a2, b2 = _tap(min(t0 + 2, K - 1), kh, kw, dh, dw, Hp, Wp, T, mode, xc)
                a3, b3 = _tap(min(t0 + 3, K - 1), kh, kw, dh, dw, Hp, Wp, T, mode, xc)
                if vec:
                    D0(gp, xp, data_pointer(o), (a0, a1, a2, a3), (b0, b1, b2, b3), mv, kv, OH * OW, om, ni,
                       Cg * OH * OW, Ci * Hp * Wp, OH, OW, Wp, OW)
                else:
                    D1(gp, xp, data_pointer(o), (a0, a1, a2, a3), (b0, b1, b2, b3), mv, kv, OH * OW, om, ni,
                       Cg * OH * OW, Ci * Hp * Wp, OH, OW, Wp, OW)
    return OK


def _run_conv2d_weight(n, lo, hi, ctx, mem, store):
    return weight_blocks(run_view(ctx, mem, store), n, lo, hi)


def _vjp_conv2d_weight(n, k, h, ctx):
    """dw = W(g, xp), bilinear.  FWD: through g, the FWD convolution of xp with h; through xp,
    the FLIP convolution of g padded by d(k-1) with h.  FLIP: through g, the FLIP convolution
    of xp with h; through xp, the FWD convolution of g padded by d(k-1) with h."""
    G, st = rule_view(ctx)
    g, xp = G.src[n, 0], G.src[n, 1]
    dh, dw, groups, mode = G.ip[n, 0], G.ip[n, 1], G.ip[n, 2], G.ip[n, 3]
    if k == 0:
        return conv_node(G, st, xp, h, xp, g, mode, dh, dw, groups, 0, 0, 0, n, k)
    qh, qw = dh * (G.shape[n, 2] - 1), dw * (G.shape[n, 3] - 1)
    return conv_node(G, st, g, h, pad_node(G, st, g, qh, qw, n, k), xp, 1 - mode, dh, dw, groups, qh, qw, 0, n, k)


defop(CONV2D_WEIGHT, "conv2d_weight", conv2d_weight, _run_conv2d_weight, _vjp_conv2d_weight, arity=2, cost=COMPUTE,
      flops=DOT, public=False, split=CUSTOM)
