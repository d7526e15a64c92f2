"""Workload (j) of ``jitgraph bench``: data-parallel training on Ray, 1 worker against 2
(1 kernel thread each) on a local Ray instance that this workload starts, on two models:

* the GPT of (g) (6 layers, d = 192, T = 128, AdamW) at a global batch of 16 -- each of
  2 workers runs (g)'s program at (g)'s batch of 8 -- and of 8;
* the relu MLP of (c) (16 layers, d = 1024, SGD) at a global batch of 256, the issue's
  example, and of 1024.

For each: samples per second of ``DataParallel.fit`` with 1 and 2 workers, their ratio,
where a step's time goes (``dp.timing()``: the slowest worker's ``bwd.run``, the
optimizer step, the all-reduce), the ratio a free all-reduce would give (the 1-worker
step over the 2-worker compute + optimizer), and the same step in this process without
Ray for reference.  The GPT has 2.7 M params against the MLP's 16.8 M: its all-reduce
moves 11 MB a step against 67 MB, for more compute.

Both DataParallels of a configuration live through its measurement (the Ray instance
declares 3 CPUs so the idle one keeps its actor; an idle actor uses none) and take turns,
the order flipping every repeat.  Ray's workers run at nice 15 by default; here at 0, as
this process, and the object store has 1 GiB.  A process's first touch of a page of the
store faults (a put of 11 MB takes 5 ms instead of 1.3 ms until the process has touched
the whole store), so each DataParallel first trains until its workers have put a store's
worth of gradients: what follows is the steady state of a long training run.  A sample is
one fit of ``steps`` global batches; its samples per second count the steps after the
first (which reloads the workers' data), from ``dp.step_times``.  Both train the same
batches from the same weights, so their params must agree to float32 rounding: the
largest relative difference is reported.  Needs Ray (``pip install "jitgraph[ray]"``);
without it the workload is skipped.
"""
import math
import os
import statistics
from dataclasses import replace

import numpy as np

import jitgraph as jg

from .gpt import FULL as GPT_FULL, QUICK as GPT_QUICK
from .harness import Target, Workload, threads, time_calls
from .models import chain_weights, gpt_weights, jg_gpt
from .report import fmt_s, md_table

WORKERS = (1, 2)
STORE = 1 << 30                # bytes of the object store


def mlp(weights):
    """The chain x (batch, d) -> relu(h @ W_i) -> mean with SGD, as (build, data, label):
    ``build(batch)`` -> (bwd, opt, inputs); ``data(rows, rng)`` -> one array per input."""
    d = weights[0].shape[0]

    def build(batch):
        g = jg.Graph(np.float32)
        x = g.input((batch, d), name="x")
        params = [g.param(w, name=f"W{i}") for i, w in enumerate(weights)]
        h = x
        for W in params:
            h = jg.relu(h @ W)
        bwd = jg.build_backward(jg.build_forward(jg.mean(h)))
        return bwd, jg.optim.SGD(params, lr=1e-3), [x]

    def data(rows, rng):
        return [rng.standard_normal((rows, d)).astype(np.float32)]
    return build, data, f"MLP {len(weights)} x {d}"


def gpt(cfg):
    """The GPT of (g) with AdamW, as ``mlp``: its inputs are the index rows (batch, T) and
    their one-hot next characters (batch, T, vocab), so both have the batch axis first."""
    w = gpt_weights(cfg)

    def build(batch):
        bwd, idx, targets, P = jg_gpt(w, replace(cfg, batch=batch), per_row_targets=True)
        return bwd, jg.optim.AdamW(list(P.values()), lr=1e-4), [idx, targets]

    def data(rows, rng):
        seq = rng.integers(0, cfg.vocab, (rows, cfg.T + 1))
        return [np.ascontiguousarray(seq[:, :-1]), np.eye(cfg.vocab, dtype=np.float32)[seq[:, 1:]]]
    return build, data, f"GPT {cfg.layers} x {cfg.d}"


def one_process(ctx, build, arrays, batch):
    """Seconds per step (bwd.run + opt.step) in this process on 1 thread, no Ray."""
    bwd, opt, inputs = build(batch)
    feeds = {t: a[:batch] for t, a in zip(inputs, arrays)}

    def step():
        bwd.run(feeds)
        opt.step()
    with threads(ctx, 1):
        step()
        calls = max(1, round(ctx.min_sample_s / time_calls(step, 1)))
        return statistics.median(time_calls(step, calls) for _ in range(3))


