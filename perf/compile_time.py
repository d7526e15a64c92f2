"""Workload (f) of ``jitgraph bench``: compile time.  A new process builds a small MLP,
differentiates it, runs it and takes one AdamW step, on an empty Numba cache (cold) and
again on the cache the cold one filled (warm)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import jitgraph as jg

from .harness import Target, Workload
from .report import fmt_s, md_table

COMPILE_PAIRS = 5           # cold+warm process pairs; a cold one compiles for ~15 s
FIGURES = ("wall_s", "import_s", "after_import_s")

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
    # the child imports the same jitgraph as this process, from a checkout or installed
    where = os.path.dirname(os.path.dirname(os.path.abspath(jg.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"compile-time child failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def run(ctx):
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
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in FIGURES} for kind, rs in runs.items() if rs}
    return {"title": "(f) compile time: a new process builds a small float32 MLP, build_backward, one bwd.run, "
                     "one AdamW step",
            "what": "wall = the whole process (interpreter start to exit) measured by the parent; import = "
                    "import numpy + jitgraph; after import = build + backward + run + AdamW step (the JIT "
                    "compile or cache load falls here). cold: empty Numba cache; warm: a second process on the "
                    "cache the cold one filled",
            "cache": cache, "quick_skips_cold": ctx.quick, "median": med, "runs": runs}


def markdown(res):
    rows = []
    for kind in ("cold", "warm"):
        m = res["median"].get(kind)
        if m is None:
            rows.append([kind, "skipped (--quick)", "", "", ""])
            continue
        walls = [r["wall_s"] for r in res["runs"][kind]]
        rows.append([kind, fmt_s(m["wall_s"]), f"{fmt_s(min(walls))} - {fmt_s(max(walls))}",
                     fmt_s(m["import_s"]), fmt_s(m["after_import_s"])])
    counts = ", ".join(f"{len(v)} {k} processes" for k, v in res["runs"].items() if v)
    return md_table(["process", "whole process (median)", "min - max", "import numpy + jitgraph", "after import"],
                    rows) + ["", f"Cache: {res['cache']}; {counts}."]


def plot(res, plots, key):
    labels, vals = [], []
    for kind, m in res["median"].items():
        labels += [f"{kind}: whole process", f"{kind}: after import"]
        vals += [m["wall_s"], m["after_import_s"]]
    plots.bars(f"{key}.png", res["title"], labels, vals, "median wall time (s)")


def process_wall(kind):
    def measure(res):
        m = res["median"].get(kind)
        return (None, "skipped (--quick)") if m is None else (m["wall_s"], None)
    return measure


WORKLOAD = Workload("f", "cold and warm compile time of a new process", run, markdown, plot,
                    (Target("cold process (s)", 20.0, process_wall("cold")),
                     Target("warm process (s)", 1.0, process_wall("warm"))))
