"""Attention benchmark: the fused ``jg.attention`` against the unfused jitgraph graph and
PyTorch eager (workload ``attention``).

Run from the repository root (or ``jitgraph bench --only attention``):

    python perf/bench_attention.py            # full run (a few minutes)
    python perf/bench_attention.py --quick    # tiny sizes, a smoke test

q, k and v are float32 (B, H, T, d) = (1, 4, 1024, 64) params, and (16, 4, 64, 32) causal (the
char GPT (i)'s heads); each program is timed fwd+bwd
(the loss is the sum of the output times a fixed random tensor, so every output element gets
a gradient), causal and not, at 1 and 2 threads, contenders interleaved, medians.  The
unfused graph is the composition the fused op replaces: ``softmax((q @ k^T) * scale + mask)
@ v``, a -inf mask above the diagonal when causal; it holds (B, H, T, T) scores and
probabilities.  PyTorch runs ``torch.nn.functional.scaled_dot_product_attention`` (its fused
CPU kernel) on the same tensors, eager and under torch.compile.  The planned peaks of the two jitgraph programs are given
beside the times, and the losses and gradients are compared.  The issue's target (reported,
not asserted): the fused op no slower than the unfused graph, with no (T, T) tensor per head
in its plan.
"""
import math
import os
import sys

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

import numpy as np  # noqa: E402

import jitgraph as jg  # noqa: E402

from . import harness  # noqa: E402
from .report import md_by_threads, md_table  # noqa: E402

THREADS = (1, 2)


def sizes(quick):
    return (1, 4, 128, 32) if quick else (1, 4, 1024, 64)


def unfused(q, k, v, causal):
    s = (q @ jg.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        T = q.shape[-2]
        s = s + q.graph.const(np.triu(np.full((T, T), -np.inf), 1))
    return jg.softmax(s) @ v


def program(make, arrays, r, causal):
    """(backward program, q, k, v) for loss = sum(attention(q, k, v) * r)."""
    g = jg.Graph(np.float32)
    q, k, v = (g.param(a, name=n) for a, n in zip(arrays, "qkv"))
    out = make(q, k, v, causal)
    bwd = jg.build_backward(jg.build_forward(jg.sum(out * g.const(r))))
    return bwd, (q, k, v)


def largest_per_head(bwd, heads):
    """The most elements per head of any tensor the program's plan holds."""
    return max(row["bytes"] // bwd.itemsize for row in bwd.nodes()) // heads


def _rel_diff(a, b):
    """Largest |a - b| relative to max(1, largest |b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def chargpt_sizes(quick):
    """(i)'s attention: 16 sequences, 4 heads, T = 64, head dim 32 (causal)."""
    return (2, 2, 16, 16) if quick else (16, 4, 64, 32)


def bench_case(ctx, causal, torch, shape=None):
    B, H, T, d = shape or sizes(ctx.quick)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((B, H, T, d)).astype(np.float32) for _ in range(3)]
    r = rng.standard_normal((B, H, T, d)).astype(np.float32)
    fused, fused_ts = program(lambda q, k, v, c: jg.attention(q, k, v, causal=c), arrays, r, causal)
    plain, plain_ts = program(unfused, arrays, r, causal)
    fns = {"fused": lambda: fused.run(), "unfused": lambda: plain.run()}
    results = {"fused": [float(fused.run())] + [t.grad for t in fused_ts],
               "unfused": [float(plain.run())] + [t.grad for t in plain_ts]}
    if torch is not None:
        F = torch.nn.functional
        tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in arrays)
        tr = torch.from_numpy(r)

        def torch_step():
            for t in (tq, tk, tv):
                t.grad = None
            loss = (F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal) * tr).sum()
            loss.backward()
            return loss
        fns["torch"] = torch_step
        results["torch"] = [float(torch_step())] + [t.grad.numpy().copy() for t in (tq, tk, tv)]

        def sdpa_step(q, k, v, r):
            for t in (q, k, v):
                t.grad = None
            loss = (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * r).sum()
            loss.backward()
            return loss
        compiled = harness.add_torch_compile(ctx, fns, sdpa_step, tq, tk, tv, tr)
    else:
        compiled = "not run: torch is not installed"
    agree = {name: max(_rel_diff(a, b) for a, b in zip(results["fused"], got))
             for name, got in results.items() if name != "fused"}
    res = {"causal": causal, "shape": [B, H, T, d], "torch_compile": compiled,
           "peak_bytes": {"fused": fused.peak_bytes, "unfused": plain.peak_bytes},
           "largest_per_head": {"fused": largest_per_head(fused, B * H), "unfused": largest_per_head(plain, B * H)},
           "max_rel_diff_from_fused": agree}
    res.update(harness.timed_by_threads(ctx, fns, THREADS, ref="fused"))
    return res


def run(ctx):
    return {"title": "attention: fused jg.attention vs the unfused graph and PyTorch eager, fwd+bwd "
                     "(perf/bench_attention.py)",
            "what": "float32 (B, H, T, d) = " + str(tuple(sizes(ctx.quick))) + "; loss = sum(out * r); "
                    "ratio < 1 means the fused op is faster",
            "cases": [bench_case(ctx, causal, ctx.torch) for causal in (False, True)]
            + [bench_case(ctx, True, ctx.torch, chargpt_sizes(ctx.quick))]}


def markdown(res):
    L = []
    for case in res["cases"]:
        B, H, T, d = case["shape"]
        p, big = case["peak_bytes"], case["largest_per_head"]
        L += [f"**{'causal' if case['causal'] else 'not causal'}**, (B, H, T, d) = ({B}, {H}, {T}, {d}):", ""]
        L += md_table(["program", "planned peak", "largest tensor per head (elements)", "T x T"],
                      [[name, f"{p[name] / 2**20:.2f} MiB", big[name], T * T] for name in ("fused", "unfused")]) + [""]
        L += [f"Peak ratio fused / unfused: {p['fused'] / p['unfused']:.3f}. Largest relative difference of "
              "the loss and gradients from the fused op's: "
              + ", ".join(f"{k} {v:.1e}" for k, v in case["max_rel_diff_from_fused"].items()) + ".", ""]
        L += md_by_threads(case, ref="fused") + [""]
        ratios = [f"{e['timing']['ratios']['fused/unfused']['median']:.2f} at {e['threads']} thread"
                  + ("s" if e["threads"] > 1 else "") for e in case["by_threads"]]
        L += ["Fused / unfused fwd+bwd (the issue's target: <= 1): " + ", ".join(ratios) + ".", ""]
        against = [f"{e['timing']['ratios'][f'fused/{who}']['median']:.2f} x {who} at {e['threads']} thread"
                   + ("s" if e["threads"] > 1 else "") for e in case["by_threads"]
                   for who in ("torch", "torch.compile") if f"fused/{who}" in e["timing"]["ratios"]]
        if against:
            L += ["Fused / PyTorch's SDPA fwd+bwd ([3/6]'s target on (i)'s shapes: <= 1.1 x torch.compile): "
                  + ", ".join(against) + f" (torch.compile: {case.get('torch_compile')}).", ""]
    return L[:-1]


WORKLOAD = harness.Workload("attention", "perf/bench_attention.py: fused attention vs the unfused graph and PyTorch",
                            run, markdown)

if __name__ == "__main__":
    sys.exit(harness.main(None, [WORKLOAD], prog="python perf/bench_attention.py",
                          description=__doc__.split("\n\n")[0]))
