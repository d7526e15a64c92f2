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
RUN = 16                 # insertion-sorted run length before merging


@on_first_use(types.Array(types.int64, 1, "C")(I64))
def argsort_stable(keys):
    """Indices that sort ``keys`` ascending; equal keys keep their order (as numpy's
    ``kind="stable"``)."""
    n = keys.size
    idx = np.arange(n)
    ordered = True
    for a in range(1, n):
        if keys[a] < keys[a - 1]:
            ordered = False
            break
    if ordered:                                        # the passes' keys often are
        return idx
    key = np.empty(n, np.int64)                        # carried with idx: merges read keys in order, not scattered
    for a in range(n):
        key[a] = keys[a]
    for lo in range(0, n, RUN):                        # runs of RUN by insertion: stable, no merge passes
        for a in range(lo + 1, min(lo + RUN, n)):
            x = idx[a]
            kx = key[a]
            b = a
            while b > lo and kx < key[b - 1]:
                idx[b] = idx[b - 1]
                key[b] = key[b - 1]
                b -= 1
            idx[b] = x
            key[b] = kx
    tmp = np.empty(n, np.int64)
    tkey = np.empty(n, np.int64)
    width = RUN
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            if mid >= hi or key[mid - 1] <= key[mid]:
                for a in range(lo, hi):                 # already in order (the passes' keys often are)
                    tmp[a] = idx[a]
                    tkey[a] = key[a]
                continue
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if key[j] < key[i]:                    # strictly less: the left run wins ties
                    tmp[k] = idx[j]
                    tkey[k] = key[j]
                    j += 1
                else:
                    tmp[k] = idx[i]
                    tkey[k] = key[i]
                    i += 1
                k += 1
            for a in range(i, mid):                    # what is left of one run (loops, not slices:
                tmp[k] = idx[a]                        # slice assignment costs 2 s of compile)
                tkey[k] = key[a]
                k += 1
            for a in range(j, hi):
                tmp[k] = idx[a]
                tkey[k] = key[a]
                k += 1
        idx, tmp = tmp, idx
        key, tkey = tkey, key
        width *= 2
    return idx
