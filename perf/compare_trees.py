"""Two builds of jitgraph side by side: this checkout and an older commit.

    python perf/compare_trees.py REV [--rounds 5] [--cold-rounds 3] [--build-rounds 3] [--demo-rounds 3]

Checks REV out into a temporary git worktree and runs, alternating between the two
trees in new processes (each with only its tree on PYTHONPATH), so machine noise
falls on both:

* workload (a): the 10k tiny-op chain's fwd+bwd (``bwd.run``), median per call, on a
  warm cache -- the per-node cost of the interpreter;
* cold start: workload (f)'s small MLP (perf/compile_time.py's child program) in a new
  process on an empty Numba cache folder, wall time and first gradient;
* workload (d): building a 10k-layer relu chain from Python and ``build_backward`` on it
  (expansion, ordering, memory plan), medians of fresh builds, warm cache;
* the cold demo: ``jitgraph demo --no-progress`` as a whole process on an empty cache.

The ratios (this tree / REV) are medians over rounds.  Issue [1/6] of the third round
(rules as programs) asks for all four against the tree before it (commit 82382b5).
REV's own API must build the chain
(``jg.Graph``, ``g.param``, ``g.input``, ``jg.build_forward``/``build_backward``).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from perf.compile_time import CHILD as COLD_CHILD  # noqa: E402

# workload (a), as perf/suite.py builds it, timed by the child itself
TINY_CHILD = r"""
import json, sys, time
import numpy as np
import jitgraph as jg
n, width = 10_000, 16
rng = np.random.default_rng(0)
x0 = rng.uniform(-1, 1, width).astype(np.float32)
yb = rng.uniform(0.999, 0.9999, width).astype(np.float32)
g = jg.Graph(np.float32)
x = g.param(x0, name="x")
y = g.input((width,), name="y")
h = x
for i in range(n):
    k = i % 3
    h = h * 1.0001 if k == 0 else (h + y if k == 1 else h * y)
bwd = jg.build_backward(jg.build_forward(jg.sum(h)))
feeds = {y: yb}
for _ in range(20):
    bwd.run(feeds)
times = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    bwd.run(feeds)
    times.append(time.perf_counter() - t)
