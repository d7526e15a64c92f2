"""``jitgraph bench``: named workloads timed against numpy eager and PyTorch eager.

Workloads (``--only a,b,...``; ``--quick`` shrinks every size to a smoke test):

  a  tiny-op chain: 10k ops on 16-element float32 tensors, fwd+bwd (interpreter overhead)
  b  MLP chain x -> relu(h @ W_i), i = 1..1000 -> mean, B = D = 64, fwd+bwd
  c  MLP chain, 16 layers, B = 64, d = 1024, fwd+bwd (BLAS bound)
  d  forward build from Python + backward expansion of a 10k-layer chain (build phases)
  e  gradient checkpointing on a deep chain: planned peak and time (none / sqrt / 25% budget)
  f  cold compile (empty Numba cache, new process) and warm first run (second process)

How figures are taken: every contender is run once as a warm-up; then, in each of
``--repeats`` (>= 5) repeats, the contenders take turns (the order flips every repeat),
each making one untimed call and then timing enough back-to-back calls to last
``min_sample_s`` (0.2 s).  A figure is the median
over the repeats; a ratio is taken per repeat (jitgraph / numpy, jitgraph / torch) and
then its median.  All contenders share one thread count (``--threads``): torch through
``torch.set_num_threads``, every BLAS and OpenMP pool through threadpoolctl.

Results go to ``--out DIR`` (default ``perf/results/<timestamp>/``): ``results.json``,
``results.md`` and one PNG per workload.
"""
import argparse
import gc
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import numpy as np

TOL = 1e-3                  # agreement: max|diff| / max|reference|, fit for float32 over deep chains
MIN_REPEATS = 5
COMPILE_PAIRS = 5           # (f): cold+warm process pairs; a cold one compiles for ~15 s
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

# The issue's targets: (workload, what is compared, limit).  Measured, never asserted.
TARGETS = [
    ("a", "jitgraph / torch", 0.02),
    ("b", "jitgraph / torch", 1.0),
    ("c", "jitgraph / torch", 1.1),
    ("d", "forward build + backward expansion (s)", 0.070),
    ("f", "cold process (s)", 20.0),
    ("f", "warm process (s)", 1.0),
]


# ---- timing -------------------------------------------------------------------------------

@dataclass
class Ctx:
    """What every workload needs: sizes mode, timing settings, torch (or None), a
    callback to show progress."""
    quick: bool
    repeats: int
    min_sample_s: float
    threads: int
    torch: object
    note: Callable[[str], None]


def time_calls(fn, calls):
    """Seconds per call of ``calls`` back-to-back calls of fn (the perf scripts share it)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def interleaved(ctx, fns):
    """Per-call seconds of each contender in ``fns`` (name -> callable), one sample per
    repeat, contenders taking turns inside each repeat.  Returns {name: [seconds]} and
    {name: calls per sample}."""
    names = list(fns)
    for name in names:
        ctx.note(f"warm-up {name}")
        fns[name]()
    calls = {}
    for name in names:
        # each contender gets its own call count, so a fast one is not timed on a single
        # call just because a slow one is in the same table
        t = min(time_calls(fns[name], 1) for _ in range(3))
        calls[name] = max(1, math.ceil(ctx.min_sample_s / max(t, 1e-9)))
    samples = {name: [] for name in names}
    for r in range(ctx.repeats):
        ctx.note(f"repeat {r + 1}/{ctx.repeats}")
        gc.collect()                  # collect between repeats, never inside a sample (as timeit)
        gc.disable()
        try:
            for name in (names if r % 2 == 0 else names[::-1]):
                # one untimed call first: the first call after another contender ran is
                # measured up to 2x slower here (that contender's BLAS threads still
                # spinning, its data in the caches); it is not this contender's speed
                fns[name]()
                samples[name].append(time_calls(fns[name], calls[name]))
        finally:
            gc.enable()
    return samples, calls


def summarize(samples, calls, ref="jitgraph", ref_over=True):
    """Medians per contender and the median of per-repeat ratios: ref / contender
    (``ref_over``) or contender / ref."""
    contenders = {name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s),
                         "samples_s": s, "calls_per_sample": calls[name]}
                  for name, s in samples.items()}
    ratios = {}
    for name, s in samples.items():
        if name != ref:
            top, bottom, key = (samples[ref], s, f"{ref}/{name}") if ref_over else (s, samples[ref], f"{name}/{ref}")
            per = [a / b for a, b in zip(top, bottom)]
            ratios[key] = {"median": statistics.median(per), "per_repeat": per}
    return {"contenders": contenders, "ratios": ratios}


def agree(got, ref, tol=TOL):
    """Does ``got`` match ``ref`` within ``tol`` of ref's largest magnitude?"""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) / scale if scale > 0 else float("inf")
    finite = bool(np.all(np.isfinite(got)) and np.all(np.isfinite(ref)))
    return {"ok": finite and diff <= tol, "max_diff_over_scale": diff, "scale": scale}


