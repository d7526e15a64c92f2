"""Backward benchmark: building, expanding and running the backward graph of a deep chain.

Run from the repository root:

    PYTHONPATH=. python perf/bench_backward.py            # N = 100, 1,000, 10,000 (under a minute)
    PYTHONPATH=. python perf/bench_backward.py --quick    # N = 10, 100: a smoke test

The model is an N-layer chain, float32, D = B = 64, one (D, D) param per layer:

    x (B, D) -> h = relu(h @ W_i) for i = 1..N -> loss = mean(h)

Figures per N (time.perf_counter; build figures are the median of BUILD_REPEATS
builds, each of a fresh graph because build_backward appends nodes to it; a small
chain is built, differentiated and run first, so JIT compilation is in no figure):

  create params         g.param(array) for N pre-generated float32 arrays, per param
  build forward ops     the Python loop h = jg.relu(h @ W) plus loss = jg.mean(h),
                        per op (2N + 1 ops: N matmuls, N relus, the mean)
  build_forward         jg.build_forward(loss): ordering and memory plan
  build_backward        jg.build_backward(fwd): expanding the backward graph (gradient
                        nodes appended to the graph), then ordering and memory plan of
                        the whole forward + backward program; with the minor page
                        faults during it (fresh memory from the OS; they explain most
                        of this figure's run-to-run variation)
  program nodes         bwd.order.size; forward / backward split from bwd.stats()
  fwd+bwd run           bwd.run({x: xb}): forward, backward, every W_i's gradient;
                        nodes/s = program nodes / run time
  numpy eager fwd+bwd   the same chain written out in numpy: forward a_i = h @ W_i,
                        h = relu(a_i); backward g_a = g * (a_i > 0), dW_i = h^T @ g_a,
                        g = g_a @ W_i^T.  It is timed alternately with jitgraph (median
                        of the repeats, after a warm-up run); ratio < 1: jitgraph faster.

Checks (not timed): W_1.grad and W_N.grad against numpy's float32 gradients
(np.allclose, rtol 1e-3, atol 1e-6), with the largest difference relative to the
gradient's scale, next to the same measure between numpy float32 and numpy float64:
over thousands of layers float32 rounding alone drifts that far, so that column
tells a rounding difference from a wrong gradient.

Weights: He-scaled, N(0, 2/D), and then each layer's scale corrected so the batch's
activation RMS stays at the input's.  Plain He scaling preserves the activations
only on average: their log-RMS still drifts down by about 1/D a layer, which on this
chain gives an RMS of ~1e-7 at layer 1,000, below float32's normal range by layer
~4,500 and float32's smallest subnormal (1e-45) at layer 10,000 -- the gradients
would be underflowed garbage and the check vacuous.  The table reports the activation RMS range over the layers, and the
check says so if anything underflowed.

The issue's targets, shown next to the figures: expanding the backward graph of the
10k-layer chain (build_backward) <= 20 ms; building its forward graph from Python
<= 2 us per op.  No assertion is made on timings.
"""
import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np

from jitgraph.bench import build_phases, chain_weights

# perf/ first on the path, so `common` is found however this script is launched
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_environment, print_table, time_alternating  # noqa: E402

D = B = 64
BUILD_REPEATS = 5
TARGET_N = 10_000
TARGET_BACKWARD_S = 20e-3      # expanding the backward graph of the 10k chain
TARGET_OP_S = 2e-6             # building its forward graph from Python, per op
RTOL, ATOL = 1e-3, 1e-6
TINY_RMS = 1e-30               # activations below this count as underflowed


# ---- data -------------------------------------------------------------------------------

# ---- the two contenders -------------------------------------------------------------------

def build_chain(weights):
    """Build the chain and its backward graph; returns (x, params, bwd, phase seconds,
    page faults during build_backward) -- jitgraph.bench times the phases."""
    built = {}
    ph = build_phases(weights, (B, D), keep=built)
    phases = (ph["params"], ph["ops"], ph["build_forward"], ph["build_backward"])
    return built["x"], built["params"], built["bwd"], phases, ph["faults"]


