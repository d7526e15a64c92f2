"""The lettered workloads of ``jitgraph bench`` and the issue's targets for them:

  a  tiny-op chain: 10k ops on 16-element float32 tensors, fwd+bwd (interpreter overhead)
  b  MLP chain x -> relu(h @ W_i), i = 1..1000 -> mean, B = D = 64, fwd+bwd
  c  MLP chain, 16 layers, B = 64, d = 1024, fwd+bwd (BLAS bound), at 1 and 2 threads
  d  forward build from Python + backward expansion of a 10k-layer chain (build phases)
  e  gradient checkpointing on a deep chain: planned peak and time (none / sqrt / 25% budget)
  f  cold compile (empty Numba cache, new process) and warm first run (second process):
     compile_time.py
  g  char-level GPT, 6 layers, d = 192, T = 128, B = 8, fwd+bwd against PyTorch eager, at
     1 and 2 threads, with jitgraph's per-op profile: gpt.py
  h  ResNet with batch norm on 32x32 images, fwd+bwd against PyTorch eager at 1 and 2
     threads, and checkpointing none / sqrt / a budget (peak, time): resnet.py
  i  char-level GPT with jg.attention and integer targets: fwd+bwd against PyTorch eager,
     a few hundred training steps plain and checkpointed (bit-identical), a sample: chargpt.py
  j  data-parallel training on Ray: the MLP of c at a global batch of 256 on 1, then 2
     workers (1 thread each): distributed.py
  k  inference from Python threads: one ForwardGraph run by 1, then 2 Python threads at
     once: concurrency.py

a, b, c and e time jitgraph against numpy eager (a hand-written backward) and PyTorch
eager, and check that loss and one gradient agree with each; c at 1 and at 2 threads.
"""
import gc
import math
import statistics
import time

import numpy as np

import jitgraph as jg

from . import chargpt, compile_time, concurrency, distributed, gpt, resnet
from .agreement import agreement, md_agreement
from .harness import (Target, Workload, add_torch_compile, interleaved, ratio_at, summarize, timed,
                      timed_by_threads)
from .models import build_phases, chain_weights, jg_chain, np_chain, torch_chain
from .report import fmt_s, md_by_threads, md_table, md_timing

WIDTH_A = 16
THREADS_C = (1, 2)          # (c) is timed at each, every contender on the same count


# ---- shared pieces ----------------------------------------------------------------------------

def chain_refs(ctx, weights, xb):
    """numpy and torch contenders of the chain: ({name: run}, {name: (loss, W_1 grad)})."""
    fns = {"numpy": lambda: np_chain(xb, weights)}
    loss, dWs, _ = np_chain(xb, weights)
    refs = {"numpy": (loss, dWs[0])}
    if ctx.torch is not None:
        run, Ws = torch_chain(ctx.torch, weights, xb)
        fns["torch"] = run
        refs["torch"] = (run().item(), Ws[0].grad.numpy().copy())
    return fns, refs


def timed_workload(ctx, fns, refs, jg_loss, jg_grad, grad_of, meta):
    res = dict(meta)
    res["agreement"] = agreement(jg_loss, jg_grad, refs, grad_of)
    res["timing"] = timed(ctx, fns)
    return res


def md_timed(res):
    """Section of a, b, c: the timing table, the agreement and the sizes."""
    sizes = (f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:.3g}" for k, v in res["sizes"].items())
    return md_timing(res["timing"], "jitgraph") + ["", md_agreement(res["agreement"]), f"Sizes: {', '.join(sizes)}."]


def plot_timed(res, plots, key):
    plots.timing(f"{key}.png", res["title"], res["timing"])


def torch_ratio(res):
    ratio = res["timing"]["ratios"].get("jitgraph/torch")
    return (None, "torch not available") if ratio is None else (ratio["median"], None)


# ---- (a) tiny-op chain ----------------------------------------------------------------------

