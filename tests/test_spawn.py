"""Every process jitgraph starts loads the jitgraph its parent loaded, wherever it is run
from: an installed jitgraph run from a folder that holds another ``jitgraph/`` package (a
clone's root) must not let its compile helpers or Ray workers import that other one
(``python -m`` and Ray put the current folder first on sys.path; see jitgraph/_boot.py)."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent

IMPOSTOR = """import os
with open(os.environ["IMPOSTOR_LOG"], "a") as f:
    f.write(f"{os.getpid()} {__file__}\\n")
raise ImportError("the impostor jitgraph was imported")
"""

SCRIPT = """import sys, numpy as np
import jitgraph as jg
g = jg.Graph(np.float32)
x = g.input((4, 3), name="x")
W = g.param(np.ones((3, 2)), name="W")
bwd = jg.build_backward(jg.build_forward(jg.mean(jg.tanh(x @ W) * jg.sigmoid(x @ W))))
print(float(bwd.run({x: np.ones((4, 3))})), jg.__file__)
"""

RAY_SCRIPT = """import warnings, numpy as np, ray
import jitgraph as jg
from jitgraph.distributed import DataParallel
g = jg.Graph(np.float32)
x = g.input((8, 3), name="x")
W = g.param(np.ones((3, 2)), name="W")
bwd = jg.build_backward(jg.build_forward(jg.mean(jg.tanh(x @ W))))
ray.init(num_cpus=1, include_dashboard=False)
with warnings.catch_warnings():
    warnings.simplefilter("error")      # "a worker imported another jitgraph" would fail here
    with DataParallel(bwd, jg.optim.SGD([W], lr=0.1), num_workers=1) as dp:
        key, folder = ray.get(dp.workers[0].ready.remote())
        losses = dp.fit({x: np.ones((16, 3))}, epochs=1, batch_size=8, progress=False)
print(key == jg._cache.KEY, folder == jg._cache.PACKAGE_DIR, len(losses), folder)
ray.shutdown()
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site folder with jitgraph installed by pip, a clone-like folder holding an impostor
    ``jitgraph/`` and a subfolder holding another, the folder of the scripts)."""
    base = tmp_path_factory.mktemp("spawn")
    source = base / "source"                      # pip builds in its source tree: not in this checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy(ROOT / name, source / name)
    for name in ("jitgraph", "perf"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns(".jitcache", "__pycache__",
                                                                                   "results"))
    site = base / "site"
    env = dict(os.environ, JITGRAPH_PRECOMPILE="0")      # these tests watch the first run compile (test_install: not)
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                          "--target", str(site), str(source)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    clone = base / "clone"
    for folder in (clone / "jitgraph", clone / "sub" / "jitgraph"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(IMPOSTOR)
    scripts = base / "scripts"
    scripts.mkdir()
    (scripts / "run.py").write_text(SCRIPT)
    (scripts / "ray_run.py").write_text(RAY_SCRIPT)
    return site, clone, scripts


def run(installed, script, cwd, cache, log, workers="1"):
    site, _, scripts = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAPH_", "NUMBA_CACHE_DIR"))}
    env.update(PYTHONPATH=str(site), NUMBA_CACHE_DIR=str(cache), IMPOSTOR_LOG=str(log),
               JITGRAPH_COMPILE_WORKERS=workers)
    out = subprocess.run([sys.executable, str(scripts / script)], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split(), out.stderr


def test_compile_helpers_load_the_installed_jitgraph_from_a_clones_root(installed, tmp_path):
    site, clone, _ = installed
    cache, log = site.parent / "cache", tmp_path / "impostor.log"
    shutil.rmtree(cache, ignore_errors=True)                    # an empty cache: the first run compiles
    (loss, where), err = run(installed, "run.py", clone, cache, log)
    assert where == str(site / "jitgraph" / "__init__.py")
    assert "2 processes" in err                                 # a helper process really compiled
    assert "rule" not in err                                    # gradient rules are data: nothing to compile
    assert not log.exists(), log.read_text()                    # and no process imported the impostor
    keys = [p.name for p in (cache / "jitgraph").iterdir()]
    assert len(keys) == 1, keys                                 # one package, one cache folder
    # warm, from the root and from a subfolder holding another impostor: nothing compiles
    for cwd in (clone, clone / "sub"):
        (again, where), err = run(installed, "run.py", cwd, cache, log)
        assert again == loss and where == str(site / "jitgraph" / "__init__.py")
        assert "jitgraph:" not in err, err
    assert not log.exists()


def test_ray_workers_load_the_installed_jitgraph_from_a_clones_root(installed, tmp_path):
    site, clone, _ = installed
    # the cache the test above filled, where it ran first: what the workers compile is not the question here
    cache, log = site.parent / "cache", tmp_path / "impostor.log"
    words, err = run(installed, "ray_run.py", clone, cache, log, workers="0")
    assert words[:3] == ["True", "True", "2"], err[-3000:]
    assert words[3] == str(site / "jitgraph")
    assert not log.exists(), log.read_text()
