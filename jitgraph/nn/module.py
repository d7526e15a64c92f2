"""Module: PyTorch's way of writing a model -- layers that own their parameters, found by
name -- on jitgraph's graphs.

A module holds its parameters' *initial values* (numpy arrays) until it is first called:
``model(x)`` then makes each parameter a ``g.param`` (each buffer a ``g.const``) of x's
graph ``g``, named by its path (``"0.weight"``, ``"attn.in_proj_bias"``), and builds the
layer's nodes on x.  From then on the module is *bound* to ``g``: ``model.fc.weight`` is that
param Tensor, later calls reuse it (weight sharing, and a training and an evaluation program
built on the same graph share their parameters), and ``parameters()`` are ready for
``jg.optim``.  A call that raises leaves the graph and the module as they were.

``state_dict()`` / ``load_state_dict()`` move values by name, PyTorch's names and layouts, from
dicts of arrays (or torch tensors) or safetensors files (``nn.files``).
"""
import math
import os
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from ..errors import GraphError
from ..graph import Graph, Tensor
from .files import load_safetensors, save_safetensors, to_array
from .summary import summary_table

_rng = np.random.default_rng(0)
# per graph: id(Parameter) -> (the Parameter, its param Tensor), so a Parameter two modules share
# (tied weights) becomes one param of that graph
_made: "weakref.WeakKeyDictionary[Graph, Dict[int, Tuple[Parameter, Tensor]]]" = weakref.WeakKeyDictionary()


def manual_seed(seed: int) -> None:
    """Seed the generator every layer draws its initial values from (PyTorch's
    ``torch.manual_seed`` for initialization): the same seed, the same model."""
    global _rng
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise GraphError(f"manual_seed: seed must be a non-negative int, got {seed!r}")
    _rng = np.random.default_rng(int(seed))


def uniform(shape: Tuple[int, ...], bound: float) -> np.ndarray:
    """U(-bound, bound) from the module generator: PyTorch's kaiming_uniform(a=sqrt(5)) for a
    weight (bound 1/sqrt(fan_in)) and its bias init."""
    return _rng.uniform(-bound, bound, shape)


def normal(shape: Tuple[int, ...], std: float = 1.0) -> np.ndarray:
    return _rng.standard_normal(shape) * std


def fan_in_bound(fan_in: int) -> float:
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Parameter:
    """A trainable value: becomes a ``g.param`` when its module is first called."""
    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = np.array(data, dtype=np.float64)


class Buffer:
    """A value that is not trained: a ``g.const`` on the graph (``on_graph``: batch norm's
    running statistics, which each training run updates), or kept here (a counter)."""
    __slots__ = ("data", "on_graph")

    def __init__(self, data: Any, on_graph: bool = True) -> None:
        self.data = np.array(data)
        self.on_graph = on_graph


class LoadResult(NamedTuple):
    """What ``load_state_dict(strict=False)`` left out: keys the model has that the source
    lacks, and keys the source has that the model lacks."""
    missing_keys: List[str]
    unexpected_keys: List[str]


