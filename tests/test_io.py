"""jg.save / jg.load: lossless round trips, and clear errors for bad files."""
import json
import zipfile

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import io as jio
from jitgraph.ops.conv import PHASES, ConvIP
from jitgraph.registry import BY_NAME, NO_GRAD, OPS

from .naive import REF, build


def every_op_model(dtype=np.float64, seed=0):
    """A graph applying every op of the registry to its example from tests/naive.py
    (on params, so every gradient rule is exercised, or on consts for ops without a
    rule), plus a float input and an index input to feed; returns (graph, x, idx,
    loss, params)."""
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((2, 3, 4), name="x")
    idx = g.input((2, 3), name="idx", dtype=np.int64)
    W = g.param(rng.standard_normal((4, 4)) * 0.5, name="W")
    T = g.param(rng.standard_normal((6, 4)) * 0.5, name="T")
    loss = jg.mean(jg.tanh(x @ W) * jg.embedding(T, idx))
    params = [W, T]
    for name in sorted(REF):
        case = REF[name]
        trainable = BY_NAME[name].vjp is not NO_GRAD
        tensors = []
        for i, a in enumerate(case.args(rng)):
            if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                t = g.param(a, name=f"{name}_{i}") if trainable else g.const(a)
                params += [t] if trainable else []
                tensors.append(t)
            else:
                tensors.append(a)
        loss = loss + jg.mean(build(name, BY_NAME[name].builder, tensors, case.kw)) * 0.1
    # a convolution read by a relu alone: the fused program runs them as an epilogue
    wc = g.param(rng.standard_normal((2, 2, 3, 3)) * 0.5, name="epilogue_w")
    loss = loss + jg.mean(jg.relu(jg.conv2d(g.const(rng.standard_normal((1, 2, 5, 5))), wc, padding=1))) * 0.1
    return g, x, idx, loss.named("loss"), params + [wc]


def feeds(x, idx, seed=1):
    rng = np.random.default_rng(seed)
    return {x: rng.standard_normal((2, 3, 4)), idx: rng.integers(0, 6, (2, 3))}


def test_every_op_is_in_the_model():
    g, x, idx, loss, params = every_op_model()
    fwd = jg.build_forward(loss, fuse=True)
    bwd = jg.build_backward(fwd, fuse=True)
    in_forward = ({OPS[int(o)].name for o in g.nodes.op[fwd.order]}
                  | {OPS[int(o)].name for o in fwd.run_table.op[fwd.run_order]})     # a group is the program's
    in_backward = ({OPS[int(o)].name for o in g.nodes.op[bwd.order]}
                   | {OPS[int(o)].name for o in bwd.run_table.op[bwd.run_order]})
    every = {op.name for op in OPS.values()} - {"nop"}
    assert every - in_forward == set(), f"ops missing from the model: {every - in_forward}"
    assert len(bwd.params) == len(params) and in_backward >= in_forward


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
    assert isinstance(o, jg.optim.SGD) and o.momentum == 0.9 and [p.name for p in o.params] == [p.name for p in params]


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
    unary = max(i for i in range(n) if jg.Tensor(g, i).op == "mean")
    tamper(set_item("ir_src", (unary, 1), 0), "wrong number of sources")
    tamper(set_item("ir_shape", (3, 3), 0), "bad shape")
    tamper(set_item("ir_ndim", 3, 9), "bad shape")
    tamper(set_item("ir_op", 5, 999), "opcode out of range")
    tamper(set_item("opnames", 1, "frobnicate"), "unknown op 'frobnicate'")
    w = g.tensor("W").id
    tamper(set_item("ir_ip", (w, 0), 10 ** 9), "outside the value store")
    tamper(lambda a: a.__setitem__("obj0_order", a["obj0_order"][::-1].copy()), "before its sources")
    meta = json.loads(str(np.load(path)["meta"]))
    meta["version"] = 99
    tamper(lambda a: a.__setitem__("meta", np.array(json.dumps(meta))), "not a jitgraph file of version 1 or 2")
    meta["version"] = 2
    meta["params"]["mean"] = [["axes", "frobs"], ["scale"]]
    frobs = set_item("ir_ip", (unary, 1), 3)
    tamper(lambda a: (a.__setitem__("meta", np.array(json.dumps(meta))), frobs(a)),
           r"op 'mean': parameter 'frobs' is not one of this version's \('axes',\)")


