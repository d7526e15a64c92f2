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


def test_importing_jitgraph_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, jitgraph; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