print(json.dumps({"per_call_s": sorted(times)[len(times) // 2], "nodes": int(bwd.stats()["n_nodes"])}))
"""


# workload (d), as perf/models.build_phases times it: the Python build of the ops and build_backward
BUILD_CHILD = r"""
import gc, json, sys, time
import numpy as np
import jitgraph as jg
n, d = 10_000, 64
rng = np.random.default_rng(2)
weights = list(rng.standard_normal((n, d, d), dtype=np.float32) * np.float32(np.sqrt(2 / d)))
def build(ws):
    g = jg.Graph(np.float32)
    x = g.input((d, d), name="x")
    params = [g.param(w) for w in ws]
    t1 = time.perf_counter()
    h = x
    for W in params:
        h = jg.relu(h @ W)
    loss = jg.mean(h)
    t2 = time.perf_counter()
    fwd = jg.build_forward(loss)
    t3 = time.perf_counter()
    jg.build_backward(fwd)
    t4 = time.perf_counter()
    return t2 - t1, t4 - t3
build(weights[:3])
runs = []
for _ in range(int(sys.argv[1])):
    gc.collect()
    runs.append(build(weights))
print(json.dumps({"ops_s": sorted(r[0] for r in runs)[len(runs) // 2],
                  "build_backward_s": sorted(r[1] for r in runs)[len(runs) // 2]}))
"""

DEMO_CHILD = r"""
import json, sys, time
t = time.perf_counter()
from jitgraph.cli import main
main(["demo", "--no-progress"])
print(json.dumps({"in_process_s": time.perf_counter() - t}))
"""


def child(tree, program, args=(), cache_dir=None):
    env = {k: v for k, v in os.environ.items() if k not in ("JITGRAPH_QUIET", "PYTHONPATH")}
    env.update(PYTHONPATH=tree, JITGRAPH_QUIET="1")
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", program, *args], env=env, cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold(tree):
    folder = tempfile.mkdtemp(prefix="jitgraph-cold-")
    try:
        start = time.perf_counter()
        rec = child(tree, COLD_CHILD, cache_dir=folder)
        rec["wall_s"] = time.perf_counter() - start
        rec["first_gradient_s"] = sum(rec[k] for k in ("import_s", "build_forward_s", "build_backward_s",
                                                         "first_run_s"))
        return rec
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cold_demo(tree):
    folder = tempfile.mkdtemp(prefix="jitgraph-cold-")
    try:
        start = time.perf_counter()
        child(tree, DEMO_CHILD, cache_dir=folder)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the older commit to compare with (e.g. fda4306)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of workload (a)")
    ap.add_argument("--calls", type=int, default=400, help="timed calls per round of (a)")
    ap.add_argument("--cold-rounds", type=int, default=3, help="alternating cold starts (0: skip)")
    ap.add_argument("--build-rounds", type=int, default=3, help="alternating rounds of workload (d) (0: skip)")
    ap.add_argument("--builds", type=int, default=5, help="fresh builds per round of (d)")
    ap.add_argument("--demo-rounds", type=int, default=0, help="alternating cold demos (0: skip)")
    a = ap.parse_args(argv)
    repo = os.path.dirname(HERE)
    old = tempfile.mkdtemp(prefix="jitgraph-rev-")
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "-q", old, a.rev], check=True)
    trees = {"this tree": repo, a.rev: old}
    try:
        for tree in trees.values():                 # fill each tree's cache (compiles once)
            child(tree, TINY_CHILD, ["5"])
        tiny = {k: [] for k in trees}
        for _ in range(a.rounds):
            for name, tree in trees.items():
                tiny[name].append(child(tree, TINY_CHILD, [str(a.calls)])["per_call_s"])
        builds = {k: [] for k in trees}
        for _ in range(a.build_rounds):
            for name, tree in trees.items():
                builds[name].append(child(tree, BUILD_CHILD, [str(a.builds)]))
        colds = {k: [] for k in trees}
        for _ in range(a.cold_rounds):
            for name, tree in trees.items():
                colds[name].append(cold(tree))
        demos = {k: [] for k in trees}
        for _ in range(a.demo_rounds):
            for name, tree in trees.items():
                demos[name].append(cold_demo(tree))
    finally:
        subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", old], check=False)
    ratio = statistics.median(t / o for t, o in zip(tiny["this tree"], tiny[a.rev]))
    print(f"| figure | this tree | {a.rev} | this / {a.rev} (median of rounds) |")
    print("|---|---|---|---|")
    print(f"| (a) fwd+bwd per call, {a.rounds} rounds | {statistics.median(tiny['this tree']) * 1e6:.0f} us | "
          f"{statistics.median(tiny[a.rev]) * 1e6:.0f} us | {ratio:.3f} |")
    for key in ("ops_s", "build_backward_s") if a.build_rounds else ():
        mine = [r[key] for r in builds["this tree"]]
        theirs = [r[key] for r in builds[a.rev]]
        what = "10k chain: ops built from Python" if key == "ops_s" else "10k chain: build_backward"
        print(f"| (d) {what}, {a.build_rounds} rounds | {statistics.median(mine) * 1e3:.1f} ms | "
              f"{statistics.median(theirs) * 1e3:.1f} ms | {statistics.median(m / t for m, t in zip(mine, theirs)):.3f} |")
    if a.demo_rounds:
        mine, theirs = demos["this tree"], demos[a.rev]
        print(f"| cold demo, whole process, {a.demo_rounds} rounds | {statistics.median(mine):.1f} s | "
              f"{statistics.median(theirs):.1f} s | {statistics.median(m / t for m, t in zip(mine, theirs)):.3f} |")
    for key in ("wall_s", "first_gradient_s") if a.cold_rounds else ():
        mine = [r[key] for r in colds["this tree"]]
        theirs = [r[key] for r in colds[a.rev]]
        print(f"| cold small MLP, {key[:-2].replace('_', ' ')}, {a.cold_rounds} rounds | "
              f"{statistics.median(mine):.1f} s | {statistics.median(theirs):.1f} s | "
              f"{statistics.median(m / t for m, t in zip(mine, theirs)):.3f} |")


if __name__ == "__main__":
    main()
