"""build_backward, grad and pareto: differentiation with checkpointing, on top of
the backward expansion (backward.py), the checkpoint rewrite and its strategies
(checkpoint.py) and programs (program.py)."""
import statistics
import time
from collections.abc import Mapping
from typing import Any, List, Optional, Sequence, Union

from .backward import differentiate
from .checkpoint import Plan, Planner
from .strategies import apply, choose_plan
from .errors import GraphError
from .graph import Graph, Tensor
from .ir import F_LOSS, F_RECOMPUTED
from .program import BackwardGraph, Feeds, ForwardGraph, build_forward
from .timing import chosen as chosen_costs

__all__ = ["build_backward", "grad", "pareto", "plans"]


def build_backward(fwd: ForwardGraph, checkpoints: Union[None, str, Sequence[Tensor]] = None,
                   memory_budget: Optional[int] = None, policy: Optional[str] = None, in_place: bool = True,
                   zero_table: bool = True, slots: Optional[int] = None,
                   fuse: Union[bool, str] = "auto", remat: Union[bool, str] = "auto",
                   costs: Optional[str] = None, plan: Optional[Plan] = None) -> BackwardGraph:
    """Differentiate ``fwd``'s loss (its one, scalar output) with respect to every
    param it depends on (ggml_build_backward_expand).

    Gradient checkpointing (the backward pass recomputes what it does not keep):

    * ``checkpoints=[t1, t2, ...]``: keep these (and params, inputs, consts, the loss);
      recompute every other forward tensor backward reads, from the nearest kept ones;
    * ``checkpoints="sqrt"``: about sqrt(n) checkpoints at the points where the graph
      narrows, spread evenly by the bytes backward needs;
    * ``checkpoints="revolve"``: several levels -- Griewank & Walther's binomial
      schedule over the chain of narrow points: at most ``slots`` states stored at
      once (default: the fewest that recompute no step more than 3 times), states
      recomputed from stored ones are themselves stored for later recomputation;
    * ``policy="save_matmuls"``: keep compute-bound results (matmuls, reductions),
      recompute the memory-bound (elementwise) ones;
    * ``memory_budget=bytes``: the plan (one level or several) with the least
      recompute whose exact planned peak fits; GraphError naming the smallest peak found when none does;
    * ``plan=``: a Plan listed by ``jg.plans(fwd, budget)`` or ``jg.pareto(fwd)`` (a row's
      ``"plan"``), built as it was priced there -- to try the runners-up, or keep a choice;
    * tensors built inside ``jg.checkpoint(fn, ...)`` segments are recomputed.

    Gradients are bit-identical to the un-checkpointed ones for every strategy.
    ``zero_table=False`` is for teaching: every gradient starts at an explicit zero
    and every contribution is added (the graph the zero table avoids).  ``fuse``: group
    connected elementwise nodes (fuse.py) -- ``"auto"`` where it pays (see build_forward),
    ``True`` every group, ``False`` none (every node alone); the bits are the same.
    ``remat`` (rematerialize): a cheap forward value the backward pass reads (an elementwise
    op's, a padding's, a norm's) is recomputed where it is read instead of saved when what it
    is made from is saved anyway -- fewer saved bytes, never more alive, a memory-bound pass
    each (torch.compile's partitioner makes the same trade) -- ``"auto"`` for tensors of 64k
    elements or more, ``True`` for all, ``False`` never (every value the backward pass reads
    is saved).  With every strategy above but revolve (it chooses what it keeps itself);
    memory_budget weighs the plain plan with remade values among its candidates.  The bits
    are the same.
    ``costs``: how memory_budget and revolve price recomputation -- ``"measured"`` (the
    default, or $JITGRAPH_COSTS): each forward op's kernel timed on this host at its shapes,
    once per machine (timing.py); ``"flops"``: the FLOP model, plans that do not depend on
    the machine.
    """
    _check_remat(remat, "build_backward")
    costs = chosen_costs(costs, "build_backward")
    loss = _scalar_loss(fwd, "build_backward")
    g = fwd.graph
    with g.transaction(flags=True):        # a plan that cannot be made leaves no gradient nodes behind
        g.nodes.flags[loss.id] |= F_LOSS
        first = g.nodes.n
        params, grad_nodes = differentiate(g, fwd.order, loss.id, zero_table)
        end = g.nodes.n
        planner = Planner(g, fwd, first, end, grad_nodes, in_place, fuse, remat, costs)
        sched = choose_plan(planner, checkpoints, memory_budget, policy, slots, plan)
        if sched is not None:
            apply(g, fwd, first, end, sched)
        bwd = BackwardGraph(fwd, params, grad_nodes, in_place=in_place, fuse=fuse)
        bwd.plan = {"plan": planner.chosen, "costs": costs}
        if planner.priced:                 # the strategy weighed plans: the chosen one's predicted recompute
            recomputed = bwd.order[(g.nodes.flags[bwd.order] & F_RECOMPUTED) != 0]
            predicted = planner.price(g.nodes.origin[recomputed])
            bwd.plan["predicted_recompute_" + ("seconds" if costs == "measured" else "flops")] = \
                predicted * 1e-9 if costs == "measured" else predicted
        return bwd


