"""Every op of the registry against its naive numpy reference (tests/naive.py):
forward in float32 and float64, and gradients against central finite differences
in float64."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.registry import BY_NAME, NO_GRAD, ZERO_GRAD

from .naive import REF, build, reference


def _example(name, seed=0):
    return REF[name].args(np.random.default_rng(seed))


def _tensors(g, args):
    return [g.param(a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]


@pytest.mark.parametrize("name", sorted(REF))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_forward_matches_reference(name, dtype):
    case = REF[name]
    args = _example(name)
    g = jg.Graph(dtype)
    out = build(name, BY_NAME[name].builder, _tensors(g, args), case.kw)
    assert out.op == name, f"the builder made a {out.op!r} node"
    got = jg.build_forward(out).run()
    cast = [a.astype(dtype).astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
            for a in args]
    want = reference(name, cast, case.kw, node=out)
    assert got.shape == want.shape and got.dtype == dtype
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=3e-5, atol=3e-5)
    np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("name", sorted(n for n, c in REF.items() if c.grad))
def test_gradient_matches_finite_differences(name):
    case = REF[name]
    args = _example(name, seed=1)
    fn = lambda *ts: build(name, BY_NAME[name].builder, list(ts), case.kw)     # noqa: E731
    res = jg.check_grads(fn, args, wrt=case.wrt)   # each coordinate within 1e-9 + 1e-6 x its magnitude
    assert res.ok and res.n_checked > 0, res


@pytest.mark.parametrize("name", sorted(n for n, c in REF.items() if not c.grad))
def test_ops_without_gradient_say_so(name):
    """A piecewise-constant op passes a zero gradient; an op without a rule raises naming itself."""
    case = REF[name]
    g = jg.Graph(np.float64)
    tensors = _tensors(g, _example(name))
    loss = jg.sum(build(name, BY_NAME[name].builder, tensors, case.kw) * 1.5)
    if BY_NAME[name].vjp is ZERO_GRAD:
        bwd = jg.build_backward(jg.build_forward(loss))
        bwd.run()
        for t in tensors:
            if isinstance(t, jg.Tensor):
                assert not np.any(bwd.grad(t)), f"{name} passed a gradient to {t.label}"
    else:
        assert BY_NAME[name].vjp is NO_GRAD
        with pytest.raises(jg.GraphError, match=f"op {name!r}.*no gradient rule"):
            jg.build_backward(jg.build_forward(loss))
