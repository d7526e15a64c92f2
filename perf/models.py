"""The relu chain x -> relu(h @ W_i), i = 1..N -> mean(h) that several workloads share:
its weights, its jitgraph, numpy and torch versions, and its timed build phases.
jitgraph's public API only."""
import time

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
