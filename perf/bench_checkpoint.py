"""Checkpointing benchmark: planned memory, run time and recompute cost of each strategy
(workload ``checkpoint``).

Run from the repository root (or ``jitgraph bench --only checkpoint``):

    python perf/bench_checkpoint.py            # full sizes (5-10 minutes)
    python perf/bench_checkpoint.py --quick    # tiny sizes: a smoke test

It takes the harness's options (``--help``) and writes its results like ``jitgraph bench``.
Networks (float32):

  chain N       x (B, D) -> h = relu(h @ W_i), i = 1..N -> loss = mean(h); B = 1024,
                D = 64; N = 100, 1,000 (--quick: 10, 100 with B = 64).  Weights from
                models.chain_weights (activation RMS kept at the input's), so nothing
                vanishes or explodes.
  dropout chain N  the same with h = dropout(relu(h @ W_i), 0.1, seed=i), N = 1,000
                (--quick: 100): three passes a layer, two of them cheap in FLOPs but not
                in time ([5/6]'s chain).
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

and the multi-level plans ([5/6]): on the chains, revolve s=K (checkpoints="revolve",
slots=K) for K = 2, 6, 12, revolve (default) (slots=None: the fewest that recompute
no step more than 3 times) and budget 1.5% (memory_budget=int(0.015 * none's peak));
on the blocks, revolve (default) and budget sqrt/2 (memory_budget = sqrt's peak // 2).

Columns:

  peak MiB          bwd.peak_bytes, the planned arena high-water mark (params, inputs and
                    the gradient outputs live outside it); x none: its ratio to none's
  fwd+bwd           bwd.run(feeds): forward, recompute, backward.  The harness's
                    interleaved median (all strategies' programs are built first and
                    take turns inside every repeat); x none: median of per-repeat ratios
  FLOPs x none      the whole program's FLOPs over none's, counted over bwd.nodes() by a
                    simple model (2mnk per matmul, one per element touched otherwise):
                    the time ratio to expect if run time were proportional to FLOPs
  recomputed        bwd.stats()["n_recomputed"]: forward nodes copied into the backward pass
  steps (per layer) bwd.stats()["recompute_steps"]: forward steps recomputed (a step runs
                    from one narrow point backward reads to the next: a chain layer, half
                    a block), and that over the number of layers / blocks
  max               bwd.stats()["max_recomputations"]: most copies of one tensor (1: one level)
  recompute GFLOP   bwd.stats()["recompute_flops"], the planner's own estimate (it weighs
                    transcendental ops more); % fwd: the recomputed copies' FLOPs over the
                    forward pass's, both by the simple model
  build_backward    jg.build_backward(fwd, ...) wall time, median of BUILD_REPEATS builds
                    (planning included: for budgets, the search over DP plans)
  bit-identical     np.array_equal of the loss and of every param's bwd.grad(W) with none's

After the tables: the Pareto frontier jg.pareto(fwd) of the largest chain, (peak,
recompute FLOPs) pairs none of which is beaten on both (one-level and multi-level plans),
plotted to checkpoint_pareto.png in two colours.

The issues' targets, shown as met / MISSED: for sqrt on the N = 1,000, B = 1,024 chain,
planned peak <= 0.07 x none and fwd+bwd time <= 1.3 x none; a multi-level plan with
peak <= 0.015 x none in <= 2.0 x none's time on both N = 1,000 chains; revolve's
recomputed steps equal Revolve's optimum t(N, slots + 1) on every relu chain; revolve
with its default slots in <= 3.0 x none's time on every network; memory_budget = half
of sqrt's peak met on 8 blocks; every strategy's loss and gradients bit-identical to
none's on every network.  No assertion is made on timings.
"""
import gc
import math
import os
import statistics
import sys
import time
from collections import namedtuple

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

import numpy as np  # noqa: E402

import jitgraph as jg  # noqa: E402

