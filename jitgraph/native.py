"""The native calling convention between the engine and the ops' kernels.

An op's runner (its kernel) is compiled one op at a time, on first use
(``compiler.py``), as a C callback (``numba.cfunc``), and the interpreter calls it
through a table of their addresses indexed by opcode.  So a graph that uses five ops compiles five runners, not all
of them -- and the call is cheaper than Numba's first-class functions (measured:
~15 ns a node against ~47 ns through a tuple of functions, and ~33 ns for the old
if-chain that reference-counted every operand slice).

A runner: ``status = run(n, lo, hi, ctx, mem, store)``

* ``n``     the node to compute;
* ``lo, hi`` the units of work to do (elements, rows ... -- the op's ``split``):
            [lo, hi), or all of them when ``hi`` is -1; a big node is cut into
            fixed blocks that threads run concurrently (interpreter.py); ``lo`` =
            an op's *chunk runner* (``chunk=`` in the registry) computes ``hi``
            elements of a group's chunk, its output and operands at the addresses in
            ctx[RUN_CHUNK...] (ops/group.py);
* ``ctx``   int64 array: the node table's and the plan's array addresses, the
            run's dropout salt and a slot for a status detail (``RUN_*`` below);
* ``mem``   the run buffer ``[arena | io]`` and ``store`` the graph's value
            store, as pointers to the graph's float dtype.

Runners rebuild typed arrays over those addresses with :func:`run_view` (no
allocation, no reference counting) and then read like any Numba code.
"""
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .ir import MAX_DIMS, MAX_SRC, N_FP, N_IP, LOC_STORE, Nodes, numel

# ---- raw addresses ----------------------------------------------------------------------------


@intrinsic
def address_of(typingctx, arr):
    """The address of a contiguous array's first element, as an int64."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))
    return types.int64(arr), codegen


@intrinsic
def data_pointer(typingctx, arr):
    """A typed pointer to a contiguous array's first element."""
    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, value=args[0]).data
    return types.CPointer(arr.dtype)(arr), codegen


@intrinsic
def pointer(typingctx, address, dtype):
    """``address`` (int64) as a typed pointer, for ``numba.carray``."""
    target = dtype.dtype

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_data_type(target).as_pointer())
    return types.CPointer(target)(address, dtype), codegen


def _call_address(context, builder, signature, args):
    """Codegen of an int64-returning C call through the address in ``args[0]``, with
    the other arguments as they are."""
    addr, *rest = args
    fnty = ir.FunctionType(ir.IntType(64), [a.type for a in rest])
    return builder.call(builder.inttoptr(addr, fnty.as_pointer()), rest)


@intrinsic
def call_runner(typingctx, address, n, lo, hi, ctx, mem, store):
    """``run(n, lo, hi, ctx, mem, store)`` through the runner at ``address``."""
    return types.int64(address, n, lo, hi, ctx, mem, store), _call_address


@intrinsic
def call_blocks(typingctx, address, fn, n, extent, per_block, ctx, mem, store):
    """``blocks(fn, n, extent, per_block, ctx, mem, store)`` through the block runner at
    ``address`` (interpreter.block_runner)."""
    return types.int64(address, fn, n, extent, per_block, ctx, mem, store), _call_address


