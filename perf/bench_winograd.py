"""Winograd F(2x2, 3x3) against the direct product, layer by layer (ops/winograd.py, ops/conv.py).

    python -m perf.bench_winograd [--rounds 9] [--threads 1] [--quick]

For 3x3 stride-1 layers of batch 32 (the (h) and ResNet-20-like shapes, and narrower ones that
place ``conv.WINOGRAD_MIN_CHANNELS``), in one process, alternating: the forward product's node time
and the input gradient's (a FLIP product) with Winograd and without (``WINOGRAD_MIN_CHANNELS = 0``),
the U node's time, their ratios, and the float32 error of each against float64. Times are the
fastest of ``--rounds`` per node (``profile``), so the machine's noise falls on both alike.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jitgraph as jg  # noqa: E402
from jitgraph.ops import conv as conv_module  # noqa: E402
from perf.environment import cpu_model  # noqa: E402

LAYERS = [(32, 16, 32), (32, 32, 16), (32, 64, 8), (32, 8, 32), (32, 12, 32), (32, 128, 8)]


def _times(x0, w0, g0, least, rounds, dtype=np.float32):
    """(forward conv s, input-gradient conv s, U s, output, input gradient) for one setting."""
    conv_module.WINOGRAD_MIN_CHANNELS = least
    g = jg.Graph(dtype)
    x = g.param(x0.astype(dtype), name="x")
    w = g.param(w0.astype(dtype), name="w")
    y = jg.conv2d(x, w, padding=1)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * g.const(g0.astype(dtype)))), fuse=False)
    bwd.run()
    fwd_s = bwd_s = u_s = 0.0
    for r in bwd.profile(repeats=rounds):
        if r["op"] == "conv2d":
            if r["phase"] == "forward":
                fwd_s += r["seconds"]
            else:
                bwd_s += r["seconds"]
        elif r["op"] == "winograd_weights":
            u_s += r["seconds"]
    out = jg.build_forward(y).run()
    return fwd_s, bwd_s, u_s, np.asarray(out, np.float64), np.asarray(x.grad, np.float64)


def study(layers, rounds, threads):
    jg.set_num_threads(threads)
    rng = np.random.default_rng(0)
    print(f"CPU: {cpu_model()}; {threads} thread(s); float32; 3x3, padding 1; fastest of {rounds} per node\n")
    print("| layer (N, C, H = W) | forward: direct | Winograd | ratio | input gradient: direct | Winograd | ratio "
          "| U (both) | fwd+input grad ratio, U included | max error / max |, direct, Winograd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    saved = conv_module.WINOGRAD_MIN_CHANNELS
    try:
        for N, C, H in layers:
            x0 = rng.standard_normal((N, C, H, H))
            w0 = rng.standard_normal((C, C, 3, 3)) / np.sqrt(9 * C)
            g0 = rng.standard_normal((N, C, H, H))
            d_f, d_b, _, d_out, d_gx = _times(x0, w0, g0, 0, rounds)
            w_f, w_b, w_u, w_out, w_gx = _times(x0, w0, g0, 1, rounds)
            *_, ref, ref_gx = _times(x0, w0, g0, 0, 1, np.float64)
            err = [max(np.abs(o - ref).max() / np.abs(ref).max(), np.abs(gx - ref_gx).max() / np.abs(ref_gx).max())
                   for o, gx in ((d_out, d_gx), (w_out, w_gx))]
            ms = lambda s: f"{s * 1e3:.3f} ms"    # noqa: E731
            print(f"| {N}, {C}, {H} | {ms(d_f)} | {ms(w_f)} | {w_f / d_f:.2f} | {ms(d_b)} | {ms(w_b)} | "
                  f"{w_b / d_b:.2f} | {ms(w_u)} | {(w_f + w_b + w_u) / (d_f + d_b):.2f} | "
                  f"{err[0]:.1e}, {err[1]:.1e} |")
    finally:
        conv_module.WINOGRAD_MIN_CHANNELS = saved


def main(argv=None):
    ap = argparse.ArgumentParser(description="Winograd F(2x2, 3x3) against the direct 3x3 product, layer by layer")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="one small layer: checks the script, measures nothing")
    a = ap.parse_args(argv)
    study([(2, 8, 8)] if a.quick else LAYERS, 1 if a.quick else a.rounds, a.threads)


if __name__ == "__main__":
    main()
