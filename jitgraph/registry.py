"""The op table: the single source of truth about every op.

Each op family module (``ops/unary.py``, ``ops/reduce.py`` ...) declares
each of its ops with one :func:`defop` call, right below the op's three parts:

* the **builder** -- the Python function users call; it checks the operands and
  applies the shape rule;
* the **runner** -- the kernel behind the op, written in the family's calling
  convention (see ``native.py``); compiled on first use, per dtype;
* the **vjp** -- the gradient rule, appending gradient nodes (see ``backward.py``);
  :data:`ZERO_GRAD` for a piecewise-constant op, :data:`NO_GRAD` for none.

Opcodes are explicit and **stable**: a code is never reused or renumbered (a test
pins them), so code compiled and cached against one op table can never dispatch to
the wrong kernel after another op is added.  Saved graphs store op *names*.
Everything else -- the public exports (``EXPORTS``: ``jitgraph.relu`` ...), cost
tables, viz labels, the names in saved files -- is read from this table.
"""
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

# what the memory planner needs to know about an op's output
LEAF = "leaf"                # data supplied from outside (input, param, const)
VIEW = "view"                # aliases its first source: no kernel, no buffer
ELEMENTWISE = "elementwise"  # same shape as its sources; may overwrite a source that dies here
OTHER = "other"
KINDS = (LEAF, VIEW, ELEMENTWISE, OTHER)   # index = the kind code the jitted planner reads

# cost classes: which results are worth keeping rather than recomputing
COMPUTE = "compute"          # matmul, reductions, row kernels: expensive per byte
MEMORY = "memory"            # elementwise, copies: cheap to recompute
FREE = "free"                # leaves and views

# how a big node of the op is cut into blocks that threads run at once (threads.py)
NONE = "none"                # one piece (BLAS does its own threading; reductions with one output)
ELEMENTS = "elements"        # units are the output's elements
ROWS = "rows"                # units are the output's rows (all axes but the last)
CUSTOM = "custom"            # the runner reports its units when called with lo = -1
SPLITS = (NONE, ELEMENTS, ROWS, CUSTOM)

# flops: per output element (or per input element, if there are more), except
DOT = -1                     # a contraction: 2 * output elements * its contracted length,
DOT_K = 7                    # which the op records in ip[DOT_K] (cost.py)


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NO_GRAD = _Sentinel("NO_GRAD")       # no gradient rule: a gradient flowing through it is an error
ZERO_GRAD = _Sentinel("ZERO_GRAD")   # piecewise constant: contributes nothing to its sources


@dataclass(frozen=True)
class Op:
    code: int
    name: str
    family: str
    arity: int                    # number of sources; -1 = 2..MAX_SRC
    kind: str
    cost: str
    flops: int
    builder: Optional[Callable[..., Any]]   # None for leaves (made by Graph.input/param/const)
    runner: Optional[Callable[..., Any]]    # None for leaves and views
    vjp: Any                      # a rule function, ZERO_GRAD or NO_GRAD
    public: bool                  # exported as jitgraph.<name>
    label: str                    # how pictures and tables name it
    split: str                    # how threads share a big node (SPLITS)
    blas: bool = False            # its runner calls the BLAS (runs then hold the BLAS to one thread)

    @property
    def differentiable(self) -> bool:
        return self.vjp is not NO_GRAD


OPS: dict = {}          # code -> Op
BY_NAME: dict = {}      # name -> Op
EXPORTS: dict = {}      # public name -> builder: what ``jitgraph.<name>`` is (see ``export``)


def defop(code: int, name: str, builder: Optional[Callable[..., Any]] = None,
          runner: Optional[Callable[..., Any]] = None, vjp: Any = NO_GRAD, *, arity: int,
          kind: str = OTHER, cost: str = MEMORY, flops: int = 1, public: bool = True,
          label: Optional[str] = None, family: Optional[str] = None, split: Optional[str] = None,
          blas: bool = False) -> int:
    """Declare an op; returns its code.  See the module docstring."""
    if code in OPS:
        raise ValueError(f"opcode {code} of {name!r} is already taken by {OPS[code].name!r}")
    if name in BY_NAME:
        raise ValueError(f"op {name!r} is declared twice")
    if kind not in KINDS:
        raise ValueError(f"op {name!r}: unknown kind {kind!r}")
    if (runner is None) != (kind in (LEAF, VIEW)):
        raise ValueError(f"op {name!r}: leaves and views have no runner, every other op has one")
    if split is None:
        split = ELEMENTS if kind == ELEMENTWISE else NONE
    if split not in SPLITS:
        raise ValueError(f"op {name!r}: unknown split {split!r}")
    if family is None:
        owner = builder or runner
        family = owner.__module__.rsplit(".", 1)[-1] if owner is not None else "leaf"
    OPS[code] = Op(code, name, family, arity, kind, cost, flops, builder, runner, vjp,
                   public and builder is not None, label or name, split, blas)
    BY_NAME[name] = OPS[code]
    if builder is not None and OPS[code].public:
        export(builder)
    _tables.clear()
    return code


def export(builder: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``builder`` public as ``jitgraph.<its name>``: defop does it for every public
    op's builder; a builder that is not an op's own (``scale``, ``conv1d``) says so with
    ``@export``."""
    name = builder.__name__
    if EXPORTS.get(name, builder) is not builder:
        raise ValueError(f"two public builders are named {name!r}")
    EXPORTS[name] = builder
    return builder


def n_codes() -> int:
    """Size of the per-opcode tables (codes may have gaps: removed ops are never reused)."""
    return max(OPS) + 1


_tables: dict = {}


def table(field: str) -> np.ndarray:
    """A per-opcode int64 array for jitted code: 'kind' (index into KINDS), 'compute'
    (1 for the compute-bound cost class), 'flops', 'arity' (-9 where no op has the code),
    'split' (index into SPLITS)."""
    got = _tables.get(field)
    if got is None:
        got = np.full(n_codes(), -9 if field == "arity" else 0, np.int64)
        for op in OPS.values():
            got[op.code] = {"kind": KINDS.index(op.kind), "compute": int(op.cost == COMPUTE),
                            "flops": op.flops, "arity": op.arity, "split": SPLITS.index(op.split)}[field]
        got.setflags(write=False)
        _tables[field] = got
    return got


def public_ops() -> list:
    return sorted(op.name for op in OPS.values() if op.public)


# the leaves: codes 0-3, made by Graph.input / param / const
NOP = defop(0, "nop", arity=0, kind=LEAF, cost=FREE, flops=0, family="leaf")   # never a valid node
INPUT = defop(1, "input", arity=0, kind=LEAF, cost=FREE, flops=0, vjp=ZERO_GRAD, family="leaf")
PARAM = defop(2, "param", arity=0, kind=LEAF, cost=FREE, flops=0, vjp=ZERO_GRAD, family="leaf")
CONST = defop(3, "const", arity=0, kind=LEAF, cost=FREE, flops=0, vjp=ZERO_GRAD, family="leaf")
