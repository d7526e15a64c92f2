"""The op table is the single source of truth: stable opcodes, a numpy reference
and a fuzz family for every op, and exports / docs derived from it."""
import os
import pkgutil
import re

import numpy as np
import pytest

import jitgraph as jg
from jitgraph import registry
from jitgraph.registry import NO_GRAD, OPS, ZERO_GRAD

from .naive import FUZZ_FAMILIES, REF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Append-only: an op's code never changes and is never reused.  Every code is pinned here;
# 71, 72, 77 and 78 were skipped and stay unused.
PINNED = {
    "nop": 0, "input": 1, "param": 2, "const": 3, "add": 4, "sub": 5, "mul": 6, "div": 7, "neg": 8, "affine": 9,
    "sqr": 10, "sqrt": 11, "exp": 12, "log": 13, "abs": 14, "relu": 15, "gelu": 16, "silu": 17, "tanh": 18,
    "sigmoid": 19, "copy": 20, "step": 21, "sign": 22, "gelu_d": 23, "gelu_dd": 24, "silu_d": 25, "silu_dd": 26,
    "sum": 27, "mean": 28, "max": 29, "broadcast": 30, "max_mask": 31, "reshape": 32, "transpose": 33,
    "concat": 34, "slice": 35, "pad": 36, "matmul": 37, "softmax": 38, "log_softmax": 39, "cross_entropy": 40,
    "layer_norm": 41, "rms_norm": 42, "norm_rstd": 43, "dropout": 44, "embedding": 45, "scatter_add": 46,
    "where": 47, "leaky_relu": 48, "softmax_d": 49, "log_softmax_d": 50, "layer_norm_d": 51, "rms_norm_d": 52,
    "cross_entropy_d": 53, "cross_entropy_index": 54, "cross_entropy_index_d": 55, "sin": 56, "cos": 57, "pow": 58,
    "clip": 59, "clip_mask": 60, "maximum": 61, "minimum": 62, "less": 63, "less_equal": 64, "greater": 65,
    "greater_equal": 66, "equal": 67, "argmax": 68, "attention": 69, "attention_d": 70, "batch_norm": 73,
    "batch_stats": 74, "batch_norm_sums": 75, "batch_norm_dx": 76, "conv2d": 79, "conv2d_weight": 80, "im2col": 81,
    "col2im": 82, "max_pool2d": 83, "max_pool2d_d": 84, "avg_pool2d": 85, "avg_pool2d_d": 86,
    "layer_norm_affine": 87, "relu_d": 88, "softplus": 89, "group": 90, "epilogue": 91, "winograd_weights": 92,
    "gelu_grad": 93,
}
SKIPPED = {71, 72, 77, 78}
LEAVES = {"nop", "input", "param", "const"}
# every module of jitgraph/ops but the shared helpers is a family; leaves have none
FAMILIES = {m.name for m in pkgutil.iter_modules(jg.ops.__path__)} - {"common"} | {"leaf"}


def test_pinned_opcodes_never_change():
    for name, code in PINNED.items():
        assert name in registry.BY_NAME, f"op {name!r} (code {code}) disappeared; codes are never reused"
        assert registry.BY_NAME[name].code == code, f"op {name!r} changed its opcode"


def test_new_opcodes_are_appended_and_unique():
    """Every code is declared in the registry's code table; a new op takes the next free
    code there (NEXT_CODE names it), so codes above the pinned ones are consecutive."""
    codes = [op.code for op in OPS.values()]
    assert len(codes) == len(set(codes)) and not set(codes) & SKIPPED
    new = sorted(op.code for op in OPS.values() if op.name not in PINNED)
    assert new == list(range(max(PINNED.values()) + 1, max(PINNED.values()) + 1 + len(new))), new
    assert registry.NEXT_CODE == max(codes) + 1
    table = {v for k, v in vars(registry).items() if k.isupper() and isinstance(v, int) and k != "NEXT_CODE"}
    assert set(codes) <= table, "every opcode is a constant of the registry's code table"
    with pytest.raises(ValueError, match="already taken"):
        registry.defop(4, "another_add", arity=2, kind=registry.LEAF)


