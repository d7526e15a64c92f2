"""Looking at graphs: Graphviz DOT pictures, HTML node tables, memory timelines.

Every node kind has its own colour and shape, and every gradient node says where
it came from ("grad of b . mul src0": the rule of forward node b's op for its
source slot 0), so a backward graph can be read on its own.  Recomputed copies
are joined to their originals by dashed edges.
"""
import html
from typing import Any, Optional, Sequence

import numpy as np

from .emit import RULE_ACCUMULATE, RULE_COPY, RULE_ZERO
from .ir import (F_CHECKPOINT, F_CONST, F_GRAD, F_INPUT, F_LOSS, F_OUTPUT, F_PARAM, F_PARAM_GRAD, F_RECOMPUTED,
                 flag_names)
from .registry import LEAF, OPS

# kind -> (fill colour, shape, legend text)
STYLE = {
    "input": ("#cfe8ff", "invhouse", "input (fed at run time)"),
    "param": ("#ffd966", "box3d", "param (trainable)"),
    "const": ("#e6e6e6", "note", "const"),
    "op": ("#ffffff", "ellipse", "forward op"),
    "output": ("#b7e1cd", "doubleoctagon", "output"),
    "loss": ("#f4a6a6", "doubleoctagon", "loss"),
    "grad": ("#d9ead3", "box", "gradient node (rule that made it)"),
    "param_grad": ("#93c47d", "box", "a param's gradient"),
    "recomputed": ("#fce5cd", "ellipse", "recomputed copy (dashed: its original)"),
}


def node_kind(flags):
    if flags & F_RECOMPUTED:
        return "recomputed"
    if flags & F_PARAM_GRAD:
        return "param_grad"
    if flags & F_GRAD:
        return "grad"
    if flags & F_LOSS:
        return "loss"
    if flags & F_INPUT:
        return "input"
    if flags & F_PARAM:
        return "param"
    if flags & F_CONST:
        return "const"
    if flags & F_OUTPUT:
        return "output"
    return "op"


def describe(graph, n):
    """One line saying what node n is; gradient nodes say where they came from."""
    nodes = graph.nodes
    flags = int(nodes.flags[n])
    op = OPS[int(nodes.op[n])].name
    origin, rule = int(nodes.origin[n]), int(nodes.rule[n])
    if flags & F_RECOMPUTED:
        return f"recompute {graph.label(origin)}"
    if flags & F_GRAD and origin >= 0:
        if op == "const" and rule == -1:
            return f"grad of {graph.label(origin)} · seed 1"
        if rule == RULE_ACCUMULATE:
            return f"grad of {graph.label(origin)} · accumulate"
        if rule == RULE_COPY:
            return f"grad of {graph.label(origin)} · copy"
        if rule == RULE_ZERO:
            return f"grad of {graph.label(origin)} · zero"
        return f"grad of {graph.label(origin)} · {OPS[int(nodes.op[origin])].label} src{rule}"
    return graph.names.get(n, "")


def params_text(graph, n):
    """Node n's parameters by name (``axis=3 eps=1e-05``), as its op declares them; a
    leaf's store offset is left out."""
    nodes = graph.nodes
    spec = OPS[int(nodes.op[n])]
    if spec.kind == LEAF:
        return ""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in spec.params(nodes.ip[n], nodes.fp[n]).items())


def _q(text):
    return '"' + _esc(text) + '"'


