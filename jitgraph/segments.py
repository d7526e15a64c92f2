"""The segment API: ``jg.checkpoint(fn, *tensors)`` marks what ``fn`` builds as a segment the
backward pass recomputes (strategies.py reads the marks)."""
from typing import Any, Callable

from .errors import GraphError
from .graph import Tensor
from .ir import F_CHECKPOINT, F_SEGMENT
from .ops.common import graph_of


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
    An exception inside ``fn`` (at any depth of nesting) propagates unchanged and leaves
    the graph exactly as it was: the nodes, names, params and consts the segment made are
    gone, and a name given inside can be used again.
    """
    if not callable(fn):
        raise GraphError(f"checkpoint: the first argument must be the segment function, got {type(fn).__name__}")
    g = graph_of("checkpoint", *tensors)
    start = g.nodes.n
    with g.transaction():                 # fn raising (here or nested) leaves the graph as it was
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
