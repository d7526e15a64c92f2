"""The gradient graphs and values that pin jitgraph's gradient rules: every case of
tests/naive.py (first and second order), and the GPT, ResNet, char-GPT and relu-chain
workloads of perf/ (plain and checkpointed), each built the same way every time.

``python -m tests.rule_graphs record`` wrote tests/fixtures/rule_graphs.npz from the
tree before the rules became programs ([1/6], at commit 8490958);
tests/test_rule_programs.py builds the same cases with today's tree and checks that
every node (op, sources, shape, params, flags, origin, rule) and every gradient bit is
what it was.
"""
import functools
import os
import sys

import numpy as np

import jitgraph as jg
from jitgraph.ir import F_INDEX, FIELDS
from jitgraph.registry import OPS

from .naive import REF, build

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "rule_graphs.npz")


@functools.lru_cache(maxsize=1)
def _recorded():
    """The ops of the fixture, sorted by name (none before it is written)."""
    if not os.path.exists(FIXTURE):
        return ()
    with np.load(FIXTURE) as f:
        return tuple(sorted({k.split(":")[0][len("first."):] for k in f.files if k.startswith("first.")}))


def _seed(name):
    """The example's seed: the case's place among the ops recorded in the fixture (sorted by
    name, as when it was recorded), so an op added since changes no other case's values."""
    recorded = _recorded() or tuple(sorted(REF))
    if name in recorded:
        return recorded.index(name)
    return len(recorded) + sorted(set(REF) - set(recorded)).index(name)


def _naive(name):
    """(bwd of the case's example reduced to a weighted sum, feeds, params), float64."""
    case = REF[name]
    rng = np.random.default_rng(_seed(name))
    args = [np.asarray(a) for a in case.args(rng)]
    g = jg.Graph(np.float64)
    floats = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    wrt = list(case.wrt) if case.wrt is not None else floats
    tensors = [g.param(a, name=f"a{i}") if i in wrt else g.const(a, name=f"a{i}") for i, a in enumerate(args)]
    out = build(name, OPS_BUILDER[name], tensors, case.kw)
    loss = jg.sum(out * g.const(rng.uniform(0.5, 1.5, out.shape)))
    return g, loss, [t for i, t in enumerate(tensors) if i in wrt]


OPS_BUILDER = {op.name: op.builder for op in OPS.values() if op.builder is not None}


def naive_first(name):
    g, loss, params = _naive(name)
    return g, jg.build_backward(jg.build_forward(loss)), {}


def naive_second(name):
    """A Hessian-vector product through the case's gradient graph: every rule of the
    derivative ops its rule emits runs too."""
    g, loss, params = _naive(name)
    grads = jg.grad(loss, params)
    rng = np.random.default_rng(99)
    total = None
    for p, gp in zip(params, grads):
        term = jg.sum(gp * g.const(rng.uniform(-1, 1, p.shape)))
        total = term if total is None else total + term
    return g, jg.build_backward(jg.build_forward(total)), {}


def naive_no_zero_table(name):
    g, loss, params = _naive(name)
    return g, jg.build_backward(jg.build_forward(loss), zero_table=False), {}


def _perf():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    import perf.chargpt as chargpt
    import perf.models as models
    import perf.resnet as resnet
    return models, resnet, chargpt


def gpt(**kw):
    models, _, _ = _perf()
    cfg = models.GPTConfig(layers=2, d=16, heads=2, vocab=11, T=8, batch=2)
    bwd, idx, targets, P = models.jg_gpt(models.gpt_weights(cfg, seed=3), cfg, **kw)
    i, _, onehot = models.gpt_batch(cfg, np.random.default_rng(4))
    return bwd.graph, bwd, {idx: i, targets: onehot}


def chargpt(**kw):
    models, _, chargpt_ = _perf()
    cfg = models.GPTConfig(layers=2, d=16, heads=2, vocab=13, T=8, batch=2)
    bwd, idx, targets, P = chargpt_.jg_chargpt(models.gpt_weights(cfg, seed=5), cfg, **kw)
    rng = np.random.default_rng(6)
    return bwd.graph, bwd, {idx: rng.integers(0, 13, (2, 8)), targets: rng.integers(0, 13, (2, 8))}


def resnet(**kw):
    _, resnet_, _ = _perf()
    cfg = resnet_.ResNetConfig(n=1, batch=2, size=8)
    P, R = resnet_.resnet_weights(cfg, seed=7)
    bwd, x, labels, _, _ = resnet_.jg_resnet(P, R, cfg, **kw)
    images, y = resnet_.resnet_batch(cfg, np.random.default_rng(8))
    return bwd.graph, bwd, {x: images, labels: y}


def chain(**kw):
    models, _, _ = _perf()
    rng = np.random.default_rng(9)
    xb = rng.standard_normal((4, 8)).astype(np.float32)
    _, params, bwd = models.jg_chain(models.chain_weights(12, 8, xb, rng), xb, **kw)
    return bwd.graph, bwd, {bwd.graph.tensor("x"): xb}


def cases():
    """{key: () -> (graph, backward program, feeds)}, in a fixed order."""
    out = {}
    for name in sorted(REF):
        out[f"first.{name}"] = lambda name=name: naive_first(name)
        if REF[name].grad:
            out[f"second.{name}"] = lambda name=name: naive_second(name)
    for name in ("mul", "div", "where", "concat", "softmax_d", "layer_norm_affine", "batch_norm", "attention"):
        out[f"nozero.{name}"] = lambda name=name: naive_no_zero_table(name)
    for model in (gpt, chargpt, resnet, chain):
        out[f"{model.__name__}.plain"] = lambda model=model: model()
        out[f"{model.__name__}.sqrt"] = lambda model=model: model(checkpoints="sqrt")
    out["chain.revolve"] = lambda: chain(checkpoints="revolve", slots=2)
    out["chain.policy"] = lambda: chain(policy="save_matmuls")
    out["resnet.budget"] = lambda: resnet(memory_budget=_peak(resnet) * 4 // 5)
    out["gpt.budget"] = lambda: gpt(memory_budget=_peak(gpt) // 2)
    return out


def _peak(model):
    return model()[1].peak_bytes


def snapshot(make):
    """{field: array} of a case: every node of its graph and the loss and gradients of
    one run, or {"error": message} when building raises."""
    try:
        g, bwd, feeds = make()
    except jg.GraphError as e:
        return {"error": np.array(str(e))}
    n = g.nodes.n
    out = {f: getattr(g.nodes, f)[:n].copy() for f in FIELDS}
    out["opname"] = np.array([OPS[int(c)].name for c in g.nodes.op[:n]])
    feeds = {t: (v if g.nodes.flags[t.id] & F_INDEX else np.asarray(v, g.dtype)) for t, v in feeds.items()}
    loss = bwd.run(feeds)
    grads = [bwd.grad(g.tensor(p)).ravel() for p in bwd.params if bwd.grad_nodes[bwd.params.index(p)] >= 0]
    out["values"] = np.concatenate([np.atleast_1d(loss).ravel()] + grads).astype(g.dtype)
    return out


def record(path=FIXTURE):
    arrays = {}
    for key, make in cases().items():
        for field, value in snapshot(make).items():
            arrays[f"{key}:{field}"] = value
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez_compressed(path, **arrays)
    return len(arrays)


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    print(record(), "arrays written to", FIXTURE)
