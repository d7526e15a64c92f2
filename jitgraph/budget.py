"""The memory-budget planner's dynamic program over a graph's narrow points (one
level: each forward tensor is recomputed at most once)."""
import numpy as np
from numba import njit


@njit(cache=True)
def budget_dp(cand_size, cand_saved, seg_saved, seg_flops, cand_flops, tail_saved, tail_flops, budget, unit,
              end_alive):
    """Which narrow points to keep so that every segment fits ``budget`` with the
    least recompute flops, under the model

        memory while segment (i, j] is recomputed = (kept points before j, and j itself
                                                     if ``end_alive``) x unit
                                                  + bytes backward needs from the segment
        memory when backward starts                = (all kept points) x unit

    (whether the segment's own end point j is still alive when its recomputed
    tensors are made depends on the execution order: in creation order it is read
    by the segment's first backward steps and dies first -- the planner tries both);
        flops of segment (i, j] = its nodes up to the last one backward needs
                                  (what only feeds a kept point is never recomputed).

    Regions: region j runs from after point j-1 up to point j (inclusive).
    dp[c][j] = least flops covering regions 1..j with c points kept, the last j; the
    best predecessor i lies in a window given by the memory bound, and the flops
    split at Q[j] (the last region before j that needs recomputing), so two
    monotone sliding-window minima make it O(points x count).
    Returns (feasible, kept flags)."""
    m = cand_size.size
    PS = np.zeros(m + 1, np.int64)
    PF = np.zeros(m + 1, np.int64)
    for j in range(m):
        PS[j + 1] = PS[j] + seg_saved[j]
        PF[j + 1] = PF[j] + seg_flops[j]
    # Q[j]: flops of regions i+1..Q[j] are paid (if Q[j] > i); extra[j]: region j's own part
    Q = np.zeros(m + 1, np.int64)
    extra = np.zeros(m + 1, np.int64)
    last_saved = 0
    for j in range(1, m + 1):
        inner = seg_saved[j - 1] - cand_saved[j - 1]      # region j needs, besides its point
        if inner > 0:
            Q[j] = j - 1
            extra[j] = seg_flops[j - 1] - cand_flops[j - 1]
        else:
            Q[j] = last_saved
        if seg_saved[j - 1] > 0:
            last_saved = j
    tail_q = m if tail_saved > 0 else last_saved          # for the tail after the last kept point
    tail_extra = tail_flops if tail_saved > 0 else 0
    cmax = min(m, budget // max(unit, 1))
    INF = np.iinfo(np.int64).max // 4
    prev = np.full(m + 1, INF, np.int64)
    prev[0] = 0                                # index 0: the start, nothing kept yet
    back = np.zeros((cmax + 1, m + 1), np.int32)
    best, best_c, best_j = INF, -1, -1
    if PS[m] + tail_saved <= budget:           # keep nothing
        best, best_c, best_j = PF[tail_q] + tail_extra, 0, 0
    dqa = np.empty(m + 1, np.int64)
    dqb = np.empty(m + 1, np.int64)
    for c in range(1, cmax + 1):
        cur = np.full(m + 1, INF, np.int64)
        ha = ta = hb = tb = 0
        ia = 0                                 # next i for window A (i < Q[j], value prev - PF)
        ib = 0                                 # next i for window B (Q[j] <= i < j, value prev)
        for j in range(1, m + 1):
            lo_bytes = PS[j - 1] + seg_saved[j - 1] - cand_saved[j - 1] + (c - 1 + end_alive) * unit - budget
            q = Q[j]
            while ia < q:
                if prev[ia] < INF:
                    v = prev[ia] - PF[ia]
                    while ta > ha and prev[dqa[ta - 1]] - PF[dqa[ta - 1]] >= v:
                        ta -= 1
                    dqa[ta] = ia
                    ta += 1
                ia += 1
            if ib < q:
                ib = q
            while ib < j:
                if prev[ib] < INF:
                    while tb > hb and prev[dqb[tb - 1]] >= prev[ib]:
                        tb -= 1
                    dqb[tb] = ib
                    tb += 1
                ib += 1
            while ha < ta and PS[dqa[ha]] < lo_bytes:
                ha += 1
            while hb < tb and (PS[dqb[hb]] < lo_bytes or dqb[hb] < q):
                hb += 1
            val = INF
            arg = -1
            if ha < ta:
                a = dqa[ha]
                val = prev[a] - PF[a] + PF[q]
                arg = a
            if hb < tb and prev[dqb[hb]] < val:
                val = prev[dqb[hb]]
                arg = dqb[hb]
            if arg < 0:
                continue
            cur[j] = val + extra[j]
            back[c, j] = arg
            # the tail after the last kept point j is recomputed from j: every kept point is alive
            if c * unit + tail_saved + (PS[m] - PS[j]) <= budget:
                total = cur[j] + tail_extra + (PF[tail_q] - PF[j] if tail_q > j else 0)
                if total < best:
                    best, best_c, best_j = total, c, j
        prev = cur
    kept = np.zeros(m, np.uint8)
    if best_c < 0:
        return False, kept
    c = best_c
    j = best_j
    while c > 0:
        kept[j - 1] = 1
        j = back[c, j]
        c -= 1
    return True, kept
