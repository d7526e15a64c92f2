"""The vector width of the loops (_target.py): the widest the CPU has, set before Numba's
code generator exists, kept from the user's own Numba settings, and never a bit of
difference in any result."""
import os
import re
import subprocess
import sys

import numpy as np
from llvmlite import binding
from numba import njit
from numba.core.registry import cpu_target

import jitgraph as jg
from jitgraph import _target, vmath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVX512 = bool(binding.get_host_cpu_features().get("avx512f", False))


def run_python(code, **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    for k in ("JITGRAPH_VECTOR_BITS", "NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME"):
        e.pop(k, None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True, text=True,
                          timeout=600)


@njit(error_model="numpy", cache=False)          # not cached, so inspect_asm has the code
def _exp_loop(x, o):
    for i in range(x.size):
        o[i] = vmath.exp(x[i])


def test_loops_get_the_widest_vectors_of_the_cpu():
    features = cpu_target.target_context.codegen()._tm_features
    x = np.linspace(-3.0, 3.0, 256, dtype=np.float32)
    o = np.empty_like(x)
    _exp_loop(x, o)
    asm = "\n".join(_exp_loop.inspect_asm().values())
    if os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME"):
        assert _target.BITS == 0 and not _target.SET_BY_JITGRAPH
    elif AVX512 and os.environ.get(_target.ENV) != "256":
        assert _target.BITS == 512 and _target.SET_BY_JITGRAPH
        assert features.endswith(_target.PREFER_256)
        assert re.search(r"vfmadd\w*ps\s[^\n]*%zmm", asm), "no 512-bit FMA in a float32 exp loop"
    else:
        assert _target.PREFER_256 not in features and not re.search(r"%zmm", asm)
    assert "512-bit" in _target.describe() or not _target.SET_BY_JITGRAPH


PROGRAM = """
import numpy as np, jitgraph as jg
from jitgraph import _target
for dt in (np.float32, np.float64):
    g = jg.Graph(dt)
    x = g.param(np.random.default_rng(3).standard_normal((37, 129)).astype(dt) * 3, name='x')
    w = g.param(np.linspace(0.5, 1.5, 129).astype(dt), name='w')
    b = g.param(np.linspace(-0.2, 0.3, 129).astype(dt), name='b')
    h = jg.layer_norm(x, weight=w, bias=b)
    y = jg.gelu(h) * jg.tanh(x) + jg.exp(-(x * x)) + jg.log(jg.sigmoid(x) + 1.0) + jg.silu(h)
    loss = jg.sum(jg.softmax(y) * x) + jg.sum(jg.sqrt(jg.exp(h) + 1.0))
    bwd = jg.build_backward(jg.build_forward(loss))
    out = np.asarray(bwd.run())
    print(out.tobytes().hex(), bwd.grad(x).tobytes().hex(), bwd.grad(w).tobytes().hex(), bwd.grad(b).tobytes().hex())
print(_target.BITS, _target.SET_BY_JITGRAPH)
"""


def test_the_vector_width_changes_no_bit():
    """The same program's loss and gradients, float32 and float64, compiled for 256-bit and
    for 512-bit loops (where the CPU has AVX-512; elsewhere both runs get the CPU's widest)."""
    narrow = run_python(PROGRAM, JITGRAPH_VECTOR_BITS="256")
    wide = run_python(PROGRAM)
    assert narrow.returncode == 0, narrow.stderr
    assert wide.returncode == 0, wide.stderr
    n_lines, w_lines = narrow.stdout.split("\n"), wide.stdout.split("\n")
    if AVX512:
        assert n_lines[2] == "256 False" and w_lines[2] == "512 True"
    else:
        assert n_lines[2] == w_lines[2] and n_lines[2].endswith("False")
    assert n_lines[:2] == w_lines[:2]
    assert len(n_lines[0]) > 1000


def test_numba_settings_of_the_user_are_kept():
    got = run_python("from numba.core import config\nimport jitgraph\nfrom jitgraph import _target\n"
                     "print(_target.BITS, _target.SET_BY_JITGRAPH, config.CPU_FEATURES)",
                     NUMBA_CPU_FEATURES="+avx2,+fma")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["0", "False", "+avx2,+fma"]


def test_numba_set_up_before_jitgraph_keeps_its_generator():
    got = run_python("from numba import njit\nnjit(lambda: 1)()\nimport jitgraph\nfrom jitgraph import _target\n"
                     "from numba.core.registry import cpu_target\n"
                     "print(_target.BITS, _target.SET_BY_JITGRAPH,"
                     " _target.PREFER_256 in cpu_target.target_context.codegen()._tm_features)")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == (["0", "False", "False"] if AVX512 else [got.stdout.split()[0], "False", "False"])


def test_a_bad_vector_width_is_a_clear_error():
    got = run_python("import jitgraph", JITGRAPH_VECTOR_BITS="300")
    assert got.returncode != 0
    assert "GraphError" in got.stderr and "JITGRAPH_VECTOR_BITS='300'" in got.stderr and "256 or 512" in got.stderr


def test_compile_helpers_get_the_same_choice():
    assert _target.child_env() == {_target.ENV: "512" if _target.SET_BY_JITGRAPH else "256"}
