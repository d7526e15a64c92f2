"""Checkpointing benchmark: planned memory, run time and recompute cost of each strategy.

Run from the repository root:

    PYTHONPATH=. python perf/bench_checkpoint.py            # full sizes (1-3 minutes)
    PYTHONPATH=. python perf/bench_checkpoint.py --quick    # tiny sizes: a smoke test

Workloads (float32):

  chain N       x (B, D) -> h = relu(h @ W_i), i = 1..N -> loss = mean(h); B = 1024,
                D = 64; N = 100, 1,000 (--quick: 10, 100).  Weights He-scaled, then
                each layer's scale corrected so the batch's activation RMS stays at the
                input's (as in bench_backward.py), so nothing vanishes or explodes.
  blocks L      L transformer-like blocks, B = 8, T = 64, D = 64: pre-norm single-head
                attention (layer_norm, q/k/v, softmax(q k^T / sqrt(D)) v, out proj,
                residual) then a pre-norm gelu MLP of width 4D with a residual;
                loss = mean(h^2); L = 8, 16 (--quick: 2).
  + dropout     the same blocks with jg.dropout(s, 0.1, seed=l) after each softmax:
                recomputed dropout must replay the very same mask.

Strategies, each on a freshly built graph of the same network and weights
(build_backward appends nodes to the graph it differentiates):

  none          jg.build_backward(fwd)
  every layer   checkpoints=[h_1, ..., h_N]: each layer's / block's output
  sqrt          checkpoints="sqrt"
  save_matmuls  policy="save_matmuls"
  budget 25%    memory_budget=int(0.25 * none's peak_bytes); a GraphError is reported
                under the table instead of figures

Columns:

  peak MiB          bwd.peak_bytes, the planned arena high-water mark (params, inputs and
                    the gradient outputs live outside it); x none: its ratio to none's
  fwd+bwd           bwd.run(feeds): forward, recompute, backward.  Median of the repeats
                    after a warm-up run; all strategies' programs are built first and take
                    turns inside every repeat (common.time_alternating), so machine noise
                    hits all alike; x none: ratio to none's median
  FLOPs x none      the whole program's FLOP estimate (2mnk per matmul, elements x op
                    factor otherwise: the planner's own cost model) over none's: the time
                    ratio to expect if run time were proportional to FLOPs
  recomputed        bwd.stats()["n_recomputed"]: forward nodes copied into the backward pass
  recompute GFLOP   bwd.stats()["recompute_flops"]; % fwd: of the forward pass's FLOPs
  build_backward    jg.build_backward(fwd, ...) wall time, median of BUILD_REPEATS builds
                    (planning included: for budgets, the search over DP plans)
  bit-identical     np.array_equal of the loss and of every param's bwd.grad(W) with none's

After the tables: the Pareto frontier jg.pareto(fwd) of the largest chain, (peak,
recompute FLOPs) pairs none of which is beaten on both, saved as a plot to
perf/results/pareto_chain.png when matplotlib is installed.

The issue's targets, shown as met / MISSED: for sqrt on the N = 1,000, B = 1,024 chain,
planned peak <= 0.07 x none and fwd+bwd time <= 1.3 x none; every strategy's loss and
gradients bit-identical to none's on every workload.  No assertion is made on timings.
"""
import argparse
import gc
import os
import statistics
import sys
import time
from collections import namedtuple

import numpy as np

import jitgraph as jg
# Not re-exported by jitgraph: the FLOP model bwd.stats()'s recompute_flops uses.
from jitgraph.bench import chain_weights
from jitgraph.checkpoint import total_flops

# perf/ first on the path, so `common` is found however this script is launched
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fmt_time, print_environment, print_table, time_alternating  # noqa: E402

