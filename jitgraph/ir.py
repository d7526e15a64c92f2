"""The graph IR: nodes as a struct of numpy arrays.

Row ``n`` of every array describes node ``n``.  Nodes are append-only, so a
node's sources always have smaller ids and a node id is stable for the life of
the graph (dropout uses it as the identity of its random mask).

* ``op``      int64    opcode (see ``jitgraph.ops``)
* ``src``     int64    [n, MAX_SRC] source ids, -1 where unused
* ``ndim``    int64    number of dimensions (0..MAX_DIMS)
* ``shape``   int64    [n, MAX_DIMS] shape, left-padded with 1s to MAX_DIMS, so
                       kernels always see four dims
* ``ip``      int64    [n, N_IP] integer op parameters (axes masks, perms, seeds ...)
* ``fp``      float64  [n, N_FP] float op parameters (eps, p, scale ...)
* ``flags``   int64    bit set of F_* below
* ``origin``  int64    for gradient / recomputed nodes: the forward node it comes
                       from (-1 otherwise)
* ``rule``    int64    for gradient nodes: which source's rule made it (-1 otherwise)

Every integer field is int64 so that values read from any of them, node ids and
literals all have one Numba type: a helper like ``new_node`` then compiles once,
not once per mix of int32 and int64 arguments (that cost seconds of cold start).

Jitted passes receive the arrays as one named tuple ``G`` (:class:`Nodes`: ``G.op``,
``G.src`` ...); they append rows in place and report the new count.  Capacity grows
by doubling on the Python side, before a pass that may need it.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

MAX_SRC = 4
MAX_DIMS = 4
N_IP = 10         # enough for a convolution's dilation, groups, mode, padding, stride and contracted length
N_FP = 2

# node flags
F_INPUT = 1 << 0
F_PARAM = 1 << 1
F_CONST = 1 << 2
F_OUTPUT = 1 << 3
F_LOSS = 1 << 4
F_CHECKPOINT = 1 << 5
F_GRAD = 1 << 6         # a node of a backward pass
F_RECOMPUTED = 1 << 7   # a copy of a forward node rebuilt in backward
F_INDEX = 1 << 8        # an input holding integer indices (embedding)
F_SEGMENT = 1 << 9      # built inside jg.checkpoint(fn, ...): recompute in backward
F_PARAM_GRAD = 1 << 10  # the final gradient of a param (kept, not overwritten)
F_LEAF = F_INPUT | F_PARAM | F_CONST

FLAG_NAMES = (
    (F_INPUT, "input"), (F_PARAM, "param"), (F_CONST, "const"), (F_OUTPUT, "output"),
    (F_LOSS, "loss"), (F_CHECKPOINT, "checkpoint"), (F_GRAD, "grad"),
    (F_RECOMPUTED, "recomputed"), (F_INDEX, "index"), (F_SEGMENT, "segment"),
    (F_PARAM_GRAD, "param_grad"),
)


@njit(cache=True)
def numel(shape, n):
    """Elements of node n (``shape``: the node table's shape column)."""
    return shape[n, 0] * shape[n, 1] * shape[n, 2] * shape[n, 3]


class Nodes(NamedTuple):
    """The node table's arrays as jitted code sees them (``G.op[n]``, ``G.shape[n, d]``)."""
    op: np.ndarray
    src: np.ndarray
    ndim: np.ndarray
    shape: np.ndarray
    ip: np.ndarray
    fp: np.ndarray
    flags: np.ndarray
    origin: np.ndarray
    rule: np.ndarray


FIELDS = Nodes._fields

# where a node's data lives at run time.  A program's run buffer is one array,
# [arena | io]: the planned, reused arena (peak_bytes) followed by persistent
# slots for inputs and param gradients; ARENA and IO offsets index the same
# array, so kernels choose between two buffers only (run buffer or value store).
LOC_ARENA = 0   # the planned, reused arena
LOC_STORE = 1   # the graph's value store (params, consts)
LOC_IO = 2      # persistent slots after the arena (inputs, param gradients)

BUFFER_ALIGN = 64   # bytes: where a run buffer and the value store start


def aligned_zeros(n, dtype):
    """``n`` zeros of ``dtype`` starting on a 64-byte boundary.  numpy's big arrays start
    16 bytes past one (malloc's header), which would misalign every offset the memory plan
    aligns: measured 5% slower BLAS products and vector loops that straddle cache lines."""
    dtype = np.dtype(dtype)
    spare = BUFFER_ALIGN // dtype.itemsize
    raw = np.zeros(n + spare, dtype)
    skip = (-raw.ctypes.data % BUFFER_ALIGN) // dtype.itemsize
    return raw[skip:skip + n]


def flag_names(flags):
    return [name for bit, name in FLAG_NAMES if flags & bit]


class NodeTable:
    """Growable struct-of-arrays node storage with fast single-row appends.

    Appends from Python go through memoryviews (a numpy scalar store costs ~10x
    more), which keeps graph building from Python near 1 microsecond per node.
    """

    op: np.ndarray
    src: np.ndarray
    ndim: np.ndarray
    shape: np.ndarray
    ip: np.ndarray
    fp: np.ndarray
    flags: np.ndarray
    origin: np.ndarray
    rule: np.ndarray

    def __init__(self, capacity: int = 256) -> None:
        self.n = 0
        self._allocate(max(int(capacity), 16))

    def _allocate(self, cap):
        old = getattr(self, "op", None)
        new = dict(
            op=np.zeros(cap, np.int64),
            src=np.full((cap, MAX_SRC), -1, np.int64),
            ndim=np.zeros(cap, np.int64),
            shape=np.ones((cap, MAX_DIMS), np.int64),
            ip=np.zeros((cap, N_IP), np.int64),
            fp=np.zeros((cap, N_FP), np.float64),
            flags=np.zeros(cap, np.int64),
            origin=np.full(cap, -1, np.int64),
            rule=np.full(cap, -1, np.int64),
        )
        if old is not None:
            for name, arr in new.items():
                arr[: self.n] = getattr(self, name)[: self.n]
        for name, arr in new.items():
            setattr(self, name, arr)
        self.capacity = cap
        # flat memoryviews for cheap scalar stores from Python
        self._m_op = memoryview(self.op)
        self._m_src = memoryview(self.src.reshape(-1))
        self._m_ndim = memoryview(self.ndim)
        self._m_shape = memoryview(self.shape.reshape(-1))
        self._m_ip = memoryview(self.ip.reshape(-1))
        self._m_fp = memoryview(self.fp.reshape(-1))
        self._m_flags = memoryview(self.flags)

    def copy(self, capacity=None, rows=None):
        """A table holding this one's first ``rows`` nodes (default: all), with room
        for ``capacity`` in all."""
        rows = self.n if rows is None else rows
        other = NodeTable(max(capacity or 0, rows, 16))
        for name in FIELDS:
            getattr(other, name)[:rows] = getattr(self, name)[:rows]
        other.n = rows
        return other

    def reserve(self, extra):
        """Make room for ``extra`` more nodes (doubling)."""
        need = self.n + int(extra)
        if need > self.capacity:
            cap = self.capacity
            while cap < need:
                cap *= 2
            self._allocate(cap)

    def truncate(self, n):
        """Drop the nodes from id ``n`` on; their rows return to the defaults ``append``
        relies on."""
        end = self.n
        self.op[n:end] = 0
        self.src[n:end] = -1
        self.ndim[n:end] = 0
        self.shape[n:end] = 1
        self.ip[n:end] = 0
        self.fp[n:end] = 0.0
        self.flags[n:end] = 0
        self.origin[n:end] = -1
        self.rule[n:end] = -1
        self.n = min(n, end)

    def arrays(self) -> Nodes:
        """The named tuple G handed to jitted passes."""
        return Nodes(self.op, self.src, self.ndim, self.shape, self.ip, self.fp,
                     self.flags, self.origin, self.rule)

    def append(self, op, srcs, shape, ip=(), fp=(), flags=0):
        """Append one node; ``shape`` is an unpadded tuple. Returns the node id."""
        n = self.n
        if n == self.capacity:
            self._allocate(2 * n)
        self._m_op[n] = op
        k = n * MAX_SRC
        m = self._m_src
        for s in srcs:
            m[k] = s
            k += 1
        nd = len(shape)
        self._m_ndim[n] = nd
        m = self._m_shape
        k = n * MAX_DIMS + MAX_DIMS - nd
        for d in shape:
            m[k] = d
            k += 1
        if ip:
            m = self._m_ip
            k = n * N_IP
            for v in ip:
                m[k] = v
                k += 1
        if fp:
            m = self._m_fp
            k = n * N_FP
            for v in fp:
                m[k] = v
                k += 1
        if flags:
            self._m_flags[n] = flags
        self.n = n + 1
        return n

    def shape_of(self, n):
        nd = int(self.ndim[n])
        return tuple(int(d) for d in self.shape[n, MAX_DIMS - nd:])

    def sources(self, n):
        return [int(s) for s in self.src[n] if s >= 0]
