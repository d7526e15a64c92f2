"""The op table: the single source of truth about every op.

Each op family module (``ops/unary.py``, ``ops/reduce.py`` ...) declares
each of its ops with one :func:`defop` call, right below the op's three parts:

* the **builder** -- the Python function users call; it checks the operands and
  applies the shape rule;
* the **runner** -- the kernel behind the op, written in the family's calling
  convention (see ``native.py``); compiled on first use, per dtype;
* the **vjp** -- the gradient rule, appending gradient nodes (see ``backward.py``);
  :data:`ZERO_GRAD` for a piecewise-constant op, :data:`NO_GRAD` for none.

``chunk=`` is an elementwise op's *chunk runner*: the same element function over a
group's chunk (its family's convention, native.py's RUN_CHUNK), compiled only for programs
that fuse the op; with one, the fusion pass (fuse.py) may put the op in a group.

Opcodes are explicit and **stable**: a code is never reused or renumbered (a test
pins them), so code compiled and cached against one op table can never dispatch to
the wrong kernel after another op is added.  Saved graphs store op *names*.
Everything else -- the public exports (``EXPORTS``: ``jitgraph.relu`` ...), cost
tables, viz labels, the names in saved files -- is read from this table.
"""
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Optional

import numpy as np

from .ir import MAX_SRC, N_FP, N_IP

# what the memory planner needs to know about an op's output
LEAF = "leaf"                # data supplied from outside (input, param, const)
VIEW = "view"                # aliases its first source: no kernel, no buffer
ELEMENTWISE = "elementwise"  # same shape as its sources (and overwrites one, by default)
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


# ---- the code table: every op's code, by family --------------------------------------------------
# Append-only: a code is never renumbered or reused (tests/test_registry.py pins every one); a new
# op takes the next free code (NEXT_CODE) here.  71, 72, 77 and 78 were skipped and stay unused.
NOP, INPUT, PARAM, CONST = 0, 1, 2, 3                                  # leaves (Graph.input/param/const)
ADD, SUB, MUL, DIV, AFFINE, WHERE = 4, 5, 6, 7, 9, 47                  # ops/binary.py
NEG, SQR, SQRT, EXP, LOG, ABS, RELU, GELU, SILU, TANH, SIGMOID, COPY = 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20
STEP, SIGN, GELU_D, GELU_DD, SILU_D, SILU_DD, LEAKY_RELU, RELU_D = 21, 22, 23, 24, 25, 26, 48, 88   # ops/derivatives.py (leaky_relu: unary.py)
SIN, COS, POW, CLIP, CLIP_MASK, SOFTPLUS = 56, 57, 58, 59, 60, 89      # ops/elementary.py
MAXIMUM, MINIMUM, LESS, LESS_EQUAL, GREATER, GREATER_EQUAL, EQUAL = 61, 62, 63, 64, 65, 66, 67   # ops/compare.py
SUM, MEAN, MAX, BROADCAST, MAX_MASK, ARGMAX = 27, 28, 29, 30, 31, 68   # ops/reduce.py
RESHAPE, TRANSPOSE, CONCAT, SLICE, PAD = 32, 33, 34, 35, 36            # ops/shape.py
MATMUL = 37                                                            # ops/linear.py
SOFTMAX, LOG_SOFTMAX, CROSS_ENTROPY, SOFTMAX_D, LOG_SOFTMAX_D = 38, 39, 40, 49, 50            # ops/softmaxes.py
CROSS_ENTROPY_D, CROSS_ENTROPY_INDEX, CROSS_ENTROPY_INDEX_D = 53, 54, 55
LAYER_NORM, RMS_NORM, NORM_RSTD, LAYER_NORM_D, RMS_NORM_D, LAYER_NORM_AFFINE = 41, 42, 43, 51, 52, 87   # ops/norm.py
DROPOUT = 44                                                           # ops/stochastic.py
EMBEDDING, SCATTER_ADD = 45, 46                                        # ops/gather.py
ATTENTION, ATTENTION_D = 69, 70                                        # ops/attention.py
BATCH_NORM, BATCH_STATS, BATCH_NORM_SUMS, BATCH_NORM_DX = 73, 74, 75, 76   # ops/batchnorm.py
CONV2D, CONV2D_WEIGHT = 79, 80                                         # ops/conv.py
IM2COL, COL2IM = 81, 82                                                # ops/windows.py
MAX_POOL2D, MAX_POOL2D_D, AVG_POOL2D, AVG_POOL2D_D = 83, 84, 85, 86   # ops/pool.py
GROUP, EPILOGUE = 90, 91                                               # ops/group.py: fused elementwise nodes
WINOGRAD_WEIGHTS = 92                                                  # ops/winograd.py
GELU_GRAD = 93                                                         # ops/derivatives.py
NEXT_CODE = 94


