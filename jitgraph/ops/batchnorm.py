"""Batch normalization over axis 1 of (N, C) or (N, C, *spatial) tensors, with running
statistics that recomputation cannot update twice.

Kernels see x as (N, C, S), S the product of the spatial dims; a channel's statistics
run over M = N * S values.  Every node of the family has C and S in its ``channels`` and
``spatial`` parameters (the same slots in every op's declaration).

* ``batch_stats(x)`` -> (2, C): the batch mean and biased variance.  running_mean,
  running_var: the node ids of the consts it updates (-1: none); momentum.
* ``batch_norm(x, stats, [weight], [bias])`` -> ``(x - mean) w rstd + b``, rstd =
  1 / sqrt(var + eps); has_weight, has_bias, training.
  ``stats`` is ``batch_stats(x)`` in training, a concat of the running consts in evaluation.
* ``batch_norm_sums(g, x, stats)`` -> (4, C): mean, var, sum(g xhat) (the weight's
  gradient) and sum(g) (the bias's), xhat = (x - mean) rstd.
* ``batch_norm_dx``: mode 1, ``(g, x, sums, [w])`` -> training's three-term gradient
  ``w rstd (g - mean(g) - xhat mean(g xhat))``; 0, ``(g, stats, [w])`` -> g w rstd
  (evaluation); 2, ``(g, x, stats)`` -> batch_stats' own gradient.

In training the gradient of x goes through the batch statistics too, so the rule of
batch_norm's x slot returns all of it and its stats slot nothing: stats is always
``batch_stats`` of the same x (the builder makes both).  The weight and bias gradients
are rows of the one sums node the x gradient reads.  batch_stats' own rule serves a
gradient reaching it otherwise (build_backward without the zero table).

Exactly once: every program gives each original (not recomputed) ``batch_stats`` node a
persistent io slot, and every checkpoint plan keeps them (2 C floats: none is ever
recomputed).  After a run has finished without error, ``RunningStats`` applies
PyTorch's momentum rule from those slots to the consts in one jitted call over all
layers -- once per node of the program, and not at all if the run raises (running.py).

Units of work: channels for the reductions (split CUSTOM; float64 sums in a fixed order,
so results never depend on the thread count); planes of S (rows of C when S = 1) for the
elementwise passes, which may run in place over x or g.
"""
import math
import numbers
from typing import Any, Optional

import numpy as np
from numba import njit

from enum import IntEnum

from ..errors import GraphError
from ..graph import Tensor
from ..native import RUN_EXTENT, operand, output, run_view, same_data, span
from ..registry import (BATCH_NORM, BATCH_NORM_DX, BATCH_NORM_SUMS, BATCH_STATS, COMPUTE, CUSTOM, ELEMENTWISE, NO_GRAD,
                        defop, slots)
from ..rules import either, op
from ..status import OK
from ..reductions import sum8
from ..vmath import in_dtype_of
from .common import need_tensor
from .shape import concat, reshape

CHANNELS, SPATIAL = 3, 4          # every op of the family: (C, S) in these int slots


class BatchStatsIP(IntEnum):
    running_mean = 0              # node ids of the consts it updates (-1: none)
    running_var = 1
    channels = CHANNELS
    spatial = SPATIAL


class BatchNormIP(IntEnum):
    has_weight = 0
    has_bias = 1
    training = 2
    channels = CHANNELS
    spatial = SPATIAL


class SumsIP(IntEnum):            # batch_norm_sums
    channels = CHANNELS
    spatial = SPATIAL


class DxIP(IntEnum):              # batch_norm_dx
    has_weight = 0
    mode = 2                      # EVALUATION, TRAINING or STATS_GRADIENT
    channels = CHANNELS
    spatial = SPATIAL


class EpsFP(IntEnum):             # batch_norm, batch_norm_sums, batch_norm_dx
    eps = 0


class MomentumFP(IntEnum):        # batch_stats
    momentum = 0


EVALUATION, TRAINING, STATS_GRADIENT = 0, 1, 2    # batch_norm_dx's modes