def agreement(jg_loss, jg_grad, refs, grad_of):
    """Loss and one gradient of jitgraph against each reference {name: (loss, grad)}."""
    out = {"tolerance": TOL, "grad_of": grad_of}
    for name, (loss, grad) in refs.items():
        a, b = agree(jg_loss, loss), agree(jg_grad, grad)
        out[name] = {"ok": a["ok"] and b["ok"], "loss": a, "grad": b,
                     "loss_values": [float(jg_loss), float(loss)]}
    return out


def fmt_s(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


# ---- shared models ----------------------------------------------------------------------

def chain_weights(n, d, xb, rng):
    """n float32 (d, d) weights, He-scaled, then each rescaled so relu(h @ W) keeps the
    batch's activation RMS.  Plain He scaling drifts by ~1/d a layer, which over 1000
    layers leaves gradients too small for an agreement check to mean anything."""
    h = xb.astype(np.float64)
    rms0 = np.sqrt(np.mean(h * h))
    out = []
    for _ in range(n):
        W = rng.standard_normal((d, d)) * np.sqrt(2.0 / d)
        a = np.maximum(h @ W, 0.0)
        W = (W * (rms0 / np.sqrt(np.mean(a * a)))).astype(np.float32)
        out.append(W)
        h = np.maximum(h @ W.astype(np.float64), 0.0)
    return out


def jg_chain(weights, xb, **backward_kwargs):
    """jitgraph's chain x -> relu(h @ W_i) -> mean; returns (run, params, bwd)."""
    import jitgraph as jg
    g = jg.Graph(np.float32)
    x = g.input(xb.shape, name="x")
    params = [g.param(w) for w in weights]
    h = x
    for W in params:
        h = jg.relu(h @ W)
    bwd = jg.build_backward(jg.build_forward(jg.mean(h)), **backward_kwargs)
    feeds = {x: xb}
    return (lambda: bwd.run(feeds)), params, bwd


def np_chain(xb, weights):
    """numpy eager forward and hand-written backward; returns (loss, [dW_i])."""
    hs = [xb]
    h = xb
    for W in weights:
        h = h @ W
        np.maximum(h, 0, out=h)          # relu in place: h > 0 exactly where h @ W > 0
        hs.append(h)
    loss = h.mean()
    g = np.full(h.shape, 1.0 / h.size, xb.dtype)
    dWs = [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        g *= hs[i + 1] > 0
        dWs[i] = hs[i].T @ g
        if i:                            # x is an input: its gradient is never needed
            g = g @ weights[i].T
    return loss, dWs


def torch_chain(torch, weights, xb, segments=None):
    """PyTorch eager chain with autograd; ``segments``: torch.utils.checkpoint's
    checkpoint_sequential with that many segments.  Returns (run, params)."""
    Ws = [torch.tensor(w, requires_grad=True) for w in weights]
    x = torch.from_numpy(xb)
    layers = [lambda h, W=W: torch.relu(h @ W) for W in Ws]

    def run():
        for W in Ws:
            W.grad = None                # what optimizer.zero_grad(set_to_none=True) does
        if segments:
            from torch.utils.checkpoint import checkpoint_sequential
            h = checkpoint_sequential(layers, segments, x, use_reentrant=False)
        else:
            h = x
            for f in layers:
                h = f(h)
        loss = h.mean()
        loss.backward()
        return loss
    return run, Ws


def chain_refs(ctx, weights, xb):
    """numpy and torch contenders of the chain: ({name: run}, {name: (loss, W_1 grad)})."""
    fns = {"numpy": lambda: np_chain(xb, weights)}
    loss, dWs = np_chain(xb, weights)
    refs = {"numpy": (loss, dWs[0])}
    if ctx.torch is not None:
        run, Ws = torch_chain(ctx.torch, weights, xb)
        fns["torch"] = run
        refs["torch"] = (run().item(), Ws[0].grad.numpy().copy())
    return fns, refs


def timed_workload(ctx, fns, refs, jg_loss, jg_grad, grad_of, meta):
    res = dict(meta)
    res["agreement"] = agreement(jg_loss, jg_grad, refs, grad_of)
    res["timing"] = summarize(*interleaved(ctx, fns))
    return res


# ---- (a) tiny-op chain ----------------------------------------------------------------------

WIDTH_A = 16


def wl_a(ctx):
    import jitgraph as jg
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
            "sizes": {"n_ops": n, "width": WIDTH_A, "program_nodes": int(bwd.order.size),
                      "n_forward": st["n_forward"], "n_backward": st["n_backward"]},
            "what": "jitgraph: bwd.run (one jitted loop over the forward and backward nodes); numpy: the "
                    "same ops in a Python loop plus a hand-written backward loop; torch: the same ops with "
                    "autograd, then loss.backward()"}
    return timed_workload(ctx, fns, refs, jg_loss, jg_grad, "x", meta)


# ---- (b), (c) MLP chains ----------------------------------------------------------------------

def mlp_workload(ctx, key, n, d, b):
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
            "sizes": {"layers": n, "d": d, "batch": b, "program_nodes": int(bwd.order.size),
                      "matmul_gflop": flops / 1e9},
            "what": "jitgraph: bwd.run; numpy: eager forward plus a hand-written backward; torch: eager "
                    "forward, loss.backward() (grads set to None first)"}
    return timed_workload(ctx, fns, refs, jg_loss, jg_grad, "W_1", meta)


