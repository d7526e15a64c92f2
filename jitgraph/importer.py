"""jg.from_torch: a PyTorch module, exported with ``torch.export``, translated node by node
into jitgraph ops with the module's weights.

The exported program is ATen's training-level IR: one node per ``aten.linear``,
``aten.conv2d``, ``aten.scaled_dot_product_attention`` ...  Each node either

* depends only on shapes and constants (a causal mask from ``ones(T, T).tril()``, position
  ids from ``arange``, a registered mask buffer): it is **folded** -- run once by torch, and
  its value kept as a constant; or
* is **translated** by its rule in ``RULES`` (below, one line or a few per op) into jitgraph
  ops on the translated sources.

An op with no rule raises a GraphError naming the ATen op and the line of the model's
source it came from; the graph being built is dropped, so nothing is left half-built.
torch is imported here only (the ``bench`` / ``dev`` extras), never by ``import jitgraph``.
"""
import inspect
import math
import operator
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .errors import GraphError
from .graph import Graph, Tensor
from . import ops  # noqa: F401  -- the op table
from .ops.attention import attention
from .ops.batchnorm import batch_norm
from .ops.conv import conv1d, conv2d
from .ops.gather import embedding
from .ops.norm import layer_norm
from .ops.pool import avg_pool2d, max_pool2d
from .ops.reduce import broadcast_to, mean, sum as total
from .ops.shape import concat, reshape, slice_axis, transpose
from .ops.softmaxes import cross_entropy, log_softmax, softmax
from .ops.stochastic import dropout
from .ops import unary, binary, elementary
from .nn.layers import channel_bias, flatten, gelu_tanh, linear

__all__ = ["from_torch", "Imported", "RULES"]


