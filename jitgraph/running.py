"""The running statistics of training-mode batch norms: updated exactly once per run.

A program holding ``batch_stats`` nodes (ops/batchnorm.py) that name running-statistics
consts gives each original node a persistent io slot (Program) and every checkpoint plan
keeps it (checkpoint.Planner), so the batch statistics are computed once, in the forward
pass, and are still in the run buffer when the run ends.  After a run has finished
without error, ``RunningStats.apply`` moves the consts by PyTorch's momentum rule in one
jitted call over all layers; recomputed copies (never made for batch_stats anyway) are
skipped, and a run that raises updates nothing.
"""
import threading
from typing import Any, Optional

import numpy as np
from numba import njit

from .errors import GraphError
from .ir import F_RECOMPUTED
from .ops.batchnorm import BatchStatsIP, MomentumFP
from .registry import BATCH_STATS, CONST, LeafIP


def statistics_nodes(nodes: Any, order: np.ndarray) -> np.ndarray:
    """The original (not recomputed) batch_stats nodes of ``order``: every checkpoint plan
    keeps them and every program gives them io slots, so they outlive the run."""
    order = np.asarray(order, np.int64)
    return order[(nodes.op[order] == BATCH_STATS) & ((nodes.flags[order] & F_RECOMPUTED) == 0)]


def io_slots(nodes: Any, order: np.ndarray, io: Any) -> np.ndarray:
    """The nodes a program plans in io slots: ``io`` plus the batch statistics of ``order``
    (the running statistics are updated from them after the run)."""
    return np.concatenate([np.asarray(io, np.int64).reshape(-1), statistics_nodes(nodes, order)])


@njit(cache=True)
def update_running(mem, store, at, mean_at, var_at, C, momentum, unbias):
    """PyTorch's rule, layer after layer: running = (1 - m) running + m batch (variance
    unbiased: times M / (M - 1)); float64 math."""
    for i in range(at.size):
        m = momentum[i]
        for c in range(C[i]):
            a = mean_at[i] + c
            store[a] = m * np.float64(mem[at[i] + c]) + (1.0 - m) * np.float64(store[a])
            b = var_at[i] + c
            store[b] = m * (np.float64(mem[at[i] + C[i] + c]) * unbias[i]) + (1.0 - m) * np.float64(store[b])


_update_lock = threading.Lock()


class RunningStats:
    """The running-statistics update of one program: where each training batch_norm's
    statistics are in the run buffer, and where its running mean and variance are in the
    value store.  ``apply`` runs after a successful run."""

    def __init__(self, graph: Any, ids: np.ndarray, off: np.ndarray) -> None:
        nodes = graph.nodes
        rm, rv = nodes.ip[ids, BatchStatsIP.running_mean], nodes.ip[ids, BatchStatsIP.running_var]
        C = nodes.ip[ids, BatchStatsIP.channels]
        at = nodes.ip[:, LeafIP.offset]                   # where a const's value is in the store
        n = nodes.n
        ok = (rm >= 0) & (rv >= 0) & (rm < n) & (rv < n) & (rm != rv)
        rm_, rv_ = np.where(ok, rm, 0), np.where(ok, rv, 0)
        numel = nodes.shape.prod(axis=1)
        ends = np.maximum(at[rm_], at[rv_]) + C
        x = nodes.src[ids, 0]
        M = numel[x] // np.maximum(C, 1)
        momentum = nodes.fp[ids, MomentumFP.momentum]
        ok &= (nodes.op[rm_] == CONST) & (nodes.op[rv_] == CONST) & (numel[rm_] == C) & (numel[rv_] == C)
        ok &= (numel[ids] == 2 * C) & (C >= 1) & (M >= 2) & (momentum >= 0) & (momentum <= 1)
        ok &= (at[rm_] >= 0) & (at[rv_] >= 0) & (ends <= graph.store_used)
        if not ok.all():
            bad = int(ids[np.flatnonzero(~ok)[0]])
            raise GraphError(f"batch_stats {graph.label(bad)!r}: its running statistics are not two distinct "
                             f"consts of its {int(nodes.ip[bad, BatchStatsIP.channels])} channels, or its momentum is "
                             "not in [0, 1]")
        self.at = np.ascontiguousarray(off[ids], np.int64)
        self.mean_at = np.ascontiguousarray(at[rm], np.int64)
        self.var_at = np.ascontiguousarray(at[rv], np.int64)
        self.C = np.ascontiguousarray(C, np.int64)
        self.momentum = np.ascontiguousarray(momentum, np.float64)
        self.unbias = M / (M - 1.0)

    @staticmethod
    def of(graph: Any, order: np.ndarray, off: np.ndarray) -> Optional["RunningStats"]:
        """The update of a program with this order and plan, or None (no training
        batch_norm with running statistics)."""
        ids = statistics_nodes(graph.nodes, order)
        ids = ids[(graph.nodes.ip[ids, BatchStatsIP.running_mean] >= 0) |
                  (graph.nodes.ip[ids, BatchStatsIP.running_var] >= 0)]
        return RunningStats(graph, ids, off) if ids.size else None

    def apply(self, mem: np.ndarray, store: np.ndarray) -> None:
        with _update_lock:
            update_running(mem, store, self.at, self.mean_at, self.var_at, self.C, self.momentum, self.unbias)
