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
a node or a scalar by a scalar condition (only the chosen branch is built).

The program: instructions (EMIT an op, SELECT a branch, PRODUCT a matmul laid out for its
source, SOURCE of a node) over refs to g / out / the sources / earlier results, and
scalar expressions as stack code; every op's program in a few int64 arrays (``tables``).
"""
import inspect
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import registry
from .ir import MAX_DIMS, MAX_SRC, N_FP, N_IP

# ---- node refs: what an instruction's operands point at --------------------------------------
NONE = -1                    # no node (no gradient for that source)
GRAD, OUT = -2, -3           # the incoming gradient, the node itself
SRC = -10                    # source i is SRC - i
BCAST = -20                  # ``like`` of an elementwise emission: the broadcast of its sources

# ---- instructions: one int64 row each ----------------------------------------------------------
EMIT, SELECT, PRODUCT, SOURCE = 0, 1, 2, 3
I_KIND, I_OP, I_SRC, I_LIKE, I_FROM = 0, 1, 2, 6, 7     # I_SRC: 4 refs
I_DIMS = 8                   # 4 (axis expression, size expression) pairs
I_IP = I_DIMS + 2 * MAX_DIMS  # an expression per int param slot (-1: 0, or params_from's)
I_FP = I_IP + N_IP
WIDTH = I_FP + N_FP
MAX_DEPS = 12
MAX_INSTRUCTIONS = 48        # per rule: backward.py reserves room for its emissions
# SELECT: I_OP the condition, I_SRC the two branches.  PRODUCT: I_SRC x, y; I_IP, I_IP + 1 their
# transpose flags; I_OP the source slot it is the gradient of.  SOURCE: I_SRC[0] a node, I_OP i.

# ---- scalar expressions: stack code, rows (opcode, a, b) --------------------------------------
(S_CONST, S_IP, S_FP, S_SHAPE, S_SHAPE_AT, S_NDIM, S_ID, S_OPCODE, S_ADD, S_SUB, S_MUL, S_DIV, S_FLOORDIV,
 S_MOD, S_EQ, S_NE, S_LT, S_LE, S_GT, S_GE, S_AND, S_OR, S_SHL, S_NEG, S_NOT, S_SELECT) = range(26)
_BINARY = {"add": S_ADD, "sub": S_SUB, "mul": S_MUL, "truediv": S_DIV, "floordiv": S_FLOORDIV, "mod": S_MOD,
           "eq": S_EQ, "ne": S_NE, "lt": S_LT, "le": S_LE, "gt": S_GT, "ge": S_GE, "and": S_AND, "or": S_OR,
           "lshift": S_SHL}
_LEAVES = {"ip": S_IP, "fp": S_FP, "shape": S_SHAPE, "ndim": S_NDIM, "id": S_ID, "opcode": S_OPCODE}


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

    def __matmul__(self, o: "Sym") -> "Sym":
        return self.tape.add(kind=PRODUCT, op=-1, srcs=(self, o), ip={0: self.trans, 1: o.trans})

    def __bool__(self):
        raise TypeError("a rule's node has no truth value: use either(cond, a, b)")


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
    bound: List[Any] = [Sym(tape, GRAD)]
    for name in names[1:]:
        if name == "out":
            bound.append(Sym(tape, OUT))
        elif name in sources:
            bound.append(Sym(tape, SRC - sources.index(name)))
        elif name in spec.ip_names:
            bound.append(Num(("ip", Sym(tape, OUT), spec.ip_names.index(name))))
        elif name in spec.fp_names:
            bound.append(Num(("fp", Sym(tape, OUT), spec.fp_names.index(name))))
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
        if not isinstance(r, Sym) or r.tape is not tape:
            raise ValueError(f"rule of {spec.name!r}: result {k} is not a node of the rule")
        if r.ref >= 0 and tape.rows[r.ref]["kind"] == PRODUCT:
            tape.rows[r.ref]["op"] = k                   # the source this product is laid out for
        refs.append(r.ref)
    for j, row in enumerate(tape.rows):
        if row["kind"] == PRODUCT and row["op"] < 0:
            raise ValueError(f"rule of {spec.name!r}: a product that is not a result (instruction {j})")
    return tape, refs + [NONE] * (MAX_SRC - len(refs))


class _Compiler:
    """Flattens tapes into the arrays of ``tables``."""

    def __init__(self) -> None:
        self.ins: List[List[int]] = []
        self.deps: List[List[int]] = []
        self.code: List[Tuple[int, int, int]] = []
        self.index: List[Tuple[int, int]] = []
        self.consts: List[float] = []

    def ref(self, x: Any) -> int:
        if x is None:
            return NONE
        if not isinstance(x, Sym):
            raise ValueError(f"a rule's node operand must be a node symbol or None, got {type(x).__name__}")
        return x.ref

    def expr(self, x: Any, refs: set) -> int:
        """The id of the stack code of scalar ``x`` (-1 for None); refs collects the
        instructions it reads."""
        if x is None:
            return -1
        start = len(self.code)
        self._emit(_num(x).tree, refs)
        self.index.append((start, len(self.code) - start))
        return len(self.index) - 1

    def _emit(self, tree: tuple, refs: set) -> None:
        kind = tree[0]
        if kind == "const":
            self.consts.append(tree[1])
            self.code.append((S_CONST, len(self.consts) - 1, 0))
        elif kind in _LEAVES:
            sym = tree[1]
            if sym.ref >= 0:
                refs.add(sym.ref)
            self.code.append((_LEAVES[kind], sym.ref, tree[2] if len(tree) > 2 else 0))
        elif kind == "shape_at":
            self._emit(tree[2].tree, refs)
            if tree[1].ref >= 0:
                refs.add(tree[1].ref)
            self.code.append((S_SHAPE_AT, tree[1].ref, 0))
        elif kind in _BINARY:
            self._emit(tree[1].tree, refs)
            self._emit(tree[2].tree, refs)
            self.code.append((_BINARY[kind], 0, 0))
        elif kind in ("neg", "not"):
            self._emit(tree[1].tree, refs)
            self.code.append((S_NEG if kind == "neg" else S_NOT, 0, 0))
        else:                                  # select
            for part in tree[1:]:
                self._emit(part.tree, refs)
            self.code.append((S_SELECT, 0, 0))

    def add(self, tape: Tape) -> int:
        start = len(self.ins)
        for j, r in enumerate(tape.rows):
            row = [-1] * WIDTH
            refs: set = set()
            row[I_KIND] = r["kind"]
            srcs = list(r.get("srcs", ())) + [None] * (MAX_SRC - len(r.get("srcs", ())))
            for i, s in enumerate(srcs):
                row[I_SRC + i] = self.ref(s)
            if r["kind"] == SELECT:
                cond_refs: set = set()
                row[I_OP] = self.expr(r["op"], cond_refs)
                if cond_refs:
                    raise ValueError(f"rule of {tape.name!r}: a condition may read only g, "
                                     "out and the sources")
            else:
                row[I_OP] = r["op"]
                row[I_LIKE] = BCAST if r.get("like") is None else self.ref(r["like"])
                row[I_FROM] = self.ref(r.get("params_from"))
                for q, (axis, size) in enumerate(r.get("dims", {}).items()):
                    row[I_DIMS + 2 * q] = self.expr(axis, refs)
                    row[I_DIMS + 2 * q + 1] = self.expr(size, refs)
                for slot, value in r.get("ip", {}).items():
                    row[I_IP + slot] = self.expr(value, refs)
                for slot, value in r.get("fp", {}).items():
                    row[I_FP + slot] = self.expr(value, refs)
            for ref in (*row[I_SRC:I_SRC + MAX_SRC], row[I_LIKE], row[I_FROM]):
                if ref >= 0:
                    refs.add(ref)
            if r["kind"] == SELECT:
                refs = set()                    # a branch is marked only when chosen (backward.py)
            if any(d >= j for d in refs) or len(refs) > MAX_DEPS:
                raise ValueError(f"rule of {tape.name!r}: instruction {j} reads a later one")
            self.ins.append(row)
            self.deps.append(sorted(refs) + [-1] * (MAX_DEPS - len(refs)))
        return start


class Tables:
    """Every op's rule program, as the jitted backward pass reads them."""

    def __init__(self) -> None:
        n = registry.n_codes()
        self.kind = np.zeros(n, np.int64)            # rule_kind of each opcode (see rule_kind)
        self.start = np.zeros(n, np.int64)
        self.count = np.zeros(n, np.int64)
        self.result = np.full((n, MAX_SRC), NONE, np.int64)
        comp = _Compiler()
        for spec in registry.OPS.values():
            self.kind[spec.code] = rule_kind(spec.vjp)
            if self.kind[spec.code] != PROGRAM:
                continue
            tape, refs = record(spec)
            self.start[spec.code] = comp.add(tape)
            self.count[spec.code] = len(tape.rows)
            self.result[spec.code] = refs
        self.ins = np.array(comp.ins or [[-1] * WIDTH], np.int64).reshape(-1, WIDTH)
        self.deps = np.array(comp.deps or [[-1] * MAX_DEPS], np.int64).reshape(-1, MAX_DEPS)
        self.code = np.array(comp.code or [(0, 0, 0)], np.int64).reshape(-1, 3)
        self.index = np.array(comp.index or [(0, 0)], np.int64).reshape(-1, 2)
        self.consts = np.array(comp.consts or [0.0], np.float64)

    def arrays(self):
        return self.kind, self.start, self.count, self.result, self.ins, self.deps, self.code, self.index, self.consts

    def instructions(self, name: str) -> int:
        return int(self.count[registry.BY_NAME[name].code])


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