from . import harness  # noqa: E402
from .models import chain_weights  # noqa: E402
from jitgraph.revolve import optimal_steps  # noqa: E402
from .report import fmt_s, md_table  # noqa: E402

MiB = 2 ** 20
CHAIN_B, CHAIN_D = 1024, 64
QUICK_B = 64                  # --quick: the chains' batch
BUILD_REPEATS = 5
BUDGET_FRACTION = 0.25
STRATEGIES = ("none", "every layer", "sqrt", "save_matmuls", "budget 25%")
# multi-level plans: revolve with a few slot counts on the chains, budgets below one level
CHAIN_EXTRA = ("revolve s=2", "revolve s=6", "revolve s=12", "revolve (default)", "budget 1.5%")
BLOCK_EXTRA = ("revolve (default)", "budget sqrt/2")
REVOLVE_FRACTION = 0.015
TARGET_N = 1_000
TARGET_PEAK_RATIO = 0.07
TARGET_TIME_RATIO = 1.3
TARGET_REVOLVE_TIME = 2.0
TARGET_DEFAULT_REVOLVE = 3.0
DROPOUT_P = 0.1
TARGET_BLOCKS = "blocks L=8"

# One freshly built network: feeds for run(), params in creation order (to pair the
# gradients across strategies), the scalar loss, and the per-layer outputs.
Model = namedtuple("Model", "feeds params loss outs")


# ---- networks -------------------------------------------------------------------------------

def chain_builder(weights, xb, dropout=False):
    def build():
        g = jg.Graph(np.float32)
        x = g.input(xb.shape, name="x")
        params, outs = [], []
        h = x
        for i, w in enumerate(weights):
            W = g.param(w)
            params.append(W)
            h = jg.relu(h @ W)
            if dropout:
                h = jg.dropout(h, DROPOUT_P, seed=i)
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


