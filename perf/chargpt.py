"""Workload (i) of ``jitgraph bench``: a char-level GPT written with ``jg.attention`` (fused,
causal, no T x T tensor in the plan) and integer targets, trained on jitgraph's own
source files.

Three things in one run:

* fwd+bwd of a training step, jitgraph beside PyTorch eager (its fused
  ``F.scaled_dot_product_attention``) on the same float32 weights, at 1 and 2 threads;
* a few hundred AdamW steps on random windows of the text, once plainly and once with
  ``checkpoints="sqrt"``: the loss must fall, and the two runs must give the same losses
  and the same final parameters bit for bit;
* a sample of text from the trained model (temperature sampling, fixed seed).
"""
import math
import time
from pathlib import Path

import numpy as np

import jitgraph as jg

from .agreement import agreement, md_agreement
from .harness import Target, Workload, add_torch_compile, ratio_at, timed_by_threads
from .models import GPTConfig, gpt_logits, gpt_weights
from .report import fmt_s, md_by_threads

THREADS = (1, 2)
GRAD_OF = "h0.wq"


def corpus():
    """jitgraph's own Python sources, concatenated in a fixed order; (text, characters)."""
    root = Path(jg.__file__).parent
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py")))
    return text, sorted(set(text))


def config(quick, vocab):
    if quick:
        return GPTConfig(layers=1, d=32, heads=2, vocab=vocab, T=16, batch=4), 20
    return GPTConfig(layers=4, d=128, heads=4, vocab=vocab, T=64, batch=16), 300


def windows(codes, cfg, count, rng):
    """``count`` random windows of T + 1 characters: (inputs (count, T), targets (count, T))."""
    starts = rng.integers(0, len(codes) - cfg.T - 1, count)
    w = codes[starts[:, None] + np.arange(cfg.T + 1)[None, :]]
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def causal_attention(q, k, v):
    return jg.attention(q, k, v, causal=True)


def jg_chargpt(w, cfg, **backward_kwargs):
    """(bwd, idx input (B, T), targets input (B, T) int, {name: param})."""
    g = jg.Graph(np.float32)
    P = {k: g.param(v, name=k) for k, v in w.items()}
    idx = g.input((cfg.batch, cfg.T), name="idx", dtype=np.int64)
    targets = g.input((cfg.batch, cfg.T), name="targets", dtype=np.int64)
    loss = jg.cross_entropy(gpt_logits(P, idx, cfg, cfg.batch, causal_attention), targets)
    return jg.build_backward(jg.build_forward(loss), **backward_kwargs), idx, targets, P


def torch_chargpt(torch, w, cfg):
    """The same model in PyTorch eager with F.scaled_dot_product_attention(is_causal=True)."""
    F = torch.nn.functional
    B, T, d, H, hd = cfg.batch, cfg.T, cfg.d, cfg.heads, cfg.head_dim
    P = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}

    def norm(t, name):
        return F.layer_norm(t, (d,), P[name + ".g"], P[name + ".b"], 1e-5)

    def run(idx, targets):
        for p in P.values():
            p.grad = None
        x = P["wte"][idx] + P["wpe"]
        for i in range(cfg.layers):
            p = f"h{i}."
            h = norm(x, p + "ln1")
            q, k, v = ((h @ P[p + "w" + c] + P[p + "b" + c]).view(B, T, H, hd).transpose(1, 2) for c in "qkv")
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
            x = x + (y @ P[p + "wo"] + P[p + "bo"])
            h = norm(x, p + "ln2")
            x = x + (F.gelu(h @ P[p + "w1"] + P[p + "b1"]) @ P[p + "w2"] + P[p + "b2"])
        logits = norm(x, "lnf") @ P["lm"]
        loss = F.cross_entropy(logits.view(B * T, cfg.vocab), targets.view(-1))
        loss.backward()
        return loss
    return run, P


def train(w, cfg, steps, data, **backward_kwargs):
    """AdamW on ``data`` (inputs, targets), one pass of ``steps`` batches in order; returns
    (losses, {name: final param value})."""
    bwd, idx, targets, P = jg_chargpt(w, cfg, **backward_kwargs)
    opt = jg.optim.AdamW(list(P.values()), lr=3e-3, weight_decay=0.0, clip_norm=1.0)
    n = steps * cfg.batch
    losses = jg.train(bwd, opt, {idx: data[0][:n], targets: data[1][:n]}, epochs=1, batch_size=cfg.batch,
                      shuffle=False, progress=False)
    return losses, {k: p.value.copy() for k, p in P.items()}


