"""The memory plan: liveness, best-fit reuse, in-place, views, exact peak."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitgraph as jg

from .conftest import examples
from jitgraph.ir import LOC_ARENA, LOC_IO, LOC_STORE
from jitgraph.registry import OPS

from .graphgen import evaluate, instance, programs


def check_no_overlap(prog):
    """Brute force, independent of the planner: no two arena tensors that are live
    at the same step share a byte, except a node whose op overwrites (elementwise ones,
    softmax and its gradients) taking over the
    buffer of a source that dies at that very node.  Over what runs: a group is one
    node reading its external inputs (fuse.py)."""
    g = prog.graph
    table = prog.run_table
    order = prog.run_order.tolist()
    pos = {n: t for t, n in enumerate(order)}
    owner, last = {}, {}

    def sources(n):
        return [int(s) for s in table.src[n] if s >= 0]

    for t, n in enumerate(order):
        owner[n] = owner[int(table.src[n, 0])] if jg.Tensor(g, n).op == "reshape" else n
        for s in sources(n):
            last[owner[s]] = max(last.get(owner[s], -1), t)
    for o in prog.outputs:
        last[owner[o.id]] = len(order)
    owners = [n for n in order if owner[n] == n and prog.loc[n] == LOC_ARENA]
    numel = {n: int(np.prod(g.shape_of(n), dtype=np.int64)) for n in owners}
    for i, a in enumerate(owners):
        for b in owners[i + 1:]:
            a0, a1 = pos[a], last.get(a, pos[a])
            b0, b1 = pos[b], last.get(b, pos[b])
            if a1 < b0 or b1 < a0:
                continue
            oa, ob = int(prog.off[a]), int(prog.off[b])
            if oa + numel[a] <= ob or ob + numel[b] <= oa:
                continue
            in_place = (b0 == a1 and oa == ob and numel[a] == numel[b]
                        and a in {owner[s] for s in sources(b)})
            assert in_place, f"live tensors {a} and {b} overlap in the arena"
            assert OPS[int(table.op[b])].overwrites, f"{OPS[int(table.op[b])].name} may not write in place"
    # arena within the peak; io slots after it and disjoint; store slots untouched
    for n in owners:
        assert 0 <= prog.off[n] and prog.off[n] + numel[n] <= prog.arena_elems
    io = sorted((int(prog.off[n]), int(np.prod(g.shape_of(n)))) for n in order
                if prog.loc[n] == LOC_IO and owner[n] == n)
    for (o1, s1), (o2, _) in zip(io, io[1:]):
        assert o1 + s1 <= o2
    assert all(o >= prog.arena_elems for o, _ in io)


@given(programs(), st.integers(0, 3))
@settings(max_examples=examples(40))
def test_random_programs_plan_and_run(program, seed):
    g, ps, vals, loss, params, weights = instance(program, seed)
    fwd = jg.build_forward(loss, fuse=True)              # small programs: "auto" would not fuse
    bwd = jg.build_backward(fwd, fuse=True)
    for prog in (fwd, bwd):
        check_no_overlap(prog)
    # forward equals the numpy reference
    want = evaluate(program, params, weights, vals)
    np.testing.assert_allclose(fwd.run(), want, rtol=1e-10, atol=1e-12)
    # NaN poisoning of freed memory changes nothing; nor does turning in-place off
    ps = [p for p in ps if p.id in bwd.params]        # the params the loss depends on
    l1 = bwd.run()
    grads1 = [p.grad for p in ps]
    l2 = bwd.run(debug=True)
    assert np.array_equal(l1, l2)
    for p, g1 in zip(ps, grads1):
        assert np.array_equal(p.grad, g1, equal_nan=True)
    plain = jg.build_backward(jg.build_forward(loss, in_place=False), in_place=False)
    assert plain.n_in_place == 0
    assert np.array_equal(plain.run(), l1)
    for p, g1 in zip(ps, grads1):
        assert np.array_equal(plain.grad(p), g1, equal_nan=True)
    # nor does running every node alone (no groups)
    alone = jg.build_backward(jg.build_forward(loss, fuse=False), fuse=False)
    assert alone.stats()["n_groups"] == 0 and alone.run_order.size == alone.order.size
    check_no_overlap(alone)
    assert np.array_equal(alone.run(), l1)
    for p, g1 in zip(ps, grads1):
        assert np.array_equal(alone.grad(p), g1, equal_nan=True)


def chain(n_layers, B=64, D=64, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    g = jg.Graph(dtype)
    x = g.input((B, D), name="x")
    h = x
    for i in range(n_layers):
        h = jg.relu(h @ g.param(rng.standard_normal((D, D)) * np.sqrt(2 / D), name=f"W{i}"))
    return g, x, jg.mean(h)


def test_forward_peak_does_not_grow_with_depth():
    act = 64 * 64 * 4
    peaks = [jg.build_forward(chain(n)[2]).peak_bytes for n in (2, 10, 100)]
    assert peaks[0] == peaks[1] == peaks[2] <= 2 * act + 64


def test_backward_peak_holds_the_activations_and_little_more():
    act = 64 * 64 * 4
    for n in (10, 100):
        g, x, loss = chain(n)
        bwd = jg.build_backward(jg.build_forward(loss))
        # backward needs each layer's relu output (n of them) and one temporary at a time
        assert n * act <= bwd.peak_bytes <= (n + 2) * act
        assert bwd.unplanned_bytes >= 4 * n * act
        check_no_overlap(bwd)


def test_debug_mode_catches_a_read_after_free():
    g, x, loss = chain(3, B=4, D=4, dtype=np.float64)
    fwd = jg.build_forward(loss)
    xb = np.random.default_rng(1).standard_normal((4, 4)) + 1.0
    good = fwd.run({x: xb})
    assert np.isfinite(good) and np.array_equal(fwd.run({x: xb}, debug=True), good)
    # a freed block really is NaN after a debug run
    o, n = int(fwd._free_off[0]), int(fwd._free_size[0])
    assert np.isnan(fwd.mem[o:o + n]).all()
    # sabotage: free the first relu's output right after it is computed, before the
    # next matmul reads it.  A normal run cannot notice; the debug run must.
    order = fwd.order.tolist()
    t = next(i for i, n in enumerate(order) if jg.Tensor(g, n).op == "relu")
    relu = order[t]
    at = fwd._free_at.copy()
    at[t + 1:] += 1
    fwd._free_off = np.insert(fwd._free_off, at[t], fwd.off[relu])
    fwd._free_size = np.insert(fwd._free_size, at[t], 16)
    fwd._free_at = at
    assert np.array_equal(fwd.run({x: xb}), good)
    assert np.isnan(fwd.run({x: xb}, debug=True))


def test_run_allocates_exactly_the_plan():
    g0, x0, loss0 = chain(1, B=2, D=2)        # load the compiled interpreter outside the measurement
    jg.build_backward(jg.build_forward(loss0)).run({x0: np.ones((2, 2), np.float32)})
    g, x, loss = chain(20, B=64, D=64)
    bwd = jg.build_backward(jg.build_forward(loss))
    g.store                                  # pack the param values before measuring
    xb = np.ones((64, 64), np.float32)
    tracemalloc.start()
    bwd.run({x: xb})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    planned = bwd.peak_bytes + bwd.io_elems * 4     # the arena plus io slots (input, 20 gradients)
    assert planned <= peak <= planned + 64 * 1024
    assert bwd.unplanned_bytes > 3 * bwd.peak_bytes  # and that is far less than a buffer per node


def test_same_network_same_plan():
    plans = []
    for _ in range(2):
        g, x, loss = chain(8)
        bwd = jg.build_backward(jg.build_forward(loss))
        plans.append((bwd.order.copy(), bwd.loc[bwd.order].copy(), bwd.off[bwd.order].copy(), bwd.peak_bytes))
    assert all(np.array_equal(a, b) for a, b in zip(plans[0][:3], plans[1][:3]))
    assert plans[0][3] == plans[1][3]


def test_inputs_params_outputs_and_grads_are_never_overwritten():
    g = jg.Graph(np.float64)
    x = g.input((3,), name="x")
    W = g.param(np.array([1.0, 2.0, 3.0]), name="W")
    h = jg.exp(x * W)
    out2 = jg.tanh(h)
    fwd = jg.build_forward([h, jg.sum(out2 * 2.0)])
    xb = np.array([0.1, 0.2, 0.3])
    r1, r2 = fwd.run({x: xb})
    np.testing.assert_allclose(r1, np.exp(xb * [1, 2, 3]))            # an output, though read later
    o = int(fwd.off[x.id])
    np.testing.assert_array_equal(fwd.mem[o:o + 3], xb)                # the input slot is intact
    np.testing.assert_array_equal(W.value, [1.0, 2.0, 3.0])
    assert fwd.loc[W.id] == LOC_STORE and fwd.loc[x.id] == LOC_IO


def test_views_alias_and_keep_their_source_alive():
    g = jg.Graph(np.float64)
    x = g.input((2, 3), name="x")
    a = jg.exp(x)
    v = jg.reshape(a, (3, 2))
    b = jg.tanh(x)                       # allocated while a is alive only through v
    out = jg.sum(v @ jg.reshape(b, (3, 2)).T)
    fwd = jg.build_forward(out)
    assert fwd.off[v.id] == fwd.off[a.id] and fwd.loc[v.id] == LOC_ARENA
    check_no_overlap(fwd)
    xb = np.arange(6.0).reshape(2, 3) / 10
    want = (np.exp(xb).reshape(3, 2) @ np.tanh(xb).reshape(3, 2).T).sum()
    np.testing.assert_allclose(fwd.run({x: xb}, debug=True), want)


def test_stats_report_memory():
    g, x, loss = chain(5)
    bwd = jg.build_backward(jg.build_forward(loss))
    st_ = bwd.stats()
    assert st_["peak_bytes"] == bwd.peak_bytes
    # x, the params, their gradients, and the 1.0 seeding the loss gradient
    assert st_["persistent_bytes"] == (64 * 64 + 5 * 64 * 64 + 5 * 64 * 64 + 1) * 4
    assert st_["n_in_place"] == bwd.n_in_place > 0
    assert st_["unplanned_bytes"] > st_["peak_bytes"]


def test_million_node_chain_is_planned():
    g = jg.Graph(np.float32)
    x = g.input((16,), name="x")
    h = x
    for i in range(1_000_000):
        h = jg.tanh(h) if i % 2 else h * 0.5
    fwd = jg.build_forward(h)
    assert fwd.order.size == 1_000_001
    assert fwd.peak_bytes == 64      # one 16-float slot: each op writes over its dying source
    out = fwd.run({x: np.ones(16, np.float32)})
    assert np.isfinite(out).all()


def test_persistent_bytes_count_a_viewed_param_once():
    g = jg.Graph(np.float32)
    W = g.param(np.ones(6), name="W")
    x = g.input((2, 3), name="x")
    fwd = jg.build_forward(jg.sum(x * jg.reshape(W, (2, 3))))
    assert fwd.persistent_bytes == 16 * 4 + 6 * 4        # x's 64-byte io slot + W's values, not W twice


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_run_buffer_and_value_store_start_on_64_bytes(tmp_path, dtype):
    """The plan aligns offsets within the buffers; that only helps when the buffers
    themselves start on a 64-byte boundary (numpy's big arrays start 16 bytes past one)."""
    rng = np.random.default_rng(0)
    g = jg.Graph(dtype)
    x = g.input((3, 70), name="x")
    h = x
    for i in range(3):            # odd sizes, so nothing is aligned by luck
        h = jg.relu(h @ g.param(rng.standard_normal((70, 70)), name=f"W{i}") + g.param(rng.standard_normal(70)))
    bwd = jg.build_backward(jg.build_forward(jg.sum(h)))
    feeds = {x: rng.standard_normal((3, 70))}
    loss = float(bwd.run(feeds))
    assert bwd.mem.ctypes.data % 64 == 0
    assert g.store.ctypes.data % 64 == 0
    g.param(rng.standard_normal(5))              # the store is repacked with the new value
    assert g.store.ctypes.data % 64 == 0
    jg.save(tmp_path / "b.npz", bwd)
    again = jg.load(tmp_path / "b.npz")
    assert again.graph.store.ctypes.data % 64 == 0
    assert float(again.run({"x": feeds[x]})) == loss


def live_max(start, end, size):
    """The most bytes alive at one step: a lower bound of any packing."""
    steps = np.arange(max(end.max(), start.max()) + 1)
    return max(int(size[(start <= t) & (end >= t)].sum()) for t in steps)


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8), st.integers(1, 64)), min_size=1, max_size=40))
@settings(max_examples=examples(60))
def test_packing_puts_no_two_live_buffers_on_one_byte(bufs):
    from jitgraph.plan import _pack
    start = np.array([b[0] for b in bufs], np.int64)
    end = start + np.array([b[1] for b in bufs], np.int64)
    size = np.array([b[2] for b in bufs], np.int64) * 16
    offs, high = _pack(start, end, size)
    for i in range(len(bufs)):
        assert 0 <= offs[i] and offs[i] + size[i] <= high
        for j in range(i):
            if start[i] <= end[j] and start[j] <= end[i]:          # alive together: disjoint bytes
                assert offs[i] + size[i] <= offs[j] or offs[j] + size[j] <= offs[i], (i, j)
    assert live_max(start, end, size) <= high <= int(size.sum())


