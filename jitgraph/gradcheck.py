"""jg.check_grads: compare build_backward's gradients with central differences."""
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .autodiff import build_backward
from .errors import GraphError
from .graph import Graph, Tensor
from .ops.reduce import sum as reduce_sum
from .program import build_forward
from .registry import LeafIP


class GradientCheckError(AssertionError):
    """check_grads found an analytic gradient that disagrees with finite differences."""


@dataclass
class GradCheckResult:
    ok: bool
    max_abs_error: float
    max_rel_error: float
    n_checked: int
    n_skipped: int                     # coordinates too close to a kink to difference
    errors: list = field(default_factory=list)   # per differentiated argument: max rel error
    analytic: list = field(default_factory=list)
    numeric: list = field(default_factory=list)

    def __str__(self) -> str:
        state = "ok" if self.ok else "MISMATCH"
        return (f"check_grads {state}: max rel error {self.max_rel_error:.3g}, max abs error "
                f"{self.max_abs_error:.3g} over {self.n_checked} coordinates ({self.n_skipped} skipped near kinks)")


def check_grads(fn: Callable[..., Tensor], args: Sequence[Any], *, wrt: Optional[Sequence[int]] = None,
                eps: float = 1e-6, rtol: float = 1e-6, atol: float = 1e-9, kink_tol: float = 1e-3, seed: int = 0,
                raise_on_failure: bool = True) -> GradCheckResult:
    """Check the gradients of ``fn`` at ``args`` against central finite differences.

    ``fn(*tensors)`` builds a graph and returns a Tensor.  Each float array in
    ``args`` becomes a float64 param (integer arrays -- embedding indices -- are
    passed through unchanged).  ``wrt``: indices of the args to differentiate
    (default: every float arg; the others become consts).  A non-scalar output is
    reduced with fixed random weights, which checks the full vector-Jacobian product.

    Each coordinate x_i moves by h = eps * max(1, |x_i|).  Where the two one-sided
    slopes disagree by more than ``kink_tol`` (relative), the point sits on a kink
    (relu at 0, abs at 0, a tie in max) and is skipped rather than reported.
    A coordinate passes when |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|).
    Returns a GradCheckResult; raises GradientCheckError on a mismatch unless
    ``raise_on_failure=False``.
    """
    args = [np.asarray(a) for a in args]
    floats = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    if wrt is None:
        wrt = floats
    wrt = list(wrt)
    for i in wrt:
        if i not in floats:
            raise GraphError(f"check_grads: argument {i} is not a float array and cannot be differentiated")
    g = Graph(np.float64)
    tensors = []
    for i, a in enumerate(args):
        if i in wrt:
            tensors.append(g.param(a, name=f"arg{i}"))
        elif a.dtype.kind == "f":
            tensors.append(g.const(a, name=f"arg{i}"))
        else:
            tensors.append(a)
    out = fn(*tensors)
    if not isinstance(out, Tensor):
        raise GraphError(f"check_grads: fn must return a Tensor, got {type(out).__name__}")
    if out.shape != ():
        weights = np.random.default_rng(seed).uniform(0.5, 1.5, out.shape)
        out = reduce_sum(out * g.const(weights))
    fwd = build_forward(out)
    bwd = build_backward(fwd)
    bwd.run()
    # an argument the function ignores has a zero gradient (and finite differences agree)
    analytic = [bwd.grad(tensors[i]) if tensors[i].id in bwd.params else np.zeros(args[i].shape) for i in wrt]

    def f():
        return float(fwd.run())

    f0 = f()
    numeric, errors = [], []
    max_abs = max_rel = 0.0
    n_checked = n_skipped = 0
    ok = True
    for i, a in zip(wrt, analytic):
        off = int(g.nodes.ip[tensors[i].id, LeafIP.offset])
        num = np.full(args[i].shape, np.nan)
        flat_num = num.reshape(-1)
        flat_a = a.reshape(-1)
        worst = 0.0
        for j in range(args[i].size):
            x = g.store[off + j]
            h = eps * max(1.0, abs(x))
            g.store[off + j] = x + h
            fp = f()
            g.store[off + j] = x - h
            fm = f()
            g.store[off + j] = x
            up, down = (fp - f0) / h, (f0 - fm) / h
            if abs(up - down) > kink_tol * max(1.0, abs(up), abs(down)):
                n_skipped += 1
                continue
            d = (fp - fm) / (2 * h)
            flat_num[j] = d
            err = abs(flat_a[j] - d)
            scale = max(abs(flat_a[j]), abs(d))
            rel = err / scale if scale > atol else 0.0
            n_checked += 1
            max_abs = max(max_abs, err)
            worst = max(worst, rel)
            if err > atol + rtol * scale:
                ok = False
        max_rel = max(max_rel, worst)
        numeric.append(num)
        errors.append(worst)
    result = GradCheckResult(ok, max_abs, max_rel, n_checked, n_skipped, errors, analytic, numeric)
    if not ok and raise_on_failure:
        raise GradientCheckError(str(result))
    return result
