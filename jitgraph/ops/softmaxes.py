"""softmax and log_softmax along any axis, cross_entropy (mean over rows of the last
axis), and the fused backward kernels of all three.

Calling convention: a line is the run of elements along the softmax axis (ip[0],
padded); units of work are lines (split CUSTOM), a line is computed by one call.
On the last axis lines are contiguous and the kernels take a fast path: each exp
computed once, float32 math in float32 (vmath), sums with eight running partials.
The gradients are one node each -- ``softmax_d(g, y) = y (g - sum(g y))``,
``log_softmax_d(g, y) = g - exp(y) sum(g)`` and cross entropy's
``(softmax(x) sum(t) - t) g / rows`` -- with their own rules, so second order
still works.
"""
from enum import IntEnum
from typing import Optional, Union

import numpy as np
from numba import njit

from ..errors import GraphError
from ..graph import Operand, Tensor
from ..ir import F_INDEX, MAX_DIMS
from ..native import RUN_DETAIL, RUN_EXTENT, operand, output, run_view, same_data, span
from ..registry import (COMPUTE, CROSS_ENTROPY, CROSS_ENTROPY_D, CROSS_ENTROPY_INDEX, CROSS_ENTROPY_INDEX_D, CUSTOM,
                        LOG_SOFTMAX, LOG_SOFTMAX_D, ROWS, SOFTMAX, SOFTMAX_D, defop, slots)
from ..rules import op
from ..status import ERR_INDEX, OK
from .. import vmath
from ..reductions import dot8, max8, sum8
from ..vmath import in_dtype_of
from .common import as_tensor, graph_of, need_pair, need_tensor, normalize_axis
from .gather import MAX_EXACT_INDEX
from .reduce import rowsum
from .shape import outer_inner


class AxisIP(IntEnum):           # softmax, log_softmax and their gradients
    axis = 0                     # padded


class IgnoreIP(IntEnum):         # cross_entropy_index and its gradient
    has_ignore = 0               # 1: rows whose class is ignore_index are left out
    ignore_index = 1


# ---- the family's calling convention ------------------------------------------------------------
def _along_axis(code: int, what: str, t: Tensor, axis: int) -> Tensor:
    t = need_tensor(t, what)
    if t.ndim == 0:
        raise GraphError(f"{what} of {t.label!r}: needs at least 1 dim")
    ax = normalize_axis(axis, t.ndim, f"{what} of {t.label!r}")
    return t.graph._node(code, (t.id,), t.shape, ip=slots(AxisIP, axis=ax + MAX_DIMS - t.ndim))


@njit(cache=True, error_model="numpy", inline="always")
def lines(v, n, lo, hi):
    """(first line, end line, line length, stride) of node n's units [lo, hi); lo is -1
    after reporting the number of lines, when asked (lo < 0)."""
    sx = v.shape[n]
    axis = v.ip[n, AxisIP.axis]
    outer, inner = outer_inner(sx, axis)
    if lo < 0:
        v.ctx[RUN_EXTENT] = outer * inner
        return -1, -1, sx[axis], inner
    lo, hi = span(lo, hi, outer * inner)
    return lo, hi, sx[axis], inner


