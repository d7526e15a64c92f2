"""Gradient rules as data: each op's vector-Jacobian product is one expression in its op's
file, turned once into a *rule program* that the jitted backward pass interprets
(backward.py).  Nothing is compiled per rule.

A rule is a Python function of symbols, run once (on first use) to record its program::

    defop(TANH, "tanh", ..., vjp=lambda g, out: g * (1 - op.sqr(out)))
    defop(MUL, "mul", ..., vjp=lambda g, a, b: (g * b, g * a))

Its parameters are bound by name: the first is the incoming gradient; ``out`` is the node
itself; the op's source names (``sources=`` of defop; ``x`` / ``a, b`` / ``a, b, c`` by
default) are its sources; its parameter names (the ``ip=`` / ``fp=`` declarations) are the
node's parameters.  It returns one gradient (one source) or a tuple, one per source
(``None``: no gradient flows there), each in the node's broadcast shape: the backward pass
sums a contribution down to its source's shape.  A value shared by several sources is
built once (a rule returns every source's gradient at once).

In a rule, node symbols combine with ``+ - * / @``, unary ``-`` and ``.T`` (a product's
transpose flags, never a node); a Python number or a scalar symbol beside a node folds
into one ``affine`` node, as it does when building a graph (``1 - t`` is affine(t, -1, 1)).
``op.<name>(*sources, like=, dims=, params_from=, **params)`` emits any op: its shape is
the broadcast of its sources (elementwise ops) or ``like``'s with ``dims`` {padded axis:
size} changed; ``params_from`` copies a node's parameters; named parameters set the rest.
Scalar symbols -- parameters, ``x.shape[3]`` (shapes padded to 4 dims, as kernels see them),
numbers -- have arithmetic, comparisons, ``&``, ``|``, ``<<``; ``either(cond, a, b)`` picks
a node or a scalar by a scalar condition (only the chosen branch is built).  A product
``x @ y`` is a rule's result, laid out by its op's file for the source it is the gradient
of (``lays_out_products``).

The program: instructions (EMIT an op, SELECT a branch, SOURCE of a node) over refs to g /
out / the sources / earlier results, every op's program in a few int64 arrays
(``tables``).  Scalars are not in the program: an op's scalar expressions are evaluated
for all of its nodes at once, in numpy, before the pass runs (``Tables.scalars``), and an
instruction names its scalars by index.  A scalar reads g's shape, and the parameters,
shapes, ndim, id and opcode of out and the sources; an emitted node's shape, which its
emission determines (``like`` and ``dims``, or the broadcast), is rewritten in those terms
when the rule is recorded.
"""
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import registry
from .ir import F_LEAF, MAX_DIMS, MAX_SRC, N_FP, N_IP
from .scalars import BCAST, BINARY, GRAD, LEAVES, NONE, OUT, SHAPES, SRC, Scalars

# ---- instructions: one int64 row each ----------------------------------------------------------
EMIT, SELECT, SOURCE = 0, 1, 2
I_KIND, I_OP, I_SRC, I_LIKE, I_FROM = 0, 1, 2, 6, 7     # I_SRC: 4 refs
I_DIMS = 8                   # 4 (axis, size) pairs
I_IP = I_DIMS + 2 * MAX_DIMS  # one per int param slot (-1: 0, or params_from's)
I_FP = I_IP + N_IP
WIDTH = I_FP + N_FP
MAX_DEPS = 12
MAX_INSTRUCTIONS = 48        # per rule: backward.py reserves room for its emissions
# EMIT: I_OP the opcode; the dims, ip and fp fields name one of the op's scalars each (-1: none).
# SELECT: I_OP names its condition (a scalar), I_SRC its two branches.  SOURCE: I_SRC[0] a node,
# I_OP which of its sources.