MiB = 2 ** 20
CHAIN_B, CHAIN_D = 1024, 64
BUILD_REPEATS = 5
BUDGET_FRACTION = 0.25
STRATEGIES = ("none", "every layer", "sqrt", "save_matmuls", "budget 25%")
TARGET_N = 1_000
TARGET_PEAK_RATIO = 0.07
TARGET_TIME_RATIO = 1.3
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# One freshly built network: feeds for run(), params in creation order (to pair the
# gradients across strategies), the scalar loss, and the per-layer outputs.
Model = namedtuple("Model", "feeds params loss outs")


# ---- workloads ----------------------------------------------------------------------------

def chain_builder(weights, xb):
    def build():
        g = jg.Graph(np.float32)
        x = g.input(xb.shape, name="x")
        params, outs = [], []
        h = x
        for w in weights:
            W = g.param(w)
            params.append(W)
            h = jg.relu(h @ W)
            outs.append(h)
        return Model({x: xb}, params, jg.mean(h), outs)
    return build


def blocks_builder(L, dropout=False, B=8, T=64, D=64, seed=0):
    xb = np.random.default_rng(seed + 1).standard_normal((B, T, D)).astype(np.float32)

    def build():
        rng = np.random.default_rng(seed)     # reseeded: every build gets the same weights
        g = jg.Graph(np.float32)
        x = g.input((B, T, D), name="x")
        params = []

        def P(*s):
            params.append(g.param(rng.standard_normal(s) / np.sqrt(s[0])))
            return params[-1]

        h = x
        outs = []
        for layer in range(L):
            a = jg.layer_norm(h)
            q, k, v = a @ P(D, D), a @ P(D, D), a @ P(D, D)
            s = jg.softmax((q @ jg.transpose(k, (0, 2, 1))) * (1 / np.sqrt(D)))
            if dropout:
                s = jg.dropout(s, 0.1, seed=layer)
            h = h + (s @ v) @ P(D, D)
            m = jg.gelu(jg.layer_norm(h) @ P(D, 4 * D)) @ P(4 * D, D)
            h = h + m
            outs.append(h)
        return Model({x: xb}, params, jg.mean(jg.sqr(h)), outs)
    return build


def strategy_kwargs(name, model, none_peak):
    if name == "budget 25%":
        return {"memory_budget": int(BUDGET_FRACTION * none_peak)}
    return {"none": {}, "every layer": {"checkpoints": model.outs}, "sqrt": {"checkpoints": "sqrt"},
            "save_matmuls": {"policy": "save_matmuls"}}[name]


# ---- one workload --------------------------------------------------------------------------

def build_strategy(build, name, none_peak, build_repeats):
    """(model, bwd, median build_backward seconds), or (None, GraphError message, None).
    Each build is of a fresh graph; the last one is kept to run."""
    times = []
    model = bwd = fwd = None
    for _ in range(build_repeats):
        model = bwd = fwd = None          # drop the previous graph and collect it, so
        gc.collect()                      # its garbage is not charged to this build
        model = build()
        fwd = jg.build_forward(model.loss)
        kwargs = strategy_kwargs(name, model, none_peak)
        t0 = time.perf_counter()
        try:
            bwd = jg.build_backward(fwd, **kwargs)
        except jg.GraphError as e:
            return None, str(e), None
        times.append(time.perf_counter() - t0)
    return model, bwd, statistics.median(times)


def program_flops(bwd):
    nodes = bwd.graph.nodes
    return int(total_flops(nodes.arrays(), bwd.order.astype(np.int64)))


def identical(model, bwd, loss, ref_loss, ref_grads):
    """'yes', or what differs from none."""
    grads = [bwd.grad(p) for p in model.params]
    bad = [i for i, (a, b) in enumerate(zip(grads, ref_grads)) if not np.array_equal(a, b)]
    if not bad and np.array_equal(loss, ref_loss):
        return "yes"
    diff = max((float(np.max(np.abs(grads[i].astype(np.float64) - ref_grads[i]))) for i in bad), default=0.0)
    return f"NO: loss {'same' if np.array_equal(loss, ref_loss) else 'differs'}, " \
           f"{len(bad)}/{len(grads)} grads differ (max |diff| {diff:.2g})"


