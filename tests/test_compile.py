"""Compiling what a graph uses: the cache folder that cannot go stale, the notices on a
first run, compile units shared with worker processes, and ``jitgraph warmup``."""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import _cache, compiler, registry, warmup
from jitgraph.cli import main as cli_main

ROOT = pathlib.Path(__file__).parent.parent

# a float64 forward graph of one op whose runner (ops/unary.py) calls vmath.exp from another file
CHILD = r"""
import numpy as np, jitgraph as jg
g = jg.Graph(np.float64)
x = g.input((3,), name="x")
print(repr(float(jg.build_forward(jg.exp(x)).run({x: np.zeros(3)})[0])))
"""


def run_child(package_parent, cache, quiet=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAPH_")}
    env.update(PYTHONPATH=str(package_parent), NUMBA_CACHE_DIR=str(cache))
    if quiet:
        env["JITGRAPH_QUIET"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=package_parent, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return float(out.stdout.strip().splitlines()[-1]), out.stderr


def test_first_run_notices_warm_run_quiet_and_an_edit_elsewhere_recompiles(tmp_path):
    """A copy of the package in an empty cache: the first process says it compiles, the
    second loads silently, and editing vmath.py (not the file of the exp runner, which is
    all Numba's own cache would check) changes the answer with no cache clearing."""
    shutil.copytree(ROOT / "jitgraph", tmp_path / "jitgraph", ignore=shutil.ignore_patterns(".jitcache", "__pycache__"))
    cache = tmp_path / "cache"
    value, err = run_child(tmp_path, cache)
    assert value == 1.0
    assert "jitgraph: first use of this build" in err
    assert "compiling 1 kernels for float64" in err
    value, err = run_child(tmp_path, cache)
    assert value == 1.0
    assert "jitgraph:" not in err                      # warm: nothing to say
    vmath = tmp_path / "jitgraph" / "vmath.py"
    text = vmath.read_text()
    assert text.count("return lambda x: math.exp(x)\n") == 1
    vmath.write_text(text.replace("return lambda x: math.exp(x)\n", "return lambda x: math.exp(x) + 1.0\n"))
    value, err = run_child(tmp_path, cache, quiet=True)
    assert value == 2.0                                # the edit is live
    assert "jitgraph:" not in err                      # JITGRAPH_QUIET=1, although it compiled
    folders = sorted(p.name for p in (cache / "jitgraph").iterdir() if p.is_dir())
    assert len(folders) == 2 and all(f.startswith("k-") for f in folders)


def test_cache_key_names_every_source_file(tmp_path):
    assert _cache.CACHE_DIR.endswith("k-" + _cache.source_key())
    names = {os.path.relpath(p, _cache.PACKAGE_DIR) for p in _cache._source_files()}
    assert {"vmath.py", "compiler.py", os.path.join("ops", "unary.py")} <= names


def test_read_only_package_folder_falls_back_to_a_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(_cache, "PACKAGE_DIR", str(tmp_path / "not-writable"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    real = _cache._writable
    monkeypatch.setattr(_cache, "_writable", lambda p: False if "not-writable" in p else real(p))
    assert _cache.cache_root() == str(tmp_path / "user" / "jitgraph")


def test_every_process_takes_the_longest_kernels_first():
    """One order for all (each claims the first unit not yet claimed): a unary op's short
    compile after the others, so the last unit to finish is a short one; a unit given
    twice is taken once."""
    code = {name: registry.BY_NAME[name].code for name in ("relu", "add", "sum", "matmul", "relu_d")}
    units = [("run", code["relu"], "float32"), ("run", code["add"], "float32"), ("run", code["matmul"], "float32"),
             ("run", code["relu_d"], "float32"), ("run", code["sum"], "float32"), ("run", code["add"], "float32")]
    assert compiler._order(units) == [("run", code["add"], "float32"), ("run", code["matmul"], "float32"),
                                      ("run", code["sum"], "float32"), ("run", code["relu"], "float32"),
                                      ("run", code["relu_d"], "float32")]


def test_a_unit_is_claimed_once(tmp_path):
    unit = ("run", registry.BY_NAME["relu"].code, "float32")
    assert compiler._claim(str(tmp_path), unit)
    assert not compiler._claim(str(tmp_path), unit)


def test_compile_workers_follow_the_environment(monkeypatch):
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "0")
    assert compiler.compile_workers(10) == 0
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "3")
    assert compiler.compile_workers(10) == 3
    assert compiler.compile_workers(2) == 1            # never more workers than units beyond the first
    assert compiler.compile_workers(1) == 0


def test_units_a_dead_worker_left_compile_here(tmp_path, monkeypatch, capsys):
    """Workers that exit without compiling anything: this process compiles every unit,
    leaves its marker and returns working callbacks."""
    for p in compiler._live():                      # workers an earlier test started
        p.wait()
    monkeypatch.setattr(compiler, "DONE_DIR", str(tmp_path / "compiled"))   # every unit looks new
    monkeypatch.setattr(compiler, "_line", compiler.CompileLine())          # earlier tests' units look new too
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "1")
    monkeypatch.delenv("JITGRAPH_QUIET", raising=False)
    started = []

    def dead_workers(units, claims, n):
        started.append((len(units), n))
        return [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(n)]

    monkeypatch.setattr(compiler, "_start_workers", dead_workers)
    codes = [registry.BY_NAME[name].code for name in ("neg", "abs", "sqrt")]
    units = [("run", c, "float64") for c in codes]
    addresses = compiler.compile_units(units)
    assert started == [(3, 1)]
    assert all(a != 0 for a in addresses)
    assert all(compiler.is_cached(*u) for u in units)
    err = capsys.readouterr().err
    assert "compiling 3 kernels for float64 (first run only, 2 processes)" in err
    assert "compiled 3 kernels for float64 in" in err
    # and the callbacks compute: run a graph through the same tables
    g = jg.Graph(np.float64)
    x = g.input((4,), name="x")
    out = jg.build_forward(jg.sqrt(jg.abs(jg.neg(x)))).run({x: np.array([-4.0, 1.0, 9.0, 0.0])})
    np.testing.assert_array_equal(out, [2.0, 1.0, 3.0, 0.0])


def test_quiet_means_no_notice(monkeypatch, capsys):
    monkeypatch.setenv("JITGRAPH_QUIET", "1")
    compiler.notice("hello")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("JITGRAPH_QUIET", "0")
    compiler.notice("hello")
    assert capsys.readouterr().err == "jitgraph: hello\n"


def test_warmup_fills_every_unit_of_a_dtype():
    got = warmup.warmup(["float32"], progress=False)
    assert got["seconds"] >= 0
    missing = [compiler.unit_name(*u) for u in warmup.units(["float32"]) if not compiler.is_cached(*u)]
    assert missing == []
    every = warmup.units(["float32"])
    assert {c for k, c, _ in every if k == "run"} == {op.code for op in registry.OPS.values() if op.runner}
    assert warmup.warmup(["float32"], progress=False)["functions"] == 0     # all there now


def test_warmup_command_line(capsys):
    assert cli_main(["warmup", "--no-progress"]) == 0
    assert "kernels compiled for float32" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["warmup", "--dtype", "float16"])
    with pytest.raises(ValueError, match="float16"):
        warmup.warmup(["float16"])


