"""Fusion side by side (issue [2/6]): jitgraph with groups and without, beside PyTorch
eager and torch.compile, same float32 weights, at 1 and 2 threads, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m perf.fusion [--rounds 7] [--quick]

Workloads: the char GPT of the issue (4 layers, d 128, T 64, batch 16, ``jg.attention``,
integer targets: perf/chargpt.py), the bench's GPT (g) (perf/gpt.py: softmax attention,
one-hot targets), ResNet (h) (perf/resnet.py) and the ResNet-20-like net without batch norm
(perf/bench_conv.py's stack, 3 blocks a stage), fwd+bwd.  Three jitgraph programs:
the default (``fuse="auto"``, ``remat="auto"``), every group formed and every value backward
reads saved (``fuse=True, remat=False``) and unfused saving everything (before [2/6]).  Timed as
``jitgraph bench`` times (harness.timed: contenders take turns in every round, so a slow
spell of the machine falls on all; a ratio is the median over rounds of jitgraph's time
over the other's), every contender on the same threads (harness.threads).  Also: the non-GEMM share of jitgraph's profile
(everything but matmul and conv2d) and the planned peaks (no checkpoints, sqrt), fused
and unfused.  torch.compile needs a C++ compiler; it is skipped (and said so) without.
"""
import argparse
import json
import os
import sys

import numpy as np

import jitgraph as jg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from perf import bench_conv, chargpt, models, resnet  # noqa: E402
from perf import gpt as gpt_g  # noqa: E402
from perf.environment import cpu_model  # noqa: E402
from perf.harness import Ctx, add_torch_compile, threads, timed  # noqa: E402

PRODUCTS = ("matmul", "conv2d", "conv2d_weight")
VARIANTS = {"default": dict(),                             # build_backward's defaults: fuse="auto", remat="auto"
            "fused, saving all": dict(fuse=True, remat=False),   # every group, every value backward reads saved
            "unfused": dict(fuse=False, remat=False)}        # every node alone, everything saved: before [2/6]


def _programs(build, *values):
    """{variant: (bwd, feeds)}: ``build(**kw)`` returns (bwd, its inputs ..., more) and ``values``
    feed those inputs in order."""
    out = {}
    for name, kw in VARIANTS.items():
        bwd, *inputs = build(**kw)
        out[name] = (bwd, dict(zip(inputs, values)))
    return out


def gpt(quick):
    text, chars = chargpt.corpus()
    cfg, _ = chargpt.config(quick, len(chars))
    w = chargpt.gpt_weights(cfg)
    codes = np.array([chars.index(c) for c in text], np.int64)
    idx, tgt = chargpt.windows(codes, cfg, cfg.batch, np.random.default_rng(0))
    build = lambda **kw: chargpt.jg_chargpt(w, cfg, **kw)      # noqa: E731
    programs = _programs(build, idx, tgt)

    def torch_run(torch):
        run, _ = chargpt.torch_chargpt(torch, w, cfg)
        ti, tt = torch.from_numpy(idx), torch.from_numpy(tgt)
        return run, (ti, tt)
    title = f"char GPT: {cfg.layers} layers, d {cfg.d}, T {cfg.T}, batch {cfg.batch}, jg.attention, float32"
    return title, programs, torch_run, lambda **kw: build(**kw)[0]


def gpt_bench(quick):
    """(g): the bench's GPT (6 layers, d 192, T 128, batch 8), attention unfused (mask const, softmax)."""
    cfg = gpt_g.QUICK if quick else gpt_g.FULL
    w = models.gpt_weights(cfg)
    idx, targets, onehot = models.gpt_batch(cfg, np.random.default_rng(1))
    build = lambda **kw: models.jg_gpt(w, cfg, **kw)           # noqa: E731
    programs = _programs(build, idx, onehot)

    def torch_run(torch):
        run, _ = models.torch_gpt(torch, w, cfg)
        return run, (torch.from_numpy(idx), torch.from_numpy(targets))
    title = f"(g) GPT: {cfg.layers} layers, d {cfg.d}, T {cfg.T}, batch {cfg.batch}, softmax attention, float32"
    return title, programs, torch_run, lambda **kw: build(**kw)[0]


def res(quick):
    cfg = resnet.QUICK if quick else resnet.FULL
    weights, stats = resnet.resnet_weights(cfg)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((cfg.batch, 3, cfg.size, cfg.size)).astype(np.float32)
    labels = rng.integers(0, 10, cfg.batch)
    build = lambda **kw: resnet.jg_resnet(weights, stats, cfg, **kw)   # noqa: E731
    programs = _programs(build, images, labels)

    def torch_run(torch):
        run, _, _ = resnet.torch_resnet(torch, weights, stats, cfg)
        return run, (torch.from_numpy(images), torch.from_numpy(labels))
    title = f"(h) ResNet-{6 * cfg.n + 2}: batch {cfg.batch}, {cfg.size}x{cfg.size}, float32"
    return title, programs, torch_run, lambda **kw: build(**kw)[0]


def resnet20(quick):
    """The ResNet-20-like net of issue [3/6]: perf/bench_conv.py's stack with 3 blocks a stage (no
    batch norm: conv, relu, residual adds, stride-2 projections), batch 32 on 32x32 images."""
    blocks, batch = (1, 4) if quick else (3, 32)
    w = bench_conv.resnet_weights(blocks)
    rng = np.random.default_rng(1)
    images = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    build = lambda **kw: bench_conv.jg_resnet(w, batch, blocks, **kw)   # noqa: E731
    programs = _programs(build, images, labels)

    def torch_run(torch):
        run, _ = bench_conv.torch_resnet(torch, w, blocks)
        return run, (torch.from_numpy(images), torch.from_numpy(labels))
    title = f"ResNet-{6 * blocks + 2}-like, no batch norm: batch {batch}, 32x32, float32"
    return title, programs, torch_run, lambda **kw: build(**kw)[0]


