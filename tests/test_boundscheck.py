"""The suite runs on bounds-checked kernels (conftest.py), so an index out of range in jitted
code fails a test instead of reading past a buffer."""
import os

import numpy as np
import pytest
from numba import njit
from numba.core import config

import jitgraph as jg


@njit
def _read(a, i):
    return a[i]


def test_the_flag_the_suite_asked_for_is_the_one_numba_compiles_with():
    assert bool(config.BOUNDSCHECK) == (os.environ["NUMBA_BOUNDSCHECK"] not in ("", "0"))
    assert jg._cache.KEY == jg._cache.source_key()      # and it names the cache folder


@pytest.mark.skipif(os.environ.get("NUMBA_BOUNDSCHECK") in ("", "0"), reason="run on unchecked kernels by request")
def test_an_index_out_of_range_raises_instead_of_reading_past_the_buffer():
    a = np.arange(4.0)
    assert _read(a, 3) == 3.0
    with pytest.raises(IndexError):
        _read(a, 4)
