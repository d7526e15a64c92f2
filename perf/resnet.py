"""Workload (h) of ``jitgraph bench``: a CIFAR-style ResNet (He et al. 2016, the 6n + 2
layer family: a 3x3 stem, three stages of n basic blocks at 16 / 32 / 64 channels, global
average pooling, a linear classifier) with batch norm, on synthetic 32x32 images, fwd+bwd.

jitgraph beside PyTorch eager on the same float32 weights at 1 and 2 threads, and the
checkpointing table Chen et al. (2016) made for deep residual networks: planned peak and
time of none / sqrt / a memory budget, with the gradients and the batch-norm running
statistics compared bit for bit against none.
"""
import time
from dataclasses import dataclass

import numpy as np

import jitgraph as jg

from .agreement import agreement, md_agreement
from .harness import Target, Workload, add_torch_compile, ratio_at, timed_by_threads
from .report import md_by_threads, md_table

THREADS = (1, 2)
GRAD_OF = "stem.w"          # the first layer's weight: its gradient crosses every block


@dataclass(frozen=True)
class ResNetConfig:
    n: int                   # basic blocks per stage: 6n + 2 layers
    batch: int
    size: int = 32           # images are size x size, 3 channels
    widths: tuple = (16, 32, 64)
    classes: int = 10

    @property
    def depth(self):
        return 6 * self.n + 2


FULL = ResNetConfig(n=5, batch=32)         # ResNet-32
QUICK = ResNetConfig(n=1, batch=4, size=8)


def blocks(cfg):
    """(name, in channels, out channels, stride) of every basic block, in order."""
    out, c_in = [], cfg.widths[0]
    for s, c in enumerate(cfg.widths):
        for b in range(cfg.n):
            stride = 2 if s > 0 and b == 0 else 1
            out.append((f"s{s}b{b}", c_in, c, stride))
            c_in = c
    return out


def resnet_weights(cfg, seed=0):
    """(params, running stats): {name: float32 array}.  Convolutions He-normal (fan out),
    batch-norm gains 1 and shifts 0, running means 0 and variances 1, the classifier
    N(0, 0.01).  A block that changes shape has a 1x1 projection shortcut with batch norm."""
    rng = np.random.default_rng(seed)
    P, R = {}, {}

    def conv(name, c_out, c_in, k):
        P[name] = rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2.0 / (c_out * k * k))

    def bn(name, c):
        P[name + ".g"], P[name + ".b"] = np.ones(c), np.zeros(c)
        R[name + ".mean"], R[name + ".var"] = np.zeros(c), np.ones(c)

    conv("stem.w", cfg.widths[0], 3, 3)
    bn("stem.bn", cfg.widths[0])
    for name, c_in, c, stride in blocks(cfg):
        conv(name + ".c1", c, c_in, 3)
        bn(name + ".bn1", c)
        conv(name + ".c2", c, c, 3)
        bn(name + ".bn2", c)
        if stride != 1 or c_in != c:
            conv(name + ".sc", c, c_in, 1)
            bn(name + ".scbn", c)
    P["fc.w"] = rng.standard_normal((cfg.widths[-1], cfg.classes)) * 0.01
    P["fc.b"] = np.zeros(cfg.classes)
    f32 = lambda d: {k: v.astype(np.float32) for k, v in d.items()}   # noqa: E731
    return f32(P), f32(R)


def resnet_batch(cfg, rng):
    """Synthetic images (B, 3, size, size) float32 and integer labels (B,)."""
    return (rng.standard_normal((cfg.batch, 3, cfg.size, cfg.size)).astype(np.float32),
            rng.integers(0, cfg.classes, cfg.batch))


def jg_resnet(weights, stats, cfg, dtype=np.float32, **backward_kwargs):
    """The ResNet in jitgraph, fwd+bwd to the mean cross entropy on integer labels, batch
    norm in training mode.  Returns (bwd, images input, labels input, {name: param},
    {name: running-stat const})."""
    fwd, x, labels, P, R = resnet_forward(weights, stats, cfg, dtype)
    return jg.build_backward(fwd, **backward_kwargs), x, labels, P, R


def resnet_forward(weights, stats, cfg, dtype=np.float32):
    """jg_resnet's forward program: (fwd, images input, labels input, {name: param},
    {name: running-stat const})."""
    g = jg.Graph(dtype)
    P = {k: g.param(v, name=k) for k, v in weights.items()}
    R = {k: g.const(v, name=k) for k, v in stats.items()}
    x = g.input((cfg.batch, 3, cfg.size, cfg.size), name="images")
    labels = g.input((cfg.batch,), name="labels", dtype=np.int64)

    def bn(t, name):
        return jg.batch_norm(t, P[name + ".g"], P[name + ".b"], R[name + ".mean"], R[name + ".var"])

    h = jg.relu(bn(jg.conv2d(x, P["stem.w"], padding=1), "stem.bn"))
    for name, c_in, c, stride in blocks(cfg):
        y = jg.relu(bn(jg.conv2d(h, P[name + ".c1"], stride=stride, padding=1), name + ".bn1"))
        y = bn(jg.conv2d(y, P[name + ".c2"], padding=1), name + ".bn2")
        if name + ".sc" in P:
            h = bn(jg.conv2d(h, P[name + ".sc"], stride=stride), name + ".scbn")
        h = jg.relu(y + h)
    logits = jg.mean(h, axis=(2, 3)) @ P["fc.w"] + P["fc.b"]
    return jg.build_forward(jg.cross_entropy(logits, labels)), x, labels, P, R


