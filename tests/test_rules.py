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
    (lambda g, x: either(op.exp(g).shape[3] == 1, g, x), r"a condition may read only g, out and the sources"),
    (lambda g, x: (g @ x) + g, r"a product that is not a result"),
])
def test_a_wrong_rule_fails_when_recorded_naming_the_op(vjp, message):
    with pytest.raises((ValueError, TypeError, AttributeError), match=message):
        tape, _ = rules.record(fake(vjp))
        rules._Compiler().add(tape)


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