# ---- builders ---------------------------------------------------------------------------------------
def _number(value: Any, what: str, name: str, lo: float, hi: float) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not lo <= float(value) <= min(hi, 1e308):
        raise GraphError(f"{what}: {name} must be a finite number in [{lo}, {hi}], got {value!r}")     # NaN too
    return float(value)


def _layout(x: Tensor, what: str):
    """(C, S) of x seen as (N, C, S)."""
    if x.ndim < 2:
        raise GraphError(f"{what} of {x.label!r}: x must be (N, C) or (N, C, *spatial), got shape {x.shape}")
    return x.shape[1], int(np.prod(x.shape[2:], dtype=np.int64))


def _per_channel(t: Any, x: Tensor, C: int, what: str, name: str) -> Optional[Tensor]:
    if t is None:
        return None
    if not isinstance(t, Tensor) or t.graph is not x.graph:
        raise GraphError(f"{what} of {x.label!r}: {name} must be a tensor of its graph, got {type(t).__name__}")
    if t.shape != (C,):
        raise GraphError(f"{what} of {x.label!r}: {name} {t.label!r} has shape {t.shape}, expected ({C},) "
                         f"(one value per channel, axis 1)")
    return t


def batch_stats(x: Tensor, running_mean: Optional[Tensor] = None, running_var: Optional[Tensor] = None,
                momentum: float = 0.1) -> Tensor:
    """(2, C): the mean and biased variance of each channel of x over every other axis.
    With running_mean / running_var (consts of shape (C,)), each run of a program holding
    this node updates them once (see the module docstring)."""
    x = need_tensor(x, "batch_stats")
    C, S = _layout(x, "batch_stats")
    rm = running_mean.id if running_mean is not None else -1
    rv = running_var.id if running_var is not None else -1
    return x.graph._node(BATCH_STATS, (x.id,), (2, C), ip=slots(BatchStatsIP, running_mean=rm, running_var=rv,
                                                                  channels=C, spatial=S),
                         fp=slots(MomentumFP, momentum=momentum))


