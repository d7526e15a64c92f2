"""jitgraph.distributed.DataParallel on one local Ray instance (2 CPUs) for the whole
module, shut down at the end with no Ray process left behind.

A small float64 classifier, 2 workers, a global batch of 16 (8 rows a shard), 2 epochs
of 10 steps.  Checked: the params equal one process's on the global batch (SGD and
AdamW, 1e-9 relative); a repeat and runs with killed workers or a driver restart in the
middle are bit-identical to an uninterrupted run; dropout with checkpointing is
bit-identical to the same steps taken by hand in this process; a worker's GraphError
reaches the driver with its message; bad batch sizes and checkpoints are refused; a
lone worker trains jg.train's bits.
"""
import inspect
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import ray

import jitgraph as jg
import jitgraph.distributed
import jitgraph.replica
from jitgraph.distributed import DataParallel

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, SHARD, EPOCHS, SEED = 2, 8, 2, 3
BATCH = N * SHARD
rng = np.random.default_rng(1)
X = rng.standard_normal((10 * BATCH, 6))
Y = rng.integers(0, 4, 10 * BATCH)


def model(batch, opt="sgd", lr=0.1, dropout=0.0, checkpoints=None):
    """x (batch, 6) -> 3 tanh layers of 8 -> 4 classes, cross entropy on integer labels;
    the same initial weights every call.  Returns (bwd, opt, x, y)."""
    r = np.random.default_rng(0)
    g = jg.Graph(np.float64)
    x = g.input((batch, 6), name="x")
    y = g.input((batch,), name="y", dtype=np.int64)
    params, h, width = [], x, 6
    for i in range(3):
        W = g.param(r.standard_normal((width, 8)) * 0.6, name=f"W{i}")
        b = g.param(np.zeros(8), name=f"b{i}")
        h = jg.tanh(h @ W + b)
        if dropout:
            h = jg.dropout(h, dropout)
        params += [W, b]
        width = 8
    V = g.param(r.standard_normal((8, 4)) * 0.6, name="V")
    params.append(V)
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(h @ V, y)), checkpoints=checkpoints)
    if opt == "sgd":
        o = jg.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-3)
    elif opt == "adamw":
        o = jg.optim.AdamW(params, lr=0.02, weight_decay=0.01)
    else:
        o = jg.optim.SGD(params, lr=lr)
    return bwd, o, x, y


def fit(dp, x, y, **kwargs):
    return dp.fit({x: X, y: Y}, epochs=EPOCHS, batch_size=BATCH, seed=SEED, progress=False, **kwargs)


def ray_pids():
    """Processes of Ray on this machine: its servers and agents, and workers ("ray::...")."""
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("ray::") or f"{os.sep}ray{os.sep}" in cmd:
            found.add(int(pid))
    return found


@pytest.fixture(scope="module")
def cluster():
    before = ray_pids()
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=128 << 20)
    try:
        yield
    finally:
        ray.shutdown()
        deadline = time.monotonic() + 30
        while ray_pids() - before and time.monotonic() < deadline:
            time.sleep(0.2)
        left = ray_pids() - before
        assert not left, f"Ray processes left after ray.shutdown(): {sorted(left)}"