def _bits(bwd, feeds):
    """The loss and every gradient of a run, as bytes."""
    loss = np.asarray(bwd.run(feeds)).tobytes()
    return [loss] + [bwd.grad(jg.Tensor(bwd.graph, p)).tobytes() for p in bwd.params]


def non_gemm_share(bwd, feeds):
    rows = bwd.profile(feeds, repeats=3)
    # an epilogue runs a convolution with the elementwise nodes that read it, in one pass whose
    # parts are not timed apart: it counts as the product (so the share is a lower bound)
    return 1.0 - sum(r["share"] for r in rows if r["op"] in PRODUCTS or r["op"].startswith("epilogue(")), rows


def workload(make, quick, rounds, torch):
    title, programs, torch_run, rebuild = make(quick)
    out = {"title": title, "by_threads": [], "peaks": {}}
    for name, (bwd, _) in programs.items():
        sqrt = rebuild(checkpoints="sqrt", **VARIANTS[name])
        out["peaks"][name] = {"none": bwd.peak_bytes, "sqrt": sqrt.peak_bytes, "groups": bwd.stats()["n_groups"],
                              "recomputed": bwd.stats()["n_recomputed"],
                              "fused nodes": bwd.stats()["n_fused"], "nodes": bwd.stats()["n_nodes"]}
    fused, feeds = programs["default"]
    unfused, ufeeds = programs["unfused"]
    saving, sfeeds = programs["fused, saving all"]
    want = _bits(unfused, ufeeds)
    out["bits_equal"] = all(_bits(p, f) == want for p, f in ((fused, feeds), (saving, sfeeds)))
    ctx = Ctx(quick=quick, repeats=rounds, min_sample_s=0.005 if quick else 0.2, threads=os.cpu_count(),
              torch=torch, note=lambda _: None, torch_compile=True)
    fns = {"jitgraph": lambda: fused.run(feeds), "fused, saving all": lambda: saving.run(sfeeds),
           "unfused": lambda: unfused.run(ufeeds)}
    out["torch_compile"] = "not run: torch is not installed"
    if torch is not None:
        eager_fn, targs = torch_run(torch)
        fns["torch eager"] = lambda: eager_fn(*targs)
        step, args = torch_run(torch)     # its own copy of the weights
        out["torch_compile"] = add_torch_compile(ctx, fns, step, *args)
    for n in (1, 2):
        if n > os.cpu_count():
            continue
        with threads(ctx, n):             # every contender, and the BLAS pools, on n threads
            t = timed(ctx, fns)
            share_f, rows = non_gemm_share(fused, feeds)
            share_u, _ = non_gemm_share(unfused, ufeeds)
        out["by_threads"].append({"threads": n,
                                  "median_s": {k: c["median_s"] for k, c in t["contenders"].items()},
                                  "ratios": {k: r["median"] for k, r in t["ratios"].items()},
                                  "non_gemm_share": {"fused": share_f, "unfused": share_u}, "profile": rows[:12]})
    return out


def markdown(results, cpu):
    lines = [f"CPU: {cpu}", ""]
    for r in results:
        lines += [f"### {r['title']}", "", f"default, fused saving all and unfused give the same bits: "
                  f"{r['bits_equal']}; torch.compile: {r['torch_compile']}", "",
                  "| threads | jitgraph (default) | fused, saving all | unfused | torch eager | torch.compile | "
                  "jitgraph/fused saving all | jitgraph/unfused | jitgraph/eager | jitgraph/compile | "
                  "non-GEMM share default / unfused |",
                  "|---" * 11 + "|"]
        for e in r["by_threads"]:
            m, q = e["median_s"], e["ratios"]

            def ms(k):
                return f"{1e3 * m[k]:.1f} ms" if k in m else "-"

            def rt(k):
                return f"{q[k]:.3f}" if k in q else "-"
            lines.append(f"| {e['threads']} | {ms('jitgraph')} | {ms('fused, saving all')} | {ms('unfused')} | "
                         f"{ms('torch eager')} | {ms('torch.compile')} | {rt('jitgraph/fused, saving all')} | "
                         f"{rt('jitgraph/unfused')} | {rt('jitgraph/torch eager')} | "
                         f"{rt('jitgraph/torch.compile')} | {e['non_gemm_share']['fused']:.1%} / "
                         f"{e['non_gemm_share']['unfused']:.1%} |")
        lines += ["", "| program | planned peak, no checkpoints | sqrt | groups | fused nodes | recomputed | nodes |",
                  "|---|---|---|---|---|---|---|"]
        base = r["peaks"]["unfused"]
        for name, p in r["peaks"].items():
            lines.append(f"| {name} | {p['none'] / 1e6:.2f} MB ({p['none'] / base['none']:.3f}x) | "
                         f"{p['sqrt'] / 1e6:.2f} MB ({p['sqrt'] / base['sqrt']:.3f}x) | {p['groups']} | "
                         f"{p['fused nodes']} | {p['recomputed']} | {p['nodes']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="tiny models: checks the script, measures nothing")
    ap.add_argument("--only", choices=("gpt", "g", "resnet", "resnet20"), default=None,
                    help="gpt: the char GPT of the issue; g: the bench's GPT (g); resnet: (h); "
                         "resnet20: the ResNet-20-like net without batch norm")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    makes = [m for k, m in (("gpt", gpt), ("g", gpt_bench), ("resnet", res), ("resnet20", resnet20))
             if args.only in (None, k)]
    results = [workload(m, args.quick, args.rounds, torch) for m in makes]
    print(markdown(results, cpu_model()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
