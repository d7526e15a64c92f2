"""Fusion (fuse.py, ops/group.py): connected elementwise nodes run as one group, chunk by
chunk, and give exactly the bits of the unfused program -- for every op of
tests/naive.py with elementwise work around it, in float32 and float64, at 1 and 2
threads, checkpointed or not; the members take no arena slot."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.fuse import FUSE_MIN_ELEMENTS, FUSE_MIN_MEMBERS, FUSE_MIN_NODES, MAX_MEMBERS
from jitgraph.ir import MAX_SRC
from jitgraph.ops.group import CHUNK_ELEMS
from jitgraph.registry import BY_NAME, GROUP, OPS
from jitgraph.threads import BLOCK

from .naive import REF, build
from .rule_graphs import OPS_BUILDER, _seed


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).tobytes()


def run_both(loss, params, feeds=None, **kw):
    """(fused program, [loss and grads]) for the fused and the unfused program."""
    got = []
    for fuse in (True, False):
        bwd = jg.build_backward(jg.build_forward(loss, fuse=fuse), fuse=fuse, **kw)
        value = bwd.run(feeds or {})
        got.append((bwd, [bits(value)] + [bits(bwd.grad(p)) for p in params if p.id in bwd.params]))
    return got


def naive_model(name, dtype):
    """The case's op with elementwise work on both sides (so it joins a group when it fuses)."""
    case = REF[name]
    rng = np.random.default_rng(_seed(name))
    args = [np.asarray(a) for a in case.args(rng)]
    g = jg.Graph(dtype)
    floats = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    wrt = list(case.wrt) if case.wrt is not None else floats
    params = [g.param(a.astype(dtype), name=f"a{i}") if i in wrt else g.const(a, name=f"a{i}")
              for i, a in enumerate(args)]
    tensors = params
    if BY_NAME[name].fuse:                           # a fusable producer for each float operand
        tensors = [t * 1.5 + 0.25 if i in wrt else t for i, t in enumerate(params)]
    out = build(name, OPS_BUILDER[name], tensors, case.kw)
    w = g.const(rng.uniform(0.5, 1.5, out.shape).astype(dtype))
    loss = jg.sum(jg.tanh(out * 0.5) * w)
    return g, loss, [params[i] for i in wrt]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(REF))
def test_fused_equals_unfused_for_every_op(name, dtype):
    g, loss, params = naive_model(name, dtype)
    fused, plain = jg.build_forward(loss, fuse=True), jg.build_forward(loss, fuse=False)
    assert bits(fused.run()) == bits(plain.run()), f"{name}: fused and unfused forward bits differ"
    assert plain.stats()["n_groups"] == 0 and fused.stats()["n_groups"] >= 1   # tanh(out * 0.5) * w at least
    if BY_NAME[name].fuse:                           # the op itself ran inside a group
        inside = {m for ms in fused.groups().values() for m in ms}
        assert any(g.nodes.op[m] == BY_NAME[name].code for m in inside), name
    if REF[name].grad:
        (_, a), (_, b) = run_both(loss, params)
        assert a == b, f"{name}: fused and unfused gradient bits differ"