def torch_resnet(torch, weights, stats, cfg):
    """The same network in PyTorch eager (F.conv2d, F.batch_norm in training mode, F.relu,
    F.cross_entropy) on copies of the same weights.  Returns (run(images, labels) -> loss
    after loss.backward(), {name: param}, {name: running stat})."""
    F = torch.nn.functional
    P = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    R = {k: torch.tensor(v) for k, v in stats.items()}

    def bn(t, name):
        return F.batch_norm(t, R[name + ".mean"], R[name + ".var"], P[name + ".g"], P[name + ".b"],
                            training=True, momentum=0.1, eps=1e-5)

    def run(x, labels):
        for p in P.values():
            p.grad = None                 # what optimizer.zero_grad(set_to_none=True) does
        h = F.relu(bn(F.conv2d(x, P["stem.w"], padding=1), "stem.bn"))
        for name, c_in, c, stride in blocks(cfg):
            y = F.relu(bn(F.conv2d(h, P[name + ".c1"], stride=stride, padding=1), name + ".bn1"))
            y = bn(F.conv2d(y, P[name + ".c2"], padding=1), name + ".bn2")
            if name + ".sc" in P:
                h = bn(F.conv2d(h, P[name + ".sc"], stride=stride), name + ".scbn")
            h = F.relu(y + h)
        logits = h.mean(dim=(2, 3)) @ P["fc.w"] + P["fc.b"]
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        return loss
    return run, P, R


def agreement_float64(torch, weights, stats, cfg, images, labels):
    """Loss and stem gradient of one step in float64, jitgraph against PyTorch.  In float32
    the two differ by up to 1e-2 of the deep layers' gradients (31 batch norms; each is as
    far from the float64 result: jitgraph's median 2e-3, PyTorch's 5e-3 at ResNet-32), so
    the comparison that can catch a wrong kernel is in float64, to 1e-9."""
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    S = {k: v.astype(np.float64) for k, v in stats.items()}
    bwd, x, lab, P, _ = jg_resnet(W, S, cfg, dtype=np.float64)
    loss = bwd.run({x: images.astype(np.float64), lab: labels})
    trun, tparams, _ = torch_resnet(torch, W, S, cfg)
    tloss = trun(torch.from_numpy(images.astype(np.float64)), torch.from_numpy(labels)).item()
    return agreement(float(loss), P[GRAD_OF].grad, {"torch": (tloss, tparams[GRAD_OF].grad.numpy())},
                     GRAD_OF + " (float64)", tol=1e-9)


STRATEGIES = (("none", {}), ("sqrt", {"checkpoints": "sqrt"}), ("budget 50%", None))


