"""Memory-plan benchmark: planned arena peaks beside the no-reuse sum (workload ``memory``).

Run from the repository root (or ``jitgraph bench --only memory``):

    python perf/bench_memory.py            # the issue's grid (a few seconds)
    python perf/bench_memory.py --quick    # smaller N

It takes the harness's options (``--help``) and writes its results like ``jitgraph bench``.
For the N-layer chain x (B, D) -> relu(h @ W_i) -> ... -> mean (float32, D = 64;
B = 64 and 1024; N = 100 and 1000) it reports, for the forward program and for
forward + backward (``stats()``):

* planned peak: the arena ``run()`` allocates (``peak_bytes``), in bytes and in
  activations (one B x D float32 tensor);
* no reuse: the sum of every computed tensor's size (``unplanned_bytes``), what a
  buffer-per-tensor executor would hold;
* in place: elementwise nodes that took over a dying source's buffer;
* persistent: inputs, the params read and the param gradients (outside the arena).

Then the time to order and plan a one-million-node chain of 16-element ops
(build_forward: the jitted DFS and the jitted planner), median of the repeats.
Planning is deterministic, so peaks are exact, not sampled.
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

D = 64
TARGET_PLAN_S = 1.0      # ordering + planning a 1M-node chain


def chain(n_layers, B, seed=0):
    rng = np.random.default_rng(seed)
    g = jg.Graph(np.float32)
    x = g.input((B, D), name="x")
    h = x
    for i in range(n_layers):
        h = jg.relu(h @ g.param(rng.standard_normal((D, D)) * np.sqrt(2 / D), name=f"W{i}"))
    return jg.mean(h)


def run(ctx):
    Ns = (10, 100) if ctx.quick else (100, 1000)
    rows = []
    for B in (64, 1024):
        for N in Ns:
            ctx.note(f"B={B} N={N}")
            fwd = jg.build_forward(chain(N, B))
            bwd = jg.build_backward(jg.build_forward(chain(N, B)))
            for name, prog in (("forward", fwd), ("fwd+bwd", bwd)):
                st = prog.stats()
                rows.append({"B": B, "N": N, "program": name, "activation_bytes": B * D * 4,
                             **{k: st[k] for k in ("peak_bytes", "unplanned_bytes", "n_in_place",
                                                   "persistent_bytes")}})

    n = 100_000 if ctx.quick else 1_000_000
    ctx.note(f"{n:,}-node chain")
    g = jg.Graph(np.float32)
    x = g.input((16,), name="x")
    h = x
    for i in range(n):
        h = jg.tanh(h) if i % 2 else h * 0.5
    jg.build_forward(jg.tanh(x))                       # warm-up: compiled code loaded outside the timing
    times = []
    for _ in range(ctx.repeats):
        t0 = time.perf_counter()
        fwd = jg.build_forward(h)
        times.append(time.perf_counter() - t0)
    return {"title": f"memory: planned arena peak vs one buffer per tensor (N-layer relu chain, float32, D = {D}) "
                     "(perf/bench_memory.py)",
            "what": "peaks from the memory plan (exact, not sampled); then build_forward (ordering + planning) "
                    f"of a {n:,}-node chain of 16-element ops",
            "programs": rows,
            "plan_chain": {"nodes": n, "median_s": statistics.median(times), "samples_s": times,
                           "peak_bytes": fwd.peak_bytes}}


def mib(b):
    return f"{b / 2**20:,.2f} MiB"


def markdown(res):
    rows = []
    for r in res["programs"]:
        act, peak, unplanned = r["activation_bytes"], r["peak_bytes"], r["unplanned_bytes"]
        rows.append([f"B={r['B']} N={r['N']}", r["program"], mib(peak), f"{peak / act:,.2f}", mib(unplanned),
                     f"{unplanned / act:,.1f}", f"{unplanned / peak:,.1f}x", f"{r['n_in_place']:,}",
                     mib(r["persistent_bytes"])])
    p = res["plan_chain"]
    status = "met" if p["median_s"] < TARGET_PLAN_S else "MISSED"
    return md_table(["chain", "program", "planned peak", "in activations", "no reuse", "in activations", "saved",
                     "in place", "persistent"], rows) + [
        "",
        "forward: the peak stays at 2 activations whatever N; fwd+bwd: the N relu outputs backward reads plus "
        "one temporary (relu writes over its matmul, each gradient step over the last).",
        "",
        f"Ordering + planning a {p['nodes']:,}-node chain (build_forward): median {fmt_s(p['median_s'])} of "
        f"{len(p['samples_s'])} (target for 1M nodes: < {fmt_s(TARGET_PLAN_S)}"
        + (f": {status}" if p["nodes"] >= 1_000_000 else ", not run (--quick)")
        + f"); planned peak {p['peak_bytes']} bytes."]


WORKLOAD = harness.Workload("memory", "perf/bench_memory.py: planned peaks and planning time", run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_memory.py",
                          description=__doc__.split("\n\n")[0]))
