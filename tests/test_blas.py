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
# with two libraries, "mixed": the first for large products, the second for every small one and
# for large A^T B -- the buckets blas.by_bucket chooses between, on every test below
MIXED = {b: LIBRARIES[-1] for b in range(blas.N_BUCKETS) if b % 2 or blas.bucket_name(b).startswith("A^T B ")}


@pytest.fixture(params=LIBRARIES + (["mixed"] if len(LIBRARIES) > 1 else []))
def library(request):
    if request.param == "mixed":
        blas.use(LIBRARIES[0], MIXED)
    else:
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


def test_the_main_library_is_chosen_on_the_large_products():
    large = {c[0] for c in blas.SHAPE_CLASSES if blas.bucket(*c[1:]) % 2 == 0}
    assert large and len(large) < len(blas.SHAPE_CLASSES)
    same = {c[0]: 1.0 for c in blas.SHAPE_CLASSES}
    small_fast = {c: 1.05 if c in large else 0.5 for c in same}          # MKL far ahead on small ones only
    assert blas._pick({"openblas": same, "mkl": small_fast}) == "mkl"
    assert blas._pick_main({"openblas": same, "mkl": small_fast}) == "openblas"
    assert blas._pick_main({"openblas": same, "mkl": {c: 0.9 if c in large else 1.2 for c in same}}) == "mkl"


def test_each_bucket_keeps_the_main_library_unless_another_is_clearly_faster_on_it():
    classes = [c[0] for c in blas.SHAPE_CLASSES]
    of = {c[0]: blas.bucket(*c[1:]) for c in blas.SHAPE_CLASSES}
    small_nt = blas.bucket(64, 64, 32, 0, 1)
    assert small_nt == blas.bucket(128, 128, 32, 0, 1) != blas.bucket(1024, 192, 768, 0, 1)
    assert blas.bucket_name(small_nt) == "A B^T small" and blas.bucket_name(blas.bucket(64, 1024, 1024, 1, 0)) == "A^T B large"
    same = {c: 1.0 for c in classes}
    # MKL 10% faster on the small A B^T classes only, 4% on the small A B ones (under the margin)
    mkl = {c: 0.9 if of[c] == small_nt else 0.96 if of[c] == blas.bucket(64, 32, 64, 0, 0) else 1.02 for c in classes}
    got = blas._pick_buckets({"openblas": same, "mkl": mkl}, "openblas")
    assert got == {blas.bucket_name(b): "mkl" if b == small_nt else "openblas" for b in range(blas.N_BUCKETS)}
    # the main library is what a bucket keeps: unmeasured ones (A^T B^T) and ties
    got = blas._pick_buckets({"openblas": {c: 0.9 if of[c] == small_nt else 1.0 for c in classes}, "mkl": same}, "mkl")
    assert got[blas.bucket_name(small_nt)] == "openblas" and got["A^T B^T small"] == "mkl" and got["A B large"] == "mkl"


@pytest.mark.skipif(len(LIBRARIES) < 2, reason="needs two BLAS libraries (the dev extra installs MKL on x86_64)")
def test_a_product_calls_its_buckets_library():
    """With small A B^T on the second library, a small A B^T product has that library's bits
    and a large A B the first's, in the same program."""
    first, second = LIBRARIES[0], LIBRARIES[-1]
    rng = np.random.default_rng(5)
    av, bv = rand(rng, (64, 200), np.float32), rand(rng, (48, 200), np.float32)     # 64 x 48 x 200: small
    cv, dv = rand(rng, (300, 500), np.float32), rand(rng, (500, 400), np.float32)

    def run():
        g = jg.Graph(np.float32)
        a, b, c, d = (g.input(v.shape, name=n) for v, n in zip((av, bv, cv, dv), "abcd"))
        fwd = jg.build_forward([a @ b.T, c @ d])
        return fwd.run({a: av, b: bv, c: cv, d: dv})

    try:
        blas.use(first)
        one = run()
        blas.use(second)
        two = run()
        small_nt = blas.bucket(64, 48, 200, 0, 1)
        blas.use(first, {small_nt: second})
        mixed = run()
        assert blas.by_bucket()[small_nt].name == second and blas.chosen().name == first
    finally:
        blas.use(None)
    assert not np.array_equal(one[0], two[0]) and not np.array_equal(one[1], two[1]), \
        "the two libraries gave the same bits: nothing tells them apart here"
    np.testing.assert_array_equal(mixed[0], two[0])
    np.testing.assert_array_equal(mixed[1], one[1])


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
        assert set(entry["buckets"]) == {blas.bucket_name(b) for b in range(blas.N_BUCKETS)}
        assert [x.name for x in blas.by_bucket(np.float32)] == [entry["buckets"][blas.bucket_name(b)]
                                                                for b in range(blas.N_BUCKETS)]
        real_cpu = blas._cpu
        monkeypatch.setattr(blas, "_cpu", lambda: real_cpu() + " (another)")     # another CPU: another host key
        blas.use(None)
        blas.chosen(np.float32)
        assert len(calls) == 2
        saved = json.loads((tmp_path / "blas-choice.json").read_text())
        for key in saved:                                         # an entry of an older jitgraph: no buckets
            del saved[key]["buckets"]
        (tmp_path / "blas-choice.json").write_text(json.dumps(saved))
        blas.use(None)
        blas.chosen(np.float32)
        assert len(calls) == 3, "an entry without buckets was taken as a choice"
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
