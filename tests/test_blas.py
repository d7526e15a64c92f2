"""The BLAS behind the products (blas.py): every library present on this host gives numpy's
products within rounding on every shape class, the same bits at any thread count and
with checkpointing, and the choice is measured, cached per host and can be forced."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import blas

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env():
    """This checkout's jitgraph first on the path, whatever is installed."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))

LIBRARIES = [lib.name for lib in blas.available()]


@pytest.fixture(params=LIBRARIES)
def library(request):
    blas.use(request.param)
    try:
        yield request.param
    finally:
        blas.use(None)


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def tolerance(dtype, K):
    """A product's rounding: ~sqrt(K) ulps of the terms' magnitude (they are ~N(0, 1))."""
    eps = np.finfo(dtype).eps
    return 8 * eps * np.sqrt(K) * np.sqrt(K)


# (a shape, b shape, transpose a, transpose b): every way a product is laid out
SHAPES = [
    ((70, 90), (90, 110), False, False),
    ((90, 70), (90, 110), True, False),
    ((70, 90), (110, 90), False, True),
    ((90, 70), (110, 90), True, True),
    ((3, 5, 17, 24), (3, 5, 24, 9), False, False),          # batched
    ((3, 5, 24, 17), (3, 5, 9, 24), True, True),
    ((1, 5, 17, 24), (3, 1, 24, 9), False, False),          # broadcast batch
    ((3, 40, 64), (64, 33), False, False),                  # a 2-D right operand: one FLAT product
    ((64,), (64, 20), False, False),                        # vector @ matrix
    ((300, 700), (700, 260), False, False),                 # big enough to be cut into tiles
]


def product(g, av, bv, ta, tb):
    x = g.param(av, name="a")
    y = g.param(bv, name="b")
    return x, y, (swap_last(x) if ta else x) @ (swap_last(y) if tb else y)


def swap_last(t):
    """op(t): its last two axes swapped (a product reads it as it lies)."""
    n = len(t.shape)
    return jg.transpose(t, tuple(range(n - 2)) + (n - 1, n - 2)) if n > 2 else t.T


def np_t(v, t):
    return np.swapaxes(v, -1, -2) if t else v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a, b, ta, tb", SHAPES)
def test_every_library_gives_numpys_products_and_gradients(library, dtype, a, b, ta, tb):
    rng = np.random.default_rng(1)
    g = jg.Graph(dtype)
    av, bv = rand(rng, a, dtype), rand(rng, b, dtype)
    x, y, out = product(g, av, bv, ta, tb)
    K = a[-1] if not ta else a[-2]
    want = np.matmul(np_t(av, ta), np_t(bv, tb))
    got = jg.build_forward(out).run()
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance(dtype, K) * 4, err_msg=library)
    # gradients of sum(out * w): dA = w op(B)^T, dB = op(A)^T w, in the operands' layouts
    w = rand(rng, want.shape, dtype)
    loss = jg.sum(out * g.const(w))
    bwd = jg.build_backward(jg.build_forward(loss))
    bwd.run()
    ga, gb = x.grad, y.grad
    A, B = np_t(av, ta), np_t(bv, tb)
    if A.ndim == 1:
        dA = w @ B.T
        dB = np.outer(A, w)
    else:
        dA = np.matmul(w, np.swapaxes(B, -1, -2)) if B.ndim > 1 else np.outer(w, B)
        dB = np.matmul(np.swapaxes(A, -1, -2), w)
        dA = dA.sum(axis=tuple(range(dA.ndim - A.ndim))) if dA.ndim > A.ndim else dA
        if dB.ndim > B.ndim:
            dB = dB.reshape((-1,) + dB.shape[-2:]).sum(axis=0)
        dA = dA.sum(axis=tuple(i for i, s in enumerate(A.shape) if s == 1 and dA.shape[i] != 1),
                    keepdims=True) if dA.shape != A.shape else dA
        dB = dB.sum(axis=tuple(i for i, s in enumerate(B.shape) if s == 1 and dB.shape[i] != 1),
                    keepdims=True) if dB.shape != B.shape else dB
    big = tolerance(dtype, max(a + b)) * 8
    np.testing.assert_allclose(ga, np_t(dA, ta), rtol=0, atol=big, err_msg=f"{library} dA")
    np.testing.assert_allclose(gb, np_t(dB, tb), rtol=0, atol=big, err_msg=f"{library} dB")


def gpt_block(dtype, rng):
    """A transformer block's fwd+bwd: products (tiled and batched) and attention."""
    g = jg.Graph(dtype)
    x = g.input((2, 64, 96), name="x")
    Wq, Wk, Wv = (g.param(rand(rng, (96, 96), dtype) / 10, name=n) for n in ("Wq", "Wk", "Wv"))
    W1 = g.param(rand(rng, (96, 384), dtype) / 10, name="W1")
    W2 = g.param(rand(rng, (384, 96), dtype) / 20, name="W2")

    def heads(t):
        return jg.transpose(jg.reshape(t, (2, 64, 4, 24)), (0, 2, 1, 3))

    att = jg.attention(heads(x @ Wq), heads(x @ Wk), heads(x @ Wv), causal=True)
    h = x + jg.reshape(jg.transpose(att, (0, 2, 1, 3)), (2, 64, 96))
    y = h + jg.gelu(h @ W1) @ W2
    loss = jg.mean(y * y)
    return g, x, [Wq, Wk, Wv, W1, W2], loss


