"""Run the jitgraph benchmark suite: the same as ``jitgraph bench`` (see jitgraph/bench.py).

    python perf/run.py                    # full run, a few minutes; results in perf/results/<timestamp>/
    python perf/run.py --quick --only a,d # tiny sizes, a smoke test

On machines where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set, unset them for the
benchmark only: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python perf/run.py``.
"""
import os
import sys

# the checkout's jitgraph first, so this works without installing the package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jitgraph.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
