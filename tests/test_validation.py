"""Bad input raises GraphError (a ValueError) naming the tensor and the problem."""
import numpy as np
import pytest

import jitgraph as jg


@pytest.fixture
def g():
    return jg.Graph(np.float64)


def test_graph_error_is_a_value_error():
    assert issubclass(jg.GraphError, ValueError)


@pytest.mark.parametrize("op", [jg.add, jg.sub, jg.mul, jg.div])
def test_binary_shape_mismatch_names_both(g, op):
    a = g.input((3, 4), name="a")
    b = g.input((5,), name="b")
    with pytest.raises(jg.GraphError, match=r"'a' \(3, 4\) and 'b' \(5,\) do not broadcast"):
        op(a, b)


def test_matmul_mismatch_names_both(g):
    a = g.input((3, 4), name="a")
    b = g.input((5, 2), name="b")
    with pytest.raises(jg.GraphError, match=r"matmul: inner dims differ: 'a' \(3, 4\) @ 'b' \(5, 2\)"):
        a @ b
    c = g.input((2, 4, 5), name="c")
    d = g.input((3, 5, 1), name="d")
    with pytest.raises(jg.GraphError, match="batch dims of 'c'.*'d'.*do not broadcast"):
        c @ d
    with pytest.raises(jg.GraphError, match="scalar"):
        jg.matmul(a, g.input((), name="s"))


def test_mixing_graphs(g):
    other = jg.Graph(np.float64)
    a = g.input((3,), name="a")
    b = other.input((3,), name="b")
    with pytest.raises(jg.GraphError, match="'a' and 'b' belong to different graphs"):
        a + b
    with pytest.raises(jg.GraphError, match="different graphs"):
        jg.concat([a, b])
    with pytest.raises(jg.GraphError, match="different graphs"):
        jg.build_forward([a, b])


@pytest.mark.parametrize("fn,msg", [
    (lambda t: jg.sum(t, axis=2), "axis 2 is out of range for 2 dims"),
    (lambda t: jg.mean(t, axis=-3), "axis -3 is out of range"),
    (lambda t: jg.max(t, axis=(0, 0)), "repeats an axis"),
    (lambda t: jg.sum(t, axis=1.5), "axis must be an int"),
    (lambda t: jg.softmax(t, axis=5), "out of range"),
    (lambda t: jg.transpose(t, (0, 0)), "not a permutation"),
    (lambda t: jg.transpose(t, (0,)), "not a permutation"),
    (lambda t: jg.concat([t, t], axis=3), "out of range"),
    (lambda t: jg.reshape(t, (5, 5)), r"cannot reshape \(3, 4\) \(size 12\) to \(5, 5\)"),
    (lambda t: jg.reshape(t, (-1, -1)), "at most one dimension may be -1"),
    (lambda t: jg.reshape(t, (5, -1)), "cannot reshape"),
    (lambda t: jg.reshape(t, (12, 0)), "dimension 0"),
    (lambda t: jg.dropout(t, 1.0), r"p must be a number in \[0, 1\)"),
    (lambda t: jg.dropout(t, -0.1), r"p must be a number in \[0, 1\)"),
    (lambda t: jg.dropout(t, 0.5, seed="x"), "seed must be an int"),
    (lambda t: jg.layer_norm(t, eps=-1.0), "eps must be a finite number >= 0"),
    (lambda t: jg.rms_norm(t, eps=float("nan")), "eps must be"),
    (lambda t: jg.scale(t, "2"), "must be a real number"),
    (lambda t: jg.slice_axis(t, 1, 3, 2), "empty or outside"),
    (lambda t: jg.pad_axis(t, 0, -1, 0), ">= 0"),
    (lambda t: jg.broadcast_to(t, (4, 3)), "cannot broadcast"),
    (lambda t: jg.cross_entropy(t, np.zeros((3, 5))), r"target .* \(3, 5\) must have the shape of logits 't' \(3, 4\)"),
    (lambda t: jg.embedding(t, np.array([0, 1])), None),   # valid: a (3, 4) table
    (lambda t: jg.embedding(t, np.array([0, 3])), r"must lie in \[0, 3\)"),
    (lambda t: jg.embedding(t, np.array([0.5])), "must be integers"),
    (lambda t: jg.embedding(t, t), "must be an integer input"),
    (lambda t: t + "a", "operand of type str is not a Tensor"),
    (lambda t: t + np.array(["a"]), "constant operand: values must be real numbers"),
    (lambda t: t + object(), "is not a Tensor, number or array"),
    (lambda t: jg.concat(t), "expects a list"),
    (lambda t: jg.concat([]), "at least one"),
])
def test_bad_op_arguments(g, fn, msg):
    t = g.input((3, 4), name="t")
    if msg is None:
        fn(t)
        return
    with pytest.raises(jg.GraphError, match=msg):
        fn(t)


def test_bad_op_arguments_name_the_tensor(g):
    t = g.input((3, 4), name="activations")
    with pytest.raises(jg.GraphError, match="'activations'"):
        jg.sum(t, axis=7)
    with pytest.raises(jg.GraphError, match="'activations'"):
        jg.reshape(t, (7,))


