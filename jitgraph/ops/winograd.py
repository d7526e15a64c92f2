"""Winograd F(2x2, 3x3): a 3x3 stride-1 convolution with 2.25x fewer multiplications.

Each 2x2 tile of an output plane is A^T [sum over input channels of U (.) V] A, where
V = B^T d B is the 4x4 input tile d (stride 2) transformed and U = G w G^T the 3x3 kernel
transformed: 16 products per tile and channel pair instead of 36.  A ``conv2d`` node whose
source is WINOGRAD (conv.py chooses it: 3x3, stride 1, no dilation, one group, both channel
counts at least WINOGRAD_MIN_CHANNELS) reads a fourth source, its kernels' U: a
``winograd_weights`` node (16, C_out, C_in), made once a step from the weights as stored
(FWD) or flipped and transposed (FLIP: an input gradient).

The convolution's units are images (so an epilogue can run it image by image); a call takes
its images a block at a time (about BLOCK_TILES tiles, so the products' rows fill whole tiles
of vectors even for 8 x 8 planes) and, per block:

1. each padded input plane split into its four parities (even / odd rows x columns: the one
   strided copy);
2. the input transform (simd.winograd_input_tile): every tile's 16 values of V, vectorized
   across tiles -- each parity plane is kept twice, the second copy shifted one column left, so
   a tile's 16 reads are runs of tw values and every lane is a tile (with rows of tw + 1 and no
   copy, the last column of each row was not a tile: 25% of an 8 x 8 plane's products wasted);
3. 16 products M[k] = U[k] @ V[k] over the channels, in conv.py's register tiles
   (simd.fma_tile);
4. the output transform (simd.winograd_output_tile) and the interleave of each tile's 2 x 2
   outputs into the output rows.

Every output element is one fixed sequence of operations whatever the block, the thread or
the call it falls in, so results do not depend on the thread count, and a checkpointed
recomputation or an epilogue's call gives the same bits.  The values are not the direct
product's: float32 results differ from it by a few units in the last place (the transforms
add and subtract inputs before the products; tests/test_winograd.py bounds it).
"""
import numpy as np
from numba import njit, uint64 as U

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, data_pointer, operand, output, output_into, run_view, span
from ..registry import CUSTOM, NO_GRAD, WINOGRAD_WEIGHTS, defop, slots
from ..simd import VECTOR_BYTES, WIDE, WIDE_BYTES, fma_tile, winograd_input_tile, winograd_output_tile
from ..status import ERR_BAD_NODE, OK
from .common import need_tensor

from enum import IntEnum

# compact rows below 16 tiles: they took 8 x 8 and 16 x 16 planes' products 0.92 -> 0.72x and
# 0.87 -> 0.74x the direct product's time, 32 x 32 ones 0.76 -> 1.4x (their split writing twice)
COMPACT_BELOW = 16
BLOCK_TILES = 64             # a block of images holds at least this many tiles (when the call has them)
_VB = WIDE_BYTES if WIDE else VECTOR_BYTES
ACROSS = 4 if WIDE else 3    # vectors of tiles in a product's tile: 16 accumulators of 32 registers, 12 of AVX2's 16
PRODUCT = fma_tile(4, 1, ACROSS, _VB)     # 4 output channels x ACROSS vectors of tiles
# a block's last tiles (fewer than a PRODUCT's columns): 12 output channels x 1 vector, or 4 or 1
# channels for convolutions with fewer output channels
TALL, TALL4, TALL1 = fma_tile(12, 1, 1, _VB), fma_tile(4, 1, 1, _VB), fma_tile(1, 1, 1, _VB)
IN_TILE, OUT_TILE = winograd_input_tile(_VB), winograd_output_tile(_VB)
FWD, FLIP = 0, 1             # conv.py's modes: the weights as stored, or flipped and transposed


class WinogradIP(IntEnum):
    mode = 0                 # FWD or FLIP


