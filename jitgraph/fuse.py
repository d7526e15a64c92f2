"""Fusion: connected elementwise nodes become one group node (ops/group.py).

After the backward expansion and the checkpoint rewrite, before the memory plan, a
jitted pass walks the execution order and lets each fusable node (registry
``fuse``) absorb a source that is fusable too, has the node's shape, is read by no
other node and is not kept (an output, a gradient the program returns, an io
slot): the source's group joins the node's.  A group has at most ``MAX_SRC``
external inputs (a node's source slots) and ``MAX_MEMBERS`` members.  Its members run
when its last one does, so a source whose group's inputs would otherwise die earlier
joins only if those inputs are no bigger than what it saves (its own buffer): fusion
never trades a smaller tensor for bigger ones held longer.

A convolution (an op declared ``epilogue=True``) read by one fusable node and not kept
joins that node's group too, as its *producer*: the group becomes an EPILOGUE node
that runs the convolution image by image and its other members over each image's
output while it is in cache (ops/group.py).  A group has at most one producer.

The result is the program's own copy of the node table's op, src and ip columns,
in which each group's last member has become a GROUP node (its sources the group's
external inputs, ``ip[GroupIP.code]`` where its code starts in one int64 array), and
the execution order without the other members.  The graph itself is not changed, and
the memory plan of that order gives the members no arena slot.
"""
from typing import NamedTuple, Union

import numpy as np
from numba import njit

from .errors import GraphError
from .ir import F_LEAF, MAX_SRC, Nodes, numel
from .ops.group import EXTERNAL, MEMBER_WORDS, GroupIP
from .plan import plan_memory
from .registry import EPILOGUE, GROUP, table

MAX_MEMBERS = 16           # a group's scratch: a chunk per member
# fuse="auto" fuses where it pays: a fusable node of FUSE_MIN_ELEMENTS elements (256 KiB of
# float32: its neighbours' traffic leaves the cache) or FUSE_MIN_NODES fusable nodes (the
# interpreter's per-node cost).  Elsewhere a program's elementwise work stays in cache and is
# cheap to dispatch, and fusing would only add the pass's and the group runner's first
# compile (~2 s of CPU) to its cold start.
FUSE_MIN_ELEMENTS = 1 << 16
FUSE_MIN_NODES = 1024
# and, below FUSE_MIN_NODES, only groups of FUSE_MIN_MEMBERS or more: measured on an AMD EPYC Zen 5
# (perf/RESULTS.md), a two-member group runs at 1.00-1.04x its members alone (they write in place,
# the group's traffic saving is small), three or more members at 0.91-0.97x
FUSE_MIN_MEMBERS = 3       # (an epilogue of two members is kept: it saves its activation's pass)


@njit(cache=True)
def _read_before(src, n, k):
    """Does node n read its source k in an earlier slot too?"""
    for j in range(k):
        if src[n, j] == src[n, k]:
            return True
    return False


@njit(cache=True)
def _holds(here, count, x):
    for j in range(count):
        if here[j] == x:
            return True
    return False