def test_packing_fills_the_hole_best_fit_in_order_leaves():
    """A (2 units, steps 0-1) and B (1 unit, steps 0-3) come first; C (3 units, steps 2-3)
    does not fit the hole A leaves, so best fit in execution order grows to 6 units;
    largest first, C goes at the bottom and the plan needs 4 -- the live maximum."""
    from jitgraph.plan import _pack
    offs, high = _pack(np.array([0, 0, 2]), np.array([1, 3, 3]), np.array([32, 16, 48]))
    assert high == 64 == live_max(np.array([0, 0, 2]), np.array([1, 3, 3]), np.array([32, 16, 48]))


def test_every_listed_checkpoint_plan_of_a_gpt_is_packed_without_overlap():
    from .rule_graphs import gpt
    _, plain, feeds = gpt()
    fwd = plain.forward
    want = plain.run(feeds)
    for r in jg.plans(fwd, plain.peak_bytes)[:8]:
        prog = jg.build_backward(jg.build_forward(fwd.outputs[0]), plan=r["plan"])
        check_no_overlap(prog)
        assert prog.peak_bytes == r["peak_bytes"]
        assert np.array_equal(prog.run(feeds, debug=True), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_and_its_gradient_write_over_a_dying_source_with_the_same_bits(dtype, axis):
    """softmax, softmax_d and log_softmax_d read a line before writing it: their output
    takes the buffer of a source that dies there (an attention's (B, H, T, T) scores), on
    the contiguous and the strided path; log_softmax (which reads x after writing) never."""
    rng = np.random.default_rng(3)

    def build(in_place):
        g = jg.Graph(dtype)
        x = g.input((6, 24), name="x")
        w = g.param(rng.standard_normal((24, 24)).astype(dtype), name="w")
        p = jg.softmax(x @ w, axis=axis)                     # the product dies at the softmax
        q = jg.log_softmax(jg.sin(x) @ w, axis=axis)         # and this one at the log_softmax
        loss = jg.sum(p * x) + jg.sum(q * x)
        fwd = jg.build_forward(loss, in_place=in_place, fuse=False)
        return x, w, fwd, jg.build_backward(fwd, in_place=in_place, fuse=False)

    xv = rng.standard_normal((6, 24)).astype(dtype)
    runs = []
    for in_place in (True, False):
        rng = np.random.default_rng(3)
        x, w, fwd, bwd = build(in_place)
        check_no_overlap(fwd)
        check_no_overlap(bwd)
        loss = bwd.run({x: xv}, debug=True)
        runs.append((bwd, loss, [bwd.grad(w)]))
    (bwd, loss, grads), (plain, loss0, grads0) = runs
    assert loss.tobytes() == loss0.tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(grads, grads0))
    over = {}
    for n in bwd.run_order:
        t = jg.Tensor(bwd.graph, int(n))
        if t.op in ("softmax", "log_softmax", "softmax_d", "log_softmax_d"):
            srcs = [int(s) for s in bwd.graph.nodes.sources(int(n))]
            over[t.op] = any(bwd.loc[s] == LOC_ARENA and bwd.off[s] == bwd.off[int(n)] for s in srcs)
    assert over["softmax"] and not over["log_softmax"]
    assert over["softmax_d"] or over["log_softmax_d"]