# ---- U = G w G^T ---------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def weights_kernel(u, w, Co, Ci, O, C, flip, lo, hi):
    """u[k, o, c] (k = 4 i + j, O x C kernels) of w (Co, Ci, 3, 3): kernel (o, c) is w[o, c]
    (FWD) or w[c, o] turned by 180 degrees (FLIP, O = Ci, C = Co), for the rows o in [lo, hi).
    G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]] (the halves are exact), G g down
    each kernel's columns, then G^T across its rows, a row o's C kernels at a time: their taps are
    gathered channel-minor first, so both steps are loops over c that vectorize (one kernel at a
    time took 3x as long: 64 x 64 kernels 0.076 -> 0.026 ms, AMD EPYC Zen 4)."""
    half = np.full(1, 0.5, u.dtype)[0]       # 1/2 in u's dtype: float32 sums stay float32
    g = np.empty(9 * C, u.dtype)             # g[q * C + c]: tap q of kernel (o, c)
    t = np.empty(12 * C, u.dtype)            # t[(3 i + j) * C + c]: (G g)[i, j]
    row = U(O * C)                           # u's rows k are O * C apart
    for o in range(lo, hi):
        for c in range(C):
            at = (c * Ci + o) * 9 if flip else (o * Ci + c) * 9
            for q in range(9):
                g[U(q * C + c)] = w[U(at + 8 - q)] if flip else w[U(at + q)]
        for j in range(3):
            a0, a1, a2 = U(j * C), U((3 + j) * C), U((6 + j) * C)
            for c in range(U(C)):
                a, b, d = g[a0 + c], g[a1 + c], g[a2 + c]
                t[a0 + c] = a
                t[a1 + c] = (a + b + d) * half
                t[a2 + c] = (a - b + d) * half
                t[U((9 + j) * C) + c] = d
        for i in range(4):
            t0, t1, t2 = U(3 * i * C), U((3 * i + 1) * C), U((3 * i + 2) * C)
            out = U((4 * i * O + o) * C)
            for c in range(U(C)):
                a, b, d = t[t0 + c], t[t1 + c], t[t2 + c]
                u[out + c] = a
                u[out + row + c] = (a + b + d) * half
                u[out + U(2) * row + c] = (a - b + d) * half
                u[out + U(3) * row + c] = d
    return OK


def winograd_weights(w: Tensor, flip: bool = False) -> Tensor:
    """(conv.py builds it for a Winograd product.)  U = G k G^T of the 3x3 kernels k of w
    (C_out, C_in, 3, 3): (16, C_out, C_in), entry 4 i + j of each kernel's 4 x 4; ``flip``: the
    kernels turned by 180 degrees and transposed, (16, C_in, C_out).  No gradient: the product's
    rule differentiates w itself."""
    w = need_tensor(w, "winograd_weights")
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise GraphError(f"winograd_weights: {w.label!r} {w.shape} must be 3x3 kernels (C_out, C_in, 3, 3)")
    if not isinstance(flip, (bool, np.bool_)):
        raise GraphError(f"winograd_weights of {w.label!r}: flip must be True or False, got {flip!r}")
    Co, Ci = w.shape[0], w.shape[1]
    O, C = (Ci, Co) if flip else (Co, Ci)
    return w.graph._node(WINOGRAD_WEIGHTS, (w.id,), (16, O, C), ip=slots(WinogradIP, mode=FLIP if flip else FWD))