class Tape:
    """The instructions of the rule being recorded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: List[dict] = []

    def add(self, **row: Any) -> "Sym":
        if len(self.rows) == MAX_INSTRUCTIONS:
            raise ValueError(f"rule of {self.name!r}: more than {MAX_INSTRUCTIONS} instructions")
        self.rows.append(row)
        return Sym(self, len(self.rows) - 1)


def _num(x: Any) -> "Num":
    if isinstance(x, Num):
        return x
    if isinstance(x, (bool, int, float, np.integer, np.floating)):
        return Num(("const", float(x)))
    raise TypeError(f"a rule's scalar must be a number or a scalar symbol, got {type(x).__name__}")


class Num:
    """A scalar in a rule: a constant, a node's parameter or shape, arithmetic of those."""

    __slots__ = ("tree",)
    __hash__ = object.__hash__

    def __init__(self, tree: tuple) -> None:
        self.tree = tree

    def _bin(self, name: str, other: Any, swap: bool = False) -> "Num":
        a, b = (_num(other), self) if swap else (self, _num(other))
        return Num((name, a, b))

    def __add__(self, o): return self._bin("add", o)             # noqa: E704
    def __radd__(self, o): return self._bin("add", o, True)      # noqa: E704
    def __sub__(self, o): return self._bin("sub", o)             # noqa: E704
    def __rsub__(self, o): return self._bin("sub", o, True)      # noqa: E704
    def __truediv__(self, o): return self._bin("truediv", o)     # noqa: E704
    def __rtruediv__(self, o): return self._bin("truediv", o, True)   # noqa: E704
    def __floordiv__(self, o): return self._bin("floordiv", o)   # noqa: E704
    def __mod__(self, o): return self._bin("mod", o)             # noqa: E704
    def __eq__(self, o): return self._bin("eq", o)               # noqa: E704
    def __ne__(self, o): return self._bin("ne", o)               # noqa: E704
    def __lt__(self, o): return self._bin("lt", o)               # noqa: E704
    def __le__(self, o): return self._bin("le", o)               # noqa: E704
    def __gt__(self, o): return self._bin("gt", o)               # noqa: E704
    def __ge__(self, o): return self._bin("ge", o)               # noqa: E704
    def __and__(self, o): return self._bin("and", o)             # noqa: E704
    def __or__(self, o): return self._bin("or", o)               # noqa: E704
    def __rlshift__(self, o): return self._bin("lshift", o, True)     # noqa: E704
    def __neg__(self): return Num(("neg", self))                 # noqa: E704
    def __invert__(self): return Num(("not", self))              # noqa: E704

    def __mul__(self, o):
        return o._affine(self, 0.0) if isinstance(o, Sym) else self._bin("mul", o)

    __rmul__ = __mul__

    def __bool__(self):
        raise TypeError("a rule's scalar has no truth value when the rule is recorded: use either(cond, a, b)")


class _Shape:
    def __init__(self, sym: "Sym") -> None:
        self.sym = sym

    def __getitem__(self, d: Any) -> Num:
        if isinstance(d, Num):
            return Num(("shape_at", self.sym, d))
        if not 0 <= d < MAX_DIMS:
            raise IndexError(f"padded shapes have {MAX_DIMS} axes, got {d}")
        return Num(("shape", self.sym, int(d)))


class Sym:
    """A node in a rule: g, out, a source, or the result of an earlier instruction."""

    __slots__ = ("tape", "ref", "trans")

    def __init__(self, tape: Tape, ref: int, trans: Any = 0) -> None:
        self.tape, self.ref, self.trans = tape, ref, trans

    # -- what a scalar may read of a node
    @property
    def shape(self) -> _Shape:
        return _Shape(self)

    @property
    def ndim(self) -> Num:
        return Num(("ndim", self))

    @property
    def id(self) -> Num:
        return Num(("id", self))

    @property
    def opcode(self) -> Num:
        return Num(("opcode", self))

    def ip(self, slot: int) -> Num:
        return Num(("ip", self, int(slot)))

    def source(self, i: int) -> "Sym":
        return self.tape.add(kind=SOURCE, op=int(i), srcs=(self,))

    # -- arithmetic, as graph building folds it
    def _affine(self, scale: Any, shift: Any) -> "Sym":
        return op.affine(self, scale=scale, shift=shift)

    def __add__(self, o):
        return op.add(self, o) if isinstance(o, Sym) else self._affine(1.0, o)

    __radd__ = __add__

    def __sub__(self, o):
        return op.sub(self, o) if isinstance(o, Sym) else self._affine(1.0, -_num(o))

    def __rsub__(self, o):
        return self._affine(-1.0, o)

    def __mul__(self, o):
        return op.mul(self, o) if isinstance(o, Sym) else self._affine(o, 0.0)

    __rmul__ = __mul__

    def __truediv__(self, o):
        return op.div(self, o) if isinstance(o, Sym) else self._affine(1.0 / _num(o), 0.0)

    def __neg__(self):
        return op.neg(self)

    # -- products: transposes are flags of the product node, never nodes
    def transposed(self, flag: Any) -> "Sym":
        """This operand as a product reads it: transposed where ``flag`` (a matmul's flag)."""
        return Sym(self.tape, self.ref, flag)

    @property
    def T(self) -> "Sym":
        return Sym(self.tape, self.ref, 1 - _num(self.trans))

    def __matmul__(self, o: "Sym") -> "Product":
        return Product(self, o)

    def __bool__(self):
        raise TypeError("a rule's node has no truth value: use either(cond, a, b)")


