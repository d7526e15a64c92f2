"""jitgraph.nn: layers against numpy references (float64), their gradients against finite
differences, PyTorch's names and initializations, train/eval programs sharing params, and
weights by name -- state dicts and safetensors files, good and hostile."""
import json
import struct

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import nn

from .naive import attention_ref, batch_norm_ref, conv2d_ref


def graph64():
    return jg.Graph(np.float64)


def forward(out, feeds):
    return jg.build_forward(out).run(feeds)


# ---- layers against numpy -----------------------------------------------------------------------
def test_linear_conv_and_norms_compute_what_pytorch_documents():
    nn.manual_seed(1)
    rng = np.random.default_rng(0)
    g = graph64()
    lin, conv, conv1 = nn.Linear(6, 5), nn.Conv2d(3, 4, 3, stride=1, padding=1), nn.Conv1d(3, 2, 3, padding=1)
    ln, rms, emb = nn.LayerNorm(5), nn.RMSNorm(5, eps=1e-6), nn.Embedding(7, 5)
    x2, x4, x3 = g.input((4, 6), name="x2"), g.input((2, 3, 5, 5), name="x4"), g.input((2, 3, 8), name="x3")
    idx = g.input((2, 3), name="idx", dtype=np.int64)
    outs = [lin(x2), conv(x4), conv1(x3), ln(lin(x2)), rms(lin(x2)), emb(idx)]
    v2, v4, v3 = rng.standard_normal((4, 6)), rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((2, 3, 8))
    iv = rng.integers(0, 7, (2, 3))
    got = jg.build_forward(outs).run({x2: v2, x4: v4, x3: v3, idx: iv})
    sd = {k: v for k, v in {**{f"lin.{k}": v for k, v in lin.state_dict().items()},
                            **{f"conv.{k}": v for k, v in conv.state_dict().items()},
                            **{f"conv1.{k}": v for k, v in conv1.state_dict().items()}}.items()}
    y = v2 @ sd["lin.weight"].T + sd["lin.bias"]
    np.testing.assert_allclose(got[0], y, rtol=1e-13)
    np.testing.assert_allclose(got[1], conv2d_ref(v4, sd["conv.weight"], 1, 1) + sd["conv.bias"][None, :, None, None],
                               rtol=1e-12, atol=1e-13)
    ref1 = conv2d_ref(v3[:, :, None, :], sd["conv1.weight"][:, :, None, :], 1, (0, 1))[:, :, 0, :]
    np.testing.assert_allclose(got[2], ref1 + sd["conv1.bias"][None, :, None], rtol=1e-12, atol=1e-13)
    mu, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    np.testing.assert_allclose(got[3], (y - mu) / np.sqrt(var + 1e-5), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got[4], y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-6), rtol=1e-12)
    np.testing.assert_allclose(got[5], emb.state_dict()["weight"][iv], rtol=0)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_self_causal_and_cross(batch_first):
    nn.manual_seed(2)
    E, H, B, T, S = 8, 2, 2, 5, 3
    mha = nn.MultiheadAttention(E, H, batch_first=batch_first)
    mha.load_state_dict({**mha.state_dict(), "in_proj_bias": np.linspace(-1, 1, 3 * E),
                         "out_proj.bias": np.linspace(0, 1, E)})
    rng = np.random.default_rng(1)
    g = graph64()
    shape = (lambda t: (B, t, E)) if batch_first else (lambda t: (t, B, E))
    x, m = g.input(shape(T), name="x"), g.input(shape(S), name="memory")
    own, _ = mha(x, x, x, is_causal=True)
    cross, _ = mha(x, m, m)
    xv, mv = rng.standard_normal(shape(T)), rng.standard_normal(shape(S))
    got = jg.build_forward([own, cross]).run({x: xv, m: mv})
    sd = mha.state_dict()
    W, b = sd["in_proj_weight"], sd["in_proj_bias"]

    def ref(q, kv, causal):
        if not batch_first:
            q, kv = q.transpose(1, 0, 2), kv.transpose(1, 0, 2)
        heads = [(t @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E]).reshape(B, -1, H, E // H).transpose(0, 2, 1, 3)
                 for i, t in enumerate((q, kv, kv))]
        o = attention_ref(*heads, causal=causal).transpose(0, 2, 1, 3).reshape(B, -1, E)
        o = o @ sd["out_proj.weight"].T + sd["out_proj.bias"]
        return o if batch_first else o.transpose(1, 0, 2)

    np.testing.assert_allclose(got[0], ref(xv, xv, True), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got[1], ref(xv, mv, False), rtol=1e-12, atol=1e-13)
    assert mha.num_parameters() == 4 * E * E + 4 * E
    with pytest.raises(jg.GraphError, match="need_weights"):
        mha(x, need_weights=True)


