"""No fixed limits: a graph of a million nodes builds, is differentiated with and
without checkpoints, is planned and runs."""
import numpy as np

import jitgraph as jg


def test_million_node_graph_end_to_end():
    n_layers = 250_000                  # 4 nodes a layer: 1M forward nodes
    g = jg.Graph(np.float32)
    x = g.input((8,), name="x")
    w = g.param(np.full(8, 0.999, np.float32), name="w")
    c = g.param(np.full(8, 1e-4, np.float32), name="c")
    h = x
    for i in range(n_layers):
        h = jg.tanh(h * w + c)           # mul, add, tanh + the affine below
        h = h * 1.0
    loss = jg.sum(h)
    fwd = jg.build_forward(loss)
    assert fwd.order.size >= 1_000_000
    xb = np.linspace(-1, 1, 8).astype(np.float32)
    value = fwd.run({x: xb})
    assert np.isfinite(value)
    plain = jg.build_backward(fwd)
    l1 = plain.run({x: xb})
    gw, gc = w.grad.copy(), c.grad.copy()
    assert plain.order.size > 2_000_000 and np.isfinite(gw).all()
    ck = jg.build_backward(jg.build_forward(loss), checkpoints="sqrt")
    l2 = ck.run({x: xb})
    assert np.array_equal(l1, l2) and np.array_equal(w.grad, gw) and np.array_equal(c.grad, gc)
    assert ck.stats()["n_recomputed"] > 500_000
    assert ck.peak_bytes < plain.peak_bytes / 50      # ~sqrt(n) checkpoints instead of every activation
