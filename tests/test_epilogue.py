"""Epilogues (fuse.py, ops/group.py): the elementwise nodes that read a convolution's
output alone run in its output pass, image by image, and give exactly the bits of the
unfused program -- forward and input-gradient convolutions, float32 and float64, 1 and
2 threads, checkpointed or not; the convolution's output takes no arena slot."""
import numpy as np
import pytest

import jitgraph as jg
from jitgraph.ops.group import EPILOGUE_ELEMS
from jitgraph.registry import OPS
from jitgraph.threads import BLOCK

from .test_fusion import bits


def names(g, members):
    return [OPS[int(g.nodes.op[m])].name for m in members]


def epilogues(prog):
    """[member op names] of each epilogue of a program."""
    run = prog.run_table
    return [names(prog.graph, ms) for n, ms in prog.groups().items() if OPS[int(run.op[n])].name == "epilogue"]


def block(dtype, N=3, C=8, H=10, stride=2, seed=0):
    """relu(conv(x) + b), relu(conv(h) + x), then a strided conv and its relu: the residual
    block's epilogues, and (in the backward pass) input-gradient convolutions followed by relu_d."""
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((N, C, H, H), name="x")
    w1 = g.param((rng.standard_normal((C, C, 3, 3)) * 0.2).astype(dtype), name="w1")
    b1 = g.param((rng.standard_normal((1, C, 1, 1)) * 0.2).astype(dtype), name="b1")
    w2 = g.param((rng.standard_normal((C, C, 3, 3)) * 0.2).astype(dtype), name="w2")
    w3 = g.param((rng.standard_normal((2 * C, C, 3, 3)) * 0.2).astype(dtype), name="w3")
    w4 = g.param((rng.standard_normal((2 * C, 2 * C, 1, 1)) * 0.2).astype(dtype), name="w4")
    h = jg.relu(jg.conv2d(x, w1, padding=1) + b1)
    y = jg.relu(jg.conv2d(h, w2, padding=1) + x)
    z = jg.relu(jg.conv2d(y, w3, padding=1, stride=stride))
    out = jg.relu(jg.conv2d(z, w4) * 0.5)
    loss = jg.mean(out * out)
    feeds = {x: rng.standard_normal((N, C, H, H)).astype(dtype)}
    return g, loss, [w1, b1, w2, w3, w4], feeds


def values(loss, params, feeds, threads=1, **kw):
    old = jg.get_num_threads()
    try:
        jg.set_num_threads(threads)
        bwd = jg.build_backward(jg.build_forward(loss, fuse=kw.get("fuse", True)), **kw)
        value = bwd.run(feeds)
        return bwd, [bits(value)] + [bits(bwd.grad(p)) for p in params]
    finally:
        jg.set_num_threads(old)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_epilogues_give_the_unfused_bits(dtype):
    g, loss, params, feeds = block(dtype)
    fused, a = values(loss, params, feeds, fuse=True)
    _, b = values(loss, params, feeds, fuse=False)
    assert a == b
    got = epilogues(fused)
    # forward: conv + b -> relu, conv + x -> relu, conv -> relu, conv * 0.5 -> relu;
    # backward: input-gradient convolutions -> relu_d
    assert ["conv2d", "add", "relu"] in got and ["conv2d", "relu"] in got and ["conv2d", "affine", "relu"] in got
    assert any(ms[0] == "conv2d" and ms[-1] == "relu_d" for ms in got)
    # the convolution inside an epilogue has no buffer of its own
    conv = next(ms[0] for n, ms in fused.groups().items() if names(g, ms)[0] == "conv2d")
    with pytest.raises(jg.GraphError, match="was fused into the group of"):
        fused.value_of(conv)
    assert {r["id"]: r["loc"] for r in fused.nodes()}[conv] == "group"


def test_epilogues_are_cut_by_images_over_threads_with_the_same_bits():
    """Big enough that the interpreter splits the epilogue over the threads, with a number of
    images that is not a multiple of a block's nor of the images the producer writes at a time."""
    image = 8 * 16 * 16
    N = 2 * BLOCK // image + EPILOGUE_ELEMS // image + 5
    assert EPILOGUE_ELEMS // image > 1 and N * image >= 2 * BLOCK
    g, loss, params, feeds = block(np.float32, N=N, C=8, H=16, stride=1, seed=1)
    runs = [values(loss, params, feeds, threads=t, fuse=f)[1] for t in (1, 2) for f in (True, False)]
    assert all(r == runs[0] for r in runs)


@pytest.mark.parametrize("checkpoints", ["sqrt", "revolve"])
def test_checkpointed_epilogues_give_the_plain_bits(checkpoints):
    g, loss, params, feeds = block(np.float64)
    plain, a = values(loss, params, feeds, fuse=True)
    ck, b = values(loss, params, feeds, fuse=True, checkpoints=checkpoints)
    assert a == b and epilogues(ck)
    assert ck.stats()["n_recomputed"] > 0


def test_a_convolution_read_elsewhere_or_returned_is_no_producer():
    """A convolution whose output another node reads too, or that the program returns, keeps
    its buffer and runs alone."""
    rng = np.random.default_rng(2)
    g = jg.Graph(np.float32)
    x = g.input((2, 4, 8, 8), name="x")
    w = g.param(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), name="w")
    c = jg.conv2d(x, w, padding=1)
    twice = jg.build_forward(jg.sum(jg.relu(c) * c), fuse=True)          # read by relu and by mul
    returned = jg.build_forward([jg.sum(jg.relu(c)), c], fuse=True)
    once = jg.build_forward(jg.sum(jg.relu(c)), fuse=True)
    assert epilogues(twice) == [] and epilogues(returned) == [] and epilogues(once) == [["conv2d", "relu"]]
    feeds = {x: rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}
    for prog in (twice, returned, once):
        ref = jg.build_forward(prog.outputs, fuse=False)
        got, want = prog.run(feeds), ref.run(feeds)
        got, want = (got, want) if isinstance(got, list) else ([got], want)
        assert [bits(v) for v in got] == [bits(v) for v in want]


def test_auto_keeps_two_member_epilogues_and_names_them():
    """fuse="auto" (the default) forms an epilogue of two members where it fuses at all (a
    plain group of two does not pay; an epilogue saves the activation's pass over memory);
    profile rows and pictures name it with its members; a program that has none needs no
    epilogue runner."""
    g, loss, params, feeds = block(np.float32, N=16, C=16, H=16, stride=1)
    auto = jg.build_backward(jg.build_forward(loss))
    assert ["conv2d", "relu"] in epilogues(auto)
    rows = {r["op"] for r in auto.profile(feeds, repeats=1)}
    assert "epilogue(conv2d, relu)" in rows
    assert "epilogue #" in auto.to_dot()
    assert any("epilogue" in r["flags"] for r in auto.nodes()) and "epilogue" in auto.format_table(limit=10**6)
    small = jg.build_forward(loss, fuse=False)
    assert "epilogue" not in {OPS[int(c)].name for c in small._op_codes}
    assert "epilogue" in {OPS[int(c)].name for c in auto._op_codes} and "conv2d" in {OPS[int(c)].name for c in
                                                                                     auto._op_codes}
