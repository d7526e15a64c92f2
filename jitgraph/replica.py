"""One replica of a data-parallel run (``jitgraph.distributed``): the Ray actor's
class and the gradient mean it runs.  Plain Python and Numba -- no Ray here: the
driver wraps ``Worker`` with ``ray.remote``.

A worker holds the program and the optimizer, loaded from ``jg.save`` bytes (no
pickled code).  ``grads`` runs the program on the worker's shard and returns its
loss and gradients, which go to every worker's ``apply`` through the object store
without passing through the driver; ``apply`` adds every worker's gradients in worker
order, divides by N (``_mean_into``: numpy's add-then-divide, bit for bit, in one pass),
steps, and answers with every shard's loss.  All replicas apply the same bits and stay
identical.
"""
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from numba import njit

from . import _cache
from .errors import GraphError
from .graph import Tensor
from .io import load, save
from .optim import Optimizer
from .program import BackwardGraph
from .threads import set_num_threads

CHUNK = 1 << 20                  # gradient elements per piece of the mean (a worker's threads share the pieces)


def to_bytes(obj: Any) -> bytes:
    """``jg.save(obj)`` as bytes."""
    with tempfile.TemporaryDirectory(prefix="jitgraph-dp-") as folder:
        path = os.path.join(folder, "model.npz")
        save(path, obj)
        with open(path, "rb") as f:
            return f.read()


def from_bytes(blob: bytes) -> Any:
    """``jg.load`` of bytes that ``to_bytes`` made."""
    with tempfile.TemporaryDirectory(prefix="jitgraph-dp-") as folder:
        path = os.path.join(folder, "model.npz")
        with open(path, "wb") as f:
            f.write(blob)
        return load(path)


@njit(cache=True, nogil=True)
def _add_into(dst, a, b, divisor):
    """dst = a + b, divided by ``divisor`` (of dst's dtype) when it is not 0: numpy's
    add-then-divide in one pass, bit for bit."""
    if divisor != 0:
        for j in range(dst.size):
            dst[j] = (a[j] + b[j]) / divisor
    else:
        for j in range(dst.size):
            dst[j] = a[j] + b[j]


def _mean_into(dst: np.ndarray, parts: List[np.ndarray]) -> None:
    """dst = (g_0 + g_1 + ... + g_{N-1}) / N, added in worker order: the same bits on
    every worker and every run."""
    n = len(parts)
    if n == 1:
        dst[:] = parts[0]
        return
    last = dst.dtype.type(n)
    _add_into(dst, parts[0], parts[1], last if n == 2 else dst.dtype.type(0))
    for m in range(2, n):
        _add_into(dst, dst, parts[m], last if m == n - 1 else dst.dtype.type(0))


