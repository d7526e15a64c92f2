"""Memory budgets on real models: does memory_budget choose the fastest plan, and does it
predict its time?  (workload ``budgets``, issue [5/6])

Run from the repository root (or ``jitgraph bench --only budgets``):

    python perf/bench_budgets.py --threads 1      # full sizes (10-20 minutes)
    python perf/bench_budgets.py --quick          # tiny sizes: a smoke test

Models (float32, fwd+bwd): (g) the GPT of perf/gpt.py (6 layers, d 192, T 128, batch 8)
and (h) the ResNet-32 of perf/resnet.py (batch 32, batch norm in training mode).  For
each budget of 1/2, 1/4 and 1/8 of the plain plan's peak:

  chosen      jg.build_backward(fwd, memory_budget=B): the plan the planner picks, priced in
              measured time (costs="measured", timed on this host first)
  candidates  every plan jg.plans(fwd, B) lists -- the budget search's and the frontier
              survey's, one level and several, all fitting B -- each built with
              build_backward(fwd, plan=row["plan"]).  One of them is the chosen plan
              itself (normally the first: the least predicted recompute); each other is
              run once (after one warm-up call) to screen them, and the fastest few then
              take turns with the chosen and the plain plan in the harness's interleaved
              timing
  predicted   the plain plan's measured time + the plan's predicted recompute seconds
              (stats()["predicted_recompute_seconds"]): what the planner expects the plan
              to cost over the plain one

Targets ([5/6]): the chosen plan's time within 5% of the fastest plan found (chosen /
fastest <= 1.05, the median of per-repeat ratios; fastest: by median time) and its predicted time within 15% of measured, at every budget; and
planning a 10,002-node graph (a 2,500-layer dropout(relu(h @ W)) chain, B 64, D 64) in
<= 2 s for memory_budget = 25% and 1.5% of its plain peak and for revolve's default.
Every built plan's loss and gradients are checked bit for bit against the plain plan's.
"""
import gc
import os
import statistics
import sys
import time

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

import numpy as np  # noqa: E402

import jitgraph as jg  # noqa: E402

from . import harness  # noqa: E402
from .bench_checkpoint import chain_builder  # noqa: E402
from .models import chain_weights, gpt_batch, gpt_forward, gpt_weights  # noqa: E402
from .gpt import FULL as GPT_FULL, QUICK as GPT_QUICK  # noqa: E402
from .resnet import FULL as RESNET_FULL, QUICK as RESNET_QUICK, resnet_batch, resnet_forward, resnet_weights  # noqa: E402
from .report import fmt_s, md_table  # noqa: E402

MiB = 2 ** 20
FRACTIONS = (2, 4, 8)             # budgets: the plain peak over these
FINALISTS = 4                     # screened candidates that go on to the interleaved timing
TARGET_CHOSEN = 1.05
TARGET_PREDICTED = 0.15
TARGET_PLAN_S = 2.0
PLAN_LAYERS = 2_500               # 4 nodes a layer + 2: a 10,002-node graph
PLAN_B, PLAN_D = 64, 64


# ---- models -----------------------------------------------------------------------------------

def gpt_model(quick):
    cfg = GPT_QUICK if quick else GPT_FULL
    w = gpt_weights(cfg)
    idx, _, onehot = gpt_batch(cfg, np.random.default_rng(1))

    def build():
        fwd, idx_in, targets_in, P = gpt_forward(w, cfg)
        return fwd, {idx_in: idx, targets_in: onehot}, list(P.values())
    return f"(g) GPT, {cfg.layers} layers, d {cfg.d}, T {cfg.T}, batch {cfg.batch}", build


def resnet_model(quick):
    cfg = RESNET_QUICK if quick else RESNET_FULL
    weights, stats = resnet_weights(cfg)
    images, labels = resnet_batch(cfg, np.random.default_rng(1))

    def build():
        fwd, x, lab, P, _ = resnet_forward(weights, stats, cfg)
        return fwd, {x: images, lab: labels}, list(P.values())
    return f"(h) ResNet-{cfg.depth}, batch {cfg.batch}, {cfg.size}x{cfg.size}", build


