"""Every op, by family.  Importing this package declares them all in the op table
(registry.py); the builders each family lists in ``__all__`` are jitgraph's public
op functions."""
from . import (binary, compare, conv, elementary, gather, linear, norm, pool, reduce, shape, softmaxes, stochastic,
               unary, windows)
from .attention import *   # noqa: F401,F403  -- binds the name attention to the op, not the module
from .attention import __all__ as _attention_all
from .binary import *      # noqa: F401,F403
from .compare import *     # noqa: F401,F403
from .conv import *        # noqa: F401,F403
from .elementary import *  # noqa: F401,F403
from .gather import *      # noqa: F401,F403
from .linear import *      # noqa: F401,F403
from .norm import *        # noqa: F401,F403
from .pool import *        # noqa: F401,F403
from .reduce import *      # noqa: F401,F403
from .shape import *       # noqa: F401,F403
from .softmaxes import *   # noqa: F401,F403
from .stochastic import *  # noqa: F401,F403
from .unary import *       # noqa: F401,F403
from . import batchnorm
from .batchnorm import *   # noqa: F401,F403

__all__ = []
__all__ += _attention_all
__all__ += binary.__all__
__all__ += compare.__all__
__all__ += conv.__all__
__all__ += elementary.__all__
__all__ += gather.__all__
__all__ += linear.__all__
__all__ += norm.__all__
__all__ += pool.__all__
__all__ += reduce.__all__
__all__ += shape.__all__
__all__ += softmaxes.__all__
__all__ += stochastic.__all__
__all__ += unary.__all__
__all__ += batchnorm.__all__
