"""Gradient rules as programs (rules.py): every rule records into a short program, a rule
written wrongly fails at recording with a message naming the op, and the interpreter
(backward.py) builds what the expressions say -- scalar parameters exactly, shared work
once, a branch only when chosen."""
import inspect

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import registry, rules
from jitgraph.ops.stochastic import DropoutIP
from jitgraph.rules import MAX_INSTRUCTIONS, PROGRAM, SKIP, either, op


def test_every_rule_is_a_short_program():
    tables = rules.tables()
    assert tables is rules.tables()                            # recorded once
    for spec in registry.OPS.values():
        kind = rules.rule_kind(spec.vjp)
        assert kind == tables.kind[spec.code]
        if kind == PROGRAM:
            assert 1 <= tables.count[spec.code] <= MAX_INSTRUCTIONS or spec.name in ("add", "copy", "sub")
        if spec.vjp is registry.ZERO_GRAD:
            assert kind == SKIP
    assert tables.instructions("tanh") == 3                    # sqr, affine, mul
    assert tables.instructions("mul") == 2
    assert tables.instructions("copy") == 0                    # g itself
    names = [p for p in inspect.signature(registry.BY_NAME["matmul"].vjp).parameters]
    assert names == ["g", "a", "b", "trans_a", "trans_b"]


def fake(vjp, arity=1, sources=None, **kw):
    """An op that is not in the table, to record a rule on its own."""
    return registry.Op(99, "fake", "test", arity, registry.ELEMENTWISE, registry.MEMORY, 1, None, None, vjp, False,
                       "fake", registry.ELEMENTS, sources=sources or registry.DEFAULT_SOURCES[arity],
                       ip_names=kw.get("ip", ()), fp_names=kw.get("fp", ()))


def test_a_rule_records_its_instructions_and_results():
    tape, refs = rules.record(fake(lambda g, x, out, slope: g * op.affine(op.step(x), scale=1.0 - slope,
                                                                      shift=slope), fp=("slope",)))
    assert [r["kind"] for r in tape.rows] == [rules.EMIT] * 3
    assert [registry.OPS[r["op"]].name for r in tape.rows] == ["step", "affine", "mul"]
    assert refs == [2, rules.NONE, rules.NONE, rules.NONE]
    tape, refs = rules.record(fake(lambda g, a, b: (g, None), arity=2))
    assert tape.rows == [] and refs[:2] == [rules.GRAD, rules.NONE]


@pytest.mark.parametrize("vjp,message", [
    (lambda g, y: g, r"rule of 'fake': 'y' is neither out, a source \('x',\) nor a parameter"),
    (lambda g, x: op.sum(g), r"op.sum: not elementwise, so its shape needs like="),
    (lambda g, x: op.relu(g, alpha=1.0), r"op.relu: no parameter 'alpha'"),
    (lambda g, x: op.frobnicate(g), r"no op named 'frobnicate'"),
    (lambda g, x: g if x else g, r"a rule's node has no truth value: use either"),
    (lambda g, x: (g, g), r"rule of 'fake': 2 results for its 1 sources \('x',\)"),
    (lambda g, x: 1.0, r"rule of 'fake': result 0 is not a node of the rule"),
    (lambda g, x: either(op.exp(g).ip(0) == 1, g, x), r"'fake': a scalar reads the ip of the node of instruction 0"),
    (lambda g, x: op.affine(g, shift=g.id), r"'fake': a scalar reads the id of g; of g and of an emitted node"),
    (lambda g, x: op.affine(g, shift=x.source(0).shape[1]), r"'fake': a scalar reads the shape of a source's source"),
    (lambda g, x: (g @ x) + g, r"'fake': a product that is not a result"),
])
def test_a_wrong_rule_fails_when_recorded_naming_the_op(vjp, message):
    with pytest.raises((ValueError, TypeError, AttributeError), match=message):
        tape, _ = rules.record(fake(vjp))
        rules._Compiler().add(tape)


def test_an_emitted_nodes_shape_is_known_from_its_emission():
    """A scalar that reads a node the rule emitted reads it through the emission: ``like``'s
    shape with ``dims`` changed, the broadcast of the sources, a SELECT's chosen branch."""
    def vjp(g, a, b, out):
        wide = op.reshape(a, like=a, dims={1: a.shape[1] * 3, 2: 1})
        both = op.add(a, b)                                   # the broadcast of a and b
        pick = either(out.shape[0] > 2, wide, both)
        return op.affine(g, scale=wide.shape[1] + wide.shape[2], shift=pick.shape[0] + both.ndim), None
    tape, _ = rules.record(fake(vjp, arity=2))
    comp = rules._Compiler()
    _, trees = comp.add(tape)
    scale, shift = (trees[comp.ins[-1][rules.I_FP + slot]] for slot in (0, 1))       # the affine's
    a, b, out = rules.SRC, rules.SRC - 1, rules.OUT
    one = ("const", 1.0)
    assert scale == ("add", ("mul", ("shape", a, 1), ("const", 3.0)), one)         # wide: (., 3 a1, 1, .)
    a0, b0 = ("shape", a, 0), ("shape", b, 0)
    broadcast0 = ("select", ("ne", b0, one), b0, a0)
    ndim = ("select", ("gt", ("ndim", b, 0), ("ndim", a, 0)), ("ndim", b, 0), ("ndim", a, 0))
    assert shift == ("add", ("select", ("gt", ("shape", out, 0), ("const", 2.0)), a0, broadcast0), ndim)


