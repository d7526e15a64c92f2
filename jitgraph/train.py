"""A minimal training loop: minibatches through ``bwd.run``, an optimizer step each,
and a tqdm progress bar showing the running loss."""
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
from tqdm.auto import tqdm

from .errors import GraphError
from .graph import Tensor
from .optim import Optimizer
from .program import BackwardGraph


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


def batch_rows(n_rows: int, batch_size: int, shuffle: bool = True, seed: int = 0,
               what: str = "batches") -> Iterator[np.ndarray]:
    """The row numbers of each batch ``batches`` yields: ``n_rows // batch_size`` batches
    of ``batch_size`` rows of one permutation drawn from ``seed`` (or in order)."""
    if not (isinstance(batch_size, int) and 0 < batch_size <= n_rows):
        raise GraphError(f"{what}: batch_size must be an int in [1, {n_rows}], got {batch_size!r}")
    idx = np.random.default_rng(seed).permutation(n_rows) if shuffle else np.arange(n_rows)
    for start in range(0, n_rows - batch_size + 1, batch_size):
        yield idx[start:start + batch_size]


def batches(data: Dict[Tensor, Any], batch_size: int, shuffle: bool = True,
            seed: int = 0) -> Iterator[Dict[Tensor, np.ndarray]]:
    """Feed dicts of ``batch_size`` rows from ``data`` ({input tensor: array}, equal
    first dims).  The last partial batch is dropped: a graph's shapes are fixed."""
    arrays, n = data_arrays(data)
    for rows in batch_rows(n, batch_size, shuffle, seed):
        yield {t: a[rows] for t, a in arrays.items()}


def train(bwd: BackwardGraph, optimizer: Optimizer, data: Dict[Tensor, Any], epochs: int = 1,
          batch_size: Optional[int] = None, shuffle: bool = True, seed: int = 0, progress: bool = True,
          desc: str = "train") -> List[float]:
    """Train for ``epochs`` passes over ``data`` ({input tensor: array}) in minibatches
    of ``batch_size`` rows (default: the graph's input batch), reshuffled each epoch
    from ``seed``; step k runs with dropout seed ``seed + k`` (fresh masks each step).
    Returns the loss of every step (floats)."""
    if batch_size is None:
        first = next(iter(data), None)
        if not isinstance(first, Tensor) or not first.shape:
            raise GraphError("train: give batch_size, or data keyed by input tensors with a batch axis")
        batch_size = first.shape[0]
    n_rows = len(next(iter(data.values())))
    per_epoch = n_rows // batch_size
    bar = None
    losses: List[float] = []
    running = None
    try:
        for epoch in range(epochs):
            for feeds in batches(data, batch_size, shuffle, seed + epoch):
                loss = float(bwd.run(feeds, seed=seed + len(losses)))
                optimizer.step()
                losses.append(loss)
                running = loss if running is None else 0.95 * running + 0.05 * loss
                if progress and bar is None:
                    # the bar opens after the first step: what compiles then has its own line
                    # (compiler.CompileLine), and the rate and ETA count the steps after it; none
                    # where stderr is no terminal (disable=None): a log would keep every frame
                    bar = tqdm(total=epochs * per_epoch, initial=1, desc=desc, unit="step", leave=False,
                               disable=None)
                elif bar is not None:
                    bar.update(1)
                if bar is not None:
                    bar.set_postfix(epoch=epoch + 1, loss=f"{running:.4f}", refresh=False)
    finally:
        if bar is not None:
            bar.close()
    return losses