@pytest.fixture(scope="module")
def reference(cluster):
    """An uninterrupted 2-worker SGD run: (losses, params, the replicas' params)."""
    bwd, opt, x, y = model(SHARD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dp = DataParallel(bwd, opt, num_workers=N)
    with dp:
        # the workers imported this jitgraph (so they share its compile cache)
        assert not [w for w in caught if "another jitgraph" in str(w.message)]
        losses = fit(dp, x, y)
        assert dp.position is None
        return losses, dp.params(), dp.worker_params()


def same_bits(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_import_jitgraph_does_not_import_ray():
    code = ("import sys, jitgraph\n"
            "assert 'ray' not in sys.modules, 'import jitgraph imported ray'\n"
            "import jitgraph.distributed\n"
            "assert 'ray' in sys.modules\n")
    env = dict(os.environ, PYTHONPATH=ROOT, JITGRAPH_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_same_params_as_one_process_on_the_global_batch(cluster, reference, kind):
    bwd, opt, x, y = model(BATCH, kind)
    one = jg.train(bwd, opt, {x: X, y: Y}, epochs=EPOCHS, batch_size=BATCH, seed=SEED, progress=False)
    expect = {p.label: p.value for p in opt.params}
    if kind == "sgd":
        losses, got, replicas = reference
    else:
        bwd, opt, x, y = model(SHARD, kind)
        with DataParallel(bwd, opt, num_workers=N) as dp:
            losses = fit(dp, x, y)
            got, replicas = dp.params(), dp.worker_params()
    assert len(losses) == len(one) == EPOCHS * 10
    np.testing.assert_allclose(losses, one, rtol=1e-9, atol=0)
    assert not np.allclose(expect["W0"], model(SHARD)[1].params[0].value, rtol=1e-3)   # it trained
    for name, want in expect.items():
        assert np.abs(got[name] - want).max() <= 1e-9 * np.abs(want).max(), name
    for held in replicas:           # every worker holds the driver's params, bit for bit
        assert same_bits(held, {k: got[k] for k in held})


def test_a_lone_worker_trains_the_bits_of_jg_train(cluster):
    """One worker keeps its gradients where bwd.run left them (nothing goes through the
    object store): its steps are jg.train's, bit for bit, dropout included."""
    bwd, opt, x, y = model(BATCH, dropout=0.2)
    one = jg.train(bwd, opt, {x: X, y: Y}, epochs=EPOCHS, batch_size=BATCH, seed=SEED, progress=False)
    expect = {p.label: p.value for p in opt.params}
    bwd, opt, x, y = model(BATCH, dropout=0.2)
    with DataParallel(bwd, opt, num_workers=1) as dp:
        losses = fit(dp, x, y)
        assert losses == one
        assert same_bits(dp.params(), expect)
        assert dp.timing()["mean"] < 1e-4                 # no gradients to average


def test_repeat_run_is_bit_identical(cluster, reference):
    bwd, opt, x, y = model(SHARD)
    with DataParallel(bwd, opt, num_workers=N) as dp:
        losses = fit(dp, x, y)
        assert losses == reference[0]
        assert same_bits(dp.params(), reference[1])
        t = dp.timing()
        assert t["step"] > 0 and 0 < t["all_reduce_share"] < 1
        assert 0 < t["mean"] < t["all_reduce"] and 0 < t["optimizer"] < t["step"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_worker_gradient_mean_is_numpys_add_then_divide_bit_for_bit(dtype):
    r = np.random.default_rng(5)
    for n in (1, 2, 3, 4):
        parts = [r.standard_normal(1001).astype(dtype) for _ in range(n)]
        for p in parts:
            p.flags.writeable = False          # as Ray hands them out of the object store
        want = parts[0].copy()
        for p in parts[1:]:
            want = want + p
        if n > 1:
            want = want / n
        got = np.full(1001, np.nan, dtype)
        jitgraph.replica._mean_into(got, parts)
        assert got.dtype == dtype and np.array_equal(got, want), n


def test_dropout_and_checkpointing_match_the_steps_taken_by_hand(cluster):
    """Each shard's dropout seed is (seed + step) * N + shard: the same steps taken in
    this process -- shard by shard, gradients accumulated, SGD at lr / N -- give the
    same bits, and a checkpointed program changes nothing."""
    bwd, opt, x, y = model(SHARD, "plain", lr=0.2, dropout=0.3, checkpoints="sqrt")
    assert bwd.stats()["n_recomputed"] > 0
    with DataParallel(bwd, opt, num_workers=N) as dp:
        def schedule(step, loss):              # a schedule set between steps reaches every replica
            if step == 7:
                dp.opt.lr = 0.05
        losses = fit(dp, x, y, callback=schedule)
        got = dp.params()
        for held in dp.worker_params():
            assert same_bits(held, got)
    hbwd, hopt, hx, hy = model(SHARD, "plain", lr=0.2 / N, dropout=0.3)
    by_hand, k = [], 0
    for epoch in range(EPOCHS):
        for feeds in jg.batches({hx: X, hy: Y}, BATCH, seed=SEED + epoch):
            loss = 0.0
            for i in range(N):
                shard = {t: a[i * SHARD:(i + 1) * SHARD] for t, a in feeds.items()}
                loss += float(hbwd.run(shard, accumulate=i > 0, seed=(SEED + k) * N + i))
            if k == 7:
                hopt.lr = 0.05 / N
            hopt.step()
            by_hand.append(loss / N)
            k += 1
    assert losses == by_hand
    assert same_bits(got, {p.label: p.value for p in hopt.params})


class _DiesWhenAsked:
    """Stands in for a worker's ``state`` method: kills the worker, then asks it (the call
    fails as a kill that lands late makes it fail)."""
    def __init__(self, worker):
        self.worker, self.method = worker, worker.state

    def remote(self):
        ray.kill(self.worker)
        return self.method.remote()


def test_a_replica_that_dies_while_it_is_copied_is_not_copied(cluster, reference):
    """Worker 1 dies; worker 0, the survivor the new worker 1 is to copy, dies as its state
    is read (ray.kill is asynchronous: a worker can answer, then die).  The copy is not
    made from a lost state: every replica restarts from the driver's, the same bits."""
    bwd, opt, x, y = model(SHARD)
    with DataParallel(bwd, opt, num_workers=N) as dp:
        def kill(step, loss):
            if step == 4:
                survivor = dp.workers[0]
                survivor.state = _DiesWhenAsked(survivor)
                ray.kill(dp.workers[1])
        losses = fit(dp, x, y, callback=kill)
        assert dp.restarts >= 2
        assert losses == reference[0]
        assert same_bits(dp.params(), reference[1])
        for held in dp.worker_params():
            assert same_bits(held, reference[2][0])


def test_killed_workers_are_replaced_and_the_run_is_unchanged(cluster, reference):
    bwd, opt, x, y = model(SHARD)
    with DataParallel(bwd, opt, num_workers=N) as dp:
        def kill(step, loss):
            if step == 4:                      # mid-epoch 1: worker 1
                ray.kill(dp.workers[1])
            if step == 13:                     # mid-epoch 2: both at once
                for w in dp.workers:
                    ray.kill(w)
        losses = fit(dp, x, y, callback=kill)
        assert dp.restarts == 3
        assert losses == reference[0]
        assert same_bits(dp.params(), reference[1])
        for held in dp.worker_params():
            assert same_bits(held, reference[2][0])


class DyingWorker(jitgraph.distributed.Worker):
    """A worker that exits inside ``apply`` of step 4 -- worker 1 before averaging,
    worker 0 after stepping -- once per run (a marker file in ``folder``, which travels
    with the class: it is pickled by value)."""
    folder = ""

    def grads(self, rows, salt):
        self.index = salt % N
        return super().grads(rows, salt)

    def apply(self, hyper, *grads):
        marker = os.path.join(self.folder, f"died{self.index}")
        if self.steps == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            if self.index == 1:
                os._exit(1)
            out = super().apply(hyper, *grads)
            os._exit(1)
        return super().apply(hyper, *grads)


@pytest.mark.parametrize("who", [0, 1])
def test_a_worker_that_dies_inside_a_step_is_replaced_from_a_survivor(cluster, reference, tmp_path, monkeypatch,
                                                                      who):
    """Worker 1 dies before it steps (worker 0 has stepped), or worker 0 dies after it
    stepped: the survivor took the step, its replica is copied to the new worker and the
    step is not redone -- the run's bits do not change."""
    (tmp_path / f"died{1 - who}").touch()     # only ``who`` dies
    monkeypatch.setattr(DyingWorker, "folder", str(tmp_path))
    monkeypatch.setattr(jitgraph.distributed, "Worker", DyingWorker)
    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)     # the workers cannot import this test file
    try:
        bwd, opt, x, y = model(SHARD)
        with DataParallel(bwd, opt, num_workers=N) as dp:
            losses = fit(dp, x, y)
            assert dp.restarts == 1 and (tmp_path / f"died{who}").exists()
            assert losses == reference[0]
            assert same_bits(dp.params(), reference[1])
            for held in dp.worker_params():
                assert same_bits(held, reference[2][0])
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)


def test_worker_graph_error_reaches_the_driver(cluster):
    bwd, opt, x, y = model(SHARD)
    with DataParallel(bwd, opt, num_workers=N) as dp:
        for bad in (12, 8, BATCH + 1):
            with pytest.raises(jg.GraphError, match=rf"batch_size {bad} is not num_workers \(2\) x the program's "
                                                    r"batch \(8\) = 16"):
                dp.fit({x: X, y: Y}, batch_size=bad, progress=False)
        labels = Y.copy()
        labels[12] = 7                         # row 12 of the first batch: worker 1's shard; 4 classes
        with pytest.raises(jg.GraphError, match=r"worker 1 failed in step 1: cross_entropy.*index 7 at position 4 "
                                                r"of 'y' is not an integer in \[0, 4\)") as raised:
            dp.fit({x: X, y: labels}, shuffle=False, progress=False)
        assert raised.value.worker == 1
        assert dp.position is None             # no step completed
        before = dp.params()
        assert len(dp.fit({x: X[:BATCH], y: Y[:BATCH]}, progress=False)) == 1    # still works
        assert not same_bits(before, dp.params())
    with pytest.raises(jg.GraphError, match="need 3 CPUs; the Ray cluster has 2"):
        DataParallel(*model(SHARD)[:2], num_workers=3)


class DriverGone(Exception):
    pass


def test_save_load_resumes_in_a_new_driver(cluster, reference, tmp_path):
    """A driver saves every 7 steps and dies after step 9; another driver process loads
    the checkpoint, redoes steps 8 and 9 and finishes: the params of an uninterrupted run."""
    path = str(tmp_path / "run.npz")
    bwd, opt, x, y = model(SHARD)

    def crash(step, loss):
        if step == 9:
            raise DriverGone
    with DataParallel(bwd, opt, num_workers=N) as dp:
        with pytest.raises(DriverGone):
            fit(dp, x, y, checkpoint=path, checkpoint_every=7, callback=crash)
        assert dp.position["step"] == 9
    np.savez(tmp_path / "data.npz", X=X, Y=Y)
    code = f"""
import json, sys
import numpy as np
import jitgraph as jg
import jitgraph.distributed
from jitgraph.distributed import DataParallel
d = np.load({str(tmp_path / "data.npz")!r})
dp = DataParallel.load({path!r}, address={ray.get_runtime_context().gcs_address!r})
assert dp.position["step"] == 7 and dp.num_workers == {N}
try:
    dp.fit({{"x": d["X"], "y": d["Y"]}}, epochs={EPOCHS}, batch_size={BATCH}, seed={SEED + 1}, progress=False)
    raise SystemExit("a resume with another seed was accepted")
except jg.GraphError as e:
    assert "unfinished fit" in str(e), e
losses = dp.fit({{"x": d["X"], "y": d["Y"]}}, epochs={EPOCHS}, batch_size={BATCH}, seed={SEED}, progress=False)
np.savez({str(tmp_path / "out.npz")!r}, losses=np.array(losses), **dp.params())
dp.shutdown()
"""
    env = dict(os.environ, PYTHONPATH=ROOT, JITGRAPH_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with np.load(tmp_path / "out.npz") as out:
        assert out["losses"].tolist() == reference[0][7:]
        assert same_bits({k: out[k] for k in reference[1]}, reference[1])


def test_load_refuses_what_is_not_a_checkpoint(cluster, tmp_path):
    bwd, opt, x, y = model(SHARD)
    jg.save(str(tmp_path / "model.npz"), {"bwd": bwd, "opt": opt})
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for name in ("model.npz", "junk.npz", "missing.npz"):
        with pytest.raises(jg.GraphError, match="not a .*DataParallel checkpoint"):
            DataParallel.load(str(tmp_path / name))


def test_public_api_is_annotated_and_documented():
    assert DataParallel.__doc__
    for attr, member in vars(DataParallel).items():
        fn = member.__func__ if isinstance(member, classmethod) else member
        if inspect.isfunction(fn) and (not attr.startswith("_") or attr == "__init__"):
            sig = inspect.signature(fn)
            assert sig.return_annotation is not inspect.Signature.empty, attr
            assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()
                       if p.name not in ("self", "cls")), attr
            assert fn.__doc__ or attr == "__init__", attr
