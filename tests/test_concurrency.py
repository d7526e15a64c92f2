"""Programs shared between Python threads: forward runs each get a run buffer of their
own, backward runs (whose gradients are program state) are serialized by the program's
lock -- every result equals the serial one."""
import os
import threading

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

import jitgraph as jg
from jitgraph import blas
from jitgraph.threads import hold_blas, release_blas


def in_threads(worker, args):
    """worker(*a) for each a in args, all at once, one Python thread each; returns when all end."""
    threads = [threading.Thread(target=worker, args=a) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def model():
    rng = np.random.default_rng(0)
    g = jg.Graph(np.float32)
    x = g.input((64, 128), name="x")
    W1 = g.param(rng.standard_normal((128, 256)) * 0.05, name="W1")
    W2 = g.param(rng.standard_normal((256, 10)) * 0.05, name="W2")
    h = jg.gelu(x @ W1)
    fwd = jg.build_forward(jg.softmax(h @ W2))
    bwd = jg.build_backward(jg.build_forward(jg.mean(h * h) + jg.mean(h @ W2)))
    feeds = [rng.standard_normal((64, 128)).astype(np.float32) for _ in range(12)]
    return x, W1, W2, fwd, bwd, feeds


def test_mixed_forward_and_backward_runs_from_eight_threads_are_all_right():
    x, W1, W2, fwd, bwd, feeds = model()
    want_f = [fwd.run({x: f}) for f in feeds]
    want_b = []
    for f in feeds:
        loss = bwd.run({x: f})
        want_b.append((loss, W1.grad, W2.grad))
    wrong, errors = [], []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(500):
                k = int(rng.integers(0, len(feeds)))
                if rng.random() < 0.5:
                    if not np.array_equal(fwd.run({x: feeds[k]}), want_f[k]):
                        wrong.append(("forward", k))
                else:
                    with bwd.lock:              # run and read the gradients of this run
                        got = (bwd.run({x: feeds[k]}), W1.grad, W2.grad)
                    if not all(np.array_equal(a, b) for a, b in zip(got, want_b[k])):
                        wrong.append(("backward", k))
        except Exception as e:                  # a crash in a thread must fail the test
            errors.append(e)

    in_threads(worker, [(s,) for s in range(8)])
    assert not errors, errors
    assert not wrong, f"{len(wrong)} of 4000 results differ from the serial ones: {wrong[:5]}"


def test_optimizer_steps_and_runs_from_threads_keep_params_consistent():
    """Each thread does run + step under the program's lock: the result equals doing the
    same number of steps serially with the same (repeated) feeds."""
    x, W1, W2, fwd, bwd, feeds = model()
    start = (W1.value, W2.value)
    opt = jg.optim.SGD([W1, W2], lr=0.01)

    def train_serial(n):
        W1.value, W2.value = start
        for _ in range(n):
            bwd.run({x: feeds[0]})
            opt.step()
        return W1.value, W2.value

    want = train_serial(40)
    W1.value, W2.value = start

    def worker():
        for _ in range(10):
            with bwd.lock:
                bwd.run({x: feeds[0]})
                opt.step()

    in_threads(worker, [()] * 4)
    np.testing.assert_array_equal(W1.value, want[0])
    np.testing.assert_array_equal(W2.value, want[1])


# ---- the BLAS's thread count while programs run -----------------------------------------------------
def openblas():
    """numpy's (else scipy's) OpenBLAS, one of the libraries jitgraph may call (blas.py)."""
    lib = blas.available()[0]
    assert lib.name == "openblas", "OpenBLAS is always a candidate, first"
    return lib


def blas_threads():
    """The current thread count of that OpenBLAS."""
    return next(i["num_threads"] for i in threadpool_info() if os.path.samefile(i["filepath"], openblas().path))


def test_runs_hold_the_blas_to_one_thread_from_the_first_start_to_the_last_end():
    """OpenBLAS's openblas_set_num_threads_local sets the process-wide count: runs that each
    set and restored it raced (one restored 2 threads under another's products)."""
    setter = openblas().setter
    assert setter, "numpy's OpenBLAS (>= 0.3.27) has openblas_set_num_threads_local"
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() == 2
        hold_blas(setter)
        hold_blas(setter)
        assert blas_threads() == 1
        release_blas(setter)
        assert blas_threads() == 1, "released while a run still calls the BLAS"
        release_blas(setter)
        assert blas_threads() == 2, "the last run did not restore the count it found"


def test_products_and_attention_run_from_two_threads_at_once_give_the_serial_bits():
    """Two programs with tiled products and attention (each also split over jitgraph's own
    threads) run at once from two Python threads: every result is the serial one's, and
    numpy's BLAS keeps its thread count afterwards."""
    rng = np.random.default_rng(3)
    g = jg.Graph(np.float32)
    x = g.input((4, 128, 64), name="x")
    Wq, Wk, Wv = (g.param(rng.standard_normal((64, 64)) / 8, name=n) for n in ("Wq", "Wk", "Wv"))
    W = g.param(rng.standard_normal((64, 512)) / 8, name="W")
    out = jg.attention(x @ Wq, x @ Wk, x @ Wv) @ W
    fwd = jg.build_forward(jg.sum(out * out))
    programs = [jg.build_backward(fwd), jg.build_backward(fwd)]
    feeds = [rng.standard_normal((4, 128, 64)).astype(np.float32) for _ in range(4)]
    want = []
    for f in feeds:
        loss = programs[0].run({x: f})
        want.append([np.asarray(loss)] + [programs[0].grad(p) for p in (Wq, Wk, Wv, W)])
    before = blas_threads()
    wrong, errors = [], []

    def worker(bwd):
        try:
            for i in range(60):
                k = i % len(feeds)
                got = [np.asarray(bwd.run({x: feeds[k]}))] + [bwd.grad(p) for p in (Wq, Wk, Wv, W)]
                if not all(a.tobytes() == b.tobytes() for a, b in zip(got, want[k])):
                    wrong.append(k)
        except Exception as e:                  # a crash in a thread must fail the test
            errors.append(e)

    in_threads(worker, [(bwd,) for bwd in programs])
    assert not errors, errors
    assert not wrong, f"{len(wrong)} of 120 runs differ from the serial ones"
    assert blas_threads() == before
