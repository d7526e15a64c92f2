"""The checkpoint rewrite, in nopython mode: backward references to forward tensors
become references to recomputed copies (ggml_build_backward_gradient_checkpointing /
ggml_recompute_graph_node), on one or more levels.

The backward nodes are cut into *segments*: the nodes a forward node's gradient
rule made belong to that node's segment (``seg_of``), and the expansion made them
in reverse forward order, so the rewrite meets the segments from the last forward
step to the first.  A replacements memo ``cur`` maps each forward tensor to the
node that stands for it, with ``lo``: the entry serves segments >= lo only (in
the order the rewrite meets them, it serves the current segment and the ones
before, until it expires).  A reference the memo cannot serve is recomputed: a
copy of the tensor whose sources are, recursively, entries that serve the
current segment (an explicit stack, no recursion), and the copy becomes the
tensor's entry.  What a copy serves is the plan's choice (``Schedule``):

* one level (every explicit, sqrt, policy or budget plan): a single segment, so
  the first copy of a tensor serves every later reference -- each forward tensor
  is copied at most once, as in ggml;
* several levels (revolve): a copy made for segment k serves segment k only
  (the steps recomputed to reach a state, the tape of a step) unless the plan
  stores it: a copy made while the segment is in [make_from, make_to] serves
  down to ``make_lo``, and so seeds later recomputations, then expires -- the
  memory plan frees it after its last reader, in between.  Segments are
  numbered by forward position: a plan may make each forward node's rule a
  segment of its own, or one segment of a whole step.

A one-level plan may also name cheap tensors to make again (``Schedule.remake``: an
elementwise op, a norm; cost.copied_again).  When a backward node reads one whose only copy
was made on the way to another copy -- the gelu a recomputed product read, long before the
gradient that reads it too -- it gets a fresh copy of its own (with the cheap steps between,
a batch norm before a relu), made right before it, and the first one dies with the
recomputation: a few memory-bound passes for a buffer less across the stretch between (the
remat of the plain plan, inside a recomputed segment).

Copies are exact copies of their original (op, params, shape; the origin field
names the original, which dropout uses as its mask's identity), so they run the
same kernels on the same values and gradients stay bit-identical.  A copy's
``rule`` field holds the recomputation it belongs to: segment x (steps + 1) + step.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

from .cost import AGAIN, ON_THE_WAY
from .emit import copy_node
from .ir import F_GRAD, F_INDEX, F_LEAF, F_RECOMPUTED, MAX_SRC
from .status import NEED_SPACE, OK

NEVER = 1 << 62          # ``orig_lo`` of an original no segment may read


class Schedule(NamedTuple):
    """What each backward segment reads, as arrays over node ids below the backward
    part (only forward nodes' entries matter)."""
    orig_lo: np.ndarray   # the original serves segments >= orig_lo (0: kept throughout; NEVER: never)
    make_from: np.ndarray  # a copy made for a segment in [make_from, make_to] serves down to make_lo;
    make_to: np.ndarray    # any other copy serves its own segment only
    make_lo: np.ndarray
    seg_of: np.ndarray    # segment of the backward nodes this forward node's rule made
    step_of: np.ndarray   # forward step (for counting recomputed steps)
    n_steps: int
    remake: np.ndarray    # cost.copied_again's: AGAIN, a backward read gets its own copy when the entry
                          # was made for a copy; ON_THE_WAY, copied afresh with it


def one_level(keep: np.ndarray, step_of: np.ndarray, n_steps: int, remake=None) -> Schedule:
    """The schedule of a keep mask: kept originals serve everyone, every other tensor
    is copied once, for everyone (one segment) -- but the ``remake`` ones (a mask), copied
    again for the backward reads when their copy was made for a recomputation."""
    n = keep.size
    orig_lo = np.where(keep.astype(bool), 0, NEVER).astype(np.int64)
    never = np.full(n, -1, np.int64)
    remake = np.zeros(n, np.uint8) if remake is None else np.asarray(remake, np.uint8)
    return Schedule(orig_lo, never, never, np.zeros(n, np.int64), np.zeros(n, np.int64),
                    np.asarray(step_of, np.int64), int(n_steps), remake)


@njit(cache=True)
def _serves(cur, lo, v, k):
    return cur[v] >= 0 and k >= lo[v]


@njit(cache=True)
def _recompute(G, st, v0, k, cur, lo, make_from, make_to, make_lo, step_of, n_steps, seen, stack, counts):
    """The node that stands for forward node v0 in segment k, copied (with whatever
    sources need copying) if no entry serves k."""
    if _serves(cur, lo, v0, k):
        return cur[v0]
    src, flags = G.src, G.flags
    stack[0] = v0
    sp = 1
    while sp > 0:
        v = stack[sp - 1]
        waiting = False
        for j in range(MAX_SRC):          # copy the sources that need copying first
            u = src[v, j]
            if u < 0:
                break
            if not _serves(cur, lo, u, k):
                stack[sp] = u
                sp += 1
                waiting = True
                break
        if waiting:
            continue
        sp -= 1
        if _serves(cur, lo, v, k):        # reached twice through a diamond
            continue
        c = copy_node(G, st, v, (flags[v] & (F_GRAD | F_INDEX)) | F_RECOMPUTED, v, k * (n_steps + 1) + step_of[v])
        for j in range(MAX_SRC):
            u = src[v, j]
            if u < 0:
                break
            src[c, j] = cur[u]
        cur[v] = c
        lo[v] = make_lo[v] if make_from[v] <= k <= make_to[v] else k
        s = step_of[v]
        if seen[s] != k:                  # a step's first copy for this segment: one recomputed step
            seen[s] = k
            counts[1] += 1
        counts[2] += 1
    return cur[v0]


@njit(cache=True)
def _forget(src, v, cur, remake, stack):
    """Drop the entries of v and of the ON_THE_WAY tensors it is made from, so that the next
    reference copies them afresh."""
    cur[v] = -1
    stack[0] = v
    sp = 1
    while sp > 0:                         # each entry dropped once, when pushed
        sp -= 1
        w = stack[sp]
        for j in range(MAX_SRC):
            u = src[w, j]
            if u < 0:
                break
            if remake[u] == ON_THE_WAY and cur[u] >= 0 and cur[u] != u:
                cur[u] = -1
                stack[sp] = u
                sp += 1


@njit(cache=True)
def rewrite_backward(G, st, first_backward, end_backward, position, n_forward, is_forward, cur, lo, make_from,
                     make_to, make_lo, seg_of, step_of, n_steps, seen, counts, stores, remake, direct):
    """Point the backward nodes [position, end_backward) at entries that serve their
    segment.  ``counts``: [current segment, recomputed steps, copies, stores made],
    carried over a resumption.  ``stores``: the states a plan stores from a recomputation
    (copies that serve beyond the segment making them), latest window first: one whose
    window the rewrite leaves without having made it -- no backward node of those segments
    read it (a dropout's rule reads no tensor) -- is made then, so the later segments find
    it stored, as the plan counted on, instead of each recomputing it.  ``direct``: the
    entry of a tensor was made for (or has served) a backward read; a ``remake`` tensor whose
    entry was not is copied afresh for the read.  Returns (status,
    position): NEED_SPACE when fewer than n_forward + 1 free rows remain before a node or one
    of its references (a reference, or one store, copies each forward node at most once) --
    grow the table and call again from position."""
    src, origin = G.src, G.origin
    stack = np.empty(n_forward + 1, np.int64)
    for n in range(position, end_backward):
        if st[0] + n_forward + 1 > st[1]:
            return NEED_SPACE, n
        o = origin[n]
        if 0 <= o < first_backward and is_forward[o]:
            counts[0] = seg_of[o]
        k = counts[0]
        while counts[3] < stores.size and k < make_from[stores[counts[3]]]:
            v = stores[counts[3]]
            if not (cur[v] >= 0 and lo[v] <= make_lo[v]):          # never made in its window: make it now
                if st[0] + n_forward + 1 > st[1]:
                    return NEED_SPACE, n
                _recompute(G, st, v, make_from[v], cur, lo, make_from, make_to, make_lo, step_of, n_steps, seen,
                           stack, counts)
            counts[3] += 1
        for j in range(MAX_SRC):
            s = src[n, j]
            if s < 0:
                break
            if s < first_backward and is_forward[s]:
                if st[0] + n_forward + 1 > st[1]:     # a forgotten copy may be made twice in one node:
                    return NEED_SPACE, n              # resume here (its slots done point at copies: skipped)
                if remake[s] == AGAIN and not direct[s] and cur[s] != s:
                    _forget(src, s, cur, remake, stack)    # its copy fed a recomputation: a fresh one
                direct[s] = 1
                src[n, j] = _recompute(G, st, s, k, cur, lo, make_from, make_to, make_lo, step_of, n_steps, seen,
                                       stack, counts)
    return OK, end_backward


def run_rewrite(nodes, first: int, end: int, fwd_order: np.ndarray, sched: Schedule) -> np.ndarray:
    """Rewrite the backward part [first, end) of node table ``nodes`` (grown as
    needed).  Returns counts: [last segment, recomputed steps, copies, stores passed]."""
    is_forward = np.zeros(first, np.uint8)
    is_forward[fwd_order] = 1
    cur = np.full(first, -1, np.int64)
    lo = np.asarray(sched.orig_lo[:first], np.int64).copy()
    leaf = fwd_order[(nodes.flags[fwd_order] & F_LEAF) != 0]
    lo[leaf] = 0                          # leaves are never recomputed
    served = fwd_order[lo[fwd_order] < NEVER]
    cur[served] = served
    seen = np.full(sched.n_steps + 1, -1, np.int64)
    counts = np.zeros(4, np.int64)
    mf = np.asarray(sched.make_from[:first], np.int64)
    stores = fwd_order[(mf[fwd_order] >= 0) & (np.asarray(sched.make_lo[:first])[fwd_order] < mf[fwd_order])]
    stores = stores[np.argsort(-mf[stores], kind="stable")]
    counts[0] = int(sched.seg_of[fwd_order].max()) if fwd_order.size else 0
    n_fwd = int(fwd_order.size)
    remake = np.asarray(sched.remake[:first], np.uint8)
    direct = np.zeros(first, np.uint8)
    position = first
    while True:
        nodes.reserve(n_fwd + 1)
        st = np.array([nodes.n, nodes.capacity], np.int64)
        status, position = rewrite_backward(nodes.arrays(), st, first, end, position, n_fwd, is_forward, cur, lo,
                                            sched.make_from, sched.make_to, sched.make_lo, sched.seg_of, sched.step_of,
                                            sched.n_steps, seen, counts, stores, remake, direct)
        nodes.n = int(st[0])
        if status == OK:
            return counts
        nodes.reserve(nodes.capacity)     # double, then resume