@njit(cache=True)
def _groups(op, src, shape, flags, n_nodes, order, keep, fusable, epilogue, max_members):
    """The groups of ``order``: each group's member list (``head`` to its last member through
    ``nxt``, in execution order), its size ``count``, external inputs ``ext`` (``n_ext``
    of them) and ``producer`` (an epilogue's, or -1), all indexed by its last member;
    ``absorbed`` marks the other members."""
    m = order.size
    readers = np.zeros(n_nodes, np.int64)           # distinct nodes that read each node
    last = np.full(n_nodes, -1, np.int64)           # and the position of the last
    pos = np.full(n_nodes, -1, np.int64)
    for t in range(m):
        n = order[t]
        pos[n] = t
        for k in range(MAX_SRC):
            if src[n, k] < 0:
                break
            if not _read_before(src, n, k):
                readers[src[n, k]] += 1
                last[src[n, k]] = t
    head = np.full(n_nodes, -1, np.int64)
    tail = np.full(n_nodes, -1, np.int64)
    nxt = np.full(n_nodes, -1, np.int64)
    count = np.zeros(n_nodes, np.int64)
    ext = np.full((n_nodes, MAX_SRC), -1, np.int64)
    n_ext = np.zeros(n_nodes, np.int64)
    absorbed = np.zeros(n_nodes, np.uint8)
    producer = np.full(n_nodes, -1, np.int64)
    here = np.empty(4 * MAX_SRC, np.int64)         # the node's external inputs so far
    for t in range(m):
        c = order[t]
        if epilogue[op[c]]:                         # a group of one that an elementwise reader may join
            head[c], tail[c], count[c], producer[c] = c, c, 1, c
            for k in range(MAX_SRC):
                if src[c, k] >= 0 and not _read_before(src, c, k):
                    ext[c, n_ext[c]] = src[c, k]
                    n_ext[c] += 1
        if not fusable[op[c]]:
            continue
        h, tl, members, n_here, made_by = -1, -1, 1, 0, -1     # the absorbed members' list, without c
        for k in range(MAX_SRC):
            s = src[c, k]
            if s < 0:
                break
            if _read_before(src, c, k):
                continue
            ok = ((fusable[op[s]] != 0 or epilogue[op[s]] != 0) and head[s] >= 0 and readers[s] == 1
                  and keep[s] == 0 and members + count[s] <= max_members and (made_by < 0 or producer[s] < 0))
            for d in range(4):
                ok = ok and shape[s, d] == shape[c, d]
            if ok and pos[s] < t - 1:               # inputs held past other steps: at most the buffer it saves
                held = 0
                for e in range(n_ext[s]):
                    x = ext[s, e]
                    if last[x] < t and (flags[x] & F_LEAF) == 0:
                        held += numel(shape, x)
                ok = held <= numel(shape, s)
            if ok:                                  # the inputs it would have, with slots for the sources to come
                union = n_here
                for e in range(n_ext[s]):
                    union += not _holds(here, n_here, ext[s, e])
                for q in range(k + 1, MAX_SRC):
                    union += src[c, q] >= 0
                ok = union <= MAX_SRC
            if not ok:                              # an input of c's group
                if not _holds(here, n_here, s):
                    here[n_here] = s
                    n_here += 1
                continue
            for e in range(n_ext[s]):               # s's group joins: its inputs, its members
                x = ext[s, e]
                if not _holds(here, n_here, x):
                    here[n_here] = x
                    n_here += 1
                last[x] = max(last[x], t)           # now read here
            if producer[s] >= 0:
                made_by = producer[s]
            if h < 0:
                h = head[s]
            else:
                nxt[tl] = head[s]
            tl = tail[s]
            members += count[s]
            x = head[s]
            while x >= 0:
                absorbed[x] = 1
                x = nxt[x]
        if h < 0:
            h = c
        else:
            nxt[tl] = c
        head[c], tail[c], count[c], producer[c] = h, c, members, made_by
        n_ext[c] = n_here
        for j in range(n_here):
            ext[c, j] = here[j]
    return head, nxt, count, ext, n_ext, producer, absorbed


@njit(cache=True)
def _drop_small(order, head, nxt, count, producer, absorbed, min_members):
    """Dissolve the groups of fewer than ``min_members`` but epilogues: their members run alone."""
    for n in order:
        if absorbed[n] == 0 and 2 <= count[n] < min_members and producer[n] < 0:
            x = head[n]
            while x >= 0:
                y = nxt[x]
                absorbed[x], count[x], head[x], nxt[x] = 0, 1, x, -1
                x = y


@njit(cache=True)
def _lay_out(op, src, ip, order, head, nxt, count, ext, n_ext, producer, absorbed):
    """Rewrite the copies op, src, ip for the groups; returns (order, code, root of each node)."""
    n_nodes = op.size
    root = np.full(n_nodes, -1, np.int64)
    place = np.full(n_nodes, -1, np.int64)
    size = 0
    for n in order:
        if absorbed[n] == 0 and count[n] >= 2:
            size += 1 + MEMBER_WORDS * count[n]
    code = np.zeros(max(size, 1), np.int64)
    at = 0
    kept = np.zeros(order.size, np.bool_)
    for t in range(order.size):
        r = order[t]
        kept[t] = absorbed[r] == 0
        if absorbed[r] != 0 or count[r] < 2:
            continue
        code[at] = count[r]
        x, j = head[r], 0
        while x >= 0:
            root[x], place[x] = r, j
            w = at + 1 + MEMBER_WORDS * j
            code[w], code[w + 1] = op[x], x
            for q in range(2):
                s = src[x, q]
                ref = -1
                if s >= 0:
                    if root[s] == r:
                        ref = EXTERNAL + place[s]
                    else:
                        for e in range(n_ext[r]):
                            if ext[r, e] == s:
                                ref = e
                code[w + 2 + q] = ref
            x, j = nxt[x], j + 1
        op[r] = GROUP if producer[r] < 0 else EPILOGUE
        for k in range(MAX_SRC):
            src[r, k] = ext[r, k]
        ip[r, :] = 0
        ip[r, GroupIP.code] = at
        if producer[r] >= 0:
            ip[r, GroupIP.producer] = place[producer[r]]
        at += 1 + MEMBER_WORDS * count[r]
    return order[kept], code, root