class Imported:
    """What ``from_torch`` returns: ``graph``; ``inputs`` (jitgraph inputs in the order of
    example_inputs); ``outputs`` (the module's tensor outputs); ``params`` (torch name ->
    jitgraph param: ``imp.params[name].grad`` is its gradient); ``buffers`` (torch name -> a
    jitgraph const where the graph reads one, else the buffer's value as a numpy array).
    ``with_batch(n)`` / ``with_inputs(...)``: the same model at other shapes on the same graph."""

    def __init__(self, graph: Graph, inputs: List[Tensor], outputs: List[Tensor], params: Dict[str, Tensor],
                 buffers: Dict[str, Any], module: Any = None, example_inputs: Sequence[Any] = ()) -> None:
        self.graph, self.inputs, self.outputs, self.params, self.buffers = graph, inputs, outputs, params, buffers
        self.module, self.example_inputs = module, tuple(example_inputs)

    def with_inputs(self, *example_inputs: Any) -> "Imported":
        """The model imported again at the shapes of ``example_inputs``, onto this graph: the
        same params and buffers (a step of either program trains both), new inputs and
        outputs.  Nothing recompiles: jitgraph's kernels do not depend on shapes."""
        return from_torch(self.module, example_inputs, into=self)

    def with_batch(self, n: int) -> "Imported":
        """``with_inputs`` at batch size ``n`` (the first axis of every input): for the last
        partial batch (``jg.train(..., tail=...)``) or evaluation at another size."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise GraphError(f"with_batch: n must be an int >= 1, got {n!r}")
        for t in self.inputs:
            if not t.shape:
                raise GraphError(f"with_batch: input {t.label!r} has no batch axis; use with_inputs(...)")
        rows = np.arange(int(n)) % np.array([ex.shape[0] for ex in self.example_inputs])[:, None]
        return self.with_inputs(*(ex[r.tolist()] for ex, r in zip(self.example_inputs, rows)))

    def __repr__(self) -> str:
        return (f"<Imported {len(self.graph)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs, "
                f"{len(self.params)} params, {len(self.buffers)} buffers>")


# ---- the rules: ATen op name -> jitgraph ops ---------------------------------------------------------
def _dims(x: Tensor, dims: Any) -> List[int]:
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted(d % x.ndim for d in dims)


def _permute(x: Tensor, perm: Sequence[int]) -> Tensor:
    perm = [p % x.ndim for p in perm]
    return x if perm == list(range(x.ndim)) else transpose(x, perm)


def _swap(x: Tensor, a: int, b: int) -> Tensor:
    perm = list(range(x.ndim))
    a, b = a % x.ndim, b % x.ndim
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(x, perm)


def _reduce(fn: Callable[..., Tensor], x: Tensor, dims: Any = None, keepdim: bool = False) -> Tensor:
    axes = list(range(x.ndim)) if dims is None or (not isinstance(dims, int) and len(dims) == 0) else _dims(x, dims)
    return fn(x, axis=tuple(axes), keepdims=bool(keepdim))


def _slice(x: Tensor, dim: int = 0, start: Optional[int] = None, end: Optional[int] = None, step: int = 1) -> Tensor:
    n = x.shape[dim]
    lo, hi, st = slice(start, end, step).indices(n)
    if st != 1:
        raise GraphError(f"slice with step {step}: only step 1 is translated")
    return x if (lo, hi) == (0, n) else slice_axis(x, dim, lo, hi)


def _split(x: Tensor, sizes: Any, dim: int = 0) -> List[Tensor]:
    n = x.shape[dim]
    sizes = [sizes] * math.ceil(n / sizes) if isinstance(sizes, int) else list(sizes)
    out, at = [], 0
    for s in sizes:
        out.append(slice_axis(x, dim, at, min(at + s, n)))
        at += s
    return out


def _unsqueeze(x: Tensor, dim: int) -> Tensor:
    dim = dim % (x.ndim + 1)
    return reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


def _squeeze(x: Tensor, dims: Any = None) -> Tensor:
    drop = [d for d in (range(x.ndim) if dims is None else _dims(x, dims)) if x.shape[d] == 1]
    return reshape(x, tuple(s for d, s in enumerate(x.shape) if d not in drop))


def _sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: Optional[float] = None, enable_gqa: bool = False) -> Tensor:
    if dropout_p:
        raise GraphError("scaled_dot_product_attention with dropout_p > 0: not translated (export in eval mode)")
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        causal = np.tril(np.ones(m.shape[-2:], bool))
        if m.dtype == bool and np.array_equal(np.broadcast_to(causal, m.shape), m):
            is_causal = True
        elif m.dtype != bool and np.array_equal(np.broadcast_to(np.where(causal, 0.0, -np.inf), m.shape), m):
            is_causal = True
        else:
            raise GraphError("scaled_dot_product_attention: an attn_mask other than the causal one is not translated")
    return attention(q, k, v, causal=bool(is_causal), scale=scale)


def _masked_fill(x: Tensor, mask: Any, value: float) -> Tensor:
    keep = 1.0 - np.asarray(mask, dtype=np.float64)             # a folded mask: where it is 0, x stays
    fill = np.where(np.asarray(mask, bool), float(value), 0.0)
    if np.isinf(value):                                        # -inf where masked: x * 1 + (-inf) would NaN at 0 * inf
        return binary.where(x.graph.const(np.asarray(mask, np.float64)), x.graph.const(fill), x)
    return x * x.graph.const(keep) + x.graph.const(fill)


def _cross_entropy(x: Tensor, target: Tensor, weight: Any = None, reduction: int = 1, ignore_index: int = -100,
                   label_smoothing: float = 0.0) -> Tensor:
    if weight is not None or reduction != 1 or label_smoothing:
        raise GraphError("cross_entropy: only the mean over rows, without class weights or label smoothing, is "
                         "translated")
    return cross_entropy(x, target, ignore_index=ignore_index if ignore_index >= 0 else None)


RULES: Dict[str, Callable[..., Any]] = {
    "linear": linear,
    "matmul": lambda a, b: a @ b, "mm": lambda a, b: a @ b, "bmm": lambda a, b: a @ b,
    "addmm": lambda c, a, b, beta=1, alpha=1: c * beta + (a @ b) * alpha if (beta, alpha) != (1, 1) else c + a @ b,
    "conv2d": lambda x, w, b=None, stride=1, padding=0, dilation=1, groups=1:
        channel_bias(conv2d(x, w, tuple(stride) if not isinstance(stride, int) else stride,
                            tuple(padding) if not isinstance(padding, int) else padding,
                            tuple(dilation) if not isinstance(dilation, int) else dilation, groups), b),
    "conv1d": lambda x, w, b=None, stride=1, padding=0, dilation=1, groups=1:
        channel_bias(conv1d(x, w, _one(stride), _one(padding), _one(dilation), groups), b),
    "batch_norm": lambda x, w, b, rm, rv, training, momentum, eps, cudnn=False:
        batch_norm(x, w, b, rm, rv, training=bool(training), momentum=momentum, eps=eps),
    "layer_norm": lambda x, shape, w=None, b=None, eps=1e-5, cudnn=False:
        layer_norm(x, eps, w, b) if len(shape) == 1 else _unsupported("layer_norm over more than the last axis"),
    "embedding": lambda w, idx, padding_idx=-1, scale_grad=False, sparse=False: embedding(w, idx),
    "scaled_dot_product_attention": _sdpa,
    "relu": unary.relu, "silu": unary.silu, "tanh": unary.tanh, "sigmoid": unary.sigmoid, "exp": unary.exp,
    "log": unary.log, "sqrt": unary.sqrt, "abs": unary.abs, "neg": unary.neg,
    "rsqrt": lambda x: 1.0 / unary.sqrt(x),
    "gelu": lambda x, approximate="none": unary.gelu(x) if approximate == "none" else gelu_tanh(x),
    "softmax": lambda x, dim, half_to_float=False: softmax(x, dim),
    "_softmax": lambda x, dim, half_to_float=False: softmax(x, dim),
    "log_softmax": lambda x, dim, half_to_float=False: log_softmax(x, dim),
    "_log_softmax": lambda x, dim, half_to_float=False: log_softmax(x, dim),
    "dropout": lambda x, p, train: dropout(x, p) if train and p > 0 else x,
    "add": lambda a, b, alpha=1: a + b * alpha if alpha != 1 else a + b,
    "sub": lambda a, b, alpha=1: a - b * alpha if alpha != 1 else a - b,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "pow": lambda a, b: elementary.pow(a, float(b)),
    "mean": lambda x, dims=None, keepdim=False, dtype=None: _reduce(mean, x, dims, keepdim),
    "sum": lambda x, dims=None, keepdim=False, dtype=None: _reduce(total, x, dims, keepdim),
    "view": lambda x, shape: reshape(x, tuple(shape)), "reshape": lambda x, shape: reshape(x, tuple(shape)),
    "_unsafe_view": lambda x, shape: reshape(x, tuple(shape)),
    "flatten": flatten, "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "unflatten": lambda x, dim, sizes: reshape(x, x.shape[:dim % x.ndim] + tuple(sizes) + x.shape[dim % x.ndim + 1:]),
    "transpose": _swap, "permute": lambda x, dims: _permute(x, dims), "t": lambda x: _swap(x, 0, 1),
    "contiguous": lambda x, memory_format=None: x, "clone": lambda x, memory_format=None: x,
    "alias": lambda x: x, "lift_fresh_copy": lambda x: x,
    "slice": _slice, "select": lambda x, dim, i: _squeeze(_slice(x, dim, i, (i % x.shape[dim]) + 1), dim),
    "split": _split, "split_with_sizes": _split, "chunk": lambda x, n, dim=0: _split(x, math.ceil(x.shape[dim] / n), dim),
    "cat": lambda ts, dim=0: concat(ts, dim), "expand": lambda x, shape, implicit=False:
        broadcast_to(x, tuple(s if s != -1 else x.shape[i - len(shape) + x.ndim] for i, s in enumerate(shape))),
    "adaptive_avg_pool2d": lambda x, size: mean(x, axis=(2, 3), keepdims=True) if tuple(size) == (1, 1) else
        _unsupported(f"adaptive_avg_pool2d to {tuple(size)} (only (1, 1))"),
    "max_pool2d": lambda x, k, stride=(), padding=0, dilation=1, ceil_mode=False:
        max_pool2d(x, tuple(k), tuple(stride) or None, _pair(padding)) if not ceil_mode else
        _unsupported("max_pool2d with ceil_mode"),
    "avg_pool2d": lambda x, k, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor=None:
        avg_pool2d(x, tuple(k), tuple(stride) or None, _pair(padding)),
    "masked_fill": _masked_fill,
    "cross_entropy_loss": _cross_entropy,
}


def _one(v: Any) -> int:
    return int(v[0]) if isinstance(v, (list, tuple)) else int(v)


def _pair(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _unsupported(what: str) -> Any:
    raise GraphError(f"{what}: not translated")


# ---- tensors of more than 4 axes -------------------------------------------------------------------
VIEWS = {"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "unflatten", "flatten", "transpose", "permute",
         "contiguous", "clone", "alias"}


class Wide:
    """A torch tensor of more than 4 axes (jitgraph's limit), as real models make one for a
    moment -- nn.MultiheadAttention's ``unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2)
    .squeeze(-2)`` -- held as the jitgraph tensor of its axes longer than 1 in the same order:
    dropping axes of length 1 leaves the row-major element order unchanged, so views of it
    (reshapes, permutes, unit axes added or removed) translate exactly."""

    def __init__(self, data: Tensor, shape: Sequence[int]) -> None:
        self.data, self.shape = data, tuple(int(d) for d in shape)


def _long_axes(shape: Sequence[int]) -> List[int]:
    return [i for i, d in enumerate(shape) if d != 1]


def _as_torch_shape(data: Tensor, shape: Sequence[int]) -> Any:
    """``data`` (in row-major order) as a tensor of torch shape ``shape``: a jitgraph tensor,
    or a Wide one when ``shape`` has more than 4 axes."""
    shape = tuple(int(d) for d in shape)
    if len(shape) <= 4:
        return data if data.shape == shape else reshape(data, shape)
    long = tuple(shape[i] for i in _long_axes(shape))
    if len(long) > 4:
        raise GraphError(f"a tensor of shape {shape}: more than 4 axes longer than 1 is beyond jitgraph's 4 axes")
    return Wide(data if data.shape == long else reshape(data, long), shape)


def view_of(op_name: str, args: Sequence[Any], out_shape: Sequence[int]) -> Any:
    """A view op (``VIEWS``) of a Wide tensor, or one making a Wide tensor: a reshape (unit
    axes added or dropped included) keeps the row-major order, a permute moves the long axes."""
    x = args[0]
    shape, data = x.shape, (x.data if isinstance(x, Wide) else x)
    if op_name in ("transpose", "permute"):
        perm = list(range(len(shape)))
        if op_name == "permute":
            perm = [p % len(shape) for p in args[1]]
        else:
            a, b = args[1] % len(shape), args[2] % len(shape)
            perm[a], perm[b] = perm[b], perm[a]
        if isinstance(x, Wide):
            long = _long_axes(shape)
            data = _permute(data, [long.index(p) for p in perm if shape[p] != 1])
        else:
            data = _permute(x, perm)
    return _as_torch_shape(data, out_shape)


# ---- the translation ------------------------------------------------------------------------------
def _source_line(node: Any, root: Any = None) -> str:
    """The model's line an exported node came from: the innermost frame outside torch; where
    torch kept no stack trace, the forward of the innermost module it came from."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', node.meta.get("stack_trace") or "")
    own = [f for f in frames if "/torch/" not in f[0]]
    if own:
        path, line, code = own[-1]
        return f"{path}, line {line}: {code.strip()}"
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if stack:
        path, kind = stack[-1][0], str(stack[-1][1])
        try:
            fn = type(root.get_submodule(path)).forward
            return (f"{inspect.getsourcefile(fn)}, line {inspect.getsourcelines(fn)[1]}: the forward of "
                    f"{path or 'the model'} ({kind})")
        except (AttributeError, TypeError, OSError):
            return f"the forward of {path or 'the model'} ({kind})"
    return "(no source line recorded)"


def from_torch(module: Any, example_inputs: Sequence[Any], dtype: Any = None, *,
               into: Optional[Imported] = None) -> Imported:
    """Import ``module`` (a torch.nn.Module) as a jitgraph graph: ``torch.export`` at the shapes
    of ``example_inputs``, then each ATen node folded (if it depends only on shapes and
    constants) or translated by its rule.  The graph's dtype is the module's floating dtype
    (float64 or float32; ``dtype`` overrides).  Train-mode batch norm updates the running
    statistics once per run; dropout uses jitgraph's masks (not torch's bits).  ``into``: an
    earlier import of this module -- translate onto its graph with its params and buffers
    (``Imported.with_inputs`` / ``with_batch``); all or nothing, as a new graph is."""
    try:
        import torch
    except ImportError:
        raise ImportError("jg.from_torch needs PyTorch: pip install 'jitgraph[bench]' (or torch)") from None
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"from_torch: expects a torch.nn.Module, got {type(module).__name__}")
    if into is not None and not isinstance(into, Imported):
        raise GraphError(f"from_torch: into must be what from_torch returned, got {type(into).__name__}")
    example_inputs = tuple(example_inputs)
    try:
        ep = torch.export.export(module, example_inputs)
    except Exception as e:            # noqa: BLE001 -- torch's own message says what it could not trace
        raise GraphError(f"from_torch: torch.export could not export {type(module).__name__}: {e}") from None
    if into is None:
        floats = [p.dtype for p in module.parameters() if p.is_floating_point()]
        dt = np.dtype(dtype) if dtype is not None else \
            np.float64 if floats and floats[0] == torch.float64 else np.float32
        return _translate(torch, module, example_inputs, ep, Graph(dt), {}, {})
    params, buffers = dict(into.params), dict(into.buffers)
    try:
        with into.graph.transaction():
            return _translate(torch, module, example_inputs, ep, into.graph, into.params, into.buffers)
    except BaseException:                 # the graph dropped what was made: so do the shared tables
        for table, was in ((into.params, params), (into.buffers, buffers)):
            table.clear()
            table.update(was)
        raise


