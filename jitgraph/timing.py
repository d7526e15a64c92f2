"""What recomputing a forward node costs, for the checkpoint planners: FLOPs, or the time
its kernel takes on this host.

A plan is only as good as its prices.  In FLOPs a relu, a dropout or a layer norm costs
next to nothing beside a product, yet each is a pass over its tensor that takes as long
as a small product (perf/RESULTS.md: a chain of ``dropout(relu(h @ W))`` layers planned in
FLOPs ran 2.7-3x its plain time under a budget, Revolve 13x).  So the planners price a node
by its kernel's **measured** time here (``costs="measured"``, the default): every distinct
(op, dtype, shapes, parameters, threads) of the forward program is run alone, at its real
shapes, the fastest of a few runs kept (``Program.node_seconds``, as ``profile``), and the
figure is cached on disk per host and build (``$XDG_CACHE_HOME/jitgraph/costs/<key>.json``,
the key of the compiled-code cache: sources, versions, CPU), so a node shape is timed once
per machine.  The forward program is run on zero inputs (valid indices for gathers; the
times of these kernels do not depend on the values).  ``costs="flops"`` (or
``JITGRAPH_COSTS=flops``) prices in the FLOP model instead: plans that do not depend on the
machine (the test suite's).

Costs are integers -- nanoseconds or FLOPs -- per node id; leaves and views cost 0.
"""
import json
import os
import threading
from typing import Dict, Optional

import numpy as np

from . import _cache, registry
from .cost import node_costs_flops
from .errors import GraphError
from .ir import F_INDEX, F_LEAF, N_IP
from .graph import Tensor
from .plan import K_VIEW
from .program import ForwardGraph
from .threads import get_num_threads

COSTS = ("measured", "flops")
REPEATS = 3                  # runs of each node; the fastest counts
IDENTITY_SLOTS = ("seed", "mask_id")     # int parameters that name a node's randomness, not its work
_lock = threading.Lock()
_memo: Dict[str, Dict[str, float]] = {}      # cache file -> its table, as read or written by this process


def chosen(costs: Optional[str], what: str) -> str:
    """The cost model asked for: ``costs``, else $JITGRAPH_COSTS, else "measured"."""
    got = costs if costs is not None else os.environ.get("JITGRAPH_COSTS", "").strip() or "measured"
    if got not in COSTS:
        raise GraphError(f"{what}: costs must be one of {', '.join(map(repr, COSTS))}, got {got!r}")
    return got


def _path() -> str:
    return os.path.join(_cache.user_root(), "costs", f"k-{_cache.KEY}.json")


def _table(path: str) -> Dict[str, float]:
    if path not in _memo:
        try:
            with open(path) as f:
                _memo[path] = {str(k): float(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, AttributeError):
            _memo[path] = {}
    return _memo[path]


def _save(path: str, table: Dict[str, float]) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        part = f"{path}.{os.getpid()}"
        with open(part, "w") as f:
            json.dump(table, f)
        os.replace(part, path)
    except OSError:
        pass                          # a read-only home: the figures are measured again next time


def _signatures(graph, ids: np.ndarray, threads: int):
    """(keys, which, first): the cache key of each distinct (op, dtype, shapes, parameters)
    among nodes ``ids``, per node the index of its key, and per key its first node -- grouped
    by numpy, so a key's string is made once per kind of node, not once per node."""
    nodes = graph.nodes
    if ids.size == 0:
        return [], np.zeros(0, np.int64), ids
    src = nodes.src[ids]
    src_ndim = np.where(src >= 0, nodes.ndim[np.maximum(src, 0)], -1)
    src_shape = np.where((src >= 0)[:, :, None], nodes.shape[np.maximum(src, 0)], -1).reshape(ids.size, -1)
    rows = np.concatenate([nodes.op[ids, None].astype(np.int64), nodes.ndim[ids, None].astype(np.int64),
                           nodes.shape[ids].astype(np.int64), src_ndim.astype(np.int64), src_shape.astype(np.int64),
                           nodes.ip[ids].astype(np.int64), nodes.fp[ids].view(np.int64)], axis=1)
    timed = _timed_ip()
    at = 2 + nodes.shape.shape[1] + src_ndim.shape[1] + src_shape.shape[1]          # the ip columns
    rows[:, at:at + N_IP] *= timed[nodes.op[ids]]
    _, first, which = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return [_key(graph, int(ids[i]), threads, timed) for i in first], which.reshape(-1), ids[first]


def _timed_ip() -> np.ndarray:
    """Per opcode, 1 for each int parameter slot that can change a kernel's time, 0 for
    the ones in IDENTITY_SLOTS (a dropout's seed: each layer's its own, the same pass)."""
    mask = np.ones((max(registry.OPS) + 1, N_IP), np.int64)
    for code, op in registry.OPS.items():
        for i, name in enumerate(op.ip_names):
            if name in IDENTITY_SLOTS:
                mask[code, i] = 0
    return mask


def _key(graph, n: int, threads: int, timed: np.ndarray) -> str:
    nodes = graph.nodes
    srcs = [int(s) for s in nodes.src[n] if s >= 0]
    ip = nodes.ip[n] * timed[nodes.op[n]]
    return "|".join([registry.OPS[int(nodes.op[n])].name, graph.dtype.name, str(graph.shape_of(n)),
                     ";".join(str(graph.shape_of(s)) for s in srcs),
                     ",".join(str(int(v)) for v in ip), ",".join(repr(float(v)) for v in nodes.fp[n]),
                     str(threads)])


def node_costs(graph, fwd, costs: str) -> np.ndarray:
    """Per node id (below graph.nodes.n): what recomputing each computed node of ``fwd``'s
    order costs -- nanoseconds here (measured, cached) or FLOPs; 0 elsewhere."""
    nodes = graph.nodes
    order = np.asarray(fwd.order, np.int64)
    if costs == "flops":
        return node_costs_flops(nodes.arrays(), nodes.n, order, registry.table("flops"))
    out = np.zeros(nodes.n, np.int64)
    computed = order[((nodes.flags[order] & F_LEAF) == 0) & (registry.table("kind")[nodes.op[order]] != K_VIEW)]
    keys, which, first = _signatures(graph, computed, get_num_threads())
    path = _path()
    with _lock:
        table = _table(path)
        missing = [i for i, k in enumerate(keys) if k not in table]
        if missing:
            seconds = _measure(graph, fwd)
            for i in missing:              # one node of each kind: its figure (all ran alone, the same)
                table[keys[i]] = float(seconds[first[i]])
            _save(path, table)
        ns = np.array([max(1, int(round(table[k] * 1e9))) for k in keys], np.int64)
        out[computed] = ns[which]
    return out


def _measure(graph, fwd) -> np.ndarray:
    """Seconds of every node of ``fwd``'s order run alone, unfused, on zero inputs."""
    nodes = graph.nodes
    prog = ForwardGraph(graph, np.asarray(fwd.order, np.int64), list(fwd.outputs), True, fuse=False)
    feeds = {}
    for n in prog.inputs:
        dtype = np.int64 if nodes.flags[n] & F_INDEX else graph.dtype
        feeds[Tensor(graph, n)] = np.zeros(graph.shape_of(n), dtype)
    best = prog.node_seconds(feeds, REPEATS)
    seconds = np.zeros(nodes.n, np.float64)
    seconds[prog.run_order] = best
    return seconds
