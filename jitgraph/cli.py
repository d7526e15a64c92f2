"""The jitgraph command: jitgraph demo | tour | info | warmup | bench (jitgraph COMMAND --help for each)."""
import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any, List, Optional

import numpy as np

import jitgraph as jg

from . import _cache, _target, blas, simd, threads
from .demo import add_arguments as demo_arguments, main as run_demo
from .warmup import COMMON, DTYPES, warmup as fill

PERF = "jitgraph._perf"
# a checkout's perf/ folder, next to this jitgraph/ (the wheel ships it as jitgraph/_perf/)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKOUT_PERF = os.path.join(CHECKOUT, "perf")


def demo(args: argparse.Namespace) -> int:
    return run_demo(args)


def perf_package() -> Any:
    """The benchmark harness as the package jitgraph._perf: the perf/ folder of the
    checkout this jitgraph runs from, else the copy the wheel installs."""
    if PERF not in sys.modules and os.path.isfile(os.path.join(CHECKOUT, "pyproject.toml")) \
            and os.path.isfile(os.path.join(CHECKOUT_PERF, "harness.py")):
        spec = importlib.util.spec_from_file_location(PERF, os.path.join(CHECKOUT_PERF, "__init__.py"),
                                                      submodule_search_locations=[CHECKOUT_PERF])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[PERF] = module
        spec.loader.exec_module(module)
    return importlib.import_module(PERF)


def bench(argv: List[str]) -> int:
    """``jitgraph bench ...``: the harness parses its own arguments."""
    perf_package()
    return importlib.import_module(PERF + ".run").main(argv)


def tour(args: argparse.Namespace) -> int:
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


def info(args: argparse.Namespace) -> int:
    """What jitgraph runs on here: version, CPU, threads, the BLAS chosen and why."""
    if args.measure:
        blas.forget_choice()
    print(f"jitgraph {jg.__version__} ({os.path.dirname(os.path.abspath(jg.__file__))})")
    print(f"CPU: {blas.cpu_description()}; {threads.max_threads()} threads "
          f"(Numba's {threads.LAYER} layer)")
    print(f"loops: {_target.describe()}; convolution tiles: {512 if simd.WIDE else 256}-bit")
    print(f"compiled-code cache: {_cache.CACHE_DIR}")
    for dtype in (np.float32, np.float64) if args.measure else (np.float32,):
        print(f"BLAS for {np.dtype(dtype).name}: {blas.describe(dtype)}")
        measured = blas.timings(dtype)
        if measured:
            names = list(measured["seconds"])
            print(f"  {'GFLOP/s, one thread':24s}" + "".join(f"{n:>10s}" for n in names))
            for c, M, N, K, _, _ in blas.SHAPE_CLASSES:
                print(f"  {c:24s}" + "".join(f"{2 * M * N * K / measured['seconds'][n][c] / 1e9:10.1f}"
                                             for n in names))
            print(f"  {'mean time / fastest':24s}" + "".join(f"{measured['score'][n]:10.3f}" for n in names))
            print("  each bucket of products calls: " + ", ".join(
                f"{blas.bucket_name(b)} {x.name}" for b, x in enumerate(blas.by_bucket(dtype))))
    for lib in blas.available():
        print(f"  {lib.name}: {lib.version}, {lib.kernel} kernels, {lib.path}")
    print(f"(JITGRAPH_BLAS={'|'.join(blas.NAMES)} forces one; `pip install \"jitgraph[mkl]\"` adds MKL, "
          f"`jitgraph info --measure` times them again)")
    return 0


def warmup(args: argparse.Namespace) -> int:
    """Compile the graph passes and every op's kernels into the cache, on all cores."""
    dtypes = list(DTYPES) if args.all else list(dict.fromkeys(args.dtype))
    got = fill(dtypes, progress=not args.no_progress, ops=COMMON if args.common else None)
    print(f"jitgraph warmup: {int(got['functions'])} kernels compiled for {', '.join(dtypes)} "
          f"in {got['seconds']:.1f} s; cache: {_cache.CACHE_DIR}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="jitgraph", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="train a deep MLP on handwritten digits with and without checkpointing")
    demo_arguments(p)
    p.set_defaults(func=demo)
    p = sub.add_parser("tour", help="build a small graph, run it, print its node table and result")
    p.add_argument("--batch", type=int, default=4)
    p.set_defaults(func=tour)
    p = sub.add_parser("info", help="print the version, the CPU and the BLAS chosen for products (and why)")
    p.add_argument("--measure", action="store_true",
                   help="time every BLAS present again (float32 and float64) and show the figures")
    p.set_defaults(func=info)
    p = sub.add_parser("warmup", help="compile every kernel into the cache ahead of time, on all cores "
                                      "(for CI images, Docker builds, clusters)")
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"],
                   help="the dtypes whose kernels to compile (default: float32)")
    p.add_argument("--all", action="store_true", help="every dtype (float32 and float64)")
    p.add_argument("--common", action="store_true",
                   help="only the common kernels (MLPs, transformers: what an install compiles)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=warmup)
    # no options of its own: what follows `bench` goes to the harness (perf/), help included
    sub.add_parser("bench", add_help=False, help="time named workloads against numpy and PyTorch eager; "
                                                 "writes JSON, markdown and plots (jitgraph bench --help)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return bench(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
