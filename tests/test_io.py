"""jg.save / jg.load: lossless round trips, and clear errors for bad files."""
import json
import zipfile

import numpy as np
import pytest

import jitgraph as jg
from jitgraph.registry import OPS


def every_op_model(dtype=np.float64, seed=0):
    """A graph that uses every public op; returns (graph, x, idx, loss, params)."""
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((2, 3, 4), name="x")
    idx = g.input((2, 3), name="idx", dtype=np.int64)
    W = g.param(rng.standard_normal((4, 4)) * 0.5, name="W")
    T = g.param(rng.standard_normal((6, 4)) * 0.5, name="T")
    b = g.param(rng.standard_normal(4) * 0.1, name="b")
    c = g.const(np.linspace(0.5, 1.5, 4), name="c")
    e = jg.embedding(T, idx)                                   # (2, 3, 4)
    h = jg.layer_norm(x @ W + b, 1e-5) + e                     # matmul (batched), add
    h = jg.concat([jg.gelu(h), jg.silu(h) - jg.tanh(h)], axis=2)          # (2, 3, 8)
    h = jg.slice_axis(jg.pad_axis(h, 1, 1, 0), 1, 0, 3)                   # pad, slice
    h = jg.reshape(jg.transpose(h, (0, 2, 1)), (2, 8, 3))
    s = jg.softmax(h, axis=1) * jg.sigmoid(h) / (jg.sqr(h) + 1.0)
    r = jg.rms_norm(jg.relu(-s) + jg.abs(s), 1e-6)
    q = jg.sqrt(jg.exp(jg.scale(r, 0.1)) + jg.log(jg.sqr(r) + 2.0))
    m = jg.max(q, axis=2, keepdims=True) + jg.mean(q, axis=(0, 1)) - jg.sum(jg.copy(q)) / 100.0
    d = jg.dropout(m, 0.25, seed=3)
    logits = jg.reshape(jg.broadcast_to(d, (2, 8, 3)), (16, 3))
    target = g.const(np.eye(3)[rng.integers(0, 3, 16)], name="target")
    loss = jg.cross_entropy(logits, target) + jg.mean(jg.log_softmax(logits, axis=0)) * 0.01
    loss = jg.mean(loss * jg.sum(c) / 4.0).named("loss")
    return g, x, idx, loss, [W, T, b]


def feeds(x, idx, seed=1):
    rng = np.random.default_rng(seed)
    return {x: rng.standard_normal((2, 3, 4)), idx: rng.integers(0, 6, (2, 3))}


def test_every_op_is_in_the_model():
    g, x, idx, loss, params = every_op_model()
    bwd = jg.build_backward(jg.build_forward(loss))
    used = {OPS[int(o)].name for o in g.nodes.op[: len(g)]}
    public = {"add", "sub", "mul", "div", "neg", "matmul", "sqr", "sqrt", "exp", "log", "abs", "relu", "gelu",
              "silu", "tanh", "sigmoid", "sum", "mean", "max", "reshape", "transpose", "softmax", "log_softmax",
              "cross_entropy", "layer_norm", "rms_norm", "dropout", "embedding", "concat", "affine",
              "broadcast", "slice", "pad", "copy", "input", "param", "const"}
    assert public <= used
    assert {"step", "sign", "gelu_d", "silu_d", "max_mask", "norm_rstd", "scatter_add"} <= used
    assert bwd is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_is_lossless(tmp_path, dtype):
    g, x, idx, loss, params = every_op_model(dtype)
    fwd = jg.build_forward(loss)
    bwd = jg.build_backward(fwd, checkpoints="sqrt")
    opt = jg.optim.AdamW(params, lr=1e-2)
    f = feeds(x, idx)
    for step in range(3):
        bwd.run(f, seed=step)
        opt.step()
    path = tmp_path / "model.npz"
    jg.save(path, {"bwd": bwd, "fwd": fwd, "opt": opt, "x": x, "idx": idx, "loss": loss, "graph": g})
    d = jg.load(path)
    g2 = d["graph"]
    assert d["bwd"].graph is g2 and d["x"].graph is g2
    for field in ("op", "src", "ndim", "shape", "ip", "fp", "flags", "origin", "rule"):
        assert np.array_equal(getattr(g2.nodes, field)[: len(g)], getattr(g.nodes, field)[: len(g)]), field
    assert g2.names == g.names and g2.params == g.params
    assert np.array_equal(g2.store[: g.store_used], g.store[: g.store_used]) and g2.dtype == g.dtype
    assert np.array_equal(d["bwd"].order, bwd.order) and d["bwd"].peak_bytes == bwd.peak_bytes
    assert np.array_equal(d["fwd"].order, fwd.order)
    # the loaded model continues exactly where the saved one stopped
    f2 = {d["x"]: f[x], d["idx"]: f[idx]}
    p2 = [g2.tensor(p.name) for p in params]
    for step in range(3, 6):
        l1 = bwd.run(f, seed=step)
        opt.step()
        l2 = d["bwd"].run(f2, seed=step)
        d["opt"].step()
        assert np.array_equal(l1, l2)
        for a, b in zip(params, p2):
            assert np.array_equal(a.value, b.value) and np.array_equal(a.grad, b.grad)
    assert np.array_equal(d["fwd"].run(f2), fwd.run(f))
    assert d["opt"].step_count == opt.step_count and d["opt"].lr == 1e-2