def _spans(slots: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """(offset, size) slots merged where they touch: the memory plan puts the gradients
    of a program's params side by side, so they usually travel as one buffer."""
    out: List[Tuple[int, int]] = []
    for o, n in sorted(slots):
        if out and out[-1][0] + out[-1][1] == o:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((o, n))
    return out


State = Tuple[List[np.ndarray], Dict[str, Any], Optional[float], int]
RunInfo = Tuple[float, float, float, float]                  # loss, run seconds, run CPU seconds, clock at its end
Part = Tuple[RunInfo, Optional[List[np.ndarray]]]            # what ``Worker.grads`` returns
Ack = Tuple[Tuple[float, float, int, float], List[RunInfo]]   # what ``Worker.apply`` returns


def capture_state(store: np.ndarray, slices: List[Tuple[int, int]], opt: Optimizer, steps: int) -> State:
    """(param values, optimizer state, last gradient norm, steps): a replica's state as
    it moves between the driver and the workers (the values are views: Ray copies them)."""
    return [store[a:b] for a, b in slices], opt.state_dict(), getattr(opt, "last_grad_norm", None), steps


def restore_state(store: np.ndarray, slices: List[Tuple[int, int]], opt: Optimizer, state: State) -> int:
    """Put ``state`` into ``store`` and ``opt``; returns its steps.  ``opt`` keeps its
    hyper-parameters: they always come from the driver's optimizer (with every step)."""
    values, opt_state, norm, steps = state
    for (a, b), v in zip(slices, values):
        store[a:b] = v
    hyper = opt._hyper()
    opt.load_state_dict(opt_state)
    for key, v in hyper.items():
        setattr(opt, key, v)
    if norm is not None:
        opt.last_grad_norm = norm
    return steps


class Worker:
    """One replica, run as a Ray actor: the program and the optimizer loaded from
    ``jg.save`` bytes.  ``grads`` runs the program on a shard; ``apply`` averages every
    worker's gradients and steps; ``state`` / ``set_state`` move the replica's params,
    optimizer state and step count."""

    def __init__(self, blob: bytes, param_ids: List[int], threads: int, index: int = 0, count: int = 1) -> None:
        set_num_threads(threads)
        objs = from_bytes(blob)
        self.bwd: BackwardGraph = objs["bwd"]
        self.opt: Optimizer = objs["opt"]
        g = self.bwd.graph
        self.index, self.count = index, count        # this worker's place among ``count``
        self.slices = [g.tensor(i)._store_slice() for i in param_ids]
        self.grad_slots = _spans([(int(self.bwd.off[n]), g.tensor(p).size)
                                  for p, n in zip(self.bwd.params, self.bwd.grad_nodes) if n >= 0])
        self.data: Dict[int, np.ndarray] = {}
        self.steps = 0                   # optimizer steps this replica has taken, counted as the fit counts
        self.last: Optional[Ack] = None  # what the last ``apply`` returned: the driver asks for it after a failure
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="jitgraph-dp") if threads > 1 else None

    def ready(self) -> Tuple[str, str]:
        """The source key and folder of the jitgraph this worker imported."""
        return _cache.KEY, _cache.PACKAGE_DIR

    def set_data(self, data: Optional[Dict[int, np.ndarray]]) -> None:
        self.data = data or {}

    def state(self) -> State:
        return capture_state(self.bwd.graph.store, self.slices, self.opt, self.steps)

    def set_state(self, state: State) -> None:
        self.steps = restore_state(self.bwd.graph.store, self.slices, self.opt, state)

    def steps_done(self) -> Tuple[int, Optional[Ack]]:
        """(steps taken, what the last ``apply`` returned)."""
        return self.steps, self.last

    def param_values(self) -> List[np.ndarray]:
        store = self.bwd.graph.store
        return [store[a:b].copy() for a, b in self.slices]

    def grads(self, rows: np.ndarray, salt: int) -> Part:
        """((loss, seconds in bwd.run, CPU seconds of this thread in bwd.run, the clock at
        its end), gradients) of the rows ``rows`` of the data: one object, which every
        worker's ``apply`` reads.  The gradients are views of the program's memory (Ray
        copies them out); a lone worker's stay where they are (None).  A GraphError
        carries this worker's index (``.worker``) to the driver."""
        g = self.bwd.graph
        feeds = {Tensor(g, i): a[rows] for i, a in self.data.items()}
        t1, c1 = time.perf_counter(), time.thread_time()
        try:
            loss = float(self.bwd.run(feeds, seed=salt))
        except GraphError as e:
            e.worker = self.index
            raise
        t2, c2 = time.perf_counter(), time.thread_time()
        mem = self.bwd.mem
        return (loss, t2 - t1, c2 - c1, t2), ([mem[o:o + n] for o, n in self.grad_slots] if self.count > 1 else None)

    def apply(self, hyper: Dict[str, Any], *parts: Part) -> Ack:
        """Average the workers' gradients (``parts[i]`` is worker i's ``grads``) into this
        program's gradient slots and take the optimizer step with ``hyper`` (the
        driver's lr and the rest, so a schedule set between steps reaches every replica).
        Returns ((seconds of the mean, seconds of the step, steps taken, the clock when
        the gradients had arrived), every part's run information): any worker's answer
        tells the driver every shard's loss."""
        t0 = time.perf_counter()
        grads = [p[1] for p in parts if p[1] is not None]
        if grads:                    # none from a lone worker: its gradients are their own mean
            mem = self.bwd.mem
            pieces = [(mem[o + lo:o + min(lo + CHUNK, size)], [g[j][lo:lo + CHUNK] for g in grads])
                      for j, (o, size) in enumerate(self.grad_slots) for lo in range(0, size, CHUNK)]
            if self.pool is not None and len(pieces) > 1:
                list(self.pool.map(lambda piece: _mean_into(*piece), pieces))     # the kernel lets go of the GIL
            else:
                for piece in pieces:
                    _mean_into(*piece)
        t1 = time.perf_counter()
        for k, v in hyper.items():
            setattr(self.opt, k, v)
        self.opt.step()
        self.steps += 1
        self.last = ((t1 - t0, time.perf_counter() - t1, self.steps, t0), [p[0] for p in parts])
        return self.last
