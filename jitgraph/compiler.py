"""Compiling what a graph uses, when it is used.

Each op's runner is compiled (or loaded from Numba's cache) the first time a
program of that dtype contains the op, and each gradient rule the first time a
backward pass meets the op (see native.py for the calling convention).  The
results are C callbacks whose addresses fill one table per dtype (runners) and
one for rules; the interpreter and the backward pass index them by opcode.
"""
import ctypes
import os
import threading
import warnings

import numpy as np
import scipy.linalg.cython_blas
from numba import cfunc, from_dtype, types
from numba.core.errors import NumbaIRAssumptionWarning
from threadpoolctl import threadpool_info

from . import registry
from .threads import max_threads, single_threaded_blas

SKIP = -1          # runner entry of an op without a kernel (leaves, views); rule entry of ZERO_GRAD
MISSING = 0        # not compiled (runners) / no gradient rule (rules)

RULE_SIGNATURE = types.int64(types.int64, types.int64, types.int64, types.CPointer(types.int64))

_lock = threading.RLock()
_keep: dict = {}                 # (kind, code, dtype) -> the compiled CFunc (the tables hold raw addresses)
_runner_tables: dict = {}        # dtype name -> int64 address table
_rule_table: list = []           # [table] once made


def runner_signature(dtype):
    t = from_dtype(np.dtype(dtype))
    i64 = types.int64
    return i64(i64, i64, i64, types.CPointer(i64), types.CPointer(t), types.CPointer(t))


def _compile(kind, op, dtype, sig):
    fn = op.runner if kind == "run" else op.vjp
    with warnings.catch_warnings():
        # inlining vmath's functions trips a pedantic SSA check of Numba's (a warning that
        # asks for a bug report); the code is right -- the tests compare every op with numpy
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        compiled = cfunc(sig, cache=True, error_model="numpy")(fn)
    _keep[(kind, op.code, dtype)] = compiled
    return compiled.address


def runners(dtype, codes):
    """The runner table of ``dtype`` with every op in ``codes`` compiled."""
    dtype = np.dtype(dtype)
    table = _runner_tables.get(dtype.name)
    if table is None or table.size < registry.n_codes():
        with _lock:
            table = _runner_tables.get(dtype.name)
            if table is None or table.size < registry.n_codes():
                table = np.full(registry.n_codes(), MISSING, np.int64)
                for op in registry.OPS.values():
                    if op.runner is None:
                        table[op.code] = SKIP
                _runner_tables[dtype.name] = table
    todo = [int(c) for c in np.unique(codes) if table[c] == MISSING]
    if todo:
        with _lock:
            sig = runner_signature(dtype)
            for code in todo:
                if table[code] == MISSING:
                    table[code] = _compile("run", registry.OPS[code], dtype.name, sig)
    return table


def rules(codes):
    """The gradient-rule table with the rule of every op in ``codes`` compiled."""
    if not _rule_table or _rule_table[0].size < registry.n_codes():
        table = np.full(registry.n_codes(), MISSING, np.int64)
        for op in registry.OPS.values():
            if op.vjp is registry.ZERO_GRAD:
                table[op.code] = SKIP
        _rule_table[:] = [table]
    table = _rule_table[0]
    todo = [int(c) for c in np.unique(codes) if table[c] == MISSING and callable(registry.OPS[int(c)].vjp)]
    if todo:
        with _lock:
            for code in todo:
                if table[code] == MISSING:
                    table[code] = _compile("vjp", registry.OPS[code], "", RULE_SIGNATURE)
    return table


def _capsule_address(capsule):
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return pointer(capsule, name(capsule))


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _library_of(address):
    """The path of the shared library holding ``address``, or None."""
    libc = ctypes.CDLL(None)
    info = _DlInfo()
    if not libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode()


def _blas_threads_local(gemm_address):
    """Address of OpenBLAS's ``openblas_set_num_threads_local`` in the library that holds
    the gemm jitgraph calls.  Without one (another BLAS, or OpenBLAS before 0.3.27) that
    library is limited to one thread process-wide, and 0 is returned."""
    path = _library_of(gemm_address)
    try:
        lib = ctypes.CDLL(path)
        return ctypes.cast(lib.openblas_set_num_threads_local, ctypes.c_void_p).value or 0
    except (OSError, AttributeError, TypeError):
        if path:
            single_threaded_blas(path)
        return 0


def _numpy_openblas(dtype):
    """(gemm, thread-local setter) of numpy's bundled OpenBLAS (64-bit integers), or None.
    It is a release newer than scipy's on these machines and 3-9% faster on the shapes
    transformers use (measured side by side, single-threaded)."""
    for info in threadpool_info():
        path = info.get("filepath") or ""
        if info.get("internal_api") != "openblas" or "numpy" not in os.path.basename(os.path.dirname(path)):
            continue
        try:
            lib = ctypes.CDLL(path)
            fn = getattr(lib, ("scipy_sgemm_64_" if dtype == np.float32 else "scipy_dgemm_64_"))
            local = getattr(lib, "openblas_set_num_threads_local", None)
            if local is None:
                single_threaded_blas(path)
            return (ctypes.cast(fn, ctypes.c_void_p).value,
                    ctypes.cast(local, ctypes.c_void_p).value if local is not None else 0)
        except (OSError, AttributeError):
            return None
    return None


_natives: dict = {}


def blas_library(dtype) -> str:
    """Path of the BLAS library whose gemm jitgraph's products call for ``dtype``."""
    return _library_of(int(natives(dtype)[0])) or ""


def natives(dtype):
    """Addresses of the native functions runners call, for ``dtype``, and one constant:
    [gemm, the BLAS's thread-local thread count setter or 0, 1 if gemm takes 64-bit
    integers, the most tiles a product is cut into (the thread pool's size, fixed for
    the process, so results never depend on set_num_threads)].  The BLAS is numpy's
    bundled OpenBLAS when it has one, else scipy's (the one Numba's np.dot uses), called
    directly so operands keep their strides; jitgraph runs it on one thread per call and
    splits big products over its own threads (one pool, not two fighting over the same
    cores)."""
    dtype = np.dtype(dtype)
    got = _natives.get(dtype.name)
    if got is None:
        found = _numpy_openblas(dtype)
        if found is not None and found[0]:
            got = np.array([found[0], found[1], 1, max_threads()], np.int64)
        else:
            capi = scipy.linalg.cython_blas.__pyx_capi__
            gemm = _capsule_address(capi["sgemm" if dtype == np.float32 else "dgemm"])
            got = np.array([gemm, _blas_threads_local(gemm), 0, max_threads()], np.int64)
        _natives[dtype.name] = got
    return got
