"""Gradient checkpointing: the plans that choose what the backward pass
recomputes (build_backward's arguments become one in strategies.py, jg.checkpoint's
segments are marked in segments.py).

After ``build_backward`` has expanded the ordinary backward graph, the rewrite
(rewrite.py, ggml_build_backward_gradient_checkpointing) points every backward
reference to a forward tensor the plan does not keep at a recomputed copy.  A
plan is a ``Schedule``: one level -- a keep mask, each other tensor recomputed
at most once (an explicit checkpoint list, ``jg.checkpoint`` segments,
``"sqrt"``, ``policy="save_matmuls"``, the budget DP) -- or several levels
(``"revolve"``: Griewank & Walther's binomial schedule over the graph's narrow
points, revolve.py), where recomputed states seed later recomputations.
``memory_budget``, ``jg.plans`` and ``jg.pareto`` weigh both kinds by the exact planned peak
(trial.py) and their recompute cost, measured on the host or in FLOPs (timing.py); a
``Plan`` is one of them as a value, listed and built again (``build_backward(plan=)``).
"""
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from . import registry
from .budget import budget_dp
from .cost import REMAT_MIN_ELEMENTS, analyze_forward, compute_bound, copied_again, not_worth_saving, remake_table
from .errors import GraphError
from .ir import F_CHECKPOINT, F_LEAF
from .plan import K_VIEW
from .revolve import FIRST_SWEEP, RECOMPUTED, optimal_steps, schedule
from .rewrite import NEVER, Schedule, one_level
from .running import statistics_nodes
from .timing import node_costs
from .trial import Trial

MAX_REVOLVE_STEPS = 8        # plans searched by budgets and pareto recompute <= this x steps


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


# ---- the strategies ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Plan:
    """One checkpointing plan of one forward graph, as ``jg.plans`` and ``jg.pareto`` list
    them and ``build_backward(fwd, plan=...)`` builds it again: a keep mask over the forward
    order (one level) or a Revolve schedule's (slots, group, fine).  ``graph``: what it was
    planned for -- (the loss, a checksum of the forward order)."""
    words: str
    graph: tuple
    keep: Optional[np.ndarray] = field(default=None, repr=False)
    revolve: Optional[tuple] = None

    def __repr__(self) -> str:
        return f"Plan({self.words!r})"



MAX_DP_POINTS = 2048          # longer chains are coarsened to every k-th narrow point
_UNKNOWN = object()           # a cached value not worked out yet (None is a value)