def test_every_op_has_a_reference_a_fuzz_family_and_a_gradient_entry():
    # groups and epilogues are made by the fusion pass in a program's own node table, never built
    # (tests/test_fusion.py, tests/test_epilogue.py)
    for made in ("group", "epilogue"):
        assert registry.BY_NAME[made].builder is None and not registry.BY_NAME[made].public
    ops = {op.name for op in OPS.values()} - LEAVES - {"group", "epilogue"}
    assert ops - set(REF) == set(), f"ops without a line in tests/naive.py: {sorted(ops - set(REF))}"
    assert set(REF) - ops == set(), f"references of unknown ops: {sorted(set(REF) - ops)}"
    for name, case in REF.items():
        op = registry.BY_NAME[name]
        assert case.fuzz in FUZZ_FAMILIES, f"{name}: unknown fuzz family {case.fuzz!r}"
        assert op.builder is not None, f"{name}: no builder"
        if case.grad:
            assert callable(op.vjp), f"{name}: the reference expects a gradient but the op has no rule"
        else:
            assert op.vjp is NO_GRAD or op.vjp is ZERO_GRAD or not case.grad, name


def test_each_op_knows_its_family_kind_and_cost():
    for op in OPS.values():
        assert op.kind in registry.KINDS and op.cost in (registry.COMPUTE, registry.MEMORY, registry.FREE)
        assert op.family in FAMILIES, op
        assert op.split in registry.SPLITS
        assert (op.runner is None) == (op.kind in (registry.LEAF, registry.VIEW))


def test_exports_are_the_public_builders():
    """jitgraph.<name> is read from the table: each public op's builder (made all or nothing,
    graph.transactional) and the few declared with @export, nothing else."""
    for op in OPS.values():
        if op.public:
            name = op.builder.__name__
            assert name in jg.__all__, f"public op {op.name!r} is not exported as jitgraph.{name}"
            assert getattr(jg, name).__wrapped__ is op.builder
    internal = {op.builder.__name__ for op in OPS.values() if op.builder is not None and not op.public}
    assert not internal & set(jg.__all__), "internal ops must not be exported"
    builders = {name for name in jg.__all__ if hasattr(getattr(jg, name), "__wrapped__")}
    assert builders == set(registry.EXPORTS) >= {"scale", "conv1d"}
    for name in jg.__all__:
        assert hasattr(jg, name), name
    with pytest.raises(AttributeError):
        jg.no_such_op


def test_readme_lists_every_public_op():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("### Operations"):]
    section = section[:section.index("\n## ")]
    missing = [op.builder.__name__ for op in OPS.values()
               if op.public and not re.search(rf"(?<![\w.]){op.builder.__name__}(?!\w)", section)]
    assert not missing, f"README's Operations section does not mention {missing}"


def test_in_place_ops_are_the_elementwise_kind():
    kinds = registry.table("kind")
    for op in OPS.values():
        assert (kinds[op.code] == registry.KINDS.index(registry.ELEMENTWISE)) == (op.kind == registry.ELEMENTWISE)


def test_every_parameter_slot_in_use_is_declared():
    """A node's int and float parameters all live in slots its op names (ip= / fp= of
    defop): what pictures show, save files store by name and rules read."""
    from .rule_graphs import cases, snapshot
    for key in ("first.conv2d", "first.batch_norm", "first.attention", "resnet.plain", "gpt.plain",
                "chain.revolve", "second.layer_norm_d", "first.dropout", "first.cross_entropy_index"):
        got = snapshot(cases()[key])
        for n, name in enumerate(got["opname"]):
            spec = registry.BY_NAME[str(name)]
            for field, names in (("ip", spec.ip_names), ("fp", spec.fp_names)):
                used = np.flatnonzero(got[field][n])
                assert all(i < len(names) and names[i] for i in used), (key, n, str(name), field, used)
