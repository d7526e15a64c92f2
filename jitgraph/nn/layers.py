"""The layers: PyTorch's names for parameters and buffers, its layouts and its default
initializations (drawn from ``nn.manual_seed``'s generator), each ``forward`` a few jitgraph
ops.  Shapes are checked where a layer is called, naming the layer and the input."""
import math
import numbers
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from .. import ops  # noqa: F401  -- the op table
from ..errors import GraphError
from ..graph import Tensor
from ..ops.conv import conv1d, conv2d
from ..ops.attention import attention
from ..ops.batchnorm import batch_norm
from ..ops.gather import embedding
from ..ops.norm import layer_norm, rms_norm
from ..ops.shape import reshape, slice_axis, transpose
from ..ops.stochastic import dropout
from ..ops import unary
from ..ops.softmaxes import log_softmax, softmax
from .module import Module, fan_in_bound, normal, uniform

Pair = Union[int, Tuple[int, int]]


def _positive_int(v: Any, what: str, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise GraphError(f"{what}: {name} must be an int >= 1, got {v!r}")
    return int(v)


def _ints(v: Any, dims: int, what: str, name: str, lo: int) -> Tuple[int, ...]:
    """An int (for every axis) or a tuple of ``dims`` ints, each >= lo."""
    vals = (v,) * dims if isinstance(v, numbers.Integral) else tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(vals) != dims or any(isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < lo for x in vals):
        raise GraphError(f"{what}: {name} must be an int >= {lo} or a tuple of {dims}, got {v!r}")
    return tuple(int(x) for x in vals)


def _need(x: Any, layer: Module, ndims: Sequence[int], axis: int, size: Optional[int], what: str) -> Tensor:
    """x as a Tensor of one of ``ndims`` dims whose ``axis`` has ``size``: else a GraphError
    naming the layer, the input and the problem."""
    name = type(layer).__name__
    if not isinstance(x, Tensor):
        raise GraphError(f"{name}: expects a Tensor, got {type(x).__name__}")
    if x.ndim not in ndims:
        raise GraphError(f"{name}: input {x.label!r} has shape {x.shape}; expected {what}")
    if size is not None and x.shape[axis] != size:
        raise GraphError(f"{name}: input {x.label!r} has shape {x.shape}; its axis {axis} must be {size} ({what})")
    return x


# ---- the layers' math, shared with jg.from_torch's rules (importer.py) ---------------------------------
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x W^T + b, W (out, in): the transpose is read in place by the product."""
    y = x @ transpose(weight)
    return y if bias is None else y + bias


def channel_bias(y: Tensor, bias: Optional[Tensor]) -> Tensor:
    """y (N, C, *spatial) plus a (C,) bias on each channel."""
    return y if bias is None else y + reshape(bias, (1, -1) + (1,) * (y.ndim - 2))


def gelu_tanh(x: Tensor) -> Tensor:
    """PyTorch's tanh GELU, x^3 as products as its kernel (pow would be an exp and a log)."""
    return x * 0.5 * (unary.tanh((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)) + 1.0)


def flatten(x: Tensor, start: int = 0, end: int = -1) -> Tensor:
    """Axes start..end (inclusive) merged into one."""
    nd = max(x.ndim, 1)
    a, b = start % nd, end % nd
    if a > b:
        raise GraphError(f"flatten: start_dim {start} comes after end_dim {end} for {x.shape}")
    return reshape(x, x.shape[:a] + (int(np.prod(x.shape[a:b + 1])),) + x.shape[b + 1:])


# ---- products ----------------------------------------------------------------------------------
class Linear(Module):
    """y = x W^T + b: weight (out_features, in_features), bias (out_features,); x (..., in_features)."""
    weight: Tensor
    bias: Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear", "in_features")
        self.out_features = _positive_int(out_features, "Linear", "out_features")
        bound = fan_in_bound(self.in_features)
        self.register_parameter("weight", uniform((self.out_features, self.in_features), bound))
        self.has_bias = bool(bias)
        if bias:
            self.register_parameter("bias", uniform((self.out_features,), bound))

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, self, (1, 2, 3, 4), -1, self.in_features, f"(..., {self.in_features})")
        return linear(x, self.weight, self.bias if self.has_bias else None)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}"


