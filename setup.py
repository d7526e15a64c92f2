"""Installing jitgraph compiles it: after the package is laid out for the wheel, the graph
passes and the common float32 kernels (jitgraph.warmup.COMMON) are compiled into the
package's own cache folder (``jitgraph/.jitcache``), which the wheel carries, so the first
process after ``pip install`` loads them instead of compiling.  The folder's name holds a
hash of the sources, the Numba / llvmlite / Python versions and the CPU (jitgraph/_cache.py):
installed where any of these differs, it is never read and jitgraph compiles as it runs.

``JITGRAPH_PRECOMPILE=0`` skips the step (editable installs skip it too: their cache is the
source tree's); ``JITGRAPH_PRECOMPILE=matmul,relu,...`` compiles those ops' kernels instead of
the common set.  Everything else is in pyproject.toml.
"""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_compiled(build_py):
    def run(self):
        super().run()
        if os.environ.get("JITGRAPH_PRECOMPILE", "1").strip() == "0" or getattr(self, "editable_mode", False):
            return
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "JITGRAPH_COMPILE_WORKERS")}
        env["JITGRAPH_QUIET"] = "1"           # precompile says what it does; no "first use" notice
        # cwd first on sys.path (python -c): the jitgraph just laid out in build_lib is the one imported
        subprocess.run([sys.executable, "-c", "import sys, jitgraph.warmup as w; sys.exit(w.precompile())"],
                       cwd=os.path.abspath(self.build_lib), env=env, check=True)


setup(cmdclass={"build_py": build_py_compiled})
