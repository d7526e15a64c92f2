"""From build_backward's checkpointing arguments (checkpoints=, policy=, memory_budget=,
slots=, plan=, jg.checkpoint segments) to the plan the rewrite applies: checked here,
planned by the Planner (checkpoint.py)."""
import numpy as np

from . import registry
from .errors import GraphError
from .graph import Tensor
from .ir import F_CHECKPOINT, F_SEGMENT
from .revolve import default_slots
from .rewrite import run_rewrite


def choose_plan(planner, checkpoints, memory_budget, policy, slots=None, plan=None):
    """The Schedule for the requested strategy, or None (nothing to recompute)."""
    graph, order = planner.graph, planner.order
    nodes = graph.nodes
    if plan is not None:
        if checkpoints is not None or memory_budget is not None or policy is not None or slots is not None:
            raise GraphError("build_backward: give plan= alone; it says what to keep itself")
        return planner.from_plan(plan)
    if slots is not None and not (isinstance(checkpoints, str) and checkpoints == "revolve"):
        raise GraphError("build_backward: slots= goes with checkpoints='revolve'")
    if memory_budget is not None:
        if checkpoints is not None or policy is not None:
            raise GraphError("build_backward: give memory_budget alone; it chooses the checkpoints itself")
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)):
            raise GraphError(f"build_backward: memory_budget must be a number of bytes (int), got {memory_budget!r}")
        if memory_budget <= 0:
            raise GraphError(f"build_backward: memory_budget must be positive, got {memory_budget}")
        return planner.for_budget(int(memory_budget))
    if isinstance(checkpoints, str) and checkpoints == "revolve":
        if policy is not None:
            raise GraphError("build_backward: checkpoints='revolve' chooses what to keep itself; give no policy")
        sched = planner.revolve(_slots(planner, slots))
        planner.chosen = planner._describe(sched)
        planner._mark_states(sched)
        return sched
    kept, recompute = [], None
    if checkpoints is not None:
        if isinstance(checkpoints, str):
            if checkpoints != "sqrt":
                raise GraphError(f"build_backward: unknown checkpoint strategy {checkpoints!r}; "
                                 "use 'sqrt', 'revolve', a list of tensors, policy= or memory_budget=")
            kept = planner.sqrt()
            planner.chosen = f"sqrt: {len(kept)} checkpoints"
        else:
            kept = _checkpoint_ids(graph, order, checkpoints, planner.fwd.outputs[0])
            planner.chosen = f"{len(kept)} checkpoints given"
    if policy is not None:
        if policy != "save_matmuls":
            raise GraphError(f"build_backward: unknown policy {policy!r}; the policy is 'save_matmuls'")
        kept = list(kept) + planner.compute_bound().tolist()
        planner.chosen = "policy save_matmuls" + (f", {planner.chosen}" if checkpoints is not None else "")
        if checkpoints is None:
            recompute = order                 # everything but what the policy saves
    if checkpoints is None and policy is None:
        seg = (nodes.flags[order] & F_SEGMENT) != 0
        recompute = order[seg & ((nodes.flags[order] & F_CHECKPOINT) == 0)]
        keep = planner.without_cheap(planner.keep(recompute_ids=recompute))
        planner.chosen = ("jg.checkpoint segments" if seg.any() else "none") + \
            (", cheap values remade (remat)" if not keep[order[~seg]].all() else "")
        if not seg.any():                     # the plain plan: each remade value is copied once
            return None if keep[order].all() else planner.schedule(keep)
        return planner.remade_schedule(keep)
    for n in kept:
        nodes.flags[n] |= F_CHECKPOINT
    if recompute is not None:
        return planner.remade_schedule(planner.without_cheap(planner.keep(kept_ids=kept, recompute_ids=recompute)))
    return planner.remade_schedule(planner.without_cheap(planner.keep(kept_ids=kept)))


def _slots(planner, slots):
    n_steps = planner.states.size + 1
    if slots is None:
        return default_slots(n_steps) - 1
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 0:
        raise GraphError(f"build_backward: slots must be a number of stored states (int >= 0), got {slots!r}")
    return int(slots)


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
        t_id = t.id       # a transpose outside the order is read through (attention reads heads as they lie)
        while t_id not in in_order and int(graph.nodes.op[t_id]) == registry.TRANSPOSE:
            t_id = int(graph.nodes.src[t_id, 0])
        if t_id not in in_order:
            raise GraphError(f"build_backward: checkpoint {t.label!r} is not in the forward graph of "
                             f"loss {loss.label!r}")
        ids.append(t_id)
    return ids


def apply(graph, fwd, first, end, sched):
    """Run the rewrite of Schedule ``sched`` on the real graph; returns the number of
    recomputed steps."""
    return int(run_rewrite(graph.nodes, first, end, fwd.order, sched)[1])