class Planner:
    """Everything the strategies need about one forward graph and its plain backward."""

    def __init__(self, graph, fwd, first, end, grad_nodes, in_place, fuse="auto", remat=False, costs="flops"):
        self.graph, self.fwd, self.first, self.end = graph, fwd, first, end
        self.remat = remat
        self.costs = costs            # "measured" (ns on this host) or "flops": timing.py
        self._cost = None
        self.chosen = "none"          # what the strategy chose, in words (stats()["plan"])
        self._revolves: dict = {}     # id of a revolve Schedule -> (slots, group, fine)
        self.order = fwd.order
        self.loss = fwd.outputs[0].id
        self.itemsize = graph.dtype.itemsize
        self._grad_nodes, self._in_place, self._fuse = grad_nodes, in_place, fuse
        self._analysis = None
        self._trial = None
        self._steps = None
        self._policy = None
        self._remade = _UNKNOWN

    @property
    def analysis(self):
        """(saved, cut, size, flops) -- computed on first use."""
        if self._analysis is None:
            nodes = self.graph.nodes
            self._analysis = analyze_forward(nodes.arrays(), nodes.n, self.order, self.first, self.end,
                                             registry.table("flops"), registry.table("kind"), K_VIEW)
        return self._analysis

    saved = property(lambda self: self.analysis[0])
    cut = property(lambda self: self.analysis[1])
    size = property(lambda self: self.analysis[2])

    @property
    def cost(self):
        """Per node id: its recompute cost (timing.node_costs) -- measured on first use only,
        by the strategies that weigh plans against each other."""
        if self._cost is None:
            self._cost = node_costs(self.graph, self.fwd, self.costs)
        return self._cost

    @property
    def priced(self) -> bool:
        """Did a strategy weigh plans (and so price the nodes)?"""
        return self._cost is not None

    def price(self, ids):
        """The recompute cost of forward nodes ``ids`` (a node once per copy)."""
        return int(self.cost[np.asarray(ids, np.int64)].sum())

    @property
    def cost_at(self):
        """The recompute cost of each position of the forward order."""
        return self.cost[self.order]

    @property
    def trial(self):
        if self._trial is None:
            self._trial = Trial(self.graph, self.order, self.first, self.end, self.loss, self._grad_nodes,
                                self._in_place, self.schedule, self._fuse, self.price)
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

    def without_cheap(self, keep):
        """``keep`` less the cheap tensors not worth saving (cost.not_worth_saving) when the
        planner rematerializes (remat True: all of them, "auto": big ones) and that lowers the
        planned peak; the loss and batch statistics stay."""
        if self.remat is False:
            return keep
        nodes = self.graph.nodes
        remake = remake_table()
        if not self._big_cheap(remake, np.ones(self.order.size, bool)):
            return keep
        drop = not_worth_saving(nodes.arrays(), self.end, self.order, self.saved, keep, remake,
                                registry.table("kind"), K_VIEW, 0 if self.remat is True else REMAT_MIN_ELEMENTS)
        drop[self.loss] = 0
        drop[statistics_nodes(nodes, self.order)] = 0
        lean = keep & (1 - drop)
        if np.array_equal(lean, keep):
            return keep
        # a remade value can outlive a source's last backward read: take it only when the exact peak falls
        trial = self.trial
        return lean if trial.measure(lean)["peak_bytes"] < trial.measure(keep)["peak_bytes"] else keep

    def _big_cheap(self, remake, among):
        """Might remat find anything among the forward positions ``among``: a cheap op there
        (with remat "auto", a big one)?  Else neither its analysis runs nor its pass compiles."""
        nodes = self.graph.nodes
        cheap = remake[nodes.op[self.order]] > 0
        if self.remat == "auto":
            cheap &= nodes.shape[self.order].prod(axis=1) >= REMAT_MIN_ELEMENTS
        return bool(np.any(cheap & among))

    @property
    def remade(self):
        """The plain plan with cheap values remade (remat), or None when remat remakes nothing."""
        if self._remade is _UNKNOWN:
            keep_all = self.keep_all()
            lean = self.without_cheap(keep_all)
            self._remade = None if lean is keep_all else lean
        return self._remade

    def compute_bound(self):
        return self.order[compute_bound(self.graph.nodes.op[self.order])]

    @property
    def policy(self):
        """The keep mask of policy="save_matmuls": compute-bound results kept, the rest recomputed."""
        if self._policy is None:
            self._policy = self.without_cheap(self.keep(kept_ids=self.compute_bound(), recompute_ids=self.order))
        return self._policy

    def sqrt(self):
        return sqrt_checkpoints(self.order, self.saved, self.cut, self.size)

    # -- steps: the chain of narrow points that multi-level plans reverse --
    @property
    def states(self):
        """Positions (in the forward order) of the states between steps: the narrow
        points backward reads (all narrow points if it reads none), but the last one
        when backward reads nothing after it.  Step j runs from after state j-1
        (the start: the leaves) to state j; the last step ends with the loss."""
        if self._steps is None:
            cut = self.cut.astype(bool) & (self.size > 0)
            cut[self.order == self.loss] = False
            sv = self.saved[self.order].astype(bool) & (self.size > 0)
            pts = np.flatnonzero(cut & sv)
            if pts.size == 0:
                pts = np.flatnonzero(cut)
            if pts.size and not sv[pts[-1] + 1:].any():
                pts = pts[:-1]
            self._steps = pts
        return self._steps

    def step_of(self, states):
        """Step number (1 ...) of every node id below the backward part, by position."""
        steps = np.zeros(self.end, np.int64)
        steps[self.order] = 1 + np.searchsorted(states, np.arange(self.order.size), side="left")
        return steps

    def schedule(self, keep):
        """The one-level Schedule of a keep mask (steps only count recomputations)."""
        states = self.states
        return one_level(keep, self.step_of(states), states.size + 1)

    def remade_schedule(self, keep):
        """The one-level Schedule of ``keep``, its cheap recomputed tensors (remat's kind) copied
        again for the backward reads that come long after the recomputation that made them
        (rewrite.py) -- when the planner rematerializes and that lowers the exact peak."""
        plain = self.schedule(keep)
        remake = remake_table()
        if self.remat is False or not self._big_cheap(remake, (keep[self.order] == 0) & (self.saved[self.order] > 0)):
            return plain
        mask = copied_again(self.graph.nodes.arrays(), self.order, self.saved, keep, remake,
                            registry.table("kind"), K_VIEW, 0 if self.remat is True else REMAT_MIN_ELEMENTS)
        if not mask.any():
            return plain
        remade = plain._replace(remake=mask)
        trial = self.trial
        if trial.measure(remade)["peak_bytes"] >= trial.measure(keep)["peak_bytes"]:
            return plain
        self.chosen += ", cheap values copied again for backward"
        return remade

    def revolve(self, slots, group=1, fine=False):
        """The binomial (Revolve) schedule with ``slots`` stored states at once (the
        leaves hold the start state for free), over steps of ``group`` narrow points.
        A step's reversal recomputes its tape from the state before it, kept for the
        whole step; ``fine``: each forward node's rule recomputes what it reads from
        that state on its own (the tape is never whole: least memory, most recompute)."""
        fine_states = self.states
        states = fine_states[group - 1::group] if group > 1 else fine_states
        n = states.size + 1
        kind, made = schedule(n, slots + 1)
        order, nodes = self.order, self.graph.nodes
        step = self.step_of(states)
        starts = np.concatenate([[0], states + 1])              # step j runs over positions
        ends = np.concatenate([states, [order.size - 1]])        # starts[j - 1] .. ends[j - 1]
        seg = np.zeros(self.end, np.int64)                       # segments: numbered by position
        seg[order] = np.arange(order.size) if fine else starts[step[order] - 1]
        orig_lo = np.full(self.end, NEVER, np.int64)
        if not fine:                                             # the last step's tape: its originals
            orig_lo[order[step[order] == n]] = starts[n - 1]
        ids = order[states]                                      # state m is ids[m - 1], m = 1 .. n - 1
        m = np.arange(1, n)
        kind, made = kind[1:n], made[1:n]
        first = kind == FIRST_SWEEP
        orig_lo[ids[first]] = starts[m[first]]                   # stored by the forward pass: serves
        if n >= 2:                                               # down to step m + 1
            orig_lo[ids[-1]] = min(orig_lo[ids[-1]], starts[n - 1])
        # a state stored by a recomputation serves down to step m + 1 from the step that made it;
        # any other state is made and kept once for the reversal of step m + 1 (its working state)
        again = kind == RECOMPUTED
        by = np.where(again, made, m + 1)
        make_from = np.full(self.end, -1, np.int64)
        make_to = np.full(self.end, -1, np.int64)
        make_lo = np.zeros(self.end, np.int64)
        make_from[ids], make_to[ids], make_lo[ids] = starts[by - 1], ends[by - 1], starts[m]
        orig_lo[order[(nodes.flags[order] & F_LEAF) != 0]] = 0
        orig_lo[self.loss] = 0
        orig_lo[statistics_nodes(nodes, order)] = 0          # batch statistics: io slots, kept for free
        sched = Schedule(orig_lo, make_from, make_to, make_lo, seg, self.step_of(fine_states), fine_states.size + 1,
                         np.zeros(self.end, np.uint8))
        self._revolves[id(sched)] = (int(slots), int(group), bool(fine))
        return sched

    def revolve_options(self, group=1):
        """(least, most) slots worth planning over steps of ``group``: from the fewest
        whose schedule recomputes at most MAX_REVOLVE_STEPS x steps to one per step."""
        n = self.states.size // group + 1
        least = 0
        while least < n - 2 and optimal_steps(n, least + 1) > MAX_REVOLVE_STEPS * n:
            least += 1
        return least, max(n - 2, least)

    def variants(self):
        """(group, fine) of the multi-level plans the budget and frontier searches try:
        steps of 1, 2, 4 ... narrow points (while there are at least 4 steps) and, for
        the least memory, single steps with fine tapes."""
        out, g = [], 1
        while g == 1 or self.states.size // g >= 4:
            out.append((g, False))
            g *= 2
        return out + [(1, True)]

    # -- the budget planner --
    def _dp_inputs(self, stride):
        sv = self.saved[self.order].astype(bool)
        nbytes = self.size * self.itemsize
        points = np.flatnonzero(self.cut.astype(bool))
        if stride > 1:
            points = points[stride - 1::stride]
        csum_saved = np.concatenate([[0], np.cumsum(np.where(sv, nbytes, 0))])
        csum_flops = np.concatenate([[0], np.cumsum(self.cost_at)])
        ends = points + 1
        starts = np.concatenate([[0], ends[:-1]])
        seg_saved = csum_saved[ends] - csum_saved[starts]
        seg_flops = csum_flops[ends] - csum_flops[starts]
        cand_saved = np.where(sv[points], nbytes[points], 0)
        last = ends[-1] if points.size else 0
        tail_saved = int(csum_saved[-1] - csum_saved[last])
        tail_flops = int(csum_flops[-1] - csum_flops[last])
        return (points, nbytes[points].astype(np.int64), cand_saved.astype(np.int64), seg_saved.astype(np.int64),
                seg_flops.astype(np.int64), self.cost_at[points].astype(np.int64), tail_saved, tail_flops)

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

    def _one_level_for_budget(self, budget):
        """(measure, keep) of the one-level DP plan with the least recompute that fits, or None."""
        best = None
        for end_alive in (1, 0):              # the two memory models (see budget_dp)
            # binary search on the model's budget: a larger one keeps more, recomputes less;
            # to 1/256 of the budget (a DP run each: finer steps change little and cost time)
            lo, hi = 0, int(budget)
            while hi - lo >= max(1, budget >> 8):
                mid = (lo + hi) // 2
                keep = self.dp_keep(mid, end_alive)
                if keep is None:
                    lo = mid + 1
                    continue
                m = self.trial.measure(keep)
                if m["peak_bytes"] <= budget:
                    if best is None or self.trial.cost(m) < self.trial.cost(best[0]):
                        best = (m, keep)
                    lo = mid + 1
                else:
                    hi = mid - 1
        return best

    def _revolve_for_budget(self, budget, cost_bound, found):
        """(measure, schedule) of the multi-level plan with the least recompute that
        fits and costs less than ``cost_bound`` to recompute, or None.  Per variant, the most
        slots that fit: the peak grows by about one state per slot, so from the
        leanest plan's peak a guess, then steps down.  Appends the leanest plans
        measured to ``found``."""
        best, cost = None, self.trial.cost
        for group, fine in self.variants():
            least, most = self.revolve_options(group)
            if cost_bound is not None and self.trial.measure(self.revolve(most, group, fine),
                                                              cost_above=cost_bound) is None:
                continue                      # even one recomputation per step costs more
            lean = self.revolve(least, group, fine)
            m = self.trial.measure(lean)
            found.append((m, lean))
            if m["peak_bytes"] > budget:
                continue
            if cost_bound is None or cost(m) <= cost_bound:
                best, cost_bound = (m, lean), cost(m)
            states = self.states[group - 1::group]
            unit = max(1, int(self.size[states].max()) * self.itemsize) if states.size else 1
            # a state can cost less than the largest one: one more slot is always worth a try
            slots, tries = min(most, least + max(1, (budget - m["peak_bytes"]) // unit)), 0
            up = True                         # moving up from a fit, down from a miss
            while slots > least and tries < 8:
                tries += 1
                sched = self.revolve(int(slots), group, fine)
                m = self.trial.measure(sched, cost_above=cost_bound)
                if m is None:                 # dearer than the best: fewer slots recompute more,
                    if up and slots < most:   # but steps of unequal prices can make one more slot
                        slots += 1            # dearer and the next one cheaper again
                        continue
                    break
                if m["peak_bytes"] <= budget:
                    best, cost_bound = (m, sched), cost(m)
                    if slots >= most:
                        break
                    slots += 1                # the guess may be short: try one more
                    up = True
                    continue
                if best is not None and best[1] is not lean and cost(best[0]) <= cost(m):
                    break
                slots -= max(1, (m["peak_bytes"] - budget) // unit)
                up = False
        return best

    def for_budget(self, budget):
        """The plan (one level or several) with the least recompute whose exact planned
        peak fits ``budget``."""
        keep_all, cost = self.keep_all(), self.trial.cost
        none_peak = self.trial.measure(keep_all)["peak_bytes"]
        if none_peak <= budget:
            self.chosen = "memory_budget: none (the plain plan fits)"
            return self.schedule(keep_all)
        one = self._one_level_for_budget(budget)
        lean = self.remade                            # the plain plan, cheap values remade (remat)
        if lean is not None:
            m = self.trial.measure(lean)
            if m["peak_bytes"] <= budget and (one is None or cost(m) <= cost(one[0])):
                one = (m, lean)
        m = self.trial.measure(self.policy)           # policy save_matmuls: products kept, the rest recomputed
        if m["peak_bytes"] <= budget and (one is None or cost(m) < cost(one[0])):
            one = (m, self.policy)
        found = []
        multi = self._revolve_for_budget(budget, None if one is None else cost(one[0]), found)
        best = multi if multi is not None else one
        if best is not None:
            self.chosen = "memory_budget: " + self._describe(best[1])
            return best[1] if isinstance(best[1], Schedule) else self.schedule(best[1])
        # nothing fitted: survey the whole range of one-level model budgets (the model can be
        # off either way), with the leanest multi-level plans, take one that fits, or name
        # the smallest peak
        found += [(self.trial.measure(p), p) for p in self._survey(none_peak)]
        fits = [f for f in found if f[0]["peak_bytes"] <= budget]
        if fits:
            plan = min(fits, key=lambda f: cost(f[0]))[1]
            self.chosen = "memory_budget: " + self._describe(plan)
            return plan if isinstance(plan, Schedule) else self.schedule(plan)
        floor = min(f[0]["peak_bytes"] for f in found)
        plain = none_peak if lean is None else min(none_peak, self.trial.measure(lean)["peak_bytes"])  # as built
        raise GraphError(f"memory_budget of {budget} bytes cannot be met: the smallest planned peak "
                         f"found is {floor} bytes (without checkpointing: {plain} bytes)")

    def _describe(self, plan):
        """A plan in words."""
        if isinstance(plan, Schedule):
            if id(plan) not in self._revolves:
                return "multi-level"
            slots, group, fine = self._revolves[id(plan)]
            return (f"revolve, {slots} slots over {self.states[group - 1::group].size + 1} steps"
                    + (f" of {group} narrow points" if group > 1 else "") + (", fine tapes" if fine else ""))
        if self._remade is not _UNKNOWN and self._remade is not None and np.array_equal(plan, self._remade):
            return "remat (the plain plan, cheap values remade)"
        if self._policy is not None and np.array_equal(plan, self._policy):
            return "policy save_matmuls (products and reductions kept)"
        kept = int(np.count_nonzero(plan[self.order]))
        if kept == self.order.size:
            return "none (every forward tensor kept)"
        return f"one level, {kept} of {self.order.size} forward tensors kept"

    # -- plans as values: listed, then built again --
    @property
    def fingerprint(self):
        return (int(self.loss), zlib.crc32(np.ascontiguousarray(self.order, np.int64).tobytes()))

    def as_plan(self, plan):
        """The Plan of a keep mask or a revolve Schedule."""
        words = self._describe(plan)
        if isinstance(plan, Schedule):
            return Plan(words, self.fingerprint, revolve=self._revolves[id(plan)])
        keep = np.array(plan[self.order], np.uint8)
        keep.flags.writeable = False
        return Plan(words, self.fingerprint, keep=keep)

    def from_plan(self, plan):
        """The Schedule of a Plan listed for this forward graph."""
        if not isinstance(plan, Plan):
            raise GraphError("build_backward: plan must be a Plan from jg.plans or jg.pareto (a row's 'plan'), "
                             f"got {type(plan).__name__}")
        if plan.graph != self.fingerprint:
            raise GraphError(f"build_backward: plan {plan.words!r} was made for another forward graph (or this one "
                             "has changed since); list the plans of this one with jg.plans(fwd, ...)")
        self.chosen = "plan given: " + plan.words
        self.cost                                  # priced: stats() give its predicted recompute
        if plan.revolve is not None:
            sched = self.revolve(*plan.revolve)
            self._mark_states(sched)
            return sched
        keep = np.zeros(self.end, np.uint8)
        keep[self.order] = plan.keep
        return self.schedule(keep)

    def _mark_states(self, sched):
        """Flag the states a revolve schedule keeps from the forward pass as checkpoints."""
        states = self.order[self.states]
        self.graph.nodes.flags[states[(sched.orig_lo[states] > 0) & (sched.orig_lo[states] < NEVER)]] |= F_CHECKPOINT

    def plans(self, budget):
        """Every distinct plan the budget search and the frontier survey measure whose
        planned peak fits ``budget``, as rows, the least recompute cost first."""
        self.trial.log = []
        try:
            self.for_budget(budget)
        except GraphError:
            pass                              # no plan fits: the survey below may still find one
        self.frontier()
        log, self.trial.log = self.trial.log, None
        rows, seen = [], set()
        for plan, m in log:
            if m["peak_bytes"] > budget:
                continue
            p = self.as_plan(plan)
            key = p.revolve if p.revolve is not None else p.keep.tobytes()
            if key in seen:
                continue
            seen.add(key)
            self.trial.cost(m)
            rows.append(dict(strategy=p.words, plan=p, **{k: v for k, v in m.items() if k != "recomputes"}))
        rows.sort(key=lambda r: (r["recompute_cost"], r["peak_bytes"]))
        return rows

    def _survey(self, none_peak):
        plans = [self.keep(kept_ids=self.sqrt())]
        for b in np.unique(np.geomspace(1, none_peak, 32).astype(np.int64)):
            for end_alive in (1, 0):
                keep = self.dp_keep(int(b), end_alive)
                if keep is not None:
                    plans.append(keep)
        return plans

    def frontier(self, n_budgets=16):
        """Rows of (peak, recompute flops, ...) of one-level plans over budgets from the
        smallest to none and of multi-level plans over slot counts, Pareto-filtered."""
        def row(strategy, plan, **extra):
            return dict(strategy=strategy, **extra, plan=self.as_plan(plan), **self.trial.measure(plan))

        one = dict(budget=None, slots=None, group=None, fine=None)
        keep_all = self.keep_all()
        rows = [row("none", keep_all, **one)]
        none_peak = rows[0]["peak_bytes"]
        if self.remade is not None:
            rows.append(row("remat", self.remade, **one))
        rows.append(row("sqrt", self.keep(kept_ids=self.sqrt()), **one))
        lo = max(1, min(rows[-1]["peak_bytes"], none_peak) // 8)      # an eighth of the sqrt plan's peak
        rows.append(row("save_matmuls", self.policy, **one))
        for b in np.unique(np.geomspace(lo, none_peak, n_budgets).astype(np.int64)):
            for end_alive in (1, 0):
                keep = self.dp_keep(int(b), end_alive)
                if keep is not None:
                    rows.append(row("budget", keep, **dict(one, budget=int(b))))
        for group, fine in self.variants():
            least, most = self.revolve_options(group)
            for slots in np.unique(np.geomspace(least + 1, most + 1, 6).astype(np.int64) - 1):
                rows.append(row("revolve", self.revolve(int(slots), group, fine), budget=None, slots=int(slots),
                                group=group, fine=fine))
        for r in rows:
            r["recompute_cost"] = self.trial.cost(r)
            del r["recomputes"]
        rows.sort(key=lambda r: (r["peak_bytes"], r["recompute_cost"]))
        front, best_cost = [], None
        for r in rows:
            if best_cost is None or r["recompute_cost"] < best_cost:
                front.append(r)
                best_cost = r["recompute_cost"]
        return front
