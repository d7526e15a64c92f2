"""Workload (j) of ``jitgraph bench``: data-parallel training on Ray.  The relu MLP of (c)
-- 16 layers, d = 1024, float32, mean loss, SGD -- at a global batch of 256, trained by
``jitgraph.distributed.DataParallel`` with 1 worker (the program takes 256 rows) and with
2 workers (128 rows each), every worker on 1 kernel thread, on a local Ray instance that
this workload starts: samples per second of each, their ratio, where a step's time goes
(``dp.timing()``: the slowest worker's ``bwd.run``, the optimizer step, the all-reduce),
and the same step in this process without Ray for reference.  The same again at a global
batch of 1024: the all-reduce moves the same bytes (every worker's gradients) against 4x
the compute.

Both DataParallels live through the whole workload (the Ray instance declares 3 CPUs so
the idle one keeps its actor; an idle actor uses none) and take turns, the order flipping
every repeat.  Ray's workers run at nice 15 by default; here at 0, as this process, and
the object store has 1 GiB (reused within a few steps: no page faults).  A
sample is one fit of ``steps`` global batches; its samples per second count the steps
after the first (which reloads the workers' data), from ``dp.step_times``.  Both train
the same batches from the same weights, so their params must agree to float32 rounding:
the largest relative difference is reported.  Needs Ray (``pip install "jitgraph[ray]"``);
without it the workload is skipped.
"""
import os
import statistics

import numpy as np

import jitgraph as jg

from .harness import Target, Workload, threads, time_calls
from .models import chain_weights
from .report import fmt_s, md_table

WORKERS = (1, 2)


def mlp(weights, batch):
    """The chain x (batch, d) -> relu(h @ W_i) -> mean with SGD: (bwd, opt, x)."""
    g = jg.Graph(np.float32)
    x = g.input((batch, weights[0].shape[0]), name="x")
    params = [g.param(w, name=f"W{i}") for i, w in enumerate(weights)]
    h = x
    for W in params:
        h = jg.relu(h @ W)
    bwd = jg.build_backward(jg.build_forward(jg.mean(h)))
    return bwd, jg.optim.SGD(params, lr=1e-3), x


def one_process(ctx, weights, X, batch):
    """Seconds per step (bwd.run + opt.step) in this process on 1 thread, no Ray."""
    bwd, opt, x = mlp(weights, batch)
    feeds = {x: X[:batch]}

    def step():
        bwd.run(feeds)
        opt.step()
    with threads(ctx, 1):
        step()
        calls = max(1, round(ctx.min_sample_s / time_calls(step, 1)))
        return statistics.median(time_calls(step, calls) for _ in range(3))


