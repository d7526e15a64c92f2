"""Memory-plan benchmark: planned arena peaks beside the no-reuse sum.

Run from the repository root:

    python perf/bench_memory.py            # the issue's grid (a few seconds)
    python perf/bench_memory.py --quick    # smaller N

For the N-layer chain x (B, D) -> relu(h @ W_i) -> ... -> mean (float32, D = 64;
B = 64 and 1024; N = 100 and 1000) it prints, for the forward program and for
forward + backward:

* planned peak: the arena ``run()`` allocates (``peak_bytes``), in bytes and in
  activations (one B x D float32 tensor);
* no reuse: the sum of every computed tensor's size (``unplanned_bytes``), what a
  buffer-per-tensor executor would hold;
* in place: elementwise nodes that took over a dying source's buffer;
* persistent: inputs, the params read and the param gradients (outside the arena).

Then the time to order and plan a one-million-node chain of 16-element ops
(build_forward: the jitted DFS and the jitted planner), median of 5.
Planning is deterministic, so peaks are exact, not sampled.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_environment, print_table  # noqa: E402

import jitgraph as jg  # noqa: E402


def chain(n_layers, B, D=64, seed=0):
    rng = np.random.default_rng(seed)
    g = jg.Graph(np.float32)
    x = g.input((B, D), name="x")
    h = x
    for i in range(n_layers):
        h = jg.relu(h @ g.param(rng.standard_normal((D, D)) * np.sqrt(2 / D), name=f"W{i}"))
    return jg.mean(h)


def mib(b):
    return f"{b / 2**20:,.2f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    Ns = (10, 100) if args.quick else (100, 1000)
    rows = []
    for B in (64, 1024):
        act = B * 64 * 4
        for N in Ns:
            loss = chain(N, B)
            fwd = jg.build_forward(loss)
            bwd = jg.build_backward(jg.build_forward(chain(N, B)))
            for name, prog in (("forward", fwd), ("fwd+bwd", bwd)):
                st = prog.stats()
                rows.append([f"B={B} N={N}", name, mib(prog.peak_bytes), f"{prog.peak_bytes / act:,.2f}",
                             mib(st["unplanned_bytes"]), f"{st['unplanned_bytes'] / act:,.1f}",
                             f"{st['unplanned_bytes'] / prog.peak_bytes:,.1f}x", f"{st['n_in_place']:,}",
                             mib(st["persistent_bytes"])])
    print_table("Planned arena peak vs one buffer per tensor (N-layer relu chain, float32, D = 64)",
                ["chain", "program", "planned peak", "in activations", "no reuse", "in activations",
                 "saved", "in place", "persistent"], rows)
    print("   forward: the peak stays at 2 activations whatever N; fwd+bwd: the N relu outputs backward\n"
          "   reads plus one temporary (relu writes over its matmul, each gradient step over the last).")

    n = 100_000 if args.quick else 1_000_000
    g = jg.Graph(np.float32)
    x = g.input((16,), name="x")
    h = x
    for i in range(n):
        h = jg.tanh(h) if i % 2 else h * 0.5
    jg.build_forward(jg.tanh(x))                       # warm-up: compiled code loaded outside the timing
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fwd = jg.build_forward(h)
        times.append(time.perf_counter() - t0)
    print(f"\nordering + planning a {n:,}-node chain (build_forward): median {statistics.median(times) * 1e3:.0f} ms "
          f"(target for 1M nodes: < 1 s); planned peak {fwd.peak_bytes} bytes\n")
    print_environment()


if __name__ == "__main__":
    main()
