"""A catalogue of bad inputs through the public API.

``python -m tests.bad_inputs`` runs every case and prints one JSON line per case;
tests/test_bad_inputs.py runs it in a child process, so a crash (a segfault in
compiled code) fails the test instead of killing pytest.
"""
import json
import sys

import numpy as np

import jitgraph as jg


def graph():
    g = jg.Graph(np.float64)
    x = g.input((3, 4), name="x")
    W = g.param(np.ones((4, 2)), name="W")
    return g, x, W


def scalar_program():
    g, x, W = graph()
    loss = jg.mean(jg.relu(x @ W)).named("loss")
    return g, x, W, loss, jg.build_forward(loss)


def binary(op):
    def case():
        g, x, W = graph()
        op(x, g.input((5,), name="y"))
    return case


def run_feed(feed_of):
    def case():
        g, x, W, loss, fwd = scalar_program()
        fwd.run(feed_of(g, x, W))
    return case


def backward(**kw):
    def case():
        g, x, W, loss, fwd = scalar_program()
        jg.build_backward(fwd, **{k: (v(g, x, W) if callable(v) else v) for k, v in kw.items()})
    return case


def embedding_run(indices):
    def case():
        g = jg.Graph(np.float32)
        T = g.param(np.zeros((5, 2)), name="T")
        i = g.input((3,), name="i", dtype=np.int64)
        jg.build_forward(jg.embedding(T, i)).run({i: np.array(indices)})
    return case


def corrupted_file():
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".npz", delete=False) as f:
        f.write(b"PK\x03\x04 this is not really a zip")
    jg.load(f.name)


