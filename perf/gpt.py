"""Workload (g) of ``jitgraph bench``: a char-level GPT, fwd+bwd, jitgraph beside PyTorch
eager on the same float32 weights, at 1 and at 2 threads for both contenders in the one
run, with jitgraph's per-op profile at each count (``bwd.profile``)."""
import time

import numpy as np

from .agreement import agreement, md_agreement
from .harness import Target, Workload, add_torch_compile, ratio_at, timed_by_threads
from .models import GPTConfig, gpt_weights, gpt_batch, jg_gpt, torch_gpt
from .report import fmt_s, md_by_threads, md_table

THREADS = (1, 2)
FULL = GPTConfig(layers=6, d=192, heads=6, vocab=65, T=128, batch=8)
QUICK = GPTConfig(layers=1, d=32, heads=2, vocab=65, T=16, batch=2)
GRAD_OF = "h0.wq"           # the first block's query weight: its gradient crosses every layer
PROFILE_ROWS = 15           # rows of the profile table in results.md (all of them are in results.json)


def flops(cfg):
    """Matmul flops of one fwd+bwd (backward = 2x forward): the blocks' projections, the
    attention products and the lm head."""
    n = cfg.batch * cfg.T
    per_layer = 2 * n * cfg.d * cfg.d * (4 + 8) + 2 * 2 * cfg.batch * cfg.T * cfg.T * cfg.d
    return 3 * (cfg.layers * per_layer + 2 * n * cfg.d * cfg.vocab)


def run(ctx):
    cfg = QUICK if ctx.quick else FULL
    w = gpt_weights(cfg)
    idx, targets, onehot = gpt_batch(cfg, np.random.default_rng(1))
    ctx.note("build")
    t0 = time.perf_counter()
    bwd, idx_in, targets_in, params = jg_gpt(w, cfg)
    build_s = time.perf_counter() - t0
    feeds = {idx_in: idx, targets_in: onehot}
    jg_loss = float(bwd.run(feeds))
    jg_grad = params[GRAD_OF].grad
    fns = {"jitgraph": lambda: bwd.run(feeds)}
    refs = {}
    if ctx.torch is not None:
        trun, tparams = torch_gpt(ctx.torch, w, cfg)
        ti, tt = ctx.torch.from_numpy(idx), ctx.torch.from_numpy(targets)
        fns["torch"] = lambda: trun(ti, tt)
        refs["torch"] = (trun(ti, tt).item(), tparams[GRAD_OF].grad.numpy().copy())
    compiled = (add_torch_compile(ctx, fns, torch_gpt(ctx.torch, w, cfg)[0], ti, tt) if ctx.torch is not None
                else "not run: torch is not installed")

    def jg_profile():
        ctx.note("profile")
        return bwd.profile(feeds)

    res = timed_by_threads(ctx, fns, THREADS, extras={"loss": lambda: float(bwd.run(feeds)),
                                                      "profile": jg_profile})
    res["torch_compile"] = compiled
    st = bwd.stats()
    res.update({
        "title": f"(g) char-level GPT: {cfg.layers} layers, d = {cfg.d}, {cfg.heads} heads, T = {cfg.T}, "
                 f"B = {cfg.batch}, vocab {cfg.vocab}, float32, fwd+bwd",
        "what": "causal self-attention (a -1e9 mask above the diagonal), pre-norm affine layer norm, exact-GELU "
                "MLP (4d), own lm head, mean cross entropy.  jitgraph: bwd.run (one-hot targets); torch: eager "
                "minGPT-style forward (manual attention, masked_fill, F.softmax, F.layer_norm, F.gelu, "
                "F.cross_entropy on integer targets), loss.backward() with grads set to None first; both on "
                f"the same float32 weights, timed at {' and '.join(map(str, THREADS))} threads each",
        "sizes": {"layers": cfg.layers, "d": cfg.d, "heads": cfg.heads, "T": cfg.T, "batch": cfg.batch,
                  "vocab": cfg.vocab, "params": int(sum(v.size for v in w.values())),
                  "program_nodes": st["n_nodes"], "matmul_gflop": flops(cfg) / 1e9},
        "build_s": build_s,
        "agreement": agreement(jg_loss, jg_grad, refs, GRAD_OF),
        # jitgraph's kernels promise the same bits at any thread count
        "same_loss_every_thread_count": all(e["loss"] == jg_loss for e in res["by_threads"]),
    })
    return res


def md_profile(res, rows=PROFILE_ROWS):
    """jitgraph's time by op and phase at each thread count, slowest (at the first count) first."""
    entries = res["by_threads"]
    if not entries:
        return []
    at = [{(r["op"], r["phase"]): r for r in e["profile"]} for e in entries]
    order = [(r["op"], r["phase"]) for r in entries[0]["profile"]]
    head = ["op", "phase", "nodes"]
    for e in entries:
        head += [f"{e['threads']} thr: time", "share", "ns/element"]
    if len(entries) > 1:
        head.append(f"speed-up {entries[0]['threads']} -> {entries[-1]['threads']} thr")
    table = []
    for key in order[:rows]:
        first = at[0][key]
        row = [key[0], key[1], first["nodes"]]
        for prof in at:
            r = prof.get(key)
            row += ["-", "", ""] if r is None else [fmt_s(r["seconds"]), f"{100 * r['share']:.1f}%",
                                                    f"{r['ns_per_element']:.2f}"]
        if len(entries) > 1:
            last = at[-1].get(key)
            row.append(f"{first['seconds'] / last['seconds']:.2f}x" if last and last["seconds"] > 0 else "-")
        table.append(row)
    totals = [sum(r["seconds"] for r in e["profile"]) for e in entries]
    medians = [e["timing"]["contenders"]["jitgraph"]["median_s"] for e in entries]
    sums = "; ".join(f"{e['threads']} thr: {fmt_s(t)} summed, {fmt_s(m)} bwd.run median"
                     for e, t, m in zip(entries, totals, medians))
    return md_table(head, table) + [
        "", f"jitgraph's profile (bwd.profile: each node run alone, fastest of 3, summed by op and phase), the top "
            f"{min(rows, len(order))} of {len(order)} rows.  Totals: {sums} (the difference is the interpreter's "
            "dispatch and what running nodes back to back shares or saves)."]


def markdown(res):
    s = res["sizes"]
    ratios = []
    for e in res["by_threads"]:
        r = e["timing"]["ratios"].get("jitgraph/torch")
        if r is not None:
            ratios.append(f"{e['threads']} thr {r['median']:.3g}")
    return (md_by_threads(res)
            + ["", "jitgraph / torch: " + (", ".join(ratios) or "torch not available") + ".",
               "", md_agreement(res["agreement"])
               + f"  jitgraph's loss is the same at every thread count: "
                 f"{'yes' if res['same_loss_every_thread_count'] else 'NO'}.",
               "", f"Sizes: {s['params']:,} parameters, {s['program_nodes']:,} program nodes, "
                   f"{s['matmul_gflop']:.2f} GFLOP of matmuls per fwd+bwd; build (graph + build_forward + "
                   f"build_backward) {fmt_s(res['build_s'])}.", ""]
            + md_profile(res))


def plot(res, plots, key):
    plots.by_threads(f"{key}.png", res["title"], res)


WORKLOAD = Workload("g", "char-level GPT, fwd+bwd, at 1 and 2 threads", run, markdown, plot,
                    tuple(Target(f"jitgraph / torch at {n} thread{'s' if n > 1 else ''}", 1.0, ratio_at(n))
                          for n in THREADS))
