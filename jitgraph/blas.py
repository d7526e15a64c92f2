"""The BLAS behind every matrix product: the fastest library on this host, by measurement.

Candidates, where present: numpy's bundled OpenBLAS (else scipy's), Intel's MKL (the
``mkl`` wheel's ``libmkl_rt``: ``pip install "jitgraph[mkl]"``) and BLIS (the ``blis``
package).  Which is fastest depends on the CPU, not on the library's reputation:
MKL leads on Intel Xeons and can trail on AMD; OpenBLAS's kernels are tuned per core.
So, the first time a process of this host needs a product, every candidate is timed
on the product shapes models make (``SHAPE_CLASSES``: a linear layer forward and both of
its gradients at MLP and transformer sizes, attention's small per-head products).  The
main library is the one with the lowest mean time relative to the best on the large
classes -- OpenBLAS keeps the place unless another is faster by ``MARGIN`` -- and each
bucket of products (its transposes, small or large: ``bucket``) calls the main library
unless another is faster by ``BUCKET_MARGIN`` on the bucket's classes.  The choice is
cached on disk per host (CPU model and flags, each candidate's version and file);
``JITGRAPH_BLAS=openblas|mkl|blis`` forces one for every product.  With only one library
present nothing is timed.

Every library runs on one thread per call (jitgraph cuts big products into tiles for
its own threads, native.py): OpenBLAS through its thread count setter
(threads.hold_blas), MKL with its sequential layer, BLIS at one thread.  So results
never depend on the thread count, whichever library is chosen.
"""
import ctypes
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import threading
import time
from typing import Dict, List, NamedTuple, Optional

import numpy as np
from numba import njit
from threadpoolctl import threadpool_info

from . import _cache
from .errors import GraphError
from .native import BLIS_TYPED, FORTRAN_ILP64, FORTRAN_LP64, N_GEMM_BUCKETS, SMALL_GEMM, data_pointer, gemm
from .threads import held_blas, max_threads, single_threaded_blas

NAMES = ("openblas", "mkl", "blis")
DEFAULT = "openblas"
MARGIN = 0.03            # another library replaces OpenBLAS only when faster by this much (timings are noisy)
ENV = "JITGRAPH_BLAS"

# (name, M, N, K, trans_a, trans_b): row-major C (M, N) = op(A) op(B), as models call them
SHAPE_CLASSES = (
    ("mlp x @ W", 64, 1024, 1024, 0, 0),
    ("mlp g @ W^T", 64, 1024, 1024, 0, 1),
    ("mlp x^T @ g", 1024, 1024, 64, 1, 0),
    ("gpt x @ W", 1024, 576, 192, 0, 0),
    ("gpt g @ W^T", 1024, 192, 768, 0, 1),
    ("gpt x^T @ g", 192, 768, 1024, 1, 0),
    ("attention q @ k^T", 64, 64, 32, 0, 1),
    ("attention p @ v", 64, 32, 64, 0, 0),
    ("heads q @ k^T", 128, 128, 32, 0, 1),
    ("heads p @ v", 128, 32, 128, 0, 0),
    ("heads p^T @ g", 128, 32, 128, 1, 0),
)
# Products are grouped in buckets by their transposes and size, and each bucket calls the library
# fastest on its classes: one library rarely leads everywhere (on an AMD EPYC Zen 3, MKL runs small
# A B^T 10-20% faster than OpenBLAS and small A^T B 17% slower, OpenBLAS the large ones faster).
SMALL_WORK = SMALL_GEMM  # M N K at most this: a small product (a head's, a tile's)
BUCKET_MARGIN = 0.05     # a bucket leaves the main library only for a library this much faster on it
N_BUCKETS = N_GEMM_BUCKETS


def bucket(M: int, N: int, K: int, ta: int, tb: int) -> int:
    """The bucket of row-major C (M, N) = op(A) op(B) contracting K (native.gemm_for's formula)."""
    return (ta * 2 + tb) * 2 + (1 if M * N * K <= SMALL_WORK else 0)


