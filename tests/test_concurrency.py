"""Programs shared between Python threads: forward runs each get a run buffer of their
own, backward runs (whose gradients are program state) are serialized by the program's
lock -- every result equals the serial one."""
import threading

import numpy as np

import jitgraph as jg


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

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(W1.value, want[0])
    np.testing.assert_array_equal(W2.value, want[1])