GE = "GraphError"
CASES = [
    ("add shapes", binary(jg.add), GE, r"add: shapes of 'x' \(3, 4\) and 'y' \(5,\) do not broadcast"),
    ("sub shapes", binary(jg.sub), GE, r"sub: shapes of 'x' \(3, 4\) and 'y'"),
    ("mul shapes", binary(jg.mul), GE, r"mul: shapes of 'x' \(3, 4\) and 'y'"),
    ("div shapes", binary(jg.div), GE, r"div: shapes of 'x' \(3, 4\) and 'y'"),
    ("matmul inner dims", lambda: (lambda g, x, W: x @ x)(*graph()), GE, r"inner dims differ: 'x' \(3, 4\) @ 'x'"),
    ("matmul batch dims", lambda: (lambda g: g.input((2, 3, 4), name="a") @ g.input((3, 4, 5), name="b"))(
        jg.Graph()), GE, "batch dims of 'a'"),
    ("matmul scalar", lambda: (lambda g: g.input((3,), name="v") @ g.input((), name="s"))(jg.Graph()), GE,
     "'s' is a scalar"),
    ("sum axis", lambda: jg.sum(graph()[1], axis=2), GE, "sum of 'x': axis 2 is out of range for 2 dims"),
    ("softmax axis", lambda: jg.softmax(graph()[1], axis=-3), GE, "softmax of 'x': axis -3 is out of range"),
    ("transpose axes", lambda: jg.transpose(graph()[1], (1, 1)), GE, "not a permutation"),
    ("concat shapes", lambda: (lambda g, x, W: jg.concat([x, W], axis=0))(*graph()), GE,
     r"'W' \(4, 2\) does not match 'x' \(3, 4\)"),
    ("reshape size", lambda: jg.reshape(graph()[1], (5, 3)), GE, r"cannot reshape \(3, 4\) \(size 12\)"),
    ("feed missing", run_feed(lambda g, x, W: {}), GE, r"missing feed for input 'x' of shape \(3, 4\)"),
    ("feed extra", run_feed(lambda g, x, W: {x: np.zeros((3, 4)), g.input((2,), name="z"): np.zeros(2)}), GE,
     "feed for 'z': an input this program does not read"),
    ("feed shape", run_feed(lambda g, x, W: {x: np.zeros((4, 3))}), GE,
     r"feed for 'x': shape \(4, 3\) does not match"),
    ("feed dtype", run_feed(lambda g, x, W: {x: np.zeros((3, 4), complex)}), GE, "feed for 'x'"),
    ("feed strings", run_feed(lambda g, x, W: {x: np.full((3, 4), "a")}), GE,
     "feed for 'x': values must be real numbers"),
    ("feed a param", run_feed(lambda g, x, W: {x: np.zeros((3, 4)), W: np.ones((4, 2))}), GE,
     "feed for 'W': not an input"),
    ("feed other graph", run_feed(lambda g, x, W: {x: np.zeros((3, 4)), graph()[1]: np.zeros((3, 4))}), GE,
     "belongs to a different graph"),
    ("mixed graphs", lambda: graph()[1] + graph()[1], GE, "'x' and 'x' belong to different graphs"),
    ("checkpoint not in graph", backward(checkpoints=lambda g, x, W: [jg.exp(x).named("stray")]), GE,
     "checkpoint 'stray' is not in the forward graph of loss 'loss'"),
    ("checkpoint other graph", backward(checkpoints=lambda g, x, W: [graph()[2]]), GE,
     "checkpoint 'W' belongs to a different graph"),
    ("unknown strategy", backward(checkpoints="cubic"), GE, "unknown checkpoint strategy 'cubic'"),
    ("unknown policy", backward(policy="save_everything"), GE, "unknown policy 'save_everything'"),
    ("budget too small", backward(memory_budget=8), GE,
     r"memory_budget of 8 bytes cannot be met: the smallest planned peak found is \d+ bytes"),
    ("budget negative", backward(memory_budget=-1024), GE, "memory_budget must be positive"),
    ("budget not a number", backward(memory_budget=1.5), GE, "memory_budget must be a number of bytes"),
    ("loss not scalar", lambda: jg.build_backward(jg.build_forward(graph()[2])), GE,
     r"the loss 'W' must be a scalar, got shape \(4, 2\)"),
    ("backward of a tensor", lambda: jg.build_backward(graph()[2]), GE, "expects the ForwardGraph"),
    ("dropout p = 1", lambda: jg.dropout(graph()[1], 1.0), GE, r"dropout of 'x': p must be a number in \[0, 1\)"),
    ("dropout p < 0", lambda: jg.dropout(graph()[1], -0.5), GE, r"p must be a number in \[0, 1\)"),
    ("dropout p NaN", lambda: jg.dropout(graph()[1], float("nan")), GE, r"p must be a number in \[0, 1\)"),
    ("embedding index too big", embedding_run([0, 5, 1]), GE,
     r"index 5 at position 1 of 'i' is not an integer in \[0, 5\)"),
    ("embedding index negative", embedding_run([-1, 0, 1]), GE, r"index -1 at position 0"),
    ("embedding float indices", lambda: (lambda g: jg.embedding(g.param(np.zeros((5, 2)), name="T"),
                                                                np.array([0.5])))(jg.Graph()), GE,
     "must be integers"),
    ("embedding const range", lambda: (lambda g: jg.embedding(g.param(np.zeros((5, 2)), name="T"),
                                                              np.array([7])))(jg.Graph()), GE,
     r"must lie in \[0, 5\)"),
    ("param of strings", lambda: jg.Graph().param(["a", "b"], name="P"), GE,
     "param 'P': values must be real numbers"),
    ("operand of strings", lambda: graph()[1] * "3", GE, "operand of type str is not a Tensor"),
    ("object operand", lambda: graph()[1] + object(), GE, "is not a Tensor, number or array"),
    ("segment returns int", lambda: jg.checkpoint(lambda t: 42, graph()[1]), GE,
     "the segment function must return a Tensor or a tuple of Tensors, got int"),
    ("segment not callable", lambda: jg.checkpoint("fn", graph()[1]), GE, "the first argument must be the segment"),
    ("graph dtype", lambda: jg.Graph(np.int16), GE, "float32 or float64"),
    ("negative dim", lambda: jg.Graph().input((3, -2), name="n"), GE, "dimension -2"),
    ("five dims", lambda: jg.Graph().input((1, 2, 3, 4, 5), name="five"), GE, "at most 4 are supported"),
    ("optimizer on input", lambda: jg.optim.AdamW([graph()[1]]), GE, "'x' is not a param"),
    ("grad before run", lambda: graph()[2].grad, GE, "param 'W' has no gradient yet"),
    ("value wrong shape", lambda: setattr(graph()[2], "value", np.zeros(3)), GE,
     r"value of 'W': shape \(3,\) does not match"),
    ("layer_norm eps", lambda: jg.layer_norm(graph()[1], eps=-1e-5), GE, "eps must be a finite number >= 0"),
    ("run seed", lambda: (lambda g, x, W, loss, fwd: fwd.run({x: np.zeros((3, 4))}, seed="a"))(*scalar_program()),
     GE, "run: seed must be an int, got 'a'"),
    ("corrupted file", corrupted_file, GE, "not a jitgraph file, or it is truncated or corrupted"),
    ("batch size", lambda: list(jg.batches({graph()[1]: np.zeros((4, 4))}, 0)), GE, "batch_size must be an int"),
]


def main():
    for name, fn, kind, pattern in CASES:
        try:
            fn()
            result = {"name": name, "raised": None}
        except Exception as e:           # noqa: BLE001 -- the point is to see what was raised
            result = {"name": name, "raised": type(e).__name__, "message": str(e),
                      "is_value_error": isinstance(e, ValueError)}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
