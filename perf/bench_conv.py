"""Convolution and pooling benchmark: jitgraph against PyTorch eager (workload ``conv``).

Run from the repository root (or ``jitgraph bench --only conv``):

    python perf/bench_conv.py            # full run (a few minutes)
    python perf/bench_conv.py --quick    # tiny sizes, a smoke test

Each layer is timed fwd+bwd (the loss is the sum of the output times a fixed random
tensor, so every output element gets a gradient) with the same float32 input and
weights in both, at the harness's thread count; the losses and the weight gradient are
compared.  Then a small ResNet-like stack (``resnet``: a 3x3 stem, then 3 stages of
16 / 32 / 64 channels of ``BLOCKS`` residual blocks relu(conv3x3(relu(conv3x3(x))) + x),
the first block of stages 2 and 3 with stride 2 and a 1x1 stride-2 projection, a
global mean, a linear layer and cross entropy on integer classes; no batch norm) is
timed fwd+bwd at batch 32 on 32x32 images, at 1 and 2 threads, against the same
model in PyTorch eager on the same weights.  jitgraph lowers conv2d to register-tiled
products (ops/conv.py), pooling to direct kernels (ops/pool.py); PyTorch calls its
oneDNN kernels.
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
from .report import fmt_s, md_by_threads, md_table  # noqa: E402

THREADS = (1, 2)
BLOCKS = 2                 # residual blocks per stage: 6 * BLOCKS + 2 weighted layers, ResNet-14


def layers(quick):
    """(name, input shape, weight shape or None, kwargs) of ResNet-on-32x32-like layers."""
    n = 4 if quick else 32
    s = 8 if quick else 32
    return [("conv 3x3, 16 -> 16 ch, pad 1", (n, 16, s, s), (16, 16, 3, 3), dict(padding=1)),
            ("conv 3x3, 32 -> 32 ch, pad 1", (n, 32, s // 2, s // 2), (32, 32, 3, 3), dict(padding=1)),
            ("conv 3x3, 64 -> 64 ch, pad 1", (n, 64, s // 4, s // 4), (64, 64, 3, 3), dict(padding=1)),
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


# ---- the ResNet-like stack -------------------------------------------------------------------------
def resnet_layout(blocks=BLOCKS, widths=(16, 32, 64), classes=10, in_ch=3):
    """The weights' names and shapes, in order: ("stem", ...), then per block conv a, conv b and
    (first block of a later stage) the projection, then the classifier."""
    shapes = [("stem", (widths[0], in_ch, 3, 3))]
    c = widths[0]
    for s, width in enumerate(widths):
        for b in range(blocks):
            shapes.append((f"s{s}b{b}a", (width, c, 3, 3)))
            shapes.append((f"s{s}b{b}b", (width, width, 3, 3)))
            if c != width:
                shapes.append((f"s{s}b{b}p", (width, c, 1, 1)))
            c = width
    shapes.append(("fc", (c, classes)))
    return shapes


def resnet_weights(blocks=BLOCKS, seed=0):
    """float32 He-scaled weights; the second conv of each block scaled by 0.2 (no batch norm:
    the residual branches start small, so activations stay O(1) through the stack)."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in resnet_layout(blocks):
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        scale = np.sqrt(2.0 / fan_in) * (0.2 if name.endswith("b") else 1.0)
        w[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return w


def _stride(name):
    """Stride 2 for the first block of stages 1 and 2 (conv a and the projection)."""
    return 2 if name[1] in "12" and name[3] == "0" and name[-1] in "ap" else 1


def jg_resnet(w, batch, blocks=BLOCKS, **backward_kwargs):
    """jitgraph's stack; returns (bwd, image input, class input, params by name)."""
    g = jg.Graph(np.float32)
    x = g.input((batch, 3, 32, 32), name="images")
    t = g.input((batch,), dtype=np.int64, name="classes")
    p = {name: g.param(v, name=name) for name, v in w.items()}
    h = jg.relu(jg.conv2d(x, p["stem"], padding=1))
    for s in range(3):
        for b in range(blocks):
            key = f"s{s}b{b}"
            a = jg.relu(jg.conv2d(h, p[key + "a"], stride=_stride(key + "a"), padding=1))
            skip = jg.conv2d(h, p[key + "p"], stride=2) if key + "p" in p else h
            h = jg.relu(jg.conv2d(a, p[key + "b"], padding=1) + skip)
    logits = jg.mean(h, axis=(2, 3)) @ p["fc"]
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(logits, t)), **backward_kwargs)
    return bwd, x, t, p


