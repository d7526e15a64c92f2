"""jg.from_torch: model code written the way real projects write it -- a torchvision-style
ResNet, GPT-2-style transformers (SDPA, or a registered causal mask with masked_fill; a tied
head), a ViT-style patch embedding + encoder -- imported, and one training step's loss and
every parameter's gradient equal PyTorch's (float64 to 1e-10, float32 to 1e-4 / 1e-3)."""
import math
import subprocess
import sys

import numpy as np
import pytest

import jitgraph as jg

torch = pytest.importorskip("torch")        # the bench / dev extras; `import jitgraph` never needs it
tnn, F = torch.nn, torch.nn.functional


class Block(tnn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False), tnn.BatchNorm2d(cout)
        self.conv2, self.bn2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False), tnn.BatchNorm2d(cout)
        self.downsample = (tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + identity)


class ResNet(tnn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = tnn.Sequential(tnn.Conv2d(3, 8, 3, 1, 1, bias=False), tnn.BatchNorm2d(8), tnn.ReLU(),
                                   tnn.MaxPool2d(2))
        self.layers = tnn.Sequential(Block(8, 8, 1), Block(8, 16, 2))
        self.pool, self.fc = tnn.AdaptiveAvgPool2d(1), tnn.Linear(16, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class SelfAttention(tnn.Module):
    def __init__(self, d, heads, T, sdpa, causal=True):
        super().__init__()
        self.heads, self.sdpa, self.causal = heads, sdpa, causal
        self.c_attn, self.c_proj = tnn.Linear(d, 3 * d), tnn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class TransformerBlock(tnn.Module):
    def __init__(self, d, heads, T, sdpa=True, causal=True):
        super().__init__()
        self.ln_1, self.attn = tnn.LayerNorm(d), SelfAttention(d, heads, T, sdpa, causal)
        self.ln_2, self.fc, self.proj = tnn.LayerNorm(d), tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(tnn.Module):
    def __init__(self, sdpa, vocab=13, d=16, heads=2, T=8, layers=2):
        super().__init__()
        self.wte, self.wpe = tnn.Embedding(vocab, d), tnn.Embedding(T, d)
        self.h = tnn.ModuleList([TransformerBlock(d, heads, T, sdpa) for _ in range(layers)])
        self.ln_f, self.lm_head = tnn.LayerNorm(d), tnn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight                  # tied

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(0, idx.shape[1], dtype=torch.long))   # positions from shapes
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class ViT(tnn.Module):
    def __init__(self, d=16, classes=10, patches=4):
        super().__init__()
        self.patch = tnn.Conv2d(3, d, 4, 4)
        self.cls_token = tnn.Parameter(torch.randn(1, 1, d))
        self.pos = tnn.Parameter(torch.randn(1, patches + 1, d) * 0.02)
        self.blocks = tnn.Sequential(*[TransformerBlock(d, 2, patches + 1, causal=False) for _ in range(2)])
        self.norm, self.head = tnn.LayerNorm(d), tnn.Linear(d, classes)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), p], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def onehot(y, n, dtype):
    return np.eye(n, dtype=dtype)[y]


def models():
    torch.manual_seed(0)
    images, labels = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    idx, tokens = torch.randint(0, 13, (2, 8)), torch.randint(0, 13, (16,))
    small, small_labels = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
    return [("resnet", ResNet(), (images,), labels, 10), ("gpt-sdpa", GPT(sdpa=True), (idx,), tokens, 13),
            ("gpt-masked", GPT(sdpa=False), (idx,), tokens, 13), ("vit", ViT(), (small,), small_labels, 10)]


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

    with pytest.raises(jg.GraphError, match=r"aten\.cumsum .*test_from_torch\.py, line \d+: return torch\.cumsum"):
        jg.from_torch(Odd(), (torch.randn(2, 4),))
    with pytest.raises(jg.GraphError, match="torch.nn.Module"):
        jg.from_torch(lambda x: x, (torch.randn(2),))


def test_importing_jitgraph_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, jitgraph; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
