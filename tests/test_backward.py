"""build_backward: the zero table, origins, second order, run semantics, errors."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.emit import RULE_ACCUMULATE
from jitgraph.ir import F_CONST

RNG = np.random.default_rng(99)


def backward_rows(bwd):
    fwd_ids = set(bwd.forward.order.tolist())
    return [row for row in bwd.nodes() if row["id"] not in fwd_ids]


def test_zero_table_on_y_equals_a_x_squared():
    """b = x*x; y = a*b: dy/dx = 2 a x, dy/da = x^2.  The backward part is exactly
    seed, ga = seed*b, gb = seed*a, gb*x (slot 0), gb*x (slot 1), and ONE add."""
    g = jg.Graph(np.float64)
    x = g.param(np.array(3.0), name="x")
    a = g.param(np.array(2.0), name="a")
    b = (x * x).named("b")
    y = (a * b).named("y")
    bwd = jg.build_backward(jg.build_forward(y))
    assert float(bwd.run()) == 18.0
    assert float(x.grad) == 2 * 2.0 * 3.0
    assert float(a.grad) == 3.0 ** 2
    rows = backward_rows(bwd)
    ops = sorted(r["op"] for r in rows)
    assert ops == ["add", "const", "mul", "mul", "mul", "mul"]
    assert bwd.stats()["n_backward"] == 6
    nodes = g.nodes
    for row in rows:
        if row["op"] == "add":          # the one accumulation: the two contributions to x
            assert int(nodes.origin[row["id"]]) == x.id and int(nodes.rule[row["id"]]) == RULE_ACCUMULATE
            for s in row["sources"]:    # neither operand is a zero constant
                assert not nodes.flags[s] & F_CONST and g.nodes.op[s] != 0
    # origins: ga comes from y's rule for slot 0 (a), gb from slot 1 (b)
    ga = next(r["id"] for r in rows if r["op"] == "mul" and b.id in r["sources"])
    assert int(nodes.origin[ga]) == y.id and int(nodes.rule[ga]) == 0
    gx_parts = [r["id"] for r in rows if r["op"] == "mul" and x.id in r["sources"]]
    assert sorted(int(nodes.rule[i]) for i in gx_parts) == [0, 1]
    assert all(int(nodes.origin[i]) == b.id for i in gx_parts)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scaled", [False, True])
def test_relus_gradient_is_one_node_with_the_bits_of_g_times_step(dtype, scaled):
    """relu's rule appends one relu_d node (g * step(out) in one pass, where a mul and a
    step took two): its bits are numpy's g * (out > 0), zeros' signs included, on one
    thread and on two (the elements split between them); with ``scaled`` relu's input is
    1.5 x, so relu_d's result is a temporary the plan may write over g."""
    g = jg.Graph(dtype)
    X = RNG.standard_normal((129, 1031)).astype(dtype)
    X[::5, ::3] = 0.0                                     # relu's kink: step(0) = 0
    x = g.param(X, name="x")
    w = g.input(X.shape, name="w")
    y = jg.relu(x * 1.5 if scaled else x)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * w)))
    ops = [r["op"] for r in backward_rows(bwd)]
    assert ops.count("relu_d") == 1 and "step" not in ops
    W = RNG.standard_normal(X.shape).astype(dtype)
    W[1::4] = 0.0
    want = W * (np.maximum(X * dtype(1.5) if scaled else X, 0) > 0)
    if scaled:
        want = want * dtype(1.5)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    try:
        for threads in (1, 2):
            jg.set_num_threads(threads)
            bwd.run({w: W})
            np.testing.assert_array_equal(np.asarray(x.grad).view(bits), want.view(bits))
    finally:
        jg.set_num_threads()


def test_gradient_nodes_are_flagged_and_carry_origin():
    g = jg.Graph(np.float64)
    x = g.input((4, 3), name="x")
    W = g.param(RNG.normal(size=(3, 2)), name="W")
    loss = jg.mean(jg.tanh(x @ W))
    bwd = jg.build_backward(jg.build_forward(loss))
    for row in backward_rows(bwd):
        n = row["id"]
        assert "grad" in row["flags"]
        assert 0 <= g.nodes.origin[n] < n
    gW = bwd.grad_nodes[bwd.params.index(W.id)]
    assert "param_grad" in jg.Tensor(g, gW).flags