def is_group(ops: np.ndarray) -> np.ndarray:
    """Which of these opcodes run a group's members (a group or an epilogue)."""
    return (ops == GROUP) | (ops == EPILOGUE)


class Fused(NamedTuple):
    order: np.ndarray      # the execution order with each group as its last member
    nodes: Nodes           # the node table as the program runs it (op, src, ip: copies)
    code: np.ndarray       # every group's code (ops/group.py)
    root: np.ndarray       # each node's group (its last member), or -1
    n_groups: int


def fuse_order(G: Nodes, n_nodes: int, order: np.ndarray, keep: np.ndarray, min_members: int = 2) -> Fused:
    """The groups of ``order`` (``keep``: nodes whose values must stay: outputs, io slots) of
    ``min_members`` or more."""
    keep_mask = np.zeros(n_nodes, np.uint8)
    keep_mask[np.asarray(keep, np.int64)] = 1
    head, nxt, count, ext, n_ext, producer, absorbed = _groups(G.op, G.src, G.shape, G.flags, n_nodes, order,
                                                               keep_mask, table("fuse"), table("epilogue"),
                                                               MAX_MEMBERS)
    if min_members > 2:
        _drop_small(order, head, nxt, count, producer, absorbed, min_members)
    if not np.any(absorbed):                        # no group: nothing to copy or lay out
        return unfused(G, n_nodes, order)
    op, src, ip = G.op[:n_nodes].copy(), G.src[:n_nodes].copy(), G.ip[:n_nodes].copy()
    fused_order, code, root = _lay_out(op, src, ip, order, head, nxt, count, ext, n_ext, producer, absorbed)
    nodes = Nodes(op, src, G.ndim[:n_nodes], G.shape[:n_nodes], ip, G.fp[:n_nodes], G.flags[:n_nodes],
                  G.origin[:n_nodes], G.rule[:n_nodes])
    return Fused(fused_order, nodes, code, root, int(np.count_nonzero(is_group(op[fused_order]))))


def unfused(G: Nodes, n_nodes: int, order: np.ndarray) -> Fused:
    """No groups: the graph's own table (``build_forward(..., fuse=False)``)."""
    return Fused(order, G, np.zeros(1, np.int64), np.full(n_nodes, -1, np.int64), 0)


def wants_fusion(G: Nodes, order: np.ndarray, fuse: Union[bool, str]) -> int:
    """The least members of the groups to form for ``fuse`` (True, False or "auto") in the
    program ``order``, 0 for none: True forms every group (2), False none; "auto" every
    group when it has FUSE_MIN_NODES fusable nodes (the interpreter's per-node cost), the
    groups of FUSE_MIN_MEMBERS when one has FUSE_MIN_ELEMENTS elements, else none."""
    if fuse is True or fuse is False:
        return 2 if fuse else 0
    if fuse != "auto":
        raise GraphError(f"fuse must be True, False or 'auto', got {fuse!r}")
    is_fusable = table("fuse")[G.op[order]] != 0
    if np.count_nonzero(is_fusable) >= FUSE_MIN_NODES:
        return 2
    return FUSE_MIN_MEMBERS if np.any(G.shape[order[is_fusable]].prod(axis=1) >= FUSE_MIN_ELEMENTS) else 0


def fuse_and_plan(G: Nodes, n_nodes: int, orders: list, io: np.ndarray, outputs: np.ndarray, in_place: bool,
                  fuse: Union[bool, str] = "auto") -> tuple:
    """(order, Fused, plan) of the candidate order whose plan, after fusion, peaks lowest
    (the first on ties): what a program runs, and what the checkpoint planners price."""
    min_members = wants_fusion(G, orders[0], fuse)
    fuse = min_members > 0
    kinds, overwrites, best = table("kind"), table("overwrites"), None
    keep = np.concatenate([np.asarray(outputs, np.int64), np.asarray(io, np.int64)])
    for order in orders:
        f = fuse_order(G, n_nodes, order, keep, min_members) if fuse else unfused(G, n_nodes, order)
        # the candidates hold the same nodes and readers: one without groups is taken for all (it
        # saves the pass over the others, ~0.5 ms on a 60k-node program)
        fuse = fuse and f.n_groups > 0
        plan = plan_memory(f.nodes, n_nodes, f.order, io, outputs, in_place, kinds, overwrites)
        if best is None or plan[2] < best[2][2]:
            best = (order, f, plan)
    assert best is not None, "no candidate order"
    return best