def batch_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               running_mean: Optional[Tensor] = None, running_var: Optional[Tensor] = None,
               training: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over axis 1 of x, (N, C) or (N, C, *spatial), as PyTorch's
    ``F.batch_norm``: ``(x - mean) / sqrt(var + eps) * weight + bias`` per channel.

    ``training=True``: mean and biased variance of the batch (over N and the spatial
    axes); the gradient flows through them.  After every successful run of a program
    holding the node, ``running_mean`` and ``running_var`` (consts of shape (C,) made
    with ``g.const``; both or neither) become ``(1 - momentum) * running + momentum *
    batch`` (the variance unbiased) -- exactly once per run, however often checkpointing
    recomputes the layer.  ``training=False``: the running statistics normalize (an
    affine map per channel; gradients flow to x, weight and bias).  ``weight`` and
    ``bias`` are optional (C,) tensors, usually params."""
    what = "batch_norm"
    x = need_tensor(x, what)
    C, S = _layout(x, what)
    w = _per_channel(weight, x, C, what, "weight")
    b = _per_channel(bias, x, C, what, "bias")
    rm = _per_channel(running_mean, x, C, what, "running_mean")
    rv = _per_channel(running_var, x, C, what, "running_var")
    if (rm is None) != (rv is None):
        given = "running_mean" if rm is not None else "running_var"
        raise GraphError(f"{what} of {x.label!r}: pass both running_mean and running_var or neither, got only {given}")
    for name, t in (("running_mean", rm), ("running_var", rv)):
        if t is not None and t.op != "const":
            raise GraphError(f"{what} of {x.label!r}: {name} {t.label!r} must be a const (g.const(np.zeros(C))), "
                             f"got a {t.op} node")
    if rm is not None and rv is not None and rm.id == rv.id:
        raise GraphError(f"{what} of {x.label!r}: running_mean and running_var are the same tensor {rm.label!r}")
    if not isinstance(training, (bool, np.bool_)):
        raise GraphError(f"{what} of {x.label!r}: training must be True or False, got {training!r}")
    momentum = _number(momentum, f"{what} of {x.label!r}", "momentum", 0.0, 1.0)
    eps = _number(eps, f"{what} of {x.label!r}", "eps", 0.0, math.inf)
    M = x.size // C
    if training:
        if M < 2:
            raise GraphError(f"{what} of {x.label!r}: training needs more than one value per channel, got "
                             f"{M} (shape {x.shape}: N times the spatial size)")
        stats = batch_stats(x, rm, rv, momentum)
    elif rm is None or rv is None:
        raise GraphError(f"{what} of {x.label!r}: evaluation (training=False) needs running_mean and running_var")
    else:
        stats = concat([reshape(rm, (1, C)), reshape(rv, (1, C))], axis=0)
    srcs = [x.id, stats.id] + [t.id for t in (w, b) if t is not None]
    return x.graph._node(BATCH_NORM, tuple(srcs), x.shape, ip=slots(BatchNormIP, has_weight=int(w is not None),
                                                                     has_bias=int(b is not None),
                                                                     training=int(bool(training)), channels=C, spatial=S),
                         fp=slots(EpsFP, eps=eps))


def batch_norm_sums(g: Tensor, x: Tensor, stats: Tensor, eps: float = 1e-5) -> Tensor:
    """(4, C): the mean and variance of ``stats`` (2, C), then per channel sum(g xhat) and
    sum(g), xhat = (x - mean) / sqrt(var + eps)."""
    g, x, stats = (need_tensor(t, "batch_norm_sums") for t in (g, x, stats))
    C, S = _layout(x, "batch_norm_sums")
    if g.shape != x.shape or stats.shape != (2, C):
        raise GraphError(f"batch_norm_sums: {g.label!r} {g.shape}, {x.label!r} {x.shape} and {stats.label!r} "
                         f"{stats.shape} must be g and x of one shape and (2, C)")
    return x.graph._node(BATCH_NORM_SUMS, (g.id, x.id, stats.id), (4, C), ip=slots(SumsIP, channels=C, spatial=S),
                         fp=slots(EpsFP, eps=_number(eps, "batch_norm_sums", "eps", 0.0, math.inf)))


def batch_norm_dx(g: Tensor, x: Tensor, p: Tensor, weight: Optional[Tensor] = None, training: bool = True,
                  eps: float = 1e-5) -> Tensor:
    """batch_norm's gradient of x for its output's gradient g: in training ``p`` is the
    batch_norm_sums (4, C); in evaluation the (2, C) statistics (x gives only the shape)."""
    g, x, p = (need_tensor(t, "batch_norm_dx") for t in (g, x, p))
    C, S = _layout(x, "batch_norm_dx")
    w = _per_channel(weight, x, C, "batch_norm_dx", "weight")
    if g.shape != x.shape or p.shape != ((4, C) if training else (2, C)):
        raise GraphError(f"batch_norm_dx: {g.label!r} {g.shape}, {x.label!r} {x.shape} and {p.label!r} {p.shape} "
                         f"must be g and x of one shape and ({4 if training else 2}, C)")
    srcs = [g.id] + ([x.id] if training else []) + [p.id] + ([w.id] if w is not None else [])
    return x.graph._node(BATCH_NORM_DX, tuple(srcs), x.shape,
                         ip=slots(DxIP, has_weight=int(w is not None), mode=TRAINING if training else EVALUATION,
                                  channels=C, spatial=S),
                         fp=slots(EpsFP, eps=_number(eps, "batch_norm_dx", "eps", 0.0, math.inf)))


# ---- kernels ----------------------------------------------------------------------------------------
WIDTH = 1024      # float64 accumulators of a channel: a plane is added into them WIDTH elements at a time


@njit(cache=True, error_model="numpy")
def _plane_sums(acc, ad, g, x, b, S, mu, what):
    """Add the plane of S elements at b into the accumulators, chunk by chunk: (what 0)
    acc += x; (1) acc += (x - mu)^2; (2) acc += g, ad += g (x - mu).  Elementwise adds, so
    they vectorize without a chain of dependent additions, in float64."""
    W = acc.size
    for o in range(0, S, W):
        m = min(W, S - o)
        xs = x[b + o:b + o + m]
        if what == 0:
            for j in range(m):
                acc[j] += xs[j]
        elif what == 1:
            for j in range(m):
                d = np.float64(xs[j] - mu)
                acc[j] += d * d
        else:
            gs = g[b + o:b + o + m]
            for j in range(m):
                acc[j] += gs[j]
                ad[j] += gs[j] * (xs[j] - mu)


# Planes of at most WIDTH elements: WIDTH // S channels at a time, whose planes lie side by side
# in each image, so an image adds one contiguous run into the accumulators (channel c's at
# [c S, c S + S)) where a plane at a time read short runs far apart (8 x 8 planes: 0.83 ns an
# element for the statistics, the prefetcher lost between planes).  Each accumulator adds the
# same values in the same order as a plane at a time did, and sum8 reads the same S of them:
# the same bits.
@njit(cache=True, error_model="numpy")
def _stats_by_block(out, x, C, S, lo, hi):
    N = x.size // (C * S)
    M = N * S
    per = max(1, WIDTH // S)
    acc = np.empty(per * S, np.float64)
    mu = np.empty(per, x.dtype)
    for c0 in range(lo, hi, per):
        k = min(per, hi - c0)
        run = k * S
        for j in range(run):
            acc[j] = 0.0
        for i in range(N):
            xs = x[(i * C + c0) * S:(i * C + c0) * S + run]
            for j in range(run):
                acc[j] += xs[j]
        for c in range(k):
            mu[c] = in_dtype_of(x, sum8(acc[c * S:c * S + S]) / M)
            out[c0 + c] = mu[c]
        for j in range(run):
            acc[j] = 0.0
        for i in range(N):
            for c in range(k):
                m, xs, a = mu[c], x[((i * C + c0 + c) * S):((i * C + c0 + c) * S + S)], acc[c * S:c * S + S]
                for j in range(S):
                    d = np.float64(xs[j] - m)
                    a[j] += d * d
        for c in range(k):
            out[C + c0 + c] = sum8(acc[c * S:c * S + S]) / M
    return OK


@njit(cache=True, error_model="numpy")
def _sums_by_block(out, g, x, p, C, S, eps, lo, hi):
    N = x.size // (C * S)
    per = max(1, WIDTH // S)
    sg = np.empty(per * S, np.float64)
    sd = np.empty(per * S, np.float64)
    for c0 in range(lo, hi, per):
        k = min(per, hi - c0)
        for j in range(k * S):
            sg[j] = 0.0
            sd[j] = 0.0
        for i in range(N):
            for c in range(k):
                b, o, m = (i * C + c0 + c) * S, c * S, p[c0 + c]
                gs, xs, ag, ad = g[b:b + S], x[b:b + S], sg[o:o + S], sd[o:o + S]
                for j in range(S):
                    ag[j] += gs[j]
                    ad[j] += gs[j] * (xs[j] - m)
        for c in range(c0, c0 + k):
            o = (c - c0) * S
            out[c] = p[c]
            out[C + c] = p[C + c]
            out[2 * C + c] = sum8(sd[o:o + S]) / np.sqrt(np.float64(p[C + c]) + eps)
            out[3 * C + c] = sum8(sg[o:o + S])
    return OK


@njit(cache=True, error_model="numpy")
def stats_kernel(out, x, C, S, lo, hi):
    """Channels [lo, hi) of out (2, C): mean and biased variance of x (N, C, S), two passes."""
    N = x.size // (C * S)
    M = N * S
    if S == 1:                                   # rows of C: running sums down the columns
        m = hi - lo
        acc = np.zeros(m, np.float64)
        for r in range(N):
            row = x[r * C + lo:r * C + hi]
            for j in range(m):
                acc[j] += row[j]
        mu = out[lo:hi]
        for j in range(m):
            mu[j] = acc[j] / M
            acc[j] = 0.0
        for r in range(N):
            row = x[r * C + lo:r * C + hi]
            for j in range(m):
                d = np.float64(row[j] - mu[j])
                acc[j] += d * d
        var = out[C + lo:C + hi]
        for j in range(m):
            var[j] = acc[j] / M
        return OK
    if S <= WIDTH:
        return _stats_by_block(out, x, C, S, lo, hi)
    acc = np.empty(WIDTH, np.float64)
    for c in range(lo, hi):
        mu = in_dtype_of(x, 0.0)
        for what in range(2):                    # the mean, then squares around it
            acc[:] = 0.0
            for i in range(N):
                _plane_sums(acc, acc, x, x, (i * C + c) * S, S, mu, what)
            if what == 0:
                mu = in_dtype_of(x, sum8(acc) / M)
        out[c] = mu
        out[C + c] = sum8(acc) / M
    return OK


@njit(cache=True, error_model="numpy")
def sums_kernel(out, g, x, p, C, S, eps, lo, hi):
    """Channels [lo, hi) of out (4, C): p's mean and variance, sum(g xhat), sum(g)."""
    N = x.size // (C * S)
    if S == 1:
        m = hi - lo
        sg = np.zeros(m, np.float64)
        sd = np.zeros(m, np.float64)
        mu = p[lo:hi]
        for r in range(N):
            gr = g[r * C + lo:r * C + hi]
            xr = x[r * C + lo:r * C + hi]
            for j in range(m):
                sg[j] += gr[j]
                sd[j] += gr[j] * (xr[j] - mu[j])
        for j in range(m):
            c = lo + j
            out[c] = p[c]
            out[C + c] = p[C + c]
            out[2 * C + c] = sd[j] / np.sqrt(np.float64(p[C + c]) + eps)
            out[3 * C + c] = sg[j]
        return OK
    if S <= WIDTH:
        return _sums_by_block(out, g, x, p, C, S, eps, lo, hi)
    sg = np.empty(WIDTH, np.float64)
    sd = np.empty(WIDTH, np.float64)
    for c in range(lo, hi):
        sg[:] = 0.0
        sd[:] = 0.0
        for i in range(N):
            _plane_sums(sg, sd, g, x, (i * C + c) * S, S, p[c], 2)
        out[c] = p[c]
        out[C + c] = p[C + c]
        out[2 * C + c] = sum8(sd) / np.sqrt(np.float64(p[C + c]) + eps)
        out[3 * C + c] = sum8(sg)
    return OK