def measure(ctx, DataParallel, model, batch, steps, rng):
    """One model at one global batch size: the one-process reference, then DataParallel
    on 1 and 2 workers taking turns.  Returns its section of the result."""
    build, make_data, label = model
    arrays = make_data(batch * steps, rng)
    out = {"model": label, "global_batch": batch, "steps_per_fit": steps}
    ctx.note(f"{label}, batch {batch}: one process")
    out["one_process_step_s"] = one_process(ctx, build, arrays, batch)
    dps = {}
    try:
        for w in WORKERS:
            ctx.note(f"{label}, batch {batch}: start {w} worker{'s' if w > 1 else ''}")
            bwd, opt, inputs = build(batch // w)
            dps[w] = (DataParallel(bwd, opt, num_workers=w), inputs)
        grad_bytes = sum(p.size for p in dps[1][0].opt.params) * 4
        rates = {w: [] for w in WORKERS}
        times = {w: [] for w in WORKERS}

        def sample(w, epochs=1):
            dp, inputs = dps[w]
            dp.fit(dict(zip(inputs, arrays)), epochs=epochs, batch_size=batch, seed=0, progress=False)
            rows = dp.step_times[1:]
            times[w] += rows
            return batch * len(rows) / sum(r["step"] for r in rows)
        # epochs until every worker has touched the store (the quick run's tiny models skip it)
        warm = 1 if ctx.quick else math.ceil(STORE / grad_bytes / steps) + 1
        out["warm_up_steps"] = warm * steps
        for w in WORKERS:
            ctx.note(f"{label}, batch {batch}: warm-up {w}")
            sample(w, warm)
            times[w].clear()
        for r in range(ctx.repeats):
            ctx.note(f"{label}, batch {batch}: repeat {r + 1}/{ctx.repeats}")
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
        one, two = out["workers"]["1"]["step_s"], out["workers"]["2"]["step_s"]
        out["ratio_free_all_reduce"] = one["step"] / (two["compute"] + two["optimizer"])
        p1, p2 = dps[1][0].params(), dps[2][0].params()
        out["params_max_rel_diff"] = max(float(np.abs(p1[k] - p2[k]).max() / max(np.abs(p1[k]).max(), 1e-30))
                                         for k in p1)
    finally:
        for dp, _ in dps.values():
            dp.shutdown()
    return out


def run(ctx):
    n, d = (2, 128) if ctx.quick else (16, 1024)
    cfg = GPT_QUICK if ctx.quick else GPT_FULL
    # (model, global batch, steps per fit); the first of each model is its target's
    configs = (("gpt", 2 * cfg.batch, 4 if ctx.quick else 6), ("gpt", cfg.batch, 4 if ctx.quick else 6),
               ("mlp", 32 if ctx.quick else 256, 4 if ctx.quick else 6), ("mlp", 64 if ctx.quick else 1024, 3))
    res = {"title": f"(j) data-parallel training on Ray, 1 vs 2 workers: the GPT of (g) ({cfg.layers} layers, d = "
                    f"{cfg.d}, AdamW) at global batch {configs[0][1]} (and {configs[1][1]}); an MLP x (B, {d}) -> "
                    f"{n} x relu(h @ W_i) -> mean (SGD) at {configs[2][1]} (and {configs[3][1]}); float32",
           "what": "samples per second of DataParallel.fit with 1 worker (program batch = the global batch) and 2 "
                   "workers (half each), 1 kernel thread per worker (jg.set_num_threads(1) in the actor), on a "
                   "local Ray instance (workers at nice 0, not Ray's default 15; a 1 GiB object store, which each "
                   "DataParallel's workers touch all of in a warm-up before the measured fits); median "
                   "over repeats of (steps after the first) x batch / their seconds; ratio per repeat, then "
                   "median.  Step split from dp.timing(): compute = the slowest worker's bwd.run (and its "
                   "thread's CPU time), optimizer = the slowest worker's opt.step, all-reduce = the rest (each "
                   "worker's gradients into the object store, every worker reading and averaging all of "
                   "them, the driver's calls; a lone worker keeps its gradients).  'one process': "
                   "bwd.run + opt.step on the global batch in this process, 1 thread, no Ray.  Targets: the GPT "
                   f"at B = {configs[0][1]} (2 workers each run (g)'s batch) and the MLP at B = {configs[2][1]} "
                   "(the issue's example)",
           "sizes": {"mlp_layers": n, "mlp_d": d, "mlp_params": n * d * d, "gpt": vars(cfg),
                     "cpu_count": os.cpu_count()}}
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
    # --quick: the example alone (the MLP's target config): every DataParallel
    # starts its Ray actors, ~1 s each, which kept bench --quick over 30 s
    todo = (configs[2],) if ctx.quick else configs
    build = {"gpt": lambda: gpt(cfg),
             "mlp": lambda: mlp(chain_weights(n, d, rng.standard_normal((256, d)).astype(np.float32), rng))}
    models = {m: build[m]() for m in dict.fromkeys(m for m, _, _ in todo)}     # only the models todo runs
    started = not ray.is_initialized()
    if started:
        # worker_niceness 0: Ray runs workers at nice 15 by default, which on a shared machine
        # hands their cores to any other process; the one-process reference runs at 0 too.
        # A 1 GiB object store (Ray's default: 30% of the RAM) is touched all over by the warm-up
        ray.init(address="local", num_cpus=sum(WORKERS), include_dashboard=False, log_to_driver=False,
                 object_store_memory=STORE, _system_config={"worker_niceness": 0})
    try:
        res["configs"] = [measure(ctx, DataParallel, models[m], b, steps, rng) for m, b, steps in todo]
    finally:
        if started:
            ray.shutdown()
    res["load_average"] = [load0, os.getloadavg()[0]]
    return res


def _plural(w):
    return f"{w} worker{'s' if str(w) != '1' else ''}"


def _name(c):
    return f"{c['model']}, B = {c['global_batch']}"


def markdown(res):
    if "skipped" in res:
        return [f"Skipped: {res['skipped']}."]
    rows, notes = [], []
    for c in res["configs"]:
        b = c["global_batch"]
        rows.append([f"{_name(c)}: one process, no Ray (1 thread)", f"{b / c['one_process_step_s']:.0f}",
                     fmt_s(c["one_process_step_s"]), "", "", "", "", ""])
        for w, r in c["workers"].items():
            st = r["step_s"]
            rows.append([f"{_name(c)}: DataParallel, {_plural(w)}", f"{r['samples_per_s_median']:.0f}",
                         fmt_s(st["step"]), f"**{c['ratio']['median']:.3g}**" if w != "1" else "1",
                         f"{fmt_s(st['compute'])} ({fmt_s(st['compute_cpu'])} CPU)", fmt_s(st["optimizer"]),
                         fmt_s(st["all_reduce"]), f"{100 * st['all_reduce_share']:.0f}%"])
        per = c["ratio"]["per_repeat"]
        split = "; ".join(f"{_plural(w)}: gradient mean {fmt_s(r['step_s']['mean'])}"
                          for w, r in c["workers"].items())
        notes += ["", f"{_name(c)}: 2 workers / 1 worker per repeat {min(per):.3g} - {max(per):.3g}; with an "
                      f"all-reduce that took no time it would be {c['ratio_free_all_reduce']:.3g} (the 1-worker "
                      f"step over the 2-worker compute + optimizer).  Inside the all-reduce (medians, the slowest "
                      f"worker's) {split}, the rest is the gradients going into the object store and the "
                      f"driver's calls.  Warm-up: {c['warm_up_steps']} steps.  Params after the same batches, 1 vs "
                      f"2 workers: largest relative difference {c['params_max_rel_diff']:.2g} (float32 sums in "
                      f"another order).  Restarts: {sum(r['restarts'] for r in c['workers'].values())}."]
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
        labels.append(f"{_name(c)}, 2 workers / 1")
        values.append(c["ratio"]["median"])
    plots.bars(f"{key}.png", res["title"], labels, values, "samples/s, 2 workers over 1")


def speedup(model):
    def measure(res):
        if "skipped" in res:
            return None, "skipped: " + res["skipped"]
        c = next((c for c in res["configs"] if c["model"].startswith(model)), None)
        if c is None:
            return None, "skipped (--quick)"
        return c["ratio"]["median"], f"{c['ratio_free_all_reduce']:.3g} with a free all-reduce"
    return measure


WORKLOAD = Workload("j", "data-parallel training on Ray, 1 vs 2 workers", run, markdown, plot,
                    (Target("2 workers / 1 worker, samples per second: the GPT of (g), global batch 16 (8 a worker)",
                            1.6, speedup("GPT"), at_least=True),
                     Target("2 workers / 1 worker, samples per second: the MLP, global batch 256 (the issue's example)",
                            1.6, speedup("MLP"), at_least=True)))
