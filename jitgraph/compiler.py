"""Compiling what a graph uses, when it is used, on all cores.

Each op's runner is compiled (or loaded from Numba's cache) the first time a
program of that dtype contains the op (see native.py for the calling convention).
The results are C callbacks whose addresses fill one table per dtype; the
interpreter indexes it by opcode.  (Gradient rules are data, run by the backward
pass itself: nothing is compiled per rule, see rules.py.)

A compile *unit* is one runner.  When several units are not in the
on-disk cache yet, worker processes (``_boot.child_argv``: they import this very jitgraph) compile
some of them while this process compiles others: each unit is claimed by
creating a file (``O_EXCL``: exactly one process wins it), every process takes the
first unclaimed unit in one order (``_order``: the longest kernels first), and
a finished unit leaves a marker in the cache folder.  Units
that come while workers run (build_backward's, after build_forward's) are handed to
them as a batch file in the claims folder rather than to a new process.
This process then loads the workers' units from the cache.  The markers also
say, without compiling anything, which units a first run will have to compile:
that is when the compile line (CompileLine: one line, units done / known and the time) goes
to stderr (``JITGRAPH_QUIET=1`` hides it).
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np
from numba import cfunc, from_dtype, types
from numba.core.errors import NumbaIRAssumptionWarning

from . import _cache, _target, registry
from ._boot import child_argv

SKIP = -1          # runner entry of an op without a kernel (leaves, views)
MISSING = 0        # not compiled

_lock = threading.RLock()
_keep: dict = {}                 # (kind, code, dtype) -> the compiled CFunc (the tables hold raw addresses)
_runner_tables: dict = {}        # (kind, dtype name) -> int64 address table


def runner_signature(dtype):
    t = from_dtype(np.dtype(dtype))
    i64 = types.int64
    return i64(i64, i64, i64, types.CPointer(i64), types.CPointer(t), types.CPointer(t))


def _function(kind, op):
    """The op's runner ("run") or chunk runner ("chunk": ops/group.py), or None."""
    return op.runner if kind == "run" else op.chunk


def _compile(kind, op, dtype, sig):
    fn = _function(kind, op)
    with warnings.catch_warnings():
        # inlining vmath's functions trips a pedantic SSA check of Numba's (a warning that
        # asks for a bug report); the code is right -- the tests compare every op with numpy
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        compiled = cfunc(sig, cache=True, error_model="numpy")(fn)
    _keep[(kind, op.code, dtype)] = compiled
    return compiled.address


# ---- units, markers and workers -------------------------------------------------------------------
DONE_DIR = os.path.join(_cache.CACHE_DIR, "compiled")     # one empty file per unit in the cache


def unit_name(kind: str, code: int, dtype: str) -> str:
    return f"{kind}-{registry.OPS[code].name}" + (f"-{dtype}" if dtype else "")


def is_cached(kind: str, code: int, dtype: str) -> bool:
    """Whether the unit's machine code is in the cache folder (loading it takes ms)."""
    return os.path.exists(os.path.join(DONE_DIR, unit_name(kind, code, dtype)))


def _compile_unit(kind, code, dtype):
    """Compile (or load) one unit and leave its marker; returns the callback's address."""
    address = _compile(kind, registry.OPS[code], dtype, runner_signature(dtype))
    try:
        os.makedirs(DONE_DIR, exist_ok=True)
        open(os.path.join(DONE_DIR, unit_name(kind, code, dtype)), "w").close()
    except OSError:
        pass                           # a read-only cache: it only costs the notice's accuracy
    return address