class Module:
    """Base class of layers and models: subclass it, assign Parameters, Buffers and
    submodules in ``__init__``, write ``forward``; call the module on Tensors."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_tensors", {})        # name -> Tensor of the bound graph
        object.__setattr__(self, "_graph", None)
        object.__setattr__(self, "_built", [])         # (first, end node id, output shape) of each call
        object.__setattr__(self, "training", True)

    # ---- attributes: parameters, buffers and submodules by name ----
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise GraphError(f"{type(self).__name__}: call Module.__init__(self) before assigning {name!r}")
        if self._graph is not None and isinstance(value, (Parameter, Buffer)):
            raise GraphError(f"{type(self).__name__}.{name}: the module is on a graph already; set values with "
                             "load_state_dict (or the param's .value)")
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Buffer):
            self._buffers[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_parameters" in d:
            if name in d["_modules"]:
                return d["_modules"][name]
            if name in d["_parameters"] or name in d["_buffers"]:
                t = d["_tensors"].get(name)
                if t is not None:
                    return t
                if name in d["_buffers"] and not d["_buffers"][name].on_graph:
                    return d["_buffers"][name].data
                # not on a graph yet: the Parameter itself, so that PyTorch's way of tying weights
                # (self.head.weight = self.embed.weight) shares it; binding makes one param of it
                return d["_parameters"].get(name) or d["_buffers"][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_parameter(self, name: str, value: Any) -> None:
        """A trainable value named ``name`` (``self.name = nn.Parameter(value)`` does the same)."""
        setattr(self, name, Parameter(value))

    def register_buffer(self, name: str, value: Any, on_graph: bool = True) -> None:
        """A value that is not trained (``on_graph``: a const of the graph, else kept here)."""
        setattr(self, name, Buffer(value, on_graph))

    # ---- building ----
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        g = _graph_of(args, kwargs)
        if g is None:
            raise GraphError(f"{type(self).__name__}: expects jitgraph Tensors (made by g.input, or a layer's output), "
                             f"got {', '.join(type(a).__name__ for a in args)}")
        first = g.nodes.n
        with self._building(g):
            out = self.forward(*args, **kwargs)
        self._built.append((first, g.nodes.n, out.shape if isinstance(out, Tensor) else None))
        return out

    def bind(self, graph: Graph) -> "Module":
        """Make this module's parameters and buffers (and its submodules') on ``graph`` now,
        without building a layer: for ``parameters()`` before the first call."""
        if not isinstance(graph, Graph):
            raise GraphError(f"{type(self).__name__}.bind: expects a jitgraph Graph, got {type(graph).__name__}")
        with self._building(graph):
            pass
        return self

    @contextmanager
    def _building(self, g: Graph) -> Iterator[None]:
        """This module bound to g, then the block, all or nothing: if anything raises, g drops
        what was built (its transaction), the modules bound here are unbound again and the
        calls recorded inside are forgotten."""
        newly: List[Module] = []
        first = g.nodes.n
        try:
            with g.transaction():
                self._bind(g, "", newly)
                yield
        except BaseException:
            for m in newly:                  # the transaction took their params back
                m._unbind()
            for m in self.modules():         # and the nodes inner calls had built
                m._built[:] = [b for b in m._built if b[0] < first]
            raise

    def _bind(self, g: Graph, prefix: str, newly: List["Module"]) -> None:
        if self._graph is not g:             # bound here already: its children may be new (appended)
            if self._graph is not None:
                raise GraphError(f"{type(self).__name__}: its parameters live on another graph; build a second "
                                 "model and copy the weights (other.load_state_dict(model.state_dict()))")
            object.__setattr__(self, "_graph", g)
            newly.append(self)
            made = _made.setdefault(g, {})
            for name, p in self._parameters.items():
                shared = made.get(id(p))                 # a Parameter two modules hold (tied): one param
                if shared is None or shared[0] is not p:
                    shared = made[id(p)] = (p, g.param(p.data, name=_free_name(g, prefix + name)))
                self._tensors[name] = shared[1]
            for name, b in self._buffers.items():
                if b.on_graph:
                    self._tensors[name] = g.const(b.data, name=_free_name(g, prefix + name))
        for name, m in self._modules.items():
            m._bind(g, prefix + name + ".", newly)

    def _unbind(self) -> None:
        g = self._graph
        made = _made.get(g) if g is not None else None
        if made:                                     # the params the rolled-back call made are gone
            for key in [k for k, (_, t) in made.items() if t.id >= g.nodes.n]:
                del made[key]
        self._tensors.clear()
        object.__setattr__(self, "_graph", None)

    @property
    def graph(self) -> Optional[Graph]:
        """The graph this module's parameters live on (None before its first call)."""
        return self._graph

    # ---- modes ----
    def train(self, mode: bool = True) -> "Module":
        """Training mode (the default) for this module and its submodules: what the next calls
        build (dropout active, batch norm on batch statistics).  Returns self."""
        if not isinstance(mode, bool):
            raise GraphError(f"{type(self).__name__}.train: mode must be True or False, got {mode!r}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode: the next calls build dropout as the identity and batch norm on its
        running statistics -- an evaluation program sharing the training program's params."""
        return self.train(False)

    # ---- walking the tree ----
    def named_modules(self, prefix: str = "") -> Iterator[Tuple[str, "Module"]]:
        seen = set()

        def walk(m: "Module", path: str) -> Iterator[Tuple[str, "Module"]]:
            if id(m) in seen:
                return
            seen.add(id(m))
            yield path, m
            for name, child in m._modules.items():
                yield from walk(child, f"{path}.{name}" if path else name)
        return walk(self, prefix)

    def modules(self) -> Iterator["Module"]:
        return (m for _, m in self.named_modules())

    def children(self) -> Iterator["Module"]:
        return iter(self._modules.values())

    def _named(self, which: str) -> Iterator[Tuple[str, "Module", str]]:
        """(path, owner, local name) of every parameter ("_parameters") or buffer, each once."""
        seen = set()
        for path, m in self.named_modules():
            for name, value in getattr(m, which).items():
                if id(value) not in seen:
                    seen.add(id(value))
                    yield (f"{path}.{name}" if path else name), m, name

    def named_parameters(self) -> Iterator[Tuple[str, Tensor]]:
        """(name, param Tensor) of every parameter (a shared one once), PyTorch's names; the
        module must be bound (called once, or bind(graph))."""
        for path, m, name in self._named("_parameters"):
            t = m._tensors.get(name)
            if t is None:
                raise GraphError(f"{type(m).__name__}.{name} is not on a graph yet: call the model on an input "
                                 "(or bind(graph)) first")
            yield path, t

    def parameters(self) -> List[Tensor]:
        """Every parameter's Tensor, for ``jg.optim``; the module must be bound (called once)."""
        return [t for _, t in self.named_parameters()]

    def named_buffers(self) -> Iterator[Tuple[str, Any]]:
        for path, m, name in self._named("_buffers"):
            yield path, getattr(m, name)

    def num_parameters(self) -> int:
        """The number of trainable values (each shared parameter once)."""
        return int(sum(m._parameters[name].data.size for _, m, name in self._named("_parameters")))

    # ---- weights by name ----
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """{name: array} of every parameter and buffer (copies), PyTorch's names and order:
        each module's parameters, then its buffers, then its submodules'."""
        out: "OrderedDict[str, np.ndarray]" = OrderedDict()
        for path, m in self.named_modules():
            for which in ("_parameters", "_buffers"):
                for name in getattr(m, which):
                    key = f"{path}.{name}" if path else name
                    if key not in out:
                        out[key] = m._value(name)
        return out

    def _value(self, name: str) -> np.ndarray:
        t = self._tensors.get(name)
        if t is not None:
            return t.value
        entry = self._parameters.get(name) or self._buffers[name]
        data = entry.data.copy()
        return data.astype(self._graph.dtype) if self._graph is not None and data.dtype.kind == "f" else data

    def load_state_dict(self, state: Union[Dict[str, Any], str, "os.PathLike[str]"], strict: bool = True) -> LoadResult:
        """Set parameters and buffers by name from ``state`` -- a dict of arrays or torch
        tensors, or the path of a safetensors file (``safetensors.torch.save_file(
        model.state_dict(), path)`` loads into the same architecture).  Every key is checked
        before anything changes: with ``strict``, missing and unexpected keys are errors; a
        shape mismatch or a value that is not real numbers always is -- one GraphError names
        every problem, and no parameter changes.  Returns (missing_keys, unexpected_keys)."""
        if isinstance(state, (str, os.PathLike)):
            state = load_safetensors(state)
        if not isinstance(state, dict):
            raise GraphError(f"load_state_dict: expects a dict of arrays or a safetensors path, got {type(state).__name__}")
        problems = []
        arrays: Dict[str, Optional[np.ndarray]] = {}
        for key, value in state.items():
            try:
                arrays[key] = to_array(key, value, "load_state_dict")
            except GraphError as e:
                arrays[key] = None
                problems.append(str(e).replace("load_state_dict: ", ""))
        targets: Dict[str, Tuple[Module, str, str]] = {}
        for path, m in self.named_modules():
            for which in ("_parameters", "_buffers"):
                for name in getattr(m, which):
                    targets.setdefault(f"{path}.{name}" if path else name, (m, name, which))
        given = {id(getattr(m, w)[n]) for k, (m, n, w) in targets.items() if k in arrays}
        missing = [k for k, (m, n, w) in targets.items() if id(getattr(m, w)[n]) not in given]   # tied: one name does
        unexpected = [k for k in arrays if k not in targets]
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        for key, (m, name, which) in targets.items():
            if key not in arrays:
                continue
            a, want = arrays[key], getattr(m, which)[name].data
            if a is None:
                continue
            if a.shape != want.shape:
                problems.append(f"{key}: shape {a.shape} in the source, {want.shape} in the model")
            elif want.dtype.kind == "f" and a.dtype.kind not in "fiu":
                problems.append(f"{key}: dtype {a.dtype} is not a real number type")
            elif want.dtype.kind in "iu" and a.dtype.kind not in "iu":
                problems.append(f"{key}: dtype {a.dtype}, an integer counter expected")
        if problems:
            raise GraphError(f"load_state_dict into {type(self).__name__}: " + "; ".join(problems) + " -- nothing was changed")
        for key, (m, name, which) in targets.items():
            a = arrays.get(key)
            if a is not None:
                entry = getattr(m, which)[name]
                entry.data = a.astype(entry.data.dtype, copy=True)
                t = m._tensors.get(name)
                if t is not None:
                    t.value = a
        return LoadResult(missing, unexpected)

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Write ``state_dict()`` to a safetensors file (loadable by ``safetensors.torch.load_file``
        into the PyTorch model of the same architecture, and by ``load_state_dict``)."""
        save_safetensors(self.state_dict(), path)

    # ---- looking at it ----
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"

    def summary(self, program: Any = None) -> str:
        """A table of the layers: each module's type, its own parameters (count and bytes) and,
        when it has been called, the shape of its last output; with ``program`` (a
        BackwardGraph built from it), the bytes of the layer's forward tensors the memory plan
        keeps for the backward pass -- what checkpointing trades for recompute."""
        return summary_table(self, program)


def _graph_of(args: tuple, kwargs: dict) -> Optional[Graph]:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, Tensor):
            return a.graph
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    return b.graph
    return None


def _free_name(g: Graph, name: str) -> Optional[str]:
    """``name`` if no tensor of g has it yet (two models on one graph: the second unnamed)."""
    try:
        g.tensor(name)
    except GraphError:
        return name
    return None
