"""The training loop: minibatches (arrays or any iterable of feed dicts) through ``bwd.run``,
gradients accumulated over micro-batches, an optimizer step at the learning rate a schedule
gives, evaluation every n steps, callbacks that may stop, and checkpoints a run resumes from
bit for bit -- with a tqdm progress bar showing the running loss."""
import json
import math
import os
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import GraphError
from .graph import Tensor
from .ir import F_INDEX
from .optim import Optimizer
from .program import BackwardGraph, ForwardGraph, build_forward
from .registry import BATCH_STATS, DROPOUT


def data_arrays(data: Dict[Tensor, Any], what: str = "batches") -> Tuple[Dict[Tensor, np.ndarray], int]:
    """``data`` ({input tensor: array}, equal first dims) checked: (the arrays, their row count)."""
    if not data:
        raise GraphError(f"{what}: data must map input tensors to arrays")
    arrays = {}
    n = -1
    for t, a in data.items():
        if not isinstance(t, Tensor):
            raise GraphError(f"{what}: keys must be input tensors, got {type(t).__name__}")
        a = np.asarray(a)
        if a.ndim == 0:
            raise GraphError(f"{what}: the array for {t.label!r} has no rows")
        if n < 0:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise GraphError(f"{what}: arrays have different numbers of rows ({n} and {a.shape[0]} for {t.label!r})")
        arrays[t] = a
    return arrays, n


def check_batch_size(batch_size: Any, n_rows: int, what: str) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 0 < batch_size <= n_rows:
        raise GraphError(f"{what}: batch_size must be an int in [1, {n_rows}], got {batch_size!r}")


def batch_rows(n_rows: int, batch_size: int, shuffle: bool = True, seed: int = 0,
               what: str = "batches", keep_last: bool = False) -> Iterator[np.ndarray]:
    """The row numbers of each batch ``batches`` yields: ``n_rows // batch_size`` batches
    of ``batch_size`` rows of one permutation drawn from ``seed`` (or in order), then, with
    ``keep_last``, the rows left over (a partial batch) if any."""
    check_batch_size(batch_size, n_rows, what)
    idx = np.random.default_rng(seed).permutation(n_rows) if shuffle else np.arange(n_rows)
    end = n_rows if keep_last else n_rows - batch_size + 1
    for start in range(0, end, batch_size):
        yield idx[start:start + batch_size]


class Tail:
    """The program that takes a partial batch: ``program``'s model at ``rows`` rows (the same
    params; built by calling a jg.nn model on smaller inputs, or ``Imported.with_batch``).
    Their inputs pair up in the order they were made; each pair must differ only in the
    batch (first) axis."""

    def __init__(self, main: Any, tail: Any, what: str) -> None:
        if type(tail) is not type(main) or tail.graph is not main.graph:
            raise GraphError(f"{what}: tail must be a {type(main).__name__} on the same graph as the program "
                             f"(the same params), got {type(tail).__name__}")
        g, mine, theirs = main.graph, sorted(main.inputs), sorted(tail.inputs)
        if len(mine) != len(theirs):
            raise GraphError(f"{what}: the program reads {len(mine)} inputs and its tail {len(theirs)}")
        rows = {g.shape_of(n)[0] if g.shape_of(n) else None for n in theirs}
        self.rows = rows.pop() if len(rows) == 1 else None
        for a, b in zip(mine, theirs):
            sa, sb = g.shape_of(a), g.shape_of(b)
            if not sa or not sb or sa[1:] != sb[1:] or self.rows is None or \
                    (g.nodes.flags[a] & F_INDEX) != (g.nodes.flags[b] & F_INDEX):
                raise GraphError(f"{what}: tail input {g.label(b)!r} {sb} does not pair with {g.label(a)!r} {sa}: "
                                 "paired in the order they were made, they must differ only in the first axis, "
                                 "equal across the tail's inputs")
        if len(getattr(main, "outputs", ())) != len(getattr(tail, "outputs", ())):
            raise GraphError(f"{what}: the program has {len(main.outputs)} outputs and its tail {len(tail.outputs)}")
        self.main, self.program, self.pair = main, tail, {a: g.tensor(b) for a, b in zip(mine, theirs)}
        self.main_rows = g.shape_of(mine[0])[0] if mine else None

    def check_last(self, n_rows: int, batch_size: int, what: str) -> None:
        """GraphError unless the tail takes the rows batches of ``batch_size`` leave over."""
        if self.rows != n_rows % batch_size:
            raise GraphError(f"{what}: tail takes {self.rows} rows; the last partial batch has {n_rows % batch_size}")

    def route(self, feeds: Dict[Any, Any]) -> Tuple[Any, Dict[Any, Any]]:
        """(the program that takes ``feeds``, the feeds keyed for it): the tail when they
        have its rows and not the main program's."""
        first = np.shape(next(iter(feeds.values()))) if feeds else ()
        if not first or first[0] != self.rows or first[0] == self.main_rows:
            return self.main, feeds
        keyed = {}
        for k, v in feeds.items():
            n = self.main._resolve_feed_key(k)
            if n not in self.pair:
                raise GraphError(f"a batch of {self.rows} rows for the tail feeds {self.main.graph.label(n)!r}, "
                                 "which the training program does not read")
            keyed[self.pair[n]] = v
        return self.program, keyed


