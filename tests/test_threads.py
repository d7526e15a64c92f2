"""Results never depend on the thread count: every op of tests/naive.py at a size the
interpreter splits over threads, forward and gradients, and a small transformer block
(plain and checkpointed), are bit-identical at 1 and 2 threads; set_num_threads
rejects counts outside [1, cores]."""
import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.interpreter import PARALLEL_MIN
from jitgraph.ops.linear import tiling
from jitgraph.registry import BY_NAME, ELEMENTS, NO_GRAD, ROWS, ZERO_GRAD
from jitgraph.threads import BLOCK, max_threads

from .naive import REF, build, reference

THREADS = (1, 2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def default_threads_after():
    """Every test leaves the default thread count (all cores) behind."""
    yield
    jg.set_num_threads()


def at_each_thread_count(run):
    """run() at 1 and at 2 threads: {n: list of arrays}."""
    got = {}
    for n in THREADS:
        assert jg.set_num_threads(n) == n
        got[n] = [np.array(a, copy=True) for a in run()]
        # a run sets Numba's (per Python thread) count in the thread that runs it: this one
        assert numba.get_num_threads() == n, "the run did not use the thread count set"
    return got


def assert_same_bits(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what}[{i}]"
        assert np.all(np.isfinite(x)), f"{what}[{i}]: non-finite values (the comparison would prove little)"
        if x.tobytes() != y.tobytes():
            bad = np.flatnonzero(x.reshape(-1) != y.reshape(-1))
            pytest.fail(f"{what}[{i}]: {bad.size} of {x.size} elements differ between 1 and 2 threads, "
                        f"first at flat index {bad[0]}: {x.reshape(-1)[bad[0]]!r} vs {y.reshape(-1)[bad[0]]!r}")


# ---- (a) every op of naive.REF at a size the interpreter splits ------------------------------------
def _stacked(draws):
    """k fresh draws of an example stacked along axis 0: the arrays that share the first one's
    leading length (broadcast partners and index vectors of other lengths are the first
    draw's).  Fresh values, not copies, so a block computed from the wrong place shows."""
    first = draws[0]
    lead = first[0].shape[0]
    return [np.concatenate([d[i] for d in draws], axis=0)
            if isinstance(a, np.ndarray) and a.ndim and a.shape[0] == lead else a
            for i, a in enumerate(first)]


def _big_embedding(rng):
    table, idx = REF["embedding"].args(rng)          # the output has idx.size rows of the table's width
    k = math.ceil(PARALLEL_MIN / (idx.size * table.shape[1]))
    return [table, np.concatenate([np.roll(idx, j) for j in range(k)], axis=0)], REF["embedding"].kw


# ops whose example does not grow by stacking along axis 0 alone: their shape keyword follows the operand
KW_FOR = {
    "broadcast": lambda args: dict(shape=(2,) + args[0].shape[:1] + (4,)),
    "reshape": lambda args: dict(shape=(-1, args[0].shape[-1])),
}
GROW = {"embedding": _big_embedding}


def big_example(name, seed=0):
    """(args, kw) of op ``name``: its naive.py example drawn k times and stacked until the
    node has at least PARALLEL_MIN elements (the interpreter's threshold for splitting)."""
    rng = np.random.default_rng(seed)
    case = REF[name]
    if name in GROW:
        return GROW[name](rng)
    first = case.args(rng)
    k = math.ceil(PARALLEL_MIN / first[0].size)
    args = _stacked([first] + [case.args(rng) for _ in range(k - 1)])
    kw = KW_FOR[name](args) if name in KW_FOR else case.kw
    return args, kw


def _graph_of_example(name, dtype, args, kw, as_params):
    g = jg.Graph(dtype)
    wrt = REF[name].wrt
    tensors = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            trainable = as_params and (wrt is None or i in wrt)
            tensors.append(g.param(a, name=f"a{i}") if trainable else g.const(a, name=f"a{i}"))
        else:
            tensors.append(a)
    out = build(name, BY_NAME[name].builder, tensors, kw)
    assert out.op == name, f"the builder made a {out.op!r} node"
    return g, tensors, out


def _work(t):
    """The interpreter's measure of a node: its elements, or its first source's if more."""
    size = t.size
    srcs = t.sources
    if srcs:
        size = max(size, srcs[0].size)
    return size


@pytest.mark.parametrize("name", sorted(REF))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_every_op_forward_is_bit_identical_at_1_and_2_threads(name, dtype):
    args, kw = big_example(name)
    g, tensors, out = _graph_of_example(name, dtype, args, kw, as_params=False)
    assert _work(out) >= PARALLEL_MIN, f"{name}: the example did not grow to a split size"
    op = BY_NAME[name]
    if op.split in (ELEMENTS, ROWS):              # the interpreter's units and block size (interpreter.py)
        units = out.size if op.split == ELEMENTS else out.size // (out.shape[-1] if out.ndim else 1)
        per_block = max(1, BLOCK * units // _work(out))
        assert units > per_block, f"{name}: one block only ({units} units of {per_block})"
    fwd = jg.build_forward(out)
    got = at_each_thread_count(lambda: [fwd.run()])
    assert_same_bits(got[1], got[2], f"{name} forward")
    # and the split result is the right one (naive.py's float64 reference)
    cast = [a.astype(dtype).astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
            for a in args]
    want = reference(name, cast, kw, node=out)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1][0], want, **tol, err_msg=name)


