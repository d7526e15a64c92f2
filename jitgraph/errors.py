"""The one exception type of the library."""
from typing import Optional


class GraphError(ValueError):
    """Raised for every invalid graph, argument or feed.

    The message names the tensor (or argument) and says what is wrong with it.
    It subclasses ValueError so ``except ValueError`` keeps working.
    """
    worker: Optional[int] = None   # the index of the data-parallel worker that raised it (jitgraph.distributed)