@pytest.mark.parametrize("text", ["p // r", "p % r", "1 << (r * r)", "(p > r) & (r != 0) | (p == 3)", "~(p < 0)",
                                  "-p / (r * r + 1)", "either(p >= 2, p * 0.5, 1 - r)"])
def test_scalars_are_evaluated_as_python_would(text):
    """Tables.scalars evaluates a rule's scalars for all of an op's nodes at once, in numpy:
    the values Python's own arithmetic gives, integer division and remainder included (by
    zero: 0)."""
    nodes = jg.Graph(np.float64).nodes
    nodes.reserve(8)
    ps, rs = np.array([-7, -3, 0, 2, 3, 9]), np.array([2, -4, 3, 0, 5, -2])
    ids = np.arange(ps.size)
    nodes.ip[ids, 0], nodes.ip[ids, 1] = ps, rs
    tape = rules.Tape("fake")
    out = rules.Sym(tape, rules.OUT)
    p, r = out.ip(0), out.ip(1)
    comp = rules._Compiler()
    comp.name, comp.rows, comp.index, comp.trees = "fake", [], {}, []
    tree = comp.tree(rules._num(eval(text, {"p": p, "r": r, "either": either})).tree)
    program = rules.Scalars([tree])
    got = program.run(nodes, ids)[program.outputs[0]]

    def python(pv, rv):
        if ("//" in text or "%" in text) and rv == 0:
            return 0.0
        pick = (lambda c, u, v: u if c else v)
        value = eval(text.replace("~", "not "), {"p": pv, "r": rv, "either": pick})
        return float(value)
    np.testing.assert_array_equal(np.broadcast_to(got, ids.shape), [python(int(a), int(b)) for a, b in zip(ps, rs)])


def test_a_copied_int_parameter_is_exact_past_2_to_the_53():
    """Scalar expressions are float64, but a parameter copied as it is stays an int64: a
    dropout's seed above 2**53 reaches its gradient node bit for bit."""
    g = jg.Graph(np.float64)
    x = g.param(np.ones((3, 4)), name="x")
    seed = (1 << 60) + 12345
    y = jg.dropout(x, 0.25, seed=seed)
    bwd = jg.build_backward(jg.build_forward(jg.sum(y * y)))
    drops = [n for n in range(g.nodes.n) if g.nodes.op[n] == registry.DROPOUT]
    assert len(drops) >= 2 and all(int(g.nodes.ip[n, DropoutIP.seed]) == seed for n in drops)
    assert len({int(g.nodes.ip[n, DropoutIP.mask_id]) for n in drops}) == 1
    bwd.run()
    kept = np.asarray(jg.build_forward(y).run()) != 0
    np.testing.assert_array_equal(x.grad != 0, kept)


def test_work_shared_between_sources_is_built_once():
    """attention's rule packs dq, dk and dv into one attention_d node that each source slices."""
    g = jg.Graph(np.float64)
    q, k, v = (g.param(np.random.default_rng(i).standard_normal((1, 2, 5, 4)), name=n) for i, n in enumerate("qkv"))
    jg.build_backward(jg.build_forward(jg.sum(jg.attention(q, k, v, causal=True))))
    ops = [registry.OPS[int(c)].name for c in g.nodes.op[:g.nodes.n]]
    assert ops.count("attention_d") == 1 and ops.count("slice") == 3 and ops.count("concat") == 1


def test_only_the_chosen_branch_is_built():
    """pow's rule chooses by its exponent: p = 2 builds 2x (one affine), p = 1 passes g
    through, p = 0 gives nothing, any other p builds p x^(p-1)."""
    built = {}
    for p in (0.0, 1.0, 2.0, 3.0):
        g = jg.Graph(np.float64)
        x = g.param(np.full(3, 1.5), name="x")
        first = g.nodes.n + 2                         # after the pow node and the sum
        loss = jg.sum(jg.pow(x, p))
        jg.build_backward(jg.build_forward(loss))
        built[p] = [registry.OPS[int(c)].name for c in g.nodes.op[first:g.nodes.n]]
    assert "pow" not in built[2.0] and "affine" in built[2.0]
    assert built[3.0].count("pow") == 1 and "mul" in built[3.0]
    assert "mul" not in built[1.0] and "pow" not in built[1.0]
    assert "mul" not in built[0.0]
