"""Gradient rules are programs now; the graphs they build and the bits they compute are
exactly what the jitted rules of the tree before built (tests/fixtures/rule_graphs.npz,
recorded at 8490958 by tests/rule_graphs.py): for every case of tests/naive.py, first
and second order and without the zero table, and for the GPT, ResNet, char-GPT and
relu-chain workloads, plain and checkpointed (sqrt, revolve, policy, budget)."""
import numpy as np
import pytest

from jitgraph.ir import FIELDS, N_IP
from jitgraph.ops.conv import PHASES, ConvIP
from jitgraph.registry import CONV2D

from . import rule_graphs

EXPECTED = np.load(rule_graphs.FIXTURE)
CASES = rule_graphs.cases()
RECORDED = sorted({k.split(":")[0] for k in EXPECTED.files})      # ops added since have no record: nothing to keep


def expected(key):
    prefix = key + ":"
    return {k[len(prefix):]: EXPECTED[k] for k in EXPECTED.files if k.startswith(prefix)}


def today(ip, op):
    """The recorded int parameters in today's layout.  Since the fixture was recorded, a node
    has N_IP = 10 int slots (8 before), and conv2d keeps a PHASES stride in its own slots
    (stride_h, stride_w) where slots 4 and 5 held it in place of DIRECT's padding."""
    out = np.zeros((ip.shape[0], N_IP), np.int64)
    out[:, :ip.shape[1]] = ip
    phases = (op == CONV2D) & (ip[:, ConvIP.source] == PHASES)
    out[phases, ConvIP.stride_h], out[phases, ConvIP.stride_w] = ip[phases, 4], ip[phases, 5]
    out[phases, ConvIP.pad_h] = out[phases, ConvIP.pad_w] = 0
    return out


def test_every_recorded_case_is_still_built():
    assert set(RECORDED) <= set(CASES) and len(RECORDED) == 166


@pytest.mark.parametrize("key", RECORDED)
def test_gradient_graph_and_bits_are_what_they_were(key):
    want = expected(key)
    got = rule_graphs.snapshot(CASES[key])
    if "error" in want or "error" in got:
        assert str(got.get("error")) == str(want.get("error"))
        return
    assert got["opname"].size == want["opname"].size, "node count"
    np.testing.assert_array_equal(got["opname"], want["opname"])
    want["ip"] = today(want["ip"], want["op"])
    for field in FIELDS:
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)
    assert got["values"].dtype == want["values"].dtype
    np.testing.assert_array_equal(got["values"].view(np.uint8), want["values"].view(np.uint8))