def _pack_reference(start, end, size):
    """greedy by size in plain Python over numpy's stable argsort: what plan._pack must equal"""
    by_size = np.argsort(-(size * (end.max() + 2) + (end - start)), kind="stable")
    offs, placed, high = np.zeros(size.size, np.int64), [], 0
    for b in by_size:
        near = sorted(((offs[p], offs[p] + size[p]) for p in placed
                       if start[p] <= end[b] and start[b] <= end[p]), key=lambda r: r[0])
        best, best_gap, top = -1, None, 0
        for lo, hi in near:
            gap = lo - top
            if gap >= size[b] and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, hi)
        offs[b] = best if best >= 0 else top
        high = max(high, offs[b] + size[b])
        placed.append(b)
    return offs, high


def test_pack_is_greedy_by_size_and_never_overlaps_live_buffers():
    """plan._pack (insertion-ordered, no sort template) places like the reference greedy-by-size
    packer -- ties in size and lifetime included -- and no two buffers alive together share bytes."""
    from jitgraph.plan import _pack
    rng = np.random.default_rng(11)
    for case in range(300):
        nb = int(rng.integers(1, 40))
        start = rng.integers(0, 30, nb)
        end = start + rng.integers(0, 12, nb)
        size = rng.choice([64, 128, 256, 4096], nb) if case % 2 else rng.integers(1, 5000, nb)
        offs, high = _pack(start, end, size)
        ref_offs, ref_high = _pack_reference(start, end, size)
        np.testing.assert_array_equal(offs, ref_offs)
        assert high == ref_high == (offs + size).max()
        for a in range(nb):
            for b in range(a + 1, nb):
                if start[a] <= end[b] and start[b] <= end[a]:
                    assert offs[a] + size[a] <= offs[b] or offs[b] + size[b] <= offs[a]
