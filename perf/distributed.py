"""Workload (j) of ``jitgraph bench``: data-parallel training on Ray.  The relu MLP of (c)
-- 16 layers, d = 1024, float32, mean loss, SGD -- at a global batch of 256, trained by
``jitgraph.distributed.DataParallel`` with 1 worker (the program takes 256 rows) and with
2 workers (128 rows each), every worker on 1 kernel thread, on a local Ray instance that
this workload starts: samples per second of each, their ratio, where a step's time goes
(``dp.timing()``: the slowest worker's ``bwd.run``, the optimizer step, the all-reduce),
and the same step in this process without Ray for reference.

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


def run(ctx):
    n, d, batch, steps = (2, 128, 32, 4) if ctx.quick else (16, 1024, 256, 6)
    res = {"title": f"(j) data-parallel training on Ray: MLP x ({batch}, {d}) -> {n} x relu(h @ W_i) -> mean, "
                    f"float32, SGD, 1 vs 2 workers",
           "what": "samples per second of DataParallel.fit with 1 worker (program batch = the global batch) and 2 "
                   "workers (half each), 1 kernel thread per worker (jg.set_num_threads(1) in the actor), on a "
                   "local Ray instance (workers at nice 0, not Ray's default 15; a 1 GiB object store); median "
                   "over repeats of (steps after the first) x batch / their seconds; ratio per repeat, then "
                   "median.  Step split from dp.timing(): compute = the slowest worker's "
                   "bwd.run, optimizer = opt.step on the driver, all-reduce = the rest (params into the object "
                   "store, workers copy them in, gradients back, their mean).  'one process': bwd.run + opt.step "
                   "on the global batch in this process, 1 thread, no Ray",
           "sizes": {"layers": n, "d": d, "global_batch": batch, "steps_per_fit": steps,
                     "params": n * d * d, "cpu_count": os.cpu_count()}}
    try:
        import ray

        from jitgraph.distributed import DataParallel
    except ImportError as e:
        res["skipped"] = f"Ray is not installed ({e}); pip install 'jitgraph[ray]'"
        return res
    if (os.cpu_count() or 1) < max(WORKERS):
        res["skipped"] = f"{max(WORKERS)} workers > os.cpu_count() = {os.cpu_count()}"
        return res
    rng = np.random.default_rng(7)
    X = rng.standard_normal((batch * steps, d)).astype(np.float32)
    weights = chain_weights(n, d, X[:batch], rng)
    ctx.note("one process")
    res["one_process_step_s"] = one_process(ctx, weights, X, batch)
    started = not ray.is_initialized()
    if started:
        # worker_niceness 0: Ray runs workers at nice 15 by default, which on a shared machine
        # hands their cores to any other process; the one-process reference runs at 0 too.
        # A 1 GiB object store (Ray's default: 30% of the RAM) is reused within a few steps:
        # in a bigger one every step's objects land on pages no process has touched yet, and
        # the page faults cost up to 100 ms per 64 MiB put (measured here)
        ray.init(address="local", num_cpus=sum(WORKERS), include_dashboard=False, log_to_driver=False,
                 object_store_memory=1 << 30, _system_config={"worker_niceness": 0})
    dps = {}
    try:
        for w in WORKERS:
            ctx.note(f"start {w} worker{'s' if w > 1 else ''}")
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
            ctx.note(f"warm-up {w}")
            sample(w)
            times[w].clear()
        for r in range(ctx.repeats):
            ctx.note(f"repeat {r + 1}/{ctx.repeats}")
            for w in (WORKERS if r % 2 == 0 else WORKERS[::-1]):
                rates[w].append(sample(w))
        per = [b / a for a, b in zip(rates[1], rates[2])]
        res["workers"] = {str(w): {"samples_per_s_median": statistics.median(rates[w]), "samples_per_s": rates[w],
                                   "step_s": {k: statistics.median(t[k] for t in times[w]) for k in times[w][0]},
                                   "restarts": dps[w][0].restarts}
                          for w in WORKERS}
        for w in WORKERS:
            s = res["workers"][str(w)]["step_s"]
            s["all_reduce_share"] = s["all_reduce"] / s["step"]
        res["ratio"] = {"median": statistics.median(per), "per_repeat": per}
        p1, p2 = dps[1][0].params(), dps[2][0].params()
        res["params_max_rel_diff"] = max(float(np.abs(p1[k] - p2[k]).max() / np.abs(p1[k]).max()) for k in p1)
    finally:
        for dp, _ in dps.values():
            dp.shutdown()
        if started:
            ray.shutdown()
    return res


def markdown(res):
    if "skipped" in res:
        return [f"Skipped: {res['skipped']}."]
    batch = res["sizes"]["global_batch"]
    rows = [["one process, no Ray (1 thread)", f"{batch / res['one_process_step_s']:.0f}",
             fmt_s(res["one_process_step_s"]), "", "", "", "", ""]]
    for w, r in res["workers"].items():
        s = r["step_s"]
        rows.append([f"DataParallel, {w} worker{'s' if w != '1' else ''}", f"{r['samples_per_s_median']:.0f}",
                     fmt_s(s["step"]), f"{res['ratio']['median']:.3g}" if w != "1" else "1",
                     fmt_s(s["compute"]), fmt_s(s["optimizer"]), fmt_s(s["all_reduce"]),
                     f"{100 * s['all_reduce_share']:.0f}%"])
    per = res["ratio"]["per_repeat"]
    split = "; ".join(f"{w} worker{'s' if w != '1' else ''}: params out {fmt_s(r['step_s']['params_out'])}, in "
                      f"{fmt_s(r['step_s']['params_in'])}, gradient mean {fmt_s(r['step_s']['mean'])}"
                      for w, r in res["workers"].items())
    return md_table(["", "samples/s (median)", "time per step", "x 1 worker", "compute (slowest worker)",
                     "optimizer step", "all-reduce", "all-reduce share"], rows) + [
        "", f"2 workers / 1 worker per repeat: {min(per):.3g} - {max(per):.3g}.  Params after the same batches, "
            f"1 vs 2 workers: largest relative difference {res['params_max_rel_diff']:.2g} (float32 sums in "
            f"another order).  Restarts: {sum(r['restarts'] for r in res['workers'].values())}.",
        "", f"Inside the all-reduce (medians): {split}; the rest is Ray moving the gradients back and "
            f"calling the workers."]


def plot(res, plots, key):
    if "skipped" in res:
        return
    labels = ["one process"] + [f"{w} worker{'s' if w != '1' else ''}" for w in res["workers"]]
    values = [res["one_process_step_s"]] + [r["step_s"]["step"] for r in res["workers"].values()]
    plots.bars(f"{key}.png", res["title"], labels, values, f"median time per global batch of "
                                                           f"{res['sizes']['global_batch']} (s)")


def speedup(res):
    if "skipped" in res:
        return None, "skipped: " + res["skipped"]
    return res["ratio"]["median"], None


WORKLOAD = Workload("j", "data-parallel training on Ray, 1 vs 2 workers", run, markdown, plot,
                    (Target("2 workers / 1 worker, samples per second", 1.6, speedup, at_least=True),))
