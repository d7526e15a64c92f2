"""Graph and Tensor: the Python handles users build with.

A ``Graph`` owns the node table (``jitgraph.ir.NodeTable``), the names, and the
value store holding every param's and const's data.  A ``Tensor`` is a thin
handle ``(graph, node id)``; ops are plain functions in ``jitgraph.ops``, and a
Tensor's operators call them through the op table.
"""
import contextlib
import functools
import numbers
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from .errors import GraphError
from .ir import (F_CONST, F_INDEX, F_INPUT, F_PARAM, MAX_DIMS, NodeTable,
                 aligned_zeros, flag_names)
from .order import topo_order
from .registry import BY_NAME, CONST, EXPORTS, INPUT, OPS, PARAM, LeafIP, slots
from .viz import describe, params_text, render_svg, rich_html, to_dot

_ALIGN = 16   # elements: value offsets are multiples of 64 bytes (float32)


def _check_dtype(dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise GraphError(f"Graph dtype {dtype!r} is not a dtype; use np.float32 or np.float64") from None
    if dt not in (np.float32, np.float64):
        raise GraphError(f"Graph dtype must be float32 or float64, got {dt}")
    return dt


def check_shape(shape: Any, what: str) -> tuple:
    """A shape tuple of 0..4 positive ints, or GraphError naming ``what``."""
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"{what}: shape must be a tuple of ints, got {shape!r}") from None
    if len(dims) > MAX_DIMS:
        raise GraphError(f"{what}: shape {dims} has {len(dims)} dims; at most {MAX_DIMS} are supported")
    out = []
    for d in dims:
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise GraphError(f"{what}: shape {dims} must hold ints, got {d!r}")
        if d <= 0:
            raise GraphError(f"{what}: shape {dims} has a dimension {d}; dimensions must be >= 1")
        out.append(int(d))
    return tuple(out)


def as_numeric_array(value: Any, what: str) -> np.ndarray:
    """``value`` as a real numeric numpy array, or GraphError naming ``what``."""
    try:
        arr = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise GraphError(f"{what}: cannot make an array of {type(value).__name__}: {e}") from None
    if arr.dtype.kind not in "biuf":
        raise GraphError(f"{what}: values must be real numbers, got dtype {arr.dtype}")
    return arr


