"""Dropout with counter-based randomness.

Element i of a dropout node keeps its value iff hash(seed, mask_id, i) >= p, where
mask_id is the node's stable id.  A recomputed copy or a gradient carries the same
(seed, mask_id), so it sees the same mask -- no RNG state to save or restore.
"""
import numbers
from enum import IntEnum

import numpy as np
from numba import njit

from ..errors import GraphError
from ..graph import Tensor
from ..native import operand, output, run_view, span
from ..registry import DROPOUT, ELEMENTWISE, defop, slots
from ..rules import op
from ..status import OK
from .common import need_tensor


class DropoutIP(IntEnum):
    seed = 0
    mask_id = 1              # the mask's identity: the node's id (a recomputed copy or a gradient keeps it)


class DropoutFP(IntEnum):
    p = 0


def dropout(t: Tensor, p: float, seed: int = 0) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p).

    The mask is a pure function of (seed, this node, element index): recomputing
    the node (checkpointing) or re-running the graph gives the same mask.  For fresh
    masks each training step, run with ``run(feeds, seed=step)``, which is added to
    every dropout's seed for that run.  p == 0 returns ``t`` itself.
    """
    t = need_tensor(t, "dropout")
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise GraphError(f"dropout of {t.label!r}: p must be a number in [0, 1), got {p!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise GraphError(f"dropout of {t.label!r}: seed must be an int, got {seed!r}")
    if p == 0.0:
        return t
    n = t.graph.nodes.n                         # the node about to be made: the mask's identity
    return t.graph._node(DROPOUT, (t.id,), t.shape, fp=slots(DropoutFP, p=float(p)),
                         ip=slots(DropoutIP, seed=int(seed) & 0x7FFFFFFFFFFFFFFF, mask_id=n))


@njit(cache=True)
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _dropout_key(seed, mask_id):
    return _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(mask_id))


@njit(cache=True)
def _dropout_u(key, i):
    z = _mix(key + np.uint64(i) * np.uint64(0xD1B54A32D192ED03))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)   # 53 bits -> [0, 1)


@njit(cache=True, error_model="numpy")
def dropout_uniform(seed, mask_id, i):
    """The uniform in [0, 1) that decides element i of mask (seed, mask_id); kept iff >= p."""
    return _dropout_u(_dropout_key(seed, mask_id), i)


@njit(cache=True, error_model="numpy")
def dropout_kernel(out, x, p, seed, mask_id, lo, hi):
    """Elements [lo, hi): each one's mask depends on its index only, so blocks agree."""
    key = _dropout_key(seed, mask_id)
    keep_scale = 1.0 / (1.0 - p)
    y = out[lo:hi]
    xs = x[lo:hi]
    for i in range(y.size):
        y[i] = xs[i] * keep_scale if _dropout_u(key, lo + i) >= p else 0.0 * xs[i]
    return OK


def _run_dropout(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    lo, hi = span(lo, hi, out.size)
    return dropout_kernel(out, operand(v, n, 0), v.fp[n, DropoutFP.p], v.ip[n, DropoutIP.seed] + v.salt,
                          v.ip[n, DropoutIP.mask_id], lo, hi)


defop(DROPOUT, "dropout", dropout, _run_dropout, arity=1, kind=ELEMENTWISE, flops=4, ip=DropoutIP, fp=DropoutFP,
      vjp=lambda g, out: op.dropout(g, params_from=out))      # the same mask: the same (seed, mask id) and p