def test_single_objects_round_trip(tmp_path):
    g, x, idx, loss, params = every_op_model()
    jg.save(tmp_path / "g.npz", g)
    assert isinstance(jg.load(tmp_path / "g.npz"), jg.Graph)
    jg.save(tmp_path / "t.npz", loss)
    t = jg.load(tmp_path / "t.npz")
    assert isinstance(t, jg.Tensor) and t.name == "loss" and t.shape == ()
    opt = jg.optim.SGD(params, lr=0.1, momentum=0.9)
    jg.save(tmp_path / "o.npz", opt)
    o = jg.load(tmp_path / "o.npz")
    assert isinstance(o, jg.optim.SGD) and o.momentum == 0.9 and [p.name for p in o.params] == ["W", "T", "b"]


def test_truncated_and_corrupted_files_raise_clear_errors(tmp_path):
    g, x, idx, loss, params = every_op_model()
    path = tmp_path / "m.npz"
    jg.save(path, {"bwd": jg.build_backward(jg.build_forward(loss))})
    raw = path.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(jg.GraphError, match="truncated or corrupted"):
        jg.load(truncated)
    # flip bytes inside one stored array (an uncompressed zip member): the checksum catches it
    corrupted = tmp_path / "corrupted.npz"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(corrupted, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "ir_shape.npy":
                data = data[:-8] + bytes(b ^ 0xFF for b in data[-8:])
            zout.writestr(item, data)
    with pytest.raises(jg.GraphError, match="corrupted \\(checksum mismatch\\)"):
        jg.load(corrupted)
    not_ours = tmp_path / "plain.npz"
    np.savez(not_ours, a=np.zeros(3))
    with pytest.raises(jg.GraphError, match="not a jitgraph file"):
        jg.load(not_ours)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"definitely not a zip file")
    with pytest.raises(jg.GraphError, match="not a jitgraph file"):
        jg.load(garbage)
    with pytest.raises(jg.GraphError, match="no file"):
        jg.load(tmp_path / "missing.npz")


def test_structurally_invalid_graphs_are_refused_before_running(tmp_path):
    """A file with a valid checksum but impossible contents (a hand-made or buggy
    writer) is checked before any array reaches compiled code."""
    from jitgraph import io as jio
    g, x, idx, loss, params = every_op_model()
    path = tmp_path / "m.npz"
    jg.save(path, {"fwd": jg.build_forward(loss)})

    def tamper(edit, match):
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays.pop("checksum")
        edit(arrays)
        arrays["checksum"] = np.array(jio._checksum(arrays))
        bad = tmp_path / "bad.npz"
        with open(bad, "wb") as f:
            np.savez(f, **arrays)
        with pytest.raises(jg.GraphError, match=match):
            jg.load(bad)

    def set_item(key, index, value):
        def edit(arrays):
            a = arrays[key].copy()
            a[index] = value
            arrays[key] = a
        return edit

    n = len(g)
    tamper(set_item("ir_src", (n - 1, 0), n + 5), "source id outside the graph")
    tamper(set_item("ir_src", (n - 1, 1), 0), "wrong number of sources")
    tamper(set_item("ir_shape", (3, 3), 0), "bad shape")
    tamper(set_item("ir_ndim", 3, 9), "bad shape")
    tamper(set_item("ir_op", 5, 999), "opcode out of range")
    tamper(set_item("opnames", 1, "frobnicate"), "unknown op 'frobnicate'")
    w = g.tensor("W").id
    tamper(set_item("ir_ip", (w, 0), 10 ** 9), "outside the value store")
    tamper(lambda a: a.__setitem__("obj0_order", a["obj0_order"][::-1].copy()), "before its sources")
    meta = json.loads(str(np.load(path)["meta"]))
    meta["version"] = 99
    tamper(lambda a: a.__setitem__("meta", np.array(json.dumps(meta))), "not a jitgraph version-1 file")


def test_save_argument_errors(tmp_path):
    g1, x1, _, l1, _ = every_op_model()
    g2, x2, _, l2, _ = every_op_model()
    with pytest.raises(jg.GraphError, match="belong to different graphs"):
        jg.save(tmp_path / "a.npz", {"a": l1, "b": l2})
    with pytest.raises(jg.GraphError, match="cannot save a int"):
        jg.save(tmp_path / "a.npz", 3)
    with pytest.raises(jg.GraphError, match="nothing to save"):
        jg.save(tmp_path / "a.npz", {})
