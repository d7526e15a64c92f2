"""Explicit Numba signatures for small helpers that jitted code calls with
constants.

Numba compiles a jitted callee once per *literal* argument value it is called
with from jitted code (every opcode constant passed to ``new_node`` was a fresh
compile: 31 of them, several seconds of cold start).  A declared signature
compiles each helper once; literal arguments are converted to it.  Helpers that
only some ops' gradient rules or passes use declare it with ``on_first_use``,
which compiles that one signature when first needed instead of at import (a cold
``import jitgraph`` compiled 16 helpers for 3.3 s; the conv ones alone took 0.8 s
in every MLP user's first process).
"""
from numba import types, typeof
from numba.core import config, typeinfer
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

from .ir import NodeTable

G = typeof(NodeTable(16).arrays())        # the node table tuple handed to jitted passes
i64 = types.int64
f64 = types.float64
ST = types.Array(types.int64, 1, "C")     # a pass's [count, capacity] state, or an int64 row

# Float kernels keep lazy compilation: a signature would compile them for both
# dtypes at import, and their few literal specializations (constant strides)
# are fast code worth having.


class FirstUse(CPUDispatcher):
    """A jitted function with one declared signature, compiled (or loaded from the
    cache) the first time a caller is compiled or it is called -- not at import, so a
    program that never uses it (a conv helper in an MLP) never pays for it.  Once
    compiled it behaves as ``njit(signature)``: literal arguments convert to it."""

    _declared = None

    def _compile_declared(self):
        if self._can_compile:
            with global_compiler_lock:        # the lock typing already holds: no second lock to order
                if self._can_compile:
                    with typeinfer.register_dispatcher(self):
                        self.compile(self._declared)
                    self.disable_compile()

    def get_call_template(self, args, kws):
        self._compile_declared()
        return super().get_call_template(args, kws)

    def _compile_for_args(self, *args, **kws):
        # a call from Python before any compile: the caller invokes what this returns
        self._compile_declared()
        return self.overloads[tuple(self._declared.args)].entry_point


def on_first_use(signature):
    """``@njit(signature, cache=True)``, compiled on first use (``FirstUse``)."""
    def wrap(fn):
        if config.DISABLE_JIT:            # as njit does: the plain function
            return fn
        disp = FirstUse(py_func=fn, locals={}, targetoptions={"nopython": True, "boundscheck": None})
        disp.enable_caching()
        disp._declared = signature
        return disp
    return wrap
