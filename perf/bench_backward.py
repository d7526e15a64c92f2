"""Backward benchmark: building, expanding and running the backward graph of a deep chain
(workload ``backward``).

Run from the repository root (or ``jitgraph bench --only backward``):

    python perf/bench_backward.py            # N = 100, 1,000, 10,000 (about a minute)
    python perf/bench_backward.py --quick    # N = 10, 100: a smoke test

It takes the harness's options (``--help``) and writes its results like ``jitgraph bench``.
The model is an N-layer chain, float32, D = B = 64, one (D, D) param per layer:

    x (B, D) -> h = relu(h @ W_i) for i = 1..N -> loss = mean(h)

Figures per N (build figures are the median of BUILD_REPEATS builds, each of a fresh
graph because build_backward appends nodes to it; a small chain is built,
differentiated and run first, so JIT compilation is in no figure):

  create params         g.param(array) for N pre-generated float32 arrays, per param
  build forward ops     the Python loop h = jg.relu(h @ W) plus loss = jg.mean(h),
                        per op (2N + 1 ops: N matmuls, N relus, the mean)
  build_forward         jg.build_forward(loss): ordering and memory plan
  build_backward        jg.build_backward(fwd): expanding the backward graph (gradient
                        nodes appended to the graph), then ordering and memory plan of
                        the whole forward + backward program; with the minor page
                        faults during it (fresh memory from the OS; they explain most
                        of this figure's run-to-run variation)
  program nodes         bwd.stats(): n_nodes, and its forward / backward split
  fwd+bwd run           bwd.run({x: xb}): forward, backward, every W_i's gradient;
                        nodes/s = program nodes / run time
  numpy eager fwd+bwd   the same chain written out in numpy: forward a_i = h @ W_i,
                        h = relu(a_i); backward g_a = g * (a_i > 0), dW_i = h^T @ g_a,
                        g = g_a @ W_i^T.  Timed interleaved with jitgraph (the harness);
                        ratio < 1: jitgraph faster.

Checks (not timed): W_1.grad and W_N.grad against numpy's float32 gradients
(np.allclose, rtol 1e-3, atol 1e-6), with the largest difference relative to the
gradient's scale, next to the same measure between numpy float32 and numpy float64:
over thousands of layers float32 rounding alone drifts that far, so that column
tells a rounding difference from a wrong gradient.

Weights: models.chain_weights, He-scaled and then each layer's scale corrected so the
batch's activation RMS stays at the input's.  Plain He scaling preserves the
activations only on average: their log-RMS still drifts down by about 1/D a layer,
which on this chain gives an RMS of ~1e-7 at layer 1,000, below float32's normal range
by layer ~4,500 and float32's smallest subnormal (1e-45) at layer 10,000 -- the
gradients would be underflowed garbage and the check vacuous.  The table reports the
activation RMS range over the layers, and the check says so if anything underflowed.

The issue's targets, shown next to the figures: expanding the backward graph of the
10k-layer chain (build_backward) <= 20 ms; building its forward graph from Python
<= 2 us per op.  No assertion is made on timings.
"""
import gc
import os
import statistics
import sys
import time

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

import numpy as np  # noqa: E402

from . import harness  # noqa: E402
from .models import build_phases, chain_weights, np_chain  # noqa: E402
from .report import fmt_s, md_table  # noqa: E402

D = B = 64
BUILD_REPEATS = 5
TARGET_N = 10_000
TARGET_BACKWARD_S = 20e-3      # expanding the backward graph of the 10k chain
TARGET_OP_S = 2e-6             # building its forward graph from Python, per op
RTOL, ATOL = 1e-3, 1e-6
TINY_RMS = 1e-30               # activations below this count as underflowed
PHASES = ("params", "ops", "build_forward", "build_backward")