def test_prefetch_starts_workers_only_for_new_units(tmp_path, monkeypatch):
    """build_forward hands the graph's ops to prefetch: units in the cache start nothing,
    new ones start a worker on their runners."""
    for p in compiler._live():
        p.wait()
    started = []
    monkeypatch.setattr(compiler, "_start_workers", lambda units, claims, n: started.append((units, n)) or [])
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "1")
    relu = registry.BY_NAME["relu"].code
    compiler.runners(np.float32, [relu])
    compiler.prefetch(np.float32, [relu, relu])
    assert started == []                               # compiled in this process already
    monkeypatch.setattr(compiler, "DONE_DIR", str(tmp_path / "compiled"))
    monkeypatch.setattr(compiler, "_runner_tables", {})
    compiler.prefetch(np.float32, [relu, relu])
    assert started == [([("run", relu, "float32")], 1)]
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "0")
    compiler.prefetch(np.float64, [relu])
    assert len(started) == 1                           # no workers wanted: nothing starts


def test_import_compiles_nothing_and_first_use_helpers_compile_once(tmp_path):
    """``import jitgraph`` on an empty cache compiles no function (helpers with a declared
    signature wait for their first use); a first-use helper then compiles its one
    signature whether reached from jitted code with literal arguments or from Python,
    and keeps it (no specialization per literal)."""
    code = """
import numba
from numba.core import event
compiled = []
class Count(event.Listener):
    def on_start(self, ev):
        compiled.append(str(ev.data["dispatcher"].py_func.__qualname__))
    def on_end(self, ev):
        pass
with event.install_listener("numba:compile", Count()):
    import jitgraph
assert compiled == [], compiled
from jitgraph import emit, plan
from jitgraph._sigs import FirstUse
assert isinstance(emit.new_node, FirstUse) and not emit.new_node.signatures
@numba.njit
def take_twice(st):
    a = plan._take(st, st, 3, 4, 5)
    b = plan._take(st, st, 7, 8, 9)
    return a[0] + b[0]
import numpy as np
st = np.zeros(8, np.int64)
with event.install_listener("numba:compile", Count()):
    take_twice(st)
assert "take_twice" in compiled and "_take" in compiled, compiled     # the listener does see compiles
assert len(plan._take.signatures) == 1, plan._take.signatures
plan._give(st, st, 1, 2, 3, 4)       # first use from Python
assert len(plan._give.signatures) == 1
print("ok")
"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), JITGRAPH_QUIET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-3000:]


def test_warmup_passes_load_the_block_runner(monkeypatch):
    """warmup's model is too small to need the block runner, so warmup asks for it."""
    from jitgraph import interpreter
    monkeypatch.setattr(interpreter, "_block_runners", {})
    warmup._passes("float32")
    assert list(interpreter._block_runners) == ["float32"]


