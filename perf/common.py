"""Helpers shared by the perf/ scripts: timing, a table printer, the environment report.

The scripts import it as ``from common import ...`` after putting their own
directory first on sys.path, so it works however they are launched
(``python perf/<name>.py``, with or without PYTHONPATH=.).
"""
import os
import platform
import statistics

import numpy as np

from jitgraph.bench import cpu_model, time_calls  # noqa: F401  (cpu_model: one place for the machine report)


# ---- timing -------------------------------------------------------------------------------

def _inner_count(fns, min_sample_s):
    """Calls per sample so the slowest contender's sample lasts >= min_sample_s
    (keeps timer resolution and per-sample jitter out of fast figures)."""
    # best of 3 single calls, so one stray slow call does not shrink the count
    slowest = max(min(time_calls(fn, 1) for _ in range(3)) for fn in fns)
    return max(1, int(np.ceil(min_sample_s / max(slowest, 1e-9))))


def time_alternating(fns, repeats, min_sample_s):
    """Per-call seconds for each of ``fns``: median over ``repeats`` samples, the
    contenders taking turns inside every repeat.  Each fn is warmed up first.
    Returns (list of seconds, calls per sample)."""
    for fn in fns:
        fn()                                   # warm-up: JIT, caches, allocations
    inner = _inner_count(fns, min_sample_s)
    samples = [[] for _ in fns]
    for r in range(repeats):
        # swap who goes first on alternate repeats so neither is always second
        idx = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in idx:
            samples[i].append(time_calls(fns[i], inner))
    return [statistics.median(s) for s in samples], inner


def minor_page_faults():
    """This process's minor page faults so far (first touches of fresh memory), or
    None where the resource module is missing (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fmt_time(seconds):
    if seconds < 1e-6:
        return f"{seconds * 1e9:.1f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


# ---- output -------------------------------------------------------------------------------

def print_table(title, header, rows):
    """Fixed-width table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def fmt(row):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths)))

    print(f"\n{title}")
    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(fmt(r))


def print_environment(title="Environment"):
    """Versions, CPU, and the BLAS libraries loaded (threadpoolctl, when installed)."""
    import numba
    import scipy

    import jitgraph
    print(f"\n{title}")
    print(f"   python {platform.python_version()} on {platform.platform()}")
    print(f"   CPU: {cpu_model()}, {cpu_count()} usable")
    print(f"   numpy {np.__version__}, numba {numba.__version__}, scipy {scipy.__version__}, "
          f"jitgraph {jitgraph.__version__}")
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        print("   BLAS at run time: threadpoolctl not installed")
        blas = numpy_build_blas()
        if blas:
            print(f"   numpy was built against: {blas} (from np.show_config; scipy, which numba's "
                  "matmul calls, may bundle its own)")
    else:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if not pools:
            print("   BLAS at run time: none loaded (threadpoolctl found no BLAS library)")
        for p in pools:
            print(f"   BLAS at run time: {p.get('internal_api')} {p.get('version')}, "
                  f"{p.get('num_threads')} threads, {p.get('filepath')}")


def cpu_count():
    """CPUs this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def numpy_build_blas():
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:   # older numpy, or a build without this section
        return None