def bench_workload(build, repeats, min_sample_s, build_repeats):
    """Build every strategy's program, check it against none, time them interleaved.
    Returns ({strategy: figures}, with figures['error'] set for a GraphError; and
    {forward FLOPs, calls per timed sample})."""
    built = {}
    model, bwd, t_build = build_strategy(build, "none", None, build_repeats)
    built["none"] = (model, bwd, t_build)
    none_peak = bwd.peak_bytes
    for name in STRATEGIES[1:]:
        built[name] = build_strategy(build, name, none_peak, build_repeats)

    ok = {k: v for k, v in built.items() if v[0] is not None}
    # one run each (also a warm-up) for the bit-identity check against none
    ref_model, ref_bwd, _ = ok["none"]
    ref_loss = ref_bwd.run(ref_model.feeds)
    ref_grads = [ref_bwd.grad(p) for p in ref_model.params]
    fwd_flops = total_flops(ref_bwd.graph.nodes.arrays(), ref_bwd.forward.order.astype(np.int64))
    none_flops = program_flops(ref_bwd)
    same = {}
    for name, (model, bwd, _) in ok.items():
        same[name] = identical(model, bwd, bwd.run(model.feeds), ref_loss, ref_grads)
    del ref_grads

    names = list(ok)
    fns = [lambda m=ok[k][0], b=ok[k][1]: b.run(m.feeds) for k in names]
    secs, inner = time_alternating(fns, repeats, min_sample_s)
    run_s = dict(zip(names, secs))

    res = {}
    for name in STRATEGIES:
        model, bwd, t_build = built[name]
        if model is None:
            res[name] = {"error": bwd}
            continue
        st = bwd.stats()
        res[name] = {
            "peak": bwd.peak_bytes, "peak_ratio": bwd.peak_bytes / none_peak,
            "run": run_s[name], "run_ratio": run_s[name] / run_s["none"],
            "flops_ratio": program_flops(bwd) / none_flops,
            "n_recomputed": st["n_recomputed"], "recompute_flops": st["recompute_flops"],
            "recompute_frac": st["recompute_flops"] / fwd_flops,
            "build": t_build, "same": same[name],
            "budget": strategy_kwargs(name, model, none_peak).get("memory_budget"),
        }
    return res, {"fwd_flops": fwd_flops, "inner": inner}


def print_workload(title, res, meta):
    rows, errors = [], []
    for name in STRATEGIES:
        r = res[name]
        label = name if r.get("budget") is None else f"{name} ({r['budget'] / MiB:.2f} MiB)"
        if "error" in r:
            rows.append([label, "GraphError"] + ["-"] * 9)
            errors.append(f"   {label}: GraphError: {r['error']}")
            continue
        rows.append([label, f"{r['peak'] / MiB:.2f}", f"{r['peak_ratio']:.3f}",
                     fmt_time(r["run"]), f"{r['run_ratio']:.3f}", f"{r['flops_ratio']:.3f}",
                     f"{r['n_recomputed']:,}", f"{r['recompute_flops'] / 1e9:.3f}",
                     f"{100 * r['recompute_frac']:.0f}%", fmt_time(r["build"]), r["same"]])
    print_table(title, ["strategy", "peak MiB", "x none", "fwd+bwd", "x none", "FLOPs x none",
                        "recomputed", "recompute GFLOP", "% fwd", "build_backward", "bit-identical"], rows)
    print(f"   forward pass: {meta['fwd_flops'] / 1e9:.3f} GFLOP; fwd+bwd calls per timed sample: {meta['inner']}")
    for line in errors:
        print(line)


# ---- Pareto frontier ------------------------------------------------------------------------

