"""The report of a run: results.json, results.md (targets, one section per workload,
the environment) and PNG plots; shared markdown pieces for the workloads' sections."""
import json
import os

from . import environment

QUICK_NOTE = " (--quick: tiny sizes, not a measurement)"
CONTENDER_LABEL = {"numpy": "numpy eager", "torch": "torch eager"}


def fmt_s(s):
    """Seconds in ns, us, ms or s: the one time format of every report."""
    if s is None:
        return "-"
    if s < 1e-6:
        return f"{s * 1e9:.1f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def md_table(header, rows):
    """A markdown table; cells are str()-ed, a "|" in them escaped (max|diff|)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [line(header), "|" + "---|" * len(header)] + [line(row) for row in rows]


def md_timing(timing, ref, ref_over=True):
    """The table of a ``harness.summarize`` result: medians, spreads and ratios to ``ref``."""
    head = f"{ref} / contender" if ref_over else f"contender / {ref}"
    rows = []
    for name, c in timing["contenders"].items():
        ratio = timing["ratios"].get(f"{ref}/{name}" if ref_over else f"{name}/{ref}")
        shown, spread = ("1", "") if name == ref else (
            (f"{ratio['median']:.4g}", f"{min(ratio['per_repeat']):.3g} - {max(ratio['per_repeat']):.3g}")
            if ratio else ("-", ""))
        rows.append([CONTENDER_LABEL.get(name, name), fmt_s(c["median_s"]),
                     f"{fmt_s(c['min_s'])} - {fmt_s(c['max_s'])}", c["calls_per_sample"], shown, spread])
    return md_table(["contender", "median", "min - max", "calls/sample",
                     f"{head} (median of per-repeat ratios)", "ratio min - max"], rows)


def md_by_threads(res, ref="jitgraph"):
    """The tables of a ``harness.timed_by_threads`` result, one per thread count."""
    L = []
    for entry in res["by_threads"]:
        n = entry["threads"]
        L += [f"At {n} thread{'s' if n > 1 else ''} (every contender):", ""] + md_timing(entry["timing"], ref) + [""]
    for n in res["skipped_threads"]:
        L += [f"{n} threads: skipped, more than os.cpu_count() = {res['cpu_count']}.", ""]
    if "torch_compile" in res:
        L += [f"torch.compile (inductor, compiled in the warm-up): {res['torch_compile']}.", ""]
    return L[:-1]


# ---- targets ------------------------------------------------------------------------------------

def targets(workloads, results):
    """One row per target of every registered workload, run or not."""
    rows = []
    for w in workloads:
        for t in w.targets:
            row = {"workload": w.key, "what": t.what, "limit": t.limit, "measured": None, "met": None}
            if w.key not in results:
                row["note"] = "not run"
            else:
                row["measured"], note = t.measure(results[w.key])
                if note:
                    row["note"] = note
            if t.at_least:
                row["at_least"] = True
            if row["measured"] is not None:
                row["met"] = row["measured"] >= t.limit if t.at_least else row["measured"] <= t.limit
                if not row["met"]:
                    pct = 100 * abs(row["measured"] / t.limit - 1)
                    row["note"] = f"by {pct:.{1 if pct < 10 else 0}f}% ({row['measured'] / t.limit:.3g}x the target)"
            rows.append(row)
    return rows


def fmt_target(row):
    sign = ">=" if row.get("at_least") else "<="
    if row["what"].endswith("(s)"):
        return f"{sign} {fmt_s(row['limit'])}", fmt_s(row["measured"])
    return f"{sign} {row['limit']:g}", "-" if row["measured"] is None else f"{row['measured']:.3g}"


def md_targets(rows):
    table = []
    for row in rows:
        wanted, measured = fmt_target(row)
        status = {None: "", True: "met", False: "MISSED"}[row["met"]]
        status = " ".join(x for x in (status, row.get("note")) if x)
        table.append([f"({row['workload']})", row["what"], wanted, measured, status])
    return ["## Targets", ""] + md_table(["workload", "target", "wanted", "measured", "status"], table)


# ---- the files ------------------------------------------------------------------------------------

def markdown(report, registry):
    env = report["env"]
    L = [f"# jitgraph bench results ({report['started']})", "",
         f"Command: `{report['command']}`  ", f"Total time: {report['duration_s']:.0f} s; "
         f"{report['repeats']} repeats per figure{QUICK_NOTE if report['quick'] else ''}; "
         f"threads: {env['threads']} for every contender.", ""]
    if report["targets"]:
        L += md_targets(report["targets"]) + [""]
    for key, res in report["results"].items():
        L += [f"## {res['title']}", "", res["what"] + ".", ""] + registry[key].markdown(res) + [""]
    L += environment.markdown(env)
    return "\n".join(L) + "\n"


class Plots:
    """PNG files in the results folder (matplotlib is optional: ``available`` is False
    without it, and no workload plots)."""

    def __init__(self, out):
        self.out = out
        self.paths = []
        try:
            import matplotlib
        except ImportError:
            self.plt = None
            return
        matplotlib.use("Agg")               # files only, no display
        import matplotlib.pyplot as plt
        self.plt = plt

    @property
    def available(self):
        return self.plt is not None

    def figure(self, figsize=(7, 3)):
        return self.plt.subplots(figsize=figsize)

    def save(self, fig, name):
        path = os.path.join(self.out, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        self.plt.close(fig)
        self.paths.append(path)

    def bars(self, name, title, labels, values, xlabel):
        """Horizontal bars of seconds, labelled; log scale when they span 30x or more."""
        fig, ax = self.figure()
        ax.barh(labels[::-1], values[::-1], color="tab:blue")
        for i, v in enumerate(values[::-1]):
            ax.text(v, i, " " + fmt_s(v), va="center", fontsize=8)
        if max(values) > 30 * min(values):
            ax.set_xscale("log")         # a 50x spread would hide the fast bars
        ax.set_xlabel(xlabel)
        ax.margins(x=0.25)
        ax.set_title(title, fontsize=8)
        self.save(fig, name)

    def by_threads(self, name, title, res, xlabel="median time per fwd+bwd (s)"):
        """Bars of every contender at every thread count of a ``harness.timed_by_threads`` result."""
        labels, values = [], []
        for entry in res["by_threads"]:
            for contender, c in entry["timing"]["contenders"].items():
                labels.append(f"{CONTENDER_LABEL.get(contender, contender)}, {entry['threads']} thr")
                values.append(c["median_s"])
        if values:
            self.bars(name, title, labels, values, xlabel)

    def timing(self, name, title, timing, xlabel="median time per fwd+bwd (s)"):
        """Bars of a ``harness.summarize`` result's medians."""
        c = timing["contenders"]
        self.bars(name, title, [CONTENDER_LABEL.get(n, n) for n in c], [v["median_s"] for v in c.values()], xlabel)


def write(report, registry, out):
    """results.json, results.md and the plots; returns (markdown, plot paths)."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=float)
    md = markdown(report, registry)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    plots = Plots(out)
    if plots.available:
        for key, res in report["results"].items():
            if registry[key].plot is not None:
                registry[key].plot(res, plots, key)
    return md, plots.paths
