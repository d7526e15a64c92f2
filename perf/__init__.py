"""jitgraph's benchmark harness (harness.py, environment.py, report.py) and its workloads
(suite.py: a-g, j and k, with compile_time.py, gpt.py, distributed.py and concurrency.py; bench_*.py:
the named scripts), registered in run.py.

In a checkout this is the folder perf/; the wheel ships it as the subpackage
``jitgraph._perf`` (pyproject.toml maps it), which ``jitgraph bench`` imports.  The
modules import each other relatively, so they work under either name; run as scripts
(``python perf/run.py``, ``python perf/bench_forward.py``) they first load this folder
as ``jitgraph._perf`` (``jitgraph.cli.perf_package``).
"""