def _claim(claims, unit):
    try:
        os.close(os.open(os.path.join(claims, "-".join(map(str, unit))), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
    except OSError:                    # the claims folder is gone: the process that made it ended
        return False


def compile_workers(n_units: int) -> int:
    """How many worker processes help compile ``n_units`` units: one per other usable
    core, at most one per unit beyond the first; JITGRAPH_COMPILE_WORKERS overrides
    (0: compile in this process only)."""
    chosen = os.environ.get("JITGRAPH_COMPILE_WORKERS", "")
    if chosen.strip().isdigit():
        most = int(chosen)
    else:
        most = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) - 1
    return max(0, min(most, n_units - 1))


def quiet() -> bool:
    return os.environ.get("JITGRAPH_QUIET", "").strip() not in ("", "0")


def _bar_open() -> bool:
    """Is a tqdm bar on screen (a training loop's)?  Then a line goes above it (tqdm.write),
    never into it."""
    tqdm = sys.modules.get("tqdm")
    return bool(tqdm is not None and getattr(getattr(tqdm, "tqdm", None), "_instances", None))


def notice(message: str) -> None:
    if quiet():
        return
    if _bar_open():
        sys.modules["tqdm"].tqdm.write(f"jitgraph: {message}", file=sys.stderr)
    else:
        print(f"jitgraph: {message}", file=sys.stderr, flush=True)


class CompileLine:
    """The one line a process's compiling gets on stderr.  Units join it as the graph
    passes find them (in the background) and as runs need them; it opens with the first,
    says units done / known and the time since it opened -- in place, on a terminal with no
    progress bar on it; elsewhere once at the start -- and closes, with the total and the
    time, when every unit it knows is compiled.  Nothing compiles, nothing is said."""
    EVERY_S = 0.25                 # in-place updates at most this often

    def __init__(self):
        self.units: dict = {}       # unit -> None, in the order they came
        self.start = 0.0
        self.shown = 0.0
        self.processes = 1
        self.live = False           # the last thing written is this line, unfinished
        self.lock = threading.RLock()

    def _text(self, done: bool, counts: bool = True) -> str:
        """The closing text, or the opening one (with ready / known and the time: ``counts``)."""
        dtypes = " and ".join(dict.fromkeys(u[2] for u in self.units))
        n, seconds = len(self.units), time.perf_counter() - self.start
        if done:
            return f"compiled {n} kernels for {dtypes} in {seconds:.1f} s"
        ways = f", {self.processes} processes" if self.processes > 1 else ""
        text = f"compiling {n} kernels for {dtypes} (first run only{ways})..."
        return f"{text} {sum(is_cached(*u) for u in self.units)}/{n}, {seconds:.1f} s" if counts else text

    def _in_place(self) -> bool:
        isatty = getattr(sys.stderr, "isatty", None)       # a replaced stderr may have none
        return bool(isatty and isatty()) and not _bar_open()

    def add(self, units, processes: int) -> None:
        new = [u for u in units if u not in self.units]
        if not new:
            return
        opening = not self.units
        if opening:
            self.start = time.perf_counter()
        self.units.update(dict.fromkeys(new))
        self.processes = max(self.processes, processes)
        if opening or self._in_place():
            self._show()

    def _show(self) -> None:
        if quiet():
            return
        with self.lock:
            if self._in_place():
                print(f"\r\x1b[Kjitgraph: {self._text(False)}", file=sys.stderr, end="", flush=True)
                if not self.live:
                    self.live = True
                    threading.Thread(target=self._ticker, daemon=True).start()
            else:
                notice(self._text(False, counts=False))
            self.shown = time.perf_counter()

    def _ticker(self) -> None:
        """On a terminal: the time goes on while this process compiles the graph passes
        (which are not units) between the workers' units."""
        while self.live:
            time.sleep(self.EVERY_S)
            self.tick()

    def tick(self) -> None:
        """While this process waits on units: the count and the time, in place."""
        if self.units and self._in_place() and time.perf_counter() - self.shown >= self.EVERY_S:
            self._show()

    def close_if_done(self) -> None:
        with self.lock:
            if not self.units or not all(is_cached(*u) for u in self.units):
                return
            if not quiet():
                if self.live and self._in_place():
                    print(f"\r\x1b[Kjitgraph: {self._text(True)}", file=sys.stderr, flush=True)
                else:
                    notice(self._text(True))
            self.units, self.live = {}, False

    def end_line(self) -> None:
        """At exit: a line left open gets its newline."""
        with self.lock:
            if self.live and not quiet():
                print(file=sys.stderr, flush=True)
            self.live = False


_line = CompileLine()
atexit.register(_line.end_line)


WORKER_IDLE_S = 2.0                # a worker with nothing to claim waits this long for another batch
_claims_dir: list = []             # this process's claims folder, shared by every batch of units
_workers: list = []                # worker processes started by this process


def _claims():
    if not _claims_dir:
        _claims_dir.append(tempfile.mkdtemp(prefix="jitgraph-compile-"))
        atexit.register(_end_workers)
    return _claims_dir[0]


def _end_workers():
    """At exit: stop workers still compiling (units they finish would only go unused)."""
    for p in _workers:
        if p.poll() is None:
            p.terminate()
        p.wait()
    shutil.rmtree(_claims_dir[0], ignore_errors=True)


def _live():
    _workers[:] = [p for p in _workers if p.poll() is None]
    return _workers


def _start_workers(units, claims, n):
    """Start n worker processes on ``units``; each imports this very jitgraph (_boot)."""
    env = dict(os.environ, JITGRAPH_QUIET="1", **_target.child_env())
    argv = child_argv("jitgraph.compiler:worker", claims, *(f"{kind}:{code}:{dtype}" for kind, code, dtype in units))
    return [subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for _ in range(n)]


def _spawn(units):
    """Workers for ``units``: the running ones get them as a batch (read when their
    current unit is done: a new process would first spend ~0.7 CPU-seconds importing),
    and new ones start while the cores allow."""
    claims = _claims()
    live = len(_live())
    if live:
        _add_batch(claims, units)
    n = compile_workers(len(units) + 1) - live
    if n > 0:
        _workers.extend(_start_workers(units, claims, n))
    return len(_workers)


def _add_batch(claims, units):
    """Hand ``units`` to the running workers: a file of the claims folder, written whole."""
    path = os.path.join(claims, f"batch-{time.monotonic_ns():020d}")
    with open(path + ".part", "w") as f:
        f.write("\n".join(f"{kind}:{code}:{dtype}" for kind, code, dtype in units))
    os.replace(path + ".part", path)


def _batches(claims):
    """Every unit handed to the workers in batches so far, oldest batch first."""
    units = []
    try:
        for name in sorted(n for n in os.listdir(claims) if n.startswith("batch-") and not n.endswith(".part")):
            with open(os.path.join(claims, name)) as f:
                units += _parse(f.read().split())
    except OSError:                    # the claims folder is gone: the process that made it ended
        pass
    return units


def _parse(words):
    return [(kind, int(code), dtype) for kind, code, dtype in (w.split(":") for w in words)]


def _order(units):
    """The order every process takes units in (each claims the first one not yet
    claimed): the kernels longest first, so the last to finish is a short one -- a unary
    or derivative op's runner (one or two loops, ~0.4 s to compile) after the others (broadcast cases,
    layouts, tiles: 1-1.6 s)."""
    return sorted(dict.fromkeys(units), key=lambda unit: registry.OPS[unit[1]].family in ("unary", "derivatives"))


def compile_units(units) -> list:
    """Addresses of the callbacks of ``units`` ((kind, code, dtype) triples), compiled
    across processes when more than one is not in the cache yet."""
    fresh = [u for u in units if not is_cached(*u)]
    addresses = {}
    if fresh:
        workers = _spawn(fresh) if len(fresh) > 1 else len(_live())
        _line.add(fresh, workers + 1)
        claims = _claims()
        for unit in _order(fresh):
            if _claim(claims, unit):
                addresses[unit] = _compile_unit(*unit)
                _line.tick()
        while _live() and not all(is_cached(*u) for u in fresh):    # units the workers claimed
            time.sleep(0.02)
            _line.tick()
    # the workers' units load from the cache; a unit a worker did not finish compiles here
    out = [addresses[u] if u in addresses else _compile_unit(*u) for u in units]
    _line.close_if_done()
    return out


def _new_units(dtype, codes):
    table = _runner_tables.get(("run", dtype))
    present = np.flatnonzero(np.bincount(np.asarray(codes, np.int64), minlength=registry.n_codes()))
    out = []
    for code in present.tolist():
        op = registry.OPS.get(code)
        if op is None or (table is not None and code < table.size and table[code] != MISSING):
            continue
        if op.runner is not None and not is_cached("run", code, dtype):
            out.append(("run", code, dtype))
    return out


def prefetch(dtype, codes) -> None:
    """Start compiling, in worker processes, the runners of the ops in ``codes`` that are
    not in the cache; returns at once.  The graph passes call it as soon as they know what
    a program will run, so the kernels compile while this process compiles and runs the
    passes."""
    if compile_workers(2) == 0:
        return
    name = np.dtype(dtype).name
    kernels = _new_units(name, codes)
    kernels = [u for u in kernels if u not in _line.units]      # already on their way
    if kernels:
        with _lock:
            workers = _spawn(kernels)
            _line.add(kernels, workers + 1)


def _table(kind, dtype):
    """The address table of ``kind`` ("run": runners, "chunk": chunk runners) for ``dtype``."""
    key = (kind, dtype.name)
    table = _runner_tables.get(key)
    if table is None or table.size < registry.n_codes():
        with _lock:
            table = _runner_tables.get(key)
            if table is None or table.size < registry.n_codes():
                table = np.full(registry.n_codes(), MISSING, np.int64)
                for op in registry.OPS.values():
                    if _function(kind, op) is None:
                        table[op.code] = SKIP
                _runner_tables[key] = table
    return table


def tables(dtype, codes, chunk_codes=()):
    """(runner table, chunk runner table) of ``dtype``, with the runners of ``codes`` and the
    chunk runners of ``chunk_codes`` (distinct opcodes) compiled -- in one batch, so that
    worker processes share it."""
    dtype = np.dtype(dtype)
    by_kind = {"run": _table("run", dtype), "chunk": _table("chunk", dtype)}
    wanted = [("run", int(c)) for c in codes] + [("chunk", int(c)) for c in chunk_codes]
    if any(by_kind[k][c] == MISSING for k, c in wanted):
        with _lock:
            units = [(k, c, dtype.name) for k, c in wanted if by_kind[k][c] == MISSING]
            for (kind, code, _), address in zip(units, compile_units(units)):
                by_kind[kind][code] = address
    return by_kind["run"], by_kind["chunk"]


def runners(dtype, codes):
    """The runner table of ``dtype`` with every op in ``codes`` (distinct opcodes) compiled."""
    return tables(dtype, codes)[0]


def worker(argv) -> int:
    """The worker process (started by ``_start_workers``): ``CLAIMS UNIT...``, UNIT
    being kind:code:dtype; compiles the units it can claim into the cache, then those of
    the batches that come (``_add_batch``), until none has come for WORKER_IDLE_S or the
    process that started it has ended (its claims folder is gone)."""
    claims, units = argv[0], _parse(argv[1:])
    idle = time.monotonic()
    while os.path.isdir(claims):
        todo = next((u for u in _order(units + _batches(claims)) if _claim(claims, u)), None)
        if todo is not None:
            _compile_unit(*todo)
            idle = time.monotonic()
        elif time.monotonic() - idle > WORKER_IDLE_S:
            break
        else:
            time.sleep(0.02)
    return 0