def test_batch_norm_trains_on_the_batch_evaluates_on_running_statistics_and_shares_params():
    nn.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3), nn.ReLU(), nn.Dropout(0.5))
    g = graph64()
    x = g.input((4, 2, 6, 6), name="x")
    train_out = model(x)
    model.eval()
    xe = g.input((1, 2, 6, 6), name="x_eval")
    eval_out = model(xe)
    assert not model[1].training and not model[3].training
    rng = np.random.default_rng(2)
    xv, xev = rng.standard_normal((4, 2, 6, 6)), rng.standard_normal((1, 2, 6, 6))
    w = model[0].state_dict()["weight"]
    conv = conv2d_ref(xv, w, 1, 1)
    loss = jg.sum(jg.sqr(train_out))
    bwd = jg.build_backward(jg.build_forward(loss))
    bwd.run({x: xv})
    sd = model.state_dict()
    mean, var = conv.mean(axis=(0, 2, 3)), conv.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(sd["1.running_mean"], 0.1 * mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sd["1.running_var"], 0.9 + 0.1 * var, rtol=1e-12)
    # eval: running statistics, no dropout; the training run's update is what it reads
    ev = jg.build_forward(eval_out).run({xe: xev})
    want = np.maximum(batch_norm_ref(conv2d_ref(xev, w, 1, 1), sd["1.weight"], sd["1.bias"], training=False,
                                     mean=sd["1.running_mean"], var=sd["1.running_var"]), 0)
    np.testing.assert_allclose(ev, want, rtol=1e-12, atol=1e-14)
    # the two programs share the conv weight: an optimizer step moves the eval output
    opt = jg.optim.SGD(model.parameters(), lr=0.1)
    opt.step()
    assert not np.allclose(jg.build_forward(eval_out).run({xe: xev}), ev)


# ---- gradients against finite differences ------------------------------------------------------
def test_gradients_of_a_model_match_finite_differences():
    nn.manual_seed(4)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 3, 3, padding=1)
            self.norm = nn.LayerNorm(5)
            self.mlp = nn.Sequential(nn.Linear(5, 7), nn.GELU(approximate="tanh"), nn.Linear(7, 5), nn.SiLU())
            self.rms = nn.RMSNorm(5)
            self.attn = nn.MultiheadAttention(5, 1, batch_first=True)

        def forward(self, x):
            h = self.norm(self.conv(x))                    # (N, 3, 5): 3 tokens of width 5
            h = h + self.mlp(h)
            a, _ = self.attn(h, is_causal=True)
            return jg.sum(jg.sqr(self.rms(h + a)))

    model = Net()
    g = graph64()
    x = g.input((2, 2, 5), name="x")
    loss = model(x)
    bwd = jg.build_backward(jg.build_forward(loss))
    xv = np.random.default_rng(3).standard_normal((2, 2, 5))
    fwd = jg.build_forward(loss)
    bwd.run({x: xv})
    rng = np.random.default_rng(5)
    for name, p in model.named_parameters():
        grad = p.grad.copy()
        base = p.value
        for flat in rng.choice(p.size, min(p.size, 3), replace=False):
            i = np.unravel_index(flat, p.shape)
            h = 1e-6 * max(1.0, abs(base[i]))
            vals = []
            for s in (1, -1):
                moved = base.copy()
                moved[i] += s * h
                p.value = moved
                vals.append(float(fwd.run({x: xv})))
            p.value = base
            fd = (vals[0] - vals[1]) / (2 * h)
            assert abs(fd - grad[i]) <= 1e-6 * max(1.0, abs(fd)), (name, i, fd, grad[i])


# ---- names, initialization, binding ----------------------------------------------------------------
def test_pytorch_names_layouts_and_seeded_initialization():
    def make():
        nn.manual_seed(7)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
                             nn.LayerNorm(10))

    a, b = make(), make()
    sd = a.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                        "1.num_batches_tracked", "4.weight", "4.bias", "5.weight", "5.bias"]
    assert sd["0.weight"].shape == (8, 3, 3, 3) and sd["4.weight"].shape == (10, 128)
    assert sd["1.num_batches_tracked"].dtype == np.int64
    assert all(np.array_equal(sd[k], v) for k, v in b.state_dict().items())          # seeded: the same model
    nn.manual_seed(8)
    assert not np.array_equal(nn.Linear(128, 10).state_dict()["weight"], sd["4.weight"])
    bound = 1 / np.sqrt(3 * 9)                                                          # kaiming_uniform(a=sqrt(5))
    assert np.abs(sd["0.weight"]).max() <= bound and np.abs(sd["0.weight"]).max() > 0.8 * bound
    assert np.array_equal(sd["1.weight"], np.ones(8)) and np.array_equal(sd["1.running_var"], np.ones(8))
    assert a.num_parameters() == 8 * 27 + 8 + 16 + 1280 + 10 + 20
    assert "Conv2d(3, 8, kernel_size=(3, 3)" in repr(a)
    with pytest.raises(jg.GraphError, match="not on a graph yet"):
        a.parameters()
    g = jg.Graph(np.float32)
    a.bind(g)
    names = [n for n, _ in a.named_parameters()]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias", "5.weight", "5.bias"]
    assert g.tensor("4.weight") is not None and a[4].weight.graph is g
    assert a.state_dict()["4.weight"].dtype == np.float32
    with pytest.raises(jg.GraphError, match="another graph"):
        a(jg.Graph(np.float32).input((1, 3, 6, 6)))