def measure(ctx, DataParallel, weights, batch, steps, rng):
    """One global batch size: the one-process reference, then DataParallel on 1 and 2
    workers taking turns.  Returns its section of the result."""
    d = weights[0].shape[0]
    X = rng.standard_normal((batch * steps, d)).astype(np.float32)
    out = {"global_batch": batch, "steps_per_fit": steps}
    ctx.note(f"batch {batch}: one process")
    out["one_process_step_s"] = one_process(ctx, weights, X, batch)
    dps = {}
    try:
        for w in WORKERS:
            ctx.note(f"batch {batch}: start {w} worker{'s' if w > 1 else ''}")
            bwd, opt, x = mlp(weights, batch // w)
            dps[w] = (DataParallel(bwd, opt, num_workers=w), x)
        rates = {w: [] for w in WORKERS}
        times = {w: [] for w in WORKERS}

        def sample(w):
            dp, x = dps[w]
            dp.fit({x: X}, epochs=1, batch_size=batch, seed=0, progress=False)
            rows = dp.step_times[1:]
            times[w] += rows
            return batch * len(rows) / sum(r["step"] for r in rows)
        for w in WORKERS:
            ctx.note(f"batch {batch}: warm-up {w}")
            sample(w)
            times[w].clear()
        for r in range(ctx.repeats):
            ctx.note(f"batch {batch}: repeat {r + 1}/{ctx.repeats}")
            for w in (WORKERS if r % 2 == 0 else WORKERS[::-1]):
                rates[w].append(sample(w))
        per = [b / a for a, b in zip(rates[1], rates[2])]
        out["workers"] = {str(w): {"samples_per_s_median": statistics.median(rates[w]), "samples_per_s": rates[w],
                                   "step_s": {k: statistics.median(t[k] for t in times[w]) for k in times[w][0]},
                                   "restarts": dps[w][0].restarts}
                          for w in WORKERS}
        for w in WORKERS:
            st = out["workers"][str(w)]["step_s"]
            st["all_reduce_share"] = st["all_reduce"] / st["step"]
        out["ratio"] = {"median": statistics.median(per), "per_repeat": per}
        p1, p2 = dps[1][0].params(), dps[2][0].params()
        out["params_max_rel_diff"] = max(float(np.abs(p1[k] - p2[k]).max() / np.abs(p1[k]).max()) for k in p1)
    finally:
        for dp, _ in dps.values():
            dp.shutdown()
    return out


def run(ctx):
    n, d = (2, 128) if ctx.quick else (16, 1024)
    configs = ((32, 4), (64, 4)) if ctx.quick else ((256, 6), (1024, 3))   # (global batch, steps per fit)
    res = {"title": f"(j) data-parallel training on Ray: MLP x (B, {d}) -> {n} x relu(h @ W_i) -> mean, "
                    f"float32, SGD, 1 vs 2 workers, global batch B = {configs[0][0]} (and {configs[1][0]})",
           "what": "samples per second of DataParallel.fit with 1 worker (program batch = the global batch) and 2 "
                   "workers (half each), 1 kernel thread per worker (jg.set_num_threads(1) in the actor), on a "
                   "local Ray instance (workers at nice 0, not Ray's default 15; a 1 GiB object store); median "
                   "over repeats of (steps after the first) x batch / their seconds; ratio per repeat, then "
                   "median.  Step split from dp.timing(): compute = the slowest worker's bwd.run (and its "
                   "thread's CPU time), optimizer = the slowest worker's opt.step, all-reduce = the rest (each "
                   "worker's gradients into the object store, every worker reading and averaging all of "
                   "them, the driver's calls).  'one process': "
                   "bwd.run + opt.step on the global batch in this process, 1 thread, no Ray.  The target is "
                   f"read at B = {configs[0][0]}; B = {configs[1][0]} shows the same all-reduce against 4x the "
                   "compute",
           "sizes": {"layers": n, "d": d, "params": n * d * d, "cpu_count": os.cpu_count()}}
    try:
        import ray

        from jitgraph.distributed import DataParallel
    except ImportError as e:
        res["skipped"] = f"Ray is not installed ({e}); pip install 'jitgraph[ray]'"
        return res
    if (os.cpu_count() or 1) < max(WORKERS):
        res["skipped"] = f"{max(WORKERS)} workers > os.cpu_count() = {os.cpu_count()}"
        return res
    load0 = os.getloadavg()[0]
    rng = np.random.default_rng(7)
    weights = chain_weights(n, d, rng.standard_normal((configs[0][0], d)).astype(np.float32), rng)
    started = not ray.is_initialized()
    if started:
        # worker_niceness 0: Ray runs workers at nice 15 by default, which on a shared machine
        # hands their cores to any other process; the one-process reference runs at 0 too.
        # A 1 GiB object store (Ray's default: 30% of the RAM) is reused within a few steps:
        # in a bigger one every step's objects land on pages no process has touched yet, and
        # the page faults cost up to 100 ms per 64 MiB put (measured here)
        ray.init(address="local", num_cpus=sum(WORKERS), include_dashboard=False, log_to_driver=False,
                 object_store_memory=1 << 30, _system_config={"worker_niceness": 0})
    try:
        res["configs"] = [measure(ctx, DataParallel, weights, b, steps, rng) for b, steps in configs]
    finally:
        if started:
            ray.shutdown()
    res["load_average"] = [load0, os.getloadavg()[0]]
    return res


def _plural(w):
    return f"{w} worker{'s' if str(w) != '1' else ''}"


def markdown(res):
    if "skipped" in res:
        return [f"Skipped: {res['skipped']}."]
    rows, notes = [], []
    for c in res["configs"]:
        b = c["global_batch"]
        rows.append([f"B = {b}: one process, no Ray (1 thread)", f"{b / c['one_process_step_s']:.0f}",
                     fmt_s(c["one_process_step_s"]), "", "", "", "", ""])
        for w, r in c["workers"].items():
            st = r["step_s"]
            rows.append([f"B = {b}: DataParallel, {_plural(w)}", f"{r['samples_per_s_median']:.0f}", fmt_s(st["step"]),
                         f"**{c['ratio']['median']:.3g}**" if w != "1" else "1",
                         f"{fmt_s(st['compute'])} ({fmt_s(st['compute_cpu'])} CPU)", fmt_s(st["optimizer"]),
                         fmt_s(st["all_reduce"]), f"{100 * st['all_reduce_share']:.0f}%"])
        per = c["ratio"]["per_repeat"]
        split = "; ".join(f"{_plural(w)}: gradient mean {fmt_s(r['step_s']['mean'])}"
                          for w, r in c["workers"].items())
        notes += ["", f"B = {b}: 2 workers / 1 worker per repeat {min(per):.3g} - {max(per):.3g}; inside the "
                      f"all-reduce (medians, the slowest worker's) {split}, the rest is the gradients going into "
                      f"the object store and the driver's calls.  Params after the same batches, 1 vs 2 workers: largest relative difference "
                      f"{c['params_max_rel_diff']:.2g} (float32 sums in another order).  Restarts: "
                      f"{sum(r['restarts'] for r in c['workers'].values())}."]
    return md_table(["", "samples/s (median)", "time per step", "x 1 worker", "compute: slowest worker's run",
                     "optimizer step", "all-reduce", "all-reduce share"], rows) + notes + [
        "", f"A worker's run with less CPU time than wall time waited for a core (other processes).  Load "
            f"average (1 min) when the workload started and ended: {res['load_average'][0]:.2f}, "
            f"{res['load_average'][1]:.2f} ({res['sizes']['cpu_count']} cores)."]


def plot(res, plots, key):
    if "skipped" in res:
        return
    labels, values = [], []
    for c in res["configs"]:
        b = c["global_batch"]
        labels.append(f"B = {b}, one process")
        values.append(c["one_process_step_s"] / b)
        for w, r in c["workers"].items():
            labels.append(f"B = {b}, {_plural(w)}")
            values.append(1 / r["samples_per_s_median"])
    plots.bars(f"{key}.png", res["title"], labels, values, "time per sample (s)")


def speedup(res):
    if "skipped" in res:
        return None, "skipped: " + res["skipped"]
    c = res["configs"][0]
    return c["ratio"]["median"], None


WORKLOAD = Workload("j", "data-parallel training on Ray, 1 vs 2 workers", run, markdown, plot,
                    (Target("2 workers / 1 worker, samples per second, global batch 256", 1.6, speedup,
                            at_least=True),))
