"""Pictures, rich display and the memory timeline."""
import os
import shutil

import numpy as np

import jitgraph as jg
import jitgraph.viz as viz

from .test_checkpoint import chain


def a_x_squared():
    g = jg.Graph(np.float64)
    x = g.param(np.array(3.0), name="x")
    a = g.param(np.array(2.0), name="a")
    b = (x * x).named("b")
    y = (a * b).named("y")
    return g, x, a, b, y


def test_forward_picture_tells_kinds_apart_and_labels_nodes():
    g = jg.Graph(np.float32)
    x = g.input((4, 3), name="x")
    W = g.param(np.ones((3, 2)), name="W")
    c = g.const(np.ones(2), name="c")
    out = jg.relu(x @ W + c).named("out")
    dot = jg.build_forward(out).to_dot()
    for kind in ("input", "param", "const", "output"):
        fill, shape, text = viz.STYLE[kind]
        assert f'fillcolor="{fill}", shape={shape}' in dot
        assert text in dot                                      # the legend
    assert '"#0 x\\ninput [4×3]"' in dot
    assert "out\\nrelu [4×2]" in dot
    assert f"n{x.id} -> n{x.id + 3};" in dot or f"n{x.id} ->" in dot


def test_backward_picture_says_where_each_gradient_comes_from():
    g, x, a, b, y = a_x_squared()
    bwd = jg.build_backward(jg.build_forward(y))
    dot = bwd.to_dot()
    for text in ("grad of y · seed 1", "grad of y · mul src0", "grad of y · mul src1", "grad of b · mul src0",
                 "grad of b · mul src1", "grad of x · accumulate", "= gradient of param x", "= gradient of param a"):
        assert text in dot, text
    assert viz.STYLE["grad"][0] in dot and viz.STYLE["param_grad"][0] in dot and viz.STYLE["loss"][0] in dot
    rows = bwd.nodes()
    assert [r["describe"] for r in rows if r["op"] == "add"] == ["grad of x · accumulate"]


def test_recomputed_nodes_point_to_their_originals():
    g, x, loss, hs, Ws = chain(4, B=2, D=2)
    bwd = jg.build_backward(jg.build_forward(loss), checkpoints=[hs[1]])
    dot = bwd.to_dot()
    rec = [n for n in bwd.order.tolist() if "recomputed" in jg.Tensor(g, n).flags]
    assert rec
    for n in rec:
        o = int(g.nodes.origin[n])
        assert f"n{o} -> n{n} [style=dashed" in dot
        assert f"recompute {g.label(o)}" in dot
    assert "penwidth=3" in dot                                  # the checkpoint is marked
    assert "checkpoint (kept)" in dot


def test_big_graph_options():
    g, x, loss, hs, Ws = chain(40, B=2, D=2)
    bwd = jg.build_backward(jg.build_forward(loss))
    dot = bwd.to_dot(max_nodes=50)
    assert dot.count("fillcolor") - dot.count("legend_") <= 50 + 2
    assert f"... {bwd.order.size - 50} earlier nodes not drawn" in dot
    folded = bwd.to_dot(fold_forward=True)
    assert f"forward pass ({bwd.forward.order.size} nodes)" in folded
    assert "forward -> n" in folded
    assert f"n{loss.id} [" not in folded                        # forward nodes are inside the box


def test_rich_display_with_graphviz(monkeypatch):
    g, x, a, b, y = a_x_squared()
    bwd = jg.build_backward(jg.build_forward(y))
    if shutil.which("dot") is None and os.environ.get("JITGRAPH_REQUIRE_DOT") != "1":
        # without the dot program the picture is missing but the table is there (checked below too)
        assert bwd._repr_svg_() is None
        return
    svg = bwd._repr_svg_()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "grad of x · accumulate" in svg
    html = bwd._repr_html_()
    assert "<svg" in html and "<table" in html and "grad of b · mul src1" in html
    assert "<svg" in y._repr_svg_() and "<table" in y._repr_html_()


def test_rich_display_falls_back_without_dot(monkeypatch):
    import graphviz

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Source, "pipe", missing)
    g, x, a, b, y = a_x_squared()
    fwd = jg.build_forward(y)
    assert fwd._repr_svg_() is None
    html = fwd._repr_html_()
    assert "was not found" in html and "apt install graphviz" in html
    assert "<table" in html and "<svg" not in html
    monkeypatch.setattr(viz, "render_svg", lambda dot: None)
    assert "was not found" in y._repr_html_()


def test_html_table_has_the_planned_locations():
    g, x, loss, hs, Ws = chain(2, B=2, D=2)
    fwd = jg.build_forward(loss)
    html = viz.html_table(fwd.nodes())
    for col in ("id", "name", "op", "shape", "bytes", "sources", "flags", "where"):
        assert f">{col}</th>" in html
    assert "arena @" in html and "store @" in html and "io @" in html


def test_memory_timeline_and_plots(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    g, x, loss, hs, Ws = chain(12, B=16, D=16)
    none = jg.build_backward(jg.build_forward(loss))
    g2, x2, loss2, hs2, Ws2 = chain(12, B=16, D=16)
    sq = jg.build_backward(jg.build_forward(loss2), checkpoints="sqrt")
    for prog in (none, sq):
        live = prog.memory_timeline()
        assert live.size == prog.run_order.size              # a step per node run (a group: one)
        assert 0 <= live.min() and live.max() <= prog.peak_bytes
        assert live.max() >= 0.9 * prog.peak_bytes                # the plan's peak is live at some step
    assert sq.memory_timeline().max() < none.memory_timeline().max()
    ax = none.plot_memory(sq, labels=["none", "sqrt"])
    assert len(ax.lines) >= 4
    g3, x3, loss3, _, _ = chain(6, B=8, D=8)
    rows = jg.pareto(jg.build_forward(loss3), costs="measured", feeds={x3: np.ones((8, 8), g3.dtype)}, repeats=1)
    ax2 = jg.plot_pareto(rows)
    assert any(line.get_label() == "measured" for line in ax2.lines)
    ax.figure.savefig(tmp_path / "m.png")
    ax2.figure.savefig(tmp_path / "p.png")
    assert (tmp_path / "m.png").stat().st_size > 1000


def test_every_picture_is_valid_dot():
    """With Graphviz's dot (CI installs it and sets JITGRAPH_REQUIRE_DOT=1), every
    picture renders; without it, pictures degrade to None and the DOT text is at least
    well-formed."""
    import graphviz
    have_dot = shutil.which("dot") is not None
    if os.environ.get("JITGRAPH_REQUIRE_DOT") == "1":
        assert have_dot, "JITGRAPH_REQUIRE_DOT=1 but Graphviz's dot is not on PATH"
    g, x, loss, hs, Ws = chain(5, B=2, D=2)
    fwd = jg.build_forward(loss)
    for dot in (fwd.to_dot(), jg.build_backward(fwd, checkpoints="sqrt").to_dot(fold_forward=True),
                hs[2].to_dot(), jg.build_backward(jg.build_forward(chain(3)[2]), zero_table=False).to_dot()):
        assert dot.startswith("digraph ") and dot.rstrip().endswith("}") and dot.count("{") == dot.count("}")
        if have_dot:
            graphviz.Source(dot).pipe(format="svg")              # raises on a syntax error
        else:
            assert viz.render_svg(dot) is None
