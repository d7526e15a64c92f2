"""Entry of the processes that help compile (see compiler.py): ``python -m
jitgraph._compile_worker CLAIMS UNIT...``."""
import sys

from jitgraph import compiler  # importing jitgraph registers every op

if __name__ == "__main__":
    sys.exit(compiler.worker(sys.argv[1:]))