# ---- one budget ---------------------------------------------------------------------------------

def bench_budget(ctx, build, plain, ref, budget):
    """The chosen plan against every listed plan at ``budget``."""
    fwd, feeds, params = build()
    t0 = time.perf_counter()
    try:
        chosen = jg.build_backward(fwd, memory_budget=budget)
    except jg.GraphError as e:            # no plan fits: jg.plans lists none either
        return {"budget": budget, "error": str(e), "n_plans": len(jg.plans(build()[0], budget))}
    plan_s = time.perf_counter() - t0
    rows = jg.plans(build()[0], budget)
    built = {}
    for i, r in enumerate(rows):
        f, fd, ps = build()
        built[i] = (jg.build_backward(f, plan=r["plan"]), fd, ps)
    # screen: one call each after a warm-up call
    screen = {}
    for i, (bwd, fd, _) in built.items():
        bwd.run(fd)
        screen[i] = harness.time_calls(lambda b=bwd, f=fd: b.run(f), 1)
    # the finalists: the fastest screened plans other than the chosen one (the same plan, by
    # its words and peak; normally rows[0])
    st = chosen.stats()
    same_as_chosen = {i for i, r in enumerate(rows)
                      if st["plan"] == "memory_budget: " + r["strategy"] and chosen.peak_bytes == r["peak_bytes"]}
    finalists = sorted((i for i in screen if i not in same_as_chosen), key=screen.get)[:FINALISTS]
    same = {i: identical(bwd, fd, ps, ref) for i, (bwd, fd, ps) in built.items()}
    fns = {"plain": lambda: plain[0].run(plain[1]), "chosen": lambda: chosen.run(feeds)}
    for i in finalists:
        fns[f"plan {i}"] = lambda b=built[i][0], f=built[i][1]: b.run(f)
    timing = harness.timed(ctx, fns, ref="plain", ref_over=False)
    med = {k: v["median_s"] for k, v in timing["contenders"].items()}
    fastest = min((k for k in med if k != "plain"), key=med.get)
    # chosen / fastest as the median of per-repeat ratios (they ran side by side in each repeat)
    per = [a / b for a, b in zip(timing["contenders"]["chosen"]["samples_s"], timing["contenders"][fastest]["samples_s"])]
    predicted = med["plain"] + st.get("predicted_recompute_seconds", 0.0)
    out = {
        "budget": budget, "plan_s": plan_s, "chosen": st["plan"], "chosen_peak": chosen.peak_bytes,
        "chosen_same": identical(chosen, feeds, params, ref), "n_plans": len(rows),
        "chosen_is_cheapest": bool(rows) and st.get("predicted_recompute_seconds", 0.0) * 1e9 <=
        min(r["recompute_cost"] for r in rows) + 1,
        "predicted_recompute_s": st.get("predicted_recompute_seconds", 0.0),
        "plain_s": med["plain"], "chosen_s": med["chosen"], "predicted_s": predicted,
        "predicted_error": predicted / med["chosen"] - 1.0,
        "fastest": fastest if fastest == "chosen" else rows[int(fastest.split()[1])]["strategy"],
        "fastest_s": med[fastest], "chosen_over_fastest": statistics.median(per),
        "plans": [{"strategy": r["strategy"], "peak_bytes": r["peak_bytes"],
                   "predicted_recompute_s": r.get("recompute_seconds"), "screen_s": screen[i],
                   "timed_s": med["chosen"] if i in same_as_chosen else med.get(f"plan {i}"), "same": same[i]}
                  for i, r in enumerate(rows)],
        "timing": timing,
    }
    return out


def identical(bwd, feeds, params, ref):
    loss = bwd.run(feeds)
    return bool(np.array_equal(loss, ref[0]) and all(np.array_equal(bwd.grad(p), g) for p, g in zip(params, ref[1])))


