"""Neural-network ops: softmax, log_softmax, cross_entropy, layer_norm, rms_norm,
dropout and embedding (with scatter_add, its gradient).

Normalisations run over the last axis; softmax over any axis (ip[0], padded).
Dropout is counter-based: element i of a dropout node keeps its value iff
hash(seed, mask_id, i) >= p, where mask_id is the node's stable id.  A
recomputed copy or a gradient carries the same (seed, mask_id), so it sees the
same mask -- no RNG state to save or restore.
"""
import math
import numbers

import numpy as np
from numba import njit

from .._sigs import G as G_T, ST, f64, i64
from ..emit import new_node
from ..errors import GraphError
from ..graph import Tensor
from ..ir import F_GRAD, F_INDEX, MAX_DIMS
from ..registry import COMPUTE, ELEMENTWISE, MEMORY, OTHER, defop
from .common import KERNEL, as_tensor, graph_of, need_tensor, normalize_axis
from .elementwise import AFFINE, EXP, MUL, NO_CONTRIBUTION, NO_RULE, SQR, SUB
from .reduce import MEAN, SUM
from .shape import outer_inner

SOFTMAX = defop("softmax", 1, OTHER, COMPUTE, 12)
LOG_SOFTMAX = defop("log_softmax", 1, OTHER, COMPUTE, 12)
CROSS_ENTROPY = defop("cross_entropy", 2, OTHER, COMPUTE, 12)
LAYER_NORM = defop("layer_norm", 1, OTHER, COMPUTE, 8)
RMS_NORM = defop("rms_norm", 1, OTHER, COMPUTE, 6)
NORM_RSTD = defop("norm_rstd", 1, OTHER, COMPUTE, 4)   # 1/std (ip[0]=1) or 1/rms (ip[0]=0) per row
DROPOUT = defop("dropout", 1, ELEMENTWISE, MEMORY, 4)
EMBEDDING = defop("embedding", 2, OTHER, MEMORY)
SCATTER_ADD = defop("scatter_add", 2, OTHER, MEMORY)    # embedding's table gradient
FIRST_OP, LAST_OP = SOFTMAX, SCATTER_ADD

ERR_INDEX = 3      # status: an index out of range or not an integer

_MAX_EXACT_INDEX = {np.dtype(np.float32): 1 << 24, np.dtype(np.float64): 1 << 53}


# ---- Python shape rules -----------------------------------------------------------
def _along_axis(code, what, t, axis):
    t = need_tensor(t, what)
    if t.ndim == 0:
        raise GraphError(f"{what} of {t.label!r}: needs at least 1 dim")
    ax = normalize_axis(axis, t.ndim, f"{what} of {t.label!r}")
    return t.graph._node(code, (t.id,), t.shape, ip=(ax + MAX_DIMS - t.ndim,))


def softmax(t, axis=-1):
    """exp(t) / sum(exp(t)) along ``axis`` (max-shifted, so large logits are safe)."""
    return _along_axis(SOFTMAX, "softmax", t, axis)


def log_softmax(t, axis=-1):
    """t - logsumexp(t) along ``axis``."""
    return _along_axis(LOG_SOFTMAX, "log_softmax", t, axis)


def cross_entropy(logits, target_probs):
    """mean over rows of -sum(target * log_softmax(logits), axis=-1); a scalar."""
    g = graph_of("cross_entropy", logits, target_probs)
    logits = as_tensor(logits, g, "cross_entropy")
    target = as_tensor(target_probs, g, "cross_entropy")
    if logits.ndim == 0:
        raise GraphError(f"cross_entropy: logits {logits.label!r} need at least 1 dim")
    if target.shape != logits.shape:
        raise GraphError(f"cross_entropy: target {target.label!r} {target.shape} must have the shape "
                         f"of logits {logits.label!r} {logits.shape}")
    return g._node(CROSS_ENTROPY, (logits.id, target.id), ())