def test_parameters_are_saved_by_name_and_read_into_this_versions_slots(tmp_path):
    """A file names each op's parameter slots (meta["params"]); loading puts every value
    where this version keeps that name -- here a file whose softmax kept its axis in a
    later slot."""
    g = jg.Graph(np.float64)
    x = g.param(np.arange(12.0).reshape(3, 4), name="x")
    y = jg.mean(jg.softmax(x, 0), axis=1)
    path = tmp_path / "m.npz"
    jg.save(path, y)
    with np.load(path) as f:
        arrays = {k: f[k].copy() for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    assert meta["params"]["softmax"] == [["axis"], []] and meta["params"]["mean"] == [["axes"], ["scale"]]
    soft, mean = jg.Tensor(g, y.sources[0].id), y
    ip = arrays["ir_ip"]
    ip[soft.id, 3], ip[soft.id, 0] = ip[soft.id, 0], 0            # the softmax axis saved in slot 3 ...
    meta["params"]["softmax"] = [["", "", "", "axis"], []]          # ... and said so
    arrays["meta"] = np.array(json.dumps(meta))
    arrays.pop("checksum")
    arrays["checksum"] = np.array(jio._checksum(arrays))
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    back = jg.load(path)
    assert int(back.graph.nodes.ip[soft.id, 0]) == int(g.nodes.ip[soft.id, 0])
    np.testing.assert_array_equal(back.graph.nodes.ip[:g.nodes.n], g.nodes.ip[:g.nodes.n])
    np.testing.assert_array_equal(jg.build_forward(back).run(), jg.build_forward(y).run())


def test_a_file_from_before_parameter_names_loads_its_strided_convolutions(tmp_path):
    """Version-1 files kept a conv2d's PHASES stride in slots 4 and 5 (DIRECT's padding);
    loading one moves it to stride_h / stride_w, so the stride-2 convolution runs the same."""
    g = jg.Graph(np.float64)
    x = g.param(np.random.default_rng(0).standard_normal((1, 2, 8, 8)), name="x")
    w = g.param(np.random.default_rng(1).standard_normal((4, 2, 3, 3)), name="w")
    y = jg.conv2d(x, w, stride=2, padding=1)
    assert y.op == "conv2d" and int(g.nodes.ip[y.id, ConvIP.source]) == PHASES
    path = tmp_path / "old.npz"
    jg.save(path, y)
    with np.load(path) as f:
        arrays = {k: f[k].copy() for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    del meta["params"]
    meta["version"] = 1
    ip = arrays["ir_ip"][:, :8].copy()                                # 8 int slots then
    ip[y.id, 4], ip[y.id, 5] = arrays["ir_ip"][y.id, ConvIP.stride_h], arrays["ir_ip"][y.id, ConvIP.stride_w]
    arrays["ir_ip"] = ip
    arrays["meta"] = np.array(json.dumps(meta))
    arrays.pop("checksum")
    arrays["checksum"] = np.array(jio._checksum(arrays))
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    back = jg.load(path)
    np.testing.assert_array_equal(back.graph.nodes.ip[:g.nodes.n], g.nodes.ip[:g.nodes.n])
    np.testing.assert_array_equal(jg.build_forward(back).run(), jg.build_forward(y).run())


def test_save_argument_errors(tmp_path):
    g1, x1, _, l1, _ = every_op_model()
    g2, x2, _, l2, _ = every_op_model()
    with pytest.raises(jg.GraphError, match="belong to different graphs"):
        jg.save(tmp_path / "a.npz", {"a": l1, "b": l2})
    with pytest.raises(jg.GraphError, match="cannot save a int"):
        jg.save(tmp_path / "a.npz", 3)
    with pytest.raises(jg.GraphError, match="nothing to save"):
        jg.save(tmp_path / "a.npz", {})