def _names(params: Any, what: str) -> tuple:
    """The slot names of a parameter declaration (an IntEnum of slots), '' for unused slots."""
    if params is None:
        return ()
    slots = {int(m): m.name for m in params}
    if min(slots) < 0:
        raise ValueError(f"{what}: negative parameter slot")
    return tuple(slots.get(i, "") for i in range(max(slots) + 1))


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
    sources: tuple = ()           # the names its rule gives its sources
    ip_names: tuple = ()          # its int parameters by slot (G.ip[n, slot]); '' for an unused slot
    fp_names: tuple = ()          # its float parameters by slot (G.fp[n, slot])
    chunk: Optional[Callable[..., Any]] = None   # its chunk runner: the op fuses (fuse.py)
    overwrites: bool = False      # may write its output over a same-sized source that dies here (plan.py)
    epilogue: bool = False        # may produce an epilogue's input: units and output image by image (ops/group.py)

    @property
    def fuse(self) -> bool:
        return self.chunk is not None

    @property
    def differentiable(self) -> bool:
        return self.vjp is not NO_GRAD

    def params(self, ip: Any, fp: Any) -> dict:
        """{name: value} of a node's parameters (its ip and fp rows)."""
        out = {name: int(ip[i]) for i, name in enumerate(self.ip_names) if name}
        out.update({name: float(fp[i]) for i, name in enumerate(self.fp_names) if name})
        return out


OPS: dict = {}          # code -> Op
BY_NAME: dict = {}      # name -> Op
EXPORTS: dict = {}      # public name -> builder: what ``jitgraph.<name>`` is (see ``export``)


DEFAULT_SOURCES = {1: ("x",), 2: ("a", "b"), 3: ("a", "b", "c"), 4: ("a", "b", "c", "d"), -1: ("x0", "x1", "x2", "x3")}