class _ConvNd(Module):
    weight: Tensor
    bias: Tensor

    def __init__(self, dims: int, in_channels: int, out_channels: int, kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any, groups: int, bias: bool) -> None:
        super().__init__()
        what = type(self).__name__
        self.in_channels = _positive_int(in_channels, what, "in_channels")
        self.out_channels = _positive_int(out_channels, what, "out_channels")
        self.groups = _positive_int(groups, what, "groups")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise GraphError(f"{what}: in_channels {in_channels} and out_channels {out_channels} must divide by "
                             f"groups {groups}")
        if isinstance(padding, str):
            raise GraphError(f"{what}: padding must be ints (string paddings such as {padding!r} are not offered)")
        self.kernel_size = _ints(kernel_size, dims, what, "kernel_size", 1)
        self.stride = _ints(stride, dims, what, "stride", 1)
        self.padding = _ints(padding, dims, what, "padding", 0)
        self.dilation = _ints(dilation, dims, what, "dilation", 1)
        fan_in = self.in_channels // self.groups * int(np.prod(self.kernel_size))
        bound = fan_in_bound(fan_in)
        self.register_parameter("weight", uniform((self.out_channels, self.in_channels // self.groups) + self.kernel_size, bound))
        self.has_bias = bool(bias)
        if bias:
            self.register_parameter("bias", uniform((self.out_channels,), bound))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}" + (f", groups={self.groups}" if self.groups > 1 else "")
                + ("" if self.has_bias else ", bias=False"))


class Conv2d(_ConvNd):
    """2-D convolution, x (N, C_in, H, W) -> (N, C_out, OH, OW); weight (C_out, C_in / groups, kh, kw)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Pair, stride: Pair = 1, padding: Pair = 0,
                 dilation: Pair = 1, groups: int = 1, bias: bool = True) -> None:
        super().__init__(2, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, self, (4,), 1, self.in_channels, f"(N, {self.in_channels}, H, W)")
        y = conv2d(x, self.weight, self.stride, self.padding, self.dilation, self.groups)
        return channel_bias(y, self.bias if self.has_bias else None)


class Conv1d(_ConvNd):
    """1-D convolution, x (N, C_in, L) -> (N, C_out, OL); weight (C_out, C_in / groups, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1, groups: int = 1, bias: bool = True) -> None:
        super().__init__(1, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, self, (3,), 1, self.in_channels, f"(N, {self.in_channels}, L)")
        y = conv1d(x, self.weight, self.stride[0], self.padding[0], self.dilation[0], self.groups)
        return channel_bias(y, self.bias if self.has_bias else None)


# ---- normalization -----------------------------------------------------------------------------
class _BatchNorm(Module):
    ndims: Tuple[int, ...] = ()
    _layout = ""
    weight: Tensor
    bias: Tensor
    running_mean: Tensor
    running_var: Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__()
        self.num_features = _positive_int(num_features, type(self).__name__, "num_features")
        self.eps, self.momentum = eps, momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        if affine:
            self.register_parameter("weight", np.ones(self.num_features))
            self.register_parameter("bias", np.zeros(self.num_features))
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(self.num_features))
            self.register_buffer("running_var", np.ones(self.num_features))
            # PyTorch counts training batches here (read only when momentum is None, which
            # jitgraph does not offer); carried through save and load unchanged
            self.register_buffer("num_batches_tracked", np.array(0, np.int64), on_graph=False)

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, self, self.ndims, 1, self.num_features, self._layout)
        stats = self.track_running_stats
        if not self.training and not stats:
            raise GraphError(f"{type(self).__name__}: evaluation needs running statistics (track_running_stats=True)")
        return batch_norm(x, self.weight if self.affine else None, self.bias if self.affine else None,
                          self.running_mean if stats else None, self.running_var if stats else None,
                          training=self.training, momentum=self.momentum, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchNorm1d(_BatchNorm):
    """Batch norm of x (N, C) or (N, C, L) per channel; weight, bias, running_mean, running_var."""
    ndims = (2, 3)
    _layout = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch norm of x (N, C, H, W) per channel; weight, bias, running_mean, running_var."""
    ndims = (4,)
    _layout = "(N, C, H, W)"


def _last_dim(shape: Any, what: str) -> int:
    dims = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape) if isinstance(shape, (tuple, list)) else None
    if dims is None or len(dims) != 1:
        raise GraphError(f"{what}: normalized_shape must be one int (the last axis), got {shape!r}")
    return _positive_int(dims[0], what, "normalized_shape")


class LayerNorm(Module):
    """Normalize the last axis; weight (ones) and bias (zeros) of its size."""
    weight: Tensor
    bias: Tensor

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        self.d = _last_dim(normalized_shape, "LayerNorm")
        self.eps = eps
        self.affine, self.has_bias = bool(elementwise_affine), bool(elementwise_affine and bias)
        if self.affine:
            self.register_parameter("weight", np.ones(self.d))
        if self.has_bias:
            self.register_parameter("bias", np.zeros(self.d))

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, self, (1, 2, 3, 4), -1, self.d, f"(..., {self.d})")
        return layer_norm(x, self.eps, self.weight if self.affine else None, self.bias if self.has_bias else None)

    def extra_repr(self) -> str:
        return f"({self.d},), eps={self.eps}, elementwise_affine={self.affine}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (eps None: the dtype's machine
    epsilon, as PyTorch)."""
    weight: Tensor

    def __init__(self, normalized_shape: Any, eps: Optional[float] = None, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.d = _last_dim(normalized_shape, "RMSNorm")
        self.eps = eps
        self.affine = bool(elementwise_affine)
        if self.affine:
            self.register_parameter("weight", np.ones(self.d))

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, self, (1, 2, 3, 4), -1, self.d, f"(..., {self.d})")
        eps = float(np.finfo(x.graph.dtype).eps) if self.eps is None else self.eps
        y = rms_norm(x, eps)
        return y * self.weight if self.affine else y


# ---- lookup, dropout, attention ------------------------------------------------------------------
class Embedding(Module):
    """Rows of weight (num_embeddings, embedding_dim), N(0, 1), picked by integer indices."""
    weight: Tensor

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "Embedding", "num_embeddings")
        self.embedding_dim = _positive_int(embedding_dim, "Embedding", "embedding_dim")
        self.register_parameter("weight", normal((self.num_embeddings, self.embedding_dim)))

    def forward(self, indices: Tensor) -> Tensor:
        return embedding(self.weight, indices)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Zero each element with probability p in training (jitgraph's counter-based masks:
    fresh each step with ``run(seed=step)``, not torch's bits); the identity in eval."""
    p: float

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
            raise GraphError(f"Dropout: p must be a number in [0, 1), got {p!r}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p) if self.training and self.p > 0 else x

    def extra_repr(self) -> str:
        return f"p={self.p}"


class MultiheadAttention(Module):
    """PyTorch's nn.MultiheadAttention (its parameter names: in_proj_weight (3E, E),
    in_proj_bias, out_proj.weight, out_proj.bias) on ``jg.attention`` -- which never holds
    the (T, T) matrix.  ``mha(query, key, value, is_causal=...)`` returns ``(output, None)``
    like PyTorch with need_weights=False; ``batch_first`` as PyTorch (default False:
    (T, B, E)).  No masks other than causal, no dropout on the weights."""
    in_proj_weight: Tensor
    in_proj_bias: Tensor

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, batch_first: bool = False) -> None:
        super().__init__()
        self.embed_dim = _positive_int(embed_dim, "MultiheadAttention", "embed_dim")
        self.num_heads = _positive_int(num_heads, "MultiheadAttention", "num_heads")
        if embed_dim % num_heads:
            raise GraphError(f"MultiheadAttention: embed_dim {embed_dim} must divide by num_heads {num_heads}")
        self.batch_first, self.has_bias = bool(batch_first), bool(bias)
        E = self.embed_dim
        self.register_parameter("in_proj_weight", uniform((3 * E, E), math.sqrt(6.0 / (4 * E))))   # xavier_uniform
        if bias:
            self.register_parameter("in_proj_bias", np.zeros(3 * E))
        self.out_proj = Linear(E, E, bias=bias)
        if bias:
            self.out_proj.register_parameter("bias", np.zeros(E))

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                is_causal: bool = False, need_weights: bool = False) -> Tuple[Tensor, None]:
        if need_weights:
            raise GraphError("MultiheadAttention: need_weights=True is not offered (jg.attention never holds the "
                             "weights); pass need_weights=False")
        E, H = self.embed_dim, self.num_heads
        key = query if key is None else key
        value = key if value is None else value
        layout = "(B, T, E)" if self.batch_first else "(T, B, E)"
        q, k, v = (_need(t, self, (3,), -1, E, layout) for t in (query, key, value))
        if not self.batch_first:
            q, k, v = (transpose(t, (1, 0, 2)) for t in (q, k, v))
        W, b = self.in_proj_weight, self.in_proj_bias if self.has_bias else None
        if query is key and key is value:                 # self-attention: one product for q, k and v
            qkv = q @ transpose(W)
            qkv = qkv + b if b is not None else qkv
            q, k, v = (slice_axis(qkv, -1, i * E, (i + 1) * E) for i in range(3))
        else:
            q, k, v = (self._project(t, i) for i, t in enumerate((q, k, v)))
        B, Tq, Tk, d = q.shape[0], q.shape[1], k.shape[1], E // H
        if k.shape[0] != B or v.shape[:2] != k.shape[:2]:
            raise GraphError(f"MultiheadAttention: query {query.label!r}, key {key.label!r} and value {value.label!r} "
                             "must share the batch, and key and value the sequence length")
        heads = [transpose(reshape(t, (B, T, H, d)), (0, 2, 1, 3)) for t, T in ((q, Tq), (k, Tk), (v, Tk))]
        o = attention(heads[0], heads[1], heads[2], causal=bool(is_causal))
        o = self.out_proj(reshape(transpose(o, (0, 2, 1, 3)), (B, Tq, E)))
        return (o if self.batch_first else transpose(o, (1, 0, 2))), None

    def _project(self, t: Tensor, i: int) -> Tensor:
        """t's projection by the i-th third of in_proj (0: query, 1: key, 2: value)."""
        E = self.embed_dim
        y = t @ transpose(slice_axis(self.in_proj_weight, 0, i * E, (i + 1) * E))
        return y + slice_axis(self.in_proj_bias, 0, i * E, (i + 1) * E) if self.has_bias else y

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