def wl_b(ctx):
    return mlp_workload(ctx, "b", 20 if ctx.quick else 1000, 64, 64)


def wl_c(ctx):
    return mlp_workload(ctx, "c", 2 if ctx.quick else 16, 128 if ctx.quick else 1024, 64)


# ---- (d) build phases ---------------------------------------------------------------------------

def minor_faults():
    try:
        import resource
    except ImportError:                  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def build_phases(weights, shape, keep=None):
    """Seconds of each build phase of the chain (a fresh graph each time).  ``keep``,
    a dict, receives the built x, params and bwd for callers that also run them."""
    import jitgraph as jg
    t0 = time.perf_counter()
    g = jg.Graph(np.float32)
    x = g.input(shape, name="x")
    params = [g.param(w) for w in weights]
    t1 = time.perf_counter()
    h = x
    for W in params:
        h = jg.relu(h @ W)
    loss = jg.mean(h)
    t2 = time.perf_counter()
    fwd = jg.build_forward(loss)
    t3 = time.perf_counter()
    f0 = minor_faults()
    bwd = jg.build_backward(fwd)
    t4 = time.perf_counter()
    faults = None if f0 is None else minor_faults() - f0
    if keep is not None:
        keep.update(x=x, params=params, bwd=bwd)
    return {"params": t1 - t0, "ops": t2 - t1, "build_forward": t3 - t2, "build_backward": t4 - t3,
            "total": t4 - t1, "faults": faults, "nodes": int(bwd.order.size)}


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
    keys = ("params", "ops", "build_forward", "build_backward", "total")
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    return {"title": f"(d) build a {n:,}-layer chain (B = D = {d}) from Python and expand its backward graph",
            "sizes": {"layers": n, "d": d, "ops": 2 * n + 1, "program_nodes": runs[-1]["nodes"]},
            "what": "params = jg.Graph, g.input and N g.param calls; ops = the Python loop h = relu(h @ W) and "
                    "jg.mean; build_forward = ordering + memory plan; build_backward = backward expansion + "
                    "ordering + memory plan of forward+backward; total = ops + build_forward + build_backward",
            "median_s": med, "runs": runs,
            "minor_faults_build_backward": [r["faults"] for r in runs]}


# ---- (e) checkpointing ---------------------------------------------------------------------------

