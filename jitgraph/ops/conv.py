"""Convolutions: conv2d (and conv1d on it), lowered to register-tiled products.

How a ``conv2d(x, w)`` is computed (measured choices; README "Convolutions"):

* **stride 1** (padding at most the kernel's reach): a *direct* product.  The product pads
  x as it reads it (``FOLD_PADDING``: an image at a time, into a zeroed scratch that stays in
  cache; before, an ``im2col`` node with a 1x1 kernel copied it, 1.1-1.6x the size of x, into
  the arena: the same values in the same order, the same bits), then each tile of 4 output
  channels x 3 rows of 8 output positions of one image
  (with AVX-512 up to 64 positions of 512-bit vectors) is 12 (16) vector accumulators
  that stay in registers while the contraction over input channels and kernel taps streams past (simd.fma_tile): the
  windows are read from the padded input as shifted rows, never copied.  A 1x1 stride-1
  convolution without padding reads x itself, all of an image's positions as one row.
* **Winograd F(2x2, 3x3)** (winograd.py): a 3x3 stride-1 product without dilation or groups,
  with at least WINOGRAD_MIN_CHANNELS input and output channels, computes each 2x2 output tile
  from its 4x4 input tile with 16 products instead of 36 (source WINOGRAD: source 3 is the
  kernels' transform U, a ``winograd_weights`` node); its input gradient is a Winograd product
  too.  Its float32 values differ from the direct product's by rounding; its bits do not
  depend on threads, checkpointing or fusion.
* **stride s > 1** (no dilation): the padded input is split into its s x s *phases*
  (an ``im2col`` whose kernel is its stride: a space-to-depth the size of the input),
  and each phase is a stride-1 product with the kernel taps of that phase, the phases
  summed in the tile's registers.
* **otherwise** (dilated strides, rows narrower than a vector, padding beyond the
  kernel): an ``im2col`` node lays every window out, (N, C*kh*kw, OH, OW), and the same
  product runs as a 1x1 convolution on it.
* The **weight gradient** is one ``conv2d_weight`` node (conv_weight.py): dW[co, c, i, j]
  summed over images and positions in one pass, never a product per image and a sum; planes
  narrower than CHANNEL_BELOW read g channels last (a transpose node).
* The **input gradient** is a convolution too: the output gradient padded (as it is read) by
  ``dilation*(k-1) - padding`` and convolved with the weights flipped and transposed
  (the FLIP mode, which reads w that way: no flipped copy); for phases, each phase's
  gradient is such a convolution with its taps, and a ``col2im`` puts the phases back
  in place; for windows, the 1x1 product back onto them and a ``col2im`` that adds them
  into the input plane by plane in a fixed order.

The weight gradient's padded input, the phases and the windows are arena tensors: the memory
plan counts them and checkpointing may drop and recompute them.  A ``conv2d`` node has three
sources: the input x (the gradient's target), the weight and the tensor it reads (x -- padded
as read when ``pad_h`` / ``pad_w`` say so and it has x's shape --, a padded copy, phases or
windows); only the first two get a gradient.  Every rule is made of these
ops, so second derivatives work too.  Units of work are fixed tiles (conv2d), channel
blocks (conv2d_weight) or (image, channel) planes: every output element is computed by
one fixed sequence of operations, so results do not depend on the thread count and a
checkpointed recomputation is bit-identical.
"""
import numbers
from typing import Any

import numpy as np
from numba import njit, uint64 as U

from enum import IntEnum

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, data_pointer, operand, output_into, run_view, span
from ..registry import COMPUTE, CONV2D, CUSTOM, DOT, DOT_K, defop, export, slots
from ..rules import Sym, either, op
from ..simd import VECTOR_BYTES, WIDE, WIDE_BYTES, fma_tile
from ..status import ERR_BAD_NODE, OK
from .common import need_tensor
from .shape import reshape
from .windows import Pair, WindowsIP, int_pair, im2col, out_size, pad
from .winograd import winograd_tiles, winograd_weights

