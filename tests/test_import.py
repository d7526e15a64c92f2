"""What ``import jitgraph`` loads: a process that builds and runs a graph loads neither
scipy.linalg (Numba's BLAS check is met by scipy's bare cython_blas extension,
jitgraph/_blas_probe.py) nor the layers, the PyTorch importer or tqdm -- and each of them
still works as usual when asked for."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent

PROBE = """
import sys
import numpy as np
import jitgraph as jg
g = jg.Graph(np.float32)
x = g.input((4, 3), name="x")
W = g.param(np.ones((3, 2)), name="W")
bwd = jg.build_backward(jg.build_forward(jg.mean(jg.relu(x @ W))))
loss = float(bwd.run({x: np.arange(12.0).reshape(4, 3)}))
assert loss == 16.5, loss
loaded = sorted(m for m in ("scipy.linalg", "jitgraph.nn", "jitgraph.importer", "tqdm") if m in sys.modules)
print("LOADED", loaded, jg._blas_probe.LIGHT)

# each still works when asked for, and scipy.linalg gets the very module Numba's check saw
import scipy.linalg.cython_blas as cython_blas
import scipy.linalg
assert scipy.linalg.cython_blas is cython_blas and "sgemm" in cython_blas.__pyx_capi__
assert scipy.linalg.solve(np.eye(2) * 2, np.ones(2)).tolist() == [0.5, 0.5]
import numba
@numba.njit
def dot(a, b):
    return np.dot(a, b)
assert dot(np.eye(2), np.full((2, 2), 3.0)).tolist() == [[3.0, 3.0], [3.0, 3.0]]
assert jg.nn.Linear(3, 2)(x).shape == (4, 2) and callable(jg.from_torch) and jg.Imported.__name__ == "Imported"
assert callable(jg.train) and jg.train.__module__ == "jitgraph.train"
import jitgraph.train
assert callable(jg.train), "importing the module jitgraph.train must not rebind jg.train"
print("OK")
"""


def run(code, *before):
    """Run ``code`` in a new process that first imports ``before`` (modules), from the clone."""
    pre = "".join(f"import {m}\n" for m in before)
    out = subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_graph_run_loads_no_scipy_linalg_layers_importer_or_tqdm():
    out = run(PROBE)
    assert "LOADED [] True" in out and out.rstrip().endswith("OK"), out


def test_scipy_linalg_imported_first_is_left_to_numba():
    out = run(PROBE, "scipy.linalg")
    assert "LOADED ['scipy.linalg'] False" in out and out.rstrip().endswith("OK"), out


WITHOUT_SCIPY = """
import sys
sys.modules["scipy"] = None          # as if not installed: every import of it raises ImportError
import numpy as np
import jitgraph as jg
from jitgraph import blas
rng = np.random.default_rng(0)
g = jg.Graph(np.float64)
x = g.input((5, 4), name="x")
W = g.param(rng.standard_normal((4, 3)), name="W")
bwd = jg.build_backward(jg.build_forward(jg.sum(x @ W)))
xs = rng.standard_normal((5, 4))
loss = float(bwd.run({x: xs}))
assert abs(loss - float((xs @ W.value).sum())) < 1e-12, loss
assert np.allclose(bwd.grad(W), xs.sum(0)[:, None] * np.ones((1, 3)))
assert not jg._blas_probe.LIGHT and blas.chosen(np.float64).name in ("openblas", "mkl", "blis")
assert blas._openblas([]) is None        # numpy's OpenBLAS out of sight, and no scipy to fall back on
blas._found[:] = []
blas._chosen.clear()
blas.available = lambda: []
try:
    blas.chosen(np.float32)
except jg.GraphError as e:
    assert "no BLAS for float32 products" in str(e) and "pip install scipy" in str(e), e
else:
    raise AssertionError("no BLAS at all must raise")
print("OK")
"""


def test_without_scipy_products_run_on_numpys_openblas():
    """scipy is no dependency on Linux (numpy's wheels carry OpenBLAS): without it jitgraph
    imports, its products run on numpy's OpenBLAS (or MKL), and a host with no BLAS at all
    gets an error saying what to install."""
    out = run(WITHOUT_SCIPY)
    assert out.rstrip().endswith("OK"), out


GC_PROBE = """
import gc, weakref
gc.{setting}()                       # the user's choice: jitgraph's import must keep it
import jitgraph as jg
print("AFTER", gc.isenabled(), gc.get_freeze_count() > 100_000)
gc.enable()

class Node:
    pass

a, b = Node(), Node()              # a cycle made after the import is collected as usual
a.other, b.other = b, a
alive = weakref.ref(a)
del a, b
gc.collect()
print("CYCLE", alive() is None)
"""


def test_import_freezes_numbas_objects_out_of_collections_and_keeps_the_collector_setting():
    out = run(GC_PROBE.format(setting="disable"))
    assert "AFTER False True" in out and "CYCLE True" in out, out
    out = run(GC_PROBE.format(setting="enable"))
    assert "AFTER True True" in out and "CYCLE True" in out, out


def test_jitgraph_gc_freeze_0_leaves_the_collector_alone():
    code = "import os; os.environ['JITGRAPH_GC_FREEZE'] = '0'\nimport gc, jitgraph\nprint('FROZEN', gc.get_freeze_count())"
    assert "FROZEN 0" in run(code)