def bucket_name(b: int) -> str:
    ops = ("A B", "A B^T", "A^T B", "A^T B^T")
    return f"{ops[b // 2]} {'small' if b % 2 else 'large'}"

TIMED_S = 0.004          # least time of one timed batch of calls
ROUNDS = 5               # batches per class and library; the fastest counts


class Library(NamedTuple):
    name: str
    version: str
    kernel: str          # the code path it runs on this CPU (OpenBLAS's core type, BLIS's arch, MKL's ISA)
    path: str
    gemm: Dict[str, int]  # dtype name -> address of its ?gemm
    kind: int            # native.FORTRAN_LP64 / FORTRAN_ILP64 / BLIS_TYPED
    setter: int          # OpenBLAS's thread count setter (threads.hold_blas), else 0: one thread process-wide


# ---- finding the libraries ---------------------------------------------------------------------

def _address(lib, name) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def _capsule_address(capsule) -> int:
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return pointer(capsule, name(capsule))


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_of(address: int) -> Optional[str]:
    """The path of the shared library holding ``address``, or None."""
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode()


def _pool_of(path: str, pools: List[dict]) -> dict:
    real = os.path.realpath(path)
    return next((i for i in pools if os.path.realpath(i.get("filepath") or "") == real), {})


def _thread_setter(path: str) -> int:
    """Address of OpenBLAS's ``openblas_set_num_threads_local`` in the library at ``path``
    (threads.hold_blas), or 0 -- another BLAS, or OpenBLAS before 0.3.27: then that library
    is limited to one thread process-wide."""
    try:
        return _address(ctypes.CDLL(path), "openblas_set_num_threads_local")
    except (OSError, AttributeError, TypeError):
        if path:
            single_threaded_blas(path)
        return 0


def _openblas(pools: List[dict]) -> Optional[Library]:
    """numpy's bundled OpenBLAS (64-bit integers; a newer release than scipy's on these
    machines and 3-9% faster on transformers' shapes, measured), else scipy's."""
    for info in pools:
        path = info.get("filepath") or ""
        if info.get("internal_api") != "openblas" or "numpy" not in os.path.basename(os.path.dirname(path)):
            continue
        try:
            lib = ctypes.CDLL(path)
            gemms = {"float32": _address(lib, "scipy_sgemm_64_"), "float64": _address(lib, "scipy_dgemm_64_")}
        except (OSError, AttributeError):
            break
        return Library("openblas", str(info.get("version")), str(info.get("architecture")), path, gemms,
                       FORTRAN_ILP64, _thread_setter(path))
    try:                                  # scipy's BLAS only where numpy has none of its own: its import costs ~0.35 s
        import scipy.linalg.cython_blas
    except ImportError:                   # not installed (a dependency only off Linux, pyproject.toml)
        return None
    capi = scipy.linalg.cython_blas.__pyx_capi__
    gemms = {"float32": _capsule_address(capi["sgemm"]), "float64": _capsule_address(capi["dgemm"])}
    path = library_of(gemms["float32"]) or ""
    info = _pool_of(path, pools) if path else {}
    return Library(str(info.get("internal_api") or "openblas"), str(info.get("version")),
                   str(info.get("architecture")), path, gemms, FORTRAN_LP64, _thread_setter(path))


MKL_THREADING_SEQUENTIAL = 1
MKL_INTERFACE_LP64 = 0


