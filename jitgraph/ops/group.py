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

An **epilogue** is a group whose members include a *producer*: a node that is not
elementwise but makes its output image by image (registry ``epilogue``: conv2d), read
by the group alone.  Its runner takes images as units: for a few images at a time
(``EPILOGUE_ELEMS``) it runs the producer's own runner into a scratch (native.py's
RUN_INTO), then the other members over those images' chunks, reading the producer's
values in that scratch while they are in cache -- bias, residual add and activation in
the convolution's output pass.  The producer computes every element as it does alone,
so the bits are still the unfused program's.  ``ip[n, GroupIP.producer]`` is the
producer's place among the members.
"""
from enum import IntEnum

import numpy as np
from numba import carray, njit

from ..ir import MAX_SRC, numel
from ..native import (RUN_CHUNK, RUN_CTX, RUN_EXTENT, RUN_GROUPS, RUN_INTO, RUN_N_GROUPS, RUN_CHUNKS, RUN_N_CHUNKS,
                      RUN_N_RUNNERS, RUN_RUNNERS, address_of, call_runner, data_pointer, operand, output, pointer,
                      run_view, span)
from ..registry import COMPUTE, CUSTOM, ELEMENTWISE, EPILOGUE, GROUP, defop
from ..status import OK
from .binary import bcast_strides, row_offset

CHUNK_ELEMS = 4096         # elements of a chunk: its members' scratch stays in cache
EPILOGUE_ELEMS = 1 << 15   # an epilogue's producer writes about this many elements (whole images) at a time
MEMBER_WORDS = 4           # opcode, node, two refs
EXTERNAL = MAX_SRC         # refs below it are external inputs


class GroupIP(IntEnum):
    code = 0                 # where the group's code starts in the program's group code
    producer = 1             # an epilogue's producer: its place among the members


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


@njit(cache=True)
def _used(code, at, k, producer):
    """Which external inputs the members (but the producer) read."""
    used = np.zeros(MAX_SRC, np.uint8)
    for j in range(k):
        if j != producer:
            for q in range(2):
                ref = code[at + 1 + MEMBER_WORDS * j + 2 + q]
                if 0 <= ref < EXTERNAL:
                    used[ref] = 1
    return used


@njit(cache=True, inline="always")
def _run_chunk(v, n, c0, m, code, chunks, at, scratch, inputs, used, local, local_p, mem, store, producer,
               produced):
    """Elements [c0, c0 + m) of group n: each member's chunk runner in order, the last writing
    the output; the member ``producer`` (-1: none) is not run, its values are at address ``produced``."""
    out = output(v, n)
    k = code[at]
    for e in range(MAX_SRC):
        if used[e] == 0:
            continue
        x = operand(v, n, e)
        if x.size == out.size:                # read where it is
            inputs[e] = address_of(x[c0:c0 + m])
        else:                                 # a scalar or a broadcast: its chunk gathered first
            buf = scratch[(k - 1 + e) * CHUNK_ELEMS:(k - 1 + e) * CHUNK_ELEMS + m]
            _gather(v.shape, n, v.src[n, e], x, c0, m, buf)
            inputs[e] = address_of(buf)
    for j in range(k):
        if j == producer:
            continue
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
            elif ref - EXTERNAL == producer:
                local[RUN_CHUNK + 1 + q] = produced
            else:
                i = ref - EXTERNAL
                local[RUN_CHUNK + 1 + q] = address_of(scratch[i * CHUNK_ELEMS:i * CHUNK_ELEMS + m])
        status = call_runner(chunks[code[w]], code[w + 1], 0, m, local_p, mem, store)     # elements [0, m)
        if status != OK:
            return status
    return OK


@njit(cache=True, inline="always")
def _local(v):
    """A copy of the run's ctx for one call: the chunks' addresses are its own."""
    local = np.empty(RUN_CTX, np.int64)
    for i in range(RUN_CTX):
        local[i] = v.ctx[i]
    return local


def _run_group(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    lo, hi = span(lo, hi, numel(v.shape, n))
    code = carray(pointer(v.ctx[RUN_GROUPS], np.int64), v.ctx[RUN_N_GROUPS])
    chunks = carray(pointer(v.ctx[RUN_CHUNKS], np.int64), v.ctx[RUN_N_CHUNKS])
    at = v.ip[n, GroupIP.code]
    k = code[at]
    # scratch: a chunk for each member's result but the last, and for each broadcast input
    scratch = np.empty((k - 1 + MAX_SRC) * CHUNK_ELEMS, v.mem.dtype)
    local = _local(v)
    local_p = data_pointer(local)
    inputs = np.zeros(MAX_SRC, np.int64)      # the chunk's address in each external input
    used = _used(code, at, k, -1)
    for c0 in range(lo, hi, CHUNK_ELEMS):
        status = _run_chunk(v, n, c0, min(CHUNK_ELEMS, hi - c0), code, chunks, at, scratch, inputs, used, local,
                            local_p, mem, store, -1, 0)
        if status != OK:
            return status
    return OK


defop(GROUP, "group", None, _run_group, arity=-1, kind=ELEMENTWISE, public=False, ip=GroupIP,
      label="group")


def _run_epilogue(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    images = v.shape[n, 0]
    if lo < 0:                                # units: images
        v.ctx[RUN_EXTENT] = images
        return OK
    lo, hi = span(lo, hi, images)
    code = carray(pointer(v.ctx[RUN_GROUPS], np.int64), v.ctx[RUN_N_GROUPS])
    chunks = carray(pointer(v.ctx[RUN_CHUNKS], np.int64), v.ctx[RUN_N_CHUNKS])
    runners = carray(pointer(v.ctx[RUN_RUNNERS], np.int64), v.ctx[RUN_N_RUNNERS])
    at = v.ip[n, GroupIP.code]
    k, producer = code[at], v.ip[n, GroupIP.producer]
    w = at + 1 + MEMBER_WORDS * producer
    run, p = runners[code[w]], code[w + 1]
    local = _local(v)
    local_p = data_pointer(local)
    call_runner(run, p, -1, -1, local_p, mem, store)      # the producer's units (image-major) into RUN_EXTENT
    per_image = local[RUN_EXTENT] // images
    image = numel(v.shape, n) // images
    step = max(1, EPILOGUE_ELEMS // image)
    into = np.empty(min(step, hi - lo) * image, v.mem.dtype)      # the producer's values of `step` images
    scratch = np.empty((k - 1 + MAX_SRC) * CHUNK_ELEMS, v.mem.dtype)
    inputs = np.zeros(MAX_SRC, np.int64)
    used = _used(code, at, k, producer)
    for i0 in range(lo, hi, step):
        i1 = min(i0 + step, hi)
        local[RUN_INTO], local[RUN_INTO + 1], local[RUN_INTO + 2] = address_of(into), i0 * image, (i1 - i0) * image
        status = call_runner(run, p, i0 * per_image, i1 * per_image, local_p, mem, store)
        local[RUN_INTO] = 0
        if status != OK:
            return status
        for c0 in range(i0 * image, i1 * image, CHUNK_ELEMS):
            m = min(CHUNK_ELEMS, i1 * image - c0)
            status = _run_chunk(v, n, c0, m, code, chunks, at, scratch, inputs, used, local, local_p, mem, store,
                                producer, address_of(into[c0 - i0 * image:c0 - i0 * image + m]))
            if status != OK:
                return status
    return OK


defop(EPILOGUE, "epilogue", None, _run_epilogue, arity=-1, cost=COMPUTE, public=False, ip=GroupIP, split=CUSTOM,
      label="epilogue")


def members_of(code: np.ndarray, at: int) -> list:
    """The member node ids of the group whose code starts at ``at``, in order."""
    k = int(code[at])
    return [int(code[at + 2 + MEMBER_WORDS * j]) for j in range(k)]
