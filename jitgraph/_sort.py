"""One stable argsort over int64 keys for every jitted pass.

The passes sorted with ``np.argsort`` (quicksort and mergesort) and ``np.sort``: Numba
builds each of those from its generic sort templates, one compile per kind and
array type -- about 4 CPU-seconds of a cold start and of every install's compile
(measured on a 2-core AMD EPYC Zen 4), for arrays of a few thousand keys at most.
A bottom-up merge sort of our own compiles once, in a fraction of that, and being
stable it gives one order for equal keys wherever it is used (a plan does not
depend on which sort a pass happened to pick).
"""
import numpy as np

from ._sigs import on_first_use
from numba import types

I64 = types.Array(types.int64, 1, "A")


@on_first_use(types.Array(types.int64, 1, "C")(I64))
def argsort_stable(keys):
    """Indices that sort ``keys`` ascending; equal keys keep their order (as numpy's
    ``kind="stable"``)."""
    n = keys.size
    idx = np.arange(n)
    tmp = np.empty(n, np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if keys[idx[j]] < keys[idx[i]]:        # strictly less: the left run wins ties
                    tmp[k] = idx[j]
                    j += 1
                else:
                    tmp[k] = idx[i]
                    i += 1
                k += 1
            while i < mid:
                tmp[k] = idx[i]
                i += 1
                k += 1
            while j < hi:
                tmp[k] = idx[j]
                j += 1
                k += 1
        idx, tmp = tmp, idx
        width *= 2
    return idx