def wl_e(ctx):
    n, b, d = (100, 32, 64) if ctx.quick else (1000, 256, 64)   # quick: big enough for a 25% plan to exist
    rng = np.random.default_rng(3)
    xb = rng.standard_normal((b, d)).astype(np.float32)
    weights = chain_weights(n, d, xb, rng)
    strategies = {"none": {}, "sqrt": {"checkpoints": "sqrt"}}
    ctx.note("warm-up builds")
    for kwargs in ({}, {"checkpoints": "sqrt"}, {"memory_budget": 1 << 20}):
        try:                             # loads (or compiles) the checkpoint passes: in no figure
            jg_chain(weights[:4], xb, **kwargs)[0]()
        except ValueError:
            pass
    built, fns, info = {}, {}, {}
    for name, kwargs in list(strategies.items()) + [("budget 25%", None)]:
        ctx.note(f"build {name}")
        if kwargs is None:               # a quarter of none's planned peak
            kwargs = {"memory_budget": int(0.25 * built["none"][2].peak_bytes)}
        t0 = time.perf_counter()
        try:
            built[name] = jg_chain(weights, xb, **kwargs)
        except ValueError as e:          # GraphError: no plan fits the budget
            info[name] = {"error": str(e)}
            continue
        run, params, bwd = built[name]
        st = bwd.stats()
        info[name] = {"build_s": time.perf_counter() - t0, "peak_bytes": int(bwd.peak_bytes),
                      "n_recomputed": st["n_recomputed"], "recompute_flops": st["recompute_flops"],
                      "kwargs": {k: v for k, v in kwargs.items()}}
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
    timing = summarize(samples, calls, ref="none", ref_over=False)
    return {"title": f"(e) checkpointing: chain x ({b}, {d}) -> {n:,} x relu(h @ W_i) -> mean, float32, fwd+bwd",
            "sizes": {"layers": n, "d": d, "batch": b},
            "what": "jitgraph strategies: build_backward(fwd), checkpoints='sqrt', memory_budget=25% of none's "
                    "planned peak; peak = planned arena bytes (bwd.peak_bytes); time = bwd.run; ratios are "
                    "per repeat against jitgraph none",
            "strategies": info, "timing": timing,
            "agreement": agreement(ref_loss, ref_grads[0], refs, "W_1")}


# ---- (f) compile time --------------------------------------------------------------------------

# Runs in a new process: imports, then builds, differentiates, runs and steps a small MLP.
CHILD = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import jitgraph as jg
t1 = time.perf_counter()
rng = np.random.default_rng(0)
g = jg.Graph(np.float32)
x = g.input((32, 64), name="x")
t = g.input((32, 10), name="t")
sizes = [64, 64, 64, 10]
params, h = [], x
for i, (m, k) in enumerate(zip(sizes, sizes[1:])):
    W = g.param(rng.standard_normal((m, k)) * np.sqrt(2 / m), name=f"W{i}")
    b = g.param(np.zeros(k), name=f"b{i}")
    params += [W, b]
    h = h @ W + b
    if i < len(sizes) - 2:
        h = jg.relu(h)
bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(h, t)))
loss = bwd.run({x: rng.standard_normal((32, 64)), t: np.eye(10)[rng.integers(0, 10, 32)]})
jg.optim.AdamW(params).step()
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "after_import_s": t2 - t1, "loss": float(loss)}))
"""


def run_child(cache_dir, threads):
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # the child imports the same jitgraph as this process, installed or not
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"compile-time child failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def wl_f(ctx):
    runs = {"cold": [], "warm": []}
    if ctx.quick:
        # no cold figure (it takes ~15 s): warm processes on the default cache, after
        # one process that fills that cache if it is empty
        run_child(None, ctx.threads)
        for r in range(ctx.repeats):
            ctx.note(f"warm process {r + 1}/{ctx.repeats}")
            runs["warm"].append(run_child(None, ctx.threads))
        cache = "the default Numba cache (next to the package, or NUMBA_CACHE_DIR)"
    else:
        for r in range(COMPILE_PAIRS):
            path = tempfile.mkdtemp(prefix="jitgraph-numba-cache-")
            try:
                ctx.note(f"cold process {r + 1}/{COMPILE_PAIRS}")
                runs["cold"].append(run_child(path, ctx.threads))
                ctx.note(f"warm process {r + 1}/{COMPILE_PAIRS}")
                runs["warm"].append(run_child(path, ctx.threads))
            finally:
                shutil.rmtree(path, ignore_errors=True)
        cache = "NUMBA_CACHE_DIR = a new temporary folder per cold/warm pair"
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "import_s", "after_import_s")}
           for kind, rs in runs.items() if rs}
    return {"title": "(f) compile time: a new process builds a small float32 MLP, build_backward, one bwd.run, "
                     "one AdamW step",
            "what": "wall = the whole process (interpreter start to exit) measured by the parent; import = "
                    "import numpy + jitgraph; after import = build + backward + run + AdamW step (the JIT "
                    "compile or cache load falls here). cold: empty Numba cache; warm: a second process on the "
                    "cache the cold one filled",
            "cache": cache, "quick_skips_cold": ctx.quick, "median": med, "runs": runs}


WORKLOADS = {"a": wl_a, "b": wl_b, "c": wl_c, "d": wl_d, "e": wl_e, "f": wl_f}


# ---- environment ---------------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_owner(path):
    """Which package a BLAS library file ships with (numpy.libs/ -> numpy)."""
    parts = os.path.normpath(path or "").split(os.sep)
    for p in reversed(parts[:-1]):
        for pkg in ("numpy", "scipy", "torch"):
            if p == pkg or p.startswith(pkg + "."):
                return pkg
    return "system"


def environment(torch, threads):
    import numba
    import scipy

    import jitgraph
    env = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads,
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
                     "scipy": scipy.__version__, "torch": getattr(torch, "__version__", None),
                     "jitgraph": jitgraph.__version__},
        "env_vars": {k: os.environ.get(k) for k in OPENBLAS_VARS + THREAD_VARS},
        # other processes on the machine skew every figure: the load says how busy it was
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:
        from threadpoolctl import threadpool_info
        pools = threadpool_info()
    except ImportError:
        pools = None
    env["threadpools"] = pools
    # which BLAS each contender calls: numpy's own; jitgraph's matmul is numba's np.dot,
    # which calls scipy's BLAS (scipy.linalg.cython_blas); torch's is linked into it
    blas = {}
    for p in pools or []:
        if p.get("user_api") == "blas":
            owner = blas_owner(p.get("filepath"))
            who = {"numpy": "numpy", "scipy": "jitgraph (numba np.dot via scipy)"}.get(owner, owner)
            blas[who] = {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                                "threading_layer", "filepath")}
    if torch is not None:
        cfg = torch.__config__.show()
        found = re.search(r"BLAS_INFO=(\w+)", cfg)
        # the library's own line, e.g. "Intel(R) oneAPI Math Kernel Library Version 2024.2-..."
        lib = [line.strip(" -") for line in cfg.splitlines() if re.search(r"Math Kernel|OpenBLAS|MKL-DNN", line)]
        blas["torch"] = {"internal_api": found.group(1) if found else None, "version": "; ".join(lib) or None,
                         "num_threads": torch.get_num_threads(),
                         "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                         "mkldnn": bool(torch.backends.mkldnn.is_available()),
                         "mkl": bool(torch.backends.mkl.is_available()),
                         "note": "statically linked, not visible to threadpoolctl"}
    env["blas"] = blas
    return env


# ---- report ---------------------------------------------------------------------------------

def targets(results):
    rows = []
    for key, what, limit in TARGETS:
        r = results.get(key)
        row = {"workload": key, "what": what, "limit": limit, "measured": None, "met": None}
        if r is None:
            row["note"] = "not run"
        elif key in "abc":
            ratio = r["timing"]["ratios"].get("jitgraph/torch")
            if ratio is None:
                row["note"] = "torch not available"
            else:
                row["measured"] = ratio["median"]
        elif key == "d":
            row["measured"] = r["median_s"]["total"]
        else:
            kind = what.split()[0]
            m = r["median"].get(kind)
            if m is None:
                row["note"] = "skipped (--quick)"
            else:
                row["measured"] = m["wall_s"]
        if row["measured"] is not None:
            row["met"] = row["measured"] <= limit
            if not row["met"]:
                pct = 100 * (row["measured"] / limit - 1)
                row["note"] = f"by {pct:.{1 if pct < 10 else 0}f}% ({row['measured'] / limit:.3g}x the target)"
        rows.append(row)
    return rows


def fmt_target(row):
    if row["what"].endswith("(s)"):
        return f"<= {fmt_s(row['limit'])}", fmt_s(row["measured"])
    return f"<= {row['limit']:g}", "-" if row["measured"] is None else f"{row['measured']:.3g}"


CONTENDER_LABEL = {"numpy": "numpy eager", "torch": "torch eager"}


def md_timing(res, ref, ref_over=True):
    t = res["timing"]
    head = f"{ref} / contender" if ref_over else f"contender / {ref}"
    lines = [f"| contender | median | min - max | calls/sample | {head} (median of per-repeat ratios) | "
             "ratio min - max |", "|---|---|---|---|---|---|"]
    for name, c in t["contenders"].items():
        ratio = t["ratios"].get(f"{ref}/{name}" if ref_over else f"{name}/{ref}")
        shown, spread = ("1", "") if name == ref else (
            (f"{ratio['median']:.4g}", f"{min(ratio['per_repeat']):.3g} - {max(ratio['per_repeat']):.3g}")
            if ratio else ("-", ""))
        lines.append(f"| {CONTENDER_LABEL.get(name, name)} | {fmt_s(c['median_s'])} | {fmt_s(c['min_s'])} - "
                     f"{fmt_s(c['max_s'])} | {c['calls_per_sample']} | {shown} | {spread} |")
    return lines


def md_agreement(a):
    parts = []
    for name in ("numpy", "torch"):
        r = a.get(name)
        if r is not None:
            parts.append(f"{name}: {'yes' if r['ok'] else 'NO'} (loss {r['loss']['max_diff_over_scale']:.1e}, "
                         f"{a['grad_of']} grad {r['grad']['max_diff_over_scale']:.1e})")
    return (f"Agreement with jitgraph (loss and the {a['grad_of']} gradient, max|diff| / max|ref| <= "
            f"{a['tolerance']:g}): " + "; ".join(parts) + ".")


QUICK_NOTE = " (--quick: tiny sizes, not a measurement)"


def fmt_load(load):
    return "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)


def markdown(report):
    env = report["env"]
    L = [f"# jitgraph bench results ({report['started']})", "",
         f"Command: `{report['command']}`  ", f"Total time: {report['duration_s']:.0f} s; "
         f"{report['repeats']} repeats per figure{QUICK_NOTE if report['quick'] else ''}; "
         f"threads: {env['threads']} for every contender.", ""]
    L += ["## Targets", "", "| workload | target | wanted | measured | status |", "|---|---|---|---|---|"]
    for row in report["targets"]:
        wanted, measured = fmt_target(row)
        status = {None: "", True: "met", False: "MISSED"}[row["met"]]
        status = " ".join(x for x in (status, row.get("note")) if x)
        L.append(f"| ({row['workload']}) | {row['what']} | {wanted} | {measured} | {status} |")
    for key, res in report["results"].items():
        L += ["", f"## {res['title']}", "", res["what"] + ".", ""]
        if key in "abc":
            L += md_timing(res, "jitgraph") + ["", md_agreement(res["agreement"])]
            sizes = (f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:.3g}" for k, v in res["sizes"].items())
            L.append(f"Sizes: {', '.join(sizes)}.")
        elif key == "d":
            m = res["median_s"]
            n = res["sizes"]["layers"]
            L += ["| phase | median | per unit |", "|---|---|---|",
                  f"| param creation ({n:,} g.param) | {fmt_s(m['params'])} | {fmt_s(m['params'] / n)} per param |",
                  f"| forward ops build ({res['sizes']['ops']:,} ops) | {fmt_s(m['ops'])} | "
                  f"{fmt_s(m['ops'] / res['sizes']['ops'])} per op |",
                  f"| build_forward | {fmt_s(m['build_forward'])} | |",
                  f"| build_backward | {fmt_s(m['build_backward'])} | |",
                  f"| **total: ops + build_forward + build_backward** | **{fmt_s(m['total'])}** | "
                  f"{res['sizes']['program_nodes']:,} program nodes |", "",
                  f"Medians of {len(res['runs'])} fresh builds (total = median of the per-build sums). "
                  f"Minor page faults during build_backward: {res['minor_faults_build_backward']}."]
        elif key == "e":
            L += ["| strategy | planned peak | x none | recomputed nodes | build (graph + backward) | "
                  "bit-identical to none |",
                  "|---|---|---|---|---|---|"]
            for name, s in res["strategies"].items():
                if "error" in s:
                    L.append(f"| {name} | GraphError: {s['error']} | | | | |")
                else:
                    L.append(f"| {name} | {s['peak_bytes'] / 2 ** 20:.2f} MiB | {s['peak_ratio']:.3f} | "
                             f"{s['n_recomputed']:,} | {fmt_s(s['build_s'])} | "
                             f"{'yes' if s['bit_identical'] else 'NO'} |")
            L += ["", "fwd+bwd time (the references keep every activation, as none does):", ""]
            L += md_timing(res, "none", ref_over=False) + ["", md_agreement(res["agreement"])]
        elif key == "f":
            L += ["| process | whole process (median) | min - max | import numpy + jitgraph | after import |",
                  "|---|---|---|---|---|"]
            for kind in ("cold", "warm"):
                m = res["median"].get(kind)
                if m is None:
                    L.append(f"| {kind} | skipped (--quick) | | | |")
                    continue
                walls = [r["wall_s"] for r in res["runs"][kind]]
                L.append(f"| {kind} | {fmt_s(m['wall_s'])} | {fmt_s(min(walls))} - {fmt_s(max(walls))} | "
                         f"{fmt_s(m['import_s'])} | {fmt_s(m['after_import_s'])} |")
            L += ["", f"Cache: {res['cache']}; " + ", ".join(f"{len(v)} {k} processes" for k, v in res["runs"].items()
                                                             if v) + "."]
    L += ["", "## Environment", "",
          f"* CPU: {env['cpu_model']}, {env['cpu_count']} cores ({env['usable_cpus']} usable); "
          f"python {env['python']} on {env['platform']}",
          f"* load average (1, 5, 15 min) at start {fmt_load(env['load_average_at_start'])}, "
          f"at end {fmt_load(env.get('load_average_at_end'))}: other processes on the machine, which skew timings",
          "* versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
          "* environment variables: " + (", ".join(f"{k}={v}" for k, v in env["env_vars"].items() if v is not None)
                                         or "none of " + ", ".join(env["env_vars"]) + " set")]
    for who, b in env["blas"].items():
        L.append(f"* BLAS of {who}: " + ", ".join(f"{k} {v}" for k, v in b.items()
                                                   if v is not None and k != "filepath"))
    if env["threadpools"] is None:
        L.append("* threadpoolctl not installed: BLAS thread counts not limited or recorded")
    return "\n".join(L) + "\n"


# ---- plots -----------------------------------------------------------------------------------

def plot_all(report, out):
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")               # files only, no display
    import matplotlib.pyplot as plt
    paths = []

    def save(fig, name):
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)

    def bars(ax, labels, values, xlabel):
        ax.barh(labels[::-1], values[::-1], color="tab:blue")
        for i, v in enumerate(values[::-1]):
            ax.text(v, i, " " + fmt_s(v), va="center", fontsize=8)
        if max(values) > 30 * min(values):
            ax.set_xscale("log")         # a 50x spread would hide the fast bars
        ax.set_xlabel(xlabel)
        ax.margins(x=0.25)

    for key, res in report["results"].items():
        fig, ax = plt.subplots(figsize=(7, 3))
        if "timing" in res:
            c = res["timing"]["contenders"]
            bars(ax, [CONTENDER_LABEL.get(n, n) for n in c], [v["median_s"] for v in c.values()],
                 "median time per fwd+bwd (s)")
        elif key == "d":
            m = res["median_s"]
            keys = ["params", "ops", "build_forward", "build_backward", "total"]
            bars(ax, keys, [m[k] for k in keys], "median time (s)")
        elif key == "f":
            labels, vals = [], []
            for kind, m in res["median"].items():
                labels += [f"{kind}: whole process", f"{kind}: after import"]
                vals += [m["wall_s"], m["after_import_s"]]
            bars(ax, labels, vals, "median wall time (s)")
        ax.set_title(res["title"], fontsize=8)
        save(fig, f"{key}.png")
        if key == "e":                   # planned peak against time, one point per strategy
            fig, ax = plt.subplots(figsize=(6, 4))
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
            save(fig, "e_peak_vs_time.png")
    return paths


# ---- main ------------------------------------------------------------------------------------

def default_out():
    """perf/results/<timestamp>/ of the repository when jitgraph runs from a checkout,
    else of the current folder."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = root if os.path.isdir(os.path.join(root, "perf")) else os.getcwd()
    return os.path.join(base, "perf", "results", time.strftime("%Y%m%d-%H%M%S"))