def _mkl(pools: List[dict]) -> Optional[Library]:
    """Intel's MKL from the ``mkl`` wheel (or the system's ``libmkl_rt``), set to its
    sequential layer before its first call, so it never starts threads of its own -- unless
    an MKL is already loaded (numpy or scipy built on it): then that one is the user's, its
    thread count theirs, and it is no candidate here (scipy's BLAS, the fallback, may be it)."""
    # where the wheel (or conda) puts it, and LD_LIBRARY_PATH's folders -- not
    # ctypes.util.find_library, which runs ldconfig and gcc: 0.1 s a process without MKL
    folders = [os.path.join(sys.prefix, "lib")] + [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = [p for d in folders for p in sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")))]
    if not found:
        return None
    if any(i.get("internal_api") == "mkl" for i in pools):
        return None          # the process's own MKL (numpy's or scipy's): its threads are the user's, left alone
    try:
        lib = ctypes.CDLL(found[0])
        lib.MKL_Set_Interface_Layer(MKL_INTERFACE_LP64)
        layer = lib.MKL_Set_Threading_Layer(MKL_THREADING_SEQUENTIAL)
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, len(buf))
        gemms = {"float32": _address(lib, "sgemm_"), "float64": _address(lib, "dgemm_")}
    except (OSError, AttributeError):
        return None
    if layer != MKL_THREADING_SEQUENTIAL:        # initialized threaded before us after all: not ours to use
        return None
    words = buf.value.decode(errors="replace").split()
    version = next((w for w in words if w[:1].isdigit()), buf.value.decode(errors="replace"))
    return Library("mkl", version, _mkl_isa(lib), found[0], gemms, FORTRAN_LP64, 0)


def _mkl_isa(lib) -> str:
    """The instruction set MKL's reproducible mode would pick on this CPU (its CNR auto
    branch, mkl_cbwr.h's codes) -- the code path MKL dispatches to."""
    branches = {3: "compatible", 4: "sse2", 6: "ssse3", 7: "sse4_1", 8: "sse4_2", 9: "avx", 10: "avx2",
                11: "avx512_mic", 12: "avx512", 13: "avx512_mic_e1", 14: "avx512_e1"}
    try:
        return branches.get(int(lib.mkl_cbwr_get_auto_branch()), "auto")
    except AttributeError:
        return "auto"


def _blis(_pools: List[dict]) -> Optional[Library]:
    """BLIS from the ``blis`` package (its extension modules hold the whole library), at
    one thread."""
    spec = importlib.util.find_spec("blis")
    if spec is None or not spec.origin:
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "cy*.so")))
    if not found:
        return None
    try:
        lib = ctypes.CDLL(found[0])
        gemms = {"float32": _address(lib, "bli_sgemm"), "float64": _address(lib, "bli_dgemm")}
        lib.bli_thread_set_num_threads(ctypes.c_int64(1))
        lib.bli_arch_string.restype = ctypes.c_char_p
        kernel = (lib.bli_arch_string(lib.bli_arch_query_id()) or b"unknown").decode()
        lib.bli_info_get_version_str.restype = ctypes.c_char_p
        version = (lib.bli_info_get_version_str() or b"").decode()
    except (OSError, AttributeError):
        return None
    try:
        version = f"{version} (blis {importlib.metadata.version('blis')})"
    except importlib.metadata.PackageNotFoundError:
        pass
    return Library("blis", version, kernel, found[0], gemms, BLIS_TYPED, 0)


_lock = threading.RLock()
_found: List[Library] = []
_chosen: Dict[str, Library] = {}
_by_bucket: Dict[str, List[Library]] = {}      # dtype name -> each bucket's library
_natives: Dict[str, np.ndarray] = {}
_timings: Dict[str, dict] = {}


def available() -> List[Library]:
    """The BLAS libraries present on this host (OpenBLAS first), found once per process."""
    with _lock:
        if not _found:
            pools = threadpool_info()               # the BLAS and OpenMP libraries loaded so far
            for find in (_openblas, _mkl, _blis):
                lib = find(pools)
                if lib is not None and all(lib.gemm.values()):
                    _found.append(lib)
        return list(_found)


# ---- timing them -------------------------------------------------------------------------------

