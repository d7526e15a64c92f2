"""The vector width of jitgraph's loops: the widest the CPU has.

LLVM tunes its loop vectorizer to prefer 256-bit vectors on Intel's AVX-512 cores (its
``prefer-256-bit`` tuning, from the first of them, which slowed their clock for 512-bit
work) and to use 512 bits on AMD's.  jitgraph's elementwise kernels are compute-bound
loops of polynomials (exp, erf, tanh): measured on an Intel Xeon with AVX-512
(perf/RESULTS.md), 512-bit vectors ran a loop of exp 1.55x and of gelu 1.3x as fast.  So
where the CPU has AVX-512, jitgraph drops that tuning before Numba sets up its code
generator: every CPU with AVX-512 gets 512-bit loops, whoever made it.

The width changes speed, never a bit: Numba vectorizes without reassociating (no
fastmath), so every element goes through the same operations at any width.  Numba's cache
records the features code was compiled for, so code compiled for one width never loads
for the other.

``JITGRAPH_VECTOR_BITS=256`` keeps LLVM's own tuning.  Numba's code generator is shared by
the process: the choice applies to the user's own jitted functions too, and is not made
when the user set ``NUMBA_CPU_FEATURES`` / ``NUMBA_CPU_NAME`` (theirs is kept) or when
Numba compiled something before jitgraph was imported (its generator is set up then).
This module must be imported before any jitted function is defined.
"""
import os

from numba.core import config
from numba.core.codegen import get_host_cpu_features
from numba.core.registry import cpu_target

from .errors import GraphError

ENV = "JITGRAPH_VECTOR_BITS"
PREFER_256 = "-prefer-256-bit"     # an LLVM tuning flag; minus: turned off


def _choose():
    """(bits of the loops' vectors, why, set by jitgraph?)."""
    asked = os.environ.get(ENV, "").strip()
    if asked not in ("", "256", "512"):
        raise GraphError(f"{ENV}={asked!r}: expected 256 or 512, or unset for the widest vectors the CPU has")
    if config.CPU_FEATURES is not None or getattr(config, "CPU_NAME", None):
        return 0, "NUMBA_CPU_FEATURES / NUMBA_CPU_NAME set: Numba's choice for them", False
    features = get_host_cpu_features().split(",")
    if "+avx512f" not in features:
        return (256 if "+avx" in features else 128), "the CPU's widest", False
    if "_toplevel_target_context" in cpu_target.__dict__:
        return 0, "LLVM's tuning for this CPU: Numba compiled code before jitgraph was imported", False
    if asked == "256":
        return 256, f"{ENV}=256 (LLVM's tuning for this CPU)", False
    config.CPU_FEATURES = ",".join(features + [PREFER_256])
    return 512, "AVX-512: the CPU's widest", True


BITS, WHY, SET_BY_JITGRAPH = _choose()


def child_env() -> dict:
    """What a child process (the compile helpers) needs in its environment to compile for
    the code generator this process has: the same choice (where this process could not
    make it, the helpers must not make it either)."""
    return {ENV: "512" if SET_BY_JITGRAPH else "256"}


def describe() -> str:
    width = f"{BITS}-bit" if BITS else "as Numba chose"
    return f"{width} ({WHY})"
