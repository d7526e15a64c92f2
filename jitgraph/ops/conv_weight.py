"""The weight gradient of a convolution: one ``conv2d_weight`` node, dW[co, c, i, j] summed
over images and positions in one pass (never a product per image and a sum).

Two kernels, both register tiles of partial sums (simd.py):

* ``weight_blocks`` (g channels first): a tile is a few of g's channels x a few taps, each
  accumulator a vector of positions (simd.dot_tile), the images taken a cache-sized chunk at a
  time;
* ``channel_blocks`` (g channels last, for planes narrower than CHANNEL_BELOW): a tile is two
  vectors of output channels x 8 taps (6 with 256-bit vectors), x broadcast
  (simd.channel_tile) -- a narrow plane would fill a position vector only in part.

Units of work are channel blocks (and tap ranges): every element of dW is one fixed sequence
of operations, whatever the thread count.
"""

import numpy as np
from numba import njit

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, data_pointer, operand, output, run_view, span
from ..registry import COMPUTE, CONV2D_WEIGHT, CUSTOM, DOT, IM2COL, defop, slots
from ..rules import either
from ..simd import VECTOR_BYTES, WIDE, WIDE_BYTES, channel_tile, dot_tile
from ..status import ERR_BAD_NODE, OK
from .common import need_tensor
from .conv import (CHANNEL_BLOCK, CHANNELS_FIRST, CHANNELS_LAST, DIRECT, FLIP, FWD, PHASES, ConvWeightIP, _channels_first,
                   _channels_last, _conv, _plane, _spans)
from .windows import Pair, int_pair, pad

CHUNK_BYTES = 1 << 21     # weight_blocks takes a weight gradient's images in chunks of about this much input
# channel_blocks: positions in chunks of CHANNEL_CHUNK_BYTES of a channel block, taps in at most
# CHANNEL_UNITS ranges (units for threads, not cache)
CHANNEL_CHUNK_BYTES, CHANNEL_UNITS = 1 << 14, 8


