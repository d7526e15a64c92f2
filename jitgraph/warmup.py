"""Filling the compiled-code cache ahead of time: ``jitgraph warmup``.

A first run compiles what it uses, as it uses it (compiler.py).  For CI images,
Docker builds and cluster nodes it is better to pay that once, in parallel, when
the image is made: ``warmup`` compiles the graph passes (by building, running,
differentiating and checkpointing a small model) and the runner of every op for
each requested dtype, spread over all cores (gradient rules are data: nothing to compile).
"""
import os
import time
from typing import Dict, Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from . import compiler, registry
from .autodiff import build_backward
from .errors import GraphError
from .graph import Graph
from .interpreter import block_runner
from .ops.binary import add
from .ops.linear import matmul
from .ops.softmaxes import cross_entropy
from .ops.unary import relu
from .optim import SGD, AdamW
from .program import build_forward
from .running import update_running

DTYPES = ("float32", "float64")


def _passes(dtype: str) -> None:
    """Build, run, differentiate (plain, checkpointed on one level and on several, under
    a budget) and step a small model: compiles the graph passes, the interpreter, the
    block runner (which this model is too small to need) and the optimizers."""
    block_runner(dtype)
    rng = np.random.default_rng(0)
    g = Graph(np.dtype(dtype))
    x = g.input((8, 16), name="x")
    t = g.input((8, 4), name="t")
    h = x
    params = []
    for i, (m, k) in enumerate(((16, 16), (16, 16), (16, 16), (16, 4))):
        W = g.param(rng.standard_normal((m, k)) * 0.3, name=f"W{i}")
        b = g.param(np.zeros(k), name=f"b{i}")
        params += [W, b]
        h = add(matmul(h, W), b)
        if k != 4:
            h = relu(h)
    fwd = build_forward(cross_entropy(h, t))
    feeds = {x: rng.standard_normal((8, 16)), t: np.eye(4)[rng.integers(0, 4, 8)]}
    fwd.run(feeds)
    plain = build_backward(fwd)
    plain.run(feeds)
    build_backward(fwd, checkpoints="sqrt").run(feeds)
    build_backward(fwd, checkpoints="revolve", slots=1).run(feeds)     # the multi-level schedule
    try:                                   # the budget planner (this small model may not fit it)
        build_backward(fwd, memory_budget=int(0.9 * plain.peak_bytes)).run(feeds)
    except GraphError:
        pass
    AdamW(params).step()
    SGD(params, lr=0.1, momentum=0.9).step()
    none = np.zeros(0, np.int64)                  # batch norms' running-statistics update
    update_running(np.zeros(1, g.dtype), np.zeros(1, g.dtype), none, none, none, none, np.zeros(0), np.zeros(0))


def units(dtypes: Iterable[str]) -> list:
    """Every op's runner, and every fusable op's chunk runner, for each dtype."""
    return ([("run", op.code, dt) for dt in dtypes for op in registry.OPS.values() if op.runner is not None]
            + [("chunk", op.code, dt) for dt in dtypes for op in registry.OPS.values() if op.chunk is not None])


def warmup(dtypes: Sequence[str] = ("float32",), progress: bool = True) -> Dict[str, float]:
    """Compile the graph passes and every op for ``dtypes`` into the cache, on all
    cores; returns {"functions": runners compiled, "seconds": wall time}."""
    for dt in dtypes:
        if dt not in DTYPES:
            raise ValueError(f"warmup: dtype {dt!r} is not one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    todo = [u for u in units(dtypes) if not compiler.is_cached(*u)]
    bar = None
    if progress and not compiler.quiet():
        bar = tqdm(total=len(todo) + len(dtypes), desc="jitgraph warmup", unit="fn", leave=True)
    if todo:
        compiler._spawn(todo)
    claims = compiler._claims()
    done = 0

    def advance():
        now = done + sum(compiler.is_cached(*u) for u in todo)
        if bar is not None:
            bar.update(now - bar.n)

    saved = {k: os.environ.get(k) for k in ("JITGRAPH_COMPILE_WORKERS", "JITGRAPH_QUIET")}
    os.environ["JITGRAPH_COMPILE_WORKERS"] = "0"          # the workers already use the other cores
    os.environ["JITGRAPH_QUIET"] = "1"                    # the bar says it all
    try:
        for dt in dtypes:
            _passes(dt)
            done += 1
            advance()
        for unit in todo:
            if compiler._claim(claims, unit):
                compiler._compile_unit(*unit)
                advance()
        while compiler._live():
            time.sleep(0.1)
            advance()
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
        if bar is not None:
            advance()
            bar.close()
    for unit in todo:                                      # a worker that died left these
        if not compiler.is_cached(*unit):
            compiler._compile_unit(*unit)
    return {"functions": len(todo), "seconds": time.perf_counter() - start}