def print_pareto(build, measured, title):
    """Table of jg.pareto(fwd) rows, and the plot when matplotlib is installed."""
    model = build()
    fwd = jg.build_forward(model.loss)
    t0 = time.perf_counter()
    front = jg.pareto(fwd)
    t_pareto = time.perf_counter() - t0
    none_peak = next(r["peak_bytes"] for r in front if r["strategy"] == "none")
    rows = [[r["strategy"], "-" if r["budget"] is None else f"{r['budget'] / MiB:.2f}",
             f"{r['peak_bytes'] / MiB:.2f}", f"{r['peak_bytes'] / none_peak:.3f}",
             f"{r['recompute_flops'] / 1e9:.3f}", f"{r['n_recomputed']:,}"] for r in front]
    print_table(f"{title}: Pareto frontier, jg.pareto(fwd) ({fmt_time(t_pareto)})",
                ["strategy", "budget MiB", "peak MiB", "x none", "recompute GFLOP", "recomputed"], rows)
    # the strategies measured above that the frontier beats on both axes
    for name, r in measured.items():
        if "error" in r:
            continue
        better = [f for f in front if f["peak_bytes"] <= r["peak"] and f["recompute_flops"] <= r["recompute_flops"]
                  and (f["peak_bytes"], f["recompute_flops"]) != (r["peak"], r["recompute_flops"])]
        if better:
            f = min(better, key=lambda f: f["recompute_flops"])
            print(f"   {name} ({r['peak'] / MiB:.2f} MiB, {r['recompute_flops'] / 1e9:.3f} GFLOP) is off the "
                  f"frontier: {f['strategy']} gives {f['peak_bytes'] / MiB:.2f} MiB, "
                  f"{f['recompute_flops'] / 1e9:.3f} GFLOP")
    plot_pareto(front, measured, title)


def plot_pareto(front, measured, title):
    try:
        import matplotlib
    except ImportError:
        print("   plot skipped: matplotlib is not installed")
        return
    matplotlib.use("Agg")                 # file output only, no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["peak_bytes"] / MiB for r in front]
    ys = [r["recompute_flops"] / 1e9 for r in front]
    # frontier rows come lowest peak first: a step shows what each extra MiB buys
    ax.step(xs, ys, where="post", color="tab:blue", alpha=0.5)
    ax.plot(xs, ys, "o", color="tab:blue", label="jg.pareto(fwd)")
    # the strategies as built and run above: hollow markers of shrinking size, so
    # coinciding ones (none, every layer, save_matmuls on a chain) stay visible
    for i, (name, r) in enumerate(measured.items()):
        if "error" not in r:
            ax.plot(r["peak"] / MiB, r["recompute_flops"] / 1e9, "sD^vP"[i], markersize=14 - 2 * i,
                    fillstyle="none", label=name)
    ax.set_xlabel("planned peak (MiB)")
    ax.set_ylabel("recompute (GFLOP)")
    ax.set_title(f"{title}: memory vs recompute")
    ax.legend()
    ax.grid(alpha=0.3)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, "pareto_chain.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"   plot saved: {os.path.relpath(path)}")


# ---- main -------------------------------------------------------------------------------

def met(ok):
    return "met" if ok else "MISSED"


def print_targets(results, chain_key):
    r = results.get(chain_key, {}).get("sqrt")
    rows = []
    if r is None or "error" in r:
        why = "not run (--quick)" if r is None else "sqrt failed"
        rows += [["sqrt peak / none, chain N=1,000", f"<= {TARGET_PEAK_RATIO}", why, ""],
                 ["sqrt fwd+bwd / none, chain N=1,000", f"<= {TARGET_TIME_RATIO}", why, ""]]
    else:
        rows += [["sqrt peak / none, chain N=1,000", f"<= {TARGET_PEAK_RATIO}", f"{r['peak_ratio']:.3f}",
                  met(r["peak_ratio"] <= TARGET_PEAK_RATIO)],
                 ["sqrt fwd+bwd / none, chain N=1,000", f"<= {TARGET_TIME_RATIO}", f"{r['run_ratio']:.3f}",
                  met(r["run_ratio"] <= TARGET_TIME_RATIO)]]
    checked = [(w, s) for w, res in results.items() for s in STRATEGIES if "error" not in res[s]]
    differ = [f"{w} / {s}" for w, s in checked if results[w][s]["same"] != "yes"]
    rows.append(["gradients bit-identical to none", "all", f"{len(checked) - len(differ)} of {len(checked)}",
                 met(not differ)])
    print_table("Targets", ["target", "wanted", "measured", ""], rows)
    for d in differ:
        print(f"   differs: {d}")
    n_err = sum("error" in res[s] for res in results.values() for s in STRATEGIES)
    if n_err:
        print(f"   ({n_err} budget run(s) raised GraphError and are not in the count)")


