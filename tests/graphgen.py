"""Random graph programs for property tests, drawn from the op table.

A program is a list of instructions over 2-D values.  Each instruction applies
one op of ``tests/naive.py`` through its fuzz family: ``build`` turns a program
into jitgraph nodes and ``evaluate`` runs it with the numpy references, so a test
can compare forward results, differentiate, checkpoint or check memory plans.
Operands whose op has a restricted domain are squashed first (positive: v*v + 1,
bounded: tanh v), in both builds.

An instruction is ``(op, args, kw)``; ``args`` items are ("v", i, domain) value i,
("p", shape) a new param, ("c", array) a constant.  Results that are not 2-D are
brought back to 2-D (scalars to (1, 1), a leading batch axis summed).
"""
import numpy as np
from hypothesis import strategies as st

import jitgraph as jg
from jitgraph.registry import BY_NAME, NO_GRAD

from .naive import REF, build as build_op, reference

DIMS = (1, 2, 3, 4)
BY_FAMILY = {}
for _name, _case in REF.items():
    BY_FAMILY.setdefault(_case.fuzz, []).append(_name)
FAMILY_DRAWS = tuple(f for f in ("unary", "unary", "binary", "binary", "select", "reduce", "rowwise", "rowpair",
                                  "shape", "shape", "matmul", "gather", "loss", "channels", "attention", "window") if f in BY_FAMILY)
EMBED_ROWS = 5


def _targets(shape):
    t = np.linspace(0.2, 1.0, shape[0] * shape[1]).reshape(shape)
    return t / t.sum(-1, keepdims=True)


def _broadcasts(a, b):
    return all(x == y or x == 1 or y == 1 for x, y in zip(a, b))


@st.composite
def programs(draw, max_steps=12, max_params=3, differentiable=True):
    """(param shapes, instructions, output value indices).  ``differentiable``: only ops
    with a gradient rule (piecewise-constant ones included), for backward properties."""
    shapes = [(draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS)))
              for _ in range(draw(st.integers(1, max_params)))]
    vals = list(shapes)
    prog = []
    for _ in range(draw(st.integers(1, max_steps))):
        family = draw(st.sampled_from(FAMILY_DRAWS))
        choices = [op for op in BY_FAMILY[family] if not differentiable or BY_NAME[op].vjp is not NO_GRAD]
        op = draw(st.sampled_from(choices))
        ins = _draw_instruction(draw, family, op, vals)
        if ins is None:                                   # not applicable to the drawn operands
            ins = ("neg", (("v", draw(st.integers(0, len(vals) - 1)), "any"),), {})
        prog.append(ins)
        vals.append(_shape_of(ins, vals))
    outs = draw(st.lists(st.integers(0, len(vals) - 1), min_size=1, max_size=3, unique=True))
    return shapes, prog, outs


def _value(draw, vals):
    return draw(st.integers(0, len(vals) - 1))


