"""Property-based fuzzing over random graph programs using every op family.

Bounded in CI (the 'ci' hypothesis profile); ``JITGRAPH_HYPOTHESIS=long python3 -m
pytest tests/test_fuzz.py`` runs 2000 examples per property.  The companion
properties live beside their subjects: the memory plan never overlaps live
tensors (test_plan.py) and checkpointed equals plain bit for bit
(test_checkpoint.py); both draw from the same generator.
"""
import numpy as np
from hypothesis import given, settings, strategies as st

import jitgraph as jg

from .conftest import examples

from .graphgen import as_function, evaluate, instance, loss_weights, out_shapes, param_values, programs


@given(programs(max_steps=14, differentiable=False), st.integers(0, 5))
@settings(max_examples=examples(80))
def test_forward_equals_the_numpy_reference(program, seed):
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 2e-4)):
        g, ps, vals, loss, params, weights = instance(program, seed, dtype)
        got = jg.build_forward(loss).run()
        want = evaluate(program, params, weights, vals)
        if dtype == np.float32 and abs(want) > np.finfo(np.float32).max:
            want = np.copysign(np.inf, want)       # the exact loss overflows float32: so must the program
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@given(programs(max_steps=8, max_params=2), st.integers(0, 3))
@settings(max_examples=examples(40))
def test_backward_equals_finite_differences(program, seed):
    shapes, prog, outs = program
    params = param_values(shapes, prog, seed)
    weights = loss_weights(out_shapes(shapes, prog, outs), seed)
    res = jg.check_grads(as_function(program, weights), params, rtol=1e-5, atol=1e-7, raise_on_failure=False)
    assert res.ok, str(res)


@given(programs(max_steps=10), st.integers(0, 3))
@settings(max_examples=examples(40))
def test_runs_are_deterministic_and_debug_clean(program, seed):
    g, ps, vals, loss, params, weights = instance(program, seed, np.float32)
    bwd = jg.build_backward(jg.build_forward(loss))
    used = [p for p in ps if p.id in bwd.params]
    first = (bwd.run(seed=3), [p.grad for p in used])
    again = (bwd.run(seed=3, debug=True), [p.grad for p in used])
    assert np.array_equal(first[0], again[0], equal_nan=True)
    for a, b in zip(first[1], again[1]):
        assert np.array_equal(a, b, equal_nan=True)
