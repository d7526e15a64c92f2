"""Batch norm benchmark: jitgraph against PyTorch eager (workload ``batchnorm``).

Run from the repository root (or ``jitgraph bench --only batchnorm``):

    python perf/bench_batchnorm.py            # full run (about a minute)
    python perf/bench_batchnorm.py --quick    # tiny sizes, a smoke test

Each layer is a training-mode ``batch_norm`` with weight, bias and running statistics, timed
fwd+bwd at 1 and 2 threads (every contender on the same count): the loss is the sum of the
output times a fixed random tensor, the input needs its gradient (it is a param in jitgraph,
``requires_grad`` in PyTorch, as inside a network), and the running statistics are updated
once per step in both.  Losses, the three gradients and the running statistics are
compared.  The shapes are a ResNet's on 32x32 images at batch 32: 16 channels at 32x32,
64 channels at 8x8.
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

THREADS = (1, 2)


def shapes(quick):
    return [(4, 16, 8, 8), (4, 64, 4, 4)] if quick else [(32, 16, 32, 32), (32, 64, 8, 8)]


def close(a, b, tol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max()))


def bench_layer(ctx, shape, torch):
    C = shape[1]
    rng = np.random.default_rng(0)
    xv = rng.normal(0.5, 2.0, shape).astype(np.float32)
    wv, bv = rng.uniform(0.5, 1.5, C).astype(np.float32), rng.uniform(-0.5, 0.5, C).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    g = jg.Graph(np.float32)
    x, w, b = g.param(xv, name="x"), g.param(wv, name="w"), g.param(bv, name="b")
    rm, rv = g.const(np.zeros(C), name="running_mean"), g.const(np.ones(C), name="running_var")
    y = jg.batch_norm(x, w, b, rm, rv, training=True, momentum=0.1)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * g.const(r))))
    fns = {"jitgraph": lambda: bwd.run()}
    res = {"shape": list(shape), "peak_bytes": bwd.peak_bytes}
    if torch is not None:
        F = torch.nn.functional
        tx, tw, tb = (torch.from_numpy(a.copy()).requires_grad_() for a in (xv, wv, bv))
        trm, trv, tr = torch.zeros(C), torch.ones(C), torch.from_numpy(r)

        def torch_step():
            tx.grad = tw.grad = tb.grad = None
            loss = (F.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.1) * tr).sum()
            loss.backward()
            return loss
        fns["torch"] = torch_step
        got, want = float(bwd.run()), float(torch_step())
        res["agree"] = bool(close(got, want) and close(x.grad, tx.grad.numpy()) and close(w.grad, tw.grad.numpy())
                            and close(b.grad, tb.grad.numpy()) and close(rm.value, trm.numpy())
                            and close(rv.value, trv.numpy()))
    res.update(harness.timed_by_threads(ctx, fns, THREADS))
    return res


def run(ctx):
    torch = ctx.torch
    return {"title": "batchnorm: training-mode batch_norm fwd+bwd against PyTorch eager (perf/bench_batchnorm.py)",
            "what": "float32, weight, bias and running statistics; loss = sum(out * r), gradients of x, weight "
                    "and bias; every contender at 1 and at 2 threads; ratio < 1 means jitgraph is faster",
            "layers": [bench_layer(ctx, s, torch) for s in shapes(ctx.quick)]}


def markdown(res):
    rows = []
    for r in res["layers"]:
        for entry in r["by_threads"]:
            t = entry["timing"]["contenders"]
            ratio = entry["timing"]["ratios"].get("jitgraph/torch")
            rows.append([str(tuple(r["shape"])), str(entry["threads"]), fmt_s(t["jitgraph"]["median_s"]),
                         fmt_s(t["torch"]["median_s"]) if "torch" in t else "-",
                         f"{ratio['median']:.2f}" if ratio else "-", f"{r['peak_bytes'] / 2**20:.1f} MiB",
                         {True: "yes", False: "NO"}.get(r.get("agree"), "-")])
    return md_table(["input (fwd+bwd)", "threads", "jitgraph", "torch eager", "jitgraph / torch",
                     "jitgraph planned peak", "loss, gradients and running stats agree (1e-4)"], rows)


WORKLOAD = harness.Workload("batchnorm", "perf/bench_batchnorm.py: batch_norm layers against PyTorch", run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_batchnorm.py",
                          description=__doc__.split("\n\n")[0]))
