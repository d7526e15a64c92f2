"""Data-parallel training on a Ray cluster: ``DataParallel`` (the optional extra
``pip install "jitgraph[ray]"``; ``import jitgraph`` never imports Ray, this module does).

The program ``bwd`` is built for one worker's shard: its inputs' first axis holds b
rows.  A global batch of N * b rows -- the batch ``jg.batches`` gives with the same
arguments -- is cut into N contiguous shards, shard i for worker i.  Every worker is a
Ray actor holding a replica of the program and of the optimizer, loaded from
``jg.save`` bytes (no pickled code), and a step goes:

1. each worker runs ``bwd.run`` on its shard with dropout seed ``(seed + step) * N + i``
   and hands its loss and gradients to every worker;
2. each worker adds all N workers' gradients in worker order and divides by N -- a
   fixed reduction order, the same on every worker -- into its program's gradient
   slots, takes the optimizer step with the driver's current hyper-parameters, and
   answers the driver with every shard's loss.

Both are Ray actor tasks; the gradients go through the object store (zero-copy reads on
a node).  A lone worker keeps its gradients: they are their own mean.

Every replica starts a fit from the same state and applies the same bits, so all hold
identical params; nothing but row numbers, hyper-parameters and the gradients moves in
a step.  The driver holds no live state during a fit: it pulls the params and
optimizer state from a worker at the end of each epoch, at each checkpoint, at the
end of the fit and when asked (``params``, ``save``).  A worker that dies is replaced
by a new actor that copies a surviving replica's state (the interrupted step is redone
if the survivors had not taken it); if every replica is lost at once, new workers
start from the driver's last pulled state and redo the steps since, which give the
same bits.
"""
import json
import os
import time
import warnings
import zipfile
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError
from tqdm.auto import tqdm

from . import _cache
from ._boot import actor_class, ship_by_value
from .errors import GraphError
from .graph import Tensor
from .ir import F_INDEX
from .optim import Optimizer
from .program import BackwardGraph
from .replica import Worker, capture_state, from_bytes, restore_state, to_bytes
from .train import batch_rows

MAGIC = "jitgraph-dataparallel"
VERSION = 1
DIED = (RayActorError, WorkerCrashedError, ObjectLostError)   # the worker or its result is gone: replace it


class _AllLost(Exception):
    """Every replica died at once: the fit goes back to the driver's last pulled state."""


def _int(x, name, low):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < low:
        raise GraphError(f"DataParallel: {name} must be an int >= {low}, got {x!r}")
    return int(x)