def test_a_call_that_raises_leaves_the_graph_and_the_model_as_they_were():
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(5, 2))       # 3 != 5: the second layer fails
    g = graph64()
    x = g.input((2, 4), name="x")
    n = len(g)
    with pytest.raises(jg.GraphError, match=r"Linear: input .* axis -1 must be 5"):
        model(x)
    assert len(g) == n and model.graph is None and model[0].graph is None
    assert isinstance(model[0].weight, nn.Parameter)              # unbound again: the initial value
    fixed = nn.Sequential(model[0], nn.ReLU(), nn.Linear(3, 2))
    out = fixed(x)
    assert out.shape == (2, 2) and g.tensor("0.weight").shape == (3, 4)
    with pytest.raises(jg.GraphError, match="expects jitgraph Tensors"):
        fixed(np.zeros((2, 4)))


def test_parameters_train_with_jg_optim_and_jg_train():
    nn.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    g = jg.Graph(np.float32)
    x, y = g.input((32, 4), name="x"), g.input((32,), name="y", dtype=np.int64)
    loss = jg.cross_entropy(model(x), y)
    bwd = jg.build_backward(jg.build_forward(loss))
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((256, 4)).astype(np.float32)
    yv = (xv[:, 0] > 0).astype(np.int64) + (xv[:, 1] > 0)
    losses = jg.train(bwd, jg.optim.AdamW(model.parameters(), lr=0.02), {x: xv, y: yv}, epochs=8, progress=False)
    assert np.mean(losses[-8:]) < 0.6 * np.mean(losses[:8])
    table = model.summary(bwd)
    assert "Linear" in table and "kept for backward" in table and "147 parameters" not in table
    assert f"{model.num_parameters():,} parameters" in table


# ---- weights by name ------------------------------------------------------------------------------
def model_and_graph(seed=0):
    nn.manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    g = jg.Graph(np.float32)
    x = g.input((5, 3), name="x")
    return m, g, x, m(x)


