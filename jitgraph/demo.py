"""``jitgraph demo``: train a deep MLP on handwritten digits twice -- without
checkpointing and with a checkpoint strategy -- and compare memory, time, loss,
accuracy, and whether the two runs' losses are bit-identical.

The digits ship with the package (``data/digits.npz``, 45 KB): the 1797 8x8 images of
the test set of "Optical Recognition of Handwritten Digits" (E. Alpaydin, C. Kaynak, UCI
Machine Learning Repository, 1998; CC BY 4.0), the same images scikit-learn's
``load_digits`` gives, so the demo installs nothing more."""
import os
import time

import numpy as np

import jitgraph as jg


def load_data(seed=0, n_test=360):
    """The 8x8 digits (1797 images) with a fixed train/test split, standardized on train."""
    with np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.npz")) as f:
        X, y = f["images"].reshape(-1, 64).astype(np.float64), f["labels"].astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(X))
    test, train = perm[:n_test], perm[n_test:]
    X = X.astype(np.float32) / 16.0
    mu, sd = X[train].mean(0), X[train].std(0) + 1e-3
    X = ((X - mu) / sd).astype(np.float32)
    Y = np.eye(10, dtype=np.float32)[y]
    return X[train], Y[train], X[test], y[test]


def build(depth, width, batch, n_test, dropout, strategy, seed=1):
    """A pre-norm residual MLP, h = h + dropout(relu(layer_norm(h) @ W + b)), with a
    training loss on (batch, 64) inputs and a test forward on (n_test, 64), sharing params."""
    rng = np.random.default_rng(seed)
    g = jg.Graph(np.float32)
    W_in = g.param(rng.standard_normal((64, width)) * np.sqrt(2 / 64), name="W_in")
    b_in = g.param(np.zeros(width), name="b_in")
    blocks = [(g.param(rng.standard_normal((width, width)) * np.sqrt(0.5 / width), name=f"W{i}"),
               g.param(np.zeros(width), name=f"b{i}")) for i in range(depth)]
    W_out = g.param(rng.standard_normal((width, 10)) * np.sqrt(1 / width), name="W_out")
    b_out = g.param(np.zeros(10), name="b_out")

    def net(x, train):
        h = jg.relu(x @ W_in + b_in)
        for i, (W, b) in enumerate(blocks):
            r = jg.relu(jg.layer_norm(h) @ W + b)
            if train and dropout:
                r = jg.dropout(r, dropout, seed=i)
            h = h + r
        return h @ W_out + b_out

    x = g.input((batch, 64), name="x")
    t = g.input((batch, 10), name="t")
    loss = jg.cross_entropy(net(x, True), t).named("loss")
    fwd = jg.build_forward(loss)
    bwd = jg.build_backward(fwd) if strategy == "none" else jg.build_backward(fwd, checkpoints=strategy)
    x_test = g.input((n_test, 64), name="x_test")
    test_logits = jg.build_forward(net(x_test, False))
    params = [jg.Tensor(g, p) for p in g.params]
    return bwd, x, t, x_test, test_logits, params


def run_once(strategy, data, args, progress):
    Xtr, Ytr, Xte, yte = data
    bwd, x, t, x_test, test_logits, params = build(args.depth, args.width, args.batch, len(Xte),
                                                   args.dropout, strategy)
    opt = jg.optim.AdamW(params, lr=args.lr, weight_decay=1e-4, clip_norm=1.0)
    times, losses = [], []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses += jg.train(bwd, opt, {x: Xtr, t: Ytr}, epochs=1, batch_size=args.batch,
                           seed=args.seed * 1_000_003 + epoch * 10_007 + len(losses),
                           progress=progress, desc=f"{strategy} epoch {epoch + 1}/{args.epochs}")
        times.append(time.perf_counter() - t0)
    acc = float((test_logits.run({x_test: Xte}).argmax(1) == yte).mean())
    steady = times[1:] or times
    return dict(strategy=strategy, peak=bwd.peak_bytes, stats=bwd.stats(), epoch_time=float(np.median(steady)),
                first_epoch=times[0], loss=float(np.mean(losses[-(len(Xtr) // args.batch):])), acc=acc,
                losses=np.array(losses))


def main(args, out=print):
    progress = not args.no_progress
    data = load_data(args.seed)
    n_train = len(data[0])
    out(f"jitgraph demo: handwritten digits (8x8, scikit-learn), {n_train} train / {len(data[2])} test images")
    out(f"model: pre-norm residual MLP, {args.depth} blocks of width {args.width}, dropout {args.dropout}; "
        f"AdamW lr {args.lr}, batch {args.batch}, {args.epochs} epochs\n")
    runs = [run_once(s, data, args, progress) for s in ("none", args.strategy)]
    a, b = runs
    head = f"{'checkpointing':<14} {'planned peak':>13} {'recomputed':>10} {'time/epoch':>10} {'final loss':>10} {'test acc':>8}"
    out(head)
    out("-" * len(head))
    for r in runs:
        out(f"{r['strategy']:<14} {r['peak'] / 1024:>10.1f} KiB {r['stats']['n_recomputed']:>10d} "
            f"{r['epoch_time'] * 1e3:>7.1f} ms {r['loss']:>10.4f} {r['acc']:>8.4f}")
    same = a["losses"].shape == b["losses"].shape and np.array_equal(a["losses"], b["losses"])
    out(f"\npeak with {b['strategy']!r}: {b['peak'] / a['peak']:.2f} x without; "
        f"the two runs' {len(a['losses'])} losses are bit-identical: {'yes' if same else 'NO'}")
    out(f"(first epochs, including JIT compile or cache load: {a['first_epoch']:.2f} s and {b['first_epoch']:.2f} s)")
    return 0 if same else 1


def add_arguments(p):
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--depth", type=int, default=16, help="residual blocks")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--strategy", default="sqrt", help="checkpoint strategy of the second run (default sqrt)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