def _eps(eps, what):
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps >= 0 or math.isinf(eps):
        raise GraphError(f"{what}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def layer_norm(t, eps=1e-5):
    """(t - mean) / sqrt(var + eps) over the last axis (no affine part: multiply and add yourself)."""
    t = need_tensor(t, "layer_norm")
    if t.ndim == 0:
        raise GraphError(f"layer_norm of {t.label!r}: needs at least 1 dim")
    return t.graph._node(LAYER_NORM, (t.id,), t.shape, fp=(_eps(eps, f"layer_norm of {t.label!r}"),))


def rms_norm(t, eps=1e-6):
    """t / sqrt(mean(t^2) + eps) over the last axis."""
    t = need_tensor(t, "rms_norm")
    if t.ndim == 0:
        raise GraphError(f"rms_norm of {t.label!r}: needs at least 1 dim")
    return t.graph._node(RMS_NORM, (t.id,), t.shape, fp=(_eps(eps, f"rms_norm of {t.label!r}"),))


def dropout(t, p, seed=0):
    """Zero each element with probability p and scale the rest by 1/(1-p).

    The mask is a pure function of (seed, this node, element index): recomputing
    the node (checkpointing) or re-running the graph gives the same mask.  For fresh
    masks each training step, run with ``run(feeds, seed=step)``, which is added to
    every dropout's seed for that run.  p == 0 returns ``t`` itself.
    """
    t = need_tensor(t, "dropout")
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise GraphError(f"dropout of {t.label!r}: p must be a number in [0, 1), got {p!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise GraphError(f"dropout of {t.label!r}: seed must be an int, got {seed!r}")
    if p == 0.0:
        return t
    out = t.graph._node(DROPOUT, (t.id,), t.shape, fp=(float(p),))
    ip = t.graph.nodes.ip
    ip[out.id, 0] = int(seed) & 0x7FFFFFFFFFFFFFFF
    ip[out.id, 1] = out.id                      # the mask's identity: this node
    return out


def embedding(table, indices):
    """Rows of ``table`` (V, D) picked by integer ``indices`` -> shape indices.shape + (D,).

    ``indices`` is an integer input (``g.input(shape, dtype=np.int64)``) or an
    integer array (made a const).  Indices outside [0, V) raise at run time.
    """
    table = need_tensor(table, "embedding")
    g = table.graph
    if table.ndim != 2:
        raise GraphError(f"embedding: table {table.label!r} must be 2-D (V, D), got shape {table.shape}")
    V, D = table.shape
    if V > _MAX_EXACT_INDEX[g.dtype]:
        raise GraphError(f"embedding: table {table.label!r} has {V} rows, more than {g.dtype} indexes exactly")
    if isinstance(indices, Tensor):
        idx = as_tensor(indices, g, "embedding")
        if not int(g.nodes.flags[idx.id]) & F_INDEX:
            raise GraphError(f"embedding: indices {idx.label!r} must be an integer input "
                             "(g.input(shape, dtype=np.int64)) or an integer constant")
    else:
        arr = np.asarray(indices)
        if arr.dtype.kind not in "iu":
            raise GraphError(f"embedding: indices for {table.label!r} must be integers, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= V):
            raise GraphError(f"embedding: indices for {table.label!r} must lie in [0, {V}), "
                             f"got values in [{arr.min()}, {arr.max()}]")
        idx = g.const(arr)
    if idx.ndim + 1 > MAX_DIMS:
        raise GraphError(f"embedding: indices {idx.label!r} {idx.shape} would give more than {MAX_DIMS} dims")
    return g._node(EMBEDDING, (table.id, idx.id), idx.shape + (D,))


# ---- kernels ------------------------------------------------------------------------
@njit(**KERNEL)
def softmax_kernel(out, x, sx, axis, log):
    outer, inner = outer_inner(sx, axis)
    n = sx[axis]
    for o in range(outer):
        for q in range(inner):
            base = o * n * inner + q
            m = -np.inf
            for j in range(n):
                v = x[base + j * inner]
                if v > m or v != v:
                    m = v
            if m == -np.inf:      # a row of -inf: uniform rather than NaN
                m = 0.0
            s = 0.0
            for j in range(n):
                s += math.exp(x[base + j * inner] - m)
            if log:
                ls = math.log(s)
                for j in range(n):
                    out[base + j * inner] = x[base + j * inner] - m - ls
            else:
                r = 1.0 / s
                for j in range(n):
                    out[base + j * inner] = math.exp(x[base + j * inner] - m) * r


@njit(**KERNEL)
def cross_entropy_kernel(out, logits, target, sx):
    c = sx[3]
    rows = logits.size // c
    total = 0.0
    for r in range(rows):
        b = r * c
        m = -np.inf
        for j in range(c):
            if logits[b + j] > m:
                m = logits[b + j]
        s = 0.0
        tl = 0.0
        ts = 0.0
        for j in range(c):
            s += math.exp(logits[b + j] - m)
            tl += target[b + j] * logits[b + j]
            ts += target[b + j]
        total += tl - (m + math.log(s)) * ts
    out[0] = -total / rows


@njit(**KERNEL)
def _row_rstd(x, b, d, eps, center):
    mu = 0.0
    if center:
        for j in range(d):
            mu += x[b + j]
        mu /= d
    v = 0.0
    for j in range(d):
        c = x[b + j] - mu
        v += c * c
    return mu, 1.0 / math.sqrt(v / d + eps)


@njit(**KERNEL)
def norm_kernel(out, x, sx, eps, center):
    """layer_norm (center=True) or rms_norm over the last axis."""
    d = sx[3]
    for r in range(x.size // d):
        b = r * d
        mu, rstd = _row_rstd(x, b, d, eps, center)
        for j in range(d):
            out[b + j] = (x[b + j] - mu) * rstd


@njit(**KERNEL)
def norm_rstd_kernel(out, x, sx, eps, center):
    d = sx[3]
    for r in range(x.size // d):
        out[r] = _row_rstd(x, r * d, d, eps, center)[1]


@njit(cache=True, inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def _dropout_key(seed, mask_id):
    return _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(mask_id))


@njit(cache=True, inline="always")
def _dropout_u(key, i):
    z = _mix(key + np.uint64(i) * np.uint64(0xD1B54A32D192ED03))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)   # 53 bits -> [0, 1)


@njit(**KERNEL)
def dropout_uniform(seed, mask_id, i):
    """The uniform in [0, 1) that decides element i of mask (seed, mask_id); kept iff >= p."""
    return _dropout_u(_dropout_key(seed, mask_id), i)


@njit(**KERNEL)
def dropout_kernel(out, x, p, seed, mask_id):
    key = _dropout_key(seed, mask_id)
    keep_scale = 1.0 / (1.0 - p)
    for i in range(out.size):
        out[i] = x[i] * keep_scale if _dropout_u(key, i) >= p else 0.0 * x[i]


@njit(**KERNEL)
def embedding_kernel(out, table, idx, v, d):
    """Gather rows; returns the position of a bad index, or -1."""
    for i in range(idx.size):
        f = idx[i]
        k = int(f)
        if not (0 <= f < v) or k != f:
            return i
        for j in range(d):
            out[i * d + j] = table[k * d + j]
    return -1


@njit(**KERNEL)
def scatter_add_kernel(out, g, idx, v, d):
    for i in range(out.size):
        out[i] = 0.0
    for i in range(idx.size):
        f = idx[i]
        k = int(f)
        if not (0 <= f < v) or k != f:
            return i
        for j in range(d):
            out[k * d + j] += g[i * d + j]
    return -1


# ---- gradient rules (see elementwise.vjp) -------------------------------------------
@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64), cache=True)
def _node(G, st, op, a, b, like, n, k):
    return new_node(G, st, op, a, b, like, F_GRAD, n, k)


@njit(i64(G_T, ST, i64, i64, i64, i64, i64, i64), cache=True)
def _row_reduce(G, st, op, a, like, axis, n, k):
    """sum or mean of ``a`` over padded ``axis``, keeping it as size 1."""
    t = _node(G, st, op, a, -1, like, n, k)
    G[3][t, axis] = 1
    G[4][t, 0] = 1 << axis
    if op == MEAN:
        G[5][t, 0] = 1.0 / G[3][like, axis]
    return t


@njit(i64(G_T, ST, i64, f64, i64, i64), cache=True)
def _scaled(G, st, a, s, n, k):
    t = _node(G, st, AFFINE, a, -1, a, n, k)
    G[5][t, 0] = s
    return t


@njit(cache=True)
def vjp(G, st, n, k, g):
    src, shape, ip, fp = G[1], G[3], G[4], G[5]
    code = G[0][n]
    x = src[n, 0]
    y = src[n, 1]
    if code == SOFTMAX:                 # out * (g - sum(g * out))
        axis = ip[n, 0]
        t = _row_reduce(G, st, SUM, _node(G, st, MUL, g, n, n, n, k), n, axis, n, k)
        return _node(G, st, MUL, n, _node(G, st, SUB, g, t, n, n, k), n, n, k)
    if code == LOG_SOFTMAX:             # g - exp(out) * sum(g)
        axis = ip[n, 0]
        t = _row_reduce(G, st, SUM, g, n, axis, n, k)
        t = _node(G, st, MUL, _node(G, st, EXP, n, -1, n, n, k), t, n, n, k)
        return _node(G, st, SUB, g, t, n, n, k)
    if code == CROSS_ENTROPY:           # (softmax(l) - t) g / rows ;  -log_softmax(l) g / rows
        rows = 1
        for d in range(3):
            rows *= shape[x, d]
        if k == 0:
            s = _node(G, st, SOFTMAX, x, -1, x, n, k)
            ip[s, 0] = 3
            d = _node(G, st, SUB, s, y, x, n, k)
            return _node(G, st, MUL, d, _scaled(G, st, g, 1.0 / rows, n, k), x, n, k)
        s = _node(G, st, LOG_SOFTMAX, x, -1, x, n, k)
        ip[s, 0] = 3
        return _node(G, st, MUL, s, _scaled(G, st, g, -1.0 / rows, n, k), x, n, k)
    if code == LAYER_NORM or code == RMS_NORM:
        # layer: rstd (g - mean(g) - out mean(g out));  rms: rrms (g - out mean(g out))
        center = code == LAYER_NORM
        r = _node(G, st, NORM_RSTD, x, -1, x, n, k)
        shape[r, 3] = 1
        ip[r, 0] = 1 if center else 0
        fp[r, 0] = fp[n, 0]
        m = _row_reduce(G, st, MEAN, _node(G, st, MUL, g, n, n, n, k), n, 3, n, k)
        v = _node(G, st, SUB, g, _node(G, st, MUL, n, m, n, n, k), n, n, k)
        if center:
            v = _node(G, st, SUB, v, _row_reduce(G, st, MEAN, g, n, 3, n, k), n, n, k)
        return _node(G, st, MUL, v, r, n, n, k)
    if code == NORM_RSTD:               # d rstd / dx = -rstd^2 * norm(x) / D
        t = _node(G, st, MUL, g, _node(G, st, SQR, n, -1, n, n, k), n, n, k)
        t = _scaled(G, st, t, -1.0 / shape[x, 3], n, k)
        y_ = _node(G, st, LAYER_NORM if ip[n, 0] else RMS_NORM, x, -1, x, n, k)
        fp[y_, 0] = fp[n, 0]
        return _node(G, st, MUL, y_, t, x, n, k)
    if code == DROPOUT:                 # the same mask: same (seed, mask id)
        t = _node(G, st, DROPOUT, g, -1, g, n, k)
        ip[t, 0] = ip[n, 0]
        ip[t, 1] = ip[n, 1]
        fp[t, 0] = fp[n, 0]
        return t
    if code == EMBEDDING:               # rows of g added into the table's rows
        return _node(G, st, SCATTER_ADD, g, y, x, n, k) if k == 0 else NO_CONTRIBUTION
    if code == SCATTER_ADD:
        return _node(G, st, EMBEDDING, g, y, x, n, k) if k == 0 else NO_CONTRIBUTION
    return NO_RULE
