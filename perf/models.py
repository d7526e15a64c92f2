"""The models the workloads share, in jitgraph and in their references (jitgraph's
public API only):

* the relu chain x -> relu(h @ W_i), i = 1..N -> mean(h): its weights, its jitgraph,
  numpy and torch versions, its forward alone and its timed build phases;
* a char-level GPT (minGPT's shape), in jitgraph and in PyTorch eager, on the same weights.
"""
import math
import time
from dataclasses import dataclass

import numpy as np

import jitgraph as jg

from .harness import minor_faults


def chain_weights(n, d, xb, rng):
    """n float32 (d, d) weights, He-scaled, then each rescaled so relu(h @ W) keeps the
    batch's activation RMS.  Plain He scaling drifts by ~1/d a layer, which over 1000
    layers leaves gradients too small for an agreement check to mean anything."""
    h = xb.astype(np.float64)
    rms0 = np.sqrt(np.mean(h * h))
    out = []
    for _ in range(n):
        W = rng.standard_normal((d, d)) * np.sqrt(2.0 / d)
        a = np.maximum(h @ W, 0.0)
        W = (W * (rms0 / np.sqrt(np.mean(a * a)))).astype(np.float32)
        out.append(W)
        h = np.maximum(h @ W.astype(np.float64), 0.0)
    return out


def jg_chain(weights, xb, **backward_kwargs):
    """jitgraph's chain; returns (run, params, bwd)."""
    g = jg.Graph(np.float32)
    x = g.input(xb.shape, name="x")
    params = [g.param(w) for w in weights]
    h = x
    for W in params:
        h = jg.relu(h @ W)
    bwd = jg.build_backward(jg.build_forward(jg.mean(h)), **backward_kwargs)
    feeds = {x: xb}
    return (lambda: bwd.run(feeds)), params, bwd


