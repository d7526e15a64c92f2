"""Binomial checkpointing (Griewank & Walther's Revolve) for a chain of steps.

A chain of ``l`` steps is reversed from its start state with ``s`` checkpoint
slots (Griewank's count: the start state occupies one of them).  Reversing step
k means recomputing step k's own tensors (its *tape*) from the state before it,
then running its backward part.  With ``r`` the least number such that

    beta(s, r) = C(s + r, s) >= l,

some step is evaluated r times beyond the first forward sweep, and the fewest
step evaluations beyond that sweep are

    t(l, s) = r * l - C(s + r, s + 1)

(the first sweep's evaluations are not counted; every later one is).  The
schedule splits the chain recursively: advance from the start to position m,
store state m in a slot, reverse (m, l] with one slot fewer, free the slot,
reverse (0, m] with all of them.  ``schedule`` picks every split m so that the
total meets t(l, s) and no step is evaluated more than r times, with an explicit
stack.

What the checkpoint rewrite needs from a schedule, per inner position m (state
m, 1 <= m < l, after step m):

* ``kind[m]`` 0: never stored; 1: stored by the first (original) forward sweep;
  2: stored as a recomputed copy;
* ``made[m]``: for kind 2, the segment (step number) whose reversal first needs
  it -- the copy is made while rewriting that segment and then serves segments
  made[m] down to m + 1.
"""
import numpy as np
from numba import njit

FIRST_SWEEP = 1
RECOMPUTED = 2


@njit(cache=True)
def repetitions(l, s):
    """(r, beta(s, r)): the least r with beta(s, r) = C(s + r, s) >= l, s >= 1."""
    r = 0
    b = 1
    while b < l:
        r += 1
        b = b * (s + r) // r
    return r, b


@njit(cache=True)
def optimal_steps(l, s):
    """t(l, s) = r l - C(s + r, s + 1): the fewest step evaluations, beyond the first
    forward sweep, that reverse ``l`` steps with ``s`` slots (s >= 1)."""
    if l <= 1:
        return 0
    r, b = repetitions(l, s)
    return r * l - b * r // (s + 1)


@njit(cache=True)
def _split(l, s):
    """Where to store the next state when reversing l >= 2 steps with s >= 2 slots:
    the first position m that keeps both the total and the most evaluations of one
    step optimal (the cheapest total if none keeps both)."""
    total = optimal_steps(l, s)
    r, _ = repetitions(l, s)
    best, best_cost = 1, -1
    for m in range(1, l):
        cost = m + optimal_steps(l - m, s - 1) + optimal_steps(m, s)
        if cost == total:
            rl, _ = repetitions(m, s)
            rr, _ = repetitions(l - m, s - 1)
            if 1 + rl <= r and rr <= r:
                return m
        if best_cost < 0 or cost < best_cost:
            best, best_cost = m, cost
    return best


@njit(cache=True)
def schedule(l, s):
    """(kind, made) over positions 0..l (see the module docstring) for reversing
    ``l`` steps with ``s`` >= 1 slots, the start's included."""
    kind = np.zeros(l + 1, np.int64)
    made = np.full(l + 1, -1, np.int64)
    # stack of sub-problems (lo, hi, slots, made): made = -1 for the first sweep
    stack = np.empty((l + 1, 4), np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2], stack[0, 3] = 0, l, s, -1
    sp = 1
    while sp > 0:
        sp -= 1
        lo, hi, slots, mk = stack[sp, 0], stack[sp, 1], stack[sp, 2], stack[sp, 3]
        if hi - lo < 2 or slots < 2:
            continue                       # one step, or no slot to spare: recompute from lo
        m = lo + _split(hi - lo, slots)
        if mk < 0:
            kind[m] = FIRST_SWEEP
        else:
            kind[m] = RECOMPUTED
            made[m] = mk
        # (lo, m] is reversed after (m, hi]: push it first; its stored states are made
        # when its first segment, m, is reversed
        stack[sp, 0], stack[sp, 1], stack[sp, 2], stack[sp, 3] = lo, m, slots, m
        sp += 1
        stack[sp, 0], stack[sp, 1], stack[sp, 2], stack[sp, 3] = m, hi, slots - 1, mk
        sp += 1
    return kind, made


def default_slots(l: int, max_repetitions: int = 3) -> int:
    """The fewest slots (Griewank's count, the start's included) that reverse ``l``
    steps evaluating no step more than ``max_repetitions`` times."""
    s = 1
    while repetitions(max(l, 1), s)[0] > max_repetitions:
        s += 1
    return s
