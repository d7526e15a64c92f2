"""jg.from_torch: model code written the way real projects write it -- a torchvision-style
ResNet, GPT-2-style transformers (SDPA, or a registered causal mask with masked_fill; a tied
head), a ViT-style patch embedding + encoder -- imported, and one training step's loss and
every parameter's gradient equal PyTorch's (float64 to 1e-10, float32 to 1e-4 / 1e-3)."""
import importlib
import subprocess
import sys

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import nn
from jitgraph.cli import perf_package

torch = pytest.importorskip("torch")        # the bench / dev extras; `import jitgraph` never needs it
tnn, F = torch.nn, torch.nn.functional


perf_package()
M = importlib.import_module("jitgraph._perf.torch_models").classes(torch)


def onehot(y, n, dtype):
    return np.eye(n, dtype=dtype)[y]


def models():
    torch.manual_seed(0)
    images, labels = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    idx, tokens = torch.randint(0, 13, (2, 8)), torch.randint(0, 13, (16,))
    small, small_labels = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
    return [("resnet", M.ResNet(), (images,), labels, 10), ("gpt-sdpa", M.GPT(sdpa=True), (idx,), tokens, 13),
            ("gpt-masked", M.GPT(sdpa=False), (idx,), tokens, 13), ("vit", M.ViT(), (small,), small_labels, 10)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("which", ["resnet", "gpt-sdpa", "gpt-masked", "vit"])
def test_one_training_step_equals_pytorch(which, dtype):
    name, model, inputs, target, classes = next(m for m in models() if m[0] == which)
    model = model.to(dtype)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    imp = jg.from_torch(model, inputs)
    npdt = np.float64 if dtype == torch.float64 else np.float32
    assert imp.graph.dtype == npdt
    logits = imp.outputs[0]
    logits = jg.reshape(logits, (-1, classes))
    loss = jg.cross_entropy(logits, imp.graph.const(onehot(target.numpy(), classes, npdt)))
    bwd = jg.build_backward(jg.build_forward(loss))
    got = float(bwd.run({t: v.numpy() for t, v in zip(imp.inputs, inputs)}))
    want = F.cross_entropy(model(*inputs).reshape(-1, classes), target)
    want.backward()
    loss_tol, grad_tol = (1e-10, 1e-10) if dtype == torch.float64 else (1e-4, 1e-3)
    assert got == pytest.approx(want.item(), rel=loss_tol)
    for pname, p in model.named_parameters(remove_duplicate=False):
        g, ref = imp.params[pname].grad, p.grad.numpy()
        assert np.abs(g - ref).max() <= grad_tol * max(np.abs(ref).max(), 1e-6), pname
    if which == "resnet":            # train-mode batch norm: the running statistics moved as torch's did
        for bname, b in model.named_buffers():
            if "running" in bname:
                np.testing.assert_allclose(imp.buffers[bname].value, b.numpy(), rtol=loss_tol * 10, atol=1e-7)
    # checkpointed plans on the imported graph: the same bits as the plain one
    if dtype == torch.float64 and which in ("resnet", "gpt-sdpa"):
        plain_grads = {n: imp.params[n].grad.copy() for n in imp.params}
        fwd2 = jg.build_forward(loss)
        sqrt = jg.build_backward(fwd2, checkpoints="sqrt")
        for prog in (sqrt, jg.build_backward(fwd2, memory_budget=(sqrt.peak_bytes + bwd.peak_bytes) // 2)):
            assert prog.peak_bytes < bwd.peak_bytes
            prog.run({t: v.numpy() for t, v in zip(imp.inputs, inputs)})
            assert all(np.array_equal(imp.params[n].grad, plain_grads[n]) for n in imp.params)


def test_an_op_without_a_translation_names_it_and_its_line():
    class Odd(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc = tnn.Linear(4, 4)

        def forward(self, x):
            return torch.cumsum(self.fc(x), dim=1)     # the line the error names

    with pytest.raises(jg.GraphError, match=r"aten\.cumsum .*test_from_torch\.py, line \d+: (return torch\.cumsum|the "
                                            r"forward of .*Odd)"):
        jg.from_torch(Odd(), (torch.randn(2, 4),))
    with pytest.raises(jg.GraphError, match="torch.nn.Module"):
        jg.from_torch(lambda x: x, (torch.randn(2),))


@pytest.mark.parametrize("batch_first", [True, False])
def test_torch_transformer_layers_with_five_axis_views_import(batch_first):
    """nn.TransformerEncoderLayer and nn.MultiheadAttention (its averaged weights too) make a
    5-axis tensor for a moment (unflatten, unsqueeze(0), transpose(0, -2), squeeze): held as
    its long axes, the step's loss and every gradient are PyTorch's in float64."""
    class Encoder(tnn.Module):
        def __init__(self):
            super().__init__()
            self.layer = tnn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first)
            self.mha = tnn.MultiheadAttention(16, 4, batch_first=batch_first)

        def forward(self, x):
            y = self.layer(x)
            z, w = self.mha(y, y, y)
            return (z * z).mean() + (w * w).sum()

    torch.manual_seed(1)
    model, x = Encoder().double(), torch.randn(3, 5, 16, dtype=torch.float64)
    imp = jg.from_torch(model, (x,))
    got = float(jg.build_backward(jg.build_forward(imp.outputs[0])).run({imp.inputs[0]: x.numpy()}))
    want = model(x)
    want.backward()
    assert got == pytest.approx(want.item(), rel=1e-10)
    for name, p in model.named_parameters():
        ref = p.grad.numpy()
        assert np.abs(imp.params[name].grad - ref).max() <= 1e-10 * np.abs(ref).max(), name


def test_a_tensor_of_five_long_axes_is_refused_by_name():
    class FiveAxes(tnn.Module):
        def forward(self, x):
            return x.view(2, 2, 2, 2, 2).sum()

    with pytest.raises(jg.GraphError, match=r"aten\.view .*more than 4 axes longer than 1"):
        jg.from_torch(FiveAxes(), (torch.randn(32),))

    class WideAdd(tnn.Module):
        def forward(self, x):
            return (x.view(1, 2, 2, 2, 4) + 1.0).sum()

    with pytest.raises(jg.GraphError, match=r"aten\.add on a tensor of 5 axes .*at most 4"):
        jg.from_torch(WideAdd(), (torch.randn(32),))


def test_another_batch_size_from_an_import_shares_its_params_and_buffers():
    """[6/6] item 5: imp.with_batch(3) is the same ResNet on the same graph at batch 3 (the
    same params; train-mode batch norm's running statistics one const both programs update),
    and imp.with_inputs(...) a GPT at another sequence length: both give PyTorch's loss and
    gradients.  A translation that fails adds nothing to the graph."""
    torch.manual_seed(0)
    model = M.ResNet().double()
    imp = jg.from_torch(model, (torch.randn(4, 3, 16, 16, dtype=torch.float64),))
    small = imp.with_batch(3)
    assert small.graph is imp.graph and small.params is imp.params and small.buffers is imp.buffers
    assert small.inputs[0].shape == (3, 3, 16, 16) and small.inputs[0].name == "x_2"
    x3 = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    out = small.outputs[0]
    got = float(jg.build_backward(jg.build_forward(jg.mean(out * out))).run({small.inputs[0]: x3.numpy()}))
    want = (model(x3) ** 2).mean()
    want.backward()
    assert got == pytest.approx(want.item(), rel=1e-10)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(imp.params[name].grad, p.grad.numpy(), rtol=1e-9, atol=1e-13)
    for name, b in model.named_buffers():
        if "running" in name:
            np.testing.assert_allclose(imp.buffers[name].value, b.numpy(), rtol=1e-10, atol=1e-15)

    gpt = M.GPT(sdpa=True).double()
    idx = torch.randint(0, 13, (2, 8))
    imp = jg.from_torch(gpt, (idx,))
    short = imp.with_inputs(idx[:, :5])
    assert [t.shape for t in short.inputs] == [(2, 5)] and short.params is imp.params
    logits = short.outputs[0]
    assert logits.shape == (2, 5, 13)
    got = jg.build_forward(logits).run({short.inputs[0]: idx[:, :5].numpy()})
    np.testing.assert_allclose(got, gpt(idx[:, :5]).detach().numpy(), rtol=1e-10, atol=1e-12)

    class ShapeBranch(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc = tnn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return torch.cumsum(y, 0) if x.shape[0] == 1 else y     # no translation at batch 1

    imp = jg.from_torch(ShapeBranch(), (torch.randn(2, 4),))
    before = len(imp.graph)
    with pytest.raises(jg.GraphError, match="aten.cumsum"):
        imp.with_batch(1)
    assert len(imp.graph) == before
    with pytest.raises(jg.GraphError, match="n must be an int"):
        imp.with_batch(0)


def test_importing_jitgraph_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, jitgraph; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class NNBlock(nn.Module):
    """M.BasicBlock written with jitgraph.nn: the same names, so the same state dict."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.has_down = stride != 1 or cin != cout
        if self.has_down:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = self.downsample(x) if self.has_down else x
        return jg.relu(self.bn2(self.conv2(jg.relu(self.bn1(self.conv1(x))))) + identity)


class NNResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layers = nn.Sequential(NNBlock(8, 8, 1), NNBlock(8, 16, 2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(jg.mean(self.layers(jg.max_pool2d(self.stem(x), 2)), axis=(2, 3)))


class NNAttention(nn.Module):
    """M.SelfAttention with jitgraph.nn (its mask buffer kept for the state dict's sake)."""

    def __init__(self, d, heads, T, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.register_buffer("bias", np.tril(np.ones((T, T))).reshape(1, 1, T, T), on_graph=False)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.c_attn(x)
        q, k, v = (jg.transpose(jg.reshape(jg.slice_axis(qkv, -1, i * C, (i + 1) * C), (B, T, self.heads, -1)),
                                (0, 2, 1, 3)) for i in range(3))
        return self.c_proj(jg.reshape(jg.transpose(jg.attention(q, k, v, causal=self.causal), (0, 2, 1, 3)), (B, T, C)))


class NNTransformerBlock(nn.Module):
    def __init__(self, d, heads, T, causal=True):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), NNAttention(d, heads, T, causal)
        self.ln_2, self.fc, self.proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(self.gelu(self.fc(self.ln_2(x))))


class NNGPT(nn.Module):
    def __init__(self, vocab=13, d=16, heads=2, T=8, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.h = nn.ModuleList([NNTransformerBlock(d, heads, T) for _ in range(layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight                      # tied, PyTorch's way

    def forward(self, idx):
        x = self.wte(idx) + self.wpe.weight                          # positions 0..T-1: the whole table
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class NNViT(nn.Module):
    """M.ViT: patches by a strided convolution, a class token, learned positions, encoder."""

    def __init__(self, d=16, classes=10, patch=4, image=8, layers=2):
        super().__init__()
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls_token = nn.Parameter(np.zeros((1, 1, d)))
        self.pos = nn.Parameter(np.zeros((1, n + 1, d)))
        self.blocks = nn.Sequential(*[NNTransformerBlock(d, 2, n + 1, causal=False) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        B, d = x.shape[0], self.pos.shape[-1]
        p = jg.transpose(jg.reshape(self.patch(x), (B, d, -1)), (0, 2, 1))
        x = jg.concat([jg.broadcast_to(self.cls_token, (B, 1, d)), p], 1) + self.pos
        return self.head(jg.reshape(jg.slice_axis(self.norm(self.blocks(x)), 1, 0, 1), (B, d)))


@pytest.mark.parametrize("which", ["resnet", "gpt", "vit"])
def test_the_same_models_built_with_jg_nn_load_torch_weights_and_agree(which, tmp_path):
    """[6/6]: the reference models written with jitgraph.nn (the same parameter names) load
    the torch model's safetensors file and give its loss and every gradient in float64."""
    from safetensors.torch import save_model
    torch.manual_seed(0)
    if which == "resnet":
        tm, jm = M.ResNet(), NNResNet()
        x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
        target, classes, feed_dtype = torch.randint(0, 10, (4,)), 10, None
    elif which == "gpt":
        tm, jm = M.GPT(sdpa=True), NNGPT()
        x = torch.randint(0, 13, (2, 8))
        target, classes, feed_dtype = torch.randint(0, 13, (16,)), 13, np.int64
    else:
        tm, jm = M.ViT(), NNViT()
        x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
        target, classes, feed_dtype = torch.randint(0, 10, (2,)), 10, None
    tm = tm.double()
    save_model(tm, str(tmp_path / "w.safetensors"))       # a tied weight written once, under one of its names
    assert jm.load_state_dict(tmp_path / "w.safetensors") == ([], [])
    g = jg.Graph(np.float64)
    xi = g.input(tuple(x.shape), name="x", dtype=feed_dtype)
    logits = jg.reshape(jm(xi), (-1, classes))
    loss = jg.cross_entropy(logits, g.const(onehot(target.numpy(), classes, np.float64)))
    got = float(jg.build_backward(jg.build_forward(loss)).run({xi: x.numpy()}))
    want = F.cross_entropy(tm(x).reshape(-1, classes), target)
    want.backward()
    assert got == pytest.approx(want.item(), rel=1e-10)
    ours = dict(jm.named_parameters())
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(ours[name].grad, p.grad.numpy(), rtol=1e-9, atol=1e-12 * np.abs(p.grad.numpy()).max())
    if which == "gpt":
        assert jm.lm_head.weight is jm.wte.weight                 # one param under both names
