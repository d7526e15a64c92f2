"""Small helpers shared by the tests."""
import numpy as np

import jitgraph as jg


def run_fn(fn, arrays, dtype=np.float64, params=False):
    """Build fn(*tensors) over inputs (or params) holding ``arrays``; run forward; return the result."""
    g = jg.Graph(dtype)
    if params:
        ts = [g.param(a, name=f"p{i}") for i, a in enumerate(arrays)]
        feeds = {}
    else:
        ts = [g.input(np.shape(a), name=f"in{i}") for i, a in enumerate(arrays)]
        feeds = {t: a for t, a in zip(ts, arrays)}
    out = fn(*ts)
    return jg.build_forward(out).run(feeds)


def rand(rng, shape, dtype=np.float64, low=-2.0, high=2.0):
    return rng.uniform(low, high, size=shape).astype(dtype)
