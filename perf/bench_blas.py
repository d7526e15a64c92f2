"""Each product of (c), (g) and (i), as jitgraph runs it, against every BLAS on the host.

For every matmul node of the three fwd+bwd programs, one thread: the node alone, timed
in its program (as ``profile`` times nodes, but several times back to back, operands
warm in cache as in the libraries' loop), and the same product -- the same M, N, K
and transposes, a batched one's matrices one after another -- by each BLAS library present, called
directly; in rounds, every contender in each, the fastest of each kept (nodes of one
shape: their median).  [3/6]'s target: every product >= 0.95x the
GFLOP/s of the fastest library.  Distinct products are listed once, with their count.

    python -m perf.bench_blas [--quick] [--out perf/results/blas.md]
"""
import argparse
import time

import numpy as np

import jitgraph as jg
from jitgraph import blas
from jitgraph.interpreter import run_nodes
from jitgraph.ops.linear import FLAT, MatmulIP
from jitgraph.program import _timed
from jitgraph.registry import MATMUL, table
from jitgraph.threads import enter_run, held_blas

from .environment import cpu_model, cpu_vendor
from .models import GPTConfig, chain_weights, gpt_batch, gpt_weights, jg_gpt

REPEATS = 4               # runs of each node per round, back to back
ROUNDS = 5                # rounds; each contender's fastest counts


def programs(quick):
    """(name, program, feeds) of (c), (g), (i) as the bench builds them."""
    from .chargpt import config, jg_chargpt
    rng = np.random.default_rng(1)
    d, n = (128, 2) if quick else (1024, 16)
    xb = rng.standard_normal((64, d)).astype(np.float32)
    g = jg.Graph(np.float32)
    x = g.input(xb.shape, name="x")
    h = x
    for W in chain_weights(n, d, xb, rng):
        h = jg.relu(h @ g.param(W))
    out = [("(c) MLP", jg.build_backward(jg.build_forward(jg.mean(h))), {x: xb})]
    cfg = GPTConfig(layers=1, d=32, heads=2, vocab=65, T=16, batch=2) if quick else \
        GPTConfig(layers=6, d=192, heads=6, vocab=65, T=128, batch=8)
    g, idx, tg, _ = jg_gpt(gpt_weights(cfg), cfg)
    i, t, onehot = gpt_batch(cfg, rng)
    out.append(("(g) GPT", g, {idx: i, tg: onehot}))
    icfg, _ = config(quick, 96)
    ib, iidx, itg, _ = jg_chargpt(gpt_weights(icfg), icfg)
    seq = rng.integers(0, icfg.vocab, (icfg.batch, icfg.T + 1))
    out.append(("(i) char GPT", ib, {iidx: seq[:, :-1].copy(), itg: seq[:, 1:].copy()}))
    return out


def product_of(nodes, n):
    """(M, N, K, trans_a, trans_b, matrices) of matmul node n, as ops/linear._product calls the BLAS."""
    so = nodes.shape[n]
    sa, sb = nodes.shape[nodes.src[n, 0]], nodes.shape[nodes.src[n, 1]]
    ta, tb = int(nodes.ip[n, MatmulIP.trans_a]), int(nodes.ip[n, MatmulIP.trans_b])
    N = int(so[3])
    flat = int(nodes.ip[n, MatmulIP.mode]) == FLAT
    one = flat or so[0] * so[1] == 1 or (sb[0] * sb[1] == 1 and ta == 0 and sa[0] == so[0] and sa[1] == so[1])
    K = (int(np.prod(sa)) // int(sa[3]) if ta else int(sa[3])) if flat else int(sa[2] if ta else sa[3])
    M = int(np.prod(so)) // N if one else int(so[2])
    return M, N, K, ta, tb, 1 if one else int(so[0] * so[1])


def node_seconds(prog, feeds, positions):
    """Seconds of each run-order position alone (fastest of REPEATS), one thread."""
    prog.run(feeds)
    prog._bind(feeds, prog.mem)
    g = prog.graph
    runners, natives, blocks, chunks = prog._kernels(prog.mem, 0, table("split"))
    args = (prog.loc, prog.off, prog.mem, g.store, 0, runners, natives, table("split"), blocks,
            prog._fused.code, chunks)
    enter_run()
    clock = time.perf_counter
    empty = prog.run_order[:0]
    with prog._blas_held(natives):
        base = min(_timed(run_nodes, prog.run_table, empty, args, clock) for _ in range(50))
        best = {t: np.inf for t in positions}
        for t in positions:                  # back to back, operands warm in cache -- as the libraries are timed
            for _ in range(REPEATS):
                best[t] = min(best[t], _timed(run_nodes, prog.run_table, prog.run_order[t:t + 1], args, clock) - base)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models (a smoke test)")
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = ap.parse_args(argv)
    jg.set_num_threads(1)
    libs = blas.available()
    rng = np.random.default_rng(0)
    lines = [f"CPU: {cpu_model()} ({cpu_vendor()}), one thread; jitgraph's BLAS: {blas.describe(np.float32)}", "",
             "| model | product (M, N, K, op) | count | jitgraph GFLOP/s | "
             + " | ".join(f"{x.name} GFLOP/s" for x in libs) + " | jitgraph / fastest |",
             "|" + "---|" * (5 + len(libs))]
    worst = []
    for name, prog, feeds in programs(args.quick):
        nodes = prog.graph.nodes
        order = prog.run_order.tolist()
        positions = {t: product_of(nodes, n) for t, n in enumerate(order) if int(nodes.op[n]) == MATMUL}
        shapes = sorted(set(positions.values()), key=lambda s: -s[0] * s[1] * s[2] * s[5])
        ours = {t: np.inf for t in positions}
        theirs = {(shape, x.name): np.inf for shape in shapes for x in libs}
        for _ in range(ROUNDS):                  # contenders side by side, round after round: drift hits all
            for t, sec in node_seconds(prog, feeds, list(positions)).items():
                ours[t] = min(ours[t], sec)
            for shape in shapes:
                for x in libs:
                    with held_blas(x.setter):                 # one thread, as jitgraph runs it
                        sec = blas._seconds(x, np.float32, ("shape",) + shape[:5], rng, shape[5])
                    theirs[shape, x.name] = min(theirs[shape, x.name], sec)
        for shape in shapes:
            M, N, K, ta, tb, mats = shape
            flop = 2.0 * M * N * K * mats
            mine = [ours[t] for t, s in positions.items() if s == shape]
            jg_rate = flop / float(np.median(mine)) / 1e9
            rates = [flop / theirs[shape, x.name] / 1e9 for x in libs]
            ratio = jg_rate / max(rates)
            worst.append(ratio)
            op = ("A^T" if ta else "A") + " " + ("B^T" if tb else "B") + (f", {mats} matrices" if mats > 1 else "")
            lines.append(f"| {name} | ({M}, {N}, {K}) {op} | {len(mine)} | {jg_rate:.1f} | "
                         + " | ".join(f"{v:.1f}" for v in rates) + f" | {ratio:.3f} |")
    lines += ["", f"Lowest jitgraph / fastest library: {min(worst):.3f}; median {float(np.median(worst)):.3f} "
                  f"over {len(worst)} distinct products (target >= 0.95 each)."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
