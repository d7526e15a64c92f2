"""A group: connected elementwise nodes that the fusion pass (fuse.py) made one node.

The group node keeps its last member's id, shape and buffer; its sources are the
group's external inputs (at most four).  Its runner walks the output in chunks of
``CHUNK_ELEMS`` elements and, for each chunk, calls every member's own runner in
order (its chunk runner: native.py), each reading the chunk of its operands and writing
the chunk of its result into a small scratch.  So a member's value never leaves the
cache and takes no arena slot, and every element goes through the same element
functions, in the same order, as unfused: the bits are the unfused program's.

Its code, at ``ip[n, GroupIP.code]`` of the program's group code (fuse.py lays it out):
``[members, then per member: opcode, node, ref of source 0, ref of source 1]``; a ref
below MAX_SRC is an external input (the group node's source slot), one at or above
is the result of member ``ref - MAX_SRC``, -1 none.  The last member writes the output.
"""
from enum import IntEnum

import numpy as np
from numba import carray, njit

from ..ir import MAX_SRC
from ..native import (RUN_CHUNK, RUN_CTX, RUN_GROUPS, RUN_N_GROUPS, RUN_CHUNKS, RUN_N_CHUNKS, address_of,
                      call_runner, data_pointer, operand, output, pointer, run_view, span)
from ..registry import ELEMENTWISE, GROUP, defop
from ..status import OK
from .binary import bcast_strides, row_offset

CHUNK_ELEMS = 4096         # elements of a chunk: its members' scratch stays in cache
MEMBER_WORDS = 4           # opcode, node, two refs
EXTERNAL = MAX_SRC         # refs below it are external inputs


class GroupIP(IntEnum):
    code = 0                 # where the group's code starts in the program's group code


@njit(cache=True)
def _gather(shape, n, s, x, c0, m, buf):
    """Elements [c0, c0 + m) of node s's data x broadcast to node n's shape, into buf: row
    by row (a row of n's innermost axis is a stretch of x, or one value of it)."""
    if x.size == 1:
        for i in range(m):
            buf[i] = x[0]
        return
    s0, s1, s2, s3 = bcast_strides(shape, s)
    inner = shape[n, 3]
    i = 0
    while i < m:
        r = (c0 + i) // inner
        j0 = c0 + i - r * inner
        count = min(inner - j0, m - i)
        at = row_offset(shape, n, r, s0, s1, s2) + j0 * s3
        piece = buf[i:i + count]
        if s3 == 1:
            row = x[at:at + count]
            for q in range(count):
                piece[q] = row[q]
        else:
            for q in range(count):
                piece[q] = x[at]
        i += count


def _run_group(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    out = output(v, n)
    size = out.size
    lo, hi = span(lo, hi, size)
    code = carray(pointer(v.ctx[RUN_GROUPS], np.int64), v.ctx[RUN_N_GROUPS])
    chunks = carray(pointer(v.ctx[RUN_CHUNKS], np.int64), v.ctx[RUN_N_CHUNKS])
    at = v.ip[n, GroupIP.code]
    k = code[at]
    # scratch: a chunk for each member's result but the last, and for each broadcast input
    scratch = np.empty((k - 1 + MAX_SRC) * CHUNK_ELEMS, out.dtype)
    local = np.empty(RUN_CTX, np.int64)       # this call's ctx: the chunk's addresses are its own
    for i in range(RUN_CTX):
        local[i] = v.ctx[i]
    local_p = data_pointer(local)
    inputs = np.zeros(MAX_SRC, np.int64)      # the chunk's address in each external input
    for c0 in range(lo, hi, CHUNK_ELEMS):
        m = min(CHUNK_ELEMS, hi - c0)
        for e in range(MAX_SRC):
            if v.src[n, e] < 0:
                break
            x = operand(v, n, e)
            if x.size == size:                # read where it is
                inputs[e] = address_of(x[c0:c0 + m])
            else:                             # a scalar or a broadcast: its chunk gathered first
                buf = scratch[(k - 1 + e) * CHUNK_ELEMS:(k - 1 + e) * CHUNK_ELEMS + m]
                _gather(v.shape, n, v.src[n, e], x, c0, m, buf)
                inputs[e] = address_of(buf)
        for j in range(k):
            w = at + 1 + MEMBER_WORDS * j
            if j == k - 1:
                local[RUN_CHUNK] = address_of(out[c0:c0 + m])
            else:
                local[RUN_CHUNK] = address_of(scratch[j * CHUNK_ELEMS:j * CHUNK_ELEMS + m])
            for q in range(2):
                ref = code[w + 2 + q]
                if ref < 0:
                    local[RUN_CHUNK + 1 + q] = 0
                elif ref < EXTERNAL:
                    local[RUN_CHUNK + 1 + q] = inputs[ref]
                else:
                    i = ref - EXTERNAL
                    local[RUN_CHUNK + 1 + q] = address_of(scratch[i * CHUNK_ELEMS:i * CHUNK_ELEMS + m])
            status = call_runner(chunks[code[w]], code[w + 1], 0, m, local_p, mem, store)     # elements [0, m)
            if status != OK:
                return status
    return OK


defop(GROUP, "group", None, _run_group, arity=-1, kind=ELEMENTWISE, public=False, ip=GroupIP,
      label="group")


def members_of(code: np.ndarray, at: int) -> list:
    """The member node ids of the group whose code starts at ``at``, in order."""
    k = int(code[at])
    return [int(code[at + 2 + MEMBER_WORDS * j]) for j in range(k)]
