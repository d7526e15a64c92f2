"""The ``jitgraph`` command: ``jitgraph demo``, ``jitgraph tour``, ``jitgraph bench``."""
import argparse
import sys

import numpy as np

import jitgraph as jg

from .demo import add_arguments as demo_arguments, main as run_demo


def demo(args):
    return run_demo(args)


def bench(args):
    from .bench import run
    return run(args)


def tour(args):
    """A two-layer network: build, run, and print its node table."""
    rng = np.random.default_rng(0)
    g = jg.Graph(np.float32)
    x = g.input((args.batch, 32), name="x")
    W1 = g.param(rng.standard_normal((32, 64)) * 0.2, name="W1")
    b1 = g.param(np.zeros(64), name="b1")
    W2 = g.param(rng.standard_normal((64, 10)) * 0.2, name="W2")
    h = jg.gelu(x @ W1 + b1).named("h")
    probs = jg.softmax((h @ W2).named("logits")).named("probs")
    fwd = jg.build_forward(probs)
    out = fwd.run({x: rng.standard_normal((args.batch, 32)).astype(np.float32)})
    print("softmax(gelu(x @ W1 + b1) @ W2)\n")
    print(fwd.format_table())
    print(f"\nresult: probs of shape {out.shape}; rows sum to 1: {np.allclose(out.sum(axis=1), 1.0, atol=1e-5)}")
    print(f"arena peak {fwd.peak_bytes} bytes, persistent {fwd.persistent_bytes} bytes")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="jitgraph", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="train a deep MLP on handwritten digits with and without checkpointing")
    demo_arguments(p)
    p.set_defaults(func=demo)
    p = sub.add_parser("tour", help="build a small graph, run it, print its node table and result")
    p.add_argument("--batch", type=int, default=4)
    p.set_defaults(func=tour)
    p = sub.add_parser("bench", help="time named workloads against numpy and PyTorch eager; "
                                     "writes JSON, markdown and plots",
                       description="Time named workloads (a-f, see jitgraph/bench.py) against numpy and "
                                   "PyTorch eager; write results.json, results.md and plots to --out.")
    from .bench import add_arguments as bench_arguments
    bench_arguments(p)
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
