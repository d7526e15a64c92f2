"""Optimizers: SGD (momentum, weight decay) and AdamW, updating every param in one
jitted call.

Params live in the graph's value store and gradients in the backward program's
run buffer, both at offsets fixed when the program was planned, so ``step()``
hands the kernel two buffers and three offset arrays -- no Python loop over
elements, no gathering of gradients into a temporary.  ``step()`` reads the
gradients of the backward run that last computed each param's gradient
(``W.grad``); params without one are skipped, as in PyTorch.
"""
import math
from contextlib import ExitStack
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from numba import njit

from .errors import GraphError
from .graph import Graph, Tensor
from .reductions import dot8_f64


@njit(cache=True, error_model="numpy")
def _grad_sq_norm(grads, g_off, sizes):
    """The sum of every gradient's squares, in float64 with eight partials per param (a
    fixed order: deterministic, and it vectorizes)."""
    total = 0.0
    for k in range(g_off.size):
        o = g_off[k]
        if o >= 0:
            g = grads[o:o + sizes[k]]
            total += dot8_f64(g, g)
    return total


# The update loops index slices from 0 (an offset index keeps Numba's wraparound test,
# which stops vectorization) and use numpy's error model (Python's checks every division
# for zero; eps > 0 and betas < 1 are validated, so none is): 4-5x faster than the
# offset-indexed loops, with the same arithmetic in the same order -- the same bits.
@njit(cache=True, error_model="numpy")
def _sgd_kernel(store, grads, p_off, g_off, sizes, s_off, buf, lr, momentum, dampening, weight_decay,
                nesterov, scale, first_step):
    for k in range(p_off.size):
        n = sizes[k]
        w = store[p_off[k]:p_off[k] + n]
        b = buf[s_off[k]:s_off[k] + n]
        has_grad = g_off[k] >= 0
        gk = grads[g_off[k]:g_off[k] + n] if has_grad else grads[:0]
        for i in range(n):
            g = gk[i] * scale if has_grad else 0.0
            g += weight_decay * w[i]
            if momentum != 0.0:
                bi = g if first_step else momentum * b[i] + (1.0 - dampening) * g
                b[i] = bi
                g = g + momentum * bi if nesterov else bi
            w[i] = w[i] - lr * g


@njit(cache=True, error_model="numpy")
def _adamw_kernel(store, grads, p_off, g_off, sizes, s_off, m, v, lr, beta1, beta2, eps, weight_decay,
                  step, scale):
    c1 = 1.0 - beta1 ** step
    c2 = 1.0 - beta2 ** step
    for k in range(p_off.size):
        n = sizes[k]
        w = store[p_off[k]:p_off[k] + n]
        mk = m[s_off[k]:s_off[k] + n]
        vk = v[s_off[k]:s_off[k] + n]
        has_grad = g_off[k] >= 0
        gk = grads[g_off[k]:g_off[k] + n] if has_grad else grads[:0]
        for i in range(n):
            wi = w[i] * (1.0 - lr * weight_decay)          # decoupled weight decay
            g = gk[i] * scale if has_grad else 0.0
            mi = beta1 * mk[i] + (1.0 - beta1) * g
            vi = beta2 * vk[i] + (1.0 - beta2) * g * g
            mk[i] = mi
            vk[i] = vi
            w[i] = wi - lr * (mi / c1) / (math.sqrt(vi / c2) + eps)