@njit(cache=True, error_model="numpy")
def _start(line, m, inner):
    """Index of the first element of a line (lines run along the axis with stride inner)."""
    return (line // inner) * m * inner + line % inner


# ---- softmax and log_softmax ----------------------------------------------------------------------
def softmax(t: Tensor, axis: int = -1) -> Tensor:
    """exp(t) / sum(exp(t)) along ``axis`` (max-shifted, so large logits are safe)."""
    return _along_axis(SOFTMAX, "softmax", t, axis)


def log_softmax(t: Tensor, axis: int = -1) -> Tensor:
    """t - logsumexp(t) along ``axis``."""
    return _along_axis(LOG_SOFTMAX, "log_softmax", t, axis)


@njit(cache=True, error_model="numpy")
def shifted_exps(o, xs):
    """o[j] = exp(xs[j] - max(xs)) for a contiguous row; returns the shift (0 for a row of
    -inf, which then comes out uniform rather than NaN)."""
    mx = max8(xs)
    mx = in_dtype_of(xs, 0.0) if mx == in_dtype_of(xs, -np.inf) else mx
    if same_data(o, xs):          # in place (softmax may take its source's buffer): one array, or
        for j in range(o.size):   # LLVM's overlap check picks its scalar loop (5.7 vs 1.6 ns an element)
            o[j] = vmath.exp_nonpositive(o[j] - mx)       # max-shifted: exp's bits, fewer selects
    else:
        for j in range(xs.size):
            o[j] = vmath.exp_nonpositive(xs[j] - mx)
    return mx


@njit(cache=True, error_model="numpy")
def softmax_lines(out, x, lo, hi, m, inner, log):
    """softmax (or log_softmax) of lines [lo, hi) of length m and stride inner."""
    zero = in_dtype_of(x, 0.0)
    ninf = in_dtype_of(x, -np.inf)
    for line in range(lo, hi):
        b = _start(line, m, inner)
        if inner == 1:                                    # contiguous: the fast path, on slices
            y = out[b:b + m]                              # indexed from 0 (see binary._run)
            xs = x[b:b + m]
            mx = shifted_exps(y, xs)
            s = sum8(y)
            if log:
                ls = vmath.log(s) + mx
                for j in range(m):
                    y[j] = xs[j] - ls
            else:
                r = in_dtype_of(x, 1.0) / s
                for j in range(m):
                    y[j] *= r
        else:
            mx = ninf
            for j in range(m):
                a = x[b + j * inner]
                if a > mx or a != a:
                    mx = a
            mx = zero if mx == ninf else mx
            s = zero
            for j in range(m):
                e = vmath.exp_nonpositive(x[b + j * inner] - mx)
                out[b + j * inner] = e
                s += e
            if log:
                ls = vmath.log(s) + mx
                for j in range(m):
                    out[b + j * inner] = x[b + j * inner] - ls
            else:
                r = in_dtype_of(x, 1.0) / s
                for j in range(m):
                    out[b + j * inner] *= r
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _softmax(v, n, lo, hi, log):
    lo, hi, m, inner = lines(v, n, lo, hi)
    if lo < 0:
        return OK
    return softmax_lines(output(v, n), operand(v, n, 0), lo, hi, m, inner, log)


def _run_softmax(n, lo, hi, ctx, mem, store):
    return _softmax(run_view(ctx, mem, store), n, lo, hi, False)


# softmax and the gradients read a line (a max, a sum) before writing it, element by element: their
# output may take the buffer of a dying source.  log_softmax reads x after writing exps: it may not.
defop(SOFTMAX, "softmax", softmax, _run_softmax, arity=1, cost=COMPUTE, flops=12, split=CUSTOM, ip=AxisIP,
      overwrites=True, vjp=lambda g, out, axis: op.softmax_d(g, out, like=out, axis=axis))        # y (g - sum(g y)): one node


def _run_log_softmax(n, lo, hi, ctx, mem, store):
    return _softmax(run_view(ctx, mem, store), n, lo, hi, True)


defop(LOG_SOFTMAX, "log_softmax", log_softmax, _run_log_softmax, arity=1, cost=COMPUTE, flops=12, split=CUSTOM,
      ip=AxisIP, vjp=lambda g, out, axis: op.log_softmax_d(g, out, like=out, axis=axis))   # g - exp(y) sum(g)


# ---- their gradients -------------------------------------------------------------------------------
def _grad_pair(code: int, what: str, g: Tensor, y: Tensor, axis: int) -> Tensor:
    g, y = need_pair(what, g, y)
    ax = normalize_axis(axis, y.ndim, f"{what} of {y.label!r}")
    return g.graph._node(code, (g.id, y.id), y.shape, ip=slots(AxisIP, axis=ax + MAX_DIMS - y.ndim))


def softmax_d(g: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    """softmax's vector-Jacobian product: y (g - sum(g y)) along ``axis``, y = softmax(x)."""
    return _grad_pair(SOFTMAX_D, "softmax_d", g, y, axis)


def log_softmax_d(g: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    """log_softmax's vector-Jacobian product: g - exp(y) sum(g) along ``axis``, y = log_softmax(x)."""
    return _grad_pair(LOG_SOFTMAX_D, "log_softmax_d", g, y, axis)


@njit(cache=True, error_model="numpy")
def softmax_d_lines(out, g, y, lo, hi, m, inner, log):
    for line in range(lo, hi):
        b = _start(line, m, inner)
        if inner == 1:
            o = out[b:b + m]
            gs = g[b:b + m]
            ys = y[b:b + m]
            # in place over g or y: that one array read and written (see shifted_exps)
            if log:
                s = sum8(gs)
                if same_data(o, gs):
                    for j in range(m):
                        o[j] = o[j] - vmath.exp(ys[j]) * s
                elif same_data(o, ys):
                    for j in range(m):
                        o[j] = gs[j] - vmath.exp(o[j]) * s
                else:
                    for j in range(m):
                        o[j] = gs[j] - vmath.exp(ys[j]) * s
            else:
                s = dot8(gs, ys)
                if same_data(o, gs):
                    for j in range(m):
                        o[j] = ys[j] * (o[j] - s)
                elif same_data(o, ys):
                    for j in range(m):
                        o[j] = o[j] * (gs[j] - s)
                else:
                    for j in range(m):
                        o[j] = ys[j] * (gs[j] - s)
        else:
            s = in_dtype_of(g, 0.0)
            for j in range(m):
                q = b + j * inner
                s += g[q] if log else g[q] * y[q]
            for j in range(m):
                q = b + j * inner
                out[q] = g[q] - vmath.exp(y[q]) * s if log else y[q] * (g[q] - s)
    return OK


@njit(cache=True, error_model="numpy", inline="always")
def _softmax_d(v, n, lo, hi, log):
    lo, hi, m, inner = lines(v, n, lo, hi)
    if lo < 0:
        return OK
    return softmax_d_lines(output(v, n), operand(v, n, 0), operand(v, n, 1), lo, hi, m, inner, log)


def _run_softmax_d(n, lo, hi, ctx, mem, store):
    return _softmax_d(run_view(ctx, mem, store), n, lo, hi, False)


def _softmax_d_vjp(h, g, y, axis):
    """out = y (g - s), s = sum(g y): through g, softmax_d(h, y); through y, h (g - s) - g sum(h y)."""
    s = rowsum(g * y, y, axis)
    hy = rowsum(h * y, y, axis)
    return op.softmax_d(h, y, like=y, axis=axis), h * (g - s) - g * hy


defop(SOFTMAX_D, "softmax_d", softmax_d, _run_softmax_d, _softmax_d_vjp, arity=2, cost=COMPUTE, flops=4,
      split=CUSTOM, public=False, sources=("g", "y"), ip=AxisIP, overwrites=True)


def _run_log_softmax_d(n, lo, hi, ctx, mem, store):
    return _softmax_d(run_view(ctx, mem, store), n, lo, hi, True)


def _log_softmax_d_vjp(h, g, y, axis):
    """out = g - exp(y) sum(g): through g, h - sum(h exp(y)); through y, -h exp(y) sum(g)."""
    return h - rowsum(h * op.exp(y), y, axis), -1.0 * (h * op.exp(y) * rowsum(g, y, axis))


defop(LOG_SOFTMAX_D, "log_softmax_d", log_softmax_d, _run_log_softmax_d, _log_softmax_d_vjp, arity=2,
      cost=COMPUTE, flops=10, split=CUSTOM, public=False, sources=("g", "y"), ip=AxisIP, overwrites=True)


# ---- cross_entropy --------------------------------------------------------------------------------
def cross_entropy(logits: Operand, targets: Union[Operand, np.ndarray], ignore_index: Optional[int] = None) -> Tensor:
    """The mean over rows (all axes but the last) of the cross entropy of ``logits`` (a
    scalar).  ``targets`` are probabilities shaped like logits (the row's loss is
    -sum(target * log_softmax(row)); rows need not sum to 1, a row of zeros adds nothing),
    or integer class ids shaped logits.shape[:-1] -- an index input
    (``g.input(shape, dtype=np.int64)``) or an integer array -- whose row loss is
    logsumexp(row) - row[class]; rows whose id equals ``ignore_index`` are left out of the
    loss and of the mean.  No one-hot array is ever built."""
    g = graph_of("cross_entropy", logits, targets)
    lg = as_tensor(logits, g, "cross_entropy")
    if lg.ndim == 0:
        raise GraphError(f"cross_entropy: logits {lg.label!r} need at least 1 dim")
    if is_class_targets(g, lg, targets):
        return cross_entropy_index(lg, targets, ignore_index)  # type: ignore[arg-type]  # checked just above
    if ignore_index is not None:
        raise GraphError("cross_entropy: ignore_index needs integer class targets shaped like logits "
                         f"{lg.label!r} {lg.shape} without the last axis")
    target = as_tensor(targets, g, "cross_entropy")
    if target.shape != lg.shape:
        raise GraphError(f"cross_entropy: target {target.label!r} {target.shape} must have the shape "
                         f"of logits {lg.label!r} {lg.shape} (probabilities), or {lg.shape[:-1]} (integer classes)")
    return g._node(CROSS_ENTROPY, (lg.id, target.id), ())


@njit(cache=True, error_model="numpy")
def _sum_of_exps(e, xs, m):
    """sum of exp(xs[j] - m), added in order: the exps go to scratch ``e`` first, a loop that
    vectorizes (a sum in order does not, and it took the exps with it: 5.4 ns an element)."""
    for j in range(xs.size):
        e[j] = vmath.exp_nonpositive(xs[j] - m)
    s = in_dtype_of(xs, 0.0)
    for j in range(xs.size):
        s += e[j]
    return s


@njit(cache=True, error_model="numpy")
def cross_entropy_kernel(out, logits, target, c):
    """-mean over rows of sum(target * log_softmax(logits)); float64 total."""
    rows = logits.size // c
    total = 0.0
    e = np.empty(c, logits.dtype)
    for r in range(rows):
        lg = logits[r * c:(r + 1) * c]
        tg = target[r * c:(r + 1) * c]
        m = max8(lg)
        s = _sum_of_exps(e, lg, m)
        total += dot8(tg, lg) - (m + vmath.log(s)) * sum8(tg)
    out[0] = -total / rows
    return OK


def _run_cross_entropy(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    return cross_entropy_kernel(output(v, n), operand(v, n, 0), operand(v, n, 1), v.shape[v.src[n, 0], 3])


def _rows(x):
    """In a rule: the number of rows of x (every axis but the last)."""
    return x.shape[0] * x.shape[1] * x.shape[2]


def _cross_entropy_vjp(g, x, t):
    """loss = -mean over rows of sum(t log_softmax(x)): one fused node for x; -log_softmax(x) g / rows for t."""
    return op.cross_entropy_d(x, t, g, like=x), op.log_softmax(x, like=x, axis=3) * ((-1.0 / _rows(x)) * g)


defop(CROSS_ENTROPY, "cross_entropy", cross_entropy, _run_cross_entropy, _cross_entropy_vjp, arity=2,
      cost=COMPUTE, flops=12, sources=("x", "t"))


# ---- cross_entropy's gradient ----------------------------------------------------------------------
def cross_entropy_d(logits: Tensor, target_probs: Tensor, g: Tensor) -> Tensor:
    """cross_entropy's gradient with respect to the logits: (softmax(logits) sum(target) -
    target) g / rows, row by row (sum(target) is 1 for probabilities; a row of zero targets,
    a masked row, gets a zero gradient); g is the loss's incoming gradient, a scalar."""
    lg = need_tensor(logits, "cross_entropy_d")
    t = need_tensor(target_probs, "cross_entropy_d")
    gg = need_tensor(g, "cross_entropy_d")
    if lg.ndim == 0 or t.shape != lg.shape or gg.shape != () or lg.graph is not t.graph \
            or t.graph is not gg.graph:
        raise GraphError(f"cross_entropy_d: logits {lg.label!r} {lg.shape} and target {t.label!r} {t.shape} "
                         f"must share a shape (>= 1 dim) and g {gg.label!r} {gg.shape} must be a scalar, "
                         "all of one graph")
    return lg.graph._node(CROSS_ENTROPY_D, (lg.id, t.id, gg.id), lg.shape)


@njit(cache=True, error_model="numpy")
def cross_entropy_d_rows(out, x, t, scale, c, lo, hi):
    """Rows [lo, hi) (length c) of (softmax(x) sum(t) - t) scale."""
    for r in range(lo, hi):
        o = out[r * c:(r + 1) * c]
        ts = t[r * c:(r + 1) * c]
        shifted_exps(o, x[r * c:(r + 1) * c])
        k = sum8(ts) / sum8(o)
        for j in range(c):
            o[j] = (o[j] * k - ts[j]) * scale
    return OK


def _run_cross_entropy_d(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    c = v.shape[n, 3]
    rows = out.size // c
    lo, hi = span(lo, hi, rows)
    g = operand(v, n, 2)
    return cross_entropy_d_rows(out, operand(v, n, 0), operand(v, n, 1), in_dtype_of(out, g[0] / rows), c, lo, hi)


def _cross_entropy_d_vjp(h, x, t, g):
    """out = c (s T - t), s = softmax(x), T = sum(t) per row, c = g / rows.  Through x:
    c T softmax_d(h, s); through t: c (sum(h s) - h); through g: sum(h (s T - t)) / rows (the
    backward pass sums it down to g's shape).  Each recomputes s (and T) for itself."""
    c = 1.0 / _rows(x)
    s, total = op.softmax(x, like=x, axis=3), rowsum(t, x, 3)
    dx = op.softmax_d(h, s, like=x, axis=3) * total * (c * g)
    s = op.softmax(x, like=x, axis=3)
    dt = (rowsum(h * s, x, 3) - h) * (c * g)
    s, total = op.softmax(x, like=x, axis=3), rowsum(t, x, 3)
    return dx, dt, c * (h * (s * total - t))


defop(CROSS_ENTROPY_D, "cross_entropy_d", cross_entropy_d, _run_cross_entropy_d, _cross_entropy_d_vjp, arity=3,
      cost=COMPUTE, flops=14, split=ROWS, public=False, sources=("x", "t", "g"))


# ---- cross_entropy with integer class targets -------------------------------------------------------
def _class_targets(g, lg: Tensor, targets, ignore_index, what: str) -> Tensor:
    """An index tensor of class ids shaped logits.shape[:-1]: an index input, or an integer
    array (made a const) whose values lie in [0, C) or equal ``ignore_index``."""
    C = lg.shape[-1]
    if C > MAX_EXACT_INDEX[g.dtype]:
        raise GraphError(f"{what}: logits {lg.label!r} have {C} classes, more than {g.dtype} indexes exactly")
    if isinstance(targets, Tensor):
        idx = as_tensor(targets, g, what)
    else:
        arr = np.asarray(targets)
        ok = (arr >= 0) & (arr < C)
        if ignore_index is not None:
            ok |= arr == ignore_index
        if not ok.all():
            bad = arr[~ok].reshape(-1)[0]
            raise GraphError(f"{what}: class targets for {lg.label!r} must lie in [0, {C})"
                             + (f" or equal ignore_index {ignore_index}" if ignore_index is not None else "")
                             + f", got {bad}")
        idx = g.const(arr)
    if idx.shape != lg.shape[:-1]:
        raise GraphError(f"{what}: class targets {idx.label!r} {idx.shape} must have the shape of logits "
                         f"{lg.label!r} {lg.shape} without its last axis, {lg.shape[:-1]}")
    return idx


def _ignore_params(ignore_index) -> tuple:
    if ignore_index is None:
        return slots(IgnoreIP, has_ignore=0)
    if not isinstance(ignore_index, (int, np.integer)) or isinstance(ignore_index, bool):
        raise GraphError(f"cross_entropy: ignore_index must be an int or None, got {ignore_index!r}")
    return slots(IgnoreIP, has_ignore=1, ignore_index=int(ignore_index))


def is_class_targets(g, lg: Tensor, targets) -> bool:
    """Do ``targets`` name classes (integer, shaped logits.shape[:-1]) rather than
    probabilities (shaped like logits)?"""
    if isinstance(targets, Tensor):
        return bool(int(g.nodes.flags[targets.id]) & F_INDEX) and targets.shape == lg.shape[:-1]
    arr = np.asarray(targets)
    return arr.dtype.kind in "iu" and arr.shape == lg.shape[:-1]


def cross_entropy_index(logits: Tensor, targets: Union[Tensor, np.ndarray], ignore_index: Optional[int] = None) -> Tensor:
    """cross_entropy with integer class targets (``jg.cross_entropy`` calls it): the mean over
    the rows whose target is not ``ignore_index`` of logsumexp(row) - row[target]; 0 when
    every row is ignored."""
    lg = need_tensor(logits, "cross_entropy")
    if lg.ndim == 0:
        raise GraphError(f"cross_entropy: logits {lg.label!r} need at least 1 dim")
    idx = _class_targets(lg.graph, lg, targets, ignore_index, "cross_entropy")
    return lg.graph._node(CROSS_ENTROPY_INDEX, (lg.id, idx.id), (), ip=_ignore_params(ignore_index))


@njit(cache=True, error_model="numpy")
def _ignored(f, has_ignore, ignore):
    return has_ignore != 0 and f == ignore


IGNORED, BAD_CLASS = -1, -2


@njit(cache=True, error_model="numpy")
def _class_of(f, c, has_ignore, ignore):
    """The class id stored as f: an int in [0, c), or IGNORED, or BAD_CLASS."""
    if _ignored(f, has_ignore, ignore):
        return IGNORED
    k = int(f)
    return k if 0 <= f < c and k == f else BAD_CLASS


@njit(cache=True, error_model="numpy")
def cross_entropy_index_kernel(out, x, idx, c, has_ignore, ignore):
    """Mean of logsumexp(row) - row[target] over the rows not ignored (float64 total);
    returns the position of a bad target, or -1."""
    rows = x.size // c
    zero = in_dtype_of(x, 0.0)
    ninf = in_dtype_of(x, -np.inf)
    total = 0.0
    count = 0
    e = np.empty(c, x.dtype)
    for r in range(rows):
        k = _class_of(idx[r], c, has_ignore, ignore)
        if k == IGNORED:
            continue
        if k == BAD_CLASS:
            return r
        xs = x[r * c:(r + 1) * c]
        m = max8(xs)
        m = zero if m == ninf else m
        s = _sum_of_exps(e, xs, m)
        total += m + vmath.log(s) - xs[k]
        count += 1
    out[0] = total / count if count > 0 else 0.0
    return -1


def _run_cross_entropy_index(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    bad = cross_entropy_index_kernel(output(v, n), operand(v, n, 0), operand(v, n, 1), v.shape[v.src[n, 0], 3],
                                     v.ip[n, IgnoreIP.has_ignore], v.ip[n, IgnoreIP.ignore_index])
    if bad >= 0:
        v.ctx[RUN_DETAIL] = bad
        return ERR_INDEX
    return OK


defop(CROSS_ENTROPY_INDEX, "cross_entropy_index", cross_entropy_index, _run_cross_entropy_index, arity=2,
      cost=COMPUTE, flops=12, public=False, sources=("x", "classes"), ip=IgnoreIP,    # the class ids get no gradient
      vjp=lambda g, x, classes, has_ignore, ignore_index: (op.cross_entropy_index_d(
          x, classes, g, like=x, has_ignore=has_ignore, ignore_index=ignore_index), None))


def cross_entropy_index_d(logits: Tensor, targets: Union[Tensor, np.ndarray], g: Tensor,
                          ignore_index: Optional[int] = None) -> Tensor:
    """cross_entropy_index's gradient with respect to the logits: (softmax(row) - onehot(target))
    g / count on rows not ignored, 0 on ignored rows (g the loss's scalar gradient).  It has
    no gradient of its own: second order through integer targets is not supported."""
    lg = need_tensor(logits, "cross_entropy_index_d")
    gg = need_tensor(g, "cross_entropy_index_d")
    idx = _class_targets(lg.graph, lg, targets, ignore_index, "cross_entropy_index_d")
    if lg.ndim == 0 or gg.shape != () or gg.graph is not lg.graph:
        raise GraphError(f"cross_entropy_index_d: g {gg.label!r} {gg.shape} must be a scalar of the graph of "
                         f"logits {lg.label!r} (>= 1 dim)")
    return lg.graph._node(CROSS_ENTROPY_INDEX_D, (lg.id, idx.id, gg.id), lg.shape, ip=_ignore_params(ignore_index))


@njit(cache=True, error_model="numpy")
def cross_entropy_index_d_rows(out, x, idx, gval, c, has_ignore, ignore, lo, hi):
    """Rows [lo, hi) of the gradient; returns the position of a bad target, or -1."""
    rows = x.size // c
    count = 0
    for r in range(rows):                     # every block counts the rows (cheap, and thread-count free)
        if not _ignored(idx[r], has_ignore, ignore):
            count += 1
    scale = in_dtype_of(x, gval / count if count > 0 else 0.0)
    for r in range(lo, hi):
        o = out[r * c:(r + 1) * c]
        k = _class_of(idx[r], c, has_ignore, ignore)
        if k == IGNORED:
            for j in range(c):
                o[j] = in_dtype_of(x, 0.0)
            continue
        if k == BAD_CLASS:
            return r
        shifted_exps(o, x[r * c:(r + 1) * c])
        q = scale / sum8(o)
        for j in range(c):
            o[j] *= q
        o[k] -= scale
    return -1


def _run_cross_entropy_index_d(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    c = v.shape[n, 3]
    lo, hi = span(lo, hi, out.size // c)
    bad = cross_entropy_index_d_rows(out, operand(v, n, 0), operand(v, n, 1), operand(v, n, 2)[0], c,
                                     v.ip[n, IgnoreIP.has_ignore], v.ip[n, IgnoreIP.ignore_index], lo, hi)
    if bad >= 0:
        v.ctx[RUN_DETAIL] = bad
        return ERR_INDEX
    return OK


defop(CROSS_ENTROPY_INDEX_D, "cross_entropy_index_d", cross_entropy_index_d, _run_cross_entropy_index_d, arity=3,
      cost=COMPUTE, flops=14, split=ROWS, public=False, ip=IgnoreIP)