def bench_model(ctx, title, build):
    ctx.note(f"{title}: plain")
    fwd, feeds, params = build()
    plain = jg.build_backward(fwd)
    ref = (plain.run(feeds), [plain.grad(p) for p in params])
    out = {"title": title, "plain_peak": plain.peak_bytes, "budgets": []}
    for k in FRACTIONS:
        ctx.note(f"{title}: budget 1/{k}")
        out["budgets"].append({"fraction": f"1/{k}", **bench_budget(ctx, build, (plain, feeds), ref,
                                                                    plain.peak_bytes // k)})
        gc.collect()
    return out


# ---- planning time --------------------------------------------------------------------------------

def planning(quick):
    layers = 100 if quick else PLAN_LAYERS
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((PLAN_B, PLAN_D)).astype(np.float32)
    build = chain_builder(chain_weights(layers, PLAN_D, xb, rng), xb, dropout=True)    # bench_checkpoint's chain
    plain = jg.build_backward(jg.build_forward(build().loss))
    rows = []
    for what, kw in (("memory_budget 25%", {"memory_budget": plain.peak_bytes // 4}),
                     ("memory_budget 1.5%", {"memory_budget": int(0.015 * plain.peak_bytes)}),
                     ("revolve (default slots)", {"checkpoints": "revolve"})):
        times, bwd = [], None
        for _ in range(3):
            fwd = jg.build_forward(build().loss)
            nodes = int(fwd.graph.nodes.n)        # the forward graph's, before the backward part
            bwd = None
            gc.collect()
            t0 = time.perf_counter()
            try:
                bwd = jg.build_backward(fwd, **kw)
            except jg.GraphError as e:        # a budget below every plan (--quick's short chain)
                bwd = str(e)
            times.append(time.perf_counter() - t0)
        ok = not isinstance(bwd, str)
        rows.append({"what": what, "nodes": nodes, "plan_s": statistics.median(times),
                     "plan": bwd.stats()["plan"] if ok else f"GraphError: {bwd}",
                     "peak_ratio": bwd.peak_bytes / plain.peak_bytes if ok else None})
    return rows


# ---- the workload -----------------------------------------------------------------------------------

def run(ctx):
    with harness.threads(ctx, 1):
        ctx.note("planning time")
        plans = planning(ctx.quick)
        models = [bench_model(ctx, *gpt_model(ctx.quick)), bench_model(ctx, *resnet_model(ctx.quick))]
    return {"title": "budgets: memory_budget's choice against every plan that fits, on (g) and (h), 1 thread "
                     "(perf/bench_budgets.py)",
            "what": f"float32, 1 thread; budgets 1/{', 1/'.join(map(str, FRACTIONS))} of the plain peak; costs "
                    f"measured on this host; the {FINALISTS} fastest screened plans, the chosen and the plain one "
                    f"timed interleaved, {ctx.repeats} repeats",
            "models": models, "planning": plans, "targets": targets(models, plans)}


def targets(models, plans):
    rows = []
    for m in models:
        for b in m["budgets"]:
            if "error" in b:
                rows.append({"what": f"{m['title'][:3]} budget {b['fraction']}", "wanted": "a plan",
                             "measured": f"none fits ({b['n_plans']} listed)", "met": None})
                continue
            rows.append({"what": f"{m['title'][:3]} budget {b['fraction']}: chosen / fastest plan",
                         "wanted": f"<= {TARGET_CHOSEN}", "measured": f"{b['chosen_over_fastest']:.3f}",
                         "met": b["chosen_over_fastest"] <= TARGET_CHOSEN})
            rows.append({"what": f"{m['title'][:3]} budget {b['fraction']}: predicted / measured time - 1",
                         "wanted": f"within +-{TARGET_PREDICTED:.0%}", "measured": f"{b['predicted_error']:+.1%}",
                         "met": abs(b["predicted_error"]) <= TARGET_PREDICTED})
    for p in plans:
        rows.append({"what": f"planning, {p['nodes']:,} nodes, {p['what']}", "wanted": f"<= {TARGET_PLAN_S} s",
                     "measured": fmt_s(p["plan_s"]) + ("" if p["peak_ratio"] is not None else " (no plan fits)"),
                     "met": p["plan_s"] <= TARGET_PLAN_S if p["peak_ratio"] is not None else None})
    differ = [f"{m['title'][:3]} {b['fraction']} {p['strategy']}" for m in models for b in m["budgets"]
              for p in b.get("plans", ()) if not p["same"]]
    differ += [f"{m['title'][:3]} {b['fraction']} chosen" for m in models for b in m["budgets"]
               if "error" not in b and not b["chosen_same"]]
    n = sum(len(b["plans"]) + 1 for m in models for b in m["budgets"] if "error" not in b)
    rows.append({"what": "every plan's loss and gradients bit-identical to the plain plan's", "wanted": "all",
                 "measured": f"{n - len(differ)} of {n}", "met": not differ, "differ": differ})
    return rows


def markdown(res):
    L = []
    for m in res["models"]:
        L += [f"### {m['title']}: plain peak {m['plain_peak'] / MiB:.2f} MiB", ""]
        rows = []
        for b in m["budgets"]:
            if "error" in b:
                rows.append([b["fraction"], f"{b['budget'] / MiB:.2f}", "GraphError: " + b["error"]] + ["-"] * 10)
                continue
            rows.append([b["fraction"], f"{b['budget'] / MiB:.2f}", b["chosen"], f"{b['chosen_peak'] / MiB:.2f}",
                         fmt_s(b["plan_s"]), str(b["n_plans"]), fmt_s(b["plain_s"]), fmt_s(b["chosen_s"]),
                         f"{b['chosen_s'] / b['plain_s']:.3f}", fmt_s(b["predicted_s"]),
                         f"{b['predicted_error']:+.1%}", b["fastest"], f"{b['chosen_over_fastest']:.3f}"])
        L += md_table(["budget", "MiB", "chosen plan", "peak MiB", "planning", "plans fitting", "plain",
                       "chosen", "x plain", "predicted", "pred. error", "fastest found", "chosen / fastest"], rows)
        L.append("")
        for b in m["budgets"]:
            if "error" in b:
                continue
            L += [f"Budget {b['fraction']}: the plans listed (the chosen one "
                  f"{'the cheapest predicted' if b['chosen_is_cheapest'] else 'NOT the cheapest predicted'}), "
                  "screened (one call) and, the fastest others, timed:", ""]
            L += md_table(["plan", "peak MiB", "predicted recompute", "screen", "timed", "bit-identical"],
                          [[p["strategy"], f"{p['peak_bytes'] / MiB:.2f}",
                            "-" if p["predicted_recompute_s"] is None else fmt_s(p["predicted_recompute_s"]),
                            fmt_s(p["screen_s"]), "-" if p["timed_s"] is None else fmt_s(p["timed_s"]),
                            "yes" if p["same"] else "NO"] for p in b["plans"]])
            L.append("")
    L += ["### Planning time", ""]
    L += md_table(["graph", "strategy", "build_backward (median of 3)", "plan", "peak x plain"],
                  [[f"{p['nodes']:,} nodes", p["what"], fmt_s(p["plan_s"]), p["plan"],
                    "-" if p["peak_ratio"] is None else f"{p['peak_ratio']:.4f}"]
                   for p in res["planning"]])
    L += ["", "### Targets", ""]
    L += md_table(["target", "wanted", "measured", ""],
                  [[t["what"], t["wanted"], t["measured"], {None: "", True: "met", False: "MISSED"}[t["met"]]]
                   for t in res["targets"]])
    L += [f"* differs: {d}" for t in res["targets"] for d in t.get("differ", ())]
    return L


WORKLOAD = harness.Workload("budgets", "perf/bench_budgets.py: memory_budget's choice vs every plan that fits, (g), (h)",
                            run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_budgets.py",
                          description=__doc__.split("\n\n")[0]))
