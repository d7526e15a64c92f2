"""Forward-run benchmark: jitgraph against numpy eager.

Run from the repository root:

    PYTHONPATH=. python perf/bench_forward.py            # full run (a few seconds)
    PYTHONPATH=. python perf/bench_forward.py --quick    # tiny sizes, a smoke test

What it measures (every timing is time.perf_counter, median over repeats,
taken after a warm-up run, so JIT compilation is never inside a timed figure):

1. Interpreter overhead: a chain of N tiny ops (an affine op, an add and a
   mul, in turn) on 16-element float32 tensors.  The tensors are so small that
   the time per node is almost all dispatch overhead.  numpy eager does the
   same N ops in a Python loop.  Also: the Python time to build the graph and
   the time of build_forward (ordering + memory planning).
2. An MLP forward, x (64, D) -> 8 x relu(h @ W + b) -> mean(h * h), where
   matmuls dominate.  Both contenders use the same float32 values and their
   results are checked to agree.
3. The environment (versions, BLAS).

Within each repeat the two contenders run back to back, alternating, so slow
drifts of the machine (frequency scaling, neighbours) hit both alike.
No assertion is made on timings.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

import jitgraph as jg

# perf/ first on the path, so `common` is found however this script is launched
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fmt_time, print_environment, print_table, time_alternating  # noqa: E402

CHAIN_WIDTH = 16        # elements per tensor in the chain
MLP_BATCH = 64
MLP_LAYERS = 8
BUILD_REPEATS = 3     # graph builds are slow; their timings are a median of 3


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


def bench_chain(n, repeats, min_sample_s):
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
    agree = np.allclose(got, want, rtol=1e-4, atol=1e-6)
    max_rel = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))

    (t_jg, t_np), inner = time_alternating(
        [lambda: fwd.run(feeds), lambda: numpy_chain(xb, yb, n)], repeats, min_sample_s)

    rows = [
        ["forward run, per op", fmt_time(t_jg / n), fmt_time(t_np / n), f"{t_jg / t_np:.3f}"],
        ["forward run, whole chain", fmt_time(t_jg), fmt_time(t_np), f"{t_jg / t_np:.3f}"],
        ["graph building (Python), per op", fmt_time(t_nodes / n), "-", "-"],
        ["build_forward, whole chain", fmt_time(t_build_fwd), "-", "-"],
        ["build_forward, per op", fmt_time(t_build_fwd / n), "-", "-"],
        ["first run of the built program", fmt_time(t_first_run), "-", "-"],
    ]
    print_table(f"1. Chain of {n:,} tiny ops (affine, add, mul in turn) on {CHAIN_WIDTH}-element float32 "
                f"tensors; median of {repeats} repeats, {inner} call(s) per repeat",
                ["figure", "jitgraph", "numpy eager", "jitgraph/numpy"], rows)
    n_nodes = fwd.stats()["n_nodes"]
    print(f"   program order: {n_nodes:,} nodes ({n:,} ops + {n_nodes - n} inputs); "
          f"'per op' divides by the {n:,} ops.")
    print("   forward run = fwd.run(feeds): binding the feeds, running every node, copying the output out.")
    print("   numpy eager = a Python loop of the same ops, each allocating a new 16-element array.")
    print(f"   graph building and build_forward: median of {BUILD_REPEATS} builds of the whole chain.")
    print(f"   first jitgraph call in this process (JIT load/compile, on a 30-op chain): {fmt_time(first_call)}")
    print(f"   results agree (allclose rtol 1e-4): {agree}  (max relative difference {max_rel:.2e})")


# ---- 2. MLP -------------------------------------------------------------------------------

def bench_mlp(d, repeats, min_sample_s):
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
    agree = bool(np.allclose(got, want, rtol=1e-4))

    (t_jg, t_np), inner = time_alternating([lambda: fwd.run(feeds), numpy_mlp], repeats, min_sample_s)
    flops = 2 * MLP_BATCH * d * d * MLP_LAYERS
    row = [f"D={d}", fmt_time(t_jg), fmt_time(t_np), f"{t_jg / t_np:.3f}",
           f"{flops / t_jg / 1e9:.1f} / {flops / t_np / 1e9:.1f}", fmt_time(t_build_fwd),
           f"{got:.6g} vs {want:.6g} {'ok' if agree else 'MISMATCH'}", str(inner)]
    return row


# ---- main -------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per figure (default 9; 7 with --quick)")
    args = ap.parse_args(argv)

    if args.quick:
        n_chain, dims, repeats, min_sample_s = 3_000, (64,), 7, 0.005
    else:
        n_chain, dims, repeats, min_sample_s = 100_000, (64, 256), 9, 0.05
    if args.repeats is not None:
        repeats = max(1, args.repeats)

    print("jitgraph forward benchmark" + (" (--quick: tiny sizes, figures are not meaningful)" if args.quick else ""))
    print(f"all times: median over {repeats} repeats after a warm-up run; ratio < 1 means jitgraph is faster")

    bench_chain(n_chain, repeats, min_sample_s)

    rows = [bench_mlp(d, repeats, min_sample_s) for d in dims]
    print_table(f"2. MLP forward, float32: x ({MLP_BATCH}, D) -> {MLP_LAYERS} x relu(h @ W + b) -> mean(h * h); "
                "time per forward call",
                ["size", "jitgraph", "numpy eager", "jitgraph/numpy", "GFLOP/s jg / np", "build_forward",
                 "loss jg vs np (allclose 1e-4)", "calls/repeat"], rows)
    print("   GFLOP/s counts the matmuls only (2*B*D*D per layer).  jitgraph's matmul goes through numba's")
    print("   np.dot (scipy's BLAS), numpy's @ through numpy's BLAS; their thread counts may differ (see 3).")

    print_environment("3. Environment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