FWD, FLIP = 0, 1                     # mode: the weights as stored, or flipped and transposed (an input gradient)
# a stride-1 product pads its input as it reads it (row blocks of the padded input in a scratch the
# tiles read, ``_padded_rows``), not through an ``im2col`` copy in the arena: the products read the
# same values in the same order, so the bits are the copy's (tests/test_conv.py)
FOLD_PADDING = True
DIRECT, WINDOWS, PHASES = 0, 1, 2    # conv2d's source: what source 2 is (x or padded x, windows, phases)
WINOGRAD = 3                         # DIRECT's input, by Winograd F(2x2, 3x3): source 3 its kernels' U (winograd.py)
# Winograd for 3x3 stride-1 products whose input and output channels are both at least this many
# (AMD EPYC Zen 4, one thread, batch 32, perf/bench_winograd.py: 12 channels 0.84x the direct
# product's time, 8 channels 1.05x: the transforms cost more than the products save); 0 turns it off
WINOGRAD_MIN_CHANNELS = 12


class ConvIP(IntEnum):               # conv2d
    dilation_h = 0
    dilation_w = 1
    groups = 2
    mode = 3                         # FWD or FLIP
    pad_h = 4                        # DIRECT: the zero padding source 2 adds to source 0
    pad_w = 5
    source = 6                       # DIRECT, WINDOWS, PHASES or WINOGRAD
    contracted = DOT_K
    stride_h = 8                     # PHASES: the stride the phases split
    stride_w = 9


class ConvWeightIP(IntEnum):         # conv2d_weight
    dilation_h = 0
    dilation_w = 1
    groups = 2
    mode = 3
    stride_h = 4                     # the stride of the phases it reads (1: none)
    stride_w = 5
    layout = 6                       # g's: CHANNELS_FIRST (N, C, H, W) or CHANNELS_LAST (N, H, W, C)
    contracted = DOT_K
CHANNELS_FIRST, CHANNELS_LAST = 0, 1
# the channel-vector weight gradient (conv_weight.channel_blocks) takes g's channels in blocks
# of CHANNEL_BLOCK (its two vectors of float32 channels), for planes narrower than CHANNEL_BELOW:
# on 256-bit hosts planes of 32 too (with the transpose, AMD EPYC Zen 3, one thread: 32 x 32 x
# 16 channels 0.85-0.91x dot_tile's time, 32 x 32 x 32 0.89x; 64 x 64 x 16 1.07x)
CHANNEL_BLOCK = 2 * (WIDE_BYTES if WIDE else VECTOR_BYTES) // 4
CHANNEL_BELOW = 32 if WIDE else 33


def lanes(g: Any) -> int:
    """Elements of a vector of the kernels in graph g's dtype."""
    return VECTOR_BYTES // g.dtype.itemsize


