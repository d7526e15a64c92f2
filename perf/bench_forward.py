"""Forward-run benchmark: jitgraph against numpy eager (workload ``forward``).

Run from the repository root (or ``jitgraph bench --only forward``):

    python perf/bench_forward.py            # full run (under a minute)
    python perf/bench_forward.py --quick    # tiny sizes, a smoke test

It takes the harness's options (``--help``) and writes its results like
``jitgraph bench`` (perf/results/<timestamp>/).  What it measures (the harness's
interleaved timing: median over repeats after a warm-up run, so JIT compilation is
never inside a timed figure):

1. Interpreter overhead: a chain of N tiny ops (an affine op, an add and a
   mul, in turn) on 16-element float32 tensors.  The tensors are so small that
   the time per node is almost all dispatch overhead.  numpy eager does the
   same N ops in a Python loop.  Also: the Python time to build the graph and
   the time of build_forward (ordering + memory planning).
2. An MLP forward, x (64, D) -> 8 x relu(h @ W + b) -> mean(h * h), where
   matmuls dominate.  Both contenders use the same float32 values and their
   results are checked to agree.

No assertion is made on timings.
"""
import os
import statistics
import sys
import time

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

import numpy as np  # noqa: E402

import jitgraph as jg  # noqa: E402

from . import harness  # noqa: E402
from .report import fmt_s, md_table  # noqa: E402

CHAIN_WIDTH = 16        # elements per tensor in the chain
MLP_BATCH = 64
MLP_LAYERS = 8
BUILD_REPEATS = 3       # graph builds are slow; their timings are a median of 3


# ---- 1. chain of tiny ops -------------------------------------------------------------

def build_chain(n):
    """The chain graph; returns (fwd, x, y, seconds to build nodes, seconds for build_forward)."""
    t0 = time.perf_counter()
    g = jg.Graph(np.float32)
    x = g.input((CHAIN_WIDTH,), name="x")
    y = g.input((CHAIN_WIDTH,), name="y")
    h = x
    for i in range(n):
        k = i % 3
        h = h * 1.0001 if k == 0 else (h + y if k == 1 else h * y)
    t1 = time.perf_counter()
    fwd = jg.build_forward(h)
    t2 = time.perf_counter()
    return fwd, x, y, t1 - t0, t2 - t1


def numpy_chain(xb, yb, n):
    """The same chain, eagerly: n numpy ops on 16-element float32 arrays.  Unrolled
    by three so the loop bookkeeping is not the i % 3 test of the graph builder."""
    s = np.float32(1.0001)
    h = xb
    for _ in range(n // 3):
        h = h * s
        h = h + yb
        h = h * yb
    for i in range(n - n % 3, n):
        k = i % 3
        h = h * s if k == 0 else (h + yb if k == 1 else h * yb)
    return h


def bench_chain(ctx, n):
    rng = np.random.default_rng(0)
    xb = rng.uniform(-1, 1, CHAIN_WIDTH).astype(np.float32)
    # y in [0.25, 0.75]: each (affine, add, mul) round contracts, so the values
    # settle near a fixed point instead of overflowing over 100k ops
    yb = rng.uniform(0.25, 0.75, CHAIN_WIDTH).astype(np.float32)

    # First call of the pipeline in this process, on a tiny chain: loads (or
    # compiles) the jitted passes and interpreter.  Reported, not mixed in below.
    t0 = time.perf_counter()
    small, sx, sy, _, _ = build_chain(30)
    small.run({sx: xb, sy: yb})
    first_call = time.perf_counter() - t0

    ctx.note("chain builds")
    builds = [build_chain(n) for _ in range(BUILD_REPEATS)]
    fwd, x, y = builds[-1][:3]
    t_nodes = statistics.median(b[3] for b in builds)
    t_build_fwd = statistics.median(b[4] for b in builds)
    del builds[:-1]
    feeds = {x: xb, y: yb}
    t0 = time.perf_counter()
    got = fwd.run(feeds)                       # first run: allocates the arena
    t_first_run = time.perf_counter() - t0
    want = numpy_chain(xb, yb, n)
    return {"n_ops": n, "n_nodes": fwd.stats()["n_nodes"], "first_call_s": first_call,
            "build_nodes_s": t_nodes, "build_forward_s": t_build_fwd, "first_run_s": t_first_run,
            "agree": bool(np.allclose(got, want, rtol=1e-4, atol=1e-6)),
            "max_rel_diff": float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30))),
            "timing": harness.timed(ctx, {"jitgraph": lambda: fwd.run(feeds),
                                          "numpy": lambda: numpy_chain(xb, yb, n)})}