def _run_weights(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    ws = v.src[n, 0]
    Co, Ci = v.shape[ws, 0], v.shape[ws, 1]
    flip = v.ip[n, WinogradIP.mode] == FLIP
    O, C = (Ci, Co) if flip else (Co, Ci)
    if v.shape[ws, 2] != 3 or v.shape[ws, 3] != 3 or v.shape[n, 1] != 16 or v.shape[n, 2] != O \
            or v.shape[n, 3] != C:
        return ERR_BAD_NODE
    if lo < 0:                               # units: the kernels' rows o (threads split 64 x 64 kernels)
        v.ctx[RUN_EXTENT] = O
        return OK
    lo, hi = span(lo, hi, O)
    return weights_kernel(output(v, n), operand(v, n, 0), Co, Ci, O, C, flip, lo, hi)


defop(WINOGRAD_WEIGHTS, "winograd_weights", winograd_weights, _run_weights, NO_GRAD, arity=1, public=False,
      sources=("w",), ip=WinogradIP, split=CUSTOM)


# ---- the convolution ---------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _put(planes, to, shifted, j, value, tw):
    """Parity column j of a row: at ``to`` + j (j < tw) and one column left in the shifted copy."""
    if j < tw:
        planes[to + j] = value
    if j >= 1:
        planes[shifted + j - 1] = value


@njit(cache=True, error_model="numpy")
def _split_parities(planes, ps, rw, x, src, H, W, ph, pw, compact):
    """Plane ``src`` of x (H x W), padded by (ph, pw), into its four parity planes (planes +
    (2 * row parity + column parity) * ps, rows rw long); the padding's places are never written.
    x's column 2 jj goes to the padded column 2 jj + pw, parity column jj + pw // 2; 2 jj + 1 to
    jj + (pw + 1) // 2 of the other parity.  Rows of tw + 1 (``compact`` false) hold every
    column; compact rows hold columns [0, tw), and a copy of the planes 4 ps on, shifted one
    column left, columns [1, tw].  The middle of a row is one loop reading x's columns in pairs
    (a stride-2 pair LLVM vectorizes with shuffles); compact rows' ends test each value."""
    n_even, n_odd = (W + 1) // 2, W // 2
    fe, fo = pw // 2, (pw + 1) // 2                       # parity columns of x's columns 0 and 1
    if compact:
        lo, hi = max(0, 1 - min(fe, fo)), max(0, min(n_odd, rw - max(fe, fo)))
        lo = min(lo, hi)
    for h in range(H):
        r = h + ph
        row = (r % 2) * 2 * ps + (r // 2) * rw
        at = src + h * W
        e0, o0 = row + (pw % 2) * ps, row + ((pw + 1) % 2) * ps
        if not compact:
            for jj in range(U(n_odd)):
                planes[U(e0 + fe) + jj] = x[U(at) + U(2) * jj]
                planes[U(o0 + fo) + jj] = x[U(at) + U(2) * jj + U(1)]
            if n_even > n_odd:
                planes[e0 + fe + n_odd] = x[at + 2 * n_odd]
            continue
        e1, o1 = e0 + 4 * ps, o0 + 4 * ps
        for jj in range(U(lo), U(hi)):
            e, o = x[U(at) + U(2) * jj], x[U(at) + U(2) * jj + U(1)]
            planes[U(e0 + fe) + jj] = e
            planes[U(o0 + fo) + jj] = o
            planes[U(e1 + fe - 1) + jj] = e
            planes[U(o1 + fo - 1) + jj] = o
        for jj in range(lo):                              # the ends
            _put(planes, e0, e1, jj + fe, x[at + 2 * jj], rw)
            _put(planes, o0, o1, jj + fo, x[at + 2 * jj + 1], rw)
        for jj in range(hi, n_even):
            _put(planes, e0, e1, jj + fe, x[at + 2 * jj], rw)
            if jj < n_odd:
                _put(planes, o0, o1, jj + fo, x[at + 2 * jj + 1], rw)


@njit(cache=True, error_model="numpy")
def winograd_tiles(v, n, lo, hi, pad_h, pad_w):
    """conv2d of source WINOGRAD: units are images (module docstring)."""
    x0, ws, xs, us = v.src[n, 0], v.src[n, 1], v.src[n, 2], v.src[n, 3]
    N, Ci, H, W = v.shape[xs, 0], v.shape[xs, 1], v.shape[xs, 2], v.shape[xs, 3]
    Co, OH, OW = v.shape[n, 1], v.shape[n, 2], v.shape[n, 3]
    # source 2 is source 0 padded as it is read (its shape), or a padded copy
    folded = H == v.shape[x0, 2] and W == v.shape[x0, 3]
    ph, pw = (pad_h, pad_w) if folded else (0, 0)
    if us < 0 or ws < 0 or OH != H + 2 * ph - 2 or OW != W + 2 * pw - 2 or N != v.shape[n, 0] \
            or v.shape[us, 1] != 16 or v.shape[us, 2] != Co or v.shape[us, 3] != Ci \
            or ph > 2 or pw > 2 or OH < 1 or OW < 1:
        return ERR_BAD_NODE                  # conv.py never builds one: no kernel reads out of bounds
    if lo < 0:
        v.ctx[RUN_EXTENT] = N
        return OK
    lo, hi = span(lo, hi, N)
    L = _VB // v.mem.itemsize
    th, tw = (OH + 1) // 2, (OW + 1) // 2
    # planes narrower than COMPACT_BELOW tiles keep compact rows (every lane a tile, the split
    # writing each value twice); wider ones rows of tw + 1, whose last column is no tile
    compact = tw < COMPACT_BELOW
    rw = tw if compact else tw + 1
    F = th * rw                              # an image's tiles (and, in rows of tw + 1, non-tiles)
    ps = (th + 1) * rw + L + rw + 1          # a plane of the split, room for the last vector's reads
    nb = max(1, min(hi - lo, (BLOCK_TILES + F - 1) // F))
    T = (nb * F + L - 1) // L * L            # a product's row: a block's tiles in whole vectors
    # the pitch of V, M and the outputs: a vector longer than T, since a row's last tile vector may
    # end past T (and a multiple of 4 KB would put OUT_TILE's 16 reads in one L1 set)
    pitch = T + L
    cols = ACROSS * L
    wide_end = T - T % cols if Co >= 4 else 0     # columns in PRODUCT tiles; the rest in TALL ones
    tall = 12 if Co >= 12 else (4 if Co >= 4 else 1)
    x, u = operand(v, n, 2), operand(v, n, 3)
    out, first_out = output_into(v, n)
    planes = np.zeros((8 if compact else 4) * ps, out.dtype)     # the padding stays zero: x's places are written
    # not zeroed (a call's scratch is ~0.6 MB: zeroing it cost as much as the products); every
    # column the products read is written below, the ones past a block's tiles with zeros
    vt = np.empty(16 * Ci * pitch, out.dtype)
    mt = np.empty(16 * Co * pitch, out.dtype)
    yt = np.empty(4 * pitch, out.dtype)
    for b0 in range(lo, hi, nb):
        b1 = min(b0 + nb, hi)
        for img in range(b0, b1):            # 1 and 2: V, image after image along each row
            for c in range(Ci):
                _split_parities(planes, ps, rw, x, (img * Ci + c) * H * W, H, W, ph, pw, compact)
                IN_TILE(data_pointer(planes), ps, rw, 4 * ps if compact else 1,
                        data_pointer(vt[c * pitch + (img - b0) * F:]), Ci * pitch, (F + L - 1) // L)
        written = (b1 - b0 - 1) * F + (F + L - 1) // L * L
        for row in range(16 * Ci if written < T else 0):
            for q in range(written, T):
                vt[row * pitch + q] = 0.0
        for k in range(16):                  # 3: the products, M[k] = U[k] @ V[k]
            uk, vk, mk = k * Co * Ci, k * Ci * pitch, k * Co * pitch
            for m0 in range(0, Co if wide_end else 0, 4):
                r = min(m0, Co - 4)
                for q in range(0, wide_end, cols):
                    PRODUCT(data_pointer(vt[vk + q:]), data_pointer(u[uk + r * Ci:]),
                            data_pointer(mt[mk + r * pitch + q:]), 1, 1, Ci, 0, 0, pitch, 0, 0, 1, Ci, 0, pitch, 0, 0)
            for m0 in range(0, Co if wide_end < T else 0, tall):
                r = min(m0, Co - tall)
                for q in range(wide_end, T, L):
                    xp, wp = data_pointer(vt[vk + q:]), data_pointer(u[uk + r * Ci:])
                    op = data_pointer(mt[mk + r * pitch + q:])
                    if tall == 12:
                        TALL(xp, wp, op, 1, 1, Ci, 0, 0, pitch, 0, 0, 1, Ci, 0, pitch, 0, 0)
                    elif tall == 4:
                        TALL4(xp, wp, op, 1, 1, Ci, 0, 0, pitch, 0, 0, 1, Ci, 0, pitch, 0, 0)
                    else:
                        TALL1(xp, wp, op, 1, 1, Ci, 0, 0, pitch, 0, 0, 1, Ci, 0, pitch, 0, 0)
        for co in range(Co):                 # 4: A^T M A, and each tile's outputs into place
            OUT_TILE(data_pointer(mt[co * pitch:]), Co * pitch, data_pointer(yt), pitch, T // L)
            for img in range(b0, b1):
                for y in range(OH):
                    ty, a = y // 2, y % 2
                    even = U(2 * a * pitch + (img - b0) * F + ty * rw)
                    odd = even + U(pitch)
                    row = U((img * Co + co) * OH * OW + y * OW - first_out)
                    for t in range(U(OW // 2)):
                        out[row + U(2) * t] = yt[even + t]
                        out[row + U(2) * t + U(1)] = yt[odd + t]
                    if OW % 2:
                        out[row + U(OW - 1)] = yt[even + U(OW // 2)]
    return OK