@njit(cache=True, error_model="numpy")
def coefficients(like, p, w, b, has_w, has_b, C, M, eps, mode):
    """Per channel (A, B, MU, K), float64 math stored in the graph's dtype, of
    mode 0, batch_norm:          y = A (x - MU) + K,        A = w rstd, K = bias;
    mode 1, training gradient:   y = A g + B (x - MU) + K,  p = batch_norm_sums:
                                 A (g - sum(g)/M - xhat sum(g xhat)/M);
    mode 2, evaluation gradient: y = A (g - 0) + 0;
    mode 3, batch_stats' gradient (b = its gradient [gmean; gvar]): y = 2 gvar / M (x - mean) + gmean / M."""
    co = np.empty((4, C), like.dtype)
    for c in range(C):
        r = 1.0 / np.sqrt(np.float64(p[C + c]) + eps)
        k1 = r * w[c] if has_w else r
        co[0, c] = k1 if mode != 3 else 2.0 * np.float64(b[C + c]) / M
        co[1, c] = -k1 * r * np.float64(p[2 * C + c]) / M if mode == 1 else 0.0
        co[2, c] = p[c] if mode != 2 else 0.0
        if mode == 0:
            co[3, c] = b[c] if has_b else 0.0
        elif mode == 1:
            co[3, c] = -k1 * np.float64(p[3 * C + c]) / M
        else:
            co[3, c] = np.float64(b[c]) / M if mode == 3 else 0.0
    return co