def _draw_instruction(draw, family, op, vals):
    case = REF[op]
    i = _value(draw, vals)
    a = vals[i]
    if op == "layer_norm_affine":                         # the value's rows, a weight and a bias
        return op, (("v", i, "any"), ("p", (a[1],)), ("p", (a[1],))), dict(case.kw)
    if family in ("unary", "rowwise"):
        return op, (("v", i, case.domain),), dict(case.kw)
    if family == "rowpair":                               # a gradient and a same-shaped value
        same = [j for j, s in enumerate(vals) if s == a and j != i]
        j = draw(st.sampled_from(same)) if same else i
        return op, (("v", i, "any"), ("v", j, "any")), dict(case.kw)
    if family == "binary":
        j = _value(draw, vals)
        if not _broadcasts(a, vals[j]):
            return None
        return op, (("v", i, "any"), ("v", j, case.domain)), dict(case.kw)
    if family == "reduce":
        kw = {"axis": draw(st.integers(0, 1))}
        if "keepdims" in case.kw:
            kw["keepdims"] = True
        return op, (("v", i, "any"),), kw
    if family == "shape":
        n_values = case.fuzz_kw.__code__.co_argcount              # how many operands it takes
        idx = [i] + [_value(draw, vals) for _ in range(n_values - 1)]
        kw = case.fuzz_kw(*[vals[k] for k in idx])
        if kw is None:
            return None
        return op, tuple(("v", k, "any") for k in idx), kw
    if family == "select":
        j, k = _value(draw, vals), _value(draw, vals)
        out = np.broadcast_shapes(a, vals[j], vals[k]) if _broadcasts(a, vals[j]) and _broadcasts(
            a, vals[k]) and _broadcasts(vals[j], vals[k]) else None
        if out is None:
            return None
        mask = (np.arange(int(np.prod(out))) % 3 == 0).astype(float).reshape(out)
        return op, (("c", mask), ("v", j, "any"), ("v", k, "any")), dict(case.kw)
    if family == "matmul":
        n = draw(st.sampled_from(DIMS))
        if draw(st.booleans()):                           # a @ W
            return op, (("v", i, "any"), ("p", (a[1], n))), {}
        return op, (("v", i, "any", "batch"), ("p", (2, a[1], n))), {}    # (1, m, k) @ (2, k, n), batch summed
    if family == "gather":
        if op == "embedding":
            rows = draw(st.integers(1, 4))
            return op, (("p", (EMBED_ROWS, a[1])), ("c", np.arange(rows) * 3 % EMBED_ROWS)), {}
        return op, (("v", i, "any"), ("c", np.arange(a[0]) * 2 % EMBED_ROWS)), {"n_rows": EMBED_ROWS}
    if family == "loss":
        if op == "cross_entropy_d":                      # logits, targets and the loss's scalar gradient
            return op, (("v", i, "any"), ("c", _targets(a)), ("c", np.array(0.5))), {}
        classes = np.arange(a[0]) * 3 % a[1]             # integer class ids, one per row
        if op == "cross_entropy_index":
            return op, (("v", i, "any"), ("c", classes)), {"ignore_index": int(classes[-1]) if a[0] > 2 else None}
        if op == "cross_entropy_index_d":
            return op, (("v", i, "any"), ("c", classes), ("c", np.array(0.5))), {"ignore_index": None}
        return op, (("v", i, "any"), ("c", _targets(a))), {}
    if family == "channels":                              # batch norm over axis 1 of a value (N, C)
        N, C = a
        if op == "batch_norm":                            # training needs two values per channel
            return (op, (("v", i, "any"), ("p", (C,)), ("p", (C,))), dict(case.kw)) if N > 1 else None
        if op == "batch_stats":
            return op, (("v", i, "any"),), {}
        same = [j for j, s in enumerate(vals) if s == a and j != i]
        j = draw(st.sampled_from(same)) if same else i
        stats = np.stack([np.linspace(-0.5, 0.5, C), np.linspace(0.5, 1.5, C)])
        if op == "batch_norm_sums":
            return op, (("v", i, "any"), ("v", j, "any"), ("c", stats)), dict(case.kw)
        sums = np.concatenate([stats, np.stack([np.linspace(-1, 1, C), np.linspace(1, -0.5, C)])])
        return op, (("v", i, "any"), ("v", j, "any"), ("c", sums), ("p", (C,))), dict(case.kw)
    if family == "attention":                            # value i as one head's queries (Tq, d)
        tk, causal = draw(st.sampled_from(DIMS)), draw(st.booleans())
        keys = ("p", (tk, a[1]))
        if op == "attention":                            # new keys and values, or self-attention
            if draw(st.booleans()):
                return op, (("v", i, "any"),) * 3, {"causal": causal}
            return op, (("v", i, "any"), keys, ("p", (tk, a[1]))), {"causal": causal}
        gd = np.linspace(-1.0, 1.0, a[0] * (a[1] + 1)).reshape(a[0], a[1] + 1)    # attention_d: [dO | D]
        return op, (("v", i, "bounded"), keys, ("p", (tk, a[1])), ("c", gd)), {"causal": causal}
    if family == "window":                               # the value as one (1, 1, H, W) image, weights as params
        kw = case.fuzz_kw(a)
        if kw is None:
            return None
        kw = dict(kw)
        return op, (("v", i, "any", "image"),) + tuple(("p", s) for s in kw.pop("params", ())), kw
    raise ValueError(f"unknown fuzz family {family!r}")


def _shape_of(ins, vals):
    """The 2-D shape of an instruction's result (the numpy reference on ones)."""
    op, args, kw = ins
    arrays = []
    for item in args:
        if item[0] == "v":
            arrays.append(_np_domain(np.ones(vals[item[1]]), item))
        elif item[0] == "p":
            arrays.append(np.ones(item[1]))
        else:
            arrays.append(item[1])
    return _to2d_np(_np_ref(op, arrays, kw, None)).shape


def param_values(shapes, prog, seed):
    """Initial values for the program's params (inputs first, then the ops' new params)."""
    rng = np.random.default_rng(seed)
    vals = [rng.uniform(-1.5, 1.5, s) for s in shapes]
    for op, args, kw in prog:
        for item in args:
            if item[0] == "p":
                vals.append(rng.uniform(-1.0, 1.0, item[1]))
    return vals


