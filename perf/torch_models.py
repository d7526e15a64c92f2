"""Model code written the way PyTorch projects write it, for jg.from_torch's tests and its
benchmark (perf/bench_import.py): a torchvision-style ResNet, a GPT-2-style transformer
(SDPA, or a registered causal mask with masked_fill; positions from arange; a tied head) and
a ViT-style patch embedding + encoder.  ``classes(torch)`` defines them on the torch it is
given, so importing this module does not import torch."""
import math
from types import SimpleNamespace


def classes(torch):
    tnn, F = torch.nn, torch.nn.functional

    class BasicBlock(tnn.Module):
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
        """A stem (conv, batch norm, ReLU, optional max pool), stages of basic blocks (the first of
        each later stage strided, with a 1x1 downsample), global average pool, a linear head."""

        def __init__(self, widths=(8, 16), blocks=1, classes=10, pool=True):
            super().__init__()
            stem = [tnn.Conv2d(3, widths[0], 3, 1, 1, bias=False), tnn.BatchNorm2d(widths[0]), tnn.ReLU()]
            self.stem = tnn.Sequential(*(stem + [tnn.MaxPool2d(2)] if pool else stem))
            layers, cin = [], widths[0]
            for i, w in enumerate(widths):
                for j in range(blocks):
                    layers.append(BasicBlock(cin, w, 2 if i > 0 and j == 0 else 1))
                    cin = w
            self.layers = tnn.Sequential(*layers)
            self.pool, self.fc = tnn.AdaptiveAvgPool2d(1), tnn.Linear(cin, classes)

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
        def __init__(self, sdpa=True, vocab=13, d=16, heads=2, T=8, layers=2):
            super().__init__()
            self.wte, self.wpe = tnn.Embedding(vocab, d), tnn.Embedding(T, d)
            self.h = tnn.ModuleList([TransformerBlock(d, heads, T, sdpa) for _ in range(layers)])
            self.ln_f, self.lm_head = tnn.LayerNorm(d), tnn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight                  # tied

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(0, idx.shape[1], dtype=torch.long))  # positions from shapes
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    class ViT(tnn.Module):
        def __init__(self, d=16, classes=10, patch=4, image=8, layers=2):
            super().__init__()
            n = (image // patch) ** 2
            self.patch = tnn.Conv2d(3, d, patch, patch)
            self.cls_token = tnn.Parameter(torch.randn(1, 1, d))
            self.pos = tnn.Parameter(torch.randn(1, n + 1, d) * 0.02)
            self.blocks = tnn.Sequential(*[TransformerBlock(d, 2, n + 1, causal=False) for _ in range(layers)])
            self.norm, self.head = tnn.LayerNorm(d), tnn.Linear(d, classes)

        def forward(self, x):
            p = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), p], dim=1) + self.pos
            return self.head(self.norm(self.blocks(x))[:, 0])

    return SimpleNamespace(BasicBlock=BasicBlock, ResNet=ResNet, SelfAttention=SelfAttention,
                           TransformerBlock=TransformerBlock, GPT=GPT, ViT=ViT)