def grad_check(param, i, ref32, ref64, underflow):
    """Verdict, jitgraph-vs-numpy and numpy-f32-vs-f64 for layer i's gradient; the two
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
    return {"verdict": verdict, "jg_vs_np32": float(np.max(np.abs(got - ref32[i]))) / denom,
            "np32_vs_np64": float(np.max(np.abs(ref32[i].astype(np.float64) - ref64[i]))) / denom}


def bench_n(ctx, n, all_weights, xb):
    weights = all_weights[:n]
    runs = []
    built = {}
    for r in range(BUILD_REPEATS):
        ctx.note(f"N={n:,}: build {r + 1}/{BUILD_REPEATS}")
        built.clear()                     # drop the previous graph, then collect it, so
        gc.collect()                      # its garbage is not charged to this build
        runs.append(build_phases(weights, (B, D), keep=built))
    x, params, bwd = built["x"], built["params"], built["bwd"]
    st = bwd.stats()

    feeds = {x: xb}
    loss_jg = float(bwd.run(feeds))
    loss32, dW32, hs = np_chain(xb, weights)
    _, dW64, _ = np_chain(xb.astype(np.float64), [w.astype(np.float64) for w in weights])
    rms = [float(np.sqrt(np.mean(np.square(h, dtype=np.float64)))) for h in hs[1:]]
    underflow = min(rms) < TINY_RMS
    first = grad_check(params[0], 0, dW32, dW64, underflow)
    last = grad_check(params[-1], n - 1, dW32, dW64, underflow)
    del dW32, dW64, hs

    faults = [r["faults"] for r in runs]
    return {"n": n, "median_s": {k: statistics.median(r[k] for r in runs) for k in PHASES},
            "faults": None if None in faults else statistics.median(faults),
            "n_nodes": st["n_nodes"], "n_forward": st["n_forward"], "n_backward": st["n_backward"],
            "loss": [loss_jg, float(loss32)], "rms": [min(rms), max(rms)], "underflow": underflow,
            "grad_first": first, "grad_last": last,
            "timing": harness.timed(ctx, {"jitgraph": lambda: bwd.run(feeds), "numpy": lambda: np_chain(xb, weights)})}


def run(ctx):
    ns = (10, 100) if ctx.quick else (100, 1_000, 10_000)
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((B, D)).astype(np.float32)
    all_weights = chain_weights(max(ns), D, xb, rng)

    # First call of the pipeline in this process, on a 3-layer chain: loads (or
    # compiles) every jitted pass and the interpreter.  Reported, in no figure.
    t0 = time.perf_counter()
    warm = {}
    build_phases(all_weights[:3], (B, D), keep=warm)
    warm["bwd"].run({warm["x"]: xb})
    first_call = time.perf_counter() - t0
    del warm
    return {"title": f"backward: an N-layer relu chain, float32, D = B = {D} (perf/bench_backward.py)",
            "what": f"x ({B}, {D}) -> N x relu(h @ W_i) -> mean(h); builds: median of {BUILD_REPEATS} fresh "
                    f"graphs, runs: the harness's interleaved median against numpy eager",
            "first_call_s": first_call, "by_n": [bench_n(ctx, n, all_weights, xb) for n in ns]}


def target_cell(res, value, limit, text):
    """'<text>: met' or 'MISSED' for the N = 10,000 figure, or why there is none."""
    r = next((r for r in res["by_n"] if r["n"] == TARGET_N), None)
    if r is None:
        return f"{text} (N={TARGET_N:,} not run)"
    return f"{text}: {'met' if value(r) <= limit else 'MISSED'}"


def markdown(res):
    by_n = res["by_n"]

    def row(label, cell, target=""):
        return [label] + [cell(r) for r in by_n] + [target]

    def op_s(r):
        return r["median_s"]["ops"] / (2 * r["n"] + 1)

    def t(r, name):
        return r["timing"]["contenders"][name]["median_s"]

    def grad(key, field):
        return (lambda r: r[key][field]) if field == "verdict" else (lambda r: f"{r[key][field]:.1e}")

    rows = [
        row("create params (g.param), per param", lambda r: fmt_s(r["median_s"]["params"] / r["n"])),
        row("build forward ops (Python), per op", lambda r: fmt_s(op_s(r)),
            target_cell(res, op_s, TARGET_OP_S, "<= 2 us/op")),
        row("build_forward", lambda r: fmt_s(r["median_s"]["build_forward"])),
        row("build_backward (expand the backward graph)", lambda r: fmt_s(r["median_s"]["build_backward"]),
            target_cell(res, lambda r: r["median_s"]["build_backward"], TARGET_BACKWARD_S, "<= 20 ms")),
        row("minor page faults during it", lambda r: "n/a" if r["faults"] is None else f"{r['faults']:,.0f}"),
        row("program nodes (bwd.stats n_nodes)", lambda r: f"{r['n_nodes']:,}"),
        row("n_forward / n_backward (bwd.stats)", lambda r: f"{r['n_forward']:,} / {r['n_backward']:,}"),
        row("fwd+bwd run: bwd.run({x: xb})", lambda r: fmt_s(t(r, "jitgraph"))),
        row("program nodes per second", lambda r: f"{r['n_nodes'] / t(r, 'jitgraph') / 1e6:.2f} M/s"),
        row("numpy eager fwd+bwd", lambda r: fmt_s(t(r, "numpy"))),
        row("jitgraph / numpy (median of per-repeat ratios)",
            lambda r: f"{r['timing']['ratios']['jitgraph/numpy']['median']:.3f}"),
        row("calls per timed sample, jitgraph / numpy", lambda r: " / ".join(
            str(c["calls_per_sample"]) for c in r["timing"]["contenders"].values())),
        row("loss: jitgraph / numpy", lambda r: f"{r['loss'][0]:.6g} / {r['loss'][1]:.6g}"),
        row("activation RMS over layers: min / max",
            lambda r: ("UNDERFLOW " if r["underflow"] else "") + f"{r['rms'][0]:.3g} / {r['rms'][1]:.3g}"),
        row("W_1.grad matches numpy (allclose)", grad("grad_first", "verdict")),
        row("max|diff| / max|grad|: jitgraph vs numpy f32", grad("grad_first", "jg_vs_np32")),
        row("same measure: numpy f32 vs numpy f64", grad("grad_first", "np32_vs_np64")),
        row("W_N.grad matches numpy (allclose)", grad("grad_last", "verdict")),
        row("max|diff| / max|grad|: jitgraph vs numpy f32", grad("grad_last", "jg_vs_np32")),
        row("same measure: numpy f32 vs numpy f64", grad("grad_last", "np32_vs_np64")),
    ]
    return md_table(["figure"] + [f"N={r['n']:,}" for r in by_n] + [f"target (N={TARGET_N:,})"], rows) + [
        "",
        f"* first jitgraph build + backward + run in this process (JIT load/compile, 3-layer chain): "
        f"{fmt_s(res['first_call_s'])}",
        "* 'per op' divides the Python loop by its 2N+1 ops; build_backward includes ordering and memory "
        "planning of the whole program.",
        "* fwd+bwd run leaves the gradients in jitgraph's buffer (W.grad copies one out on access); numpy "
        "returns a list of N new arrays.",
        "* allclose: rtol 1e-3, atol 1e-6; when jitgraph's difference is no bigger than numpy's own f32-vs-f64 "
        "one, it is float32 rounding.",
        "* page faults: first touches of memory the allocator had to get from the OS.  Whether build_backward "
        "gets fresh or recycled memory depends on what the process freed before, so its time varies between "
        "runs by the cost of these faults (a few us each); compare runs at equal fault counts."]


WORKLOAD = harness.Workload("backward", "perf/bench_backward.py: build, expand and run a deep chain's backward",
                            run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_backward.py",
                          description=__doc__.split("\n\n")[0]))