def out_shapes(shapes, prog, outs):
    cur = list(shapes)
    for ins in prog:
        cur.append(_shape_of(ins, cur))
    return [cur[i] for i in outs]


def loss_weights(prog_out_shapes, seed):
    rng = np.random.default_rng(seed + 1)
    return [rng.uniform(0.5, 1.5, s) for s in prog_out_shapes]


# ---- jitgraph ---------------------------------------------------------------------------
def _jg_domain(t, item):
    domain = item[2]
    if len(item) > 3:                                 # "batch": a leading axis of 1; "image": two
        t = jg.reshape(t, (1,) * (2 if item[3] == "image" else 1) + t.shape)
    if domain == "positive":
        return t * t + 1.0
    if domain == "bounded":
        return jg.tanh(t)
    return t


def _to2d_jg(t):
    if t.ndim == 0:
        return jg.reshape(t, (1, 1))
    if t.ndim == 1:
        return jg.reshape(t, (1, t.shape[0]))
    if t.ndim == 3:
        return jg.sum(t, axis=0)
    if t.ndim == 4:                                   # images: their rows stacked
        return jg.reshape(t, (t.size // t.shape[-1], t.shape[-1]))
    return t


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
    for op, args, kw in prog:
        tensors = []
        for item in args:
            if item[0] == "v":
                tensors.append(_jg_domain(vals[item[1]], item))
            elif item[0] == "p":
                tensors.append(ps[nxt])
                nxt += 1
            else:
                arr = item[1]
                tensors.append(g.const(arr) if arr.dtype.kind == "f" else arr)
        out = build_op(op, BY_NAME[op].builder, tensors, kw)
        vals.append(_to2d_jg(out))
    loss = None
    for k, i in enumerate(outs):
        v = vals[i]
        term = jg.mean(v * g.const(weights[k])) if weights is not None else jg.mean(v)
        loss = term if loss is None else loss + term
    return vals, loss


def as_function(program, weights):
    """fn(*param tensors) -> loss, for jg.check_grads."""
    shapes, prog, outs = program

    def fn(*ps):
        return build_into(list(ps), shapes, prog, outs, weights)[1]
    return fn


def instance(program, seed=0, dtype=np.float64):
    """Build a drawn program with concrete values: (graph, params, vals, loss, numpy params, weights)."""
    shapes, prog, outs = program
    params = param_values(shapes, prog, seed)
    weights = loss_weights(out_shapes(shapes, prog, outs), seed)
    g, ps, vals, loss = build(shapes, prog, outs, params, weights, dtype)
    return g, ps, vals, loss, params, weights


# ---- numpy reference ------------------------------------------------------------------------
def _np_domain(x, item):
    domain = item[2]
    if len(item) > 3:
        x = x.reshape((1,) * (2 if item[3] == "image" else 1) + x.shape)
    if domain == "positive":
        return x * x + 1.0
    if domain == "bounded":
        return np.tanh(x)
    return x


def _to2d_np(x):
    x = np.asarray(x, np.float64)
    if x.ndim == 0:
        return x.reshape(1, 1)
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 3:
        return x.sum(0)
    if x.ndim == 4:
        return x.reshape(-1, x.shape[-1])
    return x


def _np_ref(op, arrays, kw, node):
    if REF[op].node and node is None:                 # a shape probe: any mask will do
        return np.asarray(arrays[0], np.float64)
    return reference(op, arrays, kw, node)


def evaluate(program, params, weights, vals):
    """The loss in numpy float64.  ``vals`` (jitgraph's values) give the nodes of ops
    whose reference needs them (dropout's mask)."""
    shapes, prog, outs = program
    cur = list(params[: len(shapes)])
    nxt = len(shapes)
    for k, (op, args, kw) in enumerate(prog):
        arrays = []
        for item in args:
            if item[0] == "v":
                arrays.append(_np_domain(cur[item[1]], item))
            elif item[0] == "p":
                arrays.append(params[nxt])
                nxt += 1
            else:
                arrays.append(item[1])
        node = _op_node(vals[len(shapes) + k], op) if REF[op].node else None
        cur.append(_to2d_np(_np_ref(op, arrays, kw, node)))
    return sum(np.mean(cur[i] * w) for i, w in zip(outs, weights))


def _op_node(t, op):
    """The node of ``op`` under the 2-D fix-up views of value t."""
    while t.op != op:
        t = t.sources[0]
    return t
