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


class NNGPT(nn.Module):
    def __init__(self, vocab=13, d=16, heads=2, T=8, layers=2):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.h = nn.ModuleList()
        for _ in range(layers):
            block = nn.Module()
            block.ln_1, block.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            block.attn = nn.Module()
            block.attn.c_attn, block.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            block.attn.register_buffer("bias", np.tril(np.ones((T, T))).reshape(1, 1, T, T), on_graph=False)
            block.fc, block.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.h.append(block)
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight                      # tied, PyTorch's way
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe.weight                          # positions 0..T-1: the whole table
        for b in self.h:
            C = x.shape[-1]
            qkv = b.attn.c_attn(b.ln_1(x))
            q, k, v = (jg.transpose(jg.reshape(jg.slice_axis(qkv, -1, i * C, (i + 1) * C), (B, T, self.heads, -1)),
                                    (0, 2, 1, 3)) for i in range(3))
            y = jg.reshape(jg.transpose(jg.attention(q, k, v, causal=True), (0, 2, 1, 3)), (B, T, C))
            x = x + b.attn.c_proj(y)
            x = x + b.proj(self.gelu(b.fc(b.ln_2(x))))
        return self.lm_head(self.ln_f(x))


@pytest.mark.parametrize("which", ["resnet", "gpt"])
def test_the_same_models_built_with_jg_nn_load_torch_weights_and_agree(which, tmp_path):
    """[6/6]: the reference models written with jitgraph.nn (the same parameter names) load
    the torch model's safetensors file and give its loss and every gradient in float64."""
    from safetensors.torch import save_model
    torch.manual_seed(0)
    if which == "resnet":
        tm, jm = M.ResNet(), NNResNet()
        x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
        target, classes, feed_dtype = torch.randint(0, 10, (4,)), 10, None
    else:
        tm, jm = M.GPT(sdpa=True), NNGPT()
        x = torch.randint(0, 13, (2, 8))
        target, classes, feed_dtype = torch.randint(0, 13, (16,)), 13, np.int64
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
