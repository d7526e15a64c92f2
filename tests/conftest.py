import os

# Every kernel of the suite runs with Numba's bounds checking, so an index out of range fails a
# test instead of reading past a buffer.  Set before anything imports Numba (it reads the flag
# once); NUMBA_BOUNDSCHECK=0 in the environment runs the suite on unchecked code.  The flag is
# part of jitgraph's cache key (_cache.py): checked and unchecked code live in separate folders.
os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
# the checkpoint planners price recomputation in FLOPs here, not in time measured on the host
# (timing.py): plans that do not depend on the machine; tests of the measured model ask for it
os.environ.setdefault("JITGRAPH_COSTS", "flops")

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# "ci" keeps property tests bounded; JITGRAPH_HYPOTHESIS=long runs the long profile
settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = os.environ.get("JITGRAPH_HYPOTHESIS", "ci")
settings.load_profile(PROFILE)


def examples(n):
    """A property test's example count: n in CI, 50 n in the long profile (an explicit
    @settings(max_examples=...) would override the profile, so tests use this)."""
    return n if PROFILE == "ci" else 50 * n


@pytest.fixture(params=[np.float32, np.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


def tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
