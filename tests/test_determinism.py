"""The same program and feeds give bit-identical results across processes."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent

SCRIPT = r"""
import hashlib, numpy as np, jitgraph as jg
from tests.test_io import every_op_model, feeds
h = hashlib.sha256()
for dtype in (np.float32, np.float64):
    g, x, idx, loss, params = every_op_model(dtype)
    for kw in ({}, {"checkpoints": "sqrt"}):
        bwd = jg.build_backward(jg.build_forward(loss), **kw)
        opt = jg.optim.AdamW(params, lr=1e-2)
        for step in range(3):
            h.update(np.asarray(bwd.run(feeds(x, idx), seed=step)).tobytes())
            opt.step()
        for p in params:
            h.update(p.grad.tobytes()); h.update(p.value.tobytes())
print(h.hexdigest())
"""


def digest_in_child():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONHASHSEED="random")
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_bit_identical_across_processes():
    a, b = digest_in_child(), digest_in_child()
    assert a == b and len(a) == 64
    # and the same in this process
    ns = {}
    exec(compile(SCRIPT.replace("print(h.hexdigest())", "result = h.hexdigest()"), "<script>", "exec"), ns)
    assert ns["result"] == a