def defop(code: int, name: str, builder: Optional[Callable[..., Any]] = None,
          runner: Optional[Callable[..., Any]] = None, vjp: Any = NO_GRAD, *, arity: int,
          kind: str = OTHER, cost: str = MEMORY, flops: int = 1, public: bool = True,
          label: Optional[str] = None, family: Optional[str] = None, split: Optional[str] = None,
          blas: bool = False, sources: Optional[tuple] = None, ip: Any = None, fp: Any = None,
          chunk: Optional[Callable[..., Any]] = None, overwrites: Optional[bool] = None, epilogue: bool = False) -> int:
    """Declare an op; returns its code.  See the module docstring.  ``sources`` names the
    sources for its rule; ``ip`` / ``fp`` are IntEnums naming its int / float parameter
    slots, read by name everywhere (``v.ip[n, SoftmaxIP.axis]``)."""
    ip_names, fp_names = _names(ip, name), _names(fp, name)
    if len(ip_names) > N_IP or len(fp_names) > N_FP:
        raise ValueError(f"op {name!r}: more parameter slots than a node has ({N_IP} int, {N_FP} float)")
    if flops == DOT and (len(ip_names) <= DOT_K or ip_names[DOT_K] != "contracted"):
        raise ValueError(f"op {name!r}: a contraction names ip slot {DOT_K} 'contracted' (the cost model reads it)")
    if sources is None:
        sources = DEFAULT_SOURCES.get(arity, ())
    if len(sources) > MAX_SRC:
        raise ValueError(f"op {name!r}: more than {MAX_SRC} sources")
    if code in OPS:
        raise ValueError(f"opcode {code} of {name!r} is already taken by {OPS[code].name!r}")
    if name in BY_NAME:
        raise ValueError(f"op {name!r} is declared twice")
    if kind not in KINDS:
        raise ValueError(f"op {name!r}: unknown kind {kind!r}")
    if (runner is None) != (kind in (LEAF, VIEW)):
        raise ValueError(f"op {name!r}: leaves and views have no runner, every other op has one")
    if chunk is not None and (kind != ELEMENTWISE or ip_names):
        raise ValueError(f"op {name!r}: only elementwise ops without int parameters fuse")
    if epilogue and split != CUSTOM:
        raise ValueError(f"op {name!r}: an epilogue's producer reports its units (split 'custom')")
    if split is None:
        split = ELEMENTS if kind == ELEMENTWISE else NONE
    if split not in SPLITS:
        raise ValueError(f"op {name!r}: unknown split {split!r}")
    if family is None:
        owner = builder or runner
        family = owner.__module__.rsplit(".", 1)[-1] if owner is not None else "leaf"
    OPS[code] = Op(code, name, family, arity, kind, cost, flops, builder, runner, vjp,
                   public and builder is not None, label or name, split, blas, tuple(sources), ip_names, fp_names, chunk,
                   kind == ELEMENTWISE if overwrites is None else overwrites, epilogue)
    BY_NAME[name] = OPS[code]
    if builder is not None and OPS[code].public:
        export(builder)
    _tables.clear()
    return code


_slot_maps: dict = {}       # declaration -> (row width, {name: slot}); an enum's iteration and lookups are slow


def slots(params: Any, **values: Any) -> tuple:
    """A node's parameter row from values by name, in the slot order of ``params`` (an op's
    IntEnum declaration): what builders hand to ``Graph._node(ip=..., fp=...)``."""
    known = _slot_maps.get(params)
    if known is None:
        known = _slot_maps[params] = (max(int(m) for m in params) + 1, {m.name: int(m) for m in params})
    width, index = known
    row = [0] * width
    for name, value in values.items():
        row[index[name]] = value
    return tuple(row)


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
    (1 for the compute-bound cost class), 'memory' (1 for the memory-bound one), 'flops',
    'arity' (-9 where no op has the code),
    'split' (index into SPLITS), 'fuse' (1 where the op fuses), 'overwrites' (1 where its
    output may take a dying source's buffer), 'epilogue' (1 where an epilogue may run it)."""
    got = _tables.get(field)
    if got is None:
        got = np.full(n_codes(), -9 if field == "arity" else 0, np.int64)
        for op in OPS.values():
            got[op.code] = {"kind": KINDS.index(op.kind), "compute": int(op.cost == COMPUTE),
                            "memory": int(op.cost == MEMORY),
                            "flops": op.flops, "arity": op.arity, "split": SPLITS.index(op.split),
                            "fuse": int(op.fuse), "overwrites": int(op.overwrites),
                            "epilogue": int(op.epilogue)}[field]
        got.setflags(write=False)
        _tables[field] = got
    return got


def public_ops() -> list:
    return sorted(op.name for op in OPS.values() if op.public)


class LeafIP(IntEnum):
    offset = 0               # params and consts: where the value starts in the graph's value store


# the leaves, made by Graph.input / param / const
defop(NOP, "nop", arity=0, kind=LEAF, cost=FREE, flops=0, family="leaf")   # never a valid node
defop(INPUT, "input", arity=0, kind=LEAF, cost=FREE, flops=0, vjp=ZERO_GRAD, family="leaf")
defop(PARAM, "param", arity=0, kind=LEAF, cost=FREE, flops=0, vjp=ZERO_GRAD, family="leaf", ip=LeafIP)
defop(CONST, "const", arity=0, kind=LEAF, cost=FREE, flops=0, vjp=ZERO_GRAD, family="leaf", ip=LeafIP)