def test_consts_and_inputs_get_no_gradient_nodes():
    g = jg.Graph(np.float64)
    x = g.input((3,), name="x")
    c = g.const(np.ones(3), name="c")
    W = g.param(np.ones(3), name="W")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.exp(x * c) + W)))
    # d/dW of sum(W) is broadcast of the seed: nothing at all is built for exp(x*c)
    assert [r["op"] for r in backward_rows(bwd)] == ["const", "broadcast"]
    bwd.run({x: np.zeros(3)})
    np.testing.assert_array_equal(W.grad, np.ones(3))


def test_param_not_reaching_loss_and_zero_gradients():
    g = jg.Graph(np.float64)
    W = g.param(np.array([1.0, -2.0]), name="W")
    V = g.param(np.ones(2), name="V")              # unused by the loss
    loss = jg.sum(jg.relu(jg.scale(W, 0.0)) + 3.0)  # gradient exists and is zero
    bwd = jg.build_backward(jg.build_forward(loss))
    bwd.run()
    np.testing.assert_array_equal(W.grad, [0.0, 0.0])
    with pytest.raises(jg.GraphError, match="'V' is not a param this backward graph differentiates"):
        bwd.grad(V)
    with pytest.raises(jg.GraphError, match="'V' has no gradient yet"):
        V.grad
    x = g.input((2,), name="x")
    with pytest.raises(jg.GraphError, match="not a param"):
        x.grad


def test_shared_and_view_gradients_get_their_own_buffers():
    g = jg.Graph(np.float64)
    W = g.param(np.ones((2, 3)), name="W")
    V = g.param(np.full((2, 3), 2.0), name="V")
    U = g.param(np.ones(6), name="U")
    loss = jg.sum(jg.sqr(W + V + jg.reshape(U, (2, 3))))
    bwd = jg.build_backward(jg.build_forward(loss))
    bwd.run()
    want = 2 * (1 + 2 + 1) * np.ones((2, 3))
    np.testing.assert_array_equal(W.grad, want)
    np.testing.assert_array_equal(V.grad, want)
    np.testing.assert_array_equal(U.grad, want.reshape(-1))
    assert len(set(bwd.grad_nodes)) == 3


def test_loss_that_is_a_param():
    g = jg.Graph(np.float64)
    w = g.param(np.array(5.0), name="w")
    bwd = jg.build_backward(jg.build_forward(w))
    assert float(bwd.run()) == 5.0
    assert float(w.grad) == 1.0


def test_gradients_are_fresh_each_run_and_accumulate_on_request():
    g = jg.Graph(np.float64)
    x = g.input((3,), name="x")
    W = g.param(np.ones(3), name="W")
    bwd = jg.build_backward(jg.build_forward(jg.sum(x * W)))
    bwd.run({x: np.array([1.0, 2.0, 3.0])})
    bwd.run({x: np.array([1.0, 2.0, 3.0])})
    np.testing.assert_array_equal(W.grad, [1, 2, 3])
    bwd.run({x: np.array([10.0, 20.0, 30.0])}, accumulate=True)
    np.testing.assert_array_equal(W.grad, [11, 22, 33])
    np.testing.assert_array_equal(bwd.grad(W), [11, 22, 33])
    bwd.run({x: np.array([1.0, 1.0, 1.0])})
    np.testing.assert_array_equal(W.grad, [1, 1, 1])


def test_stats():
    g = jg.Graph(np.float32)
    x = g.input((4, 3), name="x")
    W = g.param(np.ones((3, 2)), name="W")
    fwd = jg.build_forward(jg.mean(jg.relu(x @ W)))
    bwd = jg.build_backward(fwd)
    st = bwd.stats()
    assert st["n_forward"] == fwd.order.size
    assert st["n_nodes"] == st["n_forward"] + st["n_backward"]
    assert st["peak_bytes"] == bwd.peak_bytes > 0


def test_loss_must_be_a_scalar_and_single_output():
    g = jg.Graph(np.float64)
    W = g.param(np.ones(3), name="W")
    with pytest.raises(jg.GraphError, match=r"the loss 'W' must be a scalar, got shape \(3,\)"):
        jg.build_backward(jg.build_forward(W))
    with pytest.raises(jg.GraphError, match="exactly one output"):
        jg.build_backward(jg.build_forward([jg.sum(W), jg.mean(W)]))
    with pytest.raises(jg.GraphError, match="expects the ForwardGraph"):
        jg.build_backward(jg.sum(W))


