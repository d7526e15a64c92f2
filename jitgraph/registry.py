"""The op table: every op's name, arity, kind and cost class, by opcode.

Op families (``elementwise``, ``reduce``, ``matmul``, ``shape``, ``nn``) declare
their ops here with :func:`defop` right beside the op's shape rule, kernel and
gradient rule.  Codes are assigned in declaration order, so the ops of one family
form a contiguous range that the interpreter can test with two comparisons.
Saved graphs store op *names*, never codes.
"""
from dataclasses import dataclass

# what the memory planner needs to know about an op's output
LEAF = "leaf"            # data supplied from outside (input, param, const)
VIEW = "view"            # aliases its first source, no kernel, no buffer
ELEMENTWISE = "elementwise"  # same shape as src0 and may overwrite a dying src0/src1
OTHER = "other"

# cost classes (which nodes are worth saving rather than recomputing)
COMPUTE = "compute"      # matmul, reductions: expensive per byte
MEMORY = "memory"        # elementwise, copies: cheap to recompute
FREE = "free"            # leaves and views


@dataclass(frozen=True)
class OpInfo:
    code: int
    name: str
    arity: int           # number of sources; -1 = 1..MAX_SRC
    kind: str
    cost: str
    flops_per_element: int   # recompute-cost estimate per output element (matmul: own rule)
    differentiable: bool     # has a gradient rule


OPS = []          # indexed by opcode
BY_NAME = {}


def defop(name, arity, kind=OTHER, cost=MEMORY, flops=1, differentiable=True):
    code = len(OPS)
    info = OpInfo(code, name, arity, kind, cost, flops, differentiable)
    OPS.append(info)
    BY_NAME[name] = info
    return code


NOP = defop("nop", 0, FREE, FREE, 0, False)   # code 0: never a valid node
INPUT = defop("input", 0, LEAF, FREE, 0)
PARAM = defop("param", 0, LEAF, FREE, 0)
CONST = defop("const", 0, LEAF, FREE, 0)
LAST_LEAF = CONST