def add_arguments(p):
    p.add_argument("--quick", action="store_true", help="tiny sizes, well under a minute: a smoke test")
    p.add_argument("--only", default=None, help="comma-separated workloads to run, of " + ",".join(WORKLOADS))
    p.add_argument("--out", default=None, help="results folder (default perf/results/<timestamp>/)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed repeats per figure (default 7, 5 with --quick; at least {MIN_REPEATS})")
    p.add_argument("--threads", type=int, default=None, help="threads for every contender (default os.cpu_count())")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out even when it is installed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def load_torch(skip):
    if skip:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


def command_line(args, set_vars):
    """The equivalent `jitgraph bench` command (however it was launched), with the
    OpenBLAS variables that were in force."""
    cmd = ["jitgraph", "bench"]
    for flag in ("quick", "no_torch", "no_progress"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    for opt in ("only", "out", "repeats", "threads"):
        if getattr(args, opt) is not None:
            cmd += ["--" + opt, str(getattr(args, opt))]
    prefix = " ".join(f"{v}={shlex.quote(os.environ[v])}" for v in set_vars)
    return (prefix + " " if prefix else "") + shlex.join(cmd)


def run(args):
    keys = list(WORKLOADS) if not args.only else [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [k for k in keys if k not in WORKLOADS]
    if bad:
        raise SystemExit(f"jitgraph bench: unknown workload(s) {bad}; choose from {','.join(WORKLOADS)}")
    repeats = max(MIN_REPEATS, args.repeats or (5 if args.quick else 7))
    threads = args.threads or os.cpu_count() or 1
    out = os.path.abspath(args.out or default_out())
    os.makedirs(out, exist_ok=True)

    torch = load_torch(args.no_torch)
    import scipy.linalg  # noqa: F401  -- loads scipy's BLAS (jitgraph's matmul) so the limits reach it
    try:
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(limits=threads)
    except ImportError:
        limits = nullcontext()
    if torch is not None:
        torch.set_num_threads(threads)

    set_vars = [v for v in OPENBLAS_VARS if os.environ.get(v)]
    from tqdm import tqdm
    bar = tqdm(total=len(keys), disable=args.no_progress, file=sys.stderr, unit="workload")
    if set_vars:
        tqdm.write(f"note: {', '.join(set_vars)} set; they may slow OpenBLAS.  For a benchmark run "
                   f"`env {' '.join('-u ' + v for v in set_vars)} jitgraph bench ...`", file=sys.stderr)
    ctx = Ctx(quick=args.quick, repeats=repeats, min_sample_s=0.005 if args.quick else 0.2, threads=threads,
              torch=torch, note=lambda s: bar.set_postfix_str(s, refresh=True))
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    results = {}
    with limits:
        env = environment(torch, threads)   # inside the limits: records the thread counts in force
        for key in keys:
            bar.set_description(f"({key})")
            results[key] = WORKLOADS[key](ctx)
            bar.update(1)
    bar.close()
    report = {"command": command_line(args, set_vars), "argv": sys.argv, "started": started,
              "duration_s": time.perf_counter() - t0, "quick": args.quick, "repeats": repeats, "out": out,
              "env": env, "results": results}
    report["targets"] = targets(results)
    report["env"]["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None

    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=float)
    md = markdown(report)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    plots = plot_all(report, out)
    print(md)
    print(f"written to {out}: results.json, results.md, " + ", ".join(os.path.basename(p) for p in plots))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="jitgraph bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