def _free(g: Graph, name: str) -> str:
    """``name``, or ``name_2``, ``name_3`` ... if another tensor of g has it."""
    k, free = 1, name
    while True:
        try:
            g.tensor(free)
        except GraphError:
            return free
        k += 1
        free = f"{name}_{k}"


def _translate(torch: Any, module: Any, example_inputs: Sequence[Any], ep: Any, g: Graph, params: Dict[str, Tensor],
               buffers: Dict[str, Any]) -> Imported:
    """The exported program ``ep`` translated onto ``g``; ``params`` and ``buffers`` hold what an
    earlier import made (shared) and receive what this one makes."""
    dt = g.dtype
    sig = ep.graph_signature
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    inputs: List[Tensor] = []
    env: Dict[str, Any] = {}          # fx node name -> a jitgraph Tensor, or a folded value (torch / python)
    lazy: Dict[str, str] = {}         # fx node name of a buffer -> its torch name (a const once the graph reads it)
    user = iter(example_inputs)
    made: Dict[int, Tensor] = {}
    for spec in sig.input_specs:
        name = spec.arg.name
        if spec.kind.name == "PARAMETER":
            value = state[spec.target]
            tied = params.get(spec.target, made.get(id(value)))   # shared, or one tensor under two names (tied)
            if tied is None:
                tied = made[id(value)] = g.param(value.detach().cpu().numpy(), name=spec.target)
            params[spec.target] = env[name] = tied
        elif spec.kind.name in ("BUFFER", "CONSTANT_TENSOR"):
            env[name] = state[spec.target].detach().clone()
            lazy[name] = spec.target
            buffers.setdefault(spec.target, env[name].numpy())
        elif spec.kind.name == "USER_INPUT":
            ex = next(user)
            if not isinstance(ex, torch.Tensor):
                raise GraphError(f"from_torch: example input {name!r} is a {type(ex).__name__}; only tensors are inputs")
            kind = np.int64 if not ex.is_floating_point() else None
            t = g.input(tuple(ex.shape), name=_free(g, name), dtype=kind)
            env[name] = t
            inputs.append(t)
        else:
            raise GraphError(f"from_torch: an input of kind {spec.kind.name} is not translated")

    def jg_value(v: Any, fx_name: Optional[str] = None) -> Any:
        """A folded torch tensor as a const of the graph (once), other values unchanged."""
        if isinstance(v, torch.Tensor):
            key = fx_name or str(id(v))
            got = consts.get(key)
            if got is None and isinstance(buffers.get(lazy.get(key, "")), Tensor):
                got = consts[key] = buffers[lazy[key]]        # read by an earlier import: the same const
            if got is None:
                arr = v.detach().cpu().numpy()
                got = consts[key] = g.const(arr if arr.dtype != bool else arr.astype(dt), name=lazy.get(key))
                if key in lazy:
                    buffers[lazy[key]] = got
            return got
        return v
    consts: Dict[str, Tensor] = {}

    def arg(a: Any, as_jg: bool) -> Any:
        if hasattr(a, "op") and hasattr(a, "name") and type(a).__name__ == "Node":
            v = env[a.name]
            return jg_value(v, a.name) if as_jg else v
        if isinstance(a, (list, tuple)):
            return type(a)(arg(b, as_jg) for b in a)
        return a

    def on_graph(a: Any) -> bool:
        if type(a).__name__ == "Node":
            return isinstance(env[a.name], (Tensor, Wide))
        return isinstance(a, (list, tuple)) and any(on_graph(b) for b in a)

    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            env[node.name] = env[node.args[0].name][node.args[1]]
            continue
        op_name = str(getattr(node.target, "__name__", node.target)).split(".")[0]
        if not any(on_graph(a) for a in list(node.args) + list(node.kwargs.values())):
            # shapes and constants only: torch computes it once (a mask, positions, a buffer's update)
            env[node.name] = node.target(*arg(node.args, False), **arg(node.kwargs, False))
            continue
        rule = RULES.get(op_name)
        where = _source_line(node, module)
        if rule is None:
            raise GraphError(f"from_torch: no translation for aten.{op_name} ({node.target}) at {where}")
        args = list(arg(node.args, True))
        out = node.meta.get("val")
        out_shape = tuple(out.shape) if isinstance(out, torch.Tensor) else ()
        wide = [a for a in args if isinstance(a, Wide)]
        if op_name in VIEWS and (wide or len(out_shape) > 4):
            try:
                env[node.name] = view_of(op_name, args, out_shape)
            except GraphError as e:
                raise GraphError(f"from_torch: aten.{op_name} at {where}: {e}") from None
            continue
        if wide or len(out_shape) > 4:
            raise GraphError(f"from_torch: aten.{op_name} on a tensor of {len((wide[0] if wide else out).shape)} axes "
                             f"at {where}: jitgraph tensors have at most 4 (only views of longer ones are translated)")
        if op_name in ("scaled_dot_product_attention", "masked_fill"):      # their masks stay folded values
            mask_at = 3 if op_name == "scaled_dot_product_attention" else 1
            if len(node.args) > mask_at and type(node.args[mask_at]).__name__ == "Node":
                v = env[node.args[mask_at].name]
                if isinstance(v, Tensor):
                    raise GraphError(f"from_torch: aten.{op_name} with a mask computed from the inputs is not "
                                     f"translated, at {where}")
                args[mask_at] = v.detach().cpu().numpy()
        try:
            env[node.name] = rule(*args, **arg(node.kwargs, True))
        except GraphError as e:
            raise GraphError(f"from_torch: aten.{op_name} at {where}: {e}") from None
    outputs = []
    for spec in sig.output_specs:
        if spec.kind.name == "USER_OUTPUT":
            v = env[spec.arg.name] if hasattr(spec.arg, "name") else spec.arg.value
            outputs.append(v if isinstance(v, Tensor) else g.const(np.asarray(v.detach().cpu().numpy()
                                                                           if isinstance(v, torch.Tensor) else v)))
    return Imported(g, inputs, outputs, params, buffers, module, example_inputs)
