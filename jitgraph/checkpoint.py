"""Gradient checkpointing: the ggml rewrite, in nopython mode, and the plans
that choose what to keep.

After ``build_backward`` has expanded the ordinary backward graph, every
reference a backward node makes to a forward node that is not *kept* is
rewritten to a recomputed copy of that node, built from the nearest kept nodes
and memoized in a replacements hash map
(ggml_build_backward_gradient_checkpointing / ggml_recompute_graph_node).
Each forward node is copied at most once; the recursion is an explicit stack.
Copies run the very same kernels on the very same inputs, so the gradients are
bit-identical to the un-checkpointed ones; nobody refers to the originals from
the backward part any more, so the memory plan frees them during the forward
pass, and the copies are ordered right before their first consumer.

Every strategy -- an explicit checkpoint list, ``jg.checkpoint`` segments,
``"sqrt"``, ``policy="save_matmuls"``, ``memory_budget`` -- only decides the
keep mask handed to this one rewrite.
"""
from typing import Any, Callable, List, Optional

import numpy as np
from numba import njit

from . import registry
from ._hashtable import ht_get_or, ht_insert, ht_new
from .cost import analyze_forward, compute_bound, total_flops
from .emit import copy_node
from .errors import GraphError
from .graph import Graph, Tensor
from .ir import F_CHECKPOINT, F_GRAD, F_INDEX, F_LEAF, F_RECOMPUTED, F_SEGMENT, MAX_SRC
from .ops.common import graph_of
from .plan import K_VIEW, backward_orders, best_plan
from .running import statistics_nodes


@njit(cache=True)
def _recompute(G, st, v0, keep, repl, stack):
    """The recomputed copy of forward node v0 (memoized in ``repl``)."""
    r = ht_get_or(repl, v0, -1)
    if r >= 0:
        return r
    src, flags = G.src, G.flags
    sp = 0
    stack[0] = v0
    sp = 1
    while sp > 0:
        v = stack[sp - 1]
        waiting = False
        for k in range(MAX_SRC):          # copy the sources that need copying first
            u = src[v, k]
            if u < 0:
                break
            if not keep[u] and ht_get_or(repl, u, -1) < 0:
                stack[sp] = u
                sp += 1
                waiting = True
                break
        if waiting:
            continue
        sp -= 1
        if ht_get_or(repl, v, -1) >= 0:   # reached twice through a diamond
            continue
        c = copy_node(G, st, v, (flags[v] & (F_GRAD | F_INDEX)) | F_RECOMPUTED, v, -1)
        for k in range(MAX_SRC):
            u = src[v, k]
            if u < 0:
                break
            if not keep[u]:
                src[c, k] = ht_get_or(repl, u, -1)
        ht_insert(repl, v, c)
    return ht_get_or(repl, v0, -1)


@njit(cache=True)
def rewrite_backward(G, st, first_backward, end_backward, is_forward, keep, n_forward):
    """Point the backward nodes [first_backward, end_backward) at recomputed copies
    of the forward nodes they read that are not kept.  Returns the number of copies.
    The caller reserves room for ``n_forward`` more nodes (at most one copy each)."""
    src = G.src
    repl = ht_new(n_forward)
    stack = np.empty(n_forward + 1, np.int64)
    before = st[0]
    for n in range(first_backward, end_backward):
        for k in range(MAX_SRC):
            s = src[n, k]
            if s < 0:
                break
            if is_forward[s] and not keep[s]:
                src[n, k] = _recompute(G, st, s, keep, repl, stack)
    return st[0] - before


# ---- what a plan costs ----------------------------------------------------------------------