@njit(cache=True, error_model="numpy")
def _time_calls(fn, kind, ta, tb, M, N, K, A, B, C, calls):
    """``calls`` times: the products row-major C_i (M, N) = op(A_i) op(B_i) of the matrices
    laid one after another in A, B, C (the BLAS's column-major C^T)."""
    lda = M if ta else K
    ldb = K if tb else N
    mats = C.size // (M * N)
    for _ in range(calls):
        for i in range(mats):
            gemm(fn, kind, tb, ta, N, M, K, 1.0, data_pointer(B[i * K * N:]), ldb, data_pointer(A[i * M * K:]), lda,
                 0.0, data_pointer(C[i * M * N:]), N)


def _seconds(lib: Library, dtype, shape, rng, matrices: int = 1) -> float:
    """Seconds of ``lib``'s gemm on one shape class, ``matrices`` distinct products of it
    (the fastest of ROUNDS batches)."""
    _, M, N, K, ta, tb = shape
    A = rng.standard_normal(M * K * matrices).astype(dtype)
    B = rng.standard_normal(K * N * matrices).astype(dtype)
    C = np.empty(M * N * matrices, dtype)
    fn = lib.gemm[np.dtype(dtype).name]
    _time_calls(fn, lib.kind, ta, tb, M, N, K, A, B, C, 2)              # warm: packing buffers, first touch
    calls, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        _time_calls(fn, lib.kind, ta, tb, M, N, K, A, B, C, calls)
        t = time.perf_counter() - t0
        if t >= TIMED_S or calls >= 1 << 16:
            break
        calls *= 2
    best = t / calls
    for _ in range(ROUNDS - 1):
        t0 = time.perf_counter()
        _time_calls(fn, lib.kind, ta, tb, M, N, K, A, B, C, calls)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def measure(dtype=np.float32, libraries: Optional[List[Library]] = None) -> dict:
    """Seconds per call of each library's gemm on each of SHAPE_CLASSES, one thread:
    ``{library: {class: seconds}}``."""
    libraries = available() if libraries is None else libraries
    got: dict = {lib.name: {} for lib in libraries}
    for shape in SHAPE_CLASSES:                    # libraries side by side per shape: drift hits all alike
        for lib in libraries:
            with held_blas(lib.setter):            # one thread, as in every run
                got[lib.name][shape[0]] = _seconds(lib, dtype, shape, np.random.default_rng(0))
    return got


def _score(times: dict) -> Dict[str, float]:
    """Each library's mean time relative to the fastest, over the shape classes."""
    best = {c: min(t[c] for t in times.values()) for c in next(iter(times.values()))}
    return {name: float(np.mean([t[c] / best[c] for c in t])) for name, t in times.items()}


def _pick(times: dict, margin: float = MARGIN, prefer: str = DEFAULT) -> str:
    score = _score(times)
    fastest = min(score, key=lambda n: score[n])
    if prefer in score and score[fastest] > score[prefer] * (1 - margin):
        return prefer
    return fastest


def _pick_main(times: dict) -> str:
    """The main library: the fastest on the large classes (where the time of a step goes),
    OpenBLAS unless another is faster by MARGIN."""
    large = [c[0] for c in SHAPE_CLASSES if bucket(*c[1:]) % 2 == 0]
    return _pick({name: {c: t[c] for c in large} for name, t in times.items()})


def _pick_buckets(times: dict, main: str) -> Dict[str, str]:
    """Each bucket's library: ``main`` unless another is faster by BUCKET_MARGIN on the
    bucket's classes (a bucket no class measures keeps ``main``)."""
    got = {}
    for b in range(N_BUCKETS):
        classes = [c[0] for c in SHAPE_CLASSES if bucket(*c[1:]) == b]
        part = {name: {c: t[c] for c in classes} for name, t in times.items()}
        got[bucket_name(b)] = _pick(part, BUCKET_MARGIN, main) if classes else main
    return got


# ---- the choice, cached per host ---------------------------------------------------------------

def cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo (empty elsewhere)."""
    got: dict = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break                          # the first processor's block is enough
                got.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return got


def cpu_description() -> str:
    """e.g. "AMD EPYC (AuthenticAMD family 25 model 1)"."""
    info = cpuinfo()
    if not info:
        return platform.processor() or platform.machine()
    return (f"{info.get('model name', '?')} ({info.get('vendor_id', '?')} family {info.get('cpu family', '?')} "
            f"model {info.get('model', '?')})")


def _cpu() -> str:
    """The CPU as the choice depends on it: description and a hash of its flags."""
    return f"{cpu_description()} [{hashlib.sha256(cpuinfo().get('flags', '').encode()).hexdigest()[:8]}]"


def host_key(libraries: List[Library]) -> str:
    """The CPU (model, flags), each candidate's name, version, kernel, file and size, and
    the environment variables that steer them (OPENBLAS_CORETYPE picks another kernel)."""
    parts = [_cpu()] + sorted(f"{k}={v}" for k, v in os.environ.items()
                              if k.startswith(("OPENBLAS_", "MKL_", "BLIS_", "GOTO_")))
    for lib in libraries:
        try:
            size = os.path.getsize(lib.path)
        except OSError:
            size = -1
        parts.append(f"{lib.name} {lib.version} {lib.kernel} {os.path.realpath(lib.path)} {size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def choice_file() -> str:
    """Where the choices are kept: the user's cache folder (a choice belongs to the host, not
    to a build, so a new or private compile cache does not time the libraries again), else
    the compile cache's root."""
    user = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "jitgraph")
    return os.path.join(user if _cache._writable(user) else _cache.ROOT, "blas-choice.json")