def test_state_dict_round_trip_and_load_into_a_bound_model():
    a, ga, xa, out_a = model_and_graph(0)
    b, gb, xb, out_b = model_and_graph(1)
    xv = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    assert not np.array_equal(forward(out_a, {xa: xv}), forward(out_b, {xb: xv}))
    res = b.load_state_dict(a.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert np.array_equal(forward(out_a, {xa: xv}), forward(out_b, {xb: xv}))
    assert all(np.array_equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_load_state_dict_names_every_problem_and_changes_nothing():
    m, g, x, out = model_and_graph(0)
    before = m.state_dict()
    bad = dict(before)
    del bad["0.bias"]
    bad["extra.weight"] = np.zeros(3)
    bad["2.weight"] = np.zeros((4, 2))
    bad["1.running_mean"] = np.array(["a", "b", "c", "d"])
    with pytest.raises(jg.GraphError) as e:
        m.load_state_dict(bad)
    msg = str(e.value)
    for part in ("missing keys: 0.bias", "unexpected keys: extra.weight", "2.weight: shape (4, 2)",
                 "1.running_mean", "nothing was changed"):
        assert part in msg
    assert all(np.array_equal(v, m.state_dict()[k]) for k, v in before.items())
    bad.pop("1.running_mean")
    bad["2.weight"] = np.ones((2, 4))
    res = m.load_state_dict(bad, strict=False)
    assert res.missing_keys == ["0.bias", "1.running_mean"] and res.unexpected_keys == ["extra.weight"]
    assert np.array_equal(m[2].weight.value, np.ones((2, 4), np.float32))
    with pytest.raises(jg.GraphError, match="integer counter"):
        m.load_state_dict({**m.state_dict(), "1.num_batches_tracked": np.array(1.5)})
    with pytest.raises(jg.GraphError, match="expects a dict"):
        m.load_state_dict([1, 2])


def test_safetensors_files_round_trip_and_bfloat16_loads_exactly(tmp_path):
    m, g, x, out = model_and_graph(0)
    path = tmp_path / "m.safetensors"
    m.save(path)
    n, g2, x2, out2 = model_and_graph(1)
    n.load_state_dict(path)
    assert all(np.array_equal(v, n.state_dict()[k]) for k, v in m.state_dict().items())
    # a bfloat16 tensor (what torch writes for bf16 models): widened to float32 exactly
    vals = np.array([1.0, -2.5, 3.140625, 0.0078125], np.float32)
    raw = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, len(raw)]}}).encode()
    (tmp_path / "bf16.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw)
    got = nn.load_safetensors(tmp_path / "bf16.safetensors")
    assert got["w"].dtype == np.float32 and np.array_equal(got["w"], vals)


def test_hostile_safetensors_files_raise_and_change_no_parameter(tmp_path):
    m, g, x, out = model_and_graph(0)
    before = m.state_dict()
    good = tmp_path / "good.safetensors"
    nn.save_safetensors(before, good)
    data = good.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    cases = {
        "truncated": data[:-7],
        "oversized header": struct.pack("<Q", 1 << 40) + data[8:],
        "not json": struct.pack("<Q", 5) + b"{bad}" + data[8 + n:],
        "offsets past the end": _with_header(header, data, n, "0.weight", data_offsets=[0, 10 ** 9]),
        "wrong dtype": _with_header(header, data, n, "0.weight", dtype="BOOL"),
        "empty": b"",
    }
    for what, blob in cases.items():
        p = tmp_path / f"{what.replace(' ', '_')}.safetensors"
        p.write_bytes(blob)
        with pytest.raises(jg.GraphError, match="safetensors file|0.weight"):
            m.load_state_dict(p)
        assert all(np.array_equal(v, m.state_dict()[k]) for k, v in before.items()), what
    with pytest.raises(jg.GraphError, match="does not exist"):
        m.load_state_dict(tmp_path / "nowhere.safetensors")


def _with_header(header, data, n, key, **changes):
    h = json.loads(json.dumps(header))
    h[key].update(changes)
    raw = json.dumps(h).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:]


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3))
    seq.append(nn.Tanh())
    assert len(seq) == 2 and isinstance(seq[1], nn.Tanh) and [type(m).__name__ for m in seq] == ["Linear", "Tanh"]
    lst = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(lst) == 3 and [k for k in lst.state_dict()][:2] == ["0.weight", "0.bias"]
    with pytest.raises(jg.GraphError, match="not a Module"):
        nn.Sequential(nn.Linear(2, 2), "relu")
    with pytest.raises(jg.GraphError, match="groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(jg.GraphError, match="normalized_shape"):
        nn.LayerNorm((4, 5))


def test_same_numbers_as_pytorch_when_it_is_installed(tmp_path):
    """With PyTorch present (the bench extra; CI's checks are the numpy ones above): a torch
    model's weights, loaded by name from its state dict and from a safetensors file it
    wrote, give its loss, gradients, running statistics and eval outputs in float64; jitgraph's
    file loads back into torch."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)

    def torch_model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 6), torch.nn.LayerNorm(6),
                                   torch.nn.GELU(), torch.nn.Linear(6, 3)).double()

    tm = torch_model()
    jm = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(100, 6),
                       nn.LayerNorm(6), nn.GELU(), nn.Linear(6, 3))
    save_file(tm.state_dict(), str(tmp_path / "t.safetensors"))
    assert jm.load_state_dict(tmp_path / "t.safetensors") == ([], [])
    xv = np.random.default_rng(0).standard_normal((4, 3, 5, 5))
    g = graph64()
    x = g.input((4, 3, 5, 5), name="x")
    out = jm(x)
    loss = float(jg.build_backward(jg.build_forward(jg.sum(jg.sqr(out)))).run({x: xv}))
    to = tm(torch.tensor(xv))
    (to * to).sum().backward()
    assert loss == pytest.approx((to * to).sum().item(), rel=1e-13)
    grads = dict(tm.named_parameters())
    for name, p in jm.named_parameters():
        np.testing.assert_allclose(p.grad, grads[name].grad.numpy(), rtol=1e-10, atol=1e-13)
    for key, value in jm.state_dict().items():
        if not key.endswith("num_batches_tracked"):             # torch counts batches; jitgraph carries it
            np.testing.assert_allclose(value, tm.state_dict()[key].numpy(), rtol=1e-12, atol=1e-15)
    jm.save(tmp_path / "j.safetensors")
    back = torch_model()
    back.load_state_dict(load_file(str(tmp_path / "j.safetensors")))
    jm.eval()
    back.eval()
    xe = g.input((2, 3, 5, 5), name="xe")
    np.testing.assert_allclose(jg.build_forward(jm(xe)).run({xe: xv[:2]}),
                               back(torch.tensor(xv[:2])).detach().numpy(), rtol=1e-11, atol=1e-13)
