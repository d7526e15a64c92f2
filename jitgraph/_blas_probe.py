"""Numba's check that a BLAS exists, answered without importing all of scipy.linalg.

The first time a process compiles or loads cached code, Numba imports
``numba.np.arraymath``, which checks for a BLAS by importing ``scipy.linalg.cython_blas`` --
and so the whole of ``scipy.linalg``, whose ``array_api_compat`` touches numpy's lazily
loaded ``f2py`` (numpy/numpy#26776).  Measured on a 2-core AMD EPYC Zen 4: 0.2 s of a warm
process's 0.8 s, for code jitgraph never runs (its products call the BLAS it chose,
blas.py).

So before anything is jitted, scipy's ``cython_blas`` extension is loaded from its file (it
needs nothing of ``scipy.linalg``), stands in ``sys.modules`` while ``arraymath`` is
imported, and is withdrawn at once: a later ``import scipy.linalg.cython_blas`` (Numba's
``np.dot``, blas.py's fallback, the user's own) imports ``scipy.linalg`` as usual and gets
the very same module object.  Anything unexpected leaves the plain import to Numba.
"""
import importlib.machinery
import importlib.util
import os
import sys

NAME = "scipy.linalg.cython_blas"


def _extension_file():
    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "linalg", "cython_blas" + suffix)
            if os.path.isfile(path):
                return path
    return None


def _stand_in():
    """scipy's cython_blas extension loaded from its file alone, or None (no scipy, already
    imported, or an unusual scipy: then Numba imports it its own way)."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules or NAME in sys.modules:
        return None
    path = _extension_file()
    if path is None:
        return None
    try:
        spec = importlib.util.spec_from_file_location(NAME, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:
        return None
    return module


# Module level, so that it happens once and before anything is jitted: the stand-in is in
# sys.modules only while arraymath's BLAS check runs.
_module = _stand_in()
LIGHT = _module is not None
"""True when arraymath was imported here with the bare extension standing in."""
if LIGHT:
    sys.modules[NAME] = _module
try:
    import numba.np.arraymath  # noqa: E402,F401  -- its BLAS check finds the module above
finally:
    if LIGHT:
        del sys.modules[NAME]
del _module
