"""Workload (f) of ``jitgraph bench``: compile time.  New processes on an empty cache
folder (cold) and again on the folder the cold one filled (warm): a small MLP (built,
differentiated, run once, one AdamW step; timed phase by phase inside the process), and
``jitgraph demo`` as a user runs it (its wall time and when its first output appears)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import jitgraph as jg

from .harness import Target, Workload
from .report import fmt_s, md_table

PAIRS = 3                   # cold+warm process pairs per program (medians of 3)
QUICK_PAIRS = 1             # --quick: warm processes only, one of each (bench --quick stays under 30 s)
PHASES = ("import_s", "build_forward_s", "build_backward_s", "first_run_s", "step_s")
FIGURES = ("wall_s", "first_gradient_s") + PHASES

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
fwd = jg.build_forward(jg.cross_entropy(h, t))
t2 = time.perf_counter()
bwd = jg.build_backward(fwd)
t3 = time.perf_counter()
loss = bwd.run({x: rng.standard_normal((32, 64)), t: np.eye(10)[rng.integers(0, 10, 32)]})
t4 = time.perf_counter()
jg.optim.AdamW(params).step()
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "build_forward_s": t2 - t1, "build_backward_s": t3 - t2,
                  "first_run_s": t4 - t3, "step_s": t5 - t4, "in_process_s": t5 - t0, "loss": float(loss)}))
"""


def child_env(cache_dir, threads):
    env = {k: v for k, v in os.environ.items() if k not in ("JITGRAPH_QUIET", "JITGRAPH_COMPILE_WORKERS")}
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # the child imports the same jitgraph as this process, from a checkout or installed
    where = os.path.dirname(os.path.dirname(os.path.abspath(jg.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
    return env


def timed_process(argv, env):
    """Run argv; returns (wall seconds, seconds to its first line of output, stdout text)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = []
    chunks = {"out": [], "err": []}

    def pump(stream, key):
        for line in stream:
            if not first:
                first.append(time.perf_counter() - t0)
            chunks[key].append(line)

    readers = [threading.Thread(target=pump, args=(proc.stdout, "out")),
               threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for r in readers:
        r.start()
    proc.wait()
    for r in readers:
        r.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"compile-time child {argv[1:3]} failed:\n{''.join(chunks['err'])[-2000:]}")
    return wall, (first[0] if first else wall), "".join(chunks["out"])


def mlp_process(cache_dir, threads):
    wall, _, out = timed_process([sys.executable, "-c", CHILD], child_env(cache_dir, threads))
    res = json.loads(out.strip().splitlines()[-1])
    res["wall_s"] = wall
    res["first_gradient_s"] = res["in_process_s"]       # process start to the first gradients
    return res


def demo_process(cache_dir, threads, epochs):
    argv = [sys.executable, "-m", "jitgraph", "demo", "--no-progress", "--epochs", str(epochs)]
    wall, first, _ = timed_process(argv, child_env(cache_dir, threads))
    return {"wall_s": wall, "first_output_s": first}


def run(ctx):
    runs = {"mlp cold": [], "mlp warm": [], "demo cold": [], "demo warm": []}
    epochs = 2 if ctx.quick else 30
    if ctx.quick:
        # no cold figures (they take a minute): warm processes on the default cache, after
        # one process of each that fills that cache if it is empty
        mlp_process(None, ctx.threads)
        demo_process(None, ctx.threads, epochs)
        for r in range(QUICK_PAIRS):
            ctx.note(f"warm processes {r + 1}/{QUICK_PAIRS}")
            runs["mlp warm"].append(mlp_process(None, ctx.threads))
            runs["demo warm"].append(demo_process(None, ctx.threads, epochs))
        cache = "the default cache (next to the package, or NUMBA_CACHE_DIR)"
    else:
        for r in range(PAIRS):
            for name, child in (("mlp", lambda path: mlp_process(path, ctx.threads)),
                                ("demo", lambda path: demo_process(path, ctx.threads, epochs))):
                path = tempfile.mkdtemp(prefix="jitgraph-numba-cache-")
                try:
                    ctx.note(f"{name} cold process {r + 1}/{PAIRS}")
                    runs[f"{name} cold"].append(child(path))
                    ctx.note(f"{name} warm process {r + 1}/{PAIRS}")
                    runs[f"{name} warm"].append(child(path))
                finally:
                    shutil.rmtree(path, ignore_errors=True)
        cache = "NUMBA_CACHE_DIR = a new, empty temporary folder per cold/warm pair"
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], float)}
           for kind, rs in runs.items() if rs}
    return {"title": "(f) compile time: new processes, empty cache (cold) and filled cache (warm)",
            "what": "mlp: a small float32 MLP (64-64-64-10, batch 32) built, build_backward, one bwd.run, one "
                    "AdamW step; phases timed inside the process, first gradient = process start to the end of "
                    "that run (the interpreter's own start-up excluded), whole process measured by the parent. "
                    f"demo: `python -m jitgraph demo --no-progress --epochs {epochs}` (the demo's defaults "
                    "otherwise: two trainings of a 16-block residual MLP), whole process and the time to its "
                    "first line of output",
            "cache": cache, "quick_skips_cold": ctx.quick, "epochs": epochs, "median": med, "runs": runs,
            "workers": os.cpu_count()}


def markdown(res):
    lines = []
    rows = []
    for kind in ("mlp cold", "mlp warm"):
        m = res["median"].get(kind)
        if m is None:
            rows.append([kind, "skipped (--quick)"] + [""] * 7)
            continue
        walls = [r["wall_s"] for r in res["runs"][kind]]
        rows.append([kind, fmt_s(m["wall_s"]), f"{fmt_s(min(walls))} - {fmt_s(max(walls))}",
                     fmt_s(m["first_gradient_s"])] + [fmt_s(m[p]) for p in PHASES])
    lines += md_table(["small MLP", "whole process (median)", "min - max", "first gradient", "import",
                       "build_forward", "build_backward", "first run", "AdamW step"], rows)
    rows = []
    for kind in ("demo cold", "demo warm"):
        m = res["median"].get(kind)
        if m is None:
            rows.append([kind, "skipped (--quick)", "", ""])
            continue
        walls = [r["wall_s"] for r in res["runs"][kind]]
        rows.append([kind, fmt_s(m["wall_s"]), f"{fmt_s(min(walls))} - {fmt_s(max(walls))}",
                     fmt_s(m["first_output_s"])])
    lines += [""] + md_table([f"jitgraph demo ({res['epochs']} epochs)", "whole process (median)", "min - max",
                              "first output after"], rows)
    counts = ", ".join(f"{len(v)} {k}" for k, v in res["runs"].items() if v)
    return lines + ["", f"Cache: {res['cache']}; processes: {counts}; medians."]


def plot(res, plots, key):
    labels, vals = [], []
    for kind, m in res["median"].items():
        labels.append(f"{kind}: whole process")
        vals.append(m["wall_s"])
    plots.bars(f"{key}.png", res["title"], labels, vals, "median wall time (s)")


def figure(kind, name):
    def measure(res):
        m = res["median"].get(kind)
        return (None, "skipped (--quick)") if m is None else (m[name], None)
    return measure


WORKLOAD = Workload("f", "cold and warm start of a new process: a small MLP and jitgraph demo", run, markdown, plot,
                    (Target("small MLP, cold: first gradient (s)", 8.0, figure("mlp cold", "first_gradient_s")),
                     Target("jitgraph demo, cold: whole process (s)", 15.0, figure("demo cold", "wall_s")),
                     Target("small MLP, warm: import + build + run + step (s)", 0.7,
                            figure("mlp warm", "in_process_s"))))