# ---- activations and plumbing ----------------------------------------------------------------------
class _Activation(Module):
    fn: Any = None

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x)


class ReLU(_Activation):
    fn = staticmethod(unary.relu)


class SiLU(_Activation):
    fn = staticmethod(unary.silu)


class Tanh(_Activation):
    fn = staticmethod(unary.tanh)


class Sigmoid(_Activation):
    fn = staticmethod(unary.sigmoid)


class GELU(Module):
    """GELU, exact (erf) by default; ``approximate="tanh"`` composes PyTorch's tanh form."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise GraphError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return unary.gelu(x) if self.approximate == "none" else gelu_tanh(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return unary.leaky_relu(x, self.negative_slope)


class Softmax(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x, self.dim)


class LogSoftmax(Softmax):
    def forward(self, x: Tensor) -> Tensor:
        return log_softmax(x, self.dim)


class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Flatten(Module):
    """Flatten axes start_dim..end_dim into one (default: all but the batch axis)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return flatten(x, self.start_dim, self.end_dim)


class _Container(Module):
    """Submodules named "0", "1", ... (or by the caller): indexed, counted, iterated, appended."""

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, m: Module) -> "_Container":
        if not isinstance(m, Module):
            raise GraphError(f"{type(self).__name__}.append: expects a Module, got {type(m).__name__}")
        setattr(self, str(len(self)), m)
        return self


class Sequential(_Container):
    """Modules called in turn: ``Sequential(a, b, c)`` (named "0", "1", "2") or from an
    OrderedDict of names."""

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        items = modules[0].items() if len(modules) == 1 and isinstance(modules[0], OrderedDict) else \
            ((str(i), m) for i, m in enumerate(modules))
        for name, m in items:
            if not isinstance(m, Module):
                raise GraphError(f"Sequential: item {name} is a {type(m).__name__}, not a Module")
            setattr(self, name, m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(_Container):
    """A list of modules whose parameters count as the owner's (names "0", "1", ...)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(modules)

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self
