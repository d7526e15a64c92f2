"""Random graph programs for property tests.

A program is a list of instructions over 2-D values.  ``build`` turns it into
jitgraph nodes; ``evaluate`` runs the same program in plain numpy (float64), so a
test can compare the forward result with a naive reference, differentiate it,
checkpoint it, or check its memory plan.  Ops whose domain is restricted get a
squashed operand (exp(tanh v), log(v^2 + 1), a / (b^2 + 1)) so values stay finite.
"""
import math

import numpy as np
from hypothesis import strategies as st
from scipy.special import erf

import jitgraph as jg

DIMS = (1, 2, 3, 4)
UNARY = ("neg", "sqr", "exp", "log", "sqrt", "abs", "relu", "gelu", "silu", "tanh", "sigmoid", "scale",
         "dropout", "copy")
BINARY = ("add", "sub", "mul", "div")
ROWWISE = ("softmax", "log_softmax", "layer_norm", "rms_norm")
REDUCE = ("sum", "mean", "max")


@st.composite
def programs(draw, max_steps=12, max_params=3):
    """(param shapes, instructions).  Each instruction appends one value."""
    shapes = [(draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS)))
              for _ in range(draw(st.integers(1, max_params)))]
    vals = list(shapes)
    prog = []
    for _ in range(draw(st.integers(1, max_steps))):
        i = draw(st.integers(0, len(vals) - 1))
        a = vals[i]
        kind = draw(st.sampled_from(("unary", "unary", "binary", "binary", "matmul", "reduce", "rowwise",
                                     "transpose", "reshape", "concat", "shape_ops", "embedding", "xent", "bmm")))
        if kind == "unary":
            prog.append((draw(st.sampled_from(UNARY)), i))
            vals.append(a)
        elif kind == "binary":
            j = draw(st.integers(0, len(vals) - 1))
            b = vals[j]
            if all(x == y or x == 1 or y == 1 for x, y in zip(a, b)):
                prog.append((draw(st.sampled_from(BINARY)), i, j))
                vals.append(tuple(max(x, y) for x, y in zip(a, b)))
            else:
                prog.append(("neg", i))
                vals.append(a)
        elif kind == "matmul":
            n = draw(st.sampled_from(DIMS))
            prog.append(("matmul_param", i, n))      # a @ (new param of shape (a[1], n))
            vals.append((a[0], n))
        elif kind == "reduce":
            axis = draw(st.integers(0, 1))
            prog.append((draw(st.sampled_from(REDUCE)), i, axis))
            vals.append((1, a[1]) if axis == 0 else (a[0], 1))
        elif kind == "rowwise":
            prog.append((draw(st.sampled_from(ROWWISE)), i))
            vals.append(a)
        elif kind == "transpose":
            prog.append(("transpose", i))
            vals.append((a[1], a[0]))
        elif kind == "reshape":
            prog.append(("reshape", i))
            vals.append((1, a[0] * a[1]))
        elif kind == "concat":
            j = draw(st.integers(0, len(vals) - 1))
            b = vals[j]
            if a[1] == b[1]:
                prog.append(("concat", i, j))
                vals.append((a[0] + b[0], a[1]))
            else:
                prog.append(("tanh", i))
                vals.append(a)
        elif kind == "shape_ops":
            op = draw(st.sampled_from(("slice", "pad", "broadcast")))
            prog.append((op, i))
            vals.append(_shape_after((op, i), vals))
        elif kind == "embedding":
            rows = draw(st.integers(1, 4))
            prog.append(("embedding_param", i, rows))     # rows of a new (5, a[1]) table, fixed indices
            vals.append((rows, a[1]))
        elif kind == "xent":
            prog.append(("xent", i))                      # cross_entropy(a, fixed targets) as a (1, 1) value
            vals.append((1, 1))
        else:
            n = draw(st.sampled_from(DIMS))
            prog.append(("bmm_param", i, n))              # (1, m, k) @ new (2, k, n) param, summed over the batch
            vals.append((a[0], n))
    outs = draw(st.lists(st.integers(0, len(vals) - 1), min_size=1, max_size=3, unique=True))
    return shapes, prog, outs


def param_values(shapes, prog, seed):
    """Initial values for the program's params (inputs first, then matmul weights)."""
    rng = np.random.default_rng(seed)
    vals = [rng.uniform(-1.5, 1.5, s) for s in shapes]
    cur = list(shapes)
    for ins in prog:
        if ins[0] == "matmul_param":
            vals.append(rng.uniform(-1.0, 1.0, (cur[ins[1]][1], ins[2])))
        elif ins[0] == "bmm_param":
            vals.append(rng.uniform(-1.0, 1.0, (2, cur[ins[1]][1], ins[2])))
        elif ins[0] == "embedding_param":
            vals.append(rng.uniform(-1.0, 1.0, (5, cur[ins[1]][1])))
        cur.append(_shape_after(ins, cur))
    return vals


