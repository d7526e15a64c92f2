"""matmul's lowering: one GEMM over all rows, a FLAT product for the gradient of a
broadcast 2-D operand, transposed operands read as views -- and the same numbers."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.ops.linear import FLAT

RNG = np.random.default_rng(7)


def r(*shape):
    return RNG.uniform(-1, 1, shape)


def ops_of(prog):
    return [jg.Tensor(prog.graph, int(n)).op for n in prog.order]


def test_weight_gradient_is_one_product_over_all_rows():
    g = jg.Graph(np.float64)
    x = g.input((4, 5, 6), name="x")
    W = g.param(r(6, 3), name="W")
    loss = jg.sum(jg.tanh(x @ W))
    bwd = jg.build_backward(jg.build_forward(loss))
    gW = bwd.grad_nodes[bwd.params.index(W.id)]
    assert jg.Tensor(g, gW).op == "matmul" and int(g.nodes.ip[gW, 2]) == FLAT
    backward = set(bwd.order.tolist()) - set(bwd.forward.order.tolist())
    assert "sum" not in [jg.Tensor(g, n).op for n in backward], "no batch-then-sum"
    xb = r(4, 5, 6)
    bwd.run({x: xb})
    d = 1 - np.tanh(xb @ W.value) ** 2
    np.testing.assert_allclose(W.grad, np.einsum("btk,btn->kn", xb, d), rtol=1e-12)


@pytest.mark.parametrize("sa,sb", [((2, 3, 4), (4, 5)), ((2, 2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
                                   ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2))])
def test_batched_products_and_their_gradients(sa, sb):
    res = jg.check_grads(lambda a, b: jg.sqr(a @ b), [r(*sa), r(*sb)])
    assert res.ok, res


def test_transposed_operands_are_views():
    g = jg.Graph(np.float64)
    q, k = g.param(r(2, 3, 5, 4), name="q"), g.param(r(2, 3, 6, 4), name="k")
    att = q @ jg.transpose(k, (0, 1, 3, 2))
    fwd = jg.build_forward(jg.sum(att * att))
    assert "transpose" not in ops_of(fwd), "the transpose of k is read in place"
    np.testing.assert_allclose(jg.build_forward(att).run(), q.value @ np.swapaxes(k.value, -1, -2), rtol=1e-12)
    res = jg.check_grads(lambda a, b: jg.sqr(a @ jg.transpose(b, (0, 1, 3, 2))), [q.value, k.value])
    assert res.ok, res
    res = jg.check_grads(lambda a, b: jg.sqr(a.T @ b), [r(4, 3), r(4, 5)])
    assert res.ok, res


def test_second_order_through_a_flat_product():
    """A Hessian-vector product through the weight gradient of a batched product."""
    xb, v = r(3, 4, 5), r(5, 2)

    def hvp_fn(W):
        g = W.graph
        x = g.const(xb)
        (gW,) = jg.grad(jg.sum(jg.sqr(jg.tanh(x @ W))), [W])
        return jg.sum(gW * g.const(v))
    res = jg.check_grads(hvp_fn, [r(5, 2)])
    assert res.ok, res