def run(ctx):
    cfg = QUICK if ctx.quick else FULL
    weights, stats = resnet_weights(cfg)
    images, labels = resnet_batch(cfg, np.random.default_rng(1))
    built, info = {}, {}
    for name, kwargs in STRATEGIES:
        ctx.note(f"build {name}")
        if kwargs is None:
            kwargs = {"memory_budget": int(0.5 * built["none"][0].peak_bytes)}
        t0 = time.perf_counter()
        try:
            built[name] = jg_resnet(weights, stats, cfg, **kwargs)
        except jg.GraphError as e:          # no plan fits the budget
            info[name] = {"error": str(e)}
            continue
        bwd = built[name][0]
        st = bwd.stats()
        info[name] = {"build_s": time.perf_counter() - t0, "peak_bytes": int(bwd.peak_bytes),
                      "n_recomputed": st["n_recomputed"], "kwargs": dict(kwargs)}
    # one step each from the same weights and stats: loss, every gradient and the running
    # statistics the step left behind, compared bit for bit with none
    results = {}
    for name, (bwd, x, lab, P, R) in built.items():
        loss = bwd.run({x: images, lab: labels})
        results[name] = (loss, {k: p.grad for k, p in P.items()}, {k: r.value.copy() for k, r in R.items()})
    ref = results["none"]
    for name, (loss, grads, rstats) in results.items():
        info[name]["bit_identical"] = bool(np.array_equal(loss, ref[0])
                                           and all(np.array_equal(grads[k], ref[1][k]) for k in grads))
        info[name]["same_running_stats"] = all(np.array_equal(rstats[k], ref[2][k]) for k in rstats)
        info[name]["peak_ratio"] = info[name]["peak_bytes"] / info["none"]["peak_bytes"]
    fns = {}
    for name, (bwd, x, lab, P, R) in built.items():
        feeds = {x: images, lab: labels}
        fns["jitgraph" if name == "none" else f"jitgraph {name}"] = lambda bwd=bwd, feeds=feeds: bwd.run(feeds)
    agreed = None
    if ctx.torch is not None:
        trun, tparams, tstats = torch_resnet(ctx.torch, weights, stats, cfg)
        ti, tl = ctx.torch.from_numpy(images), ctx.torch.from_numpy(labels)
        trun(ti, tl)
        fns["torch"] = lambda: trun(ti, tl)
        agreed = agreement_float64(ctx.torch, weights, stats, cfg, images, labels)
    compiled = (add_torch_compile(ctx, fns, torch_resnet(ctx.torch, weights, stats, cfg)[0], ti, tl) if ctx.torch
                else "not run: torch is not installed")
    res = timed_by_threads(ctx, fns, THREADS)
    res["torch_compile"] = compiled
    res.update({
        "title": f"(h) ResNet-{cfg.depth} (CIFAR-style, widths {'/'.join(map(str, cfg.widths))}, batch norm), "
                 f"batch {cfg.batch}, {cfg.size}x{cfg.size}, float32, fwd+bwd",
        "what": "conv3x3 stem, 3 stages of basic blocks (conv-bn-relu-conv-bn + shortcut, 1x1 projection with "
                "batch norm where the shape changes), global average pool, linear, mean cross entropy on integer "
                "labels; batch norm in training mode.  jitgraph: bwd.run; torch: eager F.conv2d / F.batch_norm / "
                "F.cross_entropy, loss.backward() with grads set to None first; the same float32 weights",
        "sizes": {"depth": cfg.depth, "batch": cfg.batch, "size": cfg.size,
                  "params": int(sum(v.size for v in weights.values())),
                  "program_nodes": built["none"][0].stats()["n_nodes"]},
        "strategies": info,
        "agreement": agreed or agreement(float(ref[0]), ref[1][GRAD_OF], {}, GRAD_OF),
    })
    return res


def time_ratio(res, name, threads):
    """Median per-repeat time of strategy ``name`` over none's at ``threads``."""
    entry = next((e for e in res["by_threads"] if e["threads"] == threads), None)
    r = entry and entry["timing"]["ratios"].get(f"jitgraph/jitgraph {name}")
    return None if not r else float(np.median([1.0 / v for v in r["per_repeat"]]))


def markdown(res):
    ratios = []
    for e in res["by_threads"]:
        r = e["timing"]["ratios"].get("jitgraph/torch")
        if r is not None:
            ratios.append(f"{e['threads']} thr {r['median']:.3g}")
    rows = []
    for name, s in res["strategies"].items():
        if "error" in s:
            rows.append([name, f"GraphError: {s['error']}", "", "", "", "", ""])
            continue
        t = time_ratio(res, name, THREADS[0]) if name != "none" else 1.0
        rows.append([name, f"{s['peak_bytes'] / 2 ** 20:.2f} MiB", f"{s['peak_ratio']:.3f}",
                     "-" if t is None else f"{t:.3f}", f"{s['n_recomputed']:,}",
                     "yes" if s["bit_identical"] else "NO", "yes" if s["same_running_stats"] else "NO"])
    return (md_by_threads(res)
            + ["", "jitgraph (no checkpointing) / torch: " + (", ".join(ratios) or "torch not available") + ".",
               "", f"Checkpointing (Chen et al.'s table; time x none at {THREADS[0]} thread):", ""]
            + md_table(["strategy", "planned peak", "x none", "time x none", "recomputed nodes",
                        "gradients bit-identical", "running stats bit-identical"], rows)
            + ["", md_agreement(res["agreement"]),
               "", f"Sizes: {res['sizes']['params']:,} parameters, {res['sizes']['program_nodes']:,} program nodes."])


def sqrt_peak(res):
    s = res["strategies"].get("sqrt", {})
    return s.get("peak_ratio"), s.get("error")


def sqrt_time(res):
    return time_ratio(res, "sqrt", THREADS[0]), None


def plot(res, plots, key):
    plots.by_threads(f"{key}.png", res["title"], res)


WORKLOAD = Workload("h", "ResNet with batch norm on 32x32 images, fwd+bwd, 1 and 2 threads, checkpointing", run,
                    markdown, plot,
                    tuple(Target(f"jitgraph / torch at {n} thread{'s' if n > 1 else ''}", 1.0, ratio_at(n))
                          for n in THREADS)
                    + (Target("sqrt planned peak x none", 0.35, sqrt_peak),
                       Target(f"sqrt time x none ({THREADS[0]} thread)", 1.35, sqrt_time)))
