"""Data-parallel training on a Ray cluster: ``DataParallel`` (the optional extra
``pip install "jitgraph[ray]"``; ``import jitgraph`` never imports Ray, this module does).

The program ``bwd`` is built for one worker's shard: its inputs' first axis holds b
rows.  A global batch of N * b rows -- the batch ``jg.batches`` gives with the same
arguments -- is cut into N contiguous shards, shard i for worker i, and a step goes:

1. each worker (a Ray actor holding the program, loaded from ``jg.save`` bytes: no
   pickled code) copies the current params from the object store into its graph, runs
   ``bwd.run`` on its shard with dropout seed ``(seed + step) * N + i`` and returns its
   loss and gradients through the object store;
2. the driver adds the gradients in worker order and divides by N -- a fixed reduction
   order, so two runs with the same seed and N are bit-identical -- into its own
   program's gradient slots, and takes the optimizer step;
3. the driver puts the new params into the object store (one object every worker
   reads; zero-copy on a node) for the next step.

The optimizer steps once, on the driver, and every replica receives the same bits, so
replicas cannot drift apart.  Stepping on every worker instead would move the same
bytes (the averaged gradient instead of the params) and cost the same elementwise pass,
but then no single process would hold a step's params and optimizer state: the driver
does, so a worker that dies is replaced by a new actor that gets the last completed
step's params with the step it redoes, and ``dp.save`` writes them with no worker
involved.  Workers hold no optimizer.
"""
import json
import os
import tempfile
import time
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError
from tqdm.auto import tqdm

from . import _cache
from .errors import GraphError
from .graph import Tensor
from .io import load, save
from .ir import F_INDEX
from .optim import Optimizer
from .program import BackwardGraph
from .threads import set_num_threads
from .train import batch_rows

MAGIC = "jitgraph-dataparallel"
VERSION = 1
DIED = (RayActorError, WorkerCrashedError, ObjectLostError)   # the worker or its result is gone: replace it
CHUNK = 1 << 20                  # gradient elements per piece of the mean (the driver's threads share the pieces)


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


class Worker:
    """One replica, run as a Ray actor: the program loaded from ``jg.save`` bytes, which
    computes the loss and gradients of its shard with the params it is sent."""

    def __init__(self, blob: bytes, param_ids: List[int], threads: int) -> None:
        set_num_threads(threads)
        self.bwd: BackwardGraph = from_bytes(blob)
        g = self.bwd.graph
        self.slices = [g.tensor(i)._store_slice() for i in param_ids]
        self.grad_slots = [(int(self.bwd.off[n]), g.tensor(p).size)
                           for p, n in zip(self.bwd.params, self.bwd.grad_nodes) if n >= 0]
        self.data: Dict[int, np.ndarray] = {}

    def ready(self) -> Tuple[str, str]:
        """The source key and folder of the jitgraph this worker imported."""
        return _cache.KEY, _cache.PACKAGE_DIR

    def set_data(self, data: Optional[Dict[int, np.ndarray]]) -> None:
        self.data = data or {}

    def set_params(self, values: List[np.ndarray]) -> None:
        store = self.bwd.graph.store
        for (a, b), v in zip(self.slices, values):
            store[a:b] = v

    def param_values(self) -> List[np.ndarray]:
        store = self.bwd.graph.store
        return [store[a:b].copy() for a, b in self.slices]

    def grads(self, values: List[np.ndarray], rows: np.ndarray, salt: int) -> Tuple[float, Tuple[float, float, float],
                                                                                  List[np.ndarray]]:
        """(loss, (seconds copying the params in, seconds in bwd.run, CPU seconds of this
        thread in bwd.run), gradients) of the rows ``rows`` of the data."""
        t0 = time.perf_counter()
        self.set_params(values)
        g = self.bwd.graph
        feeds = {Tensor(g, i): a[rows] for i, a in self.data.items()}
        t1, c1 = time.perf_counter(), time.thread_time()
        loss = float(self.bwd.run(feeds, seed=salt))
        t2, c2 = time.perf_counter(), time.thread_time()
        mem = self.bwd.mem                 # views: Ray copies them into the object store on return
        return loss, (t1 - t0, t2 - t1, c2 - c1), [mem[o:o + n] for o, n in self.grad_slots]