DIFFERENTIABLE = sorted(n for n, c in REF.items() if c.grad and BY_NAME[n].vjp not in (NO_GRAD, ZERO_GRAD))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_every_op_gradient_is_bit_identical_at_1_and_2_threads(name, dtype):
    args, kw = big_example(name, seed=1)
    g, tensors, out = _graph_of_example(name, dtype, args, kw, as_params=True)
    params = [t for t in tensors if isinstance(t, jg.Tensor) and "param" in t.flags]
    assert params, name
    weights = np.random.default_rng(2).uniform(0.5, 1.5, out.shape)
    loss = jg.sum(out * g.const(weights)) if out.ndim else out * 1.25
    bwd = jg.build_backward(jg.build_forward(loss))

    def run():
        value = bwd.run()
        return [np.asarray(value)] + [bwd.grad(p) for p in params]
    got = at_each_thread_count(run)
    assert_same_bits(got[1], got[2], f"{name} loss and gradients")
    assert any(np.any(gr != 0) for gr in got[1][1:]), f"{name}: all gradients are zero"


# extra layouts the examples above do not reach: sums whose output elements are split over threads
SUMS = {
    "sum over leading axes (a bias gradient)": (dict(axis=(0, 1)), (64, 16, 96)),
    "sum over the last axis": (dict(axis=-1), (2048, 40)),
    "mean over leading axes": (dict(axis=0), (300, 200)),
    "sum over leading axes in strips of columns": (dict(axis=0), (24, 2500)),     # 2 strips of 1250
    "sum over leading axes, 3-d, in strips": (dict(axis=(0, 1)), (3, 4, 4100)),  # 4 strips
}


