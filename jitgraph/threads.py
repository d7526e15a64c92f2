"""Threads: how many cores jitgraph's kernels and the BLAS use, and a threading
layer that is safe when programs run from several Python threads at once.

Kernels split big tensors into blocks of a fixed size (``BLOCK``) and hand the
blocks to Numba's threads; a block is always computed the same way, whoever runs
it, and reductions combine per-block partials in block order -- so results are
identical for any thread count, and checkpointed runs stay bit-identical.

Numba's default ``workqueue`` layer aborts when two Python threads launch parallel
work at once, so jitgraph asks for ``omp`` (GNU OpenMP, found on Linux with the
compiler runtime) or ``tbb`` (the ``tbb`` package).  Numba's thread count is per
Python thread; a run sets it in the thread that runs.
"""
import ctypes
import ctypes.util
import importlib
import importlib.util
import os
import sys
import threading
from typing import Optional

import numba
from numba.core import config
from threadpoolctl import ThreadpoolController

from .errors import GraphError

BLOCK = 1 << 14              # elements per block of an elementwise kernel (fixed: results never depend on threads)
ROWS_PER_BLOCK = 16          # rows per block of a row kernel (softmax, norms)

_lock = threading.Lock()
_wanted: list = []           # [n] once set_num_threads was called
_blas_limiter: list = []


def _layer_available(name: str) -> bool:
    """Can Numba load the ``omp`` (needs libgomp) or ``tbb`` layer here?

    The ``omp`` layer is looked for, not loaded: loading it loads libgomp, and a PyTorch
    imported after that shares this libgomp instead of its own, which made its CPU
    flash attention 40x slower at 2 threads once jitgraph had run (measured).  Numba
    loads the layer at the first parallel run, after the user's imports."""
    try:
        if name == "omp":
            return (importlib.util.find_spec("numba.np.ufunc.omppool") is not None
                    and ctypes.util.find_library("gomp") is not None)
        if name == "tbb":
            lib = os.path.join(sys.prefix, "lib", "libtbb.so.12")
            if os.path.exists(lib):          # the pip wheel puts libtbb beside Python, off the loader's path
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        importlib.import_module(f"numba.np.ufunc.{name}pool")
        return True
    except (ImportError, OSError):
        return False


# GNU OpenMP puts idle threads to sleep after ~300k spins; a training step launches
# hundreds of short parallel regions with serial gaps between them, and waking the
# sleepers cost 20% of a GPT step on 2 cores (measured).  Spinning ~10x longer (a few ms)
# keeps them awake through a step and still lets them sleep between steps.  Read by
# libgomp when it loads, so only if the user set neither variable.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000000"


def choose_layer() -> str:
    """Set Numba's threading layer to a thread-safe one (unless the user chose one)."""
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return str(getattr(config, "THREADING_LAYER"))
    for name in ("omp", "tbb"):
        if _layer_available(name):
            setattr(config, "THREADING_LAYER", name)
            return name
    setattr(config, "THREADING_LAYER", "threadsafe")   # none found: Numba raises a clear error when it launches
    return "threadsafe"


LAYER = choose_layer()


def max_threads() -> int:
    return int(getattr(config, "NUMBA_NUM_THREADS"))


def num_threads() -> int:
    """The thread count runs use (default: all cores)."""
    return _wanted[0] if _wanted else max_threads()


def set_num_threads(n: Optional[int] = None) -> int:
    """Use ``n`` threads (default: all cores) for jitgraph's kernels and matrix products.
    jitgraph cuts a big product into tiles and gives each tile to a single-threaded BLAS
    call on its own threads, so kernels and BLAS share one pool of ``n`` threads instead
    of two pools fighting over the cores.  Results do not depend on ``n``.  Returns it."""
    n = max_threads() if n is None else int(n)
    if not 1 <= n <= max_threads():
        raise GraphError(f"set_num_threads: n must be between 1 and {max_threads()} (the cores Numba may use), "
                         f"got {n}")
    with _lock:
        _wanted[:] = [n]
    return n


def get_num_threads() -> int:
    """The thread count jitgraph's runs use (set_num_threads; default all cores)."""
    return num_threads()


def single_threaded_blas(path: str) -> None:
    """Limit the BLAS library at ``path`` to one thread, process-wide -- only for a BLAS
    whose thread count jitgraph cannot set per call (OpenBLAS before 0.3.27): each tile
    of a product already runs on one of jitgraph's threads."""
    with _lock:
        if not _blas_limiter:
            _blas_limiter.append(ThreadpoolController().select(filepath=path).limit(limits=1))


_blas_lock = threading.Lock()
_blas_holds: dict = {}       # setter address -> [runs in progress, the BLAS's thread count before the first]
_setters: dict = {}


def hold_blas(setter: int) -> None:
    """A run that calls the BLAS starts: the BLAS runs on one thread until the last such
    run ends (``release_blas``).  jitgraph gives each tile of a product to a one-thread
    BLAS call on its own threads.  OpenBLAS's thread count is process-wide -- its
    ``openblas_set_num_threads_local`` too sets the global count in a pthreads build --
    so runs on several threads setting and restoring it each would race, and a product
    that then ran on two BLAS threads can round differently (OpenBLAS 0.3.31's Haswell
    kernels do): results would depend on the thread count and on timing.  Hence one
    count of runs: the first sets 1, the last restores the count it found.  ``setter``:
    the address of that function (0: nothing to do, the BLAS is limited process-wide).
    Meanwhile numpy's products in other Python threads run on one thread too."""
    if setter:
        with _blas_lock:
            held = _blas_holds.setdefault(setter, [0, 0])
            if held[0] == 0:
                fn = _setters.get(setter)
                if fn is None:
                    fn = _setters[setter] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(setter)
                held[1] = fn(1)
            held[0] += 1


def release_blas(setter: int) -> None:
    """The run that called ``hold_blas(setter)`` ended (also when it failed)."""
    if setter:
        with _blas_lock:
            held = _blas_holds[setter]
            held[0] -= 1
            if held[0] == 0:
                _setters[setter](held[1])


class held_blas:
    """``with held_blas(setter):`` -- ``hold_blas`` on entry, ``release_blas`` on exit (a
    failed run's too)."""

    __slots__ = ("setter",)

    def __init__(self, setter: int) -> None:
        self.setter = setter

    def __enter__(self) -> None:
        hold_blas(self.setter)

    def __exit__(self, *exc: object) -> None:
        release_blas(self.setter)


def enter_run() -> None:
    """Called in the thread about to run a program: Numba's count is per thread."""
    n = num_threads()
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