class Trial:
    """Rewrite + order + plan of one keep mask on a scratch copy of the node table."""

    def __init__(self, graph, fwd_order, first, end, loss_id, grad_nodes, in_place):
        self.graph, self.order = graph, fwd_order
        self.first, self.end = first, end
        self.io = np.asarray(sorted(n for n in grad_nodes if n >= 0), np.int64)
        self.io_slots = np.concatenate([self.io, statistics_nodes(graph.nodes, fwd_order)])    # as Program's
        self.keep_out = np.asarray([loss_id], np.int64)
        self.in_place = in_place
        self.is_forward = np.zeros(end, np.uint8)
        self.is_forward[fwd_order] = 1

    def run(self, keep):
        """(peak arena bytes, recompute flops, copies) of the plan that keeps ``keep``."""
        nodes = self.graph.nodes
        scratch = nodes.copy(self.end + self.order.size + 16, rows=self.end)   # room: a copy per forward node
        G = scratch.arrays()
        st = np.array([self.end, scratch.capacity], np.int64)
        copies = rewrite_backward(G, st, self.first, self.end, self.is_forward, keep, self.order.size)
        n = int(st[0])
        is_forward = np.zeros(n, np.uint8)
        is_forward[: self.end] = self.is_forward
        order, plan = best_plan(G, n, backward_orders(G, n, self.order, self.io, is_forward), self.io_slots,
                                self.keep_out, self.in_place)
        flops = total_flops(G, order[order >= self.end])       # the recomputed copies
        return int(plan[2]) * self.graph.dtype.itemsize, flops, int(copies)


# ---- choosing what to keep --------------------------------------------------------------------
def sqrt_checkpoints(order, saved, cut, size):
    """About sqrt(#saved tensors) checkpoints at narrow points, evenly spread by the
    bytes backward needs (Chen et al. 2016); saved narrow points preferred, since
    keeping them costs nothing extra."""
    sv = saved[order].astype(bool) & (size > 0)
    total = int(size[sv].sum())
    n_saved = int(sv.sum())
    if n_saved == 0:
        return []
    k = max(1, int(round(np.sqrt(n_saved))))
    step = total / (k + 1)
    good = np.flatnonzero(cut.astype(bool) & sv)
    if good.size == 0:
        good = np.flatnonzero(cut.astype(bool))
    if good.size == 0:                    # no narrow point at all: spread over saved tensors
        good = np.flatnonzero(sv)
    acc = np.cumsum(np.where(sv, size, 0))
    picks = []
    for i in range(1, k + 1):
        j = int(np.searchsorted(acc[good], i * step))
        if j < good.size:
            t = int(good[j])
            if not picks or picks[-1] != t:
                picks.append(t)
    return [int(order[t]) for t in picks]