class Graph:
    """A growable computation graph of one float dtype.

    >>> g = Graph(np.float32)
    >>> x = g.input((64, 32), name="x")
    >>> W = g.param(np.random.randn(32, 16), name="W")
    """

    def __init__(self, dtype: Any = np.float32, capacity: int = 256) -> None:
        self.dtype = _check_dtype(dtype)
        self.nodes = NodeTable(capacity)
        self.shapes: Dict[int, tuple] = {}          # node id -> unpadded shape tuple (cache; jitted passes skip it)
        self.names: Dict[int, str] = {}           # node id -> name
        self._ids_by_name: Dict[str, int] = {}
        self._store = np.zeros(0, self.dtype)  # values of params and consts, packed
        self._packed = 0                         # elements of _store in use
        self._pending: List[np.ndarray] = []
        self._store_lock = threading.Lock()                       # values added since the last packing
        self.store_used = 0                      # elements of the store, pending included
        self.params: List[int] = []          # param node ids, in creation order
        self._segment_depth = 0   # > 0 while jg.checkpoint builds a segment
        self._journaling = 0      # open transactions, and the renames of older nodes they may undo
        self._journal: List[tuple] = []
        self._journal_floor = 1 << 62  # the node count at the outermost open transaction
        self.grads: Dict[int, Any] = {}           # param id -> (backward program, index) that last computed its gradient
        self.grads_owner: Any = None   # the backward program every entry of grads points at, if one does
        self.grads_version = 0    # bumped whenever grads changes (optimizers cache on it)

    # ---- nodes -----------------------------------------------------------------
    def _node(self, op, srcs, shape, ip=(), fp=(), flags=0):
        n = self.nodes.append(op, srcs, shape, ip, fp, flags)
        self.shapes[n] = shape
        return Tensor(self, n, shape)

    def shape_of(self, n: int) -> tuple:
        s = self.shapes.get(n)
        if s is None:                    # appended by a jitted pass
            s = self.shapes[n] = self.nodes.shape_of(n)
        return s

    def label(self, n: int) -> str:
        """How messages and pictures name node n: its name, else op#id."""
        name = self.names.get(n)
        if name is not None:
            return name
        return f"{OPS[int(self.nodes.op[n])].name}#{n}"

    def _check_name(self, name, n=-1):
        """GraphError unless ``name`` is None or a name node n may take."""
        if name is None:
            return
        if not isinstance(name, str) or not name:
            raise GraphError(f"tensor name must be a non-empty string, got {name!r}")
        other = self._ids_by_name.get(name)
        if other is not None and other != n:
            raise GraphError(f"name {name!r} is already used by another tensor of this graph")

    def _set_name(self, n, name):
        self._check_name(name, n)
        if name is None:
            return
        old = self.names.get(n)
        if self._journaling and n < self._journal_floor:
            self._journal.append((n, old))      # renaming a node older than the open transaction
        if old is not None:
            del self._ids_by_name[old]
        self.names[n] = name
        self._ids_by_name[name] = n

    # ---- transactions: a build that raises leaves the graph as it was ------------------
    @contextlib.contextmanager
    def transaction(self, flags: bool = False) -> Iterator[None]:
        """If the body raises, the graph returns to its state at entry -- node count,
        names, params, the value store, segment depth (and with ``flags``, the flags of the
        nodes it had) -- before the exception propagates unchanged.  What ``jg.checkpoint``,
        ``build_backward`` and ``jg.grad`` build in; op builders roll back the same way
        (``transactional``)."""
        n, depth, journal, floor = self.nodes.n, self._segment_depth, len(self._journal), self._journal_floor
        kept_flags = self.nodes.flags[:n].copy() if flags else None
        self._journaling += 1
        self._journal_floor = n
        try:
            yield
        except BaseException:
            self.rollback(n)                  # first: new nodes give back the names they took
            for m, old in reversed(self._journal[journal:]):
                if m in self.names:
                    del self._ids_by_name[self.names.pop(m)]
                if old is not None:
                    self.names[m] = old
                    self._ids_by_name[old] = m
            del self._journal[journal:]
            self._segment_depth = depth
            if kept_flags is not None:
                self.nodes.flags[:n] = kept_flags
            raise
        finally:
            self._journaling -= 1
            self._journal_floor = floor
            if not self._journaling:          # an outer transaction may still undo an inner one's renames
                self._journal.clear()

    def rollback(self, n: int) -> None:
        """Drop every node from id ``n`` on, with its name, shape, param entry and value
        store slot (the graph becomes what it was when it had n nodes, but for renames of
        older nodes: ``transaction`` undoes those)."""
        nodes = self.nodes
        end = nodes.n
        if n >= end:
            return
        new = np.arange(n, end)
        valued = new[(nodes.flags[n:end] & (F_PARAM | F_CONST)) != 0]
        if valued.size:                      # slots are handed out in node order: cut at the first
            cut = int(nodes.ip[valued, LeafIP.offset].min())
            if self._packed > cut:
                self._packed, self._pending = cut, []
            else:
                at, keep = self._packed, 0
                while keep < len(self._pending) and at < cut:
                    at += self._pending[keep].size
                    keep += 1
                del self._pending[keep:]
            self.store_used = cut
        for m in [m for m in self.names if m >= n]:
            del self._ids_by_name[self.names.pop(m)]
        for m in range(n, end):
            self.shapes.pop(m, None)
        while self.params and self.params[-1] >= n:
            self.params.pop()
        nodes.truncate(n)

    def tensor(self, key: Union[str, int]) -> "Tensor":
        """The tensor with this name (or node id)."""
        if isinstance(key, str):
            n = self._ids_by_name.get(key)
            if n is None:
                raise GraphError(f"no tensor named {key!r} in this graph")
            return Tensor(self, n)
        if isinstance(key, numbers.Integral) and 0 <= key < self.nodes.n:
            return Tensor(self, int(key))
        raise GraphError(f"no tensor {key!r} in this graph")

    def __len__(self) -> int:
        return self.nodes.n

    def scratch_copy(self) -> "Graph":
        """A graph with a copy of the node table and the same values, for planning
        experiments that must not touch this graph."""
        other = Graph(self.dtype)
        other.nodes = self.nodes.copy()
        other.shapes = dict(self.shapes)
        other.names, other._ids_by_name = dict(self.names), dict(self._ids_by_name)   # errors name tensors alike
        other._store, other._packed = self.store, self.store_used
        other.store_used = self.store_used
        return other

    def __repr__(self):
        return f"Graph({self.nodes.n} nodes, dtype={self.dtype.name})"

    # ---- pictures: every node of the graph, in id order ----
    def to_dot(self, max_nodes: int = 300, legend: bool = True, rankdir: str = "TB") -> str:
        """Graphviz DOT text of the whole graph (the last ``max_nodes`` nodes when bigger)."""
        return to_dot(self, np.arange(self.nodes.n, dtype=np.int64), max_nodes=max_nodes, legend=legend,
                      rankdir=rankdir, title=repr(self))

    def node_rows(self, order: Optional[np.ndarray] = None) -> List[dict]:
        """One dict per node (all of them, or those of ``order``): id, name, describe, op,
        shape, bytes, sources, params (by name), flags -- the table pictures fold underneath."""
        ids = range(self.nodes.n) if order is None else (int(n) for n in order)
        return [{"id": n, "name": self.names.get(n, ""), "describe": describe(self, n),
                 "op": OPS[int(self.nodes.op[n])].name, "shape": self.shape_of(n),
                 "bytes": int(np.prod(self.shape_of(n), dtype=np.int64)) * self.dtype.itemsize,
                 "sources": self.nodes.sources(n), "params": params_text(self, n),
                 "flags": flag_names(int(self.nodes.flags[n]))} for n in ids]

    def _repr_svg_(self):
        return render_svg(self.to_dot(max_nodes=150))

    def _repr_html_(self):
        return rich_html(repr(self), self.to_dot(max_nodes=150), self.node_rows(), f"{self.nodes.n} nodes")

    # ---- leaves ----------------------------------------------------------------
    @property
    def store(self) -> np.ndarray:
        """One array holding every param's and const's value (64-byte aligned slots).

        New values queue up and are packed into one exactly-sized array the first
        time the store is needed, so adding 10k params costs 10k small copies, not
        a doubling array's repeated reallocation."""
        if self._pending:
            with self._store_lock:              # programs may run from several threads
                if self._pending:
                    parts = [self._store[: self._packed]] + self._pending
                    store = aligned_zeros(sum(p.size for p in parts), self.dtype)
                    np.concatenate(parts, out=store)
                    self._store, self._packed = store, store.size
                    self._pending = []
        return self._store

    def _store_add(self, arr):
        """Queue a copy of ``arr`` (cast to the graph dtype); returns its store offset."""
        size = arr.size
        padded = -(-size // _ALIGN) * _ALIGN
        slot = np.empty(padded, self.dtype)
        slot[:size] = arr.reshape(-1)
        slot[size:] = 0
        off = self.store_used
        self._pending.append(slot)
        self.store_used = off + padded
        return off

    def _leaf_with_value(self, op, flags, value, name, what):
        arr = as_numeric_array(value, what)
        shape = arr.shape
        if len(shape) > MAX_DIMS or 0 in shape:
            check_shape(shape, what)          # raises with the message
        self._check_name(name)                # before anything is added
        if arr.dtype.kind in "iu" and op == CONST:
            flags |= F_INDEX      # an integer const can index an embedding
        off = self._store_add(arr)
        t = self._node(op, (), shape, ip=slots(LeafIP, offset=off), flags=flags)
        self._set_name(t.id, name)
        return t

    def input(self, shape: Union[int, Sequence[int]], name: Optional[str] = None, dtype: Any = None) -> "Tensor":
        """A placeholder fed at run time.  ``dtype`` may be an integer type for an
        index input (embedding indices); otherwise the graph's float dtype."""
        what = f"input {name!r}" if name else "input"
        shape = check_shape(shape, what)
        flags = F_INPUT
        if dtype is not None:
            dt = np.dtype(dtype)
            if dt.kind in "iu":
                flags |= F_INDEX
            elif dt.kind != "f":
                raise GraphError(f"{what}: dtype must be a float or integer type, got {dt}")
        self._check_name(name)
        t = self._node(INPUT, (), shape, flags=flags)
        self._set_name(t.id, name)
        return t

    def param(self, value: Any, name: Optional[str] = None) -> "Tensor":
        """A trainable leaf with an initial value (copied, cast to the graph dtype)."""
        t = self._leaf_with_value(PARAM, F_PARAM, value, name, f"param {name!r}" if name else "param")
        self.params.append(t.id)
        return t

    def const(self, value: Any, name: Optional[str] = None) -> "Tensor":
        """A constant leaf; never gets a gradient."""
        return self._leaf_with_value(CONST, F_CONST, value, name, f"const {name!r}" if name else "const")


def _graph_in(args: tuple, kwargs: dict) -> Optional["Graph"]:
    """The graph of the first Tensor among a builder's arguments (or in a list of them)."""
    for a in args:
        if type(a) is Tensor:
            return a.graph
        if isinstance(a, (list, tuple)) and a and type(a[0]) is Tensor:
            return a[0].graph
    for a in kwargs.values():
        if type(a) is Tensor:
            return a.graph
    return None


def transactional(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build`` (an op builder) made all or nothing: if it raises -- a bad operand found
    after it made a const or a reshape -- its graph drops what it added (``Graph.rollback``)
    before the exception propagates.  What ``jitgraph.<op>`` and the Tensor operators call."""
    @functools.wraps(build)
    def builder(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else None
        g = first.graph if type(first) is Tensor else _graph_in(args, kwargs)     # the usual case, inline
        if g is None:
            return build(*args, **kwargs)
        n = g.nodes.n
        try:
            return build(*args, **kwargs)
        except BaseException:
            g.rollback(n)
            raise
    return builder


_public: Dict[Any, Callable[..., Any]] = {}     # builder -> its transactional form


def public_builders() -> Dict[str, Callable[..., Any]]:
    """{name: builder} of every public op builder (registry.EXPORTS), each transactional:
    the functions ``jitgraph.<name>`` are."""
    out = {}
    for name, fn in EXPORTS.items():
        if fn not in _public:
            _public[fn] = transactional(fn)
        out[name] = _public[fn]
    return out


_by_op_name: Dict[str, Callable[..., Any]] = {}


def _op(name: str) -> Any:
    """The public builder of op ``name`` (the ops register themselves when jitgraph is imported)."""
    got = _by_op_name.get(name)
    if got is None:
        fn = BY_NAME[name].builder
        got = _by_op_name[name] = _public.setdefault(fn, transactional(fn))
    return got


class Tensor:
    """A handle to one node of a Graph.  Hashable, so it can key a feed dict."""

    __slots__ = ("graph", "id", "shape")
    __array_priority__ = 1000     # numpy scalars/arrays on the left defer to us

    def __init__(self, graph: "Graph", node_id: int, shape: Optional[tuple] = None) -> None:
        self.graph = graph
        self.id = node_id
        self.shape: tuple = graph.shape_of(node_id) if shape is None else shape   # a node's shape never changes

    # ---- operators: numpy broadcasting; Python numbers and arrays become consts ----
    def __add__(self, other: "Operand") -> "Tensor":
        return _op("add")(self, other)

    def __radd__(self, other: "Operand") -> "Tensor":
        return _op("add")(other, self)

    def __sub__(self, other: "Operand") -> "Tensor":
        return _op("sub")(self, other)

    def __rsub__(self, other: "Operand") -> "Tensor":
        return _op("sub")(other, self)

    def __mul__(self, other: "Operand") -> "Tensor":
        return _op("mul")(self, other)

    def __rmul__(self, other: "Operand") -> "Tensor":
        return _op("mul")(other, self)

    def __truediv__(self, other: "Operand") -> "Tensor":
        return _op("div")(self, other)

    def __rtruediv__(self, other: "Operand") -> "Tensor":
        return _op("div")(other, self)

    def __matmul__(self, other: "Operand") -> "Tensor":
        return _op("matmul")(self, other)

    def __rmatmul__(self, other: "Operand") -> "Tensor":
        return _op("matmul")(other, self)

    def __neg__(self) -> "Tensor":
        return _op("neg")(self)

    def __abs__(self) -> "Tensor":
        return _op("abs")(self)

    def __pow__(self, exponent: float) -> "Tensor":
        return _op("pow")(self, exponent)

    # 0/1 masks; == and != keep comparing the tensors themselves (feed dicts key on them):
    # elementwise equality is jg.equal
    def __lt__(self, other: "Operand") -> "Tensor":
        return _op("less")(self, other)

    def __le__(self, other: "Operand") -> "Tensor":
        return _op("less_equal")(self, other)

    def __gt__(self, other: "Operand") -> "Tensor":
        return _op("greater")(self, other)

    def __ge__(self, other: "Operand") -> "Tensor":
        return _op("greater_equal")(self, other)

    def sum(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        return _op("sum")(self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        return _op("mean")(self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        return _op("max")(self, axis, keepdims)

    def reshape(self, *shape: Any) -> "Tensor":
        return _op("reshape")(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes: Any) -> "Tensor":
        return _op("transpose")(self, (axes[0] if len(axes) == 1 else axes) or None)

    @property
    def T(self) -> "Tensor":
        return _op("transpose")(self)

    def __hash__(self) -> int:
        return hash((id(self.graph), self.id))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and other.graph is self.graph and other.id == self.id

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __bool__(self) -> bool:
        return True

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        s = 1
        for d in self.shape:
            s *= d
        return s

    @property
    def dtype(self) -> np.dtype:
        return self.graph.dtype

    @property
    def op(self) -> str:
        return OPS[int(self.graph.nodes.op[self.id])].name

    @property
    def flags(self) -> list:
        return flag_names(int(self.graph.nodes.flags[self.id]))

    @property
    def sources(self) -> list:
        return [Tensor(self.graph, s) for s in self.graph.nodes.sources(self.id)]

    @property
    def name(self) -> Optional[str]:
        return self.graph.names.get(self.id)

    @name.setter
    def name(self, value: Optional[str]) -> None:
        self.graph._set_name(self.id, value)

    def named(self, name: str) -> "Tensor":
        """Set the name and return self: ``h = jg.relu(x @ W).named("h")``."""
        self.graph._set_name(self.id, name)
        return self

    @property
    def label(self) -> str:
        return self.graph.label(self.id)

    def _store_slice(self):
        g = self.graph
        if not int(g.nodes.flags[self.id]) & (F_PARAM | F_CONST):
            raise GraphError(f"tensor {self.label!r} ({self.op}) has no stored value; "
                             "only params and consts do (run a program to compute others)")
        off = int(g.nodes.ip[self.id, LeafIP.offset])
        return off, off + self.size

    @property
    def value(self) -> np.ndarray:
        """A copy of a param's or const's current value."""
        a, b = self._store_slice()
        return self.graph.store[a:b].reshape(self.shape).copy()

    @value.setter
    def value(self, new: Any) -> None:
        a, b = self._store_slice()
        arr = as_numeric_array(new, f"value of {self.label!r}")
        if arr.shape != self.shape:
            raise GraphError(f"value of {self.label!r}: shape {arr.shape} does not match the tensor's shape {self.shape}")
        self.graph.store[a:b] = arr.reshape(-1)

    @property
    def grad(self) -> np.ndarray:
        """The gradient of the last backward run that computed it (a numpy array)."""
        g = self.graph
        if not int(g.nodes.flags[self.id]) & F_PARAM:
            raise GraphError(f"tensor {self.label!r} is not a param; only params hold a .grad")
        got = g.grads.get(self.id)
        if got is None:
            raise GraphError(f"param {self.label!r} has no gradient yet: run a backward graph first")
        program, index = got
        return program._grad_value(index)

    def __repr__(self) -> str:
        kind = ",".join(self.flags) or self.op
        return f"<Tensor {self.label!r} {self.op} shape={self.shape} {self.dtype.name} [{kind}]>"

    # ---- pictures: the subgraph this tensor depends on ----
    def _ancestry(self):
        nodes = self.graph.nodes
        return topo_order(nodes.src, nodes.n, np.array([self.id], np.int64))[1]

    def to_dot(self, max_nodes: int = 200, legend: bool = True, rankdir: str = "TB") -> str:
        """Graphviz DOT text of everything this tensor depends on."""
        return to_dot(self.graph, self._ancestry(), max_nodes=max_nodes, legend=legend, rankdir=rankdir,
                      title=f"{self.label} {self.shape}")

    def _repr_svg_(self):
        return render_svg(self.to_dot(max_nodes=150))

    def _repr_html_(self):
        rows = self.graph.node_rows(self._ancestry())
        return rich_html(repr(self), self.to_dot(max_nodes=150), rows, f"{len(rows)} nodes in its subgraph")



Operand = Union[Tensor, float, int, np.ndarray, Sequence[float]]   # what ops accept beside tensors