class DataParallel:
    """Train ``bwd`` with ``opt`` on ``num_workers`` Ray actors, each running the program
    on its shard of every global batch (see the module's docstring and the README,
    "Data-parallel training on Ray").

    ``address`` is ``ray.init``'s, used unless this process is connected already: None
    joins the cluster in $RAY_ADDRESS or one ``ray start`` began on this machine, else
    starts a local instance (ended by ``shutdown``); ``"auto"`` joins the ``ray start``
    cluster; ``"ray://head:10001"`` connects to a remote one.  Each worker uses
    ``threads_per_worker`` threads (and asks Ray for as many CPUs).  A worker that dies
    is replaced, at most ``max_restarts`` times in one step."""

    def __init__(self, bwd: BackwardGraph, opt: Optimizer, num_workers: int = 2, address: Optional[str] = None,
                 threads_per_worker: int = 1, max_restarts: int = 3, start_timeout: float = 600.0) -> None:
        if not isinstance(bwd, BackwardGraph):
            raise GraphError(f"DataParallel: bwd must be a BackwardGraph (jg.build_backward), got {type(bwd).__name__}")
        if not isinstance(opt, Optimizer) or opt.graph is not bwd.graph:
            raise GraphError("DataParallel: opt must be an optimizer over params of bwd's graph")
        self.bwd, self.opt = bwd, opt
        self.num_workers = _int(num_workers, "num_workers", 1)
        self.threads = _int(threads_per_worker, "threads_per_worker", 1)
        self.max_restarts = _int(max_restarts, "max_restarts", 0)
        self.start_timeout = float(start_timeout)
        self.batch = self._program_batch()
        self.restarts = 0                                 # workers replaced so far
        self._ahead: Any = None                           # (step, its gradient refs) queued before it came
        self._last_end: Optional[float] = None            # when the fit's last step ended
        self.position: Optional[Dict[str, Any]] = None    # where an unfinished fit stopped
        self.step_times: List[Dict[str, float]] = []      # per step of the last fit
        self.workers: List[Any] = []
        g = bwd.graph
        self._param_ids = list(g.params)                  # all of them: values set on the driver reach the workers
        self._slices = [g.tensor(p)._store_slice() for p in self._param_ids]
        self._grad_slots = [(int(bwd.off[n]), g.tensor(p).size) for p, n in zip(bwd.params, bwd.grad_nodes) if n >= 0]
        self._state_ref: Any = None                       # the state a new worker starts from
        self._data_ref: Any = None
        self._blob: Any = None
        self._stale = False                               # the replicas have stepped past the driver's state
        self._driver_steps = 0                            # the fit's step count at the driver's state
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(address=address, include_dashboard=False)
        try:
            cpus = ray.cluster_resources().get("CPU", 0)
            need = self.num_workers * self.threads
            if need > cpus:
                raise GraphError(f"DataParallel: {self.num_workers} workers x {self.threads} threads need {need} CPUs; "
                                 f"the Ray cluster has {cpus:g}")
            self._blob = ray.put(to_bytes({"bwd": bwd, "opt": opt}))
            ship_by_value(ray.cloudpickle)     # the actor's stand-in reaches a worker before any jitgraph does
            methods = tuple(m for m in dir(Worker) if not m.startswith("_") and callable(getattr(Worker, m)))
            self._actor = ray.remote(actor_class(ray.cloudpickle.dumps(Worker), "Worker", methods))
            self.workers = [self._spawn(i) for i in range(self.num_workers)]   # they start while the driver warms up
            self._warm_up()
            self._check_ready()
        except BaseException:
            self.shutdown()
            raise

    # ---- set-up --------------------------------------------------------------------------------
    def _program_batch(self):
        g = self.bwd.graph
        if not self.bwd.inputs:
            raise GraphError("DataParallel: the program has no inputs, so there is no batch to share out")
        firsts = {g.label(n): g.shape_of(n)[0] if g.shape_of(n) else None for n in self.bwd.inputs}
        if None in firsts.values() or len(set(firsts.values())) != 1:
            raise GraphError(f"DataParallel: every input of the program needs the same first (batch) axis; their "
                             f"first dims are {firsts}")
        return next(iter(firsts.values()))

    def _warm_up(self):
        """One run on zeros: it loads (or compiles into the cache the workers share) the
        program's kernels before the workers start."""
        g = self.bwd.graph
        feeds = {g.tensor(n): np.zeros(g.shape_of(n), np.int64 if g.nodes.flags[n] & F_INDEX else g.dtype)
                 for n in self.bwd.inputs}
        self.bwd.run(feeds)

    def _spawn(self, i):
        # the stand-in imports the jitgraph folder this driver imported (or the node's own, on another machine)
        return self._actor.options(num_cpus=self.threads, max_restarts=0, scheduling_strategy="SPREAD").remote(
            self._blob, self._param_ids, self.threads, i, self.num_workers)

    def _check_ready(self):
        try:
            infos = ray.get([w.ready.remote() for w in self.workers], timeout=self.start_timeout)
        except GetTimeoutError:
            raise GraphError(f"DataParallel: the workers did not start within {self.start_timeout:g} s "
                             f"(are {self.num_workers * self.threads} CPUs free in the cluster?)") from None
        except (RayActorError, RayTaskError) as e:
            raise GraphError(f"DataParallel: a worker failed to start: {e}") from None
        for key, where in infos:
            if key != _cache.KEY:
                warnings.warn(f"DataParallel: a worker imported another jitgraph ({where}) than this driver "
                              f"({_cache.PACKAGE_DIR}); runs may not be reproducible", stacklevel=3)

    # ---- workers ---------------------------------------------------------------------------------
    def _replace(self, i, tries, state_ref):
        """A new actor for worker i, starting from ``state_ref`` (and the fit's data)."""
        if tries > self.max_restarts:
            raise GraphError(f"DataParallel: worker {i} died {tries} times in a row; giving up "
                             f"(max_restarts={self.max_restarts})")
        self._respawn(i)
        self.workers[i].set_state.remote(state_ref)             # queued before any call that follows
        if self._data_ref is not None:
            self.workers[i].set_data.remote(self._data_ref)

    def _respawn(self, i):
        """End worker i (if it still runs) and start a new actor in its place."""
        self._ahead = None
        try:
            ray.kill(self.workers[i])
        except Exception:              # already gone
            pass
        self.workers[i] = self._spawn(i)
        self.restarts += 1

    def _prepare(self, steps):
        """Give every worker the driver's state (at the fit's step ``steps``) and the
        fit's data, and wait; a dead worker is replaced."""
        self._state_ref = ray.put(capture_state(self.bwd.graph.store, self._slices, self.opt, steps))
        self._driver_steps = steps
        tries = [0] * len(self.workers)
        todo = list(range(len(self.workers)))
        while todo:
            refs = [(self.workers[i].set_state.remote(self._state_ref), self.workers[i].set_data.remote(self._data_ref))
                    for i in todo]
            again = []
            for i, pair in zip(todo, refs):
                try:
                    ray.get(list(pair))
                except DIED:
                    tries[i] += 1
                    self._replace(i, tries[i], self._state_ref)
                    again.append(i)
            todo = again

    def _pull(self, in_fit=False):
        """Make the driver's params and optimizer state the replicas' (a live worker's)."""
        if not self._stale or not self.workers:
            return
        for w in self.workers:
            try:
                state = ray.get(w.state.remote())
                break
            except DIED:
                continue
        else:
            if in_fit:
                raise _AllLost
            raise GraphError(f"DataParallel: every worker died; the replicas' steps after step "
                             f"{self._driver_steps} (the driver's state) are lost")
        self._driver_steps = restore_state(self.bwd.graph.store, self._slices, self.opt, state)
        self._stale = False

    def _worker_error(self, e, i, step):
        cause = getattr(e, "cause", None)
        i = cause.worker if isinstance(cause, GraphError) and cause.worker is not None else i
        error = GraphError(f"DataParallel: worker {i} failed in step {step + 1}: {cause}")
        error.worker = i
        return error

    def _alive(self, what):
        if not self.workers:
            raise GraphError(f"DataParallel.{what}: this DataParallel was shut down")

    # ---- training --------------------------------------------------------------------------------
    def _data(self, data):
        g = self.bwd.graph
        if not isinstance(data, dict) or not data:
            raise GraphError("DataParallel.fit: data must map the program's input tensors (or names) to arrays")
        arrays = {}
        n = -1
        for key, a in data.items():
            t = g.tensor(key) if isinstance(key, str) else key
            if not isinstance(t, Tensor) or t.graph is not g or t.id not in self.bwd._input_set:
                label = t.label if isinstance(t, Tensor) else repr(key)
                raise GraphError(f"DataParallel.fit: data key {label} is not an input of the program")
            a = np.ascontiguousarray(a)
            if a.ndim != len(t.shape) or a.shape[1:] != t.shape[1:]:
                raise GraphError(f"DataParallel.fit: the array for {t.label!r} has shape {a.shape}; the input takes "
                                 f"rows of shape {t.shape[1:]}")
            index = bool(g.nodes.flags[t.id] & F_INDEX)
            if (index and a.dtype.kind not in "iu") or (not index and not np.can_cast(a.dtype, g.dtype, "same_kind")):
                raise GraphError(f"DataParallel.fit: the array for {t.label!r} has dtype {a.dtype}; the input takes "
                                 f"{'integers' if index else g.dtype}")
            if 0 <= n != a.shape[0]:
                raise GraphError(f"DataParallel.fit: arrays have different numbers of rows ({n} and {a.shape[0]} "
                                 f"for {t.label!r})")
            n = a.shape[0]
            arrays[t.id] = a
        missing = [g.label(i) for i in self.bwd.inputs if i not in arrays]
        if missing:
            raise GraphError(f"DataParallel.fit: no data for the program's input(s) {missing}")
        return arrays, n

    def fit(self, data: Dict[Union[Tensor, str], Any], epochs: int = 1, batch_size: Optional[int] = None,
            shuffle: bool = True, seed: int = 0, progress: bool = True, resume: bool = True,
            checkpoint: Optional[str] = None, checkpoint_every: Optional[int] = None,
            callback: Optional[Callable[[int, float], None]] = None) -> List[float]:
        """Train for ``epochs`` passes over ``data`` ({input tensor or name: array}) in
        global batches of ``batch_size`` = num_workers x the program's batch (the default),
        the batches of ``jg.batches(data, batch_size, shuffle, seed + epoch)``; returns
        each step's loss (the mean of the workers' losses).

        A fit that stopped early (an error, a crash after ``dp.save``) is resumed by
        calling fit with the same data and arguments (``resume=False`` starts anew).
        ``checkpoint``: a path ``save`` writes every ``checkpoint_every`` steps (default:
        each epoch).  ``callback(step, loss)`` runs after each step (steps counted from 1)."""
        self._alive("fit")
        arrays, n = self._data(data)
        N, b = self.num_workers, self.batch
        if batch_size is None:
            batch_size = N * b
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size != N * b:
            raise GraphError(f"DataParallel.fit: batch_size {batch_size!r} is not num_workers ({N}) x the program's "
                             f"batch ({b}) = {N * b}; each worker runs the program on an equal shard of a batch")
        epochs = _int(epochs, "epochs", 1)
        if n < batch_size:
            raise GraphError(f"DataParallel.fit: {n} rows of data are fewer than one batch of {batch_size}")
        per_epoch = n // batch_size
        run = {"batch_size": int(batch_size), "shuffle": bool(shuffle), "seed": int(seed), "rows": int(n)}
        start = 0
        if self.position is not None and resume:
            stopped = {k: self.position[k] for k in run}
            if stopped != run:
                raise GraphError(f"DataParallel.fit: an unfinished fit ({stopped}) stopped after step "
                                 f"{self.position['step']}; fit with the same arguments resumes it, resume=False "
                                 f"starts anew")
            start = int(self.position["step"])
        if start > epochs * per_epoch:
            raise GraphError(f"DataParallel.fit: the fit to resume is at step {start}, past the "
                             f"{epochs * per_epoch} steps of {epochs} epochs")
        every = _int(checkpoint_every, "checkpoint_every", 1) if checkpoint_every is not None else per_epoch
        self.step_times = []
        total = epochs * per_epoch
        bar = tqdm(total=(total - start) * batch_size, unit="sample", leave=False,
                   desc=f"fit on {N} worker{'s' if N > 1 else ''}", disable=not progress)
        epoch_rows: Dict[int, List[np.ndarray]] = {}

        def rows_of(step):
            e = step // per_epoch
            if e not in epoch_rows:
                for old in [x for x in epoch_rows if x < e - 1]:
                    del epoch_rows[old]
                epoch_rows[e] = list(batch_rows(n, batch_size, shuffle, seed + e, "DataParallel.fit"))
            return epoch_rows[e][step % per_epoch]
        losses: List[float] = []
        self._last_end = None
        running = None
        k = reported = start
        lost = 0
        try:
            self._pull()
            self._data_ref = ray.put(arrays)
            self._prepare(start)
            while k < total:
                epoch = k // per_epoch
                try:
                    ahead = (rows_of(k + 1), seed + k + 1) if k + 1 < total else None
                    loss = self._step(rows_of(k), seed + k, k, ahead)
                    if (k + 1) % per_epoch == 0 or k + 1 == total:
                        self._pull(in_fit=True)    # the driver's state, to restart from if every replica is lost
                except _AllLost:
                    lost += 1
                    if lost > self.max_restarts:
                        raise GraphError(f"DataParallel: every worker died, {lost} times in a row; giving up "
                                         f"(max_restarts={self.max_restarts})") from None
                    k = self._restart_all()
                    del losses[k - start:]
                    continue
                lost = 0
                k += 1
                losses.append(loss)
                self.position = dict(run, step=k)
                if k <= reported:              # a step redone after every replica was lost: told once
                    continue
                reported = k
                running = loss if running is None else 0.95 * running + 0.05 * loss
                bar.update(batch_size)
                bar.set_postfix(epoch=epoch + 1, loss=f"{running:.4f}", refresh=False)
                if checkpoint is not None and k % every == 0:
                    self.save(checkpoint)
                if callback is not None:
                    callback(k, loss)
            self.position = None
        finally:
            bar.close()
            self._ahead = self._data_ref = None
            for w in self.workers:
                w.set_data.remote(None)                      # frees the data in the object store
        return losses

    def _restart_all(self):
        """Every replica died: new workers from the driver's last pulled state.  Returns
        the fit's step count at that state (the steps since are redone: the same bits)."""
        self._stale = False
        for i in range(len(self.workers)):
            self._respawn(i)
        self._prepare(self._driver_steps)
        return self._driver_steps

    def _step(self, rows, base, k, ahead=None):
        """Step k on the global batch ``rows``: each worker computes its shard's
        gradients, then every worker averages all of them and steps.  ``ahead``: step
        k+1's (rows, base), whose gradients the workers compute next, while the driver
        takes in step k's answers."""
        N = self.num_workers
        t0 = time.perf_counter()
        hyper = self.opt._hyper()
        tries = [0] * N
        while True:
            acks, failed = self._try_step(self._calls(rows, base), hyper, k, ahead)
            if failed is None:
                break
            acks = self._recover(k, tries, failed)
            if acks is not None:               # the survivors had taken the step
                break
        self._stale = True
        t1 = time.perf_counter()
        t0, self._last_end = (self._last_end if self._last_end is not None else t0), t1
        done = [a for a in acks if a is not None]
        results = done[0][1]                   # every answer carries every shard's run information
        applied = [a[0] for a in done]
        compute = max(r[1] for r in results)
        optimizer = max(a[1] for a in applied)
        self.step_times.append({"step": t1 - t0, "compute": compute, "optimizer": optimizer,
                                "all_reduce": (t1 - t0) - compute - optimizer, "mean": max(a[0] for a in applied),
                                "compute_cpu": max(r[2] for r in results),
                                # perf_counter is the machine's monotonic clock: comparable across processes on a node
                                "exchange": max(0.0, max(a[3] for a in applied) - max(r[3] for r in results))})
        loss = 0.0
        for r in results:
            loss += r[0]
        return loss / N

    def _calls(self, rows, base):
        """Each worker's (rows of its shard, dropout seed) for a step."""
        N, b = self.num_workers, self.batch
        return [(rows[i * b:(i + 1) * b], base * N + i) for i in range(N)]

    def _try_step(self, calls, hyper, k, ahead):
        """One try at step k: (each worker's answer, None where it was lost; the failure
        to recover from).  A worker's GraphError is raised, once every answer is in.
        Step k+1's gradient runs are queued behind step k's (an actor runs its calls in
        order), so the workers go on while the driver takes in the answers."""
        prefetched, self._ahead = self._ahead, None
        parts = prefetched[1] if prefetched and prefetched[0] == k else [
            w.grads.remote(*c) for w, c in zip(self.workers, calls)]
        refs = [w.apply.remote(hyper, *parts) for w in self.workers]
        if ahead is not None:
            self._ahead = (k + 1, [w.grads.remote(*c) for w, c in zip(self.workers, self._calls(*ahead))])
        acks: List[Any] = [None] * len(self.workers)
        failed: Optional[BaseException] = None
        error = None
        for i, ref in enumerate(refs):
            try:
                acks[i] = ray.get(ref)
            except RayTaskError as e:
                if isinstance(getattr(e, "cause", None), GraphError):
                    error = error or (e, i)    # a worker raised (every worker's answer carries it): nobody steps
                else:
                    failed = e                 # a dead worker's gradients never came
            except DIED as e:
                failed = e
        if error is not None or failed is not None:
            self._ahead = None                 # computed by replicas that may change: computed again
        if error is not None:
            raise self._worker_error(error[0], error[1], k) from None
        return acks, failed

    def _recover(self, k, tries, error):
        """After ``error`` in step k: replace the dead workers by copies of a live
        replica.  Returns the answers of the replicas that had taken the step (None in
        the others' places), or None if none had: the step is to be redone."""
        while True:
            alive = {}
            for i, w in enumerate(self.workers):
                try:
                    alive[i] = ray.get(w.steps_done.remote())
                except DIED:
                    pass
            if not alive:
                raise _AllLost
            if len(alive) == len(self.workers):    # nobody died: the step itself failed
                raise GraphError(f"DataParallel: step {k + 1} failed on a worker: {error}") from None
            done = [i for i, (steps, _) in alive.items() if steps == k + 1]
            source = self.workers[done[0] if done else min(alive)]
            try:
                # through the driver: a ref the source owned would be lost if it died now (a kill
                # is asynchronous), and the new workers' set_state would fail unseen
                state_ref = ray.put(ray.get(source.state.remote()))
                break
            except DIED:                           # the source died too: look again
                continue
        for i in range(len(self.workers)):
            if i not in alive:
                tries[i] += 1
                self._replace(i, tries[i], state_ref)
            elif done and alive[i][0] != k + 1:
                self.workers[i].set_state.remote(state_ref)
        return [alive[i][1] if i in done else None for i in range(len(self.workers))] if done else None

    def timing(self) -> Dict[str, float]:
        """Medians over the last fit's steps (the first left out: it loads the workers'
        data): seconds per ``step``; of the slowest worker's ``bwd.run`` (``compute``); of
        the slowest worker's ``optimizer`` step; of the ``all_reduce``, the rest of the
        step -- of which ``mean`` is the slowest worker's average of the gradients it read
        (the remainder: gradients into the object store, and the driver's calls) -- and
        ``all_reduce_share`` of a step; ``exchange``, from the end of the last worker's
        ``bwd.run`` to the gradients' arrival at the workers (clocks of different
        processes: meaningful when the workers share a machine).  ``compute_cpu``
        is the CPU time of the slowest worker's ``bwd.run`` (of its calling thread): well
        below ``compute``, the workers were waiting for a core."""
        rows = self.step_times[1:] or self.step_times
        if not rows:
            raise GraphError("DataParallel.timing: no fit has run yet")
        med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
        med["all_reduce_share"] = med["all_reduce"] / med["step"]
        return med

    # ---- results, saving, ending -----------------------------------------------------------------------
    def params(self) -> Dict[str, np.ndarray]:
        """{param name: value} of every param of the graph (copies): the replicas' params
        (pulled from a worker into the driver's graph if they stepped since)."""
        self._pull()
        g = self.bwd.graph
        return {g.label(p): g.tensor(p).value for p in g.params}

    def worker_params(self) -> List[Dict[str, np.ndarray]]:
        """What each worker holds, as ``params()``: the same bits on every worker."""
        self._alive("worker_params")
        params = [self.bwd.graph.tensor(p) for p in self._param_ids]
        return [{p.label: v.reshape(p.shape) for p, v in zip(params, vals)}
                for vals in ray.get([w.param_values.remote() for w in self.workers])]

    def save(self, path: str) -> None:
        """Write the program, the optimizer and where an unfinished fit stands to one
        .npz (``jg.save`` bytes plus JSON: no pickles); ``DataParallel.load`` resumes."""
        self._pull()
        meta = {"magic": MAGIC, "version": VERSION, "num_workers": self.num_workers,
                "threads_per_worker": self.threads, "position": self.position}
        blob = to_bytes({"bwd": self.bwd, "opt": self.opt})
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:           # a file object: numpy adds no .npz suffix
            np.savez(f, model=np.frombuffer(blob, np.uint8), meta=np.array(json.dumps(meta)))
        os.replace(tmp, path)                # a crash while writing leaves the previous checkpoint

    @classmethod
    def load(cls, path: str, num_workers: Optional[int] = None, address: Optional[str] = None,
             threads_per_worker: Optional[int] = None, max_restarts: int = 3) -> "DataParallel":
        """A DataParallel from what ``save`` wrote (workers and threads as saved unless
        given); ``fit`` with the saved run's arguments continues where it stopped.  The
        program and optimizer are ``dp.bwd`` and ``dp.opt`` (a new graph: feed
        ``dp.bwd.graph``'s inputs, or their names)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                blob, meta = z["model"].tobytes(), json.loads(str(z["meta"]))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise GraphError(f"DataParallel.load {path!r}: not a DataParallel checkpoint "
                             f"({type(e).__name__}: {e})") from None
        if not isinstance(meta, dict) or meta.get("magic") != MAGIC or meta.get("version") != VERSION:
            raise GraphError(f"DataParallel.load {path!r}: not a version-{VERSION} DataParallel checkpoint")
        objs = from_bytes(blob)
        dp = cls(objs["bwd"], objs["opt"], num_workers if num_workers is not None else meta["num_workers"], address,
                 threads_per_worker if threads_per_worker is not None else meta["threads_per_worker"], max_restarts)
        dp.position = meta["position"]
        return dp

    def shutdown(self) -> None:
        """End the workers (and the Ray instance, if this DataParallel started it); the
        driver's graph and optimizer keep the replicas' last state."""
        try:
            self._pull()
        except Exception as e:         # the workers are gone: nothing left to pull
            warnings.warn(f"DataParallel.shutdown: could not pull the replicas' state ({e})", stacklevel=2)
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:          # already gone
                pass
        self.workers = []
        self._state_ref = self._data_ref = self._blob = None
        if self._own_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "DataParallel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = f"{len(self.workers)} workers" if self.workers else "shut down"
        return (f"<DataParallel {self.num_workers} x batch {self.batch}, {state}, {self.opt.kind}, "
                f"{self.restarts} restarts>")
