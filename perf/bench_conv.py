"""Convolution and pooling benchmark: jitgraph against PyTorch eager (workload ``conv``).

Run from the repository root (or ``jitgraph bench --only conv``):

    python perf/bench_conv.py            # full run (about a minute)
    python perf/bench_conv.py --quick    # tiny sizes, a smoke test

Each layer is timed fwd+bwd (the loss is the sum of the output times a fixed random
tensor, so every output element gets a gradient) with the same float32 input and
weights in both, at the harness's thread count; the losses and the weight gradient are
compared.  jitgraph lowers conv2d to an im2col gather plus a GEMM and pooling to a gather
plus a max / mean (ops/conv.py); PyTorch calls its direct / oneDNN kernels.  No target is
set by an issue for these alone (workload (h), a ResNet, is the one with a target); the
figures say where the lowering stands.
"""
import os
import sys

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

import numpy as np  # noqa: E402

import jitgraph as jg  # noqa: E402

from . import harness  # noqa: E402
from .report import fmt_s, md_table  # noqa: E402


def layers(quick):
    """(name, input shape, weight shape or None, kwargs) of ResNet-on-32x32-like layers."""
    n = 4 if quick else 32
    s = 8 if quick else 32
    return [("conv 3x3, 16 -> 16 ch, pad 1", (n, 16, s, s), (16, 16, 3, 3), dict(padding=1)),
            ("conv 3x3 stride 2, 16 -> 32 ch, pad 1", (n, 16, s, s), (32, 16, 3, 3), dict(stride=2, padding=1)),
            ("conv 1x1, 32 -> 64 ch", (n, 32, s // 2, s // 2), (64, 32, 1, 1), dict()),
            ("max_pool2d 2x2", (n, 16, s, s), None, dict(kernel_size=2)),
            ("avg_pool2d 3x3 stride 2 pad 1", (n, 16, s, s), None, dict(kernel_size=3, stride=2, padding=1))]


def bench_layer(ctx, name, xs, ws, kw, torch):
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(xs).astype(np.float32)
    wv = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32) if ws else None
    g = jg.Graph(np.float32)
    x = g.input(xs, name="x")
    if ws:
        w = g.param(wv, name="w")
        y = jg.conv2d(x, w, **kw)
    else:
        w = g.param(np.ones(1, np.float32), name="unused")
        op = jg.max_pool2d if name.startswith("max") else jg.avg_pool2d
        y = op(x * w, **kw)
    r = rng.standard_normal(y.shape).astype(np.float32)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * g.const(r))))
    feeds = {x: xv}
    fns = {"jitgraph": lambda: bwd.run(feeds)}
    res = {"layer": name, "peak_bytes": bwd.peak_bytes}
    if torch is not None:
        F = torch.nn.functional
        tx = torch.from_numpy(xv)
        tw = torch.from_numpy(wv).requires_grad_() if ws else torch.ones(1, requires_grad=True)
        tr = torch.from_numpy(r)

        def torch_step():
            tw.grad = None
            if ws:
                out = F.conv2d(tx, tw, **kw)
            else:
                pool = F.max_pool2d if name.startswith("max") else F.avg_pool2d
                out = pool(tx * tw, **kw)
            loss = (out * tr).sum()
            loss.backward()
            return loss
        fns["torch"] = torch_step
        got, want = float(bwd.run(feeds)), float(torch_step())
        gw, tgw = w.grad, tw.grad.numpy()
        res["agree"] = bool(abs(got - want) <= 1e-3 * max(1.0, abs(want)) and
                            np.abs(gw - tgw).max() <= 1e-3 * max(1.0, np.abs(tgw).max()))
    res["timing"] = harness.timed(ctx, fns)
    return res


def run(ctx):
    torch = ctx.torch
    return {"title": "conv: conv2d and pooling layers fwd+bwd against PyTorch eager (perf/bench_conv.py)",
            "what": "float32, same input and weights; loss = sum(out * r); ratio < 1 means jitgraph is faster",
            "layers": [bench_layer(ctx, *layer, torch) for layer in layers(ctx.quick)]}


def markdown(res):
    rows = []
    for r in res["layers"]:
        t = r["timing"]["contenders"]
        ratio = r["timing"]["ratios"].get("jitgraph/torch")
        rows.append([r["layer"], fmt_s(t["jitgraph"]["median_s"]),
                     fmt_s(t["torch"]["median_s"]) if "torch" in t else "-",
                     f"{ratio['median']:.2f}" if ratio else "-", f"{r['peak_bytes'] / 2**20:.1f} MiB",
                     {True: "yes", False: "NO"}.get(r.get("agree"), "-")])
    return md_table(["layer (fwd+bwd)", "jitgraph", "torch eager", "jitgraph / torch", "jitgraph planned peak",
                     "loss and weight gradient agree (1e-3)"], rows)


WORKLOAD = harness.Workload("conv", "perf/bench_conv.py: conv2d and pooling layers against PyTorch", run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_conv.py",
                          description=__doc__.split("\n\n")[0]))