def test_first_use_helpers_are_plain_functions_without_jit():
    """Under NUMBA_DISABLE_JIT, as with njit, a first-use helper is the Python function."""
    code = """
import types, numpy as np
from jitgraph import emit, plan
assert isinstance(plan._take, types.FunctionType) and isinstance(emit.new_node, types.FunctionType)
assert plan._take(np.zeros(4, np.int64), np.zeros(4, np.int64), 0, 10, 5) == (10, 0, 15)
print("ok")
"""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", JITGRAPH_QUIET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-3000:]


def test_running_workers_get_new_units_as_a_batch(tmp_path, monkeypatch):
    """While a worker runs, more units (build_backward's after build_forward's) go to it as a
    batch file, not to another process; with a core to spare, a new worker starts too."""
    started = []
    monkeypatch.setattr(compiler, "_claims_dir", [str(tmp_path)])
    monkeypatch.setattr(compiler, "_workers", [])
    monkeypatch.setattr(compiler, "_start_workers", lambda units, claims, n: started.append((units, n)) or [])
    monkeypatch.setattr(compiler, "_live", lambda: [object()])         # one worker is busy
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "1")
    relu, neg = registry.BY_NAME["relu"].code, registry.BY_NAME["neg"].code
    first, second = [("run", relu, "float32")], [("run", neg, "float32"), ("run", relu, "float64")]
    compiler._spawn(first)
    compiler._spawn(second)
    assert started == []                                               # no second process
    assert compiler._batches(str(tmp_path)) == first + second          # oldest batch first
    monkeypatch.setenv("JITGRAPH_COMPILE_WORKERS", "2")
    compiler._spawn(second)
    assert started == [(second, 1)]                                    # a core to spare: one more


def test_a_worker_compiles_the_batches_that_come_then_exits_when_idle(tmp_path, monkeypatch):
    """compiler.worker, run in this process: it claims its own units and then every unit of
    the batches in the claims folder, and returns once none has come for WORKER_IDLE_S."""
    monkeypatch.setattr(compiler, "WORKER_IDLE_S", 0.2)
    neg, absolute = registry.BY_NAME["neg"].code, registry.BY_NAME["abs"].code
    batch = [("run", absolute, "float64"), ("run", neg, "float32")]
    compiler._add_batch(str(tmp_path), batch)
    start = time.monotonic()
    assert compiler.worker([str(tmp_path), f"run:{neg}:float64"]) == 0
    assert time.monotonic() - start >= 0.2
    claimed = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("batch-"))
    assert claimed == sorted("-".join(map(str, u)) for u in [("run", neg, "float64")] + batch)
    assert all(compiler.is_cached(*u) for u in [("run", neg, "float64")] + batch)
    assert compiler.worker([str(tmp_path / "gone")]) == 0              # no claims folder: returns at once


# ---- the compile line ---------------------------------------------------------------------------
UNITS = [("run", registry.BY_NAME[name].code, "float32") for name in ("neg", "abs", "sqrt")]


class Terminal:
    """A stand-in for stderr on a terminal."""
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return True


def _cached(monkeypatch, done):
    monkeypatch.setattr(compiler, "is_cached", lambda kind, code, dtype: (kind, code, dtype) in done)
    monkeypatch.delenv("JITGRAPH_QUIET", raising=False)


def test_the_compile_line_is_said_once_off_a_terminal(monkeypatch, capsys):
    """Units that come in three batches (forward, backward, a run) and a unit given twice:
    one line when compiling starts, one when all is compiled, with the total."""
    done = set()
    _cached(monkeypatch, done)
    line = compiler.CompileLine()
    line.add(UNITS[:2], 2)
    line.add(UNITS[2:], 2)
    line.add(UNITS[:1], 2)
    line.tick()
    done.update(UNITS[:2])
    line.close_if_done()                      # one unit is still compiling: not closed
    done.update(UNITS)
    line.close_if_done()
    line.close_if_done()                      # closed once
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "jitgraph: compiling 2 kernels for float32 (first run only, 2 processes)..."
    assert len(err) == 2 and err[1].startswith("jitgraph: compiled 3 kernels for float32 in ")