def grad(loss: Tensor, wrt: Sequence[Tensor]) -> List[Tensor]:
    """Gradient tensors of scalar ``loss`` with respect to params ``wrt`` (a list),
    as graph nodes to build on -- second-order derivatives differentiate them again."""
    with loss.graph.transaction(flags=True):
        bwd = build_backward(build_forward(loss))
        return [bwd.grad_tensor(p) for p in wrt]


def pareto(fwd: ForwardGraph, n_budgets: int = 16, in_place: bool = True,
           fuse: Union[bool, str] = "auto", remat: Union[bool, str] = "auto",
           costs: Optional[str] = None, feeds: Optional[Feeds] = None, repeats: int = 3) -> List[dict]:
    """The frontier of (planned peak bytes, recompute cost) over memory budgets.

    Returns a list of dicts (strategy, budget, peak_bytes, recompute_flops, recompute_cost,
    n_recomputed, ...), lowest peak first, each cheaper to recompute than the one before: the
    trade-offs worth having, with the peaks of fused programs (``fuse=False``: of unfused
    ones); with ``remat`` (build_backward's) the plain plan with remade values is a candidate
    too (strategy "remat").  ``costs`` as build_backward's: with "measured" (the default)
    recompute_cost is nanoseconds on this host and each row has ``recompute_seconds``; with
    "flops" it is the FLOP model's.  Works on a scratch copy: ``fwd``'s graph is not changed.

    Measured on request: with ``feeds`` (what ``run`` takes), every row's plan and the plain
    plan are built on scratch copies and run in turn, ``repeats`` times after a warm-up; each
    row gets ``measured_seconds`` (fwd+bwd, the median) and ``measured_recompute_seconds``
    (that over the plain plan's median, in ``plain_seconds``) -- what ``plot_pareto`` draws
    beside the prediction.
    """
    costs = chosen_costs(costs, "pareto")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise GraphError(f"pareto: repeats must be a positive int, got {repeats!r}")
    rows = _in_time(_scratch_planner(fwd, "pareto", in_place, fuse, remat, costs).frontier(n_budgets), costs)
    if feeds is not None:
        _measure(fwd, rows, feeds, repeats, in_place=in_place, fuse=fuse, remat=remat)
    return rows


def plans(fwd: ForwardGraph, memory_budget: int, in_place: bool = True, fuse: Union[bool, str] = "auto",
          remat: Union[bool, str] = "auto", costs: Optional[str] = None) -> List[dict]:
    """Every plan the planners can build whose planned peak fits ``memory_budget`` bytes: the
    budget search's candidates and the frontier survey's (one level and several), as rows
    like ``pareto``'s, the least recompute cost first -- the first is what
    ``build_backward(fwd, memory_budget=...)`` builds.  Each row's ``"plan"`` builds that
    plan: ``build_backward(fwd, plan=row["plan"])``.  An empty list when none fits.
    Works on a scratch copy: ``fwd``'s graph is not changed."""
    costs = chosen_costs(costs, "plans")
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise GraphError(f"plans: memory_budget must be a positive number of bytes (int), got {memory_budget!r}")
    planner = _scratch_planner(fwd, "plans", in_place, fuse, remat, costs)
    return _in_time(planner.plans(int(memory_budget)), costs)