class Product:
    """``x @ y`` in a rule: a result, laid out for the source it is the gradient of when the
    rule returns it (the layout is its op's: ``lays_out_products``)."""

    def __init__(self, x: Sym, y: Sym) -> None:
        self.x, self.y = x, y

    def _operand(self, *_: Any):
        raise ValueError(f"rule of {self.x.tape.name!r}: a product that is not a result (a product is "
                         "laid out for the source it is returned for, so it cannot be an operand)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __matmul__ = __neg__ = _operand


_layout: List[Callable[..., Sym]] = []


def lays_out_products(fn: Callable[..., Sym]) -> Callable[..., Sym]:
    """Register ``fn(x, tx, y, ty, k, out, sources) -> Sym``, which emits op(x) @ op(y)
    (transpose flags tx, ty) as the gradient of source k of node out (ops/linear.py)."""
    _layout[:] = [fn]
    return fn


def either(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where the scalar ``cond`` holds, else ``b``: nodes (or None), or scalars."""
    if isinstance(a, Sym) or isinstance(b, Sym) or a is None or b is None:
        tape = (a if isinstance(a, Sym) else b).tape
        return tape.add(kind=SELECT, op=_num(cond), srcs=(a, b))
    return Num(("select", _num(cond), _num(a), _num(b)))


class _Emitters:
    """``op.<name>(...)``: emit the op ``name`` in a rule (see the module docstring)."""

    def __getattr__(self, name: str):
        spec = registry.BY_NAME.get(name)
        if spec is None:
            raise AttributeError(f"no op named {name!r}")

        def emit(*sources: Optional[Sym], like: Optional[Sym] = None, dims: Optional[dict] = None,
                 params_from: Optional[Sym] = None, **params: Any) -> Sym:
            tape = next((s.tape for s in (*sources, like, params_from) if isinstance(s, Sym)), None)
            if tape is None or len(sources) > MAX_SRC:
                raise ValueError(f"op.{name}: needs 1 to {MAX_SRC} node sources")
            if like is None and spec.kind != registry.ELEMENTWISE:
                raise ValueError(f"op.{name}: not elementwise, so its shape needs like=")
            ip, fp = {}, {}
            for key, value in params.items():
                if key in spec.ip_names:
                    ip[spec.ip_names.index(key)] = value
                elif key in spec.fp_names:
                    fp[spec.fp_names.index(key)] = value
                else:
                    raise ValueError(f"op.{name}: no parameter {key!r} (it has {spec.ip_names + spec.fp_names})")
            return tape.add(kind=EMIT, op=spec.code, srcs=sources, like=like, dims=dims or {},
                            params_from=params_from, ip=ip, fp=fp)
        return emit


op = _Emitters()


# ---- recording every rule --------------------------------------------------------------------------
def record(spec: "registry.Op"):
    """(tape, per-source result refs) of ``spec``'s rule function."""
    tape = Tape(spec.name)
    names = list(inspect.signature(spec.vjp).parameters)
    sources = spec.sources
    out = Sym(tape, OUT)
    source_syms = [Sym(tape, SRC - i) for i in range(len(sources))]
    bound: List[Any] = [Sym(tape, GRAD)]
    for name in names[1:]:
        if name == "out":
            bound.append(out)
        elif name in sources:
            bound.append(source_syms[sources.index(name)])
        elif name in spec.ip_names:
            bound.append(Num(("ip", out, spec.ip_names.index(name))))
        elif name in spec.fp_names:
            bound.append(Num(("fp", out, spec.fp_names.index(name))))
        else:
            raise ValueError(f"rule of {spec.name!r}: {name!r} is neither out, a source {sources} nor a parameter "
                             f"{spec.ip_names + spec.fp_names}")
    got = spec.vjp(*bound)
    results = list(got) if isinstance(got, tuple) else [got]
    if len(results) > len(sources):
        raise ValueError(f"rule of {spec.name!r}: {len(results)} results for its {len(sources)} sources {sources}")
    refs = []
    for k, r in enumerate(results):
        if r is None:
            refs.append(NONE)
            continue
        if isinstance(r, Product):
            if not _layout:
                raise ValueError(f"rule of {spec.name!r}: a product, but no op lays products out")
            r = _layout[0](r.x, r.x.trans, r.y, r.y.trans, k, out, tuple(source_syms))
        if not isinstance(r, Sym) or r.tape is not tape:
            raise ValueError(f"rule of {spec.name!r}: result {k} is not a node of the rule")
        refs.append(r.ref)
    return tape, refs + [NONE] * (MAX_SRC - len(refs))


class _Compiler:
    """Flattens tapes into the arrays of ``tables``, and each op's scalars into trees over g,
    out and the sources."""

    def __init__(self) -> None:
        self.ins: List[List[int]] = []
        self.deps: List[List[int]] = []
        self.name = ""                               # the tape being added: its op's name, rows,
        self.rows: List[dict] = []
        self.index: Dict[str, int] = {}              # and scalars, by their text
        self.trees: List[tuple] = []

    def ref(self, x: Any) -> int:
        if x is None:
            return NONE
        if not isinstance(x, Sym):
            raise ValueError(f"a rule's node operand must be a node symbol or None, got {type(x).__name__}")
        return x.ref

    def scalar(self, x: Any) -> int:
        """The index of scalar ``x`` among the op's scalars (-1 for None)."""
        if x is None:
            return -1
        tree = self.tree(_num(x).tree)
        key = repr(tree)                        # repr: -0.0 and 0.0 stay two constants
        if key not in self.index:
            self.index[key] = len(self.trees)
            self.trees.append(tree)
        return self.index[key]

    def tree(self, t: tuple) -> tuple:
        """``t`` with node symbols as refs, reading only g's shape and out's and the sources'
        parameters and shapes: an emitted node's shape is rewritten as its emission sets it."""
        kind = t[0]
        if kind == "const":
            return t
        if kind in LEAVES:
            ref = t[1].ref
            if kind not in SHAPES and (ref >= 0 or ref == GRAD):
                what = "g" if ref == GRAD else f"the node of instruction {ref}"
                raise ValueError(f"rule of {self.name!r}: a scalar reads the {kind} of {what}; of g and of an "
                                 "emitted node, a rule may read only the shape and ndim")
            if kind == "ndim":
                return self.ndim(ref)
            if kind == "shape":
                return self.shape(ref, t[2])
            if kind != "shape_at":
                return (kind, ref, t[2] if len(t) > 2 else 0)
            at = self.tree(t[2].tree)
            if at[0] == "const":
                return self.shape(ref, min(max(int(at[1]), 0), MAX_DIMS - 1))
            if ref < 0:
                return ("shape_at", OUT if ref == GRAD else ref, at)
            v = self.shape(ref, MAX_DIMS - 1)          # an emitted node's: axis by axis
            for d in range(MAX_DIMS - 2, -1, -1):
                v = ("select", ("eq", at, ("const", float(d))), self.shape(ref, d), v)
            return v
        if kind in BINARY:
            return (kind, self.tree(t[1].tree), self.tree(t[2].tree))
        if kind in ("neg", "not"):
            return (kind, self.tree(t[1].tree))
        return ("select",) + tuple(self.tree(part.tree) for part in t[1:])

    def _emitted(self, ref: int, what: str) -> dict:
        row = self.rows[ref]
        if row["kind"] == SOURCE:
            raise ValueError(f"rule of {self.name!r}: a scalar reads the {what} of a source's source "
                             f"(instruction {ref}), which the rule cannot know")
        return row

    def shape(self, ref: int, d: int) -> tuple:
        """Axis d of node ref's shape, as a tree over g, out and the sources."""
        if ref < 0:
            return ("shape", OUT if ref == GRAD else ref, d)     # g is shaped as out
        row = self._emitted(ref, "shape")
        if row["kind"] == SELECT:
            return ("select", self.tree(_num(row["op"]).tree),
                    *(self.shape(self.ref(b), d) for b in row["srcs"]))
        srcs = [s for s in row["srcs"] if s is not None]
        if row.get("like") is None:             # the broadcast: a source's size where it is not 1
            v = self.shape(srcs[0].ref, d)
            for s in srcs[1:]:
                w = self.shape(s.ref, d)
                v = ("select", ("ne", w, ("const", 1.0)), w, v)
        else:
            v = self.shape(row["like"].ref, d)
        for axis, size in row.get("dims", {}).items():
            a = self.tree(_num(axis).tree)
            if a[0] == "const":
                v = self.tree(_num(size).tree) if int(a[1]) == d else v
            else:
                v = ("select", ("eq", a, ("const", float(d))), self.tree(_num(size).tree), v)
        return v

    def ndim(self, ref: int) -> tuple:
        if ref < 0:
            return ("ndim", OUT if ref == GRAD else ref, 0)
        row = self._emitted(ref, "ndim")
        if row["kind"] == SELECT:
            return ("select", self.tree(_num(row["op"]).tree), *(self.ndim(self.ref(b)) for b in row["srcs"]))
        if row.get("like") is not None:
            return self.ndim(row["like"].ref)
        srcs = [s for s in row["srcs"] if s is not None]
        v = self.ndim(srcs[0].ref)
        for s in srcs[1:]:
            w = self.ndim(s.ref)
            v = ("select", ("gt", w, v), w, v)
        return v

    def add(self, tape: Tape) -> Tuple[int, List[tuple]]:
        """Append ``tape``'s instructions; returns (its first row, the op's scalar trees)."""
        self.name, self.rows, self.index, self.trees = tape.name, tape.rows, {}, []
        start = len(self.ins)
        for j, r in enumerate(tape.rows):
            row = [-1] * WIDTH
            refs: set = set()
            row[I_KIND] = r["kind"]
            srcs = list(r.get("srcs", ())) + [None] * (MAX_SRC - len(r.get("srcs", ())))
            for i, s in enumerate(srcs):
                row[I_SRC + i] = self.ref(s)
            if r["kind"] == SELECT:
                row[I_OP] = self.scalar(r["op"])
            else:
                row[I_OP] = r["op"]
                row[I_LIKE] = BCAST if r.get("like") is None else self.ref(r["like"])
                row[I_FROM] = self.ref(r.get("params_from"))
                for q, (axis, size) in enumerate(r.get("dims", {}).items()):
                    row[I_DIMS + 2 * q] = self.scalar(axis)
                    row[I_DIMS + 2 * q + 1] = self.scalar(size)
                for slot, value in r.get("ip", {}).items():
                    row[I_IP + slot] = self.scalar(value)
                for slot, value in r.get("fp", {}).items():
                    row[I_FP + slot] = self.scalar(value)
                for ref in (*row[I_SRC:I_SRC + MAX_SRC], row[I_LIKE], row[I_FROM]):
                    if ref >= 0:
                        refs.add(ref)           # a SELECT's branch is marked only when chosen (backward.py)
            if any(d >= j for d in refs) or len(refs) > MAX_DEPS:
                raise ValueError(f"rule of {tape.name!r}: instruction {j} reads a later one")
            self.ins.append(row)
            self.deps.append(sorted(refs) + [-1] * (MAX_DEPS - len(refs)))
        return start, self.trees


class Tables:
    """Every op's rule program, as the jitted backward pass reads them, and its scalars."""

    def __init__(self) -> None:
        n = registry.n_codes()
        self.kind = np.zeros(n, np.int64)            # rule_kind of each opcode (see rule_kind)
        self.start = np.zeros(n, np.int64)
        self.count = np.zeros(n, np.int64)
        self.result = np.full((n, MAX_SRC), NONE, np.int64)
        self.n_scalars = np.zeros(n, np.int64)
        self.trees: Dict[int, List[tuple]] = {}      # opcode -> its scalars
        self.programs: Dict[int, Scalars] = {}
        comp = _Compiler()
        for spec in registry.OPS.values():
            self.kind[spec.code] = rule_kind(spec.vjp)
            if self.kind[spec.code] != PROGRAM:
                continue
            tape, refs = record(spec)
            self.start[spec.code], self.trees[spec.code] = comp.add(tape)
            self.count[spec.code] = len(tape.rows)
            self.result[spec.code] = refs
            self.n_scalars[spec.code] = len(self.trees[spec.code])
            self.programs[spec.code] = Scalars(self.trees[spec.code])
        self.ins = np.array(comp.ins or [[-1] * WIDTH], np.int64).reshape(-1, WIDTH)
        self.deps = np.array(comp.deps or [[-1] * MAX_DEPS], np.int64).reshape(-1, MAX_DEPS)

    def arrays(self):
        return self.kind, self.start, self.count, self.result, self.ins, self.deps

    def instructions(self, name: str) -> int:
        return int(self.count[registry.BY_NAME[name].code])

    def scalars(self, nodes, order: np.ndarray, need: np.ndarray):
        """(first, stride, ivals, fvals): the scalars of the rule of every node of
        ``order[::-1]`` that needs a gradient, in numpy, op by op over all its nodes at once;
        scalar i of the node at position p is at first[p] + i * stride[p] (an op's nodes
        hold one block, a column per scalar).  ivals are the values cast to int64, except a
        parameter copied as it is: exact (a dropout seed may pass 2**53)."""
        rev = order[::-1]
        ops = nodes.op[rev]
        count = np.where((need[rev] != 0) & ((nodes.flags[rev] & F_LEAF) == 0), self.n_scalars[ops], 0)
        first, stride = np.zeros(rev.size, np.int64), np.zeros(rev.size, np.int64)
        fvals, ivals = np.zeros(int(count.sum()) + 1), np.zeros(int(count.sum()) + 1, np.int64)
        end = 0
        with np.errstate(all="ignore"):
            for code in np.unique(ops[count > 0]).tolist():
                at = np.flatnonzero((ops == code) & (count > 0))
                ids, program, size = rev[at], self.programs[code], at.size * int(self.n_scalars[code])
                first[at], stride[at] = np.arange(end, end + at.size), at.size
                block, exact = fvals[end:end + size].reshape(-1, at.size), ivals[end:end + size].reshape(-1, at.size)
                values = program.run(nodes, ids)
                for i, step in enumerate(program.outputs):
                    block[i] = values[step]
                exact[:] = block                              # cast to int64
                for i, step in enumerate(program.outputs):
                    if program.exact[i]:
                        leaf = program.steps[step]
                        exact[i] = nodes.ip[ids if leaf[1] == OUT else nodes.src[ids, SRC - leaf[1]], leaf[2]]
                end += size
        return first, stride, ivals, fvals


NO_RULE, SKIP, PROGRAM = 0, 1, 2      # rule kinds: no rule (an error to need one), nothing flows, a program


def rule_kind(vjp: Any) -> int:
    if vjp is registry.NO_GRAD:
        return NO_RULE
    return SKIP if vjp is registry.ZERO_GRAD else PROGRAM


_tables: Dict[int, Tables] = {}


def tables() -> Tables:
    """The rule programs of every op, recorded on first use (a few ms)."""
    got = _tables.get(registry.n_codes())
    if got is None:
        got = _tables[registry.n_codes()] = Tables()
    return got