def wl_a(ctx):
    n = 300 if ctx.quick else 10_000
    rng = np.random.default_rng(0)
    x0 = rng.uniform(-1, 1, WIDTH_A).astype(np.float32)
    # One round (scale, add, mul) maps h to (1.0001 h + y) y, so d loss / d x is
    # prod(1.0001 y) over ~n/3 rounds: y just below 1/1.0001 keeps both the values
    # and this gradient in float32's range (y in [0.5, 1.5] would overflow for y > 1
    # and underflow the gradient to 0 for y < 1).
    yb = rng.uniform(0.999, 0.9999, WIDTH_A).astype(np.float32)
    kinds = [i % 3 for i in range(n)]

    g = jg.Graph(np.float32)
    x = g.param(x0, name="x")
    y = g.input((WIDTH_A,), name="y")
    h = x
    for k in kinds:
        h = h * 1.0001 if k == 0 else (h + y if k == 1 else h * y)
    bwd = jg.build_backward(jg.build_forward(jg.sum(h)))
    feeds = {y: yb}
    fns = {"jitgraph": lambda: bwd.run(feeds)}
    jg_loss = float(bwd.run(feeds))
    jg_grad = x.grad

    s = np.float32(1.0001)

    def numpy_run():
        hh = x0
        for k in kinds:
            hh = hh * s if k == 0 else (hh + yb if k == 1 else hh * yb)
        loss = hh.sum()
        g_ = np.ones(WIDTH_A, np.float32)
        for k in reversed(kinds):        # add passes the gradient through unchanged
            if k == 0:
                g_ = g_ * s
            elif k == 2:
                g_ = g_ * yb
        return loss, g_
    fns["numpy"] = numpy_run
    refs = {"numpy": numpy_run()}

    if ctx.torch is not None:
        torch = ctx.torch
        xt = torch.tensor(x0, requires_grad=True)
        yt = torch.from_numpy(yb)

        def torch_run():
            xt.grad = None
            hh = xt
            for k in kinds:
                hh = hh * 1.0001 if k == 0 else (hh + yt if k == 1 else hh * yt)
            loss = hh.sum()
            loss.backward()
            return loss
        fns["torch"] = torch_run
        refs["torch"] = (torch_run().item(), xt.grad.numpy().copy())

    st = bwd.stats()
    meta = {"title": f"(a) tiny-op chain: {n:,} ops on {WIDTH_A}-element float32 tensors, fwd+bwd",
            "sizes": {"n_ops": n, "width": WIDTH_A, "program_nodes": st["n_nodes"],
                      "n_forward": st["n_forward"], "n_backward": st["n_backward"]},
            "what": "jitgraph: bwd.run (one jitted loop over the forward and backward nodes); numpy: the "
                    "same ops in a Python loop plus a hand-written backward loop; torch: the same ops with "
                    "autograd, then loss.backward()"}
    return timed_workload(ctx, fns, refs, jg_loss, jg_grad, "x", meta)


# ---- (b), (c) MLP chains ----------------------------------------------------------------------

def mlp_workload(ctx, key, n, d, b, thread_counts=None):
    """(b), (c): at the run's thread count, or (``thread_counts``) at each of them."""
    rng = np.random.default_rng(1)
    xb = rng.standard_normal((b, d)).astype(np.float32)
    weights = chain_weights(n, d, xb, rng)
    run, params, bwd = jg_chain(weights, xb)
    jg_loss = float(run())
    jg_grad = params[0].grad
    fns, refs = chain_refs(ctx, weights, xb)
    fns = {"jitgraph": run, **fns}
    flops = 3 * 2 * b * d * d * n       # forward, dW and dh matmuls (layer 1's dh is skipped by all)
    meta = {"title": f"({key}) MLP chain x ({b}, {d}) -> {n:,} x relu(h @ W_i) -> mean, float32, fwd+bwd",
            "sizes": {"layers": n, "d": d, "batch": b, "program_nodes": bwd.stats()["n_nodes"],
                      "matmul_gflop": flops / 1e9},
            "what": "jitgraph: bwd.run; numpy: eager forward plus a hand-written backward; torch: eager "
                    "forward, loss.backward() (grads set to None first)"}
    if thread_counts is None:
        return timed_workload(ctx, fns, refs, jg_loss, jg_grad, "W_1", meta)
    # (c): torch.compile too ((b)'s 1,000 layers would take many minutes to compile)
    compiled = (add_torch_compile(ctx, fns, torch_chain(ctx.torch, weights, xb)[0]) if ctx.torch is not None
                else "not run: torch is not installed")
    res = timed_by_threads(ctx, fns, thread_counts, extras={"loss": lambda: float(run())})
    res.update(meta)
    res["torch_compile"] = compiled
    res["what"] += f"; every contender timed at {' and '.join(map(str, thread_counts))} threads"
    res["agreement"] = agreement(jg_loss, jg_grad, refs, "W_1")
    # jitgraph's kernels promise the same bits at any thread count
    res["same_loss_every_thread_count"] = all(e["loss"] == jg_loss for e in res["by_threads"])
    return res


def md_by_threads_workload(res):
    """Section of c: a timing table per thread count, the agreement and the sizes."""
    sizes = (f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:.3g}" for k, v in res["sizes"].items())
    same = "yes" if res["same_loss_every_thread_count"] else "NO"
    return md_by_threads(res) + ["", md_agreement(res["agreement"])
                                 + f"  jitgraph's loss is the same at every thread count: {same}.",
                                 f"Sizes: {', '.join(sizes)}."]