def test_the_compile_line_counts_in_place_on_a_terminal(monkeypatch):
    done = set()
    _cached(monkeypatch, done)
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    line = compiler.CompileLine()
    line.EVERY_S = 0.0
    line.add(UNITS, 1)
    done.add(UNITS[0])
    line.tick()
    done.update(UNITS)
    line.close_if_done()
    shown = term.text.split("\r\x1b[K")[1:]
    assert shown[0].startswith("jitgraph: compiling 3 kernels for float32 (first run only)... 0/3, ")
    assert shown[1].startswith("jitgraph: compiling 3 kernels for float32 (first run only)... 1/3, ")
    assert shown[-1].startswith("jitgraph: compiled 3 kernels for float32 in ") and shown[-1].endswith(" s\n")
    assert term.text.count("\n") == 1         # one line, rewritten


def test_the_compile_line_goes_above_an_open_progress_bar(monkeypatch):
    """With a training bar on the terminal, the line is written above it (tqdm.write), whole,
    never into the bar's line."""
    from tqdm.auto import tqdm
    done = set()
    _cached(monkeypatch, done)
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = tqdm(total=10, file=term)
    try:
        line = compiler.CompileLine()
        line.add(UNITS, 2)
        line.tick()
        done.update(UNITS)
        line.close_if_done()
    finally:
        bar.close()
    lines = re.split(r"[\r\n]", term.text)    # the bar redraws with \r; the line is a segment of its own
    assert "jitgraph: compiling 3 kernels for float32 (first run only, 2 processes)..." in lines
    assert any(s.startswith("jitgraph: compiled 3 kernels for float32 in ") for s in lines)
    assert "\x1b[K" + "jitgraph" not in term.text


def test_prefetch_hands_each_unit_out_once(monkeypatch, capsys):
    """Building several programs with the same new ops (a bench, a notebook) starts their
    compiles once and says so once."""
    _cached(monkeypatch, set())
    spawned = []
    monkeypatch.setattr(compiler, "_line", compiler.CompileLine())
    monkeypatch.setattr(compiler, "compile_workers", lambda n: 1)
    monkeypatch.setattr(compiler, "_new_units", lambda name, codes: [u for u in UNITS if u[1] in codes])
    monkeypatch.setattr(compiler, "_spawn", lambda units: spawned.append(list(units)) or 1)
    codes = [u[1] for u in UNITS]
    compiler.prefetch(np.float32, codes[:2])
    compiler.prefetch(np.float32, codes[:2])
    compiler.prefetch(np.float32, codes)
    assert spawned == [UNITS[:2], UNITS[2:]]
    assert capsys.readouterr().err.count("jitgraph: compiling") == 1


def test_the_training_bar_opens_after_the_first_step(monkeypatch):
    """The first step is where a first run compiles: the bar starts after it (initial=1), so
    its rate and ETA count only steps that did not compile."""
    training = sys.modules["jitgraph.train"]
    made = []

    class Bar:
        def __init__(self, **kw):
            made.append((len(losses_seen), kw))

        def update(self, k):
            pass

        def set_postfix(self, **kw):
            pass

        def close(self):
            pass
    monkeypatch.setattr(training, "_training_bar", Bar)
    g = jg.Graph(np.float32)
    x = g.input((4, 3), name="x")
    w = g.param(np.ones((3, 2), np.float32), name="w")
    bwd = jg.build_backward(jg.build_forward(jg.sum(jg.relu(x @ w))))
    losses_seen = []
    real_run = bwd.run
    monkeypatch.setattr(bwd, "run", lambda feeds, seed=None, accumulate=False:
                        losses_seen.append(1) or real_run(feeds, accumulate=accumulate, seed=seed))
    losses = jg.train(bwd, jg.optim.SGD([w], lr=0.1), {x: np.ones((12, 3), np.float32)}, epochs=1)
    assert len(losses) == 3
    assert made == [(1, dict(total=3, initial=1, desc="train", unit="step", leave=False, disable=None))]


def test_no_training_bar_frames_in_a_log(tmp_path):
    """Written to a file (no terminal), a training run leaves no bar frames behind."""
    code = """import numpy as np, jitgraph as jg
g = jg.Graph(np.float32)
x = g.input((4, 3), name="x")
w = g.param(np.ones((3, 2), np.float32), name="w")
bwd = jg.build_backward(jg.build_forward(jg.sum(jg.relu(x @ w))))
jg.train(bwd, jg.optim.SGD([w], lr=0.1), {x: np.ones((40, 3), np.float32)}, epochs=3)
print("trained")
"""
    env = dict(os.environ, JITGRAPH_QUIET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "trained", out.stderr[-2000:]
    assert "step/s" not in out.stderr and "it/s" not in out.stderr, out.stderr