def _scratch_planner(fwd: ForwardGraph, what: str, in_place: bool, fuse: Any, remat: Any, costs: str) -> Planner:
    """A Planner of ``fwd``'s loss on a scratch copy of its graph."""
    _check_remat(remat, what)
    loss = _scalar_loss(fwd, what)
    scratch = fwd.graph.scratch_copy()
    scratch.nodes.flags[loss.id] |= F_LOSS
    first = scratch.nodes.n
    _, grad_nodes = differentiate(scratch, fwd.order, loss.id)
    return Planner(scratch, _ShadowForward(scratch, fwd), first, scratch.nodes.n, grad_nodes, in_place, fuse,
                   remat, costs)


def _in_time(rows: List[dict], costs: str) -> List[dict]:
    for r in rows:
        if costs == "measured":
            r["recompute_seconds"] = r["recompute_cost"] * 1e-9
    return rows


def _measure(fwd: ForwardGraph, rows: List[dict], feeds: Feeds, repeats: int, **options: Any) -> None:
    """Time each row's plan and the plain one, each built on its own scratch copy of fwd's
    graph (build_backward appends to the graph it differentiates), the programs taking
    turns in every repeat so that a machine's drift is shared."""
    if not isinstance(feeds, Mapping):
        raise GraphError(f"pareto: feeds must be a dict {{input tensor or name: array}}, got {type(feeds).__name__}")
    loss = fwd.outputs[0]
    ids = {(fwd.graph.tensor(k) if isinstance(k, str) else k).id: v for k, v in feeds.items()
           if isinstance(k, str) or (isinstance(k, Tensor) and k.graph is fwd.graph)}
    if len(ids) != len(feeds):
        raise GraphError("pareto: feeds are keyed by the forward graph's input tensors or their names")
    progs = []
    for plan in [None] + [r["plan"] for r in rows]:
        g = fwd.graph.scratch_copy()
        prog = build_backward(build_forward(Tensor(g, loss.id)), plan=plan, **options)
        progs.append((prog, {Tensor(g, n): v for n, v in ids.items()}))
    times: List[List[float]] = [[] for _ in progs]
    for prog, f in progs:
        prog.run(f)                                  # compiles and warms the caches
    for _ in range(repeats):
        for k, (prog, f) in enumerate(progs):
            t0 = time.perf_counter()
            prog.run(f)
            times[k].append(time.perf_counter() - t0)
    plain = statistics.median(times[0])
    for r, t in zip(rows, times[1:]):
        r["measured_seconds"] = statistics.median(t)
        r["measured_recompute_seconds"] = r["measured_seconds"] - plain
        r["plain_seconds"] = plain


def _check_remat(remat: Any, what: str) -> None:
    if remat is not True and remat is not False and remat != "auto":
        raise GraphError(f"{what}: remat must be True, False or 'auto', got {remat!r}")


def _scalar_loss(fwd: Any, what: str) -> Tensor:
    if not isinstance(fwd, ForwardGraph):
        raise GraphError(f"{what}: expects the ForwardGraph of a loss, got {type(fwd).__name__}")
    if len(fwd.outputs) != 1:
        raise GraphError(f"{what}: the forward graph must have exactly one output, the loss; "
                         f"it has {len(fwd.outputs)}")
    loss = fwd.outputs[0]
    if loss.shape != ():
        raise GraphError(f"{what}: the loss {loss.label!r} must be a scalar, got shape {loss.shape}; "
                         "reduce it first (jg.sum or jg.mean)")
    return loss


class _ShadowForward:
    """fwd's order and outputs, on a scratch graph."""

    def __init__(self, graph: Graph, fwd: ForwardGraph) -> None:
        self.graph = graph
        self.order = fwd.order
        self.outputs = [Tensor(graph, t.id) for t in fwd.outputs]