def grads(bwd, x, params, xv):
    bwd.run({x: xv})
    return [np.array(p.grad) for p in params]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_library_gives_the_same_bits_at_any_thread_count_and_checkpointed(library, dtype):
    rng = np.random.default_rng(2)
    g, x, params, loss = gpt_block(dtype, rng)
    xv = rand(rng, x.shape, dtype)
    fwd = jg.build_forward(loss)
    plain = jg.build_backward(fwd)
    ref = None
    for n in (1, 2, 1):
        jg.set_num_threads(min(n, jg.threads.max_threads()))
        try:
            got = grads(plain, x, params, xv)
        finally:
            jg.set_num_threads()
        if ref is None:
            ref = got
        for r, q in zip(ref, got):
            np.testing.assert_array_equal(r, q, err_msg=f"{library}: {n} threads")
    ck = jg.build_backward(fwd, checkpoints="sqrt")
    for r, q in zip(ref, grads(ck, x, params, xv)):
        np.testing.assert_array_equal(r, q, err_msg=f"{library}: checkpointed")


def test_the_chooser_keeps_openblas_unless_another_is_clearly_faster():
    classes = [c[0] for c in blas.SHAPE_CLASSES]
    same = {c: 1.0 for c in classes}
    assert blas._pick({"openblas": same, "mkl": {c: 0.99 for c in classes}}) == "openblas"
    assert blas._pick({"openblas": same, "mkl": {c: 0.8 for c in classes}}) == "mkl"
    assert blas._pick({"openblas": {c: 0.8 for c in classes}, "mkl": same, "blis": same}) == "openblas"
    mixed = {"openblas": same, "mkl": {c: (0.8 if i % 2 else 1.6) for i, c in enumerate(classes)}}
    assert blas._pick(mixed) == "openblas", "faster on half the classes, slower overall"


def test_the_choice_is_measured_once_per_host_and_cached(tmp_path, monkeypatch):
    if len(LIBRARIES) < 2:
        libs = blas.available() * 2                               # one library present: pretend two
        monkeypatch.setattr(blas, "available", lambda: [libs[0], libs[0]._replace(name="mkl")])
    monkeypatch.setattr(blas, "choice_file", lambda: str(tmp_path / "blas-choice.json"))
    monkeypatch.delenv(blas.ENV, raising=False)
    calls = []
    real = blas.measure

    def counting(dtype=np.float32, libraries=None):
        calls.append(dtype)
        return real(dtype, libraries)

    monkeypatch.setattr(blas, "measure", counting)
    blas.use(None)
    try:
        first = blas.chosen(np.float32)
        assert len(calls) == 1
        saved = json.loads((tmp_path / "blas-choice.json").read_text())
        (entry,) = saved.values()
        assert entry["chosen"] == first.name and set(entry["seconds"]) == {x.name for x in blas.available()}
        blas.use(None)                                            # a new process, as far as the choice goes
        assert blas.chosen(np.float32).name == first.name
        assert len(calls) == 1, "the cached choice was measured again"
        assert "measured" in blas.describe(np.float32)
        monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")       # another kernel: another host key
        blas.use(None)
        blas.chosen(np.float32)
        assert len(calls) == 2
    finally:
        blas.use(None)


def run_python(code, **env):
    e = subprocess_env()
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("name", LIBRARIES)
def test_jitgraph_blas_forces_a_library(name):
    got = run_python("import numpy as np, jitgraph as jg\n"
                     "from jitgraph import blas\n"
                     "g = jg.Graph(np.float32); a = g.input((8, 8), name='a')\n"
                     "print(jg.build_forward(a @ a).run({a: np.eye(8, dtype=np.float32)}).sum())\n"
                     "print(blas.chosen(np.float32).name, blas.describe(np.float32))", JITGRAPH_BLAS=name)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.split("\n")
    assert float(lines[0]) == 8.0
    assert lines[1].split()[0] == name and "forced by JITGRAPH_BLAS" in lines[1]


def test_jitgraph_blas_naming_a_missing_library_says_what_is_present():
    got = run_python("import numpy as np, jitgraph as jg\n"
                     "g = jg.Graph(np.float32); a = g.input((2, 2), name='a')\n"
                     "jg.build_forward(a @ a).run({a: np.eye(2, dtype=np.float32)})", JITGRAPH_BLAS="essl")
    assert got.returncode != 0
    assert "JITGRAPH_BLAS='essl'" in got.stderr and "present: openblas" in got.stderr
    assert "Traceback" in got.stderr and "GraphError" in got.stderr


def test_info_names_the_cpu_and_the_chosen_blas():
    got = subprocess.run([sys.executable, "-m", "jitgraph", "info"], cwd=REPO, env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert "CPU: " in got.stdout and "BLAS for float32: " in got.stdout and "loops: " in got.stdout
    chosen = blas.chosen(np.float32).name
    assert f"BLAS for float32: {chosen} " in got.stdout
    for name in LIBRARIES:
        assert f"  {name}: " in got.stdout


def test_an_mkl_the_process_already_loaded_is_left_to_its_owner():
    """numpy or scipy built on MKL: that MKL's threads are the user's, so it is no candidate
    (jitgraph would set it sequential); the other libraries still are."""
    loaded = [{"internal_api": "mkl", "filepath": "/somewhere/libmkl_rt.so.2"}]
    assert blas._mkl(loaded) is None
    if "blis" in LIBRARIES:
        assert blas._blis(loaded) is not None
    assert blas._openblas(loaded) is not None          # scipy's BLAS, whatever it is, stays