# ---- conv2d -------------------------------------------------------------------------------------
def conv2d(x: Tensor, w: Tensor, stride: Pair = 1, padding: Pair = 0, dilation: Pair = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation as PyTorch's conv2d (no bias: add one yourself): ``x`` (N, C_in,
    H, W), ``w`` (C_out, C_in / groups, kh, kw) -> (N, C_out, OH, OW).  A register-tiled
    product over the padded input (stride 1), its phases (other strides) or its im2col
    windows (see the module docstring)."""
    x = need_tensor(x, "conv2d")
    w = need_tensor(w, "conv2d")
    if x.ndim != 4 or w.ndim != 4:
        raise GraphError(f"conv2d: input {x.label!r} {x.shape} and weight {w.label!r} {w.shape} must be 4-D "
                         "(N, C, H, W) and (C_out, C_in / groups, kh, kw)")
    if w.graph is not x.graph:
        raise GraphError(f"conv2d: weight {w.label!r} belongs to another graph than {x.label!r}")
    s, p, d = (int_pair(v, "conv2d", n, m) for v, n, m in ((stride, "stride", 1), (padding, "padding", 0),
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
    wide = OW >= lanes(g)
    if s == (1, 1) and p[0] <= d[0] * (kh - 1) and p[1] <= d[1] * (kw - 1) and (wide or (kh, kw, *p) == (1, 1, 0, 0)):
        if winograd_fits(kh, kw, d, groups, C, C_out):
            u = winograd_weights(w, flip=False)
            return g._node(CONV2D, (x.id, w.id, x.id, u.id), (N, C_out, OH, OW),
                           ip=slots(ConvIP, dilation_h=1, dilation_w=1, groups=1, mode=FWD, pad_h=p[0], pad_w=p[1],
                                    source=WINOGRAD, contracted=K))
        xp = x if p == (0, 0) or FOLD_PADDING else im2col(x, 1, 1, p)
        return g._node(CONV2D, (x.id, w.id, xp.id), (N, C_out, OH, OW),
                       ip=slots(ConvIP, dilation_h=d[0], dilation_w=d[1], groups=groups, mode=FWD, pad_h=p[0],
                                pad_w=p[1], source=DIRECT, contracted=K))
    # phases fit when each holds exactly the rows and columns its taps reach; every phase is read
    # when the kernel is at least the stride (a 1x1 kernel reads one phase: its windows are smaller)
    fits = out_size(H, s[0], s[0], p[0], 1) == OH + (kh - 1) // s[0] and \
        out_size(W, s[1], s[1], p[1], 1) == OW + (kw - 1) // s[1]
    if d == (1, 1) and wide and kh >= s[0] and kw >= s[1] and fits:
        phases = im2col(x, s, s, p)
        return g._node(CONV2D, (x.id, w.id, phases.id), (N, C_out, OH, OW),
                       ip=slots(ConvIP, dilation_h=1, dilation_w=1, groups=groups, mode=FWD, source=PHASES,
                                contracted=K, stride_h=s[0], stride_w=s[1]))
    cols = im2col(x, (kh, kw), s, p, d)
    wv = reshape(w, (C_out, K, 1, 1))
    return g._node(CONV2D, (x.id, wv.id, cols.id), (N, C_out, OH, OW),
                   ip=slots(ConvIP, dilation_h=1, dilation_w=1, groups=groups, mode=FWD, source=WINDOWS, contracted=K))


def winograd_fits(kh, kw, d, groups, c_in, c_out) -> bool:
    """Does a stride-1 product (padding at most 2) run by Winograd F(2x2, 3x3)?  3x3 kernels
    without dilation, one group, and at least WINOGRAD_MIN_CHANNELS channels in and out."""
    least = WINOGRAD_MIN_CHANNELS
    return bool(least) and (kh, kw) == (3, 3) and tuple(d) == (1, 1) and groups == 1 and min(c_in, c_out) >= least


@export
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


# the tiles of the product: (rows of 4 channels or 1) x R rows x V vectors of 256 bits, or
# scalars; with AVX-512 also of 512 bits (F8 - F11), and F12, whose 512-bit vectors hold
# two rows of 256 bits each (8 x 8 planes in float32), for 8 channels: each vector's second
# row is a shuffle on an FMA port, and 8 channels share it (4 channels x 4 vectors, before:
# 8 x 8 x 64 channels took 1.20x oneDNN's time forward and for the input gradient, now 1.11x,
# Intel Xeon model 207).  The 256-bit tiles keep at most 12
# accumulators: AVX2 has 16 vector registers, and 16 accumulators (the 4 x 4 tiles these
# replaced) spilled -- a ResNet layer's fwd+bwd took 1.5-1.9x as long (Zen 3, measured).
# Each output element is the same fixed sequence of fused multiply-adds in every tile: the
# choice changes speed, never a bit.
B, W = VECTOR_BYTES, WIDE_BYTES
F0, F1, F2, F3 = fma_tile(4, 1, 3, B), fma_tile(4, 2, 1, B), fma_tile(4, 3, 1, B), fma_tile(4, 1, 1, B)
F4, F5, F6, F7 = fma_tile(4, 1, 1, 0), fma_tile(1, 1, 4, B), fma_tile(1, 1, 1, B), fma_tile(1, 1, 1, 0)
F8, F9, F10, F11 = fma_tile(4, 1, 4, W), fma_tile(4, 2, 2, W), fma_tile(4, 4, 1, W), fma_tile(1, 1, 4, W)
F12 = fma_tile(8, 2, 1, W, rows=2)
TILE_SHAPES = ((4, 1, 3, B, 1), (4, 2, 1, B, 1), (4, 3, 1, B, 1), (4, 1, 1, B, 1), (4, 1, 1, 0, 1), (1, 1, 4, B, 1),
               (1, 1, 1, B, 1), (1, 1, 1, 0, 1), (4, 1, 4, W, 1), (4, 2, 2, W, 1), (4, 4, 1, W, 1), (1, 1, 4, W, 1),
               (8, 2, 1, W, 2))
# (channels, vectors down, vectors across, bytes per vector or 0 for scalars, rows per vector), as F0 ... F12


@njit(cache=True, error_model="numpy")
def pick_tile(channels, OH, OW, L, wide):
    """The largest tile of TILE_SHAPES that fits an output of OH x OW with ``channels`` per
    group (L: elements in 256 bits; ``wide``: 512-bit tiles may be used)."""
    if wide:
        if channels >= 4:
            if OW >= 8 * L:
                return 8
            if OW >= 4 * L and OH >= 2:
                return 9
            if OW >= 2 * L and OH >= 4:
                return 10
            if OW >= L and OH >= 4 and channels >= 8:
                return 12
        elif OW >= 8 * L:
            return 11
    if channels >= 4:
        if OW >= L and OH >= 3:
            return 2
        if OW >= 3 * L:
            return 0
        if OW >= L and OH >= 2:
            return 1
        return 3 if OW >= L else 4
    if OW >= 4 * L:
        return 5
    return 6 if OW >= L else 7


@njit(cache=True, error_model="numpy")
def _fma(f, x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc):
    if f == 0:
        F0(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 1:
        F1(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 2:
        F2(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 3:
        F3(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 4:
        F4(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 5:
        F5(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 6:
        F6(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 7:
        F7(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 8:
        F8(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 9:
        F9(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 10:
        F10(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    elif f == 11:
        F11(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
    else:
        F12(x, w, o, n_i, n_j, c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)


@njit(cache=True, error_model="numpy")
def _spans(kind, sh, sw, kh, kw, dh, dw):
    """(phases across, phases down, reach down, reach across): a product reads reach + 1
    rows / columns of the input it reads per output row / column."""
    if kind == PHASES:
        return sh, sw, (kh - 1) // sh, (kw - 1) // sw
    return 1, 1, dh * (kh - 1), dw * (kw - 1)


@njit(cache=True, error_model="numpy")
def _plane(kh, kw, Hp, Wp, OH, OW):
    """(Hp, Wp, OH, OW), with an image's positions as one row when a 1x1 kernel reads every
    position of an unpadded input."""
    if kh == 1 and kw == 1 and Hp == OH and Wp == OW:
        return 1, Hp * Wp, 1, OH * OW
    return Hp, Wp, OH, OW


@njit(cache=True, error_model="numpy")
def _pad_image(scratch, x, img, C, H, W, ph, pw):
    """The planes of image ``img`` of x (N, C, H, W) into the middle of scratch (C, H + 2 ph,
    W + 2 pw), whose borders are zero and stay so: only the interior is written."""
    Wp = W + 2 * pw
    for c in range(C):
        for h in range(H):         # unsigned indices: no wraparound test, no slice per row (windows.py)
            dst, src = U((c * (H + 2 * ph) + h + ph) * Wp + pw), U(((img * C + c) * H + h) * W)
            for q in range(U(W)):
                scratch[dst + q] = x[src + q]


@njit(cache=True, error_model="numpy")
def conv_tiles(v, n, lo, hi):
    """conv2d: units are tiles (image, row block, [phase,] channel block, column block).  FWD
    sums every phase of the input into a tile; a FLIP of phases makes each phase's plane.
    A WINOGRAD source goes to winograd.py (its units are images)."""
    if v.ip[n, ConvIP.source] == WINOGRAD:
        return winograd_tiles(v, n, lo, hi, v.ip[n, ConvIP.pad_h], v.ip[n, ConvIP.pad_w])
    xs, ws = v.src[n, 2], v.src[n, 1]
    N, Ci, kh, kw = v.shape[xs, 0], v.shape[xs, 1], v.shape[ws, 2], v.shape[ws, 3]
    Co = v.shape[n, 1]
    dh, dw, groups = v.ip[n, ConvIP.dilation_h], v.ip[n, ConvIP.dilation_w], v.ip[n, ConvIP.groups]
    mode, kind = v.ip[n, ConvIP.mode], v.ip[n, ConvIP.source]
    sh, sw, Pi, Pj = _spans(kind, v.ip[n, ConvIP.stride_h], v.ip[n, ConvIP.stride_w], kh, kw, dh, dw)
    # DIRECT reads source 0 padded: a padded copy as source 2, or source 0 itself, padded as it is read
    x0, pad_h, pad_w = v.src[n, 0], v.ip[n, ConvIP.pad_h], v.ip[n, ConvIP.pad_w]
    folded = kind == DIRECT and pad_h + pad_w > 0 and v.shape[xs, 2] == v.shape[x0, 2] \
        and v.shape[xs, 3] == v.shape[x0, 3]
    Hp, Wp, OH, OW = _plane(kh, kw, v.shape[xs, 2] + (2 * pad_h if folded else 0),
                            v.shape[xs, 3] + (2 * pad_w if folded else 0), v.shape[n, 2], v.shape[n, 3])
    S, T = sh * sw, kh * kw
    ti, tj = (kh - 1) // sh, (kw - 1) // sw               # the taps of the longest phase, less one
    S_in, S_out = (S, 1) if mode == FWD else (1, S)       # phases read (FWD) or made (FLIP)
    Cr, Og = Ci // S_in // groups, Co // S_out // groups  # reduced and output channels per group
    rows, cols = (Co, Cr) if mode == FWD else (Ci, Og)
    # a FLIP of phases with a padding p makes the phases of the unpadded input: x's phase (a, b) is
    # the padded input's phase ((a + p) % s, ...) from its row (a + p) // s, column (b + p) // s on
    made_x_phases = kind == PHASES and mode == FLIP
    xh, xw = (pad_h, pad_w) if made_x_phases else (0, 0)
    if made_x_phases:                        # a phase starts at most (s - 1 + p) // s rows / columns in
        bad = OH + (sh - 1 + xh) // sh > Hp - Pi or OW + (sw - 1 + xw) // sw > Wp - Pj
    else:
        bad = OH != Hp - Pi or OW != Wp - Pj
    if bad or v.shape[ws, 0] != rows or v.shape[ws, 1] != cols or Ci % (S_in * groups) \
            or Co % (S_out * groups) or N != v.shape[n, 0]:
        return ERR_BAD_NODE                  # the builders never make one: no kernel reads out of bounds
    L = VECTOR_BYTES // v.mem.itemsize
    f = pick_tile(Og, OH, OW, L, WIDE)
    MR, down, V, vbytes, per = TILE_SHAPES[f]
    R = down * per                           # output rows of a tile
    width = V * (vbytes // v.mem.itemsize // per) if vbytes else V
    n_r, n_c, n_v = (OH + R - 1) // R, (Og + MR - 1) // MR, (OW + width - 1) // width
    n_b = groups * S_out * n_c
    units = N * n_r * n_b * n_v
    if lo < 0:
        v.ctx[RUN_EXTENT] = units
        return OK
    lo, hi = span(lo, hi, units)
    # out[o - first] is output element o: the node's buffer, or an epilogue's scratch of some images
    x, w = operand(v, n, 2), operand(v, n, 1)
    out, first_out = output_into(v, n)
    # folded: the padded image the tiles read, in a scratch that stays in cache (zero borders, its
    # interior written when the image changes; a call's units are about one image's)
    scratch = np.zeros(Ci * Hp * Wp if folded else 0, out.dtype)
    at_img = -1
    for u in range(lo, hi):
        q0 = min((u % n_v) * width, OW - width)
        u //= n_v
        c = u % n_b
        u //= n_b
        r0 = min((u % n_r) * R, OH - R)
        img = u // n_r
        if folded and img != at_img:
            _pad_image(scratch, x, img, Ci, Hp - 2 * pad_h, Wp - 2 * pad_w, pad_h, pad_w)
            at_img = img
        grp = c // (S_out * n_c)
        ph = c // n_c % S_out
        m0 = min((c % n_c) * MR, Og - MR)
        ya, yb = ph // sw + xh, ph % sw + xw     # FLIP: the phase made, shifted by x's padding
        first = 0
        for pa in range(sh if mode == FWD else 1):
            for pb in range(sw if mode == FWD else 1):
                a, b = (pa, pb) if mode == FWD else (ya % sh, yb % sw)
                n_i, n_j = (kh - a + sh - 1) // sh, (kw - b + sw - 1) // sw
                if mode == FWD:        # w[co, c, i*sh + a, j*sw + b]: rows co, channels c
                    if n_i == 0 or n_j == 0:
                        continue
                    xo = ((img * Ci + grp * Cr * S + a * sw + b) * Hp + r0) * Wp + q0
                    wo = (grp * Og + m0) * Cr * T + a * kw + b
                    wm, wc, wi, wj = Cr * T, T, sh * kw, sw
                    oo = ((img * Co + grp * Og + m0) * OH + r0) * OW + q0
                    om = OH * OW
                else:                  # w[co, c, (n_i-1-i)*sh + a, ...]: rows c, channels co (no tap: zeros)
                    xo = ((img * Ci + grp * Cr) * Hp + r0 + ya // sh + (ti + 1 - n_i) * dh) * Wp \
                        + q0 + yb // sw + (tj + 1 - n_j) * dw
                    wo = grp * Cr * Og * T + m0 * T + ((n_i - 1) * sh + a) * kw + (n_j - 1) * sw + b
                    if n_i == 0 or n_j == 0:
                        xo, wo = 0, 0
                    wm, wc, wi, wj = T, Og * T, -sh * kw, -sw
                    oo = ((img * Co + (grp * Og + m0) * S + ph) * OH + r0) * OW + q0
                    om = S * OH * OW
                if folded:                 # the same offsets, in the scratch's one image
                    _fma(f, data_pointer(scratch[xo - img * Ci * Hp * Wp:]), data_pointer(w[wo:]),
                         data_pointer(out[oo - first_out:]), n_i, n_j, Cr, dh * Wp, dw, S_in * Hp * Wp, wi, wj, wc, wm,
                         Wp, om, OW, first)
                else:
                    _fma(f, data_pointer(x[xo:]), data_pointer(w[wo:]), data_pointer(out[oo - first_out:]), n_i, n_j,
                         Cr, dh * Wp, dw, S_in * Hp * Wp, wi, wj, wc, wm, Wp, om, OW, first)
                first = 1
    return OK


def _run_conv2d(n, lo, hi, ctx, mem, store):
    return conv_tiles(run_view(ctx, mem, store), n, lo, hi)


def _conv(a: Sym, w: Sym, xp: Sym, like: Sym, mode, dilation, groups, source, pad_hw=(0, 0), stride=(0, 0),
          dims=None, u=None) -> Sym:
    """In a rule: conv2d(a, w) reading xp (and for WINOGRAD the kernels' U), shaped like ``like``
    (dims changed)."""
    phases = either(source == PHASES, stride[0] * stride[1], 1)
    return op.conv2d(a, w, xp, u, like=like, dims=dims or {}, dilation_h=dilation[0], dilation_w=dilation[1],
                     groups=groups, mode=mode, pad_h=pad_hw[0], pad_w=pad_hw[1], source=source, stride_h=stride[0],
                     stride_w=stride[1], contracted=xp.shape[1] // groups * w.shape[2] * w.shape[3] // phases)


def _channels_last(t: Sym) -> Sym:
    """In a rule: (N, C, H, W) t as (N, H, W, C)."""
    return op.transpose(t, like=t, dims={1: t.shape[2], 2: t.shape[3], 3: t.shape[1]}, axis0=0, axis1=2, axis2=3,
                        axis3=1)


def _channels_first(t: Sym) -> Sym:
    """In a rule: (N, H, W, C) t as (N, C, H, W)."""
    return op.transpose(t, like=t, dims={1: t.shape[3], 2: t.shape[1], 3: t.shape[2]}, axis0=0, axis1=3, axis2=1,
                        axis3=2)


def _merge_phases(t: Sym, sh, sw, **shape) -> Sym:
    """In a rule: the (N, C*sh*sw, H/sh, W/sw) phases t of an unpadded input put back in place
    (a col2im whose kernel is the stride: each element written once)."""
    return op.col2im(t, **shape, kernel_h=sh, kernel_w=sw, stride_h=sh, stride_w=sw, pad_h=0, pad_w=0, dilation_h=1,
                     dilation_w=1)


def _conv2d_vjp(g, x, w, xp, u, out, dilation_h, dilation_w, groups, mode, pad_h, pad_w, source, stride_h,
                stride_w):
    """y = conv(x, w) reading xp: dw = conv2d_weight(g, xp); dx = the FLIP convolution of g padded
    by d(k-1) - p; for phases, the phases' FLIP product: when they are the phases of x padded by
    p, a FLIP that makes x's own phases (planes the size of g's when s divides x's size) put in
    place by col2im, else col2im of the windows' gradient (the 1x1 FLIP product of g with w seen
    as (C_out, C_in/groups*kh*kw, 1, 1)); for windows, col2im of the 1x1 FLIP product.  A FLIP
    node's own input gradient is the FWD convolution of its gradient (for one that made x's
    phases, that gradient laid out as the padded input's phases first).  WINOGRAD is DIRECT
    computed another way: its input gradient is a WINOGRAD product too, reading g padded as it
    reads it, with U of the other mode's kernels; u itself gets no gradient (w's is all of it)."""
    kh, kw = w.shape[2], w.shape[3]
    phases = source == PHASES
    S = stride_h * stride_w
    # a FLIP that made x's phases: its gradient as the phases of x padded by p, which the rules read
    H, W = out.shape[2] * stride_h, out.shape[3] * stride_w
    whole = _merge_phases(g, stride_h, stride_w, like=out, dims={1: out.shape[1] // S, 2: H, 3: W})
    padded_phases = op.im2col(whole, like=out, dims={2: (H + 2 * pad_h - stride_h) // stride_h + 1,
                                                     3: (W + 2 * pad_w - stride_w) // stride_w + 1},
                              kernel_h=stride_h, kernel_w=stride_w, stride_h=stride_h, stride_w=stride_w, pad_h=pad_h,
                              pad_w=pad_w, dilation_h=1, dilation_w=1)
    g = either(phases & (mode == FLIP) & ((pad_h > 0) | (pad_w > 0)), padded_phases, g)
    # a DIRECT product that pads as it reads (FOLD_PADDING: it reads x itself): its weight gradient
    # reads a padded copy, made here; its input gradient pads g as it reads it too
    winograd = source == WINOGRAD
    reads_x = (source == DIRECT) | winograd            # a product that reads x itself, not its windows
    folded = reads_x & (x.id == xp.id) & ((pad_h > 0) | (pad_w > 0))
    read = either(folded, pad(xp, pad_h, pad_w), xp)
    # planes narrower than CHANNEL_BELOW with whole blocks of channels: g laid out channels last
    # (a transpose the size of g) and the channel-vector kernel, where the lanes run across
    # channels (measured on 512-bit and 256-bit hosts: conv_weight.C2, C2_NARROW)
    by_channel = reads_x & (mode == FWD) & (groups == 1) & (g.shape[1] % CHANNEL_BLOCK == 0) \
        & (g.shape[3] < CHANNEL_BELOW)
    weight = dict(like=w, dilation_h=dilation_h, dilation_w=dilation_w, groups=groups, mode=mode,
                  stride_h=either(phases, stride_h, 1), stride_w=either(phases, stride_w, 1),
                  contracted=g.shape[0] * g.shape[2] * g.shape[3])
    dw = either(by_channel, op.conv2d_weight(_channels_last(g), read, layout=CHANNELS_LAST, **weight),
                op.conv2d_weight(g, read, layout=CHANNELS_FIRST, **weight))
    windows = op.col2im(_conv(g, w, g, xp, FLIP, (1, 1), groups, DIRECT), like=x, params_from=xp)
    flip_phases = _conv(g, w, g, x, FWD, (1, 1), groups, PHASES, stride=(stride_h, stride_w))
    wv = op.reshape(w, like=w, dims={1: w.shape[1] * kh * kw, 2: 1, 3: 1})
    product = _conv(g, wv, g, g, FLIP, (1, 1), groups, DIRECT, dims={1: wv.shape[1] * groups})
    x_phases = op.col2im(product, like=x, params_from=xp, kernel_h=kh, kernel_w=kw)
    g_reach = pad(g, (kh - 1) // stride_h, (kw - 1) // stride_w)      # g padded by the longest phase's reach
    phases_as_such = _conv(g, w, g_reach, xp, FLIP, (1, 1), groups, PHASES, stride=(stride_h, stride_w))
    # x's phases, when the padded input's phases hold all of x and s divides its size (x.id != xp.id:
    # xp is the im2col that split x, padded by its pad_h / pad_w)
    p_h, p_w = xp.ip(WindowsIP.pad_h), xp.ip(WindowsIP.pad_w)
    whole_phases = (x.shape[2] % stride_h == 0) & (x.shape[3] % stride_w == 0) \
        & (xp.shape[2] * stride_h - p_h >= x.shape[2]) & (xp.shape[3] * stride_w - p_w >= x.shape[3])
    own_phases = _conv(g, w, g_reach, x, FLIP, (1, 1), groups, PHASES, pad_hw=(p_h, p_w), stride=(stride_h, stride_w),
                       dims={1: x.shape[1] * S, 2: x.shape[2] // stride_h, 3: x.shape[3] // stride_w})
    x_own_phases = _merge_phases(own_phases, stride_h, stride_w, like=x)
    qh, qw = dilation_h * (kh - 1) - pad_h, dilation_w * (kw - 1) - pad_w
    other_u = op.winograd_weights(w, like=u, dims={2: u.shape[3], 3: u.shape[2]}, mode=1 - mode)   # only if built
    direct = either(winograd, _conv(g, w, g, x, 1 - mode, (1, 1), 1, WINOGRAD, pad_hw=(qh, qw), u=other_u),
                    _conv(g, w, either(folded, g, pad(g, qh, qw)), x, 1 - mode, (dilation_h, dilation_w), groups,
                          DIRECT, pad_hw=(qh, qw)))
    dx = either(source == WINDOWS, windows, either(
        phases, either(mode == FLIP, flip_phases, either(x.id != xp.id, either(whole_phases, x_own_phases, x_phases),
                                                             phases_as_such)), direct))
    return dx, dw, None, None


defop(CONV2D, "conv2d", conv2d, _run_conv2d, _conv2d_vjp, arity=-1, cost=COMPUTE, flops=DOT, split=CUSTOM,
      sources=("x", "w", "xp", "u"), ip=ConvIP, epilogue=True)