def _gemm_codegen(int_bits):
    """Codegen of a Fortran ?gemm call whose integer arguments have ``int_bits`` bits."""
    def codegen(context, builder, signature, args):
        dtype = signature.args[7].dtype
        addr, ta, tb, m_, n_, k_, al, a_, lda_, b_, ldb_, be, c_, ldc_ = args
        i8, i32 = ir.IntType(8), ir.IntType(int_bits)
        fty = context.get_value_type(dtype)

        def by_pointer(value, ty):
            slot = cgutils.alloca_once(builder, ty)
            builder.store(value, slot)
            return slot

        def trans(flag):            # 1 -> 'T', 0 -> 'N'
            return by_pointer(builder.select(builder.icmp_signed("!=", flag, flag.type(0)), i8(ord("T")),
                                             i8(ord("N"))), i8)

        def int32(value):
            return by_pointer(value if int_bits == 64 else builder.trunc(value, i32), i32)

        def scalar(value, from_type):
            return by_pointer(context.cast(builder, value, from_type, dtype), fty)

        argv = [trans(ta), trans(tb), int32(m_), int32(n_), int32(k_), scalar(al, signature.args[6]), a_,
                int32(lda_), b_, int32(ldb_), scalar(be, signature.args[11]), c_, int32(ldc_)]
        fnty = ir.FunctionType(ir.VoidType(), [v.type for v in argv])
        builder.call(builder.inttoptr(addr, fnty.as_pointer()), argv)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _fortran_gemm(typingctx, address, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Column-major C = alpha op(A) op(B) + beta C through the Fortran ?gemm at ``address``
    (every argument by pointer, 32-bit integers: scipy's cython_blas, MKL's LP64)."""
    sig = types.void(address, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    return sig, _gemm_codegen(32)


@intrinsic
def _fortran_gemm64(typingctx, address, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """``_fortran_gemm`` for a BLAS built with 64-bit integers (ILP64, as numpy's OpenBLAS)."""
    sig = types.void(address, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    return sig, _gemm_codegen(64)


BLIS_TRANSPOSE = 8          # BLIS's trans_t: BLIS_NO_TRANSPOSE is 0, BLIS_TRANSPOSE the transpose bit (1 << 3)


def _blis_codegen(context, builder, signature, args):
    """Codegen of BLIS's typed ``bli_?gemm(transa, transb, m, n, k, *alpha, a, rsa, csa, b,
    rsb, csb, *beta, c, rsc, csc)``: dims and strides 64-bit, trans_t a 32-bit enum, only
    the scalars by pointer.  A column-major matrix with leading dim ld has strides (1, ld)."""
    dtype = signature.args[7].dtype
    addr, ta, tb, m_, n_, k_, al, a_, lda_, b_, ldb_, be, c_, ldc_ = args
    i32, i64 = ir.IntType(32), ir.IntType(64)
    fty = context.get_value_type(dtype)

    def scalar(value, from_type):
        slot = cgutils.alloca_once(builder, fty)
        builder.store(context.cast(builder, value, from_type, dtype), slot)
        return slot

    def trans(flag):
        return builder.select(builder.icmp_signed("!=", flag, flag.type(0)), i32(BLIS_TRANSPOSE), i32(0))

    def wide(value):
        return builder.sext(value, i64) if value.type.width < 64 else value

    one = i64(1)
    argv = [trans(ta), trans(tb), wide(m_), wide(n_), wide(k_), scalar(al, signature.args[6]),
            a_, one, wide(lda_), b_, one, wide(ldb_), scalar(be, signature.args[11]), c_, one, wide(ldc_)]
    fnty = ir.FunctionType(ir.VoidType(), [v.type for v in argv])
    builder.call(builder.inttoptr(addr, fnty.as_pointer()), argv)
    return context.get_dummy_value()


@intrinsic
def _blis_gemm(typingctx, address, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    sig = types.void(address, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    return sig, _blis_codegen


# how the gemm at ctx[RUN_GEMM] is called (blas.py finds it and says which)
FORTRAN_LP64, FORTRAN_ILP64, BLIS_TYPED = 0, 1, 2


@njit(cache=True, inline="always")
def gemm(fn, kind, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Column-major C (m x n, leading dim ldc) = alpha op(A) op(B) + beta C, ``a``, ``b``,
    ``c`` typed pointers, ``transa``/``transb`` 0 or 1, through the gemm at address ``fn``
    called as ``kind`` says (FORTRAN_LP64, FORTRAN_ILP64 or BLIS_TYPED)."""
    if kind == BLIS_TYPED:
        _blis_gemm(fn, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    elif kind == FORTRAN_ILP64:
        _fortran_gemm64(fn, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    else:
        _fortran_gemm(fn, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


# ---- the runners' context ----------------------------------------------------------------------

RUN_ROWS, RUN_SRC, RUN_SHAPE, RUN_IP, RUN_FP, RUN_LOC, RUN_OFF = 0, 1, 2, 3, 4, 5, 6
RUN_MEM_SIZE, RUN_STORE_SIZE, RUN_SALT, RUN_DETAIL = 7, 8, 9, 10
RUN_GEMM = 11              # the main BLAS gemm of the graph's dtype (blas.chosen); products call their bucket's, RUN_GEMMS
RUN_EXTENT = 12            # where a runner called with lo = -1 reports its number of units (split CUSTOM)
RUN_GEMM_KIND = 13         # how that gemm is called: FORTRAN_LP64, FORTRAN_ILP64 or BLIS_TYPED
RUN_TILES = 14             # most tiles a product is cut into: the thread pool's size
RUN_CHUNKS, RUN_N_CHUNKS = 15, 16       # the chunk runner table (a group runs its members' chunks)
RUN_GROUPS, RUN_N_GROUPS = 17, 18       # the program's group code (fuse.py)
RUN_CHUNK = 19             # 3 addresses: a chunk's output and operands (chunk runners)
RUN_RUNNERS, RUN_N_RUNNERS = 22, 23     # the runner table (an epilogue runs its producer's runner)
# where a producer writes its output when an epilogue runs it (ops/group.py): a scratch's address,
# the output element the scratch starts at and its size; address 0: the node's own buffer
RUN_INTO = 24
RUN_GEMMS = RUN_INTO + 3   # each product bucket's gemm address and kind (blas.bucket, gemm_for)
N_GEMM_BUCKETS = 8
RUN_CTX = RUN_GEMMS + 2 * N_GEMM_BUCKETS

SMALL_GEMM = 1 << 20       # blas.SMALL_WORK


@njit(cache=True, inline="always")
def gemm_for(ctx, M, N, K, ta, tb):
    """(address, kind) of the gemm for row-major C (M, N) = op(A) op(B) contracting K: its
    bucket's library (blas.bucket: by transposes and size)."""
    b = RUN_GEMMS + 2 * ((ta * 2 + tb) * 2 + (1 if M * N * K <= SMALL_GEMM else 0))
    return ctx[b], ctx[b + 1]


class RunView(NamedTuple):
    src: np.ndarray
    shape: np.ndarray
    ip: np.ndarray
    fp: np.ndarray
    loc: np.ndarray
    off: np.ndarray
    mem: np.ndarray
    store: np.ndarray
    salt: int
    ctx: np.ndarray


@njit(cache=True)
def run_context(G, loc, off, mem, store, salt, natives, runners, chunks, groups):
    """The ctx array a program's run hands to every runner (``natives``: blas.natives;
    ``runners`` and ``chunks``: the runner and chunk runner tables; ``groups``: the
    program's group code)."""
    ctx = np.empty(RUN_CTX, np.int64)
    ctx[RUN_ROWS] = G.op.size
    ctx[RUN_SRC] = address_of(G.src)
    ctx[RUN_SHAPE] = address_of(G.shape)
    ctx[RUN_IP] = address_of(G.ip)
    ctx[RUN_FP] = address_of(G.fp)
    ctx[RUN_LOC] = address_of(loc)
    ctx[RUN_OFF] = address_of(off)
    ctx[RUN_MEM_SIZE] = mem.size
    ctx[RUN_STORE_SIZE] = store.size
    ctx[RUN_SALT] = salt
    ctx[RUN_DETAIL] = 0
    ctx[RUN_GEMM] = natives[0]
    ctx[RUN_EXTENT] = 1
    ctx[RUN_GEMM_KIND] = natives[2]
    ctx[RUN_TILES] = natives[3]
    ctx[RUN_CHUNKS] = address_of(chunks)
    ctx[RUN_N_CHUNKS] = chunks.size
    ctx[RUN_GROUPS] = address_of(groups)
    ctx[RUN_N_GROUPS] = groups.size
    # element by element: an array-to-array slice assignment makes Numba compile its shape
    # mismatch message (string formatting, ~1.8 s of a cold first gradient, measured)
    for i in range(RUN_CHUNK, RUN_CTX):
        ctx[i] = 0
    for i in range(2 * N_GEMM_BUCKETS):
        ctx[RUN_GEMMS + i] = natives[4 + i]
    ctx[RUN_RUNNERS] = address_of(runners)
    ctx[RUN_N_RUNNERS] = runners.size
    return ctx


# Which helpers are inline="always" (Numba inlines them in its own IR, typing the callee
# again at every call site): only those that take the run view (v, ctx) -- called
# through Numba's convention, passing its arrays costs ~40 ns a call in reference
# counts, on every node of every run -- and those that take a jitted function as an
# argument (binary, unary: else the function is a constant Numba will not cache).  The
# rest are plain calls that LLVM inlines where it pays: element loops vectorize as
# before (measured), and a cold small MLP's first gradient took 10.0 -> 8.4 s.
@njit(cache=True, inline="always")
def run_view(ctx_p, mem_p, store_p):
    """Typed arrays over a runner's raw arguments."""
    ctx = carray(ctx_p, RUN_CTX)
    rows = ctx[RUN_ROWS]
    return RunView(carray(pointer(ctx[RUN_SRC], np.int64), (rows, MAX_SRC)),
                   carray(pointer(ctx[RUN_SHAPE], np.int64), (rows, MAX_DIMS)),
                   carray(pointer(ctx[RUN_IP], np.int64), (rows, N_IP)),
                   carray(pointer(ctx[RUN_FP], np.float64), (rows, N_FP)),
                   carray(pointer(ctx[RUN_LOC], np.int8), rows),
                   carray(pointer(ctx[RUN_OFF], np.int64), rows),
                   carray(mem_p, ctx[RUN_MEM_SIZE]),
                   carray(store_p, ctx[RUN_STORE_SIZE]),
                   ctx[RUN_SALT], ctx)


@intrinsic
def pointer_like(typingctx, address, arr):
    """``address`` (int64) as a pointer to ``arr``'s element type."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_data_type(arr.dtype).as_pointer())
    return types.CPointer(arr.dtype)(address, arr), codegen


@njit(cache=True, inline="always")
def chunk_operand(v, k, m):
    """In a chunk runner: the ``m`` elements at address k of ctx[RUN_CHUNK...] (0 the
    output, 1 and 2 the operands)."""
    return carray(pointer_like(v.ctx[RUN_CHUNK + k], v.mem), m)


@njit(cache=True)
def same_data(a, b):
    """Do two arrays start at the same address (an op running in place)?"""
    return address_of(a) == address_of(b)


@njit(cache=True)
def span(lo, hi, extent):
    """The units a runner does: [lo, hi), or all ``extent`` of them when hi is -1."""
    return (0, extent) if hi < 0 else (lo, hi)


@njit(cache=True, inline="always")
def output(v, n):
    """Node n's own buffer (always in the run buffer)."""
    o = v.off[n]
    return v.mem[o:o + numel(v.shape, n)]


@njit(cache=True, inline="always")
def output_into(v, n):
    """Where a producer's runner writes node n's output, and the index of that array's first
    element in the output: its own buffer from 0, or the scratch an epilogue hands it
    (ctx[RUN_INTO...]) from the first element of the images it asks for."""
    if v.ctx[RUN_INTO] == 0:
        return output(v, n), 0
    return carray(pointer_like(v.ctx[RUN_INTO], v.mem), v.ctx[RUN_INTO + 2]), v.ctx[RUN_INTO + 1]


@njit(cache=True, inline="always")
def operand(v, n, k):
    """The data of node n's source k (run buffer or value store)."""
    s = v.src[n, k]
    o = v.off[s]
    if v.loc[s] == LOC_STORE:
        return v.store[o:o + numel(v.shape, s)]
    return v.mem[o:o + numel(v.shape, s)]


# ---- borrowed views --------------------------------------------------------------------------------
@njit(cache=True)
def borrowed(a):
    """A view of contiguous array ``a`` that owns no reference: handing it to a jitted call
    that is not inlined costs no reference counting (an owned array costs an atomic
    increment and decrement per argument and call: 60% of the backward pass's time
    when its loop handed owned arrays to its calls).  Valid while ``a`` lives."""
    return carray(data_pointer(a), a.shape)


@njit(cache=True)
def borrowed_nodes(G):
    """The node table ``G`` (ir.Nodes) as borrowed views (see ``borrowed``)."""
    return Nodes(borrowed(G.op), borrowed(G.src), borrowed(G.ndim), borrowed(G.shape), borrowed(G.ip),
                 borrowed(G.fp), borrowed(G.flags), borrowed(G.origin), borrowed(G.rule))