def _load_choices() -> dict:
    try:
        with open(choice_file()) as f:
            got = json.load(f)
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_choices(choices: dict) -> None:
    """The choices file, replaced whole (a reader never sees half of it)."""
    path = choice_file()
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(choices, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass                                       # a read-only cache: measured again next process


def _save_choice(key: str, entry: dict) -> None:
    choices = _load_choices()
    choices[key] = entry
    _write_choices(choices)


def forget_choice() -> None:
    """Drop this host's cached choices and this process's: the next product times the
    libraries again."""
    with _lock:
        key = host_key(available())
        _write_choices({k: v for k, v in _load_choices().items() if not k.startswith(key)})
        use(None)


def _forced(libraries: List[Library]) -> Optional[Library]:
    want = os.environ.get(ENV, "").strip().lower()
    if not want:
        return None
    for lib in libraries:
        if lib.name == want:
            return lib
    have = ", ".join(lib.name for lib in libraries)
    known = "" if want in NAMES else f" (known: {', '.join(NAMES)})"
    raise GraphError(f"{ENV}={os.environ[ENV]!r}: that BLAS is not installed here{known}; present: {have}"
                     + ("; `pip install \"jitgraph[mkl]\"` adds MKL" if want == "mkl" else "")
                     + ("; `pip install blis` adds BLIS" if want == "blis" else ""))


def chosen(dtype=np.float32) -> Library:
    """The main library of ``dtype``'s products in this process (the one a bucket keeps
    unless another is clearly faster on it, see ``by_bucket``): ``JITGRAPH_BLAS``'s, else
    the cached choice of this host, else the fastest by ``measure`` (then cached)."""
    name = np.dtype(dtype).name
    with _lock:
        lib = _chosen.get(name)
        if lib is not None:
            return lib
        libraries = available()
        if not libraries:
            raise GraphError(f"no BLAS for {name} products: numpy {np.__version__} here carries no OpenBLAS jitgraph "
                             "can call (numpy's wheels from PyPI do), scipy is not installed and neither is MKL or "
                             "BLIS; `pip install scipy` (or \"jitgraph[mkl]\") adds one")
        lib = _forced(libraries)
        if lib is None and len(libraries) == 1:
            lib = libraries[0]
        if lib is not None:
            buckets = [lib] * N_BUCKETS
        else:
            key = f"{host_key(libraries)}-{name}"
            entry = _load_choices().get(key)
            names = {x.name for x in libraries}
            if not (isinstance(entry, dict) and entry.get("chosen") in names and isinstance(entry.get("buckets"), dict)
                    and {entry["buckets"].get(bucket_name(b)) for b in range(N_BUCKETS)} <= names):
                times = measure(dtype, libraries)
                main = _pick_main(times)
                entry = {"chosen": main, "buckets": _pick_buckets(times, main), "cpu": _cpu(), "seconds": times,
                         "score": _score(times), "libraries": {x.name: f"{x.version} ({x.kernel})" for x in libraries}}
                _save_choice(key, entry)
            _timings[name] = entry
            lib = next(x for x in libraries if x.name == entry["chosen"])
            buckets = [next(x for x in libraries if x.name == entry["buckets"][bucket_name(b)])
                       for b in range(N_BUCKETS)]
        _chosen[name] = lib
        _by_bucket[name] = buckets
        return lib


def by_bucket(dtype=np.float32) -> List[Library]:
    """The library each bucket of products calls (index: ``bucket``), N_BUCKETS of them."""
    chosen(dtype)
    return list(_by_bucket[np.dtype(dtype).name])


def timings(dtype=np.float32) -> Optional[dict]:
    """The measurement behind this process's choice for ``dtype`` (None when nothing was
    timed: one library present, or JITGRAPH_BLAS)."""
    chosen(dtype)
    return _timings.get(np.dtype(dtype).name)


def use(name: Optional[str], buckets: Optional[Dict[int, str]] = None) -> None:
    """Make programs built from now on call the library ``name`` -- for the buckets in
    ``buckets`` ({bucket: library}) that one instead (None: choose again as ``chosen``
    does).  For tests and studies; programs built before keep theirs."""
    with _lock:
        _chosen.clear()
        _by_bucket.clear()
        _natives.clear()
        _timings.clear()
        if name is not None:
            def find(want):
                lib = next((x for x in available() if x.name == want), None)
                if lib is None:
                    raise GraphError(f"blas.use: {want!r} is not installed here; present: "
                                     + ", ".join(x.name for x in available()))
                return lib
            lib = find(name)
            per = [find((buckets or {}).get(b, name)) for b in range(N_BUCKETS)]
            for dtype in ("float32", "float64"):
                _chosen[dtype] = lib
                _by_bucket[dtype] = per


def natives(dtype) -> np.ndarray:
    """What runners need of the chosen BLAS for ``dtype``: [the main gemm's address, the
    thread count setter (threads.hold_blas) or 0, how to call that gemm (native.*_LP64 /
    BLIS_TYPED), the most tiles a product is cut into (the thread pool's size, fixed for
    the process, so results never depend on set_num_threads)], then each bucket's gemm
    address and kind (native.gemm_for)."""
    name = np.dtype(dtype).name
    with _lock:
        got = _natives.get(name)
        if got is None:
            lib = chosen(dtype)
            per = _by_bucket[name]
            setter = max([lib.setter] + [x.setter for x in per])    # only OpenBLAS has one
            table = [v for x in per for v in (x.gemm[name], x.kind)]
            got = _natives[name] = np.array([lib.gemm[name], setter, lib.kind, max_threads()] + table, np.int64)
        return got


def describe(dtype=np.float32) -> str:
    """One line: the chosen library, its version and kernel, and why."""
    lib = chosen(dtype)
    why = ("forced by " + ENV) if os.environ.get(ENV) else (
        "the only one present" if len(available()) == 1 else "fastest on this host, measured")
    others = [x.name for x in available() if x.name != lib.name]
    per = by_bucket(dtype)
    elsewhere = [f"{x.name} for {bucket_name(b)}" for b, x in enumerate(per) if x.name != lib.name]
    return (f"{lib.name} {lib.version} ({lib.kernel} kernels; {why}"
            + (f"; {', '.join(elsewhere)}" if elsewhere else "")
            + (f"; also present: {', '.join(others)}" if others else "") + ")")
