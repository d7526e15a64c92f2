"""Filling the compiled-code cache ahead of time: ``jitgraph warmup``.

A first run compiles what it uses, as it uses it (compiler.py).  For CI images,
Docker builds and cluster nodes it is better to pay that once, in parallel, when
the image is made: ``warmup`` compiles the graph passes (by building, running,
differentiating and checkpointing a small model) and the runner of every op for
each requested dtype, spread over all cores (gradient rules are data: nothing to compile).
"""
import hashlib
import os
import shutil
import sys
import time
from typing import Dict, Iterable, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from . import _cache, compiler, registry
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
# what an install compiles (setup.py): the float32 kernels of the programs people write first --
# MLPs, transformers, the demo -- beside the graph passes.  The rest compiles on first use.
# Each op's runner is its own compile (1-3 s of a core here), so the set is what the demo, MLPs and
# the first transformer need; an install also compiles the passes of plain and sqrt-checkpointed programs.
COMMON = ("add", "sub", "mul", "sum", "mean", "broadcast", "matmul", "relu", "relu_d", "gelu", "gelu_grad", "softmax",
          "softmax_d", "cross_entropy", "cross_entropy_d", "cross_entropy_index", "cross_entropy_index_d",
          "layer_norm", "layer_norm_d", "dropout", "embedding", "scatter_add", "transpose")


def _passes(dtype: str, every: bool = True) -> None:
    """Build, run, differentiate (plain, checkpointed on one level and, with ``every``, on
    several, under a budget and fused) and step a small model: compiles the graph passes, the
    interpreter, the block runner (which this model is too small to need) and the optimizers."""
    if every:
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
    if every:
        build_backward(fwd, checkpoints="revolve", slots=1).run(feeds)     # the multi-level schedule
        try:                                   # the budget planner (this small model may not fit it)
            build_backward(fwd, memory_budget=int(0.9 * plain.peak_bytes)).run(feeds)
        except GraphError:
            pass
        fused = build_backward(build_forward(cross_entropy(h, t), fuse=True), fuse=True)     # the fusion pass
        fused.run(feeds)
    AdamW(params).step()
    SGD(params, lr=0.1, momentum=0.9).step()
    none = np.zeros(0, np.int64)                  # batch norms' running-statistics update
    update_running(np.zeros(1, g.dtype), np.zeros(1, g.dtype), none, none, none, none, np.zeros(0), np.zeros(0))


def units(dtypes: Iterable[str], ops: Optional[Iterable[str]] = None) -> list:
    """Every op's runner, and every fusable op's chunk runner, for each dtype (only the ops
    named in ``ops``, when given)."""
    wanted = [registry.OPS[registry.BY_NAME[name].code] for name in ops] if ops is not None else \
        list(registry.OPS.values())
    return ([("run", op.code, dt) for dt in dtypes for op in wanted if op.runner is not None]
            + [("chunk", op.code, dt) for dt in dtypes for op in wanted if op.chunk is not None])


def warmup(dtypes: Sequence[str] = ("float32",), progress: bool = True,
           ops: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Compile the graph passes and every op's runners for ``dtypes`` into the cache, on all
    cores -- or, given ``ops`` (e.g. COMMON), those ops' runners (not their group loops) and
    the passes of plain and sqrt-checkpointed programs; returns {"functions": runners
    compiled, "seconds": wall time}."""
    for dt in dtypes:
        if dt not in DTYPES:
            raise ValueError(f"warmup: dtype {dt!r} is not one of {', '.join(DTYPES)}")
    unknown = [name for name in ops or () if name not in registry.BY_NAME]
    if unknown:
        raise ValueError(f"warmup: no op named {', '.join(map(repr, unknown))}")
    start = time.perf_counter()
    todo = [u for u in units(dtypes, ops) if not compiler.is_cached(*u) and (ops is None or u[0] == "run")]
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
            _passes(dt, every=ops is None)
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


def precompile() -> int:
    """What ``pip install`` runs (setup.py, in the built package folder): the graph passes and
    the COMMON float32 kernels -- or the ops JITGRAPH_PRECOMPILE names, comma-separated --
    into the package's own cache folder, saying so on stderr (``pip install -v`` shows it)."""
    asked = os.environ.get("JITGRAPH_PRECOMPILE", "").strip()
    ops = COMMON if asked in ("", "1") else tuple(name.strip() for name in asked.split(",") if name.strip())
    # a rebuild of the same sources for the same set on this machine (a reinstall, CI) reuses the
    # earlier build's code, kept in the user's cache under the folder's key and the set's
    which = hashlib.sha256(",".join(sorted(ops)).encode()).hexdigest()[:8]
    kept = os.path.join(_cache.user_root(), "builds", f"k-{_cache.KEY}-{which}")
    if os.path.isfile(os.path.join(kept, _cache.INSTALLED)):
        shutil.rmtree(_cache.CACHE_DIR, ignore_errors=True)
        if _cache.copy_folder(kept, _cache.CACHE_DIR):
            print(f"jitgraph: the graph passes and {len(ops)} float32 ops' kernels, as this machine compiled "
                  f"them for an earlier build of the same sources ({kept})", file=sys.stderr, flush=True)
            return 0
    print(f"jitgraph: compiling the graph passes and {len(ops)} float32 ops' kernels into "
          f"{_cache.CACHE_DIR} (the first run after this install loads them)", file=sys.stderr, flush=True)
    got = warmup(["float32"], progress=False, ops=ops)
    open(os.path.join(_cache.CACHE_DIR, _cache.INSTALLED), "w").close()     # what _cache._adopt_shipped looks for
    print(f"jitgraph: compiled {int(got['functions'])} kernels and the passes in {got['seconds']:.1f} s",
          file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    _cache.copy_folder(_cache.CACHE_DIR, kept)
    _cache.prune(os.path.dirname(kept), kept)
    return 0