@pytest.mark.parametrize("shape,msg", [((3, 0), "dimension 0"), ((2, 2, 2, 2, 2), "at most 4"),
                                       (("a",), "must hold ints"), (3.5, "tuple of ints"), ((-1,), "dimension -1")])
def test_bad_leaf_shapes(g, shape, msg):
    with pytest.raises(jg.GraphError, match=msg):
        g.input(shape, name="x")


def test_bad_leaf_values_and_names(g):
    with pytest.raises(jg.GraphError, match="param 'W': values must be real numbers"):
        g.param(np.array(["a", "b"]), name="W")
    with pytest.raises(jg.GraphError, match="values must be real numbers"):
        g.const(np.array([1 + 2j]))
    with pytest.raises(jg.GraphError, match="cannot make an array"):
        g.param([[1.0, 2.0], [3.0]], name="ragged")
    g.input((2,), name="x")
    with pytest.raises(jg.GraphError, match="name 'x' is already used"):
        g.input((2,), name="x")
    with pytest.raises(jg.GraphError, match="non-empty string"):
        g.input((2,), name="")
    with pytest.raises(jg.GraphError, match="float32 or float64"):
        jg.Graph(np.int32)
    with pytest.raises(jg.GraphError, match="dtype must be a float or integer type"):
        g.input((2,), name="s", dtype=np.str_)


def test_value_assignment_is_checked(g):
    W = g.param(np.zeros((2, 3)), name="W")
    with pytest.raises(jg.GraphError, match=r"value of 'W': shape \(3, 2\) does not match the tensor's shape \(2, 3\)"):
        W.value = np.zeros((3, 2))
    x = g.input((2,), name="x")
    with pytest.raises(jg.GraphError, match="'x' \\(input\\) has no stored value"):
        x.value


def test_feed_errors(g):
    x = g.input((2, 3), name="x")
    idx = g.input((2,), name="idx", dtype=np.int64)
    T = g.param(np.zeros((4, 3)), name="T")
    W = g.param(np.ones((3,)), name="W")
    other = jg.Graph(np.float64).input((2, 3), name="x_other")
    fwd = jg.build_forward(x * W + jg.embedding(T, idx))
    good = {x: np.zeros((2, 3)), idx: np.array([0, 3])}
    fwd.run(good)
    with pytest.raises(jg.GraphError, match=r"missing feed for input 'idx' of shape \(2,\)"):
        fwd.run({x: np.zeros((2, 3))})
    with pytest.raises(jg.GraphError, match=r"feed for 'x': shape \(3, 2\) does not match the input's shape \(2, 3\)"):
        fwd.run({**good, x: np.zeros((3, 2))})
    with pytest.raises(jg.GraphError, match="feed for 'x': dtype complex128 cannot|values must be real"):
        fwd.run({**good, x: np.zeros((2, 3), complex)})
    with pytest.raises(jg.GraphError, match="feed for 'x': values must be real numbers"):
        fwd.run({**good, x: np.array([["a"] * 3] * 2)})
    with pytest.raises(jg.GraphError, match="feed for index input 'idx': dtype must be an integer type, got float64"):
        fwd.run({**good, idx: np.array([0.0, 1.0])})
    with pytest.raises(jg.GraphError, match="feed for 'W': not an input"):
        fwd.run({**good, W: np.ones(3)})
    with pytest.raises(jg.GraphError, match="feed for 'x_other': the tensor belongs to a different graph"):
        fwd.run({**good, other: np.zeros((2, 3))})
    with pytest.raises(jg.GraphError, match="no tensor named 'nope'"):
        fwd.run({**good, "nope": 1})
    with pytest.raises(jg.GraphError, match="feeds must be a dict"):
        fwd.run([np.zeros((2, 3))])
    # feeding by name works
    fwd.run({"x": np.zeros((2, 3)), "idx": np.array([1, 2])})


def test_embedding_index_out_of_range_at_run_time(g):
    T = g.param(np.arange(12.0).reshape(4, 3), name="T")
    idx = g.input((3,), name="idx", dtype=np.int64)
    fwd = jg.build_forward(jg.embedding(T, idx))
    np.testing.assert_array_equal(fwd.run({idx: [3, 0, 1]}), np.arange(12.0).reshape(4, 3)[[3, 0, 1]])
    with pytest.raises(jg.GraphError, match=r"index 4 at position 1 of 'idx' is not an integer in \[0, 4\)"):
        fwd.run({idx: [0, 4, 1]})
    with pytest.raises(jg.GraphError, match=r"index -1 at position 2"):
        fwd.run({idx: [0, 1, -1]})
    # the program stays usable after an error
    np.testing.assert_array_equal(fwd.run({idx: [1, 1, 1]}), np.arange(12.0).reshape(4, 3)[[1, 1, 1]])


def test_build_forward_argument_errors(g):
    with pytest.raises(jg.GraphError, match="expects a Tensor or a list"):
        jg.build_forward(3)
    with pytest.raises(jg.GraphError, match="at least one output"):
        jg.build_forward([])
    with pytest.raises(jg.GraphError, match="outputs must be Tensors"):
        jg.build_forward([np.zeros(2)])
