"""jg.train's features: schedules, gradient accumulation, evaluation, callbacks, checkpoints
a run resumes from bit for bit, and data as any iterable of feed dicts."""
import math

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import nn
from jitgraph.train import batch_rows


def setup(seed=0, dtype=np.float32, batch=8, dropout=0.1):
    """An MLP classifier on fresh params (the same for the same seed), its training program,
    an evaluation program (eval mode: dropout off) computing loss and accuracy, and data."""
    nn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 3))
    g = jg.Graph(dtype)
    x, y = g.input((batch, 4), name="x"), g.input((batch,), name="y", dtype=np.int64)
    bwd = jg.build_backward(jg.build_forward(jg.cross_entropy(model(x), y)))
    model.eval()
    xe, ye = g.input((16, 4), name="xe"), g.input((16,), name="ye", dtype=np.int64)
    logits = model(xe)
    acc = jg.mean(jg.equal(jg.argmax(logits, axis=-1), ye)).named("accuracy")
    evaluator = jg.build_forward([jg.cross_entropy(logits, ye).named("loss"), acc])
    model.train()
    rng = np.random.default_rng(1)
    X = rng.standard_normal((64, 4)).astype(dtype)
    Y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0)
    return model, g, bwd, evaluator, (x, y, xe, ye), X, Y


def params_of(model):
    return [p.value for p in model.parameters()]


def test_schedules_follow_their_formulas():
    cos = jg.schedules.warmup_cosine(0.1, total_steps=12, warmup_steps=2, min_lr=0.01)
    assert [cos(0), cos(1)] == [0.05, 0.1]
    assert cos(2) == 0.1 and cos(12) == pytest.approx(0.01) and cos(50) == pytest.approx(0.01)
    assert cos(7) == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * 5 / 10)))
    lin = jg.schedules.warmup_linear(1.0, total_steps=10)
    assert lin(0) == 1.0 and lin(5) == pytest.approx(0.5) and lin(10) == 0.0
    st = jg.schedules.step_decay(1.0, step_size=3, gamma=0.5, warmup_steps=1)
    assert [st(0), st(1), st(3), st(4), st(7)] == [1.0, 1.0, 1.0, 0.5, 0.25]
    with pytest.raises(jg.GraphError, match="total_steps"):
        jg.schedules.warmup_cosine(0.1, total_steps=2, warmup_steps=2)


def test_schedule_and_accumulation_equal_the_loop_written_by_hand():
    """lr=schedule, accumulate=2: the same bits as run, run(accumulate=True), set lr,
    step(grad_scale=1/2), written out."""
    sched = jg.schedules.warmup_cosine(0.05, total_steps=8, warmup_steps=2)
    model, g, bwd, _, (x, y, _, _), X, Y = setup()
    opt = jg.optim.AdamW(model.parameters(), lr=1.0)
    hist = jg.train(bwd, opt, {x: X, y: Y}, epochs=2, lr=sched, accumulate=2, seed=3, progress=False)
    assert len(hist) == 8 and isinstance(hist, list)
    model2, g2, bwd2, _, (x2, y2, _, _), _, _ = setup()
    opt2 = jg.optim.AdamW(model2.parameters(), lr=1.0)
    losses, micro, step = [], 0, 0
    for epoch in range(2):
        feeds = list(jg.batches({x2: X, y2: Y}, 8, seed=3 + epoch))
        for k in range(0, 8, 2):
            a = float(bwd2.run(feeds[k], seed=3 + micro))
            b = float(bwd2.run(feeds[k + 1], accumulate=True, seed=3 + micro + 1))
            micro += 2
            opt2.lr = sched(step)
            opt2.step(grad_scale=0.5)
            step += 1
            losses.append(float(np.mean([a, b])))
    assert list(hist) == losses
    assert all(np.array_equal(a, b) for a, b in zip(params_of(model), params_of(model2)))