def to_dot(graph, order, max_nodes=300, fold_forward=None, title=None, legend=True, rankdir="TB", param_of=None,
           groups=None):
    """DOT text for the nodes of ``order`` (execution order).

    ``max_nodes``: draw at most this many (the last ones, where the interest
    usually is) and say how many were left out.  ``fold_forward``: a set of
    forward node ids drawn as one box ``forward pass (N nodes)``; backward nodes
    reading any of them get one edge from that box.  ``param_of``: {gradient node:
    param node}, to label each param's gradient with the param it belongs to.
    ``groups``: {group node: its members} (fuse.py), each drawn as one cluster.
    """
    param_of = param_of or {}
    nodes = graph.nodes
    order = [int(n) for n in order]
    folded = set(fold_forward or ())
    shown = [n for n in order if n not in folded]
    omitted = 0
    if max_nodes is not None and len(shown) > max_nodes:
        omitted = len(shown) - max_nodes
        shown = shown[-max_nodes:]
    visible = set(shown)
    lines = [f"digraph {_q(title or 'jitgraph')} {{",
             f"  rankdir={rankdir}; nodesep=0.25; ranksep=0.35;",
             '  node [fontname="Helvetica", fontsize=10, style=filled, penwidth=1.2];',
             '  edge [color="#555555", arrowsize=0.6];']
    if title:
        lines.append(f"  labelloc=t; label={_q(title)}; fontname=\"Helvetica\";")
    if folded:
        lines.append(f'  forward [label={_q(f"forward pass ({len(folded)} nodes)")}, shape=folder, '
                     'fillcolor="#eeeeee"];')
    if omitted:
        lines.append(f'  omitted [label={_q(f"... {omitted} earlier nodes not drawn")}, shape=plaintext, style=""];')
    for n in shown:
        flags = int(nodes.flags[n])
        kind = node_kind(flags)
        fill, shape, _ = STYLE[kind]
        shape_text = "×".join(str(d) for d in graph.shape_of(n)) or "scalar"
        head = describe(graph, n)
        op = OPS[int(nodes.op[n])].label
        parts = [f"#{n} {head}", f"{op} [{shape_text}]"] if head else [f"#{n} {op} [{shape_text}]"]
        if n in param_of:
            parts.append(f"= gradient of param {graph.label(param_of[n])}")
        label = "\\n".join(_esc(part) for part in parts)
        extra = f", tooltip={_q(params_text(graph, n))}" if params_text(graph, n) else ""
        if flags & F_CHECKPOINT:
            extra += ", penwidth=3, color=\"#cc0000\""
        if kind == "recomputed":
            extra += ", style=\"filled,dashed\""
        if kind == "param_grad":
            extra += ", peripheries=2"
        lines.append(f'  n{n} [label="{label}", fillcolor="{fill}", shape={shape}{extra}];')
    for root, members in (groups or {}).items():
        inside = [m for m in members if m in visible]
        if inside:
            names = ", ".join(OPS[int(nodes.op[m])].name for m in members)
            # an epilogue: elementwise members in the output pass of a convolution (ops/group.py)
            what = "epilogue" if any(OPS[int(nodes.op[m])].epilogue for m in members) else "group"
            lines.append(f'  subgraph cluster_group{root} {{ label={_q(f"{what} #{root}: {names}")}; fontsize=9; '
                         'style="rounded,filled"; fillcolor="#f4f4ff"; color="#7777cc"; '
                         + " ".join(f"n{m};" for m in inside) + " }")
    seen_fold = set()
    for n in shown:
        for s in nodes.sources(n):
            if s in visible:
                lines.append(f"  n{s} -> n{n};")
            elif s in folded and n not in seen_fold:
                seen_fold.add(n)
                lines.append(f"  forward -> n{n} [style=bold];")
        if nodes.flags[n] & F_RECOMPUTED:
            o = int(nodes.origin[n])
            if o in visible:
                lines.append(f'  n{o} -> n{n} [style=dashed, color="#e69138", constraint=false];')
    if legend:
        kinds = {node_kind(int(nodes.flags[n])) for n in shown}
        lines.append('  subgraph cluster_legend { label="legend"; fontsize=10; style=rounded; color="#999999";')
        prev = None
        for kind, (fill, shape, text) in STYLE.items():
            if kind not in kinds:
                continue
            lines.append(f'    legend_{kind} [label={_q(text)}, fillcolor="{fill}", shape={shape}, fontsize=9];')
            if prev:
                lines.append(f"    legend_{prev} -> legend_{kind} [style=invis];")
            prev = kind
        if any(nodes.flags[n] & F_CHECKPOINT for n in shown):
            lines.append('    legend_ck [label="checkpoint (kept)", shape=ellipse, fillcolor="#ffffff", '
                         'penwidth=3, color="#cc0000", fontsize=9];')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _esc(text):
    """Text safe inside a double-quoted DOT string."""
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def render_svg(dot_text):
    """SVG text of DOT source, or None when the graphviz package or `dot` is missing."""
    try:
        import graphviz
    except ImportError:
        return None
    try:
        return graphviz.Source(dot_text).pipe(format="svg").decode("utf-8")
    except (graphviz.ExecutableNotFound, graphviz.backend.CalledProcessError, OSError):
        return None


MISSING_DOT = ("<p><i>Graphviz's <code>dot</code> program was not found, so no picture: install it "
               "(<code>apt install graphviz</code>, <code>brew install graphviz</code> or "
               "<code>conda install graphviz</code>) and display again. The node table follows.</i></p>")


