"""Installing jitgraph compiles it (setup.py): the wheel carries the graph passes and the
common kernels in the package's cache folder, so the first process after ``pip install``
compiles nothing it covers -- and a process on another CPU, which that code was not
compiled for, never loads it: it compiles as a first run does."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import jitgraph as jg

ROOT = pathlib.Path(__file__).parent.parent
OPS = "matmul,add,relu,relu_d,mean,sum,broadcast,mul,affine"     # what SCRIPT runs: a small op set keeps the install short

SCRIPT = """import numpy as np
import jitgraph as jg
g = jg.Graph(np.float32)
x = g.input((16, 8), name="x")
W = g.param(np.linspace(-1, 1, 32).reshape(8, 4), name="W")
b = g.param(np.full(4, 0.1), name="b")
bwd = jg.build_backward(jg.build_forward(jg.mean(jg.relu(x @ W + b))))
loss = bwd.run({x: np.linspace(-2, 2, 128).reshape(16, 8)})
jg.optim.SGD([W, b], lr=0.1).step()
print(repr(float(loss)), repr(float(W.value[1, 2])), jg._cache.CACHE_DIR)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy(ROOT / name, source / name)
    for name in ("jitgraph", "perf"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns(".jitcache", "__pycache__",
                                                                                   "results"))
    target = base / "site"
    said = install(source, target, base / "xdg")
    assert "jitgraph: compiling the graph passes and 9 float32 ops' kernels" in said
    (base / "scripts").mkdir()
    (base / "scripts" / "run.py").write_text(SCRIPT)
    return target, base / "scripts" / "run.py"


def install(source, target, user_cache):
    """pip install ``source`` into ``target`` (compiling OPS, keeping builds in ``user_cache``);
    what it said."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAPH_", "NUMBA_CACHE_DIR"))}
    env.update(JITGRAPH_PRECOMPILE=OPS, XDG_CACHE_HOME=str(user_cache))
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(source)], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def run(site, extra=()):
    target, script = site
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAPH_", "NUMBA_CACHE_DIR"))}
    env.update(PYTHONPATH=str(target), JITGRAPH_COMPILE_WORKERS="1", **dict(extra))
    out = subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split(), out.stderr


def test_the_wheel_carries_the_compiled_kernels(site):
    target, _ = site
    folders = list((target / "jitgraph" / ".jitcache").glob("k-*"))
    assert len(folders) == 1 and (folders[0] / jg._cache.INSTALLED).is_file()
    markers = {p.name for p in (folders[0] / "compiled").iterdir()}
    assert {"run-matmul-float32", "run-relu-float32", "run-relu_d-float32", "run-sum-float32"} <= markers
    assert not any("float64" in m for m in markers)


def test_the_first_run_after_an_install_compiles_nothing(site):
    target, _ = site
    (loss, total, cache), err = run(site)
    assert "jitgraph:" not in err, err                         # no "first use", no "compiling": all loaded
    assert cache.startswith(str(target / "jitgraph" / ".jitcache" / "k-"))
    (again, total_again, _), err = run(site)
    assert (again, total_again) == (loss, total) and "jitgraph:" not in err


def test_another_cpu_never_loads_the_installed_code(site):
    """The cache folder's name holds the CPU: code compiled for this CPU is not even looked at
    by a process compiling for another (here Numba's generic x86-64): its cache is a new folder,
    whose first use it announces (what it then compiles, test_compile's tests follow)."""
    target, _ = site
    code = "import jitgraph; print(jitgraph._cache.CACHE_DIR, jitgraph._cache.target_cpu()[0])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAPH_", "NUMBA_CACHE_DIR"))}
    folders = []
    for cpu in ({}, {"NUMBA_CPU_NAME": "generic"}):
        out = subprocess.run([sys.executable, "-c", code], cwd=target.parent, capture_output=True, text=True,
                             env=dict(env, PYTHONPATH=str(target), **cpu), timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        folders.append((out.stdout.split(), out.stderr))
    (here, name), quiet = folders[0]
    (other, other_name), said = folders[1]
    assert other_name == "generic" and name != "generic"
    assert here.startswith(str(target)) and os.path.isfile(os.path.join(here, jg._cache.INSTALLED))
    assert os.path.dirname(other) == os.path.dirname(here) and other != here
    assert not os.path.isfile(os.path.join(other, jg._cache.INSTALLED))
    assert "jitgraph:" not in quiet and "first use of this build" in said


def test_a_read_only_install_starts_its_cache_from_the_installed_one(tmp_path, monkeypatch):
    """Where the package folder is read-only the cache lives in the user's folder: its first
    use copies what the install compiled there instead of starting empty."""
    cache = jg._cache
    shipped, user = tmp_path / "pkg" / ".jitcache" / "k-x", tmp_path / "user" / "k-x"
    (shipped / "compiled").mkdir(parents=True)
    (shipped / "compiled" / "run-relu-float32").write_text("")
    monkeypatch.setattr(cache, "SHIPPED_DIR", str(shipped))
    monkeypatch.setattr(cache, "CACHE_DIR", str(user))
    cache._adopt_shipped()
    assert not user.exists()                                   # a clone's own cache folder is no install's
    (shipped / cache.INSTALLED).write_text("")
    cache._adopt_shipped()
    assert (user / "compiled" / "run-relu-float32").exists()
    (user / "compiled" / "run-relu-float32").unlink()
    cache._adopt_shipped()                                     # a cache already there is never replaced
    assert not (user / "compiled" / "run-relu-float32").exists()


def test_a_reinstall_of_the_same_sources_reuses_the_compiled_code(site):
    """A second build of the same sources on this machine (a reinstall, CI's second line) copies
    what the first compiled instead of compiling again, and its first run compiles nothing."""
    target, script = site
    base = target.parent
    again = base / "site2"
    said = install(base / "source", again, base / "xdg")
    assert "as this machine compiled them for an earlier build" in said and "jitgraph: compiling" not in said
    assert len(list((again / "jitgraph" / ".jitcache").glob("k-*/installed"))) == 1
    (loss, _, cache), err = run((again, script))
    assert "jitgraph:" not in err and cache.startswith(str(again))