def md_chain(c, repeats):
    n = c["n_ops"]
    t = c["timing"]["contenders"]
    t_jg, t_np = t["jitgraph"]["median_s"], t["numpy"]["median_s"]
    ratio = f"{c['timing']['ratios']['jitgraph/numpy']['median']:.3f}"
    rows = [["forward run, per op", fmt_s(t_jg / n), fmt_s(t_np / n), ratio],
            ["forward run, whole chain", fmt_s(t_jg), fmt_s(t_np), ratio],
            ["graph building (Python), per op", fmt_s(c["build_nodes_s"] / n), "-", "-"],
            ["build_forward, whole chain", fmt_s(c["build_forward_s"]), "-", "-"],
            ["build_forward, per op", fmt_s(c["build_forward_s"] / n), "-", "-"],
            ["first run of the built program", fmt_s(c["first_run_s"]), "-", "-"]]
    calls = f"{t['jitgraph']['calls_per_sample']} / {t['numpy']['calls_per_sample']}"
    return [f"### 1. Chain of {n:,} tiny ops (affine, add, mul in turn) on {CHAIN_WIDTH}-element float32 "
            f"tensors; median of {repeats} repeats, {calls} calls per sample (jitgraph / numpy)", ""] + md_table(
        ["figure", "jitgraph", "numpy eager", "jitgraph / numpy (median of per-repeat ratios)"], rows) + [
        "",
        f"* program order: {c['n_nodes']:,} nodes ({n:,} ops + {c['n_nodes'] - n} inputs); 'per op' divides "
        f"by the {n:,} ops.",
        "* forward run = fwd.run(feeds): binding the feeds, running every node, copying the output out.",
        "* numpy eager = a Python loop of the same ops, each allocating a new 16-element array.",
        f"* graph building and build_forward: median of {BUILD_REPEATS} builds of the whole chain.",
        f"* first jitgraph call in this process (JIT load/compile, on a 30-op chain): {fmt_s(c['first_call_s'])}",
        f"* results agree (allclose rtol 1e-4): {c['agree']} (max relative difference {c['max_rel_diff']:.2e})"]


# ---- 2. MLP -------------------------------------------------------------------------------

def bench_mlp(ctx, d):
    rng = np.random.default_rng(1)
    g = jg.Graph(np.float32)
    x = g.input((MLP_BATCH, d), name="x")
    h = x
    params = []
    for i in range(MLP_LAYERS):
        # He-scaled weights keep the activations O(1) through the 8 layers
        W = g.param((rng.standard_normal((d, d)) * np.sqrt(2.0 / d)).astype(np.float32), name=f"W{i}")
        b = g.param((0.1 * rng.standard_normal(d)).astype(np.float32), name=f"b{i}")
        params.append((W, b))
        h = jg.relu(h @ W + b)
    loss = jg.mean(h * h)
    t0 = time.perf_counter()
    fwd = jg.build_forward(loss)
    t_build_fwd = time.perf_counter() - t0

    xb = rng.standard_normal((MLP_BATCH, d)).astype(np.float32)
    feeds = {x: xb}
    np_params = [(W.value, b.value) for W, b in params]   # the very same float32 values

    def numpy_mlp():
        a = xb
        for Wv, bv in np_params:
            a = np.maximum(a @ Wv + bv, np.float32(0))
        return np.mean(a * a)

    got = float(fwd.run(feeds))
    want = float(numpy_mlp())
    return {"d": d, "build_forward_s": t_build_fwd, "loss": [got, want],
            "agree": bool(np.allclose(got, want, rtol=1e-4)), "gflop": 2 * MLP_BATCH * d * d * MLP_LAYERS / 1e9,
            "timing": harness.timed(ctx, {"jitgraph": lambda: fwd.run(feeds), "numpy": numpy_mlp})}


def md_mlp(rows_in):
    rows = []
    for r in rows_in:
        t = r["timing"]["contenders"]
        t_jg, t_np = t["jitgraph"]["median_s"], t["numpy"]["median_s"]
        got, want = r["loss"]
        rows.append([f"D={r['d']}", fmt_s(t_jg), fmt_s(t_np), f"{r['timing']['ratios']['jitgraph/numpy']['median']:.3f}",
                     f"{r['gflop'] / t_jg:.1f} / {r['gflop'] / t_np:.1f}", fmt_s(r["build_forward_s"]),
                     f"{got:.6g} vs {want:.6g} {'ok' if r['agree'] else 'MISMATCH'}",
                     f"{t['jitgraph']['calls_per_sample']} / {t['numpy']['calls_per_sample']}"])
    return [f"### 2. MLP forward, float32: x ({MLP_BATCH}, D) -> {MLP_LAYERS} x relu(h @ W + b) -> mean(h * h); "
            "time per forward call", ""] + md_table(
        ["size", "jitgraph", "numpy eager", "jitgraph / numpy", "GFLOP/s jg / np", "build_forward",
         "loss jg vs np (allclose 1e-4)", "calls/sample jg / np"], rows) + [
        "", "GFLOP/s counts the matmuls only (2*B*D*D per layer).  jitgraph's matmul goes through numba's "
            "np.dot (scipy's BLAS), numpy's @ through numpy's BLAS (see Environment)."]


# ---- the workload ---------------------------------------------------------------------------

def run(ctx):
    n_chain, dims = (3_000, (64,)) if ctx.quick else (100_000, (64, 256))
    return {"title": "forward: jitgraph forward runs against numpy eager (perf/bench_forward.py)",
            "what": f"a {n_chain:,}-op chain of tiny ops (interpreter overhead) and an {MLP_LAYERS}-layer MLP "
                    "forward (BLAS bound); ratio < 1 means jitgraph is faster",
            "repeats": ctx.repeats, "chain": bench_chain(ctx, n_chain), "mlp": [bench_mlp(ctx, d) for d in dims]}


def markdown(res):
    return md_chain(res["chain"], res["repeats"]) + [""] + md_mlp(res["mlp"])


WORKLOAD = harness.Workload("forward", "perf/bench_forward.py: forward runs against numpy", run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_forward.py",
                          description=__doc__.split("\n\n")[0]))