def numpy_fwd_bwd(xb, weights):
    """Eager forward and backward in xb's dtype; returns (loss, [dW_i], [h_0..h_N])."""
    hs = [xb]
    h = xb
    for W in weights:
        h = h @ W
        np.maximum(h, 0, out=h)           # relu in place: h > 0 exactly where a > 0
        hs.append(h)
    loss = h.mean()
    g = np.full(h.shape, 1.0 / h.size, xb.dtype)
    dWs = [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        g *= hs[i + 1] > 0                # through the relu
        dWs[i] = hs[i].T @ g
        if i:                             # x is an input: its gradient is not needed
            g = g @ weights[i].T
    return loss, dWs, hs


# ---- one N ----------------------------------------------------------------------------------

def grad_check(param, i, ref32, ref64, underflow):
    """(verdict, jitgraph-vs-numpy, numpy-f32-vs-f64) for layer i's gradient; the two
    differences are max |diff| over the max |gradient| (float64)."""
    got = param.grad
    scale = float(np.max(np.abs(ref64[i])))
    if underflow:
        verdict = "VACUOUS: underflow"
    elif scale < 100 * ATOL:              # atol alone would pass anything this small
        verdict = f"VACUOUS: max|grad| {scale:.1e}"
    else:                                 # allclose is False on nan/inf too
        verdict = "yes" if np.allclose(got, ref32[i], rtol=RTOL, atol=ATOL) else "NO"
    denom = max(scale, 1e-300)
    d_jg = float(np.max(np.abs(got - ref32[i]))) / denom
    d_np = float(np.max(np.abs(ref32[i].astype(np.float64) - ref64[i]))) / denom
    return verdict, f"{d_jg:.1e}", f"{d_np:.1e}"


def bench_n(n, all_weights, xb, repeats, min_sample_s):
    weights = all_weights[:n]
    times, faults = [], []
    for _ in range(BUILD_REPEATS):
        built = None                      # drop the previous graph, then collect it, so
        gc.collect()                      # its garbage is not charged to this build
        built = build_chain(weights)
        times.append(built[3])
        faults.append(built[4])
    x, params, bwd = built[:3]
    t_params, t_ops, t_fwd, t_bwd = (statistics.median(t[k] for t in times) for k in range(4))
    st = bwd.stats()
    n_nodes = int(bwd.order.size)

    feeds = {x: xb}
    loss_jg = float(bwd.run(feeds))
    loss32, dW32, hs = numpy_fwd_bwd(xb, weights)
    _, dW64, _ = numpy_fwd_bwd(xb.astype(np.float64), [w.astype(np.float64) for w in weights])
    rms = [float(np.sqrt(np.mean(np.square(h, dtype=np.float64)))) for h in hs[1:]]
    underflow = min(rms) < TINY_RMS
    first = grad_check(params[0], 0, dW32, dW64, underflow)
    last = grad_check(params[-1], n - 1, dW32, dW64, underflow)
    del dW32, dW64, hs

    (t_run, t_np), inner = time_alternating(
        [lambda: bwd.run(feeds), lambda: numpy_fwd_bwd(xb, weights)], repeats, min_sample_s)

    return {
        "params": f"{t_params / n * 1e6:.2f} us",
        "ops": f"{t_ops / (2 * n + 1) * 1e6:.2f} us",
        "fwd": f"{t_fwd * 1e3:.2f} ms",
        "bwd": f"{t_bwd * 1e3:.2f} ms",
        "faults": "n/a" if None in faults else f"{statistics.median(faults):,.0f}",
        "nodes": f"{n_nodes:,}",
        "split": f"{st['n_forward']:,} / {st['n_backward']:,}",
        "run": f"{t_run * 1e3:.2f} ms",
        "rate": f"{n_nodes / t_run / 1e6:.2f} M/s",
        "numpy": f"{t_np * 1e3:.2f} ms",
        "ratio": f"{t_run / t_np:.3f}",
        "calls": str(inner),
        "loss": f"{loss_jg:.6g} / {float(loss32):.6g}",
        "rms": ("UNDERFLOW " if underflow else "") + f"{min(rms):.3g} / {max(rms):.3g}",
        **dict(zip(("g1", "g1_jg", "g1_np"), first)),
        **dict(zip(("gN", "gN_jg", "gN_np"), last)),
        "_op_s": t_ops / (2 * n + 1), "_bwd_s": t_bwd,
    }


# ---- main -------------------------------------------------------------------------------

def target_cell(results, key, limit, text):
    """'<text>: met' or 'MISSED' for the N = 10,000 figure, or why there is none."""
    r = results.get(TARGET_N)
    if r is None:
        return f"{text} (N={TARGET_N:,} not run)"
    return f"{text}: {'met' if r[key] <= limit else 'MISSED'}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 10, 100 only: a smoke test, not a measurement")
    ap.add_argument("--repeats", type=int, default=None, help="timed run repeats (default 7; 5 with --quick)")
    args = ap.parse_args(argv)

    if args.quick:
        ns, repeats, min_sample_s = (10, 100), 5, 0.005
    else:
        ns, repeats, min_sample_s = (100, 1_000, 10_000), 7, 0.05
    if args.repeats is not None:
        repeats = max(5, args.repeats)

    print("jitgraph backward benchmark" + (" (--quick: tiny sizes, figures are not meaningful)" if args.quick else ""))
    print(f"chain x ({B}, {D}) -> N x relu(h @ W_i) -> mean(h), float32; builds: median of {BUILD_REPEATS}, "
          f"runs: median of {repeats} after a warm-up")

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((B, D)).astype(np.float32)
    all_weights = chain_weights(max(ns), D, xb, rng)   # RMS-preserving: see jitgraph.bench

    # First call of the pipeline in this process, on a 3-layer chain: loads (or
    # compiles) every jitted pass and the interpreter.  Reported, in no figure below.
    t0 = time.perf_counter()
    wx, _, wbwd = build_chain(all_weights[:3])[:3]
    wbwd.run({wx: xb})
    first_call = time.perf_counter() - t0
    del wx, wbwd

    results = {}
    for n in ns:
        results[n] = bench_n(n, all_weights, xb, repeats, min_sample_s)

    def row(label, key, target=""):
        return [label] + [results[n][key] for n in ns] + [target]

    rows = [
        row("create params (g.param), per param", "params"),
        row("build forward ops (Python), per op", "ops",
            target_cell(results, "_op_s", TARGET_OP_S, "<= 2 us/op")),
        row("build_forward", "fwd"),
        row("build_backward (expand the backward graph)", "bwd",
            target_cell(results, "_bwd_s", TARGET_BACKWARD_S, "<= 20 ms")),
        row("  minor page faults during it", "faults"),
        row("program nodes (bwd.order.size)", "nodes"),
        row("  n_forward / n_backward (bwd.stats)", "split"),
        row("fwd+bwd run: bwd.run({x: xb})", "run"),
        row("  program nodes per second", "rate"),
        row("numpy eager fwd+bwd", "numpy"),
        row("jitgraph / numpy", "ratio"),
        row("  calls per timed sample", "calls"),
        row("loss: jitgraph / numpy", "loss"),
        row("activation RMS over layers: min / max", "rms"),
        row("W_1.grad matches numpy (allclose)", "g1"),
        row("  max|diff| / max|grad|: jitgraph vs numpy f32", "g1_jg"),
        row("  same measure: numpy f32 vs numpy f64", "g1_np"),
        row("W_N.grad matches numpy (allclose)", "gN"),
        row("  max|diff| / max|grad|: jitgraph vs numpy f32", "gN_jg"),
        row("  same measure: numpy f32 vs numpy f64", "gN_np"),
    ]
    print_table("Backward of an N-layer relu chain, float32, D = B = 64",
                ["figure"] + [f"N={n:,}" for n in ns] + ["target (N=10,000)"], rows)
    print(f"   first jitgraph build + backward + run in this process (JIT load/compile, 3-layer chain): "
          f"{first_call * 1e3:.0f} ms")
    print("   'per op' divides the Python loop by its 2N+1 ops; build_backward includes ordering and memory")
    print("   planning of the whole program.  fwd+bwd run leaves the gradients in jitgraph's buffer (W.grad")
    print("   copies one out on access); numpy returns a list of N new arrays.  allclose: rtol 1e-3, atol 1e-6;")
    print("   when jitgraph's difference is no bigger than numpy's own f32-vs-f64 one, it is float32 rounding.")
    print("   page faults: first touches of memory the allocator had to get from the OS.  Whether build_backward")
    print("   gets fresh or recycled memory depends on what the process freed before, so its time varies")
    print("   between runs by the cost of these faults (a few us each); compare runs at equal fault counts.")

    print_environment()
    return 0


if __name__ == "__main__":
    sys.exit(main())