def warm_up():
    """Load (or compile) every jitted pass and kernel the workloads use, on tiny graphs,
    so no build or run figure includes JIT time.  Returns its wall time."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((8, CHAIN_D)).astype(np.float32)
    for build in (chain_builder(chain_weights(4, xb.shape[1], xb, rng), xb), blocks_builder(2, dropout=True, B=2, T=4)):
        none_peak = None
        for name in STRATEGIES:
            model, bwd, _ = build_strategy(build, name, none_peak, 1)
            if model is not None:
                bwd.run(model.feeds)
                none_peak = none_peak or bwd.peak_bytes
    jg.pareto(jg.build_forward(build().loss))
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="chain N = 10, 100 and blocks L = 2 only: a smoke test, not a measurement")
    ap.add_argument("--repeats", type=int, default=None, help="timed run repeats (default 7; 5 with --quick; min 5)")
    args = ap.parse_args(argv)

    if args.quick:
        chain_ns, block_ls, repeats, min_sample_s, build_repeats = (10, 100), (2,), 5, 0.005, 3
    else:
        chain_ns, block_ls, repeats, min_sample_s, build_repeats = (100, 1_000), (8, 16), 7, 0.05, BUILD_REPEATS
    if args.repeats is not None:
        repeats = max(5, args.repeats)

    print("jitgraph checkpointing benchmark" +
          (" (--quick: tiny sizes, figures are not meaningful)" if args.quick else ""))
    print(f"float32; fwd+bwd: median of {repeats} interleaved repeats after a warm-up; "
          f"build_backward: median of {build_repeats} fresh builds")
    print(f"first build + run of every strategy in this process (JIT load/compile, tiny graphs): "
          f"{warm_up() * 1e3:.0f} ms, in no figure below")

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((CHAIN_B, CHAIN_D)).astype(np.float32)
    weights = chain_weights(max(chain_ns), xb.shape[1], xb, rng)
    workloads = [(f"chain N={n:,}", f"N-layer relu chain, N = {n:,}, B = {CHAIN_B}, D = {CHAIN_D}",
                  chain_builder(weights[:n], xb)) for n in chain_ns]
    for L in block_ls:
        workloads.append((f"blocks L={L}", f"{L} transformer-like blocks, B = 8, T = 64, D = 64",
                          blocks_builder(L)))
    workloads.append((f"blocks L={block_ls[0]} + dropout",
                      f"{block_ls[0]} transformer-like blocks with dropout(0.1) after softmax",
                      blocks_builder(block_ls[0], dropout=True)))

    results = {}
    for key, title, build in workloads:
        results[key], meta = bench_workload(build, repeats, min_sample_s, build_repeats)
        print_workload(title, results[key], meta)
        gc.collect()                      # free this workload's programs before the next

    n_front = max(chain_ns)
    print_pareto(chain_builder(weights[:n_front], xb), results[f"chain N={n_front:,}"],
                 f"chain N={n_front:,}")
    print_targets(results, f"chain N={TARGET_N:,}")

    print("   peak: the planned arena only; params, inputs and gradient outputs are outside it and the same")
    print("   for every strategy.  FLOPs x none is a model (matmuls 2mnk, other ops a few FLOPs per element):")
    print("   fwd+bwd x none departs from it as far as ops run at different FLOP rates or memory traffic changes.")
    print("   A strategy that recomputes nothing at none's peak (every layer on the chain) runs none's program:")
    print("   its fwd+bwd x none is the timing noise of this run.")
    print_environment()
    return 0


if __name__ == "__main__":
    sys.exit(main())