def torch_resnet(torch, w, blocks=BLOCKS):
    """The same stack in PyTorch eager; returns (run(x, t) -> loss after backward, params)."""
    F = torch.nn.functional
    p = {name: torch.from_numpy(v.copy()).requires_grad_() for name, v in w.items()}

    def run(x, t):
        for v in p.values():
            v.grad = None
        h = F.relu(F.conv2d(x, p["stem"], padding=1))
        for s in range(3):
            for b in range(blocks):
                key = f"s{s}b{b}"
                a = F.relu(F.conv2d(h, p[key + "a"], stride=_stride(key + "a"), padding=1))
                skip = F.conv2d(h, p[key + "p"], stride=2) if key + "p" in p else h
                h = F.relu(F.conv2d(a, p[key + "b"], padding=1) + skip)
        loss = F.cross_entropy(h.mean(dim=(2, 3)) @ p["fc"], t)
        loss.backward()
        return loss
    return run, p


def bench_resnet(ctx):
    batch = 4 if ctx.quick else 32
    w = resnet_weights()
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    tv = rng.integers(0, 10, batch)
    bwd, x, t, params = jg_resnet(w, batch)
    feeds = {x: xv, t: tv}
    fns = {"jitgraph": lambda: bwd.run(feeds)}
    res = {"batch": batch, "peak_bytes": bwd.peak_bytes, "n_nodes": bwd.stats()["n_nodes"]}
    if ctx.torch is not None:
        trun, tp = torch_resnet(ctx.torch, w)
        tx, tt = ctx.torch.from_numpy(xv), ctx.torch.from_numpy(tv)
        fns["torch"] = lambda: trun(tx, tt)
        got, want = float(bwd.run(feeds)), float(trun(tx, tt))
        gs, ts = params["stem"].grad, tp["stem"].grad.numpy()
        res["agree"] = bool(abs(got - want) <= 1e-4 * max(1.0, abs(want))
                            and np.abs(gs - ts).max() <= 1e-3 * max(1e-6, np.abs(ts).max()))
    res.update(harness.timed_by_threads(ctx, fns, THREADS, extras={"loss": lambda: float(bwd.run(feeds))}))
    return res


def run(ctx):
    torch = ctx.torch
    return {"title": "conv: conv2d and pooling layers, and a ResNet-like stack, fwd+bwd against PyTorch eager "
                     "(perf/bench_conv.py)",
            "what": "float32, same input and weights; loss = sum(out * r) for a layer; ratio < 1 means jitgraph "
                    "is faster",
            "layers": [bench_layer(ctx, *layer, torch) for layer in layers(ctx.quick)],
            "resnet": bench_resnet(ctx)}


def markdown(res):
    rows = []
    for r in res["layers"]:
        t = r["timing"]["contenders"]
        ratio = r["timing"]["ratios"].get("jitgraph/torch")
        rows.append([r["layer"], fmt_s(t["jitgraph"]["median_s"]),
                     fmt_s(t["torch"]["median_s"]) if "torch" in t else "-",
                     f"{ratio['median']:.2f}" if ratio else "-", f"{r['peak_bytes'] / 2**20:.1f} MiB",
                     {True: "yes", False: "NO"}.get(r.get("agree"), "-")])
    out = md_table(["layer (fwd+bwd)", "jitgraph", "torch eager", "jitgraph / torch", "jitgraph planned peak",
                    "loss and weight gradient agree (1e-3)"], rows)
    rn = res["resnet"]
    ratios = [f"{e['threads']} thr {e['timing']['ratios']['jitgraph/torch']['median']:.2f}"
              for e in rn["by_threads"] if "jitgraph/torch" in e["timing"]["ratios"]]
    same = all(e["loss"] == rn["by_threads"][0]["loss"] for e in rn["by_threads"])
    return out + ["", f"ResNet-like stack ({6 * BLOCKS + 2} weighted layers, 16/32/64 channels, batch {rn['batch']}, "
                      f"32x32, no batch norm), fwd+bwd:", ""] + md_by_threads(rn) + [
        "", "jitgraph / torch: " + (", ".join(ratios) or "torch not available")
        + f"; loss and stem gradient agree with torch: {({True: 'yes', False: 'NO'}).get(rn.get('agree'), '-')}; "
          f"jitgraph's loss the same at every thread count: {'yes' if same else 'NO'}; "
          f"planned peak {rn['peak_bytes'] / 2**20:.1f} MiB, {rn['n_nodes']} nodes."]


# no Target here: the target is workload (h), a full ResNet; these figures say where the kernels stand
WORKLOAD = harness.Workload(
    "conv", "perf/bench_conv.py: conv2d and pooling layers and a ResNet-like stack against PyTorch", run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_conv.py",
                          description=__doc__.split("\n\n")[0]))