def _mean_into(piece):
    """dst = (g_0 + g_1 + ... + g_{N-1}) / N, added in worker order: the same bits every run."""
    dst, parts = piece
    if len(parts) == 1:
        dst[:] = parts[0]
        return
    np.add(parts[0], parts[1], out=dst)
    for g in parts[2:]:
        np.add(dst, g, out=dst)
    np.divide(dst, len(parts), out=dst)


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
        self.position: Optional[Dict[str, Any]] = None    # where an unfinished fit stopped
        self.step_times: List[Dict[str, float]] = []      # per step of the last fit
        self.workers: List[Any] = []
        g = bwd.graph
        self._param_ids = list(g.params)                  # all of them: values set on the driver reach the workers
        self._slices = [g.tensor(p)._store_slice() for p in self._param_ids]
        self._grad_slots = [(int(bwd.off[n]), g.tensor(p).size) for p, n in zip(bwd.params, bwd.grad_nodes) if n >= 0]
        self._params_ref: Any = None
        self._data_ref: Any = None
        self._blob: Any = None
        self._pool = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="jitgraph-dp")
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(address=address, include_dashboard=False)
        try:
            cpus = ray.cluster_resources().get("CPU", 0)
            need = self.num_workers * self.threads
            if need > cpus:
                raise GraphError(f"DataParallel: {self.num_workers} workers x {self.threads} threads need {need} CPUs; "
                                 f"the Ray cluster has {cpus:g}")
            self._blob = ray.put(to_bytes(bwd))
            self._actor = ray.remote(Worker)
            self.workers = [self._spawn() for _ in range(self.num_workers)]   # they start while the driver warms up
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
        program's kernels, and makes ``opt`` read gradients from this program."""
        g = self.bwd.graph
        feeds = {g.tensor(n): np.zeros(g.shape_of(n), np.int64 if g.nodes.flags[n] & F_INDEX else g.dtype)
                 for n in self.bwd.inputs}
        self.bwd.run(feeds)

    def _spawn(self):
        # the workers import the jitgraph this driver imported, wherever it lives
        here = os.path.dirname(_cache.PACKAGE_DIR)
        env = {"PYTHONPATH": here + os.pathsep + "${PYTHONPATH}"}
        return self._actor.options(num_cpus=self.threads, max_restarts=0, scheduling_strategy="SPREAD",
                                   runtime_env={"env_vars": env}).remote(self._blob, self._param_ids, self.threads)

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
    def _replace(self, i, tries):
        if tries > self.max_restarts:
            raise GraphError(f"DataParallel: worker {i} died {tries} times in a row; giving up "
                             f"(max_restarts={self.max_restarts})")
        try:
            ray.kill(self.workers[i])
        except Exception:              # already gone
            pass
        self.workers[i] = self._spawn()
        self.restarts += 1
        if self._data_ref is not None:
            self.workers[i].set_data.remote(self._data_ref)     # queued before any call that follows

    def _on_all(self, method, *args):
        """Call ``method`` on every worker and wait; a dead worker is replaced and called again."""
        tries = [0] * len(self.workers)
        todo = list(range(len(self.workers)))
        while todo:
            refs = [getattr(self.workers[i], method).remote(*args) for i in todo]
            again = []
            for i, ref in zip(todo, refs):
                try:
                    ray.get(ref)
                except DIED:
                    tries[i] += 1
                    self._replace(i, tries[i])
                    again.append(i)
            todo = again

    def _worker_error(self, e, i, step):
        cause = getattr(e, "cause", None)
        if isinstance(cause, GraphError):
            return GraphError(f"DataParallel: worker {i} failed in step {step + 1}: {cause}")
        return e

    def _put_params(self):
        store = self.bwd.graph.store
        self._params_ref = ray.put([store[a:b] for a, b in self._slices])     # one copy, into the object store

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
        bar = tqdm(total=(epochs * per_epoch - start) * batch_size, unit="sample", leave=False,
                   desc=f"fit on {N} worker{'s' if N > 1 else ''}", disable=not progress)
        losses: List[float] = []
        running = None
        try:
            self._data_ref = ray.put(arrays)
            self._on_all("set_data", self._data_ref)
            self._put_params()
            for epoch in range(start // per_epoch, epochs):
                for j, rows in enumerate(batch_rows(n, batch_size, shuffle, seed + epoch, "DataParallel.fit")):
                    k = epoch * per_epoch + j
                    if k < start:
                        continue
                    loss = self._step(rows, seed + k, k)
                    losses.append(loss)
                    self.position = dict(run, step=k + 1)
                    running = loss if running is None else 0.95 * running + 0.05 * loss
                    bar.update(batch_size)
                    bar.set_postfix(epoch=epoch + 1, loss=f"{running:.4f}", refresh=False)
                    if checkpoint is not None and (k + 1) % every == 0:
                        self.save(checkpoint)
                    if callback is not None:
                        callback(k + 1, loss)
            self.position = None
            self._on_all("set_params", self._params_ref)     # every replica ends with the driver's params
        finally:
            bar.close()
            self._data_ref = None
            if self.workers:
                for w in self.workers:
                    w.set_data.remote(None)                   # frees the data in the object store
        return losses

    def _step(self, rows, base, k):
        """One step on the global batch ``rows``: shards out, gradients back, mean, optimizer step."""
        N, b = self.num_workers, self.batch
        t0 = time.perf_counter()
        shards = [rows[i * b:(i + 1) * b] for i in range(N)]

        def call(i):
            return self.workers[i].grads.remote(self._params_ref, shards[i], base * N + i)

        pending = {call(i): i for i in range(N)}
        results = [None] * N
        tries = [0] * N
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except RayTaskError as e:
                raise self._worker_error(e, i, k) from None
            except DIED:               # the step is redone on a new worker, from the same params
                tries[i] += 1
                self._replace(i, tries[i])
                pending[call(i)] = i
        t1 = time.perf_counter()
        with self.bwd.lock:
            if self.bwd.graph.grads_owner is not self.bwd:     # another program ran: read gradients from ours
                self._warm_up()
            mem = self.bwd.mem
            grads = [r[2] for r in results]
            pieces = [(mem[o + lo:o + min(lo + CHUNK, size)], [g[j][lo:lo + CHUNK] for g in grads])
                      for j, (o, size) in enumerate(self._grad_slots) for lo in range(0, size, CHUNK)]
            if len(pieces) > 1 and sum(size for _, size in self._grad_slots) > CHUNK:
                # the workers wait for this: the driver has the cores (numpy lets go of the GIL)
                list(self._pool.map(_mean_into, pieces))
            else:
                for piece in pieces:
                    _mean_into(piece)
            t2 = time.perf_counter()
            self.opt.step()
        t3 = time.perf_counter()
        self._put_params()
        t4 = time.perf_counter()
        compute = max(r[1][1] for r in results)
        self.step_times.append({"step": t4 - t0, "compute": compute, "optimizer": t3 - t2,
                                "all_reduce": (t4 - t0) - compute - (t3 - t2), "params_in": max(r[1][0] for r in results),
                                "mean": t2 - t1, "params_out": t4 - t3,
                                "compute_cpu": max(r[1][2] for r in results)})
        loss = 0.0
        for r in results:
            loss += r[0]
        return loss / N

    def timing(self) -> Dict[str, float]:
        """Medians over the last fit's steps (the first left out: it loads the workers'
        data): seconds per ``step``; of the slowest worker's ``bwd.run`` (``compute``); of
        the ``optimizer`` step; of the ``all_reduce``, the rest of the step -- of which
        ``params_out`` puts the params into the object store, ``params_in`` copies them
        into a worker's graph, ``mean`` averages the gradients (and the remainder moves
        them and calls the workers) -- and ``all_reduce_share`` of a step.  ``compute_cpu``
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
        """{param name: value} of every param of the graph (copies): the replicas' params."""
        g = self.bwd.graph
        return {g.label(p): g.tensor(p).value for p in g.params}

    def worker_params(self) -> List[Dict[str, np.ndarray]]:
        """What each worker holds, as ``params()``: after a fit, the driver's bits."""
        self._alive("worker_params")
        params = [self.bwd.graph.tensor(p) for p in self._param_ids]
        return [{p.label: v.reshape(p.shape) for p, v in zip(params, vals)}
                for vals in ray.get([w.param_values.remote() for w in self.workers])]

    def save(self, path: str) -> None:
        """Write the program, the optimizer and where an unfinished fit stands to one
        .npz (``jg.save`` bytes plus JSON: no pickles); ``DataParallel.load`` resumes."""
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
        """End the workers (and the Ray instance, if this DataParallel started it)."""
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:          # already gone
                pass
        self.workers = []
        self._params_ref = self._data_ref = self._blob = None
        self._pool.shutdown(wait=False)
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