# ---- second order ---------------------------------------------------------------------------
def tanh_sq(x, W):
    return jg.sum(jg.sqr(jg.tanh(x @ W)))


HVP_FUNCTIONS = {
    "sum tanh(xW)^2": tanh_sq,
    "softmax-xent": lambda x, W: jg.cross_entropy(x @ W, np.eye(3)[[0, 2, 1, 1]]),
    "layer_norm": lambda x, W: jg.sum(jg.sqr(jg.layer_norm(x @ W, 1e-5) + 0.3) * jg.sigmoid(x @ W)),
    "rms_norm gelu": lambda x, W: jg.sum(jg.gelu(jg.rms_norm(x @ W, 1e-5))),
    "silu max log": lambda x, W: jg.sum(jg.max(jg.silu(x @ W), axis=1)) + jg.mean(jg.log(jg.sqr(W) + 1.0)),
    "sqrt div exp": lambda x, W: jg.sum(jg.sqrt(jg.exp(x @ W) + 1.0) / (jg.sqr(W) + 2.0).sum()),
    "log_softmax axis0": lambda x, W: jg.sum(jg.log_softmax(x @ W, axis=0) * jg.tanh(x @ W)),
}


@pytest.mark.parametrize("name", list(HVP_FUNCTIONS))
def test_hessian_vector_product_against_finite_differences(name):
    f = HVP_FUNCTIONS[name]
    x, W0, V = RNG.normal(size=(4, 5)), RNG.normal(size=(5, 3)) * 0.7, RNG.normal(size=(5, 3))
    g = jg.Graph(np.float64)
    X = g.const(x, name="x")
    W = g.param(W0, name="W")
    loss = f(X, W)
    (gW,) = jg.grad(loss, [W])
    hv = jg.build_backward(jg.build_forward(jg.sum(gW * g.const(V))))
    hv.run()
    hvp = hv.grad(W)
    # finite differences of the gradient along V
    gb = jg.build_backward(jg.build_forward(loss))
    eps = 1e-5
    W.value = W0 + eps * V
    gb.run()
    gp = gb.grad(W)
    W.value = W0 - eps * V
    gb.run()
    gm = gb.grad(W)
    W.value = W0
    fd = (gp - gm) / (2 * eps)
    np.testing.assert_allclose(hvp, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", list(HVP_FUNCTIONS))
def test_gradient_norm_penalty_passes_check_grads(name):
    f = HVP_FUNCTIONS[name]
    x = RNG.normal(size=(4, 5))

    def penalised(W):
        X = W.graph.const(x)
        loss = f(X, W)
        (gW,) = jg.grad(loss, [W])
        return loss + 0.1 * jg.sum(jg.sqr(gW))

    res = jg.check_grads(penalised, [RNG.normal(size=(5, 3)) * 0.7], rtol=1e-5)
    assert res.ok and res.n_checked >= 14


def test_third_order_through_gelu_names_the_op():
    g = jg.Graph(np.float64)
    W = g.param(RNG.normal(size=3), name="W")
    (g1,) = jg.grad(jg.sum(jg.gelu(W)), [W])
    (g2,) = jg.grad(jg.sum(jg.sqr(g1)), [W])          # second order: fine
    with pytest.raises(jg.GraphError, match="op 'gelu_dd' of tensor 'gelu_dd#\\d+' has no gradient rule"):
        jg.grad(jg.sum(jg.sqr(g2)), [W])


def test_check_grads_detects_a_wrong_gradient(monkeypatch):
    from jitgraph.program import BackwardGraph
    real = BackwardGraph.grad
    monkeypatch.setattr(BackwardGraph, "grad", lambda self, p: real(self, p) * 1.001)
    with pytest.raises(jg.GradientCheckError, match="MISMATCH"):
        jg.check_grads(lambda t: jg.sum(jg.sqr(t)), [np.array([1.0, 2.0])])
    res = jg.check_grads(lambda t: jg.sum(jg.sqr(t)), [np.array([1.0, 2.0])], raise_on_failure=False)
    assert not res.ok and 5e-4 < res.max_rel_error < 2e-3


def test_check_grads_skips_kinks():
    res = jg.check_grads(lambda t: jg.sum(jg.relu(t) + jg.abs(t)), [np.array([0.0, 1.0, -1.0])])
    assert res.ok and res.n_skipped == 1 and res.n_checked == 2