def test_accumulated_micro_batches_give_the_big_batch_gradient():
    """Float64: two micro-batches of 8 step like one batch of 16 (the loss is a mean)."""
    model, g, bwd, _, (x, y, _, _), X, Y = setup(dtype=np.float64, dropout=0.0)
    big_model, gb, big, _, (xb, yb, _, _), _, _ = setup(dtype=np.float64, dropout=0.0, batch=16)
    jg.train(bwd, jg.optim.SGD(model.parameters(), lr=0.1), {x: X[:16], y: Y[:16]}, accumulate=2, shuffle=False,
             progress=False)
    jg.train(big, jg.optim.SGD(big_model.parameters(), lr=0.1), {xb: X[:16], yb: Y[:16]}, shuffle=False,
             progress=False)
    for a, b in zip(params_of(model), params_of(big_model)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_evaluation_every_n_steps_and_callbacks_that_stop():
    model, g, bwd, evaluator, (x, y, xe, ye), X, Y = setup()
    seen = []

    def stop_at_five(info):
        seen.append((info["step"], info["evaluated"]))
        if info["evaluated"]:                            # what the loop measured is what evaluate() gives now
            assert info["eval"] == jg.evaluate(evaluator, {xe: X[:48], ye: Y[:48]})
        return info["step"] == 5

    hist = jg.train(bwd, jg.optim.AdamW(model.parameters(), lr=0.01), {x: X, y: Y}, epochs=3, progress=False,
                    eval_data={xe: X[:48], ye: Y[:48]}, eval_program=evaluator, eval_every=2,
                    callbacks=[stop_at_five])
    assert hist.stopped and len(hist) == 5
    assert [s for s, _ in hist.evals] == [2, 4]
    assert seen == [(1, False), (2, True), (3, False), (4, True), (5, False)]
    assert set(hist.evals[-1][1]) == {"loss", "accuracy"}
    assert 0.0 <= hist.evals[-1][1]["accuracy"] <= 1.0
    # early stopping on an evaluation metric that stops improving
    early = jg.EarlyStopping("loss", patience=2)
    hist2 = jg.train(bwd, jg.optim.SGD(model.parameters(), lr=0.0), {x: X, y: Y}, epochs=5, progress=False,
                     eval_data={xe: X[:16], ye: Y[:16]}, eval_program=evaluator, eval_every=1, callbacks=[early])
    assert hist2.stopped and len(hist2) == 3                 # lr 0: the loss never improves after the first
    # without an eval program, a loss with dropout must not be evaluated as it is
    with pytest.raises(jg.GraphError, match="eval_program"):
        jg.train(bwd, jg.optim.SGD(model.parameters()), {x: X, y: Y}, eval_data={x: X, y: Y}, progress=False)


def test_a_resumed_run_continues_bit_for_bit(tmp_path):
    path = tmp_path / "ckpt.npz"
    kw = dict(epochs=3, lr=jg.schedules.warmup_cosine(0.02, 12, 2), accumulate=2, seed=5, progress=False)
    model, g, bwd, evaluator, (x, y, xe, ye), X, Y = setup()
    whole = jg.train(bwd, jg.optim.AdamW(model.parameters(), lr=1.0), {x: X, y: Y}, **kw,
                     eval_data={xe: X[:16], ye: Y[:16]}, eval_program=evaluator)
    # the same run, stopped at step 8 (after the checkpoint of step 6), then resumed in a new setup
    model2, g2, bwd2, ev2, (x2, y2, xe2, ye2), _, _ = setup()
    cut = jg.train(bwd2, jg.optim.AdamW(model2.parameters(), lr=1.0), {x2: X, y2: Y}, **kw,
                   eval_data={xe2: X[:16], ye2: Y[:16]}, eval_program=ev2, checkpoint_every=3, checkpoint=path,
                   callbacks=[lambda info: info["step"] == 8])
    assert cut.stopped and len(cut) == 8 and path.exists()
    model3, g3, bwd3, ev3, (x3, y3, xe3, ye3), _, _ = setup(seed=9)            # other initial params
    resumed = jg.train(bwd3, jg.optim.AdamW(model3.parameters(), lr=1.0), {x3: X, y3: Y}, **kw,
                       eval_data={xe3: X[:16], ye3: Y[:16]}, eval_program=ev3, resume=path)
    assert list(resumed) == list(whole) and resumed.evals == whole.evals
    assert all(np.array_equal(a, b) for a, b in zip(params_of(model3), params_of(model)))
    with pytest.raises(jg.GraphError, match="seed"):
        jg.train(bwd3, jg.optim.AdamW(model3.parameters()), {x3: X, y3: Y}, **{**kw, "seed": 6}, resume=path)
    with pytest.raises(jg.GraphError, match="no checkpoint"):
        jg.train(bwd3, jg.optim.AdamW(model3.parameters()), {x3: X, y3: Y}, resume=tmp_path / "none.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a checkpoint")
    with pytest.raises(jg.GraphError, match="not a jitgraph training checkpoint"):
        jg.train(bwd3, jg.optim.AdamW(model3.parameters()), {x3: X, y3: Y}, resume=tmp_path / "junk.npz")
    with pytest.raises(jg.GraphError, match="checkpoint=path"):
        jg.train(bwd3, jg.optim.AdamW(model3.parameters()), {x3: X, y3: Y}, checkpoint_every=2)


def test_any_iterable_of_feed_dicts_is_data():
    model, g, bwd, _, (x, y, _, _), X, Y = setup(dropout=0.0)
    by_arrays = jg.train(bwd, jg.optim.SGD(model.parameters(), lr=0.1), {x: X, y: Y}, epochs=2, shuffle=False,
                         progress=False)
    batches = [(X[i:i + 8], Y[i:i + 8]) for i in range(0, 64, 8)]

    class Loader:                        # what a torch DataLoader looks like from here: tuples, iterable again
        def __iter__(self):
            return iter(batches)

    for data, extra in ((Loader(), {"inputs": [None, None]}), ([{"x": a, "y": b} for a, b in batches], {})):
        m2, g2, b2, _, (x2, y2, _, _), _, _ = setup(dropout=0.0)
        if "inputs" in extra:
            extra = {"inputs": [x2, y2]}
        got = jg.train(b2, jg.optim.SGD(m2.parameters(), lr=0.1), data, epochs=2, progress=False, **extra)
        assert list(got) == list(by_arrays)
    with pytest.raises(jg.GraphError, match="read once"):
        jg.train(bwd, jg.optim.SGD(model.parameters()), (f for f in [{"x": X[:8], "y": Y[:8]}]), epochs=2)
    with pytest.raises(jg.GraphError, match="inputs="):
        jg.train(bwd, jg.optim.SGD(model.parameters()), Loader(), progress=False)
    with pytest.raises(jg.GraphError, match="accumulate"):
        jg.train(bwd, jg.optim.SGD(model.parameters()), {x: X, y: Y}, accumulate=0)


def tail_of(model, g, rows):
    """The same model's training program at ``rows`` rows: its inputs made in the same order."""
    xt, yt = g.input((rows, 4), name=f"x{rows}"), g.input((rows,), name=f"y{rows}", dtype=np.int64)
    return jg.build_backward(jg.build_forward(jg.cross_entropy(model(xt), yt))), (xt, yt)


def test_the_last_partial_batch_trains_through_a_tail():
    """[6/6] another batch size from the same model: 61 rows in batches of 8 give 7 steps of 8
    rows and one of 5 per epoch, the 5 through the tail program on the same params -- the
    same losses and params, bit for bit, as the loop written by hand."""
    model, g, bwd, _, (x, y, _, _), X, Y = setup(dropout=0.0)
    tail, _ = tail_of(model, g, 5)
    hist = jg.train(bwd, jg.optim.AdamW(model.parameters(), lr=0.01), {x: X[:61], y: Y[:61]}, epochs=2,
                    batch_size=8, seed=3, progress=False, tail=tail)
    assert len(hist) == 16
    m2, g2, b2, _, (x2, y2, _, _), _, _ = setup(dropout=0.0)
    t2, (xt, yt) = tail_of(m2, g2, 5)
    opt, want = jg.optim.AdamW(m2.parameters(), lr=0.01), []
    for epoch in range(2):
        for rows in batch_rows(61, 8, True, 3 + epoch, keep_last=True):
            prog, feeds = (b2, {x2: X[rows], y2: Y[rows]}) if len(rows) == 8 else (t2, {xt: X[rows], yt: Y[rows]})
            want.append(float(prog.run(feeds)))
            opt.step()
    assert list(hist) == want
    assert all(np.array_equal(a, b) for a, b in zip(params_of(model), params_of(m2)))
    # an iterable whose last batch is short (a DataLoader with drop_last=False) goes the same way
    m3, g3, b3, _, (x3, y3, _, _), _, _ = setup(dropout=0.0)
    t3, _ = tail_of(m3, g3, 5)
    loader = [{"x": X[:61][i:i + 8], "y": Y[:61][i:i + 8]} for i in range(0, 61, 8)]
    assert len(loader[-1]["x"]) == 5
    got = jg.train(b3, jg.optim.SGD(m3.parameters(), lr=0.1), loader, progress=False, tail=t3)
    assert len(got) == 8 and all(np.isfinite(got))
    with pytest.raises(jg.GraphError, match="shape"):        # without the tail the short batch does not fit
        jg.train(b3, jg.optim.SGD(m3.parameters(), lr=0.1), loader, progress=False)
    stray = loader[:-1] + [dict(loader[-1], xe=X[:5])]     # the short batch feeds an input neither program reads
    with pytest.raises(jg.GraphError, match="tail feeds 'xe'"):
        jg.train(b3, jg.optim.SGD(m3.parameters(), lr=0.1), stray, progress=False, tail=t3)


def test_a_tail_that_does_not_fit_is_refused_by_name():
    model, g, bwd, evaluator, (x, y, _, _), X, Y = setup(dropout=0.0)
    tail, _ = tail_of(model, g, 5)
    opt = jg.optim.SGD(model.parameters())
    with pytest.raises(jg.GraphError, match="tail takes 5 rows; the last partial batch has 4"):
        jg.train(bwd, opt, {x: X[:60], y: Y[:60]}, batch_size=8, tail=tail)
    with pytest.raises(jg.GraphError, match="accumulate > 1"):
        jg.train(bwd, opt, {x: X[:61], y: Y[:61]}, batch_size=8, tail=tail, accumulate=2)
    with pytest.raises(jg.GraphError, match="tail must be a BackwardGraph"):
        jg.train(bwd, opt, {x: X[:61], y: Y[:61]}, batch_size=8, tail=evaluator)
    odd = g.input((5, 3), name="odd")                   # pairs with x, but 3 features against 4
    w = g.param(np.ones((3, 3), np.float32))
    bad = jg.build_backward(jg.build_forward(jg.cross_entropy(odd @ w, g.input((5,), name="yodd", dtype=np.int64))))
    with pytest.raises(jg.GraphError, match="does not pair"):
        jg.train(bwd, opt, {x: X[:61], y: Y[:61]}, batch_size=8, tail=bad)


def test_evaluation_at_any_size_with_a_tail():
    """37 held-out rows in batches of 16: two batches and a tail of 5, averaged by rows --
    the metrics of one program over all 37 rows."""
    model, g, _, evaluator, (_, _, xe, ye), X, Y = setup(dropout=0.0)
    model.eval()
    programs = {}
    for rows in (5, 37):
        xr, yr = g.input((rows, 4), name=f"xe{rows}"), g.input((rows,), name=f"ye{rows}", dtype=np.int64)
        logits = model(xr)
        programs[rows] = jg.build_forward([jg.cross_entropy(logits, yr).named(f"loss{rows}"),
                                           jg.mean(jg.equal(jg.argmax(logits, axis=-1), yr)).named(f"acc{rows}")])
    got = jg.evaluate(evaluator, {xe: X[:37], ye: Y[:37]}, tail=programs[5])
    whole = [float(v) for v in programs[37].run({"xe37": X[:37], "ye37": Y[:37]})]
    assert got["loss"] == pytest.approx(whole[0], rel=1e-5) and got["accuracy"] == pytest.approx(whole[1], rel=1e-6)
    without = jg.evaluate(evaluator, {xe: X[:37], ye: Y[:37]})           # the 5 left out, as before
    assert without["loss"] != pytest.approx(whole[0], rel=1e-7)