@njit(cache=True)
def budget_dp(cand_size, cand_saved, seg_saved, seg_flops, cand_flops, tail_saved, tail_flops, budget, unit,
              end_alive):
    """Which narrow points to keep so that every segment fits ``budget`` with the
    least recompute flops, under the model

        memory while segment (i, j] is recomputed = (kept points before j, and j itself
                                                     if ``end_alive``) x unit
                                                  + bytes backward needs from the segment
        memory when backward starts                = (all kept points) x unit

    (whether the segment's own end point j is still alive when its recomputed
    tensors are made depends on the execution order: in creation order it is read
    by the segment's first backward steps and dies first -- the planner tries both);
        flops of segment (i, j] = its nodes up to the last one backward needs
                                  (what only feeds a kept point is never recomputed).

    Regions: region j runs from after point j-1 up to point j (inclusive).
    dp[c][j] = least flops covering regions 1..j with c points kept, the last j; the
    best predecessor i lies in a window given by the memory bound, and the flops
    split at Q[j] (the last region before j that needs recomputing), so two
    monotone sliding-window minima make it O(points x count).
    Returns (feasible, kept flags)."""
    m = cand_size.size
    PS = np.zeros(m + 1, np.int64)
    PF = np.zeros(m + 1, np.int64)
    for j in range(m):
        PS[j + 1] = PS[j] + seg_saved[j]
        PF[j + 1] = PF[j] + seg_flops[j]
    # Q[j]: flops of regions i+1..Q[j] are paid (if Q[j] > i); extra[j]: region j's own part
    Q = np.zeros(m + 1, np.int64)
    extra = np.zeros(m + 1, np.int64)
    last_saved = 0
    for j in range(1, m + 1):
        inner = seg_saved[j - 1] - cand_saved[j - 1]      # region j needs, besides its point
        if inner > 0:
            Q[j] = j - 1
            extra[j] = seg_flops[j - 1] - cand_flops[j - 1]
        else:
            Q[j] = last_saved
        if seg_saved[j - 1] > 0:
            last_saved = j
    tail_q = m if tail_saved > 0 else last_saved          # for the tail after the last kept point
    tail_extra = tail_flops if tail_saved > 0 else 0
    cmax = min(m, budget // max(unit, 1))
    INF = np.iinfo(np.int64).max // 4
    prev = np.full(m + 1, INF, np.int64)
    prev[0] = 0                                # index 0: the start, nothing kept yet
    back = np.zeros((cmax + 1, m + 1), np.int32)
    best, best_c, best_j = INF, -1, -1
    if PS[m] + tail_saved <= budget:           # keep nothing
        best, best_c, best_j = PF[tail_q] + tail_extra, 0, 0
    dqa = np.empty(m + 1, np.int64)
    dqb = np.empty(m + 1, np.int64)
    for c in range(1, cmax + 1):
        cur = np.full(m + 1, INF, np.int64)
        ha = ta = hb = tb = 0
        ia = 0                                 # next i for window A (i < Q[j], value prev - PF)
        ib = 0                                 # next i for window B (Q[j] <= i < j, value prev)
        for j in range(1, m + 1):
            lo_bytes = PS[j - 1] + seg_saved[j - 1] - cand_saved[j - 1] + (c - 1 + end_alive) * unit - budget
            q = Q[j]
            while ia < q:
                if prev[ia] < INF:
                    v = prev[ia] - PF[ia]
                    while ta > ha and prev[dqa[ta - 1]] - PF[dqa[ta - 1]] >= v:
                        ta -= 1
                    dqa[ta] = ia
                    ta += 1
                ia += 1
            if ib < q:
                ib = q
            while ib < j:
                if prev[ib] < INF:
                    while tb > hb and prev[dqb[tb - 1]] >= prev[ib]:
                        tb -= 1
                    dqb[tb] = ib
                    tb += 1
                ib += 1
            while ha < ta and PS[dqa[ha]] < lo_bytes:
                ha += 1
            while hb < tb and (PS[dqb[hb]] < lo_bytes or dqb[hb] < q):
                hb += 1
            val = INF
            arg = -1
            if ha < ta:
                a = dqa[ha]
                val = prev[a] - PF[a] + PF[q]
                arg = a
            if hb < tb and prev[dqb[hb]] < val:
                val = prev[dqb[hb]]
                arg = dqb[hb]
            if arg < 0:
                continue
            cur[j] = val + extra[j]
            back[c, j] = arg
            # the tail after the last kept point j is recomputed from j: every kept point is alive
            if c * unit + tail_saved + (PS[m] - PS[j]) <= budget:
                total = cur[j] + tail_extra + (PF[tail_q] - PF[j] if tail_q > j else 0)
                if total < best:
                    best, best_c, best_j = total, c, j
        prev = cur
    kept = np.zeros(m, np.uint8)
    if best_c < 0:
        return False, kept
    c = best_c
    j = best_j
    while c > 0:
        kept[j - 1] = 1
        j = back[c, j]
        c -= 1
    return True, kept


# ---- the strategies ---------------------------------------------------------------------------

MAX_DP_POINTS = 2048          # longer chains are coarsened to every k-th narrow point


class Planner:
    """Everything the strategies need about one forward graph and its plain backward."""

    def __init__(self, graph, fwd, first, end, grad_nodes, in_place):
        self.graph, self.fwd, self.first, self.end = graph, fwd, first, end
        self.order = fwd.order
        self.loss = fwd.outputs[0].id
        self.itemsize = graph.dtype.itemsize
        self._grad_nodes, self._in_place = grad_nodes, in_place
        self._analysis = None
        self._trial = None

    @property
    def analysis(self):
        """(saved, cut, size, flops) -- computed on first use; explicit plans never need it."""
        if self._analysis is None:
            nodes = self.graph.nodes
            self._analysis = analyze_forward(nodes.arrays(), nodes.n, self.order, self.first, self.end,
                                             registry.table("flops"), registry.table("kind"), K_VIEW)
        return self._analysis

    saved = property(lambda self: self.analysis[0])
    cut = property(lambda self: self.analysis[1])
    size = property(lambda self: self.analysis[2])
    flops = property(lambda self: self.analysis[3])

    @property
    def trial(self):
        if self._trial is None:
            self._trial = Trial(self.graph, self.order, self.first, self.end, self.loss, self._grad_nodes,
                                self._in_place)
        return self._trial

    def keep(self, kept_ids=(), recompute_ids=None):
        nodes = self.graph.nodes
        keep = np.zeros(self.end, np.uint8)
        if recompute_ids is None:
            keep[np.asarray(kept_ids, np.int64)] = 1
        else:
            keep[self.order] = 1
            keep[np.asarray(recompute_ids, np.int64)] = 0
            keep[np.asarray(kept_ids, np.int64)] = 1
        keep[self.order[(nodes.flags[self.order] & F_LEAF) != 0]] = 1
        keep[self.loss] = 1
        keep[statistics_nodes(nodes, self.order)] = 1     # batch statistics: io slots anyway, never recomputed
        return keep

    def keep_all(self):
        return self.keep(recompute_ids=[])

    def compute_bound(self):
        return self.order[compute_bound(self.graph.nodes.op[self.order])]

    def sqrt(self):
        return sqrt_checkpoints(self.order, self.saved, self.cut, self.size)

    # -- the budget planner --
    def _dp_inputs(self, stride):
        sv = self.saved[self.order].astype(bool)
        nbytes = self.size * self.itemsize
        points = np.flatnonzero(self.cut.astype(bool))
        if stride > 1:
            points = points[stride - 1::stride]
        csum_saved = np.concatenate([[0], np.cumsum(np.where(sv, nbytes, 0))])
        csum_flops = np.concatenate([[0], np.cumsum(self.flops)])
        ends = points + 1
        starts = np.concatenate([[0], ends[:-1]])
        seg_saved = csum_saved[ends] - csum_saved[starts]
        seg_flops = csum_flops[ends] - csum_flops[starts]
        cand_saved = np.where(sv[points], nbytes[points], 0)
        last = ends[-1] if points.size else 0
        tail_saved = int(csum_saved[-1] - csum_saved[last])
        tail_flops = int(csum_flops[-1] - csum_flops[last])
        return (points, nbytes[points].astype(np.int64), cand_saved.astype(np.int64), seg_saved.astype(np.int64),
                seg_flops.astype(np.int64), self.flops[points].astype(np.int64), tail_saved, tail_flops)

    def dp_keep(self, model_budget, end_alive=1):
        """The DP's keep mask for a model budget, or None if the model finds none."""
        n_points = int(self.cut.sum())
        stride = max(1, -(-n_points // MAX_DP_POINTS))
        points, csize, csaved, ssaved, sflops, cflops, tsaved, tflops = self._dp_inputs(stride)
        if points.size == 0:
            return None
        unit = int(csize.max())
        ok, kept = budget_dp(csize, csaved, ssaved, sflops, cflops, tsaved, tflops, int(model_budget), unit,
                             int(end_alive))
        if not ok:
            return None
        return self.keep(kept_ids=self.order[points[kept.astype(bool)]])

    def for_budget(self, budget):
        """The keep mask with the least recompute whose exact planned peak fits ``budget``."""
        none_peak, _, _ = self.trial.run(self.keep_all())
        if none_peak <= budget:
            return self.keep_all()
        best = None                           # (flops, keep, peak)
        for end_alive in (1, 0):              # the two memory models (see budget_dp)
            # binary search on the model's budget: a larger one keeps more, recomputes less
            lo, hi = 0, int(budget)
            for _ in range(24):
                if lo > hi:
                    break
                mid = (lo + hi) // 2
                keep = self.dp_keep(mid, end_alive)
                if keep is None:
                    lo = mid + 1
                    continue
                peak, flops, _ = self.trial.run(keep)
                if peak <= budget:
                    if best is None or flops < best[0]:
                        best = (flops, keep, peak)
                    lo = mid + 1
                else:
                    hi = mid - 1
        if best is None:
            # nothing fitted below the budget: survey the whole range of model budgets (the
            # model can be off either way), take a plan that fits, or name the smallest peak
            found = [self.trial.run(self.keep(kept_ids=self.sqrt())) + (self.keep(kept_ids=self.sqrt()),)]
            for b in np.unique(np.geomspace(1, none_peak, 32).astype(np.int64)):
                for end_alive in (1, 0):
                    keep = self.dp_keep(int(b), end_alive)
                    if keep is not None:
                        found.append(self.trial.run(keep) + (keep,))
            fits = [f for f in found if f[0] <= budget]
            if fits:
                return min(fits, key=lambda f: f[1])[3]
            floor = min(f[0] for f in found)
            raise GraphError(f"memory_budget of {budget} bytes cannot be met: the smallest planned peak "
                             f"found is {floor} bytes (without checkpointing: {none_peak} bytes)")
        return best[1]

    def frontier(self, n_budgets=16):
        """(peak, recompute flops) of plans over budgets from the smallest to none, Pareto-filtered."""
        none_peak, _, _ = self.trial.run(self.keep_all())
        rows = [dict(strategy="none", budget=None, peak_bytes=none_peak, recompute_flops=0, n_recomputed=0)]
        sq = self.keep(kept_ids=self.sqrt())
        p, f, c = self.trial.run(sq)
        rows.append(dict(strategy="sqrt", budget=None, peak_bytes=p, recompute_flops=f, n_recomputed=c))
        lo = max(1, min(p, none_peak) // 8)
        for b in np.unique(np.geomspace(lo, none_peak, n_budgets).astype(np.int64)):
            for end_alive in (1, 0):
                keep = self.dp_keep(int(b), end_alive)
                if keep is None:
                    continue
                p, f, c = self.trial.run(keep)
                rows.append(dict(strategy="budget", budget=int(b), peak_bytes=p, recompute_flops=f,
                                 n_recomputed=c))
        rows.sort(key=lambda r: (r["peak_bytes"], r["recompute_flops"]))
        front, best_flops = [], None
        for r in rows:
            if best_flops is None or r["recompute_flops"] < best_flops:
                front.append(r)
                best_flops = r["recompute_flops"]
        return front


def choose_keep(planner, checkpoints, memory_budget, policy):
    """The keep mask for the requested strategy, or None (nothing to recompute)."""
    graph, order = planner.graph, planner.order
    nodes = graph.nodes
    if memory_budget is not None:
        if checkpoints is not None or policy is not None:
            raise GraphError("build_backward: give memory_budget alone; it chooses the checkpoints itself")
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)):
            raise GraphError(f"build_backward: memory_budget must be a number of bytes (int), got {memory_budget!r}")
        if memory_budget <= 0:
            raise GraphError(f"build_backward: memory_budget must be positive, got {memory_budget}")
        return planner.for_budget(int(memory_budget))
    kept, recompute = [], None
    if checkpoints is not None:
        if isinstance(checkpoints, str):
            if checkpoints != "sqrt":
                raise GraphError(f"build_backward: unknown checkpoint strategy {checkpoints!r}; "
                                 "use 'sqrt', a list of tensors, policy= or memory_budget=")
            kept = planner.sqrt()
        else:
            kept = _checkpoint_ids(graph, order, checkpoints, planner.fwd.outputs[0])
    if policy is not None:
        if policy != "save_matmuls":
            raise GraphError(f"build_backward: unknown policy {policy!r}; the policy is 'save_matmuls'")
        kept = list(kept) + planner.compute_bound().tolist()
        if checkpoints is None:
            recompute = order                 # everything but what the policy saves
    if checkpoints is None and policy is None:
        seg = (nodes.flags[order] & F_SEGMENT) != 0
        if not seg.any():
            return None
        recompute = order[seg & ((nodes.flags[order] & F_CHECKPOINT) == 0)]
        return planner.keep(recompute_ids=recompute)
    for n in kept:
        nodes.flags[n] |= F_CHECKPOINT
    if recompute is not None:
        return planner.keep(kept_ids=kept, recompute_ids=recompute)
    return planner.keep(kept_ids=kept)


def _checkpoint_ids(graph, order, checkpoints, loss):
    try:
        items = list(checkpoints)
    except TypeError:
        raise GraphError("build_backward: checkpoints must be a list of tensors or 'sqrt'") from None
    in_order = set(order.tolist())
    ids = []
    for t in items:
        if not isinstance(t, Tensor):
            raise GraphError(f"build_backward: checkpoints must be Tensors, got {type(t).__name__}")
        if t.graph is not graph:
            raise GraphError(f"build_backward: checkpoint {t.label!r} belongs to a different graph")
        if t.id not in in_order:
            raise GraphError(f"build_backward: checkpoint {t.label!r} is not in the forward graph of "
                             f"loss {loss.label!r}")
        ids.append(t.id)
    return ids


def apply(graph, fwd, first, end, keep):
    """Run the rewrite on the real graph; returns the number of recomputed copies."""
    nodes = graph.nodes
    n_fwd = int(fwd.order.size)
    nodes.reserve(n_fwd + 1)
    is_forward = np.zeros(end, np.uint8)
    is_forward[fwd.order] = 1
    st = np.array([nodes.n, nodes.capacity], np.int64)
    copies = rewrite_backward(nodes.arrays(), st, first, end, is_forward, keep, n_fwd)
    nodes.n = int(st[0])
    return int(copies)


# ---- the segment API ------------------------------------------------------------------------------
def checkpoint(fn: Callable[..., Any], *tensors: Tensor) -> Any:
    """Build ``fn(*tensors)`` as a segment that the backward pass recomputes.

    Only the segment's inputs and its output are kept through the forward pass;
    every tensor built inside is recomputed when backward needs it (like
    torch.utils.checkpoint / jax.checkpoint).  Params used inside get their
    gradients as usual.  Segments nest: an inner segment belongs to the outer one,
    whose output alone is kept.  ``fn`` may return a Tensor or a tuple of Tensors.

    ``fn`` runs once, now, to build the graph -- nothing is traced or replayed
    later -- so closing over a loop variable is safe:
    ``for W in Ws: h = jg.checkpoint(lambda t: jg.relu(t @ W), h)`` uses each
    W once (in tape-based libraries the late-bound W can bite at replay time).
    An exception inside ``fn`` propagates and leaves the graph usable.
    """
    if not callable(fn):
        raise GraphError(f"checkpoint: the first argument must be the segment function, got {type(fn).__name__}")
    g = graph_of("checkpoint", *tensors)
    start = g.nodes.n
    g._segment_depth += 1
    try:
        out = fn(*tensors)
    finally:
        g._segment_depth -= 1
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(t, Tensor) for t in outs):
        got = type(out).__name__ if not isinstance(out, (tuple, list)) else \
            ", ".join(type(t).__name__ for t in outs) or "an empty sequence"
        raise GraphError(f"checkpoint: the segment function must return a Tensor or a tuple of Tensors, got {got}")
    for t in outs:
        if t.graph is not g:
            raise GraphError(f"checkpoint: the segment returned {t.label!r}, a tensor of another graph")
    nodes = g.nodes
    nodes.flags[start:nodes.n] |= F_SEGMENT
    if g._segment_depth == 0:
        for t in outs:
            if t.id >= start:
                nodes.flags[t.id] |= F_CHECKPOINT
    return out
