"""What a plan costs: its rewrite, order and memory plan on a scratch copy of the node
table (the exact planned peak), and its recomputed copies, priced by the planner
(timing.py: measured time or FLOPs)."""
import numpy as np

from .cost import total_flops
from .fuse import fuse_and_plan
from .plan import backward_orders
from .rewrite import Schedule, run_rewrite
from .running import io_slots


class Trial:
    """Rewrite + order + plan of one schedule on a scratch copy of the node table."""

    def __init__(self, graph, fwd_order, first, end, loss_id, grad_nodes, in_place, to_schedule, fuse="auto",
                 price=None):
        self.graph, self.order = graph, fwd_order
        self.price = price            # forward node ids -> their recompute cost (Planner.price)
        self.first, self.end = first, end
        self.io = np.asarray(sorted(n for n in grad_nodes if n >= 0), np.int64)
        self.io_slots = io_slots(graph.nodes, fwd_order, self.io)        # what Program plans in io
        self.keep_out = np.asarray([loss_id], np.int64)
        self.in_place, self.fuse = in_place, fuse       # priced as the program will run: fused
        self.is_forward = np.zeros(end, np.uint8)
        self.is_forward[fwd_order] = 1
        self._to_schedule = to_schedule
        self._by_keep: dict = {}      # a keep mask's bytes -> its measure (remat and the budget search ask again)
        self.log = None               # a list: every plan measured in full is appended, (plan, measure)

    def measure(self, plan, cost_above=None):
        """dict(peak_bytes, recompute_flops, n_recomputed, recompute_steps,
        max_recomputations, recomputes: the forward nodes recomputed, a copy each) of ``plan``
        (a Schedule or a keep mask); None when its recompute cost exceeds ``cost_above``
        (then it is not planned at all)."""
        key = None if isinstance(plan, Schedule) else np.asarray(plan).tobytes()
        got = self._by_keep.get(key)
        if got is not None:
            return None if cost_above is not None and self.cost(got) > cost_above else got
        got = self._measure(plan, cost_above)
        if key is not None and got is not None:
            self._by_keep[key] = got
        if self.log is not None and got is not None:
            self.log.append((plan, got))
        return got

    def cost(self, m):
        """The recompute cost of measured plan ``m`` (the planner's price of its copies)."""
        if "recompute_cost" not in m:
            m["recompute_cost"] = int(self.price(m["recomputes"]))
        return m["recompute_cost"]

    def _measure(self, plan, cost_above):
        sched = plan if isinstance(plan, Schedule) else self._to_schedule(plan)
        scratch = self.graph.nodes.copy(self.end + self.order.size + 16, rows=self.end)
        counts = run_rewrite(scratch, self.first, self.end, self.order, sched)
        G = scratch.arrays()
        n = scratch.n
        if cost_above is not None and self.price(G.origin[self.end:n]) > cost_above:
            return None
        is_forward = np.zeros(n, np.uint8)
        is_forward[: self.end] = self.is_forward
        order, _, mem = fuse_and_plan(G, n, backward_orders(G, n, self.order, self.io, is_forward),
                                      self.io_slots, self.keep_out, self.in_place, self.fuse)
        copies = order[order >= self.end]
        flops = total_flops(G, copies)
        return dict(peak_bytes=int(mem[2]) * self.graph.dtype.itemsize, recompute_flops=flops,
                    n_recomputed=int(copies.size), recompute_steps=int(counts[1]),
                    max_recomputations=max_recomputations(G, copies), recomputes=G.origin[copies].copy())

    def run(self, plan):
        """(peak arena bytes, recompute flops, copies) of ``plan``."""
        m = self.measure(plan)
        return m["peak_bytes"], m["recompute_flops"], m["n_recomputed"]


def max_recomputations(G, copies: np.ndarray) -> int:
    """The most copies of one forward tensor among node ids ``copies``."""
    if copies.size == 0:
        return 0
    return int(np.bincount(G.origin[copies]).max())
