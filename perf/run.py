"""Run the jitgraph benchmark suite: the same as ``jitgraph bench``.

    python perf/run.py                          # a-g, j, k: some minutes; results in perf/results/<timestamp>/
    python perf/run.py --quick --only a,d       # tiny sizes, a smoke test
    python perf/run.py --only forward,backward  # the perf/bench_*.py workloads, by name
    python perf/run.py --only all

On machines where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set, unset them for the
benchmark only: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python perf/run.py``.
"""
import os
import sys

if not __package__:  # a script: load this folder as jitgraph._perf (the checkout's jitgraph first)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from jitgraph.cli import perf_package
    __package__ = perf_package().__name__

from . import bench_backward, bench_checkpoint, bench_conv, bench_forward, bench_memory, harness, suite  # noqa: E402
from . import bench_attention, bench_batchnorm, bench_budgets, bench_import  # noqa: E402

WORKLOADS = suite.WORKLOADS + [bench_forward.WORKLOAD, bench_backward.WORKLOAD, bench_memory.WORKLOAD,
                               bench_checkpoint.WORKLOAD, bench_conv.WORKLOAD, bench_batchnorm.WORKLOAD,
                               bench_attention.WORKLOAD, bench_budgets.WORKLOAD, bench_import.WORKLOAD]
DEFAULT = [w.key for w in suite.WORKLOADS]     # the lettered ones; the scripts by --only


def main(argv=None):
    return harness.main(argv, WORKLOADS, DEFAULT, prog="jitgraph bench",
                        description="Time named workloads against numpy and PyTorch eager; write results.json, "
                                    "results.md and plots to --out (see perf/harness.py for how).")


if __name__ == "__main__":
    sys.exit(main())
