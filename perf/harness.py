"""The benchmark harness: workloads, timing, and one run from the command line.

A workload is a ``Workload``: a key (``--only`` selects by it), ``run(ctx)`` returning a
JSON-able dict with at least ``title`` and ``what``, a markdown renderer of that dict,
and optionally plots and targets.  perf/run.py registers all of them (``jitgraph
bench``); each perf/bench_*.py also runs its own alone.

How figures are taken (``interleaved``): every contender is run once as a warm-up; then,
in each of ``--repeats`` (>= 5) repeats, the contenders take turns (the order flips
every repeat), each making one untimed call and then timing enough back-to-back calls to
last ``min_sample_s`` (0.2 s; 5 ms with --quick).  A figure is the median over the
repeats; a ratio is taken per repeat and then its median.  All contenders share one
thread count (``--threads``): torch through ``torch.set_num_threads``, jitgraph's kernels
through ``jg.set_num_threads``, every BLAS and OpenMP pool through threadpoolctl.  A
workload that compares thread counts runs its figures inside ``threads(ctx, n)``, which
sets all three to n for the block (``timed_by_threads``: one table per count).

Results go to ``--out DIR`` (default ``perf/results/<timestamp>/`` in a checkout, else
``./jitgraph-bench-results/<timestamp>/``): ``results.json``, ``results.md`` and PNG plots.
"""
import argparse
import gc
import math
import os
import shlex
import shutil
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Optional

import scipy.linalg  # noqa: F401  -- loads scipy's BLAS (jitgraph's matmul) so the thread limits reach it

import jitgraph as jg

from . import environment, report

MIN_REPEATS = 5
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- workloads ------------------------------------------------------------------------------

@dataclass
class Ctx:
    """What every workload gets: sizes mode, timing settings, torch (or None), a
    callback to show progress."""
    quick: bool
    repeats: int
    min_sample_s: float
    threads: int
    torch: object
    note: Callable[[str], None]
    torch_compile: bool = False       # torch.compile as a contender where a workload offers it


@dataclass
class Target:
    """A figure the issue asks for, reported as met or missed (never asserted).
    ``measure(result)`` returns (measured value or None, note or None); a ``what``
    ending in "(s)" is in seconds.  Met is measured <= limit, or >= with ``at_least``."""
    what: str
    limit: float
    measure: Callable[[dict], tuple]
    at_least: bool = False


@dataclass
class Workload:
    key: str
    help: str
    run: Callable[[Ctx], dict]
    markdown: Callable[[dict], list]                # result -> lines of its report section
    plot: Optional[Callable] = None                 # (result, report.Plots, key) -> None
    targets: tuple = ()


# ---- timing ---------------------------------------------------------------------------------

def time_calls(fn, calls):
    """Seconds per call of ``calls`` back-to-back calls of fn."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def interleaved(ctx, fns):
    """Per-call seconds of each contender in ``fns`` (name -> callable), one sample per
    repeat, contenders taking turns inside each repeat.  Returns {name: [seconds]} and
    {name: calls per sample}."""
    names = list(fns)
    for name in names:
        ctx.note(f"warm-up {name}")
        fns[name]()
    calls = {}
    for name in names:
        # each contender gets its own call count, so a fast one is not timed on a single
        # call just because a slow one is in the same table
        t = min(time_calls(fns[name], 1) for _ in range(3))
        calls[name] = max(1, math.ceil(ctx.min_sample_s / max(t, 1e-9)))
    samples = {name: [] for name in names}
    for r in range(ctx.repeats):
        ctx.note(f"repeat {r + 1}/{ctx.repeats}")
        gc.collect()                  # collect between repeats, never inside a sample (as timeit)
        gc.disable()
        try:
            for name in (names if r % 2 == 0 else names[::-1]):
                # one untimed call first: the first call after another contender ran is
                # measured up to 2x slower here (that contender's BLAS threads still
                # spinning, its data in the caches); it is not this contender's speed
                fns[name]()
                samples[name].append(time_calls(fns[name], calls[name]))
        finally:
            gc.enable()
    return samples, calls


def summarize(samples, calls, ref="jitgraph", ref_over=True):
    """Medians per contender and the median of per-repeat ratios: ref / contender
    (``ref_over``) or contender / ref."""
    contenders = {name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s),
                         "samples_s": s, "calls_per_sample": calls[name]}
                  for name, s in samples.items()}
    ratios = {}
    for name, s in samples.items():
        if name != ref:
            top, bottom, key = (samples[ref], s, f"{ref}/{name}") if ref_over else (s, samples[ref], f"{name}/{ref}")
            per = [a / b for a, b in zip(top, bottom)]
            ratios[key] = {"median": statistics.median(per), "per_repeat": per}
    return {"contenders": contenders, "ratios": ratios}


def timed(ctx, fns, ref="jitgraph", ref_over=True):
    """``interleaved`` then ``summarize``."""
    return summarize(*interleaved(ctx, fns), ref=ref, ref_over=ref_over)


def add_torch_compile(ctx, fns, step, *args, key="torch.compile"):
    """Add ``torch.compile(step)`` called on ``args`` (a fresh torch step function: forward,
    ``loss.backward()``) to ``fns`` when it can run; returns what happened, for the report.
    It compiles (forward and backward) in the warm-up calls, so no timed call compiles."""
    if ctx.torch is None:
        return "not run: torch is not installed"
    if not ctx.torch_compile:
        return "not run: --quick (compiling takes a minute or more; --torch-compile runs it)"
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "not run: no C++ compiler (torch.compile's CPU code needs one)"
    compiled = ctx.torch.compile(step)
    for _ in range(2):
        compiled(*args)
    fns[key] = lambda: compiled(*args)
    return "ran"


# ---- thread counts ----------------------------------------------------------------------------

def blas_limits(n):
    """threadpoolctl's limit of every BLAS and OpenMP pool to n (a context manager that
    restores them), or a no-op without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=n)