def strategy_kwargs(name, model, peaks):
    """build_backward's arguments for strategy ``name``; ``peaks``: none's and sqrt's planned peaks."""
    if name == "budget 25%":
        return {"memory_budget": int(BUDGET_FRACTION * peaks["none"])}
    if name == "budget 1.5%":
        return {"memory_budget": int(REVOLVE_FRACTION * peaks["none"])}
    if name == "budget sqrt/2":
        return {"memory_budget": peaks["sqrt"] // 2}
    if name == "revolve (default)":
        return {"checkpoints": "revolve"}
    if name.startswith("revolve s="):
        return {"checkpoints": "revolve", "slots": int(name[len("revolve s="):])}
    return {"none": {}, "every layer": {"checkpoints": model.outs}, "sqrt": {"checkpoints": "sqrt"},
            "save_matmuls": {"policy": "save_matmuls"}}[name]


# ---- one network ------------------------------------------------------------------------------

def build_strategy(build, name, peaks, build_repeats):
    """(model, fwd, bwd, median build_backward seconds), or (None, None, GraphError
    message, None).  Each build is of a fresh graph; the last one is kept to run."""
    times = []
    model = fwd = bwd = None
    for _ in range(build_repeats):
        model = fwd = bwd = None          # drop the previous graph and collect it, so
        gc.collect()                      # its garbage is not charged to this build
        model = build()
        fwd = jg.build_forward(model.loss)
        kwargs = strategy_kwargs(name, model, peaks)
        t0 = time.perf_counter()
        try:
            bwd = jg.build_backward(fwd, **kwargs)
        except jg.GraphError as e:
            return None, None, str(e), None
        times.append(time.perf_counter() - t0)
    return model, fwd, bwd, statistics.median(times)


def program_flops(prog):
    """(all, recomputed copies') FLOPs of a program by a simple model over its public
    node table: 2mnk per matmul, one per element touched otherwise, none for leaves."""
    rows = prog.nodes()
    shapes = {r["id"]: r["shape"] for r in rows}
    total = recomputed = 0
    for r in rows:
        if not r["sources"]:
            continue
        out = math.prod(r["shape"])
        first = shapes[r["sources"][0]]
        if r["op"] == "matmul":
            # a's last two dims are (m, k) or, read transposed, (k, m): k is the one left after m
            dims = list(first[-2:])
            dims.remove(r["shape"][-2])
            flops = 2 * out * dims[0]
        else:
            flops = max(out, math.prod(first))
        total += flops
        if "recomputed" in r["flags"]:
            recomputed += flops
    return total, recomputed


def identical(model, bwd, loss, ref_loss, ref_grads):
    """'yes', or what differs from none."""
    grads = [bwd.grad(p) for p in model.params]
    bad = [i for i, (a, b) in enumerate(zip(grads, ref_grads)) if not np.array_equal(a, b)]
    if not bad and np.array_equal(loss, ref_loss):
        return "yes"
    diff = max((float(np.max(np.abs(grads[i].astype(np.float64) - ref_grads[i]))) for i in bad), default=0.0)
    return f"NO: loss {'same' if np.array_equal(loss, ref_loss) else 'differs'}, " \
           f"{len(bad)}/{len(grads)} grads differ (max |diff| {diff:.2g})"


def bench_network(ctx, key, title, build, build_repeats, strategies=STRATEGIES, n_layers=None):
    """Build every strategy's program, check it against none, time them interleaved."""
    ctx.note(f"{key}: builds")
    built = {"none": build_strategy(build, "none", None, build_repeats)}
    model, fwd, bwd, _ = built["none"]
    peaks = {"none": bwd.peak_bytes}
    fwd_flops = program_flops(fwd)[0]
    n_layers = n_layers or len(model.outs)
    for name in strategies[1:]:
        built[name] = build_strategy(build, name, peaks, build_repeats)
        if name == "sqrt" and built[name][0] is not None:
            peaks["sqrt"] = built[name][2].peak_bytes
    ok = {k: v for k, v in built.items() if v[0] is not None}

    # one run each (also a warm-up) for the bit-identity check against none
    ref_loss = bwd.run(model.feeds)
    ref_grads = [bwd.grad(p) for p in model.params]
    same = {name: identical(m, b, b.run(m.feeds), ref_loss, ref_grads) for name, (m, _, b, _) in ok.items()}
    del ref_grads
    timing = harness.timed(ctx, {k: (lambda m=v[0], b=v[2]: b.run(m.feeds)) for k, v in ok.items()},
                           ref="none", ref_over=False)

    none_flops = program_flops(bwd)[0]
    res = {}
    for name in strategies:
        model, _, bwd, t_build = built[name]
        if model is None:
            res[name] = {"error": bwd}
            continue
        st = bwd.stats()
        flops, recomputed = program_flops(bwd)
        ratio = timing["ratios"].get(f"{name}/none")
        res[name] = {
            "peak_bytes": bwd.peak_bytes, "peak_ratio": bwd.peak_bytes / peaks["none"],
            "run_s": timing["contenders"][name]["median_s"], "run_ratio": 1.0 if ratio is None else ratio["median"],
            "flops_ratio": flops / none_flops, "n_recomputed": st["n_recomputed"],
            "recompute_flops": st["recompute_flops"], "recompute_frac": recomputed / fwd_flops,
            "recompute_steps": st["recompute_steps"], "max_recomputations": st["max_recomputations"],
            "build_s": t_build, "same": same[name], "plan": st["plan"],
            "budget": strategy_kwargs(name, model, peaks).get("memory_budget"),
            "slots": strategy_kwargs(name, model, peaks).get("slots"),
        }
    return {"key": key, "title": title, "fwd_flops": fwd_flops, "strategies": res, "timing": timing,
            "n_layers": n_layers, "sqrt_peak": peaks.get("sqrt")}


# ---- Pareto frontier ------------------------------------------------------------------------

def pareto(build, measured):
    """jg.pareto(fwd)'s rows, its time, and the measured strategies it beats on both axes."""
    model = build()
    fwd = jg.build_forward(model.loss)
    t0 = time.perf_counter()
    front = jg.pareto(fwd)
    seconds = time.perf_counter() - t0
    front = [dict(r, plan=r["plan"].words) for r in front]          # the Plan in words: results.json
    off = []
    for name, r in measured.items():
        if "error" in r:
            continue
        better = [f for f in front if f["peak_bytes"] <= r["peak_bytes"] and f["recompute_flops"] <= r["recompute_flops"]
                  and (f["peak_bytes"], f["recompute_flops"]) != (r["peak_bytes"], r["recompute_flops"])]
        if better:
            off.append({"strategy": name, "by": min(better, key=lambda f: f["recompute_flops"])})
    return {"seconds": seconds, "front": front, "off_frontier": off}


# ---- the workload ---------------------------------------------------------------------------

def warm_up(rng):
    """Load (or compile) every jitted pass and kernel the networks use, on tiny graphs,
    so no build or run figure includes JIT time.  Returns its wall time."""
    t0 = time.perf_counter()
    xb = rng.standard_normal((8, CHAIN_D)).astype(np.float32)
    for build, extra in ((chain_builder(chain_weights(4, xb.shape[1], xb, rng), xb), CHAIN_EXTRA),
                         (blocks_builder(2, dropout=True, B=2, T=4), BLOCK_EXTRA)):
        peaks = {}
        for name in STRATEGIES + extra:
            model, _, bwd, _ = build_strategy(build, name, peaks, 1)
            if model is not None:
                bwd.run(model.feeds)
                peaks.setdefault("none" if name == "none" else name, bwd.peak_bytes)
    jg.pareto(jg.build_forward(build().loss))
    return time.perf_counter() - t0


def targets(networks):
    """The issue's targets as rows (what, wanted, measured, met or None)."""
    sqrt = next((n["strategies"]["sqrt"] for n in networks if n["key"] == f"chain N={TARGET_N:,}"), None)
    rows = []
    for what, field, limit in (("sqrt peak / none", "peak_ratio", TARGET_PEAK_RATIO),
                               ("sqrt fwd+bwd / none", "run_ratio", TARGET_TIME_RATIO)):
        if sqrt is None or "error" in sqrt:
            rows.append({"what": f"{what}, chain N={TARGET_N:,}", "wanted": f"<= {limit}",
                         "measured": "not run (--quick)" if sqrt is None else "sqrt failed", "met": None})
        else:
            rows.append({"what": f"{what}, chain N={TARGET_N:,}", "wanted": f"<= {limit}",
                         "measured": f"{sqrt[field]:.3f}", "met": sqrt[field] <= limit})
    rows += revolve_targets(networks)
    checked = [(n["key"], s, r) for n in networks for s, r in n["strategies"].items() if "error" not in r]
    differ = [f"{k} / {s}" for k, s, r in checked if r["same"] != "yes"]
    rows.append({"what": "gradients bit-identical to none", "wanted": "all",
                 "measured": f"{len(checked) - len(differ)} of {len(checked)}", "met": not differ,
                 "differ": differ})
    return rows


def lean_target(chain, key):
    """The leanest-plan target on one chain: a multi-level plan with peak <= 1.5% of none's
    within 2x the time."""
    what = f"multi-level plan with peak <= {REVOLVE_FRACTION} x none, {key}: fwd+bwd / none"
    if chain is None:
        return {"what": what, "wanted": f"<= {TARGET_REVOLVE_TIME}", "measured": "not run (--quick)", "met": None}
    lean = {s: r for s, r in chain["strategies"].items() if s in CHAIN_EXTRA and "error" not in r
            and r["peak_ratio"] <= REVOLVE_FRACTION}
    if not lean:
        return {"what": what, "wanted": f"<= {TARGET_REVOLVE_TIME}", "measured": "no plan that lean", "met": False}
    name, r = min(lean.items(), key=lambda kv: kv[1]["run_ratio"])
    return {"what": what, "wanted": f"<= {TARGET_REVOLVE_TIME}",
            "measured": f"{r['run_ratio']:.3f} ({name}: peak {r['peak_ratio']:.4f} x, bit-identical: {r['same']})",
            "met": r["run_ratio"] <= TARGET_REVOLVE_TIME and r["same"] == "yes"}


def revolve_targets(networks):
    """[5/6]'s targets: a multi-level plan at <= 1.5% of none's peak on the N = 1,000 chains
    within 2x the time; revolve's default within 3x on every network; revolve's recomputed
    steps = t(N, s + 1) on every relu chain; half of sqrt's peak met on the blocks."""
    rows = []
    for key in (f"chain N={TARGET_N:,}", f"dropout chain N={TARGET_N:,}"):
        rows.append(lean_target(next((n for n in networks if n["key"] == key), None), key))
    for n in networks:
        r = n["strategies"].get("revolve (default)")
        if r is None:
            continue
        what = f"revolve (default slots), {n['key']}: fwd+bwd / none"
        if "error" in r:
            rows.append({"what": what, "wanted": f"<= {TARGET_DEFAULT_REVOLVE}", "measured": "GraphError", "met": False})
        else:
            rows.append({"what": what, "wanted": f"<= {TARGET_DEFAULT_REVOLVE}",
                         "measured": f"{r['run_ratio']:.3f} ({r['plan']}: peak {r['peak_ratio']:.4f} x, "
                                     f"max {r['max_recomputations']} recomputations)",
                         "met": r["run_ratio"] <= TARGET_DEFAULT_REVOLVE and r["same"] == "yes"})
    counts = [(n["key"], s, r) for n in networks if n["key"].startswith("chain")
              for s, r in n["strategies"].items() if s.startswith("revolve s=") and "error" not in r]
    wrong = [f"{k} / {s}" for k, s, r in counts
             if r["recompute_steps"] != optimal_steps(int(k.split("=")[1].replace(",", "")), r["slots"] + 1)]
    rows.append({"what": "revolve's recomputed steps = t(N, slots + 1), every chain", "wanted": "all",
                 "measured": f"{len(counts) - len(wrong)} of {len(counts)}", "met": not wrong, "differ": wrong})
    blocks = next((n for n in networks if n["key"] == TARGET_BLOCKS), None)
    what = f"memory_budget = sqrt's peak / 2, {TARGET_BLOCKS}"
    if blocks is None:
        rows.append({"what": what, "wanted": "a plan that fits", "measured": "not run (--quick)", "met": None})
    else:
        r = blocks["strategies"]["budget sqrt/2"]
        if "error" in r:
            rows.append({"what": what, "wanted": "a plan that fits", "measured": "GraphError", "met": False})
        else:
            rows.append({"what": what, "wanted": "a plan that fits",
                         "measured": f"peak {r['peak_bytes'] / blocks['sqrt_peak']:.3f} x sqrt's, "
                                     f"{r['max_recomputations']} recomputations at most",
                         "met": r["peak_bytes"] <= blocks["sqrt_peak"] // 2})
    return rows


def run(ctx):
    if ctx.quick:
        chain_ns, block_ls, build_repeats = (10, 100), (2,), 3
    else:
        chain_ns, block_ls, build_repeats = (100, 1_000), (8, 16), BUILD_REPEATS
    rng = np.random.default_rng(0)
    ctx.note("warm-up")
    warm_s = warm_up(rng)

    rng = np.random.default_rng(0)
    batch = QUICK_B if ctx.quick else CHAIN_B
    xb = rng.standard_normal((batch, CHAIN_D)).astype(np.float32)
    weights = chain_weights(max(chain_ns), xb.shape[1], xb, rng)
    plan = [(f"chain N={n:,}", f"N-layer relu chain, N = {n:,}, B = {batch}, D = {CHAIN_D}",
             chain_builder(weights[:n], xb), STRATEGIES + CHAIN_EXTRA) for n in chain_ns]
    plan.append((f"dropout chain N={max(chain_ns):,}", f"N-layer dropout(relu) chain, N = {max(chain_ns):,}, "
                 f"B = {batch}, D = {CHAIN_D}, p = {DROPOUT_P}", chain_builder(weights, xb, dropout=True),
                 STRATEGIES + CHAIN_EXTRA))
    plan += [(f"blocks L={L}", f"{L} transformer-like blocks, B = 8, T = 64, D = 64", blocks_builder(L),
              STRATEGIES + BLOCK_EXTRA) for L in block_ls]
    plan.append((f"blocks L={block_ls[0]} + dropout",
                 f"{block_ls[0]} transformer-like blocks with dropout(0.1) after softmax",
                 blocks_builder(block_ls[0], dropout=True), STRATEGIES + BLOCK_EXTRA))
    networks = []
    for key, title, build, strategies in plan:
        networks.append(bench_network(ctx, key, title, build, build_repeats, strategies))
        gc.collect()                      # free this network's programs before the next

    n_front = max(chain_ns)
    ctx.note("pareto")
    front = pareto(chain_builder(weights[:n_front], xb), networks[chain_ns.index(n_front)]["strategies"])
    front["network"] = f"chain N={n_front:,}"
    return {"title": "checkpoint: planned memory, run time and recompute of each checkpointing strategy "
                     "(perf/bench_checkpoint.py)",
            "what": f"float32; fwd+bwd: the harness's interleaved median of {ctx.repeats} repeats; build_backward: "
                    f"median of {build_repeats} fresh builds; first build + run of every strategy in this process "
                    f"(JIT load/compile, tiny graphs): {fmt_s(warm_s)}, in no figure",
            "warm_up_s": warm_s, "networks": networks, "pareto": front, "targets": targets(networks)}


def md_network(n):
    rows, errors = [], []
    for name, r in n["strategies"].items():
        label = name if r.get("budget") is None else f"{name} ({r['budget'] / MiB:.2f} MiB)"
        if "error" in r:
            rows.append([label, "GraphError"] + ["-"] * 11)
            errors.append(f"* {label}: GraphError: {r['error']}")
            continue
        rows.append([label, f"{r['peak_bytes'] / MiB:.2f}", f"{r['peak_ratio']:.4f}", fmt_s(r["run_s"]),
                     f"{r['run_ratio']:.3f}", f"{r['flops_ratio']:.3f}", f"{r['n_recomputed']:,}",
                     f"{r['recompute_steps']:,} ({r['recompute_steps'] / n['n_layers']:.2f})",
                     str(r["max_recomputations"]), f"{r['recompute_flops'] / 1e9:.3f}",
                     f"{100 * r['recompute_frac']:.0f}%", fmt_s(r["build_s"]), r["same"]])
    calls = " / ".join(str(c["calls_per_sample"]) for c in n["timing"]["contenders"].values())
    return [f"### {n['title']}", ""] + md_table(
        ["strategy", "peak MiB", "x none", "fwd+bwd", "x none", "FLOPs x none", "recomputed",
         "steps (per layer)", "max", "recompute GFLOP", "% fwd", "build_backward", "bit-identical"], rows) + [
        "", f"Forward pass: {n['fwd_flops'] / 1e9:.3f} GFLOP; fwd+bwd calls per timed sample: {calls}."] + errors


def md_pareto(p):
    front = p["front"]
    none_peak = next(r["peak_bytes"] for r in front if r["strategy"] == "none")
    def plan(r):
        if r["slots"] is not None:
            return f"{r['slots']} slots, steps of {r['group']}" + (", fine tapes" if r["fine"] else "")
        return "-" if r["budget"] is None else f"model budget {r['budget'] / MiB:.2f} MiB"

    rows = [[r["strategy"], plan(r), f"{r['peak_bytes'] / MiB:.2f}", f"{r['peak_bytes'] / none_peak:.4f}",
             f"{r['recompute_flops'] / 1e9:.3f}", f"{r['n_recomputed']:,}", f"{r['recompute_steps']:,}",
             str(r["max_recomputations"])] for r in front]
    lines = [f"### {p['network']}: Pareto frontier, jg.pareto(fwd) ({fmt_s(p['seconds'])})", ""] + md_table(
        ["strategy", "plan", "peak MiB", "x none", "recompute GFLOP", "recomputed", "steps", "max"], rows) + [""]
    for o in p["off_frontier"]:
        f = o["by"]
        lines.append(f"* {o['strategy']} is off the frontier: {f['strategy']} gives {f['peak_bytes'] / MiB:.2f} MiB, "
                     f"{f['recompute_flops'] / 1e9:.3f} GFLOP")
    return lines


def markdown(res):
    L = []
    for n in res["networks"]:
        L += md_network(n) + [""]
    L += md_pareto(res["pareto"]) + ["", "### Targets", ""]
    L += md_table(["target", "wanted", "measured", ""],
                  [[t["what"], t["wanted"], t["measured"], {None: "", True: "met", False: "MISSED"}[t["met"]]]
                   for t in res["targets"]])
    L += [f"* differs: {d}" for t in res["targets"] for d in t.get("differ", ())]
    n_err = sum("error" in r for n in res["networks"] for r in n["strategies"].values())
    if n_err:
        L.append(f"* {n_err} budget run(s) raised GraphError and are not in the count")
    return L + [
        "",
        "Peak: the planned arena only; params, inputs and gradient outputs are outside it and the same for every "
        "strategy.  FLOPs x none is a model (matmuls 2mnk, other ops one FLOP per element): fwd+bwd x none departs "
        "from it as far as ops run at different FLOP rates or memory traffic changes.  A strategy that recomputes "
        "nothing at none's peak (every layer on the chain) runs none's program: its fwd+bwd x none is the timing "
        "noise of this run.  steps: bwd.stats()['recompute_steps'], forward steps recomputed (a step: from one "
        "narrow point backward reads to the next -- a chain layer, half a block), and per layer; max: "
        "bwd.stats()['max_recomputations'], the most copies of one tensor (1: one level)."]


def plot(res, plots, key):
    """Memory against recompute: the frontier and the strategies measured on its network."""
    p = res["pareto"]
    measured = next(n for n in res["networks"] if n["key"] == p["network"])["strategies"]
    fig, ax = plots.figure((7, 4.5))
    xs = [r["peak_bytes"] / MiB for r in p["front"]]
    ys = [r["recompute_flops"] / 1e9 for r in p["front"]]
    # frontier rows come lowest peak first: a step shows what each extra MiB buys
    ax.step(xs, ys, where="post", color="tab:gray", alpha=0.5)
    for multi, colour, label in ((False, "tab:blue", "jg.pareto: one level"),
                                 (True, "tab:orange", "jg.pareto: several levels")):
        pts = [(x, y) for x, y, r in zip(xs, ys, p["front"]) if (r["max_recomputations"] > 1) == multi]
        if pts:
            ax.plot(*zip(*pts), "o", color=colour, label=label)
    # the strategies as built and run: hollow markers of shrinking size, so coinciding
    # ones (none, every layer, save_matmuls on a chain) stay visible
    for i, (name, r) in enumerate(measured.items()):
        if "error" not in r:
            ax.plot(r["peak_bytes"] / MiB, r["recompute_flops"] / 1e9, "sD^vPXh<>p"[i % 10],
                    markersize=max(4, 14 - i), fillstyle="none", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("planned peak (MiB)")
    ax.set_ylabel("recompute (GFLOP)")
    ax.set_title(f"{p['network']}: memory vs recompute")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    plots.save(fig, f"{key}_pareto.png")


WORKLOAD = harness.Workload("checkpoint", "perf/bench_checkpoint.py: checkpointing strategies on chains and blocks",
                            run, markdown, plot)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_checkpoint.py",
                          description=__doc__.split("\n\n")[0]))