def sample(params, cfg, chars, prompt, length, temperature=0.8, seed=0):
    """``length`` characters sampled after ``prompt`` (>= T characters) by the trained model."""
    g = jg.Graph(np.float32)
    P = {k: g.const(v, name=k) for k, v in params.items()}
    idx = g.input((1, cfg.T), name="idx", dtype=np.int64)
    fwd = jg.build_forward(gpt_logits(P, idx, cfg, 1, causal_attention))
    code = {c: i for i, c in enumerate(chars)}
    ids = [code[c] for c in prompt if c in code]
    rng = np.random.default_rng(seed)
    for _ in range(length):
        z = fwd.run({idx: np.array([ids[-cfg.T:]])})[0, -1].astype(np.float64) / temperature
        p = np.exp(z - z.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return "".join(chars[i] for i in ids[-length:])


def run(ctx):
    text, chars = corpus()
    code = {c: i for i, c in enumerate(chars)}
    codes = np.fromiter((code[c] for c in text), np.int64, len(text))
    cfg, steps = config(ctx.quick, len(chars))
    w = gpt_weights(cfg)
    rng = np.random.default_rng(1)
    data = windows(codes, cfg, steps * cfg.batch, rng)

    ctx.note("train plain")
    t0 = time.perf_counter()
    losses, final = train(w, cfg, steps, data)
    train_s = time.perf_counter() - t0
    ctx.note("train sqrt")
    t0 = time.perf_counter()
    losses_ck, final_ck = train(w, cfg, steps, data, checkpoints="sqrt")
    train_ck_s = time.perf_counter() - t0
    k = max(1, steps // 10)
    text_out = sample(final, cfg, chars, text[:cfg.T], 160 if not ctx.quick else 20)

    bwd, idx_in, tgt_in, P = jg_chargpt(w, cfg)
    feeds = {idx_in: data[0][:cfg.batch], tgt_in: data[1][:cfg.batch]}
    jg_loss = float(bwd.run(feeds))
    fns = {"jitgraph": lambda: bwd.run(feeds)}
    refs = {}
    if ctx.torch is not None:
        trun, tparams = torch_chargpt(ctx.torch, w, cfg)
        ti, tt = ctx.torch.from_numpy(feeds[idx_in]), ctx.torch.from_numpy(feeds[tgt_in])
        refs["torch"] = (trun(ti, tt).item(), tparams[GRAD_OF].grad.numpy().copy())
        fns["torch"] = lambda: trun(ti, tt)
    compiled = add_torch_compile(ctx, fns, torch_chargpt(ctx.torch, w, cfg)[0], ti, tt) if ctx.torch else None
    res = timed_by_threads(ctx, fns, THREADS)
    res["torch_compile"] = compiled or "not run: torch is not installed"
    res.update({
        "title": f"(i) char-level GPT with jg.attention: {cfg.layers} layers, d = {cfg.d}, {cfg.heads} heads, "
                 f"T = {cfg.T}, B = {cfg.batch}, vocab {cfg.vocab}, float32, fwd+bwd",
        "what": "fused causal attention (jg.attention) and integer targets; trained with AdamW (lr 3e-3, clip 1) "
                "on random windows of jitgraph's own source; torch: eager with F.scaled_dot_product_attention "
                "(is_causal=True), the same float32 weights",
        "agreement": agreement(jg_loss, P[GRAD_OF].grad, refs, GRAD_OF),
        "training": {"steps": steps, "first_loss": float(np.mean(losses[:k])), "last_loss": float(np.mean(losses[-k:])),
                     "plain_s": train_s, "sqrt_s": train_ck_s,
                     "sqrt_bit_identical": bool(np.array_equal(losses, losses_ck)
                                                and all(np.array_equal(final[n], final_ck[n]) for n in final)),
                     "chance_loss": math.log(cfg.vocab), "sample": text_out},
    })
    return res


def markdown(res):
    t = res["training"]
    ratios = [f"{e['threads']} thr {e['timing']['ratios']['jitgraph/torch']['median']:.3g}"
              for e in res["by_threads"] if "jitgraph/torch" in e["timing"]["ratios"]]
    return (md_by_threads(res)
            + ["", "jitgraph / torch: " + (", ".join(ratios) or "torch not available") + ".",
               "", md_agreement(res["agreement"]),
               "", f"Training, {t['steps']} AdamW steps: loss {t['first_loss']:.3f} (first tenth) -> "
                   f"{t['last_loss']:.3f} (last tenth), chance {t['chance_loss']:.3f}; plain {fmt_s(t['plain_s'])}, "
                   f"sqrt checkpointing {fmt_s(t['sqrt_s'])}; losses and final parameters bit-identical: "
                   f"{'yes' if t['sqrt_bit_identical'] else 'NO'}.",
               "", "Sample:", "", "```", t["sample"], "```"])


def plot(res, plots, key):
    plots.by_threads(f"{key}.png", res["title"], res)


WORKLOAD = Workload("i", "char-level GPT with jg.attention: fwd+bwd beside torch, training, sample", run, markdown,
                    plot, tuple(Target(f"jitgraph / torch at {n} thread{'s' if n > 1 else ''}", 1.0, ratio_at(n))
                                for n in THREADS))
