"""Workload (k) of ``jitgraph bench``: inference from Python threads.  One ForwardGraph
(a kernel-bound MLP forward) run by 1 Python thread, then by 2 at once, each call on
one kernel thread (``jg.set_num_threads(1)``): calls per second of each and their
ratio.  Every result of every call is checked against the serial result of its input;
wrong results and errors are counted and reported, never raised."""
import math
import os
import statistics
import threading
import time

import numpy as np

from .harness import Target, Workload, threads, time_calls
from .models import chain_weights, jg_chain_forward, torch_chain_forward
from .report import fmt_s, md_table

PYTHON_THREADS = 2
N_INPUTS = 4                # distinct inputs, so a call that reads another call's data gives a wrong result


def calls_per_second(fn, inputs, refs, n_threads, calls):
    """``n_threads`` Python threads, started together, each making ``calls`` calls of
    fn(input) (cycling through the inputs from a different start) and comparing each
    result with refs.  Returns (calls per second, wrong results, errors)."""
    start = threading.Barrier(n_threads + 1)
    tallies = [None] * n_threads

    def worker(t):
        wrong, errors = 0, []
        start.wait()
        for i in range(calls):
            j = (t + i) % len(inputs)
            try:
                out = fn(inputs[j])
            except Exception as e:        # a broken concurrent run is a figure to report, not a crash
                errors.append(f"{type(e).__name__}: {e}")
                continue
            wrong += not np.array_equal(out, refs[j])
        tallies[t] = (wrong, errors)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for w in workers:
        w.start()
    start.wait()                          # threads are started before the clock: only the calls are timed
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    wrong = sum(t[0] for t in tallies)
    errors = [e for t in tallies for e in t[1]]
    return n_threads * calls / seconds, wrong, errors


def contender(ctx, name, fn, inputs):
    """Serial and concurrent samples of one contender, taking turns (order flipping every
    repeat), each after one untimed call; ``calls`` per thread make a serial sample last
    about min_sample_s."""
    refs = [fn(x) for x in inputs]
    t = min(time_calls(lambda: fn(inputs[0]), 1) for _ in range(3))
    calls = max(2, math.ceil(ctx.min_sample_s / max(t, 1e-9)))
    modes = {"1 thread": 1, f"{PYTHON_THREADS} threads": PYTHON_THREADS}
    rates = {m: [] for m in modes}
    wrong = {m: 0 for m in modes}
    errors = {m: [] for m in modes}
    for r in range(ctx.repeats):
        ctx.note(f"{name}: repeat {r + 1}/{ctx.repeats}")
        for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            fn(inputs[0])
            rate, w, e = calls_per_second(fn, inputs, refs, modes[m], calls)
            rates[m].append(rate)
            wrong[m] += w
            errors[m] += e
    serial, conc = rates["1 thread"], rates[f"{PYTHON_THREADS} threads"]
    per = [c / s for c, s in zip(conc, serial)]
    return {"calls_per_thread_per_sample": calls,
            "modes": {m: {"python_threads": modes[m], "calls_per_s_median": statistics.median(rates[m]),
                          "calls_per_s": rates[m], "calls_checked": ctx.repeats * modes[m] * calls,
                          "wrong": wrong[m], "errors": len(errors[m]), "first_errors": errors[m][:3]}
                      for m in modes},
            "ratio": {"median": statistics.median(per), "per_repeat": per}}


def run(ctx):
    n, d, b = (2, 128, 16) if ctx.quick else (4, 1024, 64)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((b, d)).astype(np.float32) for _ in range(N_INPUTS)]
    weights = chain_weights(n, d, inputs[0], rng)
    fwd, x = jg_chain_forward(weights, (b, d))
    res = {"title": f"(k) inference from Python threads: MLP forward x ({b}, {d}) -> {n} x relu(h @ W_i), "
                    f"float32, one ForwardGraph",
           "what": f"calls per second of fwd.run from 1 Python thread, then from {PYTHON_THREADS} Python threads "
                   f"at once on the same ForwardGraph, every call on 1 kernel thread (jg.set_num_threads(1), "
                   f"BLAS limited to 1); ratio = {PYTHON_THREADS}-thread calls/s over 1-thread calls/s per repeat, "
                   f"median.  Each call's result is compared (bit for bit) with the serial result of its input "
                   f"({N_INPUTS} distinct inputs).  torch, if installed: the same forward under "
                   f"torch.inference_mode, torch.set_num_threads(1), as a reference for what the machine allows",
           "sizes": {"layers": n, "d": d, "batch": b, "python_threads": PYTHON_THREADS},
           "cpu_count": os.cpu_count(), "contenders": {}}
    if (os.cpu_count() or 1) < PYTHON_THREADS:
        res["skipped"] = f"{PYTHON_THREADS} Python threads > os.cpu_count() = {os.cpu_count()}"
        return res
    with threads(ctx, 1):
        res["contenders"]["jitgraph"] = contender(ctx, "jitgraph", lambda xb: fwd.run({x: xb}), inputs)
        if ctx.torch is not None:
            res["contenders"]["torch"] = contender(ctx, "torch", torch_chain_forward(ctx.torch, weights), inputs)
    return res


def markdown(res):
    if "skipped" in res:
        return [f"Skipped: {res['skipped']}."]
    rows = []
    for name, c in res["contenders"].items():
        for m, s in c["modes"].items():
            bad = s["wrong"] + s["errors"]
            rows.append([name, m, f"{s['calls_per_s_median']:.1f}", fmt_s(1 / s["calls_per_s_median"]),
                         f"{c['ratio']['median']:.3g}" if s["python_threads"] > 1 else "1",
                         f"{s['calls_checked']:,}",
                         "all equal" if not bad else f"**{s['wrong']} wrong, {s['errors']} errors**"])
    L = md_table(["contender", "Python threads", "calls/s (median)", "time per call", "x 1 thread",
                  "results checked", "vs the serial results"], rows)
    for name, c in res["contenders"].items():
        for m, s in c["modes"].items():
            if s["first_errors"]:
                L += ["", f"{name}, {m}: first errors: " + "; ".join(s["first_errors"])]
    return L


def plot(res, plots, key):
    labels, values = [], []
    for name, c in res["contenders"].items():
        for m, s in c["modes"].items():
            labels.append(f"{name}, {m}")
            values.append(1 / s["calls_per_s_median"])
    if values:
        plots.bars(f"{key}.png", res["title"], labels, values, "wall time per call (s)")


def speedup(res):
    if "skipped" in res:
        return None, "skipped: " + res["skipped"]
    c = res["contenders"]["jitgraph"]
    conc = c["modes"][f"{PYTHON_THREADS} threads"]
    if conc["wrong"] or conc["errors"]:     # a speed-up with wrong answers is no speed-up
        return None, (f"WRONG RESULTS: {conc['wrong']} wrong and {conc['errors']} errors in "
                      f"{conc['calls_checked']:,} concurrent calls (ratio {c['ratio']['median']:.3g} not counted)")
    return c["ratio"]["median"], None


WORKLOAD = Workload("k", "inference from 1 vs 2 Python threads on one ForwardGraph", run, markdown, plot,
                    (Target(f"{PYTHON_THREADS} Python threads / 1, calls per second", 1.6, speedup,
                            at_least=True),))
