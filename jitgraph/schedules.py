"""Learning-rate schedules for ``jg.train(lr=...)``: callables of the optimizer step (0, 1,
...) returning the rate for that step.  Any callable of the step works the same way."""
import math
from typing import Any

from .errors import GraphError

__all__ = ["warmup_cosine", "warmup_linear", "step_decay", "Schedule"]


def _check(value: Any, name: str, lo: float = 0.0, integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < lo:
        kind = "an int" if integer else "a number"
        raise GraphError(f"schedule: {name} must be {kind} >= {lo}, got {value!r}")
    return value


class Schedule:
    """A rate that rises linearly from 0 over ``warmup_steps``, then follows ``decay``."""

    def __init__(self, lr: float, warmup_steps: int = 0) -> None:
        self.lr = float(_check(lr, "lr"))
        self.warmup_steps = _check(warmup_steps, "warmup_steps", integer=True)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.decay(step - self.warmup_steps)

    def decay(self, t: int) -> float:
        return self.lr

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class _Cosine(Schedule):
    def __init__(self, lr: float, total_steps: int, warmup_steps: int, min_lr: float) -> None:
        super().__init__(lr, warmup_steps)
        self.total_steps = _check(total_steps, "total_steps", lo=warmup_steps + 1, integer=True)
        self.min_lr = float(_check(min_lr, "min_lr"))

    def decay(self, t: int) -> float:
        frac = min(t / max(1, self.total_steps - self.warmup_steps), 1.0)
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * frac))


class _Linear(_Cosine):
    def decay(self, t: int) -> float:
        frac = min(t / max(1, self.total_steps - self.warmup_steps), 1.0)
        return self.lr + (self.min_lr - self.lr) * frac


class _Step(Schedule):
    def __init__(self, lr: float, step_size: int, gamma: float, warmup_steps: int) -> None:
        super().__init__(lr, warmup_steps)
        self.step_size = _check(step_size, "step_size", lo=1, integer=True)
        self.gamma = float(_check(gamma, "gamma"))

    def decay(self, t: int) -> float:
        return self.lr * self.gamma ** (t // self.step_size)


def warmup_cosine(lr: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0) -> Schedule:
    """Linear warmup to ``lr`` over ``warmup_steps``, then a half cosine down to ``min_lr`` at
    ``total_steps`` (and ``min_lr`` after)."""
    return _Cosine(lr, total_steps, warmup_steps, min_lr)


def warmup_linear(lr: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0) -> Schedule:
    """Linear warmup, then a straight line from ``lr`` to ``min_lr`` at ``total_steps``."""
    return _Linear(lr, total_steps, warmup_steps, min_lr)


def step_decay(lr: float, step_size: int, gamma: float = 0.1, warmup_steps: int = 0) -> Schedule:
    """Linear warmup, then ``lr`` times ``gamma`` every ``step_size`` steps (PyTorch's StepLR)."""
    return _Step(lr, step_size, gamma, warmup_steps)