def html_table(rows, limit=400):
    """An HTML table of node rows (as Program.nodes() gives)."""
    cols = ["id", "name", "op", "shape", "bytes", "sources", "params", "flags", "where"]
    out = ['<table style="font-size:11px;border-collapse:collapse">',
           "<thead><tr>" + "".join(f"<th style='text-align:left;padding:2px 6px'>{c}</th>" for c in cols)
           + "</tr></thead><tbody>"]
    for r in rows[:limit]:
        where = f"{r['loc']} @ {r['offset']}" if "loc" in r else ""
        vals = [r["id"], r.get("describe") or r["name"], r["op"], "×".join(map(str, r["shape"])) or "()",
                r["bytes"], ", ".join(map(str, r["sources"])), r.get("params", ""), ", ".join(r["flags"]), where]
        out.append("<tr>" + "".join(f"<td style='padding:1px 6px'>{html.escape(str(v))}</td>" for v in vals)
                   + "</tr>")
    out.append("</tbody></table>")
    if len(rows) > limit:
        out.append(f"<p><i>{len(rows) - limit} more nodes not shown</i></p>")
    return "\n".join(out)


def rich_html(title, dot_text, rows, summary):
    svg = render_svg(dot_text)
    picture = svg if svg is not None else MISSING_DOT
    return (f"<div><b>{html.escape(title)}</b> &mdash; {html.escape(summary)}<br>{picture}"
            f"<details><summary>node table ({len(rows)} nodes)</summary>{html_table(rows)}</details></div>")


def _unit(nbytes, unit):
    if unit == "auto":
        unit = next((u for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)) if nbytes >= s), "B")
    return unit, {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}[unit]


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("jitgraph's plots need matplotlib: pip install \"jitgraph[plot]\"") from None
    return plt


def plot_memory(programs: Sequence[Any], labels: Optional[Sequence[str]] = None, ax: Any = None,
                unit: str = "auto") -> Any:
    """Live arena bytes along each program's execution order (x: fraction of the
    steps, so programs of different lengths line up), with each plan's peak dashed.
    Returns the matplotlib Axes."""
    plt = _pyplot()
    unit, scale = _unit(max(p.peak_bytes for p in programs), unit)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    labels = labels or [f"program {i}" for i in range(len(programs))]
    for prog, label in zip(programs, labels):
        live = prog.memory_timeline() / scale
        x = np.linspace(0, 1, live.size)
        line, = ax.plot(x, live, label=f"{label} (peak {prog.peak_bytes / scale:.2f} {unit})")
        ax.axhline(prog.peak_bytes / scale, color=line.get_color(), ls="--", lw=0.8)
        fwd = getattr(prog, "forward", None)
        if fwd is not None:                  # the steps that run forward nodes (a group as one step)
            n_fwd = int(np.isin(prog.run_order, fwd.order).sum())
            ax.axvline((n_fwd - 1) / max(live.size - 1, 1), color="#999999", lw=0.6)
    ax.set_xlabel("execution order (fraction of steps; grey: end of the forward pass)")
    ax.set_ylabel(f"live arena memory ({unit})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def plot_pareto(rows: Sequence[dict], ax: Any = None, unit: str = "auto") -> Any:
    """Recompute cost against planned peak for jg.pareto rows -- predicted milliseconds
    where the rows were priced in measured time, else GFLOP: one-level plans in blue,
    multi-level ones (a tensor recomputed more than once) in orange; rows measured by
    ``jg.pareto(..., feeds=...)`` add their measured recompute as hollow markers.  Returns the Axes."""
    plt = _pyplot()
    unit, scale = _unit(max(r["peak_bytes"] for r in rows), unit)
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    peaks = [r["peak_bytes"] / scale for r in rows]
    timed = all("recompute_seconds" in r for r in rows)
    gflops = [1e3 * r["recompute_seconds"] if timed else r["recompute_flops"] / 1e9 for r in rows]
    ax.plot(peaks, gflops, "-", color="#999999", lw=0.8)
    multi = [r.get("max_recomputations", 1) > 1 for r in rows]
    for several, colour, label in ((False, "tab:blue", "one level"), (True, "tab:orange", "several levels")):
        pts = [(x, y) for x, y, m in zip(peaks, gflops, multi) if m == several]
        if pts:
            ax.plot(*zip(*pts), "o", color=colour, label=label)
    if timed and all("measured_recompute_seconds" in r for r in rows):
        ax.plot(peaks, [1e3 * r["measured_recompute_seconds"] for r in rows], "o--", color="#555555", lw=0.8,
                mfc="none", label="measured")
    for r, x, y in zip(rows, peaks, gflops):
        if r["strategy"] not in ("budget", "revolve"):
            ax.annotate(r["strategy"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(f"planned peak ({unit})")
    ax.set_ylabel("recompute (ms)" if timed else "recompute (GFLOP)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


__all__ = ["to_dot", "render_svg", "html_table", "plot_memory", "plot_pareto", "describe", "flag_names"]