# Runs of the passes.  In place, a loop reads y itself: with a separate name for the same
# memory, LLVM's overlap check would pick its scalar loop.
@njit(cache=True, error_model="numpy")
def _affine(y, us, a, mu, k, m):
    """y[j] = a (u[j] - mu) + k."""
    if same_data(y, us):
        for j in range(m):
            y[j] = a * (y[j] - mu) + k
    else:
        for j in range(m):
            y[j] = a * (us[j] - mu) + k


@njit(cache=True, error_model="numpy")
def _affine_row(y, us, A, MU, K, m):
    if same_data(y, us):
        for j in range(m):
            y[j] = A[j] * (y[j] - MU[j]) + K[j]
    else:
        for j in range(m):
            y[j] = A[j] * (us[j] - MU[j]) + K[j]


@njit(cache=True, error_model="numpy")
def _grad(y, gs, xs, a, b, mu, k, m):
    """y[j] = a g[j] + b (x[j] - mu) + k."""
    if same_data(y, gs):
        for j in range(m):
            y[j] = a * y[j] + b * (xs[j] - mu) + k
    elif same_data(y, xs):
        for j in range(m):
            y[j] = a * gs[j] + b * (y[j] - mu) + k
    else:
        for j in range(m):
            y[j] = a * gs[j] + b * (xs[j] - mu) + k