# ---- conv2d_weight: the weight gradient ---------------------------------------------------------------
def conv2d_weight(g: Tensor, xp: Tensor, kernel_size: Pair, dilation: Pair = 1, groups: int = 1,
                  flip: bool = False, channels_last: bool = False) -> Tensor:
    """The weight gradient of ``conv2d(x, w)`` reading xp (padded x), stride 1:
    dw[co, c, i, j] = sum over images and positions of g[n, co, p] xp[n, c, p + (i, j) * dilation]
    (groups: c counts within co's group).  ``flip``: the gradient of a FLIP convolution
    (g has the input's channels, xp the output's; taps flipped).  ``channels_last``: g is laid
    out (N, H, W, C) -- the channel-vector kernel's (``channel_blocks``): FWD, one group, a
    multiple of CHANNEL_BLOCK channels."""
    g, xp = need_tensor(g, "conv2d_weight"), need_tensor(xp, "conv2d_weight")
    k, d = int_pair(kernel_size, "conv2d_weight", "kernel_size", 1), int_pair(dilation, "conv2d_weight", "dilation", 1)
    gshape = (g.shape[0], g.shape[3], g.shape[1], g.shape[2]) if channels_last and g.ndim == 4 else g.shape
    if g.ndim != 4 or xp.ndim != 4 or gshape[0] != xp.shape[0] or gshape[1] % groups or xp.shape[1] % groups \
            or gshape[2:] != (xp.shape[2] - d[0] * (k[0] - 1), xp.shape[3] - d[1] * (k[1] - 1)) \
            or channels_last and (flip or groups != 1 or gshape[1] % CHANNEL_BLOCK):
        raise GraphError(f"conv2d_weight: gradient {g.label!r} {g.shape} does not fit input {xp.label!r} {xp.shape} "
                         f"with kernel {k}, dilation {d}, groups {groups}"
                         + (f", channels last (FWD, one group, channels a multiple of {CHANNEL_BLOCK})"
                            if channels_last else ""))
    rows, cols = (xp.shape[1], gshape[1] // groups) if flip else (gshape[1], xp.shape[1] // groups)
    return g.graph._node(CONV2D_WEIGHT, (g.id, xp.id), (rows, cols) + k,
                         ip=slots(ConvWeightIP, dilation_h=d[0], dilation_w=d[1], groups=groups, mode=FLIP if flip else FWD,
                                  stride_h=1, stride_w=1, layout=CHANNELS_LAST if channels_last else CHANNELS_FIRST,
                                  contracted=gshape[0] * gshape[2] * gshape[3]))


# 4 rows x 3 taps of 256-bit partial sums (12 accumulators fit AVX2's 16 registers; 4 x 4
# spilled: a ResNet layer's weight gradient 1.6x slower, Zen 3), 4 x 4 scalars, 4 x 6 512-bit ones
# (24 of AVX-512's 32 registers: 4 x 4 loaded 0.75 vectors an FMA, 4 x 6 0.67, and ran the
# weight gradient of a 32 x 32 plane 1.24x, 16 x 16 1.23x faster; 5 x 5 and 6 x 4 fell between,
# 4 x 7 spilled; Intel Xeon model 207); D3: 4 x 6 512-bit ones over planes half a vector wide,
# two rows a vector (8 x 8 float32 ran at 256 bits, 84 GFLOP/s where oneDNN makes 188)
D0, D1, D2, D3 = dot_tile(4, 3, VECTOR_BYTES), dot_tile(4, 4, 0), dot_tile(4, 6, WIDE_BYTES), \
    dot_tile(4, 6, WIDE_BYTES, paired=True)
WEIGHT_TILES = ((4, 3), (4, 4), (4, 6), (4, 6))     # (rows, taps) of D0 ... D3


@njit(cache=True, error_model="numpy")
def weight_tile(OH, OW, itemsize, wide):
    """The tile of a weight gradient over OH x OW planes: D2 (rows of 512-bit vectors), D3 (two
    rows a 512-bit vector), D0 (256-bit) or D1 (scalars); ``wide``: 512-bit tiles may be used."""
    wide_lanes = WIDE_BYTES // itemsize
    if wide and OW >= wide_lanes:
        return 2
    if wide and 2 * OW == wide_lanes and OH % 2 == 0:
        return 3
    return 0 if OW >= VECTOR_BYTES // itemsize else 1


@njit(cache=True, error_model="numpy")
def _tap(t, q, n_j, a, b, sh, sw, S, kw, dh, dw, Hp, Wp, T, ti, tj, Cw, mode):
    """(input offset, output offset) of tap t = (channel, i, j) of phase (a, b) of a weight
    gradient (q = n_i * n_j taps a channel)."""
    c = t // q
    i = t % q // n_j
    j = t % n_j
    at = (i * sh + a) * kw + j * sw + b
    if mode == FWD:            # channel c of the input, phase (a, b)
        return (c * S + a * sw + b) * Hp * Wp + i * dh * Wp + j * dw, c * T + at
    return c * Hp * Wp + (ti - i) * dh * Wp + (tj - j) * dw, c * Cw * T + at


# the channel-vector weight gradient: 2 vectors of output channels x 8 taps of 512-bit sums
# (16 accumulators, 2 + 8 operand registers and 8 tap pointers: 12 taps spilled, 3x slower; 10
# ran as 8); a unit is a block of CHANNEL_BLOCK channels at most (2 vectors: 32 in float32,
# 16 in float64) and a range of taps, over positions a chunk at a time so the block's gradient
# stays in cache for every tap.  Measured against oneDNN's weight gradient (Intel Xeon model
# 207, one thread, batch 32; jitgraph / torch): 16 x 16 x 32 channels 1.05 -> 0.83, 8 x 8 x 64
# 1.40 -> 0.90, 32 x 32 x 32 0.96 -> 0.88 -- but the transpose it reads costs ~0.5 ns an
# element of g, ~10% of a 32-channel weight gradient: planes of 32 and wider keep dot_tile
C2, CHANNEL_TAPS = channel_tile(2, 8, WIDE_BYTES), 8
# 256-bit hosts: 2 vectors x 6 taps (12 accumulators of AVX2's 16 registers, as D0; 4 taps
# ran no faster).  Against dot_tile's D0, each with its layout's transpose (AMD EPYC Zen 3, one
# thread, batch 32, 3 x 3): 8 x 8 x 64 channels 0.72-0.80x the time, 16 x 16 x 32 0.85-0.86x,
# 32 x 32 x 16 0.85-0.91x (with the tiled transpose, shape.py; before it 0.80, 0.93, 1.05)
C2_NARROW, CHANNEL_TAPS_NARROW = channel_tile(2, 6, VECTOR_BYTES), 6


@njit(cache=True, error_model="numpy")
def channel_blocks(v, n, lo, hi):
    """conv2d_weight of a channels-last gradient g (N, OH, OW, Co), FWD, one group: each
    step of a tile adds g's vector of channels at one position times a broadcast element
    of xp to a tap's sums, so no plane is too narrow for the lanes.  dw[co, t] is a running
    sum over the positions in order, made by one unit: the same bits at any thread count."""
    gs, xs = v.src[n, 0], v.src[n, 1]
    N, OH, OW, Co = v.shape[gs, 0], v.shape[gs, 1], v.shape[gs, 2], v.shape[gs, 3]
    Ci, Hp, Wp = v.shape[xs, 1], v.shape[xs, 2], v.shape[xs, 3]
    kh, kw = v.shape[n, 2], v.shape[n, 3]
    dh, dw = v.ip[n, ConvWeightIP.dilation_h], v.ip[n, ConvWeightIP.dilation_w]
    L = (WIDE_BYTES if WIDE else VECTOR_BYTES) // v.mem.itemsize
    CB = 2 * L                                 # channels a tile's two vectors hold
    if v.shape[xs, 0] != N or OH != Hp - dh * (kh - 1) or OW != Wp - dw * (kw - 1) or v.shape[n, 0] != Co \
            or v.shape[n, 1] != Ci or Co % CB or v.ip[n, ConvWeightIP.groups] != 1 \
            or v.ip[n, ConvWeightIP.mode] != FWD:
        return ERR_BAD_NODE
    T = kh * kw
    K = Ci * T
    NB = CHANNEL_TAPS if WIDE else CHANNEL_TAPS_NARROW
    n_cb, n_tb = Co // CB, (K + NB - 1) // NB
    per = max(1, (n_tb + CHANNEL_UNITS - 1) // CHANNEL_UNITS)    # tap blocks a unit
    n_ranges = (n_tb + per - 1) // per
    if lo < 0:
        v.ctx[RUN_EXTENT] = n_cb * n_ranges
        return OK
    lo, hi = span(lo, hi, n_cb * n_ranges)
    g, x, out = operand(v, n, 0), operand(v, n, 1), output(v, n)
    offs = np.empty(K + NB, np.int64)          # each tap's element of xp from a position's
    for t in range(K + NB):
        offs[t] = _tap(min(t, K - 1), T, kw, 0, 0, 1, 1, 1, kw, dh, dw, Hp, Wp, T, 0, 0, Co, FWD)[0]
    P, plane = N * OH * OW, OH * OW
    chunk = max(1, CHANNEL_CHUNK_BYTES // (CB * v.mem.itemsize))
    for u in range(lo, hi):
        cb = u // n_ranges
        t_lo = (u % n_ranges) * per * NB
        t_hi = min(K, t_lo + per * NB)
        # [tap][channel], dw's block transposed; a last block's taps past kv are loaded, not stored
        sums = np.zeros((t_hi - t_lo + NB) * CB, out.dtype)
        for p0 in range(0, P, chunk):
            steps = min(chunk, P - p0)
            img, at = p0 // plane, p0 % plane
            gp = data_pointer(g[p0 * Co + cb * CB:])
            xp = data_pointer(x[img * Ci * Hp * Wp:])
            for t0 in range(t_lo, t_hi, NB):
                o = offs[t0:t0 + NB]
                if WIDE:
                    C2(gp, xp, data_pointer(sums[(t0 - t_lo) * CB:]),
                       (o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]),
                       min(NB, t_hi - t0), steps, Co, at % OW, at // OW, OW, OH, Wp, Ci * Hp * Wp)
                else:
                    C2_NARROW(gp, xp, data_pointer(sums[(t0 - t_lo) * CB:]), (o[0], o[1], o[2], o[3], o[4], o[5]),
                              min(NB, t_hi - t0), steps, Co, at % OW, at // OW, OW, OH, Wp, Ci * Hp * Wp)
        for t in range(t_lo, t_hi):
            for c in range(CB):
                out[(cb * CB + c) * K + t] = sums[(t - t_lo) * CB + c]
    return OK


@njit(cache=True, error_model="numpy")
def weight_blocks(v, n, lo, hi):
    """conv2d_weight: units are blocks of a tile's rows (output channels, or input channels
    for FLIP) of one group, each summed over every image and position in a fixed order; a
    channels-last g goes to channel_blocks."""
    if v.ip[n, ConvWeightIP.layout] == CHANNELS_LAST:
        return channel_blocks(v, n, lo, hi)
    gs, xs = v.src[n, 0], v.src[n, 1]
    N, Ci, Cg = v.shape[xs, 0], v.shape[xs, 1], v.shape[gs, 1]
    kh, kw = v.shape[n, 2], v.shape[n, 3]
    dh, dw, groups = v.ip[n, ConvWeightIP.dilation_h], v.ip[n, ConvWeightIP.dilation_w], v.ip[n, ConvWeightIP.groups]
    mode, sh, sw = v.ip[n, ConvWeightIP.mode], v.ip[n, ConvWeightIP.stride_h], v.ip[n, ConvWeightIP.stride_w]
    sh, sw, Pi, Pj = _spans(PHASES if sh > 1 or sw > 1 else DIRECT, sh, sw, kh, kw,
                            dh, dw)
    Hp, Wp, OH, OW = _plane(kh, kw, v.shape[xs, 2], v.shape[xs, 3], v.shape[gs, 2], v.shape[gs, 3])
    S, T = sh * sw, kh * kw
    ti, tj = (kh - 1) // sh, (kw - 1) // sw
    S_in, S_g = (S, 1) if mode == FWD else (1, S)         # phases in the input (FWD) or in g (FLIP)
    Mg, Cr = Cg // S_g // groups, Ci // S_in // groups    # gradient rows and input channels per group
    rows, cols = (Mg * groups, Cr) if mode == FWD else (Ci, Mg)
    if OH != Hp - Pi or OW != Wp - Pj or Cg % (S_g * groups) or Ci % (S_in * groups) or v.shape[gs, 0] != N \
            or v.shape[n, 0] != rows or v.shape[n, 1] != cols:
        return ERR_BAD_NODE
    # 512-bit lanes (with AVX-512) change the order of a sum's partial sums: the bits differ
    # from another host's, never between runs, thread counts or checkpointed recomputations
    tile = weight_tile(OH, OW, v.mem.itemsize, WIDE)
    MR, step = WEIGHT_TILES[tile]
    n_m = (Mg + MR - 1) // MR
    if lo < 0:
        v.ctx[RUN_EXTENT] = groups * n_m
        return OK
    lo, hi = span(lo, hi, groups * n_m)
    om = Cr * T if mode == FWD else T     # FWD: out[co, c, i, j], rows co; FLIP: out[co, c, ...], rows c
    chunk = max(1, CHUNK_BYTES // ((Cr * S_in * Hp * Wp + MR * S_g * OH * OW) * v.mem.itemsize))
    g, x, out = operand(v, n, 0), operand(v, n, 1), output(v, n)
    for u in range(lo, hi):
        grp = u // n_m
        m0 = (u % n_m) * MR
        mv = min(MR, Mg - m0)
        base = (grp * Mg + m0) * om if mode == FWD else grp * Cr * Mg * T + m0 * T
        for co in range(1 if mode == FWD else Cr):
            for q in range(mv * (om if mode == FWD else T)):
                out[base + co * Mg * T + q] = 0.0
        o = data_pointer(out[base:])
        for i0 in range(0, N, chunk):
            ni = min(chunk, N - i0)
            xp = data_pointer(x[(i0 * Ci + grp * Cr * S_in) * Hp * Wp:])
            for a in range(sh):
                for b in range(sw):
                    n_i, n_j = (kh - a + sh - 1) // sh, (kw - b + sw - 1) // sw
                    K = Cr * n_i * n_j
                    ph = 0 if mode == FWD else a * sw + b
                    gp = data_pointer(g[((i0 * Cg) + (grp * Mg + m0) * S_g + ph) * OH * OW:])
                    # every tap's (input, output) offsets, padded to whole steps with the last tap
                    xoffs, ooffs = np.empty(K + step, np.int64), np.empty(K + step, np.int64)
                    for t in range(K + step):
                        xoffs[t], ooffs[t] = _tap(min(t, K - 1), n_i * n_j, n_j, a, b, sh, sw, S, kw, dh, dw, Hp, Wp,
                                                  T, ti, tj, Mg, mode)
                    for t0 in range(0, K, step):
                        kv = min(step, K - t0)
                        a0, a1, a2, a3 = xoffs[t0], xoffs[t0 + 1], xoffs[t0 + 2], xoffs[t0 + 3]
                        b0, b1, b2, b3 = ooffs[t0], ooffs[t0 + 1], ooffs[t0 + 2], ooffs[t0 + 3]
                        a4, a5 = xoffs[min(t0 + 4, K + step - 1)], xoffs[min(t0 + 5, K + step - 1)]    # D2, D3's
                        b4, b5 = ooffs[min(t0 + 4, K + step - 1)], ooffs[min(t0 + 5, K + step - 1)]
                        # the tiles called here, not through a dispatcher like _fma: a call to one
                        # made the weight gradient 4-5% slower (ResNet-32, side by side)
                        if tile == 3:
                            D3(gp, xp, o, (a0, a1, a2, a3, a4, a5), (b0, b1, b2, b3, b4, b5), mv, kv, S_g * OH * OW,
                               om, ni, Cg * OH * OW, Ci * Hp * Wp, OH, OW, Wp, OW)
                        elif tile == 2:
                            D2(gp, xp, o, (a0, a1, a2, a3, a4, a5), (b0, b1, b2, b3, b4, b5), mv, kv, S_g * OH * OW,
                               om, ni, Cg * OH * OW, Ci * Hp * Wp, OH, OW, Wp, OW)
                        elif tile == 0:
                            D0(gp, xp, o, (a0, a1, a2), (b0, b1, b2), mv, kv, S_g * OH * OW, om, ni,
                               Cg * OH * OW, Ci * Hp * Wp, OH, OW, Wp, OW)
                        else:
                            D1(gp, xp, o, (a0, a1, a2, a3), (b0, b1, b2, b3), mv, kv, S_g * OH * OW, om, ni,
                               Cg * OH * OW, Ci * Hp * Wp, OH, OW, Wp, OW)
    return OK


def _run_conv2d_weight(n, lo, hi, ctx, mem, store):
    return weight_blocks(run_view(ctx, mem, store), n, lo, hi)


def _conv2d_weight_vjp(h, g, xp, out, dilation_h, dilation_w, groups, mode, stride_h, stride_w, layout):
    """dw = W(g, xp), bilinear.  FWD: through g, the FWD convolution of xp with h; through xp,
    the FLIP convolution of g padded by the reach with h.  FLIP: through g, the FLIP
    convolution of xp with h; through xp, the FWD convolution of g padded by the reach.  A
    channels-last g is made channels first (gf) for these, and its gradient laid out back."""
    last = layout == CHANNELS_LAST
    gf = either(last, _channels_first(g), g)
    phases = (stride_h > 1) | (stride_w > 1)
    source = either(phases, PHASES, DIRECT)
    kh, kw = out.shape[2], out.shape[3]
    qh = either(phases, (kh - 1) // stride_h, dilation_h * (kh - 1))
    qw = either(phases, (kw - 1) // stride_w, dilation_w * (kw - 1))
    stride, dilation = (either(phases, stride_h, 0), either(phases, stride_w, 0)), (dilation_h, dilation_w)
    x = either(xp.opcode == IM2COL, xp.source(0), xp)                # the FLIP's unpadded input
    dg = either((mode == FWD) | ~phases, _conv(xp, h, xp, gf, mode, dilation, groups, source, stride=stride),
                _conv(x, h, xp, gf, FLIP, dilation, groups, source, stride=stride))
    gp = pad(gf, qh, qw)
    dxp = either(phases, _conv(either(mode == FLIP, gp, gf), h, gp, xp, 1 - mode, dilation, groups, PHASES,
                               stride=stride),
                 _conv(gf, h, gp, xp, 1 - mode, dilation, groups, DIRECT, pad_hw=(qh, qw)))
    return either(last, _channels_last(dg), dg), dxp


defop(CONV2D_WEIGHT, "conv2d_weight", conv2d_weight, _run_conv2d_weight, _conv2d_weight_vjp, arity=2, cost=COMPUTE,
      flops=DOT, public=False, split=CUSTOM, sources=("g", "xp"), ip=ConvWeightIP)