def set_jg_threads(n):
    """jg.set_num_threads(n), or all the cores Numba may use where n is more; returns
    the count set."""
    try:
        return jg.set_num_threads(n)
    except jg.GraphError:
        return jg.set_num_threads()


@contextmanager
def threads(ctx, n):
    """Every contender on n threads inside the block: torch, jitgraph's kernels and
    numpy's BLAS; the run's count (ctx.threads) again after it."""
    limits = blas_limits(n)   # taken first: its exit restores the pools as they were before the block
    with limits:
        jg.set_num_threads(n)     # its kernels' count (it sets the BLAS pools to n as well)
        if ctx.torch is not None:
            ctx.torch.set_num_threads(n)
        try:
            yield
        finally:
            if ctx.torch is not None:
                ctx.torch.set_num_threads(ctx.threads)
            set_jg_threads(ctx.threads)   # as run() set it; then the limits' exit restores the pools


def thread_counts(counts):
    """(the counts this machine can run, the ones above os.cpu_count()): those would
    time threads queuing for cores, not a contender."""
    cores = os.cpu_count() or 1
    return [n for n in counts if n <= cores], [n for n in counts if n > cores]


def timed_by_threads(ctx, fns, counts, ref="jitgraph", extras=None):
    """``timed`` inside ``threads(ctx, n)`` for each count: {"by_threads": [{"threads": n,
    "timing": ...}], "skipped_threads": [...]}.  ``extras`` ({name: callable}) run once
    per count after its timing, on its threads; each result is kept under its name."""
    run, skipped = thread_counts(counts)
    out = {"by_threads": [], "skipped_threads": skipped, "cpu_count": os.cpu_count()}
    for n in run:
        ctx.note(f"{n} thread{'s' if n > 1 else ''}")
        with threads(ctx, n):
            entry = {"threads": n, "timing": timed(ctx, fns, ref=ref)}
            for name, fn in (extras or {}).items():
                entry[name] = fn()
        out["by_threads"].append(entry)
    return out


def ratio_at(n, key="jitgraph/torch"):
    """A Target measure: the median ratio ``key`` at n threads of a ``timed_by_threads`` result."""
    def measure(res):
        if n in res["skipped_threads"]:
            return None, f"skipped: {n} threads > os.cpu_count() = {res['cpu_count']}"
        entry = next(e for e in res["by_threads"] if e["threads"] == n)
        ratio = entry["timing"]["ratios"].get(key)
        return (None, "torch not available") if ratio is None else (ratio["median"], None)
    return measure


def minor_faults():
    """This process's minor page faults so far (first touches of fresh memory), or None
    where the resource module is missing (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---- the command line -------------------------------------------------------------------------

def default_out():
    """perf/results/<timestamp>/ in a checkout (this file in perf/ beside pyproject.toml);
    installed, ./jitgraph-bench-results/<timestamp>/ of the current folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if os.path.basename(HERE) == "perf" and os.path.isfile(os.path.join(os.path.dirname(HERE), "pyproject.toml")):
        return os.path.join(HERE, "results", stamp)
    return os.path.join(os.getcwd(), "jitgraph-bench-results", stamp)


def add_arguments(p, workloads, default):
    others = [w.key for w in workloads if w.key not in default]
    names = ",".join(default) + (f" (the default); named only: {','.join(others)}" if others else "")
    p.add_argument("--quick", action="store_true", help="tiny sizes, a smoke test: under 30 s on 2 cores once the cache is warm (25 s on an Intel Xeon)")
    p.add_argument("--only", default=None, help=f"comma-separated workloads to run, or 'all', of: {names}")
    p.add_argument("--out", default=None, help="results folder (default perf/results/<timestamp>/ in a "
                                               "checkout, else ./jitgraph-bench-results/<timestamp>/)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed repeats per figure (default 7, 5 with --quick; at least {MIN_REPEATS})")
    p.add_argument("--threads", type=int, default=None, help="threads for every contender (default os.cpu_count())")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out even when it is installed")
    p.add_argument("--torch-compile", action="store_true",
                   help="time torch.compile even with --quick (it is a contender of (c), (g), (h), (i) by default)")
    p.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def load_torch(skip):
    if skip:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