def mlp(dtype, B=64, D=300):
    rng = np.random.default_rng(0)
    g = jg.Graph(dtype)
    x = g.input((B, D), name="x")
    W = g.param((rng.standard_normal((D, D)) * 0.05).astype(dtype), name="W")
    b = g.param(rng.standard_normal(D).astype(dtype), name="b")
    c = g.param(rng.standard_normal((B, 1)).astype(dtype), name="c")
    h = jg.tanh(x @ W + b) * 2.0 + 1.0
    h = jg.gelu(h) * h - c
    loss = jg.mean(jg.sqr(jg.relu(h @ W + b) + x))
    return g, x, loss, [W, b, c], {x: rng.standard_normal((B, D)).astype(dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_groups_cut_the_forward_peak_and_keep_the_bits(dtype):
    g, x, loss, params, feeds = mlp(dtype)
    fused = jg.build_forward(loss, fuse=True)
    plain = jg.build_forward(loss, fuse=False)
    assert bits(fused.run(feeds)) == bits(plain.run(feeds))
    st = fused.stats()
    assert st["n_groups"] >= 2 and st["n_fused"] >= 6
    assert fused.run_order.size == fused.order.size - st["n_fused"] + st["n_groups"]
    assert fused.peak_bytes <= plain.peak_bytes
    groups = fused.groups()
    for root, members in groups.items():
        assert members[-1] == root and len(members) >= 2
        assert fused.run_table.op[root] == GROUP and g.nodes.op[root] != GROUP      # the graph is not changed
        assert sum(1 for s in fused.run_table.src[root] if s >= 0) <= MAX_SRC
        for m in members[:-1]:
            with pytest.raises(jg.GraphError, match="was fused into the group of .* fuse=False"):
                fused.value_of(m)
    table = {r["id"]: r for r in fused.nodes()}
    for root, members in groups.items():
        assert "group" in table[root]["flags"] and table[root]["loc"] in ("arena", "io")
        assert all((table[m]["loc"], table[m]["offset"]) == ("group", root) for m in members[:-1])
    assert f"group@{root}" in fused.format_table(limit=1000)
    rows = fused.profile(feeds, repeats=1)
    assert any(r["op"].startswith("group(") and "tanh" in r["op"] for r in rows)


def test_members_take_no_arena_slot():
    """a*b + c*d: unfused, both products are live at the add; fused, only the result is."""
    rng = np.random.default_rng(5)
    g = jg.Graph(np.float32)
    a, b, c, d = (g.input((256, 64), name=k) for k in "abcd")
    out = jg.sum(a * b + c * d)
    fused, plain = jg.build_forward(out, fuse=True), jg.build_forward(out, fuse=False)
    buffer = 256 * 64 * 4
    assert plain.peak_bytes >= 2 * buffer and fused.peak_bytes < 2 * buffer
    assert fused.unplanned_bytes < plain.unplanned_bytes
    feeds = {t: rng.standard_normal((256, 64)).astype(np.float32) for t in (a, b, c, d)}
    assert bits(fused.run(feeds)) == bits(plain.run(feeds))
    live = fused.memory_timeline()
    assert live.size == fused.run_order.size and live.max() <= fused.peak_bytes


@pytest.mark.parametrize("checkpoints", [None, "sqrt"])
def test_fused_backward_equals_unfused_checkpointed_or_not(checkpoints):
    g, x, loss, params, feeds = mlp(np.float32)
    (fused, a), (_, b) = run_both(loss, params, feeds, checkpoints=checkpoints)
    assert a == b
    assert fused.stats()["n_groups"] >= 3
    if checkpoints:                                   # and checkpointed == plain, fused
        plain = jg.build_backward(jg.build_forward(loss), fuse=True)
        value = plain.run(feeds)
        assert [bits(value)] + [bits(plain.grad(p)) for p in params] == a


def test_threads_split_groups_with_the_same_bits():
    """Big enough that the interpreter cuts the group into blocks over the threads, and
    neither the tensor nor a block a multiple of the chunk."""
    rng = np.random.default_rng(1)
    n = 2 * BLOCK + 3 * CHUNK_ELEMS + 17
    g = jg.Graph(np.float32)
    x = g.input((n,), name="x")
    s = g.param(rng.standard_normal(1).astype(np.float32), name="s")
    p = g.param(rng.standard_normal(n).astype(np.float32), name="p")
    loss = jg.sum(jg.sigmoid(x * p + s) * jg.exp(x * 0.1) - x)
    feeds = {x: rng.standard_normal(n).astype(np.float32)}
    runs = []
    old = jg.get_num_threads()
    try:
        for threads in (1, 2):
            jg.set_num_threads(threads)
            runs.append(run_both(loss, [s, p], feeds))
    finally:
        jg.set_num_threads(old)
    assert runs[0][0][1] == runs[0][1][1] == runs[1][0][1] == runs[1][1][1]


def test_broadcast_inputs_are_read_as_unfused():
    """Scalars, rows and columns broadcast into a group's chunk, against numpy and unfused."""
    rng = np.random.default_rng(2)
    g = jg.Graph(np.float64)
    x = g.input((5, 3, 7, 300), name="x")
    row = g.param(rng.standard_normal(300), name="row")
    col = g.param(rng.standard_normal((7, 1)), name="col")
    one = g.param(rng.standard_normal((1,)), name="one")
    y = jg.relu(x - row) * col + one
    out = jg.sqrt(jg.abs(y) + 1.0) / (jg.exp(-y) + 1.0)
    xs = rng.standard_normal((5, 3, 7, 300))
    fused, plain = jg.build_forward(out, fuse=True), jg.build_forward(out, fuse=False)
    # y is read twice, so it ends a group: [sub relu mul add] and [abs +1 sqrt neg exp +1 div]
    assert [len(m) for m in fused.groups().values()] == [4, 7]
    yv = np.maximum(xs - row.value, 0) * col.value + one.value
    np.testing.assert_allclose(fused.run({x: xs}), np.sqrt(np.abs(yv) + 1.0) / (np.exp(-yv) + 1.0), rtol=1e-12)
    assert bits(fused.run({x: xs})) == bits(plain.run({x: xs}))


def test_a_group_stops_at_what_must_stay():
    """Outputs, values read twice and gradients the program returns are never members; at
    most MAX_SRC external inputs and MAX_MEMBERS members."""
    rng = np.random.default_rng(3)
    g = jg.Graph(np.float64)
    xs = [g.input((40,), name=f"x{i}") for i in range(MAX_SRC + 2)]
    total = xs[0]
    for x in xs[1:]:
        total = total * x                            # MAX_SRC + 2 inputs: more than one group can take
    twice = jg.exp(total)
    chain = twice
    for _ in range(MAX_MEMBERS + 4):
        chain = jg.tanh(chain)
    out1, out2 = chain + twice, jg.sqr(twice)
    fwd = jg.build_forward([out1, out2], fuse=True)
    feeds = {x: rng.standard_normal(40) for x in xs}
    alone = jg.build_forward([out1, out2], fuse=False)
    assert all(bits(a) == bits(b) for a, b in zip(fwd.run(feeds), alone.run(feeds)))
    groups = fwd.groups()
    members = {m for ms in groups.values() for m in ms[:-1]}
    assert out1.id in groups and twice.id not in members and out2.id not in members
    for root, ms in groups.items():
        assert len(ms) <= MAX_MEMBERS
        assert sum(1 for s in fwd.run_table.src[root] if s >= 0) <= MAX_SRC
    assert len(groups) >= 3                          # the product of six and the long chain are cut


def test_planners_price_fused_programs():
    """memory_budget and pareto measure the plans as they will run: fused."""
    g, x, loss, params, feeds = mlp(np.float32, B=32, D=64)
    fwd = jg.build_forward(loss, fuse=True)
    rows, plain_rows = jg.pareto(fwd, fuse=True), jg.pareto(fwd, fuse=False)
    assert rows[-1]["peak_bytes"] <= plain_rows[-1]["peak_bytes"]
    for row in rows:
        bwd = jg.build_backward(jg.build_forward(loss), memory_budget=row["peak_bytes"], fuse=True)
        assert bwd.peak_bytes <= row["peak_bytes"]


def test_auto_fuses_where_it_pays():
    """The default, fuse="auto": a program of a few small elementwise nodes runs every node
    alone (fusing would only add a first compile); one with a big fusable node forms its
    groups of FUSE_MIN_MEMBERS or more, one with many small ones every group; anything but
    True, False, "auto" is an error."""
    def program(n, layers):
        g = jg.Graph(np.float32)
        x = g.input((n,), name="x")
        h = x
        for _ in range(layers):
            h = jg.tanh(h * 2.0) + x
        return g, x, jg.build_forward(jg.sum(h))
    assert program(FUSE_MIN_ELEMENTS - 1, 3)[2].stats()["n_groups"] == 0
    assert program(FUSE_MIN_ELEMENTS, 1)[2].stats()["n_groups"] == 1
    layers = -(-FUSE_MIN_NODES // 3)                                            # 3 fusable nodes a layer
    assert program(16, layers)[2].stats()["n_groups"] >= layers * 3 // MAX_MEMBERS
    assert program(16, layers - 1)[2].stats()["n_groups"] == 0
    # below FUSE_MIN_NODES, "auto" forms only groups of FUSE_MIN_MEMBERS (two members do not pay)
    g = jg.Graph(np.float32)
    x, z = g.input((FUSE_MIN_ELEMENTS,), name="x"), g.input((FUSE_MIN_ELEMENTS,), name="z")
    chain = jg.exp(x)
    for k in range(FUSE_MIN_MEMBERS - 2):
        chain = jg.tanh(chain)
    for members, y in ((2, jg.exp(x) * z), (FUSE_MIN_MEMBERS, chain * z)):
        auto, always = jg.build_forward(jg.sum(y)), jg.build_forward(jg.sum(y), fuse=True)
        assert always.stats()["n_groups"] == 1 and list(map(len, always.groups().values())) == [members]
        assert auto.stats()["n_groups"] == (members >= FUSE_MIN_MEMBERS)
        feeds = {x: np.linspace(-1, 1, FUSE_MIN_ELEMENTS, dtype=np.float32), z: np.full(FUSE_MIN_ELEMENTS, 0.5, np.float32)}
        assert bits(auto.run(feeds)) == bits(always.run(feeds))
    g, x, _ = program(16, 1)
    with pytest.raises(jg.GraphError, match="fuse must be True, False or 'auto', got 'yes'"):
        jg.build_forward(jg.sum(x), fuse="yes")


def test_a_source_joins_only_if_it_holds_no_bigger_inputs_longer():
    """w = mm1 * mm2 frees two products where it runs: fused into tanh(w) right after it, it
    holds them no longer (a group); fused into w + mm3, it would hold both over mm3's step to
    save one buffer (no group)."""
    rng = np.random.default_rng(7)
    g = jg.Graph(np.float64)
    x = g.input((64, 64), name="x")
    W1, W2, W3 = (g.param(rng.standard_normal((64, 64)), name=f"W{i}") for i in range(3))
    w = (x @ W1) * (x @ W2)
    next_to = jg.build_forward(jg.sum(jg.tanh(w)), fuse=True)
    assert list(next_to.groups().values()) == [[w.id, w.id + 1]]
    w2 = (x @ W1) * (x @ W2)
    apart = jg.build_forward(jg.sum(w2 + x @ W3), fuse=True)
    assert apart.stats()["n_groups"] == 0
    feeds = {x: rng.standard_normal((64, 64))}
    for prog in (next_to, apart):
        assert bits(prog.run(feeds)) == bits(jg.build_forward(prog.outputs[0], fuse=False).run(feeds))


def test_only_what_runs_is_compiled():
    """A program runs the runners of what runs alone and the chunk runners of its groups'
    members: an op that only runs inside groups needs no runner of its own, and an unfused
    program needs no chunk runner."""
    g, x, loss, params, feeds = mlp(np.float32)
    fused, plain = jg.build_forward(loss, fuse=True), jg.build_forward(loss, fuse=False)
    names = lambda codes: {OPS[int(c)].name for c in codes}                  # noqa: E731
    inside = {OPS[int(g.nodes.op[m])].name for ms in fused.groups().values() for m in ms}
    assert names(fused._chunk_codes) == inside and "group" in names(fused._op_codes)
    assert "tanh" in inside and "tanh" not in names(fused._op_codes)          # tanh only runs in a group
    assert plain._chunk_codes.size == 0 and "tanh" in names(plain._op_codes)
    assert bits(fused.run(feeds)) == bits(plain.run(feeds))