def plot_by_threads(res, plots, key):
    plots.by_threads(f"{key}.png", res["title"], res)


def wl_b(ctx):
    return mlp_workload(ctx, "b", 20 if ctx.quick else 1000, 64, 64)


def wl_c(ctx):
    return mlp_workload(ctx, "c", 2 if ctx.quick else 16, 128 if ctx.quick else 1024, 64, THREADS_C)


# ---- (d) build phases ---------------------------------------------------------------------------

PHASES = ("params", "ops", "build_forward", "build_backward", "total")


def wl_d(ctx):
    n = 300 if ctx.quick else 10_000
    d = 64
    rng = np.random.default_rng(2)
    weights = list((rng.standard_normal((n, d, d), dtype=np.float32) * np.float32(np.sqrt(2 / d))))
    build_phases(weights[:3], (d, d))   # loads (or compiles) every pass: in no figure
    runs = []
    for r in range(ctx.repeats):
        ctx.note(f"build {r + 1}/{ctx.repeats}")
        gc.collect()                     # the previous graph's garbage is not charged to this build
        runs.append(build_phases(weights, (d, d)))
    med = {k: statistics.median(r[k] for r in runs) for k in PHASES}
    return {"title": f"(d) build a {n:,}-layer chain (B = D = {d}) from Python and expand its backward graph",
            "sizes": {"layers": n, "d": d, "ops": 2 * n + 1, "program_nodes": runs[-1]["nodes"]},
            "what": "params = jg.Graph, g.input and N g.param calls; ops = the Python loop h = relu(h @ W) and "
                    "jg.mean; build_forward = ordering + memory plan; build_backward = backward expansion + "
                    "ordering + memory plan of forward+backward; total = ops + build_forward + build_backward",
            "median_s": med, "runs": runs,
            "minor_faults_build_backward": [r["faults"] for r in runs]}


def md_d(res):
    m = res["median_s"]
    n, ops = res["sizes"]["layers"], res["sizes"]["ops"]
    rows = [[f"param creation ({n:,} g.param)", fmt_s(m["params"]), f"{fmt_s(m['params'] / n)} per param"],
            [f"forward ops build ({ops:,} ops)", fmt_s(m["ops"]), f"{fmt_s(m['ops'] / ops)} per op"],
            ["build_forward", fmt_s(m["build_forward"]), ""],
            ["build_backward", fmt_s(m["build_backward"]), ""],
            ["**total: ops + build_forward + build_backward**", f"**{fmt_s(m['total'])}**",
             f"{res['sizes']['program_nodes']:,} program nodes"]]
    return md_table(["phase", "median", "per unit"], rows) + [
        "", f"Medians of {len(res['runs'])} fresh builds (total = median of the per-build sums). "
            f"Minor page faults during build_backward: {res['minor_faults_build_backward']}."]


def plot_d(res, plots, key):
    m = res["median_s"]
    plots.bars(f"{key}.png", res["title"], list(PHASES), [m[k] for k in PHASES], "median time (s)")


# ---- (e) checkpointing ---------------------------------------------------------------------------

