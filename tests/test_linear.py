"""matmul's lowering: one GEMM over all rows, a FLAT product for the gradient of a
broadcast 2-D operand, transposed operands read as views -- and the same numbers."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph import blas
from jitgraph.ops.linear import FLAT, TILE_WORK, swaps, tiling

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


@pytest.mark.parametrize("most", [1, 2, 3, 7])
def test_tiles_cover_the_product(most):
    """The tiles of a big product (the pool size bounds their number) are each of at least
    32 rows/columns and together compute exactly the product, for every transpose flag
    and a FLAT product, uneven edges included."""
    for M, N, K in [(300, 1000, 70), (1000, 300, 70), (33, 2000, 300), (2000, 33, 300), (64, 64, 8)]:
        rt, ct = tiling(M, N, K, most)
        assert 1 <= rt * ct <= most
        assert (rt == 1 or M // rt >= 32) and (ct == 1 or N // ct >= 32)
        if 2 * M * N * K >= most * TILE_WORK:
            assert rt * ct >= most - 1, "a big product uses the pool"
    natives = blas.natives(np.float64)
    saved = natives[3]
    natives[3] = most
    try:
        for ta in (0, 1):
            for tb in (0, 1):
                g = jg.Graph(np.float64)
                a = g.input((400, 90) if ta else (90, 400), name="a")
                b = g.input((1000, 400) if tb else (400, 1000), name="b")
                out = (a.T if ta else a) @ (b.T if tb else b)
                av, bv = r(*a.shape), r(*b.shape)
                got = jg.build_forward(out).run({a: av, b: bv})
                want = (av.T if ta else av) @ (bv.T if tb else bv)
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        x, W = r(3, 40, 400), r(400, 1000)                # a FLAT product: rows of every batch at once
        g = jg.Graph(np.float64)
        xi = g.input(x.shape, name="x")
        np.testing.assert_allclose(jg.build_forward(xi @ g.const(W)).run({xi: x}), x @ W, rtol=1e-12, atol=1e-12)
    finally:
        natives[3] = saved


def test_few_row_products_with_a_transposed_operand_run_transposed():
    """x @ W.T with few rows (a linear layer's input gradient, weights stored (out, in))
    is computed as its transpose W @ x.T and transposed back (OpenBLAS is up to 2x faster
    that way round): the numbers are numpy's, in both dtypes and through the gradient,
    and the same bits at 1 and 2 threads."""
    assert swaps(0, 1, 64, 512, 1024) and swaps(0, 1, 16, 300, 300)
    assert not swaps(0, 0, 64, 512, 1024) and not swaps(1, 0, 64, 512, 1024)
    assert not swaps(0, 1, 256, 512, 1024) and not swaps(0, 1, 64, 128, 1024) and not swaps(0, 1, 64, 512, 64)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        g = jg.Graph(dtype)
        x = g.input((37, 300), name="x")
        W = g.param(r(700, 300), name="W")          # rows not a multiple of any vector width
        fwd = jg.build_forward(x @ W.T)
        xv = r(37, 300)
        want = xv @ W.value.astype(np.float64).T
        np.testing.assert_allclose(fwd.run({x: xv}), want, rtol=tol, atol=tol * np.abs(want).max())
    g = jg.Graph(np.float64)
    h = g.param(r(8, 300), name="h")
    W = g.param(r(600, 300), name="W")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.tanh(h @ W.T))))
    bwd.run()
    t = np.tanh(h.value @ W.value.T)
    np.testing.assert_allclose(h.grad, (1 - t * t) @ W.value, rtol=1e-12, atol=1e-12)
    got = []
    for threads in (1, 2):
        jg.set_num_threads(threads)
        try:
            bwd.run()
            got.append(h.grad.copy())
        finally:
            jg.set_num_threads(None)
    assert np.array_equal(got[0], got[1])