@njit(cache=True, error_model="numpy")
def _grad_row(y, gs, xs, A, B, MU, K, m):
    if same_data(y, gs):
        for j in range(m):
            y[j] = A[j] * y[j] + B[j] * (xs[j] - MU[j]) + K[j]
    elif same_data(y, xs):
        for j in range(m):
            y[j] = A[j] * gs[j] + B[j] * (y[j] - MU[j]) + K[j]
    else:
        for j in range(m):
            y[j] = A[j] * gs[j] + B[j] * (xs[j] - MU[j]) + K[j]


@njit(cache=True, error_model="numpy")
def channel_pass(out, u, x, co, C, S, two, lo, hi):
    """Units [lo, hi) -- planes of S, or rows of C when S = 1 -- of y = A (u - MU) + K, or
    with ``two`` y = A u + B (x - MU) + K."""
    A, B, MU, K = co[0], co[1], co[2], co[3]
    if S == 1:
        for r in range(lo, hi):
            y = out[r * C:(r + 1) * C]
            if two:
                _grad_row(y, u[r * C:(r + 1) * C], x[r * C:(r + 1) * C], A, B, MU, K, C)
            else:
                _affine_row(y, u[r * C:(r + 1) * C], A, MU, K, C)
        return OK
    for q in range(lo, hi):
        c = q % C
        y = out[q * S:(q + 1) * S]
        if two:
            _grad(y, u[q * S:(q + 1) * S], x[q * S:(q + 1) * S], A[c], B[c], MU[c], K[c], S)
        else:
            _affine(y, u[q * S:(q + 1) * S], A[c], MU[c], K[c], S)
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _elementwise(v, n, lo, hi, out, u, x, p, w, b, has_w, has_b, mode):
    """The runner of batch_norm and batch_norm_dx (split CUSTOM): units are planes (rows
    when S = 1).  When the planner made the output overwrite a per-channel source (an
    equal element count: M = 2 or 4), one call does all, coefficients first."""
    C = v.ip[n, CHANNELS]
    S = v.ip[n, SPATIAL]
    units = out.size // (C if S == 1 else S)
    one = same_data(out, p) or (has_w and same_data(out, w)) or (has_b and same_data(out, b))
    if lo < 0:
        v.ctx[RUN_EXTENT] = 1 if one else units
        return OK
    lo, hi = (0, units) if one else span(lo, hi, units)
    co = coefficients(out, p, w, b, has_w, has_b, C, out.size // C, v.fp[n, EpsFP.eps], mode)
    return channel_pass(out, u, x, co, C, S, mode == 1, lo, hi)


# ---- runners, rules and the op table ---------------------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _by_channel(v, n, lo, hi):
    """(lo, hi) of a reduction whose units are channels, or -1 after reporting them."""
    C = v.ip[n, CHANNELS]
    if lo < 0:
        v.ctx[RUN_EXTENT] = C
        return -1, -1
    return span(lo, hi, C)


def _run_batch_stats(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    lo, hi = _by_channel(v, n, lo, hi)
    if lo < 0:
        return OK
    return stats_kernel(output(v, n), operand(v, n, 0), v.ip[n, CHANNELS], v.ip[n, SPATIAL], lo, hi)


def _batch_stats_vjp(g, x, out, channels, spatial):      # batch_norm_dx of mode STATS_GRADIENT: (g, x, stats)
    return op.batch_norm_dx(g, x, out, like=x, mode=STATS_GRADIENT, channels=channels, spatial=spatial)


defop(BATCH_STATS, "batch_stats", batch_stats, _run_batch_stats, _batch_stats_vjp, arity=1, cost=COMPUTE, flops=3,
      split=CUSTOM, public=False, ip=BatchStatsIP, fp=MomentumFP)


def _run_batch_norm(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    has_w = v.ip[n, BatchNormIP.has_weight] != 0
    has_b = v.ip[n, BatchNormIP.has_bias] != 0
    x = operand(v, n, 0)
    p = operand(v, n, 1)
    w = operand(v, n, 2) if has_w else p
    b = (operand(v, n, 3) if has_w else operand(v, n, 2)) if has_b else p
    return _elementwise(v, n, lo, hi, output(v, n), x, x, p, w, b, has_w, has_b, 0)


def _batch_norm_vjp(g, x, stats, p2, p3, has_weight, training, channels, spatial, eps):
    """x: batch_norm_dx, the whole gradient (through the batch statistics in training);
    the statistics: none, it is in x's; weight and bias (p2, p3: whichever are given, in
    that order): rows 2 (sum g xhat) and 3 (sum g) of the one batch_norm_sums node."""
    sums = op.batch_norm_sums(g, x, stats, like=stats, dims={2: 4}, channels=channels, spatial=spatial, eps=eps)
    weight = either(has_weight, p2, None)
    params = dict(like=x, has_weight=has_weight, mode=training, channels=channels, spatial=spatial, eps=eps)
    dx = either(training, op.batch_norm_dx(g, x, sums, weight, **params), op.batch_norm_dx(g, stats, weight, **params))
    return (dx, None, op.slice(sums, like=p2, axis=2, start=either(has_weight, 2, 3)),
            op.slice(sums, like=p3, axis=2, start=3))


defop(BATCH_NORM, "batch_norm", batch_norm, _run_batch_norm, _batch_norm_vjp, arity=-1, kind=ELEMENTWISE,
      flops=3, split=CUSTOM, sources=("x", "stats", "p2", "p3"), ip=BatchNormIP, fp=EpsFP)


def _run_batch_norm_sums(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    lo, hi = _by_channel(v, n, lo, hi)
    if lo < 0:
        return OK
    return sums_kernel(output(v, n), operand(v, n, 0), operand(v, n, 1), operand(v, n, 2), v.ip[n, CHANNELS],
                       v.ip[n, SPATIAL], v.fp[n, EpsFP.eps], lo, hi)


defop(BATCH_NORM_SUMS, "batch_norm_sums", batch_norm_sums, _run_batch_norm_sums, NO_GRAD, arity=3, cost=COMPUTE,
      flops=4, split=CUSTOM, public=False, sources=("g", "x", "stats"), ip=SumsIP, fp=EpsFP)


def _run_batch_norm_dx(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    has_w = v.ip[n, DxIP.has_weight] != 0
    g = operand(v, n, 0)
    if v.ip[n, DxIP.mode] == STATS_GRADIENT:     # batch_stats' gradient: (g (2, C), x, statistics)
        x = operand(v, n, 1)
        p = operand(v, n, 2)
        return _elementwise(v, n, lo, hi, output(v, n), x, x, p, p, g, False, True, 3)
    if v.ip[n, DxIP.mode] == TRAINING:           # training: (g, x, sums, [w])
        x = operand(v, n, 1)
        p = operand(v, n, 2)
        w = operand(v, n, 3) if has_w else p
        return _elementwise(v, n, lo, hi, output(v, n), g, x, p, w, p, has_w, False, 1)
    p = operand(v, n, 1)                         # evaluation: (g, stats, [w])
    w = operand(v, n, 2) if has_w else p
    return _elementwise(v, n, lo, hi, output(v, n), g, g, p, w, p, has_w, False, 2)


defop(BATCH_NORM_DX, "batch_norm_dx", batch_norm_dx, _run_batch_norm_dx, NO_GRAD, arity=-1, kind=ELEMENTWISE,
      flops=5, split=CUSTOM, public=False, ip=DxIP, fp=EpsFP)