def wl_e(ctx):
    n, b, d = (100, 32, 64) if ctx.quick else (1000, 256, 64)   # quick: big enough for a 25% plan to exist
    rng = np.random.default_rng(3)
    xb = rng.standard_normal((b, d)).astype(np.float32)
    weights = chain_weights(n, d, xb, rng)
    ctx.note("warm-up builds")
    for kwargs in ({}, {"checkpoints": "sqrt"}, {"memory_budget": 1 << 20}):
        try:                             # loads (or compiles) the checkpoint passes: in no figure
            jg_chain(weights[:4], xb, **kwargs)[0]()
        except jg.GraphError:
            pass
    built, fns, info = {}, {}, {}
    for name, kwargs in (("none", {}), ("sqrt", {"checkpoints": "sqrt"}), ("budget 25%", None)):
        ctx.note(f"build {name}")
        if kwargs is None:               # a quarter of none's planned peak
            kwargs = {"memory_budget": int(0.25 * built["none"][2].peak_bytes)}
        t0 = time.perf_counter()
        try:
            built[name] = jg_chain(weights, xb, **kwargs)
        except jg.GraphError as e:       # no plan fits the budget
            info[name] = {"error": str(e)}
            continue
        run, params, bwd = built[name]
        st = bwd.stats()
        info[name] = {"build_s": time.perf_counter() - t0, "peak_bytes": int(bwd.peak_bytes),
                      "n_recomputed": st["n_recomputed"], "recompute_flops": st["recompute_flops"],
                      "kwargs": dict(kwargs)}
        fns[name] = run
    # bit-identity of every strategy with none: loss and every gradient
    ref_loss = built["none"][0]()
    ref_grads = [p.grad for p in built["none"][1]]
    for name, (run, params, bwd) in built.items():
        loss = run()
        info[name]["bit_identical"] = bool(np.array_equal(loss, ref_loss) and all(
            np.array_equal(p.grad, gr) for p, gr in zip(params, ref_grads)))
    none_peak = info["none"]["peak_bytes"]
    for r in info.values():
        if "peak_bytes" in r:
            r["peak_ratio"] = r["peak_bytes"] / none_peak

    ref_fns, refs = chain_refs(ctx, weights, xb)
    fns.update(ref_fns)
    if ctx.torch is not None:            # torch's own checkpointing, about sqrt(n) segments
        seg = max(1, round(math.sqrt(n)))
        fns[f"torch checkpoint_sequential({seg})"] = torch_chain(ctx.torch, weights, xb, segments=seg)[0]
    samples, calls = interleaved(ctx, fns)
    return {"title": f"(e) checkpointing: chain x ({b}, {d}) -> {n:,} x relu(h @ W_i) -> mean, float32, fwd+bwd",
            "sizes": {"layers": n, "d": d, "batch": b},
            "what": "jitgraph strategies: build_backward(fwd), checkpoints='sqrt', memory_budget=25% of none's "
                    "planned peak; peak = planned arena bytes (bwd.peak_bytes); time = bwd.run; ratios are "
                    "per repeat against jitgraph none",
            "strategies": info, "timing": summarize(samples, calls, ref="none", ref_over=False),
            "agreement": agreement(ref_loss, ref_grads[0], refs, "W_1")}


def md_e(res):
    rows = []
    for name, s in res["strategies"].items():
        if "error" in s:
            rows.append([name, f"GraphError: {s['error']}", "", "", "", ""])
        else:
            rows.append([name, f"{s['peak_bytes'] / 2 ** 20:.2f} MiB", f"{s['peak_ratio']:.3f}",
                         f"{s['n_recomputed']:,}", fmt_s(s["build_s"]), "yes" if s["bit_identical"] else "NO"])
    return (md_table(["strategy", "planned peak", "x none", "recomputed nodes", "build (graph + backward)",
                      "bit-identical to none"], rows)
            + ["", "fwd+bwd time (the references keep every activation, as none does):", ""]
            + md_timing(res["timing"], "none", ref_over=False) + ["", md_agreement(res["agreement"])])


def plot_e(res, plots, key):
    plot_timed(res, plots, key)
    fig, ax = plots.figure((6, 4))      # planned peak against time, one point per strategy
    t = res["timing"]["contenders"]
    for name, s in res["strategies"].items():
        if "peak_bytes" in s:
            ax.plot(t[name]["median_s"], s["peak_bytes"] / 2 ** 20, "o", markersize=8)
            ax.annotate(name, (t[name]["median_s"], s["peak_bytes"] / 2 ** 20),
                        textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("fwd+bwd median time (s)")
    ax.set_ylabel("planned peak (MiB)")
    ax.set_title("(e) checkpointing: planned peak vs time", fontsize=9)
    ax.grid(alpha=0.3)
    plots.save(fig, f"{key}_peak_vs_time.png")


WORKLOADS = [
    Workload("a", "tiny-op chain, fwd+bwd", wl_a, md_timed, plot_timed, (Target("jitgraph / torch", 0.02, torch_ratio),)),
    Workload("b", "MLP chain, 1000 layers, D = 64", wl_b, md_timed, plot_timed,
             (Target("jitgraph / torch", 1.0, torch_ratio),)),
    Workload("c", "MLP chain, 16 layers, d = 1024, at 1 and 2 threads", wl_c, md_by_threads_workload,
             plot_by_threads,
             tuple(Target(f"jitgraph / torch at {n} thread{'s' if n > 1 else ''}", 1.0, ratio_at(n))
                   for n in THREADS_C)),
    Workload("d", "build phases of a 10k-layer chain", wl_d, md_d, plot_d,
             (Target("forward build + backward expansion (s)", 0.070, lambda r: (r["median_s"]["total"], None)),)),
    Workload("e", "checkpointing strategies on a deep chain", wl_e, md_e, plot_e),
    compile_time.WORKLOAD,
    gpt.WORKLOAD,
    resnet.WORKLOAD,
    chargpt.WORKLOAD,
    distributed.WORKLOAD,
    concurrency.WORKLOAD,
]