def np_chain(xb, weights):
    """numpy eager forward and hand-written backward in xb's dtype; returns (loss,
    [dW_i], [h_0 .. h_N])."""
    hs = [xb]
    h = xb
    for W in weights:
        h = h @ W
        np.maximum(h, 0, out=h)          # relu in place: h > 0 exactly where h @ W > 0
        hs.append(h)
    loss = h.mean()
    g = np.full(h.shape, 1.0 / h.size, xb.dtype)
    dWs = [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        g *= hs[i + 1] > 0
        dWs[i] = hs[i].T @ g
        if i:                            # x is an input: its gradient is never needed
            g = g @ weights[i].T
    return loss, dWs, hs


def torch_chain(torch, weights, xb, segments=None):
    """PyTorch eager chain with autograd; ``segments``: torch.utils.checkpoint's
    checkpoint_sequential with that many segments.  Returns (run, params)."""
    Ws = [torch.tensor(w, requires_grad=True) for w in weights]
    x = torch.from_numpy(xb)
    layers = [lambda h, W=W: torch.relu(h @ W) for W in Ws]

    def run():
        for W in Ws:
            W.grad = None                # what optimizer.zero_grad(set_to_none=True) does
        if segments:
            from torch.utils.checkpoint import checkpoint_sequential
            h = checkpoint_sequential(layers, segments, x, use_reentrant=False)
        else:
            h = x
            for f in layers:
                h = f(h)
        loss = h.mean()
        loss.backward()
        return loss
    return run, Ws


def build_phases(weights, shape, keep=None):
    """Seconds of each build phase of the chain (a fresh graph each time), the minor
    page faults during build_backward and the program's node count.  ``keep``, a dict,
    receives the built x, params and bwd for callers that also run them."""
    t0 = time.perf_counter()
    g = jg.Graph(np.float32)
    x = g.input(shape, name="x")
    params = [g.param(w) for w in weights]
    t1 = time.perf_counter()
    h = x
    for W in params:
        h = jg.relu(h @ W)
    loss = jg.mean(h)
    t2 = time.perf_counter()
    fwd = jg.build_forward(loss)
    t3 = time.perf_counter()
    f0 = minor_faults()
    bwd = jg.build_backward(fwd)
    t4 = time.perf_counter()
    faults = None if f0 is None else minor_faults() - f0
    if keep is not None:
        keep.update(x=x, params=params, bwd=bwd)
    return {"params": t1 - t0, "ops": t2 - t1, "build_forward": t3 - t2, "build_backward": t4 - t3,
            "total": t4 - t1, "faults": faults, "nodes": bwd.stats()["n_nodes"]}


def jg_chain_forward(weights, shape):
    """The chain's forward without the mean, for inference: returns (fwd, x); fwd.run
    gives the last activations."""
    g = jg.Graph(np.float32)
    x = g.input(shape, name="x")
    h = x
    for w in weights:
        h = jg.relu(h @ g.param(w))
    return jg.build_forward(h), x


def torch_chain_forward(torch, weights):
    """The same forward in torch, no autograd: returns run(x numpy) -> numpy."""
    Ws = [torch.from_numpy(w) for w in weights]

    def run(xb):
        with torch.inference_mode():
            h = torch.from_numpy(xb)
            for W in Ws:
                h = torch.relu(h @ W)
            return h.numpy()
    return run


# ---- a char-level GPT --------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    layers: int
    d: int
    heads: int
    vocab: int
    T: int            # context length
    batch: int

    @property
    def head_dim(self):
        return self.d // self.heads


# (name, shape in units of d) of each block's matrices and biases
GPT_MATRICES = (("wq", (1, 1)), ("wk", (1, 1)), ("wv", (1, 1)), ("wo", (1, 1)), ("w1", (1, 4)), ("w2", (4, 1)))
GPT_BIASES = (("bq", 1), ("bk", 1), ("bv", 1), ("bo", 1), ("b1", 4), ("b2", 1))


def gpt_weights(cfg, seed=0):
    """{name: float32 array}: matrices and embeddings N(0, 0.02) as GPT-2 starts, biases
    N(0, 0.01) (not zero: their gradients then depend on every layer), layer-norm gains
    1 and shifts 0.  The lm head is its own matrix, not tied to the token embedding."""
    rng = np.random.default_rng(seed)
    d = cfg.d
    w = {"wte": rng.standard_normal((cfg.vocab, d)) * 0.02, "wpe": rng.standard_normal((cfg.T, d)) * 0.02,
         "lnf.g": np.ones(d), "lnf.b": np.zeros(d), "lm": rng.standard_normal((d, cfg.vocab)) * 0.02}
    for i in range(cfg.layers):
        for name, (r, c) in GPT_MATRICES:
            w[f"h{i}.{name}"] = rng.standard_normal((r * d, c * d)) * 0.02
        for name, c in GPT_BIASES:
            w[f"h{i}.{name}"] = rng.standard_normal(c * d) * 0.01
        for ln in ("ln1", "ln2"):
            w[f"h{i}.{ln}.g"] = np.ones(d)
            w[f"h{i}.{ln}.b"] = np.zeros(d)
    return {k: v.astype(np.float32) for k, v in w.items()}


def gpt_batch(cfg, rng):
    """A batch of next-character prediction: (idx (B, T) int64, targets (B*T,) int64,
    targets one-hot (B*T, vocab) float32)."""
    seq = rng.integers(0, cfg.vocab, (cfg.batch, cfg.T + 1))
    idx = np.ascontiguousarray(seq[:, :-1])
    targets = seq[:, 1:].reshape(-1)
    return idx, targets, np.eye(cfg.vocab, dtype=np.float32)[targets]


def gpt_logits(P, idx, cfg, batch, attend):
    """The GPT's logits (batch, T, vocab) for index input ``idx`` (batch, T), params ``P``;
    ``attend(q, k, v)`` maps the (batch, H, T, hd) heads to their attention output."""
    T, d, H, hd = cfg.T, cfg.d, cfg.heads, cfg.head_dim

    def norm(t, name):
        return jg.layer_norm(t, 1e-5, weight=P[name + ".g"], bias=P[name + ".b"])

    def split_heads(t):                   # (B, T, d) -> (B, H, T, hd)
        return jg.transpose(jg.reshape(t, (batch, T, H, hd)), (0, 2, 1, 3))

    x = jg.embedding(P["wte"], idx) + P["wpe"]
    for i in range(cfg.layers):
        p = f"h{i}."
        h = norm(x, p + "ln1")
        q, k, v = (split_heads(h @ P[p + "w" + c] + P[p + "b" + c]) for c in "qkv")
        y = jg.reshape(jg.transpose(attend(q, k, v), (0, 2, 1, 3)), (batch, T, d))
        x = x + (y @ P[p + "wo"] + P[p + "bo"])
        h = norm(x, p + "ln2")
        x = x + (jg.gelu(h @ P[p + "w1"] + P[p + "b1"]) @ P[p + "w2"] + P[p + "b2"])
    return norm(x, "lnf") @ P["lm"]


def jg_gpt(w, cfg, per_row_targets=False, **backward_kwargs):
    """The GPT in jitgraph with unfused attention (a causal mask const and softmax), fwd+bwd
    to the mean cross entropy: returns (bwd, idx input, one-hot targets input, {name: param}).
    The targets input is (B * T, vocab), or with ``per_row_targets`` (B, T, vocab), so that
    both inputs have the batch axis first (DataParallel shards them)."""
    fwd, idx, targets, P = gpt_forward(w, cfg, per_row_targets)
    return jg.build_backward(fwd, **backward_kwargs), idx, targets, P


def gpt_forward(w, cfg, per_row_targets=False):
    """jg_gpt's forward program: (fwd, idx input, targets input, {name: param})."""
    B, T = cfg.batch, cfg.T
    g = jg.Graph(np.float32)
    P = {k: g.param(v, name=k) for k, v in w.items()}
    idx = g.input((B, T), name="idx", dtype=np.int64)
    targets = g.input((B, T, cfg.vocab) if per_row_targets else (B * T, cfg.vocab), name="targets")
    # causal: a large negative score above the diagonal, so softmax gives those keys 0
    mask = g.const(np.triu(np.full((T, T), -1e9, np.float32), 1))

    def attend(q, k, v):
        scores = (q @ jg.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(cfg.head_dim)) + mask
        return jg.softmax(scores, -1) @ v

    logits = jg.reshape(gpt_logits(P, idx, cfg, B, attend), (B * T, cfg.vocab))
    flat = jg.reshape(targets, (B * T, cfg.vocab)) if per_row_targets else targets
    return jg.build_forward(jg.cross_entropy(logits, flat)), idx, targets, P


def torch_gpt(torch, w, cfg):
    """The same GPT in PyTorch eager as minGPT writes it (manual attention, masked_fill,
    F.softmax, F.layer_norm, F.gelu, F.cross_entropy on integer targets), on copies of
    the same weights.  Returns (run(idx, targets) -> loss after loss.backward(), {name: param})."""
    F = torch.nn.functional
    B, T, d, H, hd = cfg.batch, cfg.T, cfg.d, cfg.heads, cfg.head_dim
    P = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def norm(t, name):
        return F.layer_norm(t, (d,), P[name + ".g"], P[name + ".b"], 1e-5)

    def split_heads(t):
        return t.view(B, T, H, hd).transpose(1, 2)

    def run(idx, targets):
        for p in P.values():
            p.grad = None                 # what optimizer.zero_grad(set_to_none=True) does
        x = P["wte"][idx] + P["wpe"]
        for i in range(cfg.layers):
            p = f"h{i}."
            h = norm(x, p + "ln1")
            q, k, v = (split_heads(h @ P[p + "w" + c] + P[p + "b" + c]) for c in "qkv")
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, d)
            x = x + (y @ P[p + "wo"] + P[p + "bo"])
            h = norm(x, p + "ln2")
            x = x + (F.gelu(h @ P[p + "w1"] + P[p + "b1"]) @ P[p + "w2"] + P[p + "b2"])
        logits = (norm(x, "lnf") @ P["lm"]).view(B * T, cfg.vocab)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        return loss
    return run, P