@pytest.mark.parametrize("case", list(SUMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_split_sums_are_bit_identical_at_1_and_2_threads(case, dtype):
    kw, shape = SUMS[case]
    g = jg.Graph(dtype)
    x = g.param(np.random.default_rng(3).standard_normal(shape), name="x")
    s = (jg.mean if case.startswith("mean") else jg.sum)(x, **kw)
    assert s.size > 1 and x.size >= PARALLEL_MIN
    loss = jg.sum(jg.sqr(s))
    bwd = jg.build_backward(jg.build_forward(loss))
    fwd = jg.build_forward(s)
    got = at_each_thread_count(lambda: [fwd.run(), np.asarray(bwd.run()), bwd.grad(x)])
    assert_same_bits(got[1], got[2], case)
    ref = (np.mean if case.startswith("mean") else np.sum)(x.value.astype(np.float64), **kw)
    np.testing.assert_allclose(got[1][0], ref, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


# ---- (b) a transformer block ----------------------------------------------------------------------
B, T, D, H, V = 4, 64, 128, 4, 300         # B*T = 256 rows: the logits' GEMM is cut in tiles
DH = D // H


def transformer(dtype, seed=0):
    """Pre-norm attention + GELU MLP block, an output projection and cross_entropy; returns
    (input, target, loss, params)."""
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((B, T, D), name="x")
    target = g.input((B, T, V), name="target")

    def w(*shape, name):
        return g.param(rng.standard_normal(shape) / np.sqrt(shape[0]), name=name)

    g1 = g.param(1.0 + 0.1 * rng.standard_normal(D), name="g1")
    b1 = g.param(0.1 * rng.standard_normal(D), name="b1")
    Wq, Wk, Wv, Wo = (w(D, D, name=n) for n in ("Wq", "Wk", "Wv", "Wo"))
    g2 = g.param(1.0 + 0.1 * rng.standard_normal(D), name="g2")
    b2 = g.param(0.1 * rng.standard_normal(D), name="b2")
    W1, W2, Wout = w(D, 4 * D, name="W1"), w(4 * D, D, name="W2"), w(D, V, name="Wout")
    c1 = g.param(0.1 * rng.standard_normal(4 * D), name="c1")

    def heads(t):                                             # (B, T, D) -> (B, H, T, DH)
        return jg.transpose(jg.reshape(t, (B, T, H, DH)), (0, 2, 1, 3))

    h = jg.layer_norm(x) * g1 + b1
    q, k, v = heads(h @ Wq), heads(h @ Wk), heads(h @ Wv)
    scores = (q @ jg.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(DH))   # (B, H, T, T)
    att = jg.softmax(scores, axis=-1) @ v                                 # (B, H, T, DH)
    x1 = x + jg.reshape(jg.transpose(att, (0, 2, 1, 3)), (B, T, D)) @ Wo
    h2 = jg.layer_norm(x1) * g2 + b2
    x2 = x1 + jg.gelu(h2 @ W1 + c1) @ W2
    loss = jg.cross_entropy(x2 @ Wout, target)
    params = [g1, b1, Wq, Wk, Wv, Wo, g2, b2, W1, W2, Wout, c1]
    sizes = {"scores": scores.size, "mlp": (B * T * 4 * D), "rows": B * T, "logits": B * T * V}
    return x, target, loss, params, sizes


def feeds(x, target, seed=1):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((B, T, V))
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return {x: rng.standard_normal((B, T, D)), target: p}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_transformer_block_plain_and_checkpointed_bit_identical_at_1_and_2_threads(dtype):
    results = {}
    for kw in ({}, {"checkpoints": "sqrt"}):
        x, target, loss, params, sizes = transformer(dtype)
        assert tiling(B * T, V, D, max_threads()) != (1, 1)           # the logits' GEMM is tiled
        assert min(B * T * D, sizes["scores"], sizes["mlp"]) >= PARALLEL_MIN   # norms, softmax, gelu are split
        bwd = jg.build_backward(jg.build_forward(loss), **kw)
        if kw:
            assert bwd.stats()["n_recomputed"] > 0
        fd = feeds(x, target)

        def run():
            value = bwd.run(fd)
            return [np.asarray(value)] + [bwd.grad(p) for p in params]
        got = at_each_thread_count(run)
        assert_same_bits(got[1], got[2], f"transformer {kw or 'plain'}")
        results[bool(kw)] = got
        assert np.isfinite(got[1][0]) and got[1][0] > 0
        assert all(np.any(gr != 0) for gr in got[1][1:])
    for n in THREADS:
        assert_same_bits(results[False][n], results[True][n], f"checkpointed vs plain at {n} threads")


# ---- (c) set_num_threads checks its argument ------------------------------------------------------
def test_set_num_threads_accepts_1_to_cores_and_rejects_the_rest():
    cores = max_threads()
    assert cores >= 2
    for n in range(1, cores + 1):
        assert jg.set_num_threads(n) == n and jg.get_num_threads() == n
    assert jg.set_num_threads() == cores and jg.get_num_threads() == cores
    for bad in (0, -1, -8, cores + 1, 10 * cores):
        with pytest.raises(jg.GraphError, match="set_num_threads"):
            jg.set_num_threads(bad)
    # a rejected call changes nothing
    jg.set_num_threads(1)
    with pytest.raises(jg.GraphError):
        jg.set_num_threads(0)
    assert jg.get_num_threads() == 1
    g = jg.Graph(np.float32)
    t = g.param(np.arange(4.0))
    jg.build_forward(jg.sum(t)).run()
    assert numba.get_num_threads() == 1


def test_import_leaves_openmp_to_libraries_imported_later():
    """``import jitgraph`` must not load libgomp: a PyTorch imported afterwards would share it
    instead of its own, and its CPU flash attention ran 40x slower at 2 threads once jitgraph
    had run.  Numba loads its omp layer at the first parallel run; that run still works."""
    code = ("import jitgraph as jg, numpy as np\n"
            "maps = lambda: [l for l in open('/proc/self/maps') if 'libgomp' in l]\n"
            "assert not maps(), maps()\n"
            "g = jg.Graph(np.float32)\n"
            "x = g.input((64, 4096), name='x')\n"
            "jg.set_num_threads(2)\n"
            "out = jg.build_forward(jg.exp(x)).run({x: np.ones((64, 4096), np.float32)})\n"
            "assert np.allclose(out, np.e)\n"
            "import numba\n"
            "assert numba.threading_layer() != 'omp' or maps()\n")
    env = dict(os.environ, PYTHONPATH=ROOT, JITGRAPH_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_block_runner_is_compiled_only_for_programs_with_a_node_to_split():
    """A graph whose nodes are all below PARALLEL_MIN never loads the parallel block
    runner (a small graph's first run does not wait for it); one with a bigger node
    loads it, and the tables of both name it right (checked in a new process)."""
    code = f"""
import numpy as np, jitgraph as jg
from jitgraph import interpreter
g = jg.Graph(np.float64)
x = g.input((4, 8), name="x")
W = g.param(np.ones((8, 8)), name="W")
small = jg.build_backward(jg.build_forward(jg.mean(jg.tanh(x @ W))))
small.run({{x: np.ones((4, 8))}})
assert not interpreter._block_runners, interpreter._block_runners
assert small._tables[2] == 0
n = {PARALLEL_MIN}
y = g.input((n,), name="y")
big = jg.build_forward(jg.sum(jg.exp(y)))
assert float(big.run({{y: np.zeros(n)}})) == n
assert list(interpreter._block_runners) == ["float64"] and big._tables[2] != 0
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=ROOT, JITGRAPH_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-3000:]