def batches(data: Dict[Tensor, Any], batch_size: int, shuffle: bool = True,
            seed: int = 0) -> Iterator[Dict[Tensor, np.ndarray]]:
    """Feed dicts of ``batch_size`` rows from ``data`` ({input tensor: array}, equal
    first dims).  The last partial batch is dropped: a graph's shapes are fixed."""
    arrays, n = data_arrays(data)
    for rows in batch_rows(n, batch_size, shuffle, seed):
        yield {t: a[rows] for t, a in arrays.items()}


class History(list):
    """What ``train`` returns: the loss of every optimizer step (a list of floats, the mean
    over its micro-batches), with ``evals`` -- (step, {metric: value}) of each evaluation --
    and ``stopped`` (a callback ended the run early)."""

    def __init__(self, losses: Iterable[float] = ()) -> None:
        super().__init__(losses)
        self.evals: List[Tuple[int, Dict[str, float]]] = []
        self.stopped = False


class EarlyStopping:
    """A callback: stop when the evaluation ``metric`` (an eval program output's name, or
    "loss" for the training loss) has not improved by ``min_delta`` for ``patience`` checks."""

    def __init__(self, metric: str = "loss", patience: int = 3, mode: str = "min", min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise GraphError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise GraphError(f"EarlyStopping: patience must be an int >= 1, got {patience!r}")
        self.metric, self.patience, self.mode, self.min_delta = metric, patience, mode, float(min_delta)
        self.best: Optional[float] = None
        self.waited = 0

    def __call__(self, info: Dict[str, Any]) -> bool:
        if self.metric == "loss" and not info["evaluated"]:
            value = info["loss"]
        elif not info["evaluated"]:
            return False
        elif self.metric not in info["eval"]:
            raise GraphError(f"EarlyStopping: no metric {self.metric!r}; the evaluation gives {sorted(info['eval'])}")
        else:
            value = info["eval"][self.metric]
        sign = 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (value - self.best) < -self.min_delta:
            self.best, self.waited = value, 0
            return False
        self.waited += 1
        return self.waited >= self.patience


class _Source:
    """The micro-batches of each epoch: from arrays ({input: array}, shuffled per epoch from
    seed + epoch), or from an iterable of feed dicts (or of tuples, with ``inputs``)."""

    def __init__(self, data: Any, batch_size: Optional[int], shuffle: bool, seed: int, epochs: int,
                 inputs: Optional[Sequence[Tensor]], tail: Optional[Tail] = None) -> None:
        self.arrays: Optional[Dict[Tensor, np.ndarray]] = None
        if isinstance(data, Mapping) and all(isinstance(k, Tensor) for k in data):
            self.arrays, n = data_arrays(dict(data), "train")
            if batch_size is None:
                first = next(iter(self.arrays))
                if not first.shape:
                    raise GraphError("train: give batch_size, or data keyed by input tensors with a batch axis")
                batch_size = first.shape[0]
            check_batch_size(batch_size, n, "train")
            if tail is not None:
                tail.check_last(n, batch_size, "train")
            self.n_rows, self.batch_size = n, batch_size
        elif isinstance(data, Mapping) or not hasattr(data, "__iter__"):
            raise GraphError("train: data must map input tensors to arrays, or be an iterable of feed dicts "
                             f"(a list, a torch DataLoader ...), got {type(data).__name__}")
        elif epochs > 1 and iter(data) is data:
            raise GraphError("train: an iterator can be read once; for several epochs pass something iterable "
                             "again (a list, a DataLoader)")
        self.data, self.shuffle, self.seed, self.inputs, self.tail = data, shuffle, seed, inputs, tail

    def epoch(self, k: int) -> Iterator[Dict[Any, Any]]:
        if self.arrays is not None:
            for rows in batch_rows(self.n_rows, self.batch_size, self.shuffle, self.seed + k, "train",
                                   keep_last=self.tail is not None):
                yield {t: a[rows] for t, a in self.arrays.items()}
            return
        for batch in self.data:
            if isinstance(batch, Mapping):
                yield dict(batch)
            elif isinstance(batch, (tuple, list)) and self.inputs is not None and len(batch) == len(self.inputs):
                yield dict(zip(self.inputs, batch))
            else:
                raise GraphError(f"train: a batch of {type(batch).__name__} is not a feed dict; pass dicts keyed by "
                                 "input tensors or names, or tuples with inputs=[x, y, ...] naming what they feed")


def _eval_program(bwd: BackwardGraph, program: Optional[ForwardGraph]) -> ForwardGraph:
    if program is not None:
        if not isinstance(program, ForwardGraph):
            raise GraphError(f"train: eval_program must be a ForwardGraph (jg.build_forward), got {type(program).__name__}")
        for t in program.outputs:
            if t.shape != ():
                raise GraphError(f"train: eval_program output {t.label!r} has shape {t.shape}; its outputs are the "
                                 "metrics, scalars (reduce with jg.mean)")
        return program
    ops = bwd.graph.nodes.op[bwd.forward.order]
    if np.isin(ops, (DROPOUT, BATCH_STATS)).any():
        raise GraphError("train: the loss has dropout or training-mode batch norm, which evaluation must not use; "
                         "pass eval_program=jg.build_forward(...) built in eval mode (model.eval())")
    return build_forward(bwd.loss)


def evaluate(program: ForwardGraph, data: Dict[Tensor, Any], batch_size: Optional[int] = None,
             tail: Optional[ForwardGraph] = None) -> Dict[str, float]:
    """Each scalar output of ``program`` averaged over ``data``'s batches, in order, weighted
    by their rows: {output name: value}.  The last partial batch runs through ``tail`` (the
    same model at that many rows: ``Tail``), or is left out -- a graph's shapes are fixed."""
    arrays, n = data_arrays(data, "evaluate")
    if batch_size is None:
        batch_size = min(next(iter(arrays)).shape[0], n)
    router = Tail(program, tail, "evaluate") if tail is not None else None
    if router is not None:
        router.check_last(n, batch_size, "evaluate")
    sums = np.zeros(len(program.outputs))
    count = 0
    for rows in batch_rows(n, batch_size, shuffle=False, what="evaluate", keep_last=router is not None):
        feeds = {t: a[rows] for t, a in arrays.items()}
        runner, feeds = router.route(feeds) if router is not None else (program, feeds)
        sums += [float(v) * len(rows) for v in runner.run(feeds)]
        count += len(rows)
    return {(t.name or t.label): float(v / count) for t, v in zip(program.outputs, sums)}


def _learning_rate(lr: Any, step: int) -> float:
    value = lr(step) if callable(lr) else lr
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or \
            not math.isfinite(value) or value < 0:
        raise GraphError(f"train: the learning rate at step {step} is {value!r}; it must be a finite number >= 0")
    return float(value)


def _training_bar(**kw: Any) -> Any:
    """A tqdm bar; tqdm is imported here, when a bar opens, so a process that never trains
    does not load it."""
    from tqdm.auto import tqdm
    return tqdm(**kw)


def train(bwd: BackwardGraph, optimizer: Optimizer, data: Any, epochs: int = 1,
          batch_size: Optional[int] = None, shuffle: bool = True, seed: int = 0, progress: bool = True,
          desc: str = "train", *, lr: Union[None, float, Callable[[int], float]] = None, accumulate: int = 1,
          inputs: Optional[Sequence[Tensor]] = None, eval_data: Optional[Dict[Tensor, Any]] = None,
          eval_program: Optional[ForwardGraph] = None, eval_every: Optional[int] = None,
          callbacks: Sequence[Callable[[Dict[str, Any]], Any]] = (), checkpoint_every: Optional[int] = None,
          checkpoint: Union[None, str, "os.PathLike[str]"] = None,
          resume: Union[None, str, "os.PathLike[str]"] = None, tail: Optional[BackwardGraph] = None) -> History:
    """Train for ``epochs`` passes over ``data`` and return the loss of every optimizer step.

    ``data``: {input tensor: array} (minibatches of ``batch_size`` rows, default the graph's
    input batch, reshuffled each epoch from ``seed``; the last partial batch is dropped), or
    any iterable of feed dicts -- a list, a generator for one epoch, a torch DataLoader
    (dicts keyed by inputs or their names, or tuples with ``inputs=[x, y]``).  Micro-batch k
    runs with dropout seed ``seed + k``.

    * ``tail``: the model at the last partial batch's rows (a BackwardGraph on the same params:
      a jg.nn model called on smaller inputs, or ``Imported.with_batch``); that batch then
      trains too, through it, as PyTorch's ``drop_last=False`` does (an iterable's batches
      of its rows go to it as well).  Not with ``accumulate`` > 1;

    * ``lr``: a number, or a schedule -- any callable of the step (``jg.schedules``:
      warmup + cosine, linear or step decay) -- set on the optimizer before each step;
    * ``accumulate=k``: each optimizer step takes the mean gradient of k micro-batches (their
      gradients added by ``run(accumulate=True)``); an epoch's last short group steps too;
    * ``eval_data`` ({input of the eval program: array}) evaluated every ``eval_every`` steps
      (default: at each epoch's end) by ``eval_program`` (a ForwardGraph whose scalar outputs
      are the metrics, e.g. built after ``model.eval()``; default: the loss, when it has no
      dropout or batch norm); results in ``History.evals``;
    * ``callbacks``: each called after every step with {step, epoch, loss, lr, evaluated,
      eval, history}; a true return value stops training (``jg.EarlyStopping``);
    * ``checkpoint_every=n`` with ``checkpoint=path``: every n steps, params and buffers, the
      optimizer's state and the loop's position are written to ``path`` (.npz, atomically);
      ``resume=path`` continues from it -- the same steps, losses and params, bit for bit, as
      the run that was not interrupted (given the same data and arguments).
    """
    for name, v, lo in (("epochs", epochs, 0), ("accumulate", accumulate, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise GraphError(f"train: {name} must be an int >= {lo}, got {v!r}")
    for name, every in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise GraphError(f"train: {name} must be an int >= 1, got {every!r}")
    if checkpoint_every is not None and checkpoint is None:
        raise GraphError("train: checkpoint_every needs checkpoint=path (where to write)")
    if lr is not None:
        _learning_rate(lr, 0)
    router = Tail(bwd, tail, "train") if tail is not None else None
    if router is not None and accumulate > 1:
        raise GraphError("train: tail with accumulate > 1: a step's gradients must come from one program")
    source = _Source(data, batch_size, shuffle, seed, epochs, inputs, router)
    evaluation: Optional[Tuple[ForwardGraph, Dict[Tensor, Any]]] = None
    if eval_data is not None:
        data_arrays(eval_data, "train (eval_data)")
        evaluation = (_eval_program(bwd, eval_program), eval_data)
    pos = {"step": 0, "epoch": 0, "in_epoch": 0, "micro": 0}
    history = History()
    config = {"seed": seed, "accumulate": accumulate, "shuffle": shuffle, "batch_size": batch_size, "epochs": epochs}
    if resume is not None:
        pos, history = _load_checkpoint(resume, bwd, optimizer, config)
    per_epoch = None if source.arrays is None else \
        -(-source.n_rows // source.batch_size) if router is not None else source.n_rows // source.batch_size
    bar = None
    running = history[-1] if history else None

    def after_step(epoch: int) -> bool:
        nonlocal bar, running
        loss = history[-1]
        running = loss if running is None else 0.95 * running + 0.05 * loss
        step = pos["step"]
        evaluated = evaluation is not None and eval_every is not None and step % eval_every == 0
        if evaluation is not None and evaluated:
            history.evals.append((step, evaluate(*evaluation)))
        info = {"step": step, "epoch": epoch, "loss": loss, "lr": optimizer.lr, "evaluated": evaluated,
                "eval": history.evals[-1][1] if history.evals else None, "history": history}
        stop = any([bool(cb(info)) for cb in callbacks])
        if checkpoint is not None and checkpoint_every is not None and step % checkpoint_every == 0:
            _save_checkpoint(checkpoint, bwd, optimizer, pos, history, config)
        if progress and bar is None:
            # the bar opens after the first step: what compiles then has its own line
            # (compiler.CompileLine), and the rate and ETA count the steps after it; none
            # where stderr is no terminal (disable=None): a log would keep every frame
            total = epochs * (math.ceil(per_epoch / accumulate) if per_epoch is not None else 0) or None
            bar = _training_bar(total=total, initial=step, desc=desc, unit="step", leave=False, disable=None)
        elif bar is not None:
            bar.update(1)
        if bar is not None:
            bar.set_postfix(epoch=epoch + 1, loss=f"{running:.4f}", refresh=False)
        return stop

    def take_step(micro_losses: List[float], epoch: int) -> None:
        """One optimizer step on the micro-batches' mean gradient, then what follows a step
        (evaluation, callbacks -- which may stop the run -- checkpoint, the bar)."""
        if lr is not None:
            optimizer.lr = _learning_rate(lr, pos["step"])
        optimizer.step(grad_scale=1.0 / len(micro_losses))
        pos["step"] += 1
        history.append(float(np.mean(micro_losses)) if len(micro_losses) > 1 else micro_losses[0])
        history.stopped = after_step(epoch)

    try:
        for epoch in range(pos["epoch"], epochs):
            pos["epoch"] = epoch
            micro: List[float] = []
            for k, feeds in enumerate(source.epoch(epoch)):
                if k < pos["in_epoch"]:
                    continue                      # resuming: these ran before the checkpoint
                runner, feeds = router.route(feeds) if router is not None else (bwd, feeds)
                micro.append(float(runner.run(feeds, accumulate=bool(micro), seed=seed + pos["micro"])))
                pos["micro"] += 1
                pos["in_epoch"] = k + 1
                if len(micro) == accumulate:
                    take_step(micro, epoch)
                    micro = []
                    if history.stopped:
                        return history
            if micro:                             # the epoch's last, short group
                take_step(micro, epoch)
                if history.stopped:
                    return history
            pos["in_epoch"] = 0
            if evaluation is not None and eval_every is None:
                history.evals.append((pos["step"], evaluate(*evaluation)))
    finally:
        if bar is not None:
            bar.close()
    return history


# ---- checkpoints: the loop's state in one .npz (no pickle) ----------------------------------------
def _save_checkpoint(path: Any, bwd: BackwardGraph, optimizer: Optimizer, pos: Dict[str, int], history: History,
                     config: Dict[str, Any]) -> None:
    g = bwd.graph
    opt = optimizer.state_dict()
    meta = {"pos": pos, "config": config, "losses": list(history), "evals": history.evals,
            "optimizer": {"kind": opt["kind"], "step": opt["step"], "hyper": opt["hyper"], "params": opt["params"]},
            "store_used": int(g.store_used), "dtype": g.dtype.name}
    arrays = {f"opt_{k}": v for k, v in opt["state"].items()}
    path = os.fspath(path)
    tmp = path + ".tmp.npz"
    np.savez(tmp, meta=np.array(json.dumps(meta)), store=g.store[:g.store_used], **arrays)
    os.replace(tmp, path)


def _load_checkpoint(path: Any, bwd: BackwardGraph, optimizer: Optimizer,
                     config: Dict[str, Any]) -> Tuple[Dict[str, int], History]:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GraphError(f"train: no checkpoint at {path!r} to resume from")
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            store = f["store"].copy()
            state = {k[4:]: f[k].copy() for k in f.files if k.startswith("opt_")}
    except (OSError, ValueError, KeyError) as e:
        raise GraphError(f"train: {path!r} is not a jitgraph training checkpoint ({e})") from None
    g = bwd.graph
    if meta["store_used"] != g.store_used or meta["dtype"] != g.dtype.name or store.size != g.store_used:
        raise GraphError(f"train: the checkpoint {path!r} holds {meta['store_used']} {meta['dtype']} values, this "
                         f"graph {g.store_used} {g.dtype.name}: it was written for another model")
    changed = [k for k, v in config.items() if k != "epochs" and meta["config"].get(k) != v]
    if changed:
        raise GraphError(f"train: resuming with other {', '.join(changed)} than the checkpoint's would not continue "
                         "the same run: " + ", ".join(f"{k}={meta['config'][k]!r}" for k in changed))
    optimizer.load_state_dict({**meta["optimizer"], "state": state})
    g.store[:g.store_used] = store
    history = History(meta["losses"])
    history.evals = [(int(s), dict(m)) for s, m in meta["evals"]]
    return {k: int(v) for k, v in meta["pos"].items()}, history
