"""Every op, by family.  Importing this package declares them all in the op table
(registry.py); ``registry.EXPORTS`` -- each public op's builder, and the few builders
declared with ``@export`` -- are jitgraph's public op functions (``jitgraph.relu``)."""
from . import (attention, batchnorm, binary, compare, conv, conv_weight, derivatives, elementary, gather, group, linear,  # noqa: F401
               norm, pool, reduce, shape, softmaxes, stochastic, unary, windows, winograd)