def _indices(rows):
    return np.arange(rows) * 3 % 5                    # fixed, with a repeat once rows > 5/gcd


def _targets(shape):
    t = np.linspace(0.2, 1.0, shape[0] * shape[1]).reshape(shape)
    return t / t.sum(-1, keepdims=True)


def _shape_after(ins, cur):
    op, i = ins[0], ins[1]
    a = cur[i]
    if op in ("matmul_param", "bmm_param"):
        return (a[0], ins[2])
    if op == "embedding_param":
        return (ins[2], a[1])
    if op == "xent":
        return (1, 1)
    if op == "slice":
        return (a[0], max(a[1] - 1, 1))
    if op == "pad":
        return (a[0] + 1, a[1])
    if op == "broadcast":
        return (3, a[1]) if a[0] == 1 else a
    if op in BINARY:
        b = cur[ins[2]]
        return tuple(max(x, y) for x, y in zip(a, b))
    if op in REDUCE:
        return (1, a[1]) if ins[2] == 0 else (a[0], 1)
    if op == "transpose":
        return (a[1], a[0])
    if op == "reshape":
        return (1, a[0] * a[1])
    if op == "concat":
        return (a[0] + cur[ins[2]][0], a[1])
    return a


def loss_weights(prog_out_shapes, seed):
    rng = np.random.default_rng(seed + 1)
    return [rng.uniform(0.5, 1.5, s) for s in prog_out_shapes]


# ---- jitgraph ---------------------------------------------------------------------------
def build(shapes, prog, outs, params, weights=None, dtype=np.float64):
    """Build the program in a new graph.  Returns (graph, param tensors, values, loss)."""
    g = jg.Graph(dtype)
    ps = [g.param(v, name=f"p{k}") for k, v in enumerate(params)]
    vals, loss = build_into(ps, shapes, prog, outs, weights)
    return g, ps, vals, loss


def build_into(ps, shapes, prog, outs, weights=None):
    """The program over existing param tensors ``ps``: (values, loss)."""
    g = ps[0].graph
    vals = list(ps[: len(shapes)])
    nxt = len(shapes)
    for ins in prog:
        op = ins[0]
        a = vals[ins[1]]
        if op == "matmul_param":
            out = a @ ps[nxt]
            nxt += 1
        elif op == "bmm_param":
            out = jg.sum(jg.reshape(a, (1,) + a.shape) @ ps[nxt], axis=0)
            nxt += 1
        elif op == "embedding_param":
            out = jg.embedding(ps[nxt], _indices(ins[2]))
            nxt += 1
        elif op == "xent":
            out = jg.reshape(jg.cross_entropy(a, g.const(_targets(a.shape))), (1, 1))
        else:
            out = _jg_op(op, a, vals[ins[2]] if op in BINARY or op == "concat" else ins[2] if len(ins) > 2 else None)
        vals.append(out)
    loss = None
    for k, i in enumerate(outs):
        v = vals[i]
        term = jg.mean(v * g.const(weights[k])) if weights is not None else jg.mean(v)
        loss = term if loss is None else loss + term
    return vals, loss


def _jg_op(op, a, b):
    if op in BINARY:
        if op == "div":
            return a / (jg.sqr(b) + 1.0)
        return {"add": jg.add, "sub": jg.sub, "mul": jg.mul}[op](a, b)
    if op in REDUCE:
        return getattr(jg, op)(a, axis=b, keepdims=True)
    if op == "exp":
        return jg.exp(jg.tanh(a))
    if op == "log":
        return jg.log(jg.sqr(a) + 1.0)
    if op == "sqrt":
        return jg.sqrt(jg.sqr(a) + 1.0)
    if op == "scale":
        return jg.scale(a, -1.5)
    if op == "dropout":
        return jg.dropout(a, 0.3, seed=11)
    if op == "transpose":
        return jg.transpose(a)
    if op == "copy":
        return jg.copy(a)
    if op == "slice":
        return jg.slice_axis(a, 1, 0, a.shape[1] - 1) if a.shape[1] > 1 else a
    if op == "pad":
        return jg.pad_axis(a, 0, 1, 0)
    if op == "broadcast":
        return jg.broadcast_to(a, (3, a.shape[1])) if a.shape[0] == 1 else a
    if op == "reshape":
        return jg.reshape(a, (1, a.size))
    if op == "concat":
        return jg.concat([a, b], axis=0)
    if op in ("layer_norm", "rms_norm"):
        return getattr(jg, op)(a, 1e-5)
    return getattr(jg, op)(a)