def command_line(prog, args, set_vars):
    """The equivalent command (however it was launched), with the OpenBLAS variables
    that were in force."""
    cmd = shlex.split(prog)
    for flag in ("quick", "no_torch", "torch_compile", "no_torch_compile", "no_progress"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    for opt in ("only", "out", "repeats", "threads"):
        if getattr(args, opt) is not None:
            cmd += ["--" + opt, str(getattr(args, opt))]
    prefix = " ".join(f"{v}={shlex.quote(os.environ[v])}" for v in set_vars)
    return (prefix + " " if prefix else "") + shlex.join(cmd)


def selected(only, registry, default, prog):
    if not only:
        return list(default)
    keys = [k.strip() for k in only.split(",") if k.strip()]
    if keys == ["all"]:
        return list(registry)
    bad = [k for k in keys if k not in registry]
    if bad:
        raise SystemExit(f"{prog}: unknown workload(s) {bad}; choose from {','.join(registry)} or all")
    return keys


class Progress:
    """A tqdm bar over the workloads (tqdm is optional: without it, no bar)."""

    def __init__(self, total, disable):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = None if tqdm is None else tqdm(total=total, disable=disable, file=sys.stderr, unit="workload")

    def write(self, text):
        if self.bar is None:
            print(text, file=sys.stderr)
        else:
            self.bar.write(text, file=sys.stderr)

    def note(self, text):
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def start(self, key):
        if self.bar is not None:
            self.bar.set_description(f"({key})")

    def done(self):
        if self.bar is not None:
            self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run(args, workloads, default=None, prog="jitgraph bench"):
    registry = {w.key: w for w in workloads}
    keys = selected(args.only, registry, default or list(registry), prog)
    repeats = max(MIN_REPEATS, args.repeats or (5 if args.quick else 7))
    count = args.threads or os.cpu_count() or 1    # not `threads`: that is the context manager
    out = os.path.abspath(args.out or default_out())
    os.makedirs(out, exist_ok=True)

    torch = load_torch(args.no_torch)
    progress = Progress(len(keys), args.no_progress)
    jg_threads = set_jg_threads(count)     # before the limits: it limits the BLAS pools too
    if jg_threads != count:
        progress.write(f"note: jitgraph runs on {jg_threads} threads, all Numba may use ({count} asked)")
    limits = blas_limits(count)
    if torch is not None:
        torch.set_num_threads(count)

    load = environment.load_average()
    if load and load[0] >= 1:
        # a busy core makes a BLAS or OpenMP pool wait for it: 2-thread figures on a
        # 2-core machine with one core busy come out 10-100x slow
        progress.write(f"note: load average {load[0]:.2f} before the run: other processes are busy; figures on "
                       f"more threads than idle cores will be slow and noisy")
    set_vars = [v for v in environment.OPENBLAS_VARS if os.environ.get(v)]
    if set_vars:
        progress.write(f"note: {', '.join(set_vars)} set; they may slow OpenBLAS.  For a benchmark run "
                       f"`env {' '.join('-u ' + v for v in set_vars)} {prog} ...`")
    ctx = Ctx(quick=args.quick, repeats=repeats, min_sample_s=0.005 if args.quick else 0.2, threads=count,
              torch=torch, note=progress.note,
              torch_compile=(args.torch_compile or not args.quick) and not args.no_torch_compile)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    results = {}
    with limits:
        env = environment.probe(torch, count)   # inside the limits: records the thread counts in force
        env["jitgraph_threads"] = jg_threads
        for key in keys:
            progress.start(key)
            results[key] = registry[key].run(ctx)
            progress.done()
    progress.close()
    rep = {"command": command_line(prog, args, set_vars), "argv": sys.argv, "started": started,
           "duration_s": time.perf_counter() - t0, "quick": args.quick, "repeats": repeats, "out": out,
           "env": env, "results": results, "targets": report.targets(workloads, results)}
    env["load_average_at_end"] = environment.load_average()
    md, plots = report.write(rep, registry, out)
    print(md)
    print(f"written to {out}: results.json, results.md" + "".join(", " + os.path.basename(p) for p in plots))
    return 0


def main(argv=None, workloads=(), default=None, prog="jitgraph bench", description=None):
    """Parse ``argv`` and run: ``default`` lists the keys run without --only (all)."""
    default = list(default or [w.key for w in workloads])
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(p, workloads, default)
    return run(p.parse_args(argv), workloads, default, prog)