class Optimizer:
    """Base class: the params, their flat state, and finding the gradients."""

    kind = "Optimizer"

    def __init__(self, params: Sequence[Tensor], lr: float, clip_norm: Optional[float]) -> None:
        params = list(params)
        if not params:
            raise GraphError(f"{self.kind}: needs at least one param")
        g: Optional[Graph] = None
        for p in params:
            if not isinstance(p, Tensor) or "param" not in p.flags:
                label = p.label if isinstance(p, Tensor) else type(p).__name__
                raise GraphError(f"{self.kind}: {label!r} is not a param (make trainable tensors with g.param)")
            if g is None:
                g = p.graph
            elif p.graph is not g:
                raise GraphError(f"{self.kind}: params {params[0].label!r} and {p.label!r} belong to different graphs")
        if len({p.id for p in params}) != len(params):
            raise GraphError(f"{self.kind}: a param is listed twice")
        assert g is not None
        self.graph: Graph = g
        self.params = params
        self.lr = _positive(lr, "lr", self.kind, allow_zero=True)
        self.clip_norm = None if clip_norm is None else _positive(clip_norm, "clip_norm", self.kind)
        sizes = np.array([p.size for p in params], np.int64)
        self._sizes = sizes
        self._s_off = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.n_state = int(sizes.sum())
        self.step_count = 0
        self.last_grad_norm: Optional[float] = None
        self._programs: list = []
        self._cache = None

    def _groups(self):
        """Per backward program holding gradients: (mem, p_off, g_off, sizes, s_off).
        Offsets are fixed by the plans, so this is rebuilt only when another backward
        program has computed gradients since (g.grads_version)."""
        g = self.graph
        if self._cache is not None and self._cache[0] == g.grads_version:
            return self._cache[1]
        groups = self._build_groups()
        self._cache = (g.grads_version, groups)
        return groups

    def _build_groups(self):
        g = self.graph
        store_off = g.nodes.ip
        groups = {}
        for k, p in enumerate(self.params):
            source = g.grads.get(p.id)
            if source is None:
                continue
            program, index = source
            n = program.grad_nodes[index]
            if n < 0 and p.id in program._zero_grad_extra:
                raise GraphError(f"{self.kind}: the accumulated gradient of {p.label!r} is not in a run buffer; "
                                 "step after a plain run")
            rows = groups.setdefault(id(program), (program, []))[1]
            rows.append((int(store_off[p.id, 0]), int(program.off[n]) if n >= 0 else -1, k))
        out = []
        self._programs = sorted((program for program, _ in groups.values()), key=id)
        for program, rows in groups.values():
            a = np.array(rows, np.int64)
            out.append((program.mem, a[:, 0].copy(), a[:, 1].copy(), self._sizes[a[:, 2]], self._s_off[a[:, 2]]))
        return out

    def step(self, grad_scale: float = 1.0) -> None:
        """Update every param from its current gradient (W.grad) times ``grad_scale`` (1/k
        after k accumulated micro-batches: their mean).  Holds the lock of each backward
        program whose gradients it reads, so no run of theirs changes them meanwhile (take
        ``bwd.lock`` yourself around run + step to pair them)."""
        grad_scale = _positive(grad_scale, "grad_scale", self.kind)
        groups = self._groups()
        if not groups:
            raise GraphError(f"{self.kind}.step: none of the params has a gradient yet; run a backward graph first")
        with ExitStack() as held:
            for program in self._programs:             # in a fixed order: two optimizers never deadlock
                held.enter_context(program.lock)
            self._step(groups, grad_scale)

    def _step(self, groups, grad_scale=1.0):
        scale = grad_scale
        if self.clip_norm is not None:
            sq = sum(_grad_sq_norm(mem, g_off, sizes) for mem, _, g_off, sizes, _ in groups)
            norm = math.sqrt(sq) * grad_scale
            self.last_grad_norm = norm
            if norm > self.clip_norm:
                scale = grad_scale * (self.clip_norm / (norm + 1e-12))
        self.step_count += 1
        store = self.graph.store
        for mem, p_off, g_off, sizes, s_off in groups:
            self._update(store, mem, p_off, g_off, sizes, s_off, scale)

    def _update(self, store: np.ndarray, mem: np.ndarray, p_off: np.ndarray, g_off: np.ndarray, sizes: np.ndarray,
                s_off: np.ndarray, scale: float) -> None:
        raise NotImplementedError

    def _state(self) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    # -- state --
    def _hyper(self):
        return {"lr": self.lr, "clip_norm": self.clip_norm}

    def state_dict(self) -> Dict[str, Any]:
        """Hyper-parameters, step count and state arrays (copies), plus the param
        names and shapes they belong to."""
        return {"kind": self.kind, "step": self.step_count, "hyper": self._hyper(),
                "params": [(p.name or p.label, p.shape) for p in self.params],
                "state": {k: a.copy() for k, a in self._state().items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("kind") != self.kind:
            got = state.get("kind") if isinstance(state, dict) else type(state).__name__
            raise GraphError(f"{self.kind}.load_state_dict: expects a {self.kind} state, got {got!r}")
        shapes = [tuple(s) for _, s in state["params"]]
        if shapes != [p.shape for p in self.params]:
            raise GraphError(f"{self.kind}.load_state_dict: the state is for params of shapes {shapes}, "
                             f"this optimizer has {[p.shape for p in self.params]}")
        for k, a in self._state().items():
            new = np.asarray(state["state"][k])
            if new.shape != a.shape:
                raise GraphError(f"{self.kind}.load_state_dict: state {k!r} has shape {new.shape}, expected {a.shape}")
            a[...] = new
        self.step_count = int(state["step"])
        for k, v in state["hyper"].items():
            setattr(self, k, v)


def _positive(x, name, kind, allow_zero=False):
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)) or not math.isfinite(x) \
            or x < 0 or (x == 0 and not allow_zero):
        raise GraphError(f"{kind}: {name} must be a {'non-negative' if allow_zero else 'positive'} number, got {x!r}")
    return float(x)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and (L2) weight decay, as torch.optim.SGD:
    g += wd*w; b = momentum*b + (1-dampening)*g (b = g on the first step); w -= lr*(g + momentum*b
    if nesterov else b)."""

    kind = "SGD"

    def __init__(self, params: Sequence[Tensor], lr: float = 0.01, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, clip_norm: Optional[float] = None) -> None:
        super().__init__(params, lr, clip_norm)
        self.momentum = _positive(momentum, "momentum", self.kind, allow_zero=True)
        self.dampening = _positive(dampening, "dampening", self.kind, allow_zero=True)
        self.weight_decay = _positive(weight_decay, "weight_decay", self.kind, allow_zero=True)
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise GraphError("SGD: nesterov needs momentum > 0 and dampening 0")
        self.buf = np.zeros(self.n_state, self.graph.dtype)

    def _update(self, store, mem, p_off, g_off, sizes, s_off, scale):
        _sgd_kernel(store, mem, p_off, g_off, sizes, s_off, self.buf, self.lr, self.momentum, self.dampening,
                    self.weight_decay, self.nesterov, scale, self.step_count == 1)

    def _hyper(self):
        return dict(super()._hyper(), momentum=self.momentum, dampening=self.dampening,
                    weight_decay=self.weight_decay, nesterov=self.nesterov)

    def _state(self):
        return {"buf": self.buf}


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW:
    w *= 1 - lr*wd; m, v moving averages of g and g^2; w -= lr * m_hat / (sqrt(v_hat) + eps)."""

    kind = "AdamW"

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, clip_norm: Optional[float] = None) -> None:
        super().__init__(params, lr, clip_norm)
        try:
            b1, b2 = (float(b) for b in betas)
        except (TypeError, ValueError):
            raise GraphError(f"AdamW: betas must be two numbers, got {betas!r}") from None
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise GraphError(f"AdamW: betas must lie in [0, 1), got {betas!r}")
        self.betas = (b1, b2)
        self.eps = _positive(eps, "eps", self.kind)
        self.weight_decay = _positive(weight_decay, "weight_decay", self.kind, allow_zero=True)
        self.m = np.zeros(self.n_state, self.graph.dtype)
        self.v = np.zeros(self.n_state, self.graph.dtype)

    def _update(self, store, mem, p_off, g_off, sizes, s_off, scale):
        _adamw_kernel(store, mem, p_off, g_off, sizes, s_off, self.m, self.v, self.lr, self.betas[0],
                      self.betas[1], self.eps, self.weight_decay, self.step_count, scale)

    def _hyper(self):
        return dict(super()._hyper(), betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def _state(self):
        return {"m": self.m, "v": self.v}