# ---- numpy reference ------------------------------------------------------------------------
def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def evaluate(shapes, prog, outs, params, weights, dropout_masks=None):
    """The loss in numpy float64.  Dropout needs the masks jitgraph drew (by value index)."""
    vals = list(params[: len(shapes)])
    nxt = len(shapes)
    for k, ins in enumerate(prog):
        op, a = ins[0], vals[ins[1]]
        if op == "matmul_param":
            out = a @ params[nxt]
            nxt += 1
        elif op == "bmm_param":
            out = (a[None] @ params[nxt]).sum(0)
            nxt += 1
        elif op == "embedding_param":
            out = params[nxt][_indices(ins[2])]
            nxt += 1
        elif op == "xent":
            e = np.exp(a - a.max(-1, keepdims=True))
            out = np.array([[-(_targets(a.shape) * np.log(e / e.sum(-1, keepdims=True))).sum(-1).mean()]])
        elif op in BINARY:
            b = vals[ins[2]]
            out = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / (b * b + 1.0)}[op]
        elif op in REDUCE:
            out = {"sum": np.sum, "mean": np.mean, "max": np.max}[op](a, axis=ins[2], keepdims=True)
        elif op == "concat":
            out = np.concatenate([a, vals[ins[2]]], axis=0)
        elif op == "dropout":
            out = a * dropout_masks[len(shapes) + k] / 0.7
        else:
            out = _np_unary(op, a)
        vals.append(out)
    return sum(np.mean(vals[i] * w) for i, w in zip(outs, weights))


def _np_unary(op, a):
    if op == "neg":
        return -a
    if op == "sqr":
        return a * a
    if op == "exp":
        return np.exp(np.tanh(a))
    if op == "log":
        return np.log(a * a + 1)
    if op == "sqrt":
        return np.sqrt(a * a + 1)
    if op == "abs":
        return np.abs(a)
    if op == "relu":
        return np.maximum(a, 0)
    if op == "gelu":
        return 0.5 * a * (1 + erf(a / math.sqrt(2)))
    if op == "silu":
        return a * _sigmoid(a)
    if op == "tanh":
        return np.tanh(a)
    if op == "sigmoid":
        return _sigmoid(a)
    if op == "scale":
        return -1.5 * a
    if op == "transpose":
        return a.T
    if op == "copy":
        return a.copy()
    if op == "slice":
        return a[:, : a.shape[1] - 1] if a.shape[1] > 1 else a
    if op == "pad":
        return np.pad(a, [(1, 0), (0, 0)])
    if op == "broadcast":
        return np.broadcast_to(a, (3, a.shape[1])) if a.shape[0] == 1 else a
    if op == "reshape":
        return a.reshape(1, -1)
    if op in ("softmax", "log_softmax"):
        e = np.exp(a - a.max(-1, keepdims=True))
        s = e / e.sum(-1, keepdims=True)
        return s if op == "softmax" else np.log(s)
    if op == "layer_norm":
        mu = a.mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    if op == "rms_norm":
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-5)
    raise ValueError(op)


def out_shapes(shapes, prog, outs):
    cur = list(shapes)
    for ins in prog:
        cur.append(_shape_after(ins, cur))
    return [cur[i] for i in outs]


def as_function(program, weights):
    """fn(*param tensors) -> loss, for jg.check_grads."""
    shapes, prog, outs = program

    def fn(*ps):
        g = ps[0].graph
        vals, loss = build_into(list(ps), shapes, prog, outs, None)
        return loss if weights is None else _weighted(g, vals, outs, weights)
    return fn


def _weighted(g, vals, outs, weights):
    loss = None
    for k, i in enumerate(outs):
        term = jg.mean(vals[i] * g.const(weights[k]))
        loss = term if loss is None else loss + term
    return loss


def instance(program, seed=0, dtype=np.float64):
    """Build a drawn program with concrete values: (graph, params, vals, loss, numpy inputs)."""
    shapes, prog, outs = program
    params = param_values(shapes, prog, seed)
    weights = loss_weights(out_shapes(shapes, prog, outs), seed)
    g, ps, vals, loss = build(shapes, prog, outs, params, weights, dtype)
    return g, ps, vals, loss, params, weights


def dropout_masks(shapes, prog, vals):
    """The keep-masks jitgraph's dropout nodes drew, by value index (for ``evaluate``)."""
    from jitgraph.ops.nn import dropout_uniform
    masks = {}
    for k, ins in enumerate(prog):
        if ins[0] == "dropout":
            t = vals[len(shapes) + k]
            u = np.array([dropout_uniform(11, t.id, i) for i in range(t.size)])
            masks[len(shapes) + k] = (u >= 0.3).reshape(t.shape)
    return masks
