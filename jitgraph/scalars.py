"""A rule's scalars: expression trees over node refs (a node's parameters, shape, ndim, id,
opcode; numbers; arithmetic, comparisons, selection), and their evaluation for all nodes of
an op at once, in numpy, before the backward pass runs (rules.Tables.scalars)."""
from typing import Any, Dict, List

import numpy as np

from .ir import MAX_DIMS

# ---- node refs: what an instruction's operands point at --------------------------------------
NONE = -1                    # no node (no gradient for that source)
GRAD, OUT = -2, -3           # the incoming gradient, the node itself
SRC = -4                     # source i is SRC - i (so -2 - ref indexes [g, out, sources...])
BCAST = -20                  # ``like`` of an elementwise emission: the broadcast of its sources

# ---- scalar expressions: trees ---------------------------------------------------------------------
# ("const", v); leaves (kind, node, slot or axis): ip, fp, shape, shape_at (axis a tree), ndim, id,
# opcode; (name, a, b) for the binary names below; ("neg", a), ("not", a); ("select", c, a, b).
BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "eq", "ne", "lt", "le", "gt", "ge", "and", "or",
          "lshift")
LEAVES = ("ip", "fp", "shape", "shape_at", "ndim", "id", "opcode")
SHAPES = ("shape", "shape_at", "ndim")       # all a scalar may read of g (out's) or of an emitted node


_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.divide, "eq": np.equal,
          "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}


class Scalars:
    """An op's scalars as one straight-line program over all of its nodes at once: every
    distinct subexpression a step, computed once (leaves are fancy-indexed reads of the node
    table, the rest numpy arithmetic); scalar i is step ``outputs[i]``."""

    def __init__(self, trees: List[tuple]) -> None:
        self.steps: List[tuple] = []
        self._index: Dict[tuple, int] = {}
        self.outputs = [self._lower(t) for t in trees]
        self.exact = [t[0] == "ip" for t in trees]          # a parameter copied as it is: int64, exactly

    def _lower(self, t: tuple) -> int:
        kind = t[0]
        if kind == "const":
            step: tuple = (kind, t[1], repr(t[1]))             # repr: -0.0 and 0.0 are two constants
        elif kind == "shape_at":
            step = (kind, t[1], self._lower(t[2]))
        elif kind in LEAVES:
            step = t
        else:
            step = (kind,) + tuple(self._lower(part) for part in t[1:])
        if step not in self._index:
            self._index[step] = len(self.steps)
            self.steps.append(step)
        return self._index[step]

    def run(self, nodes, ids: np.ndarray) -> List[Any]:
        """Every step's value for the nodes ``ids`` (float64 -- parameters, sizes and ids are
        integers far below 2**53, so exact; ``//``, ``%`` and ``<<`` on int64, as Python's,
        by zero 0)."""
        of: Dict[int, np.ndarray] = {}                      # the nodes a ref stands for
        v: List[Any] = []
        for step in self.steps:
            kind = step[0]
            if kind in LEAVES:
                m = of.get(step[1])
                if m is None:
                    m = of[step[1]] = ids if step[1] == OUT else nodes.src[ids, SRC - step[1]]
                if kind == "fp":
                    x = nodes.fp[m, step[2]]
                elif kind == "shape_at":                   # an axis out of range reads the nearest
                    x = nodes.shape[m, np.clip(v[step[2]], 0, MAX_DIMS - 1).astype(np.int64)]
                else:
                    x = (nodes.ip[m, step[2]] if kind == "ip" else nodes.shape[m, step[2]] if kind == "shape" else
                         nodes.ndim[m] if kind == "ndim" else m if kind == "id" else nodes.op[m])
                x = x.astype(np.float64)
            elif kind == "const":
                x = np.float64(step[1])
            elif kind == "neg":
                x = -v[step[1]]
            elif kind == "not":
                x = np.where(v[step[1]] == 0.0, 1.0, 0.0)
            elif kind == "select":
                x = np.where(v[step[1]] != 0.0, v[step[2]], v[step[3]])
            else:
                x = _binary(kind, v[step[1]], v[step[2]])
            v.append(x)
        return v


def _binary(kind: str, x: Any, y: Any) -> Any:
    if kind in _UFUNC:
        return np.asarray(_UFUNC[kind](x, y), np.float64)
    if kind == "and":
        return np.where((x != 0.0) & (y != 0.0), 1.0, 0.0)
    if kind == "or":
        return np.where((x != 0.0) | (y != 0.0), 1.0, 0.0)
    p, r = np.asarray(x).astype(np.int64), np.asarray(y).astype(np.int64)
    if kind == "lshift":
        return np.left_shift(p, r).astype(np.float64)
    r1 = np.where(r == 0, 1, r)
    v = np.floor_divide(p, r1) if kind == "floordiv" else np.mod(p, r1)
    return np.where(r == 0, 0, v).astype(np.float64)
