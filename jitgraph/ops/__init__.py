"""All ops, grouped by family.  Import order fixes the opcodes (see registry)."""
from ..registry import BY_NAME, OPS, CONST, INPUT, LAST_LEAF, NOP, PARAM  # noqa: F401
from . import elementwise, reduce, shape, matmul, nn  # noqa: F401  (declaration order = opcodes)
from .elementwise import (abs_, add, copy, div, exp, gelu, log, mul, neg, relu,  # noqa: F401
                          scale, sigmoid, silu, sqr, sqrt, sub, tanh)
from .matmul import matmul  # noqa: F401
from .nn import (cross_entropy, dropout, embedding, layer_norm, log_softmax,  # noqa: F401
                 rms_norm, softmax)
from .reduce import broadcast_to, max_, mean, sum_  # noqa: F401
from .shape import concat, pad_axis, reshape, slice_axis, transpose  # noqa: F401


def _install_tensor_methods():
    """Operators and methods on Tensor, so ``x @ W + b`` builds nodes."""
    from ..graph import Tensor

    def rsub(a, b):
        return sub(b, a)

    def rdiv(a, b):
        return div(b, a)

    def rmatmul(a, b):
        return matmul(b, a)

    def radd(a, b):
        return add(b, a)

    def rmul(a, b):
        return mul(b, a)

    Tensor.__add__ = add
    Tensor.__radd__ = radd
    Tensor.__sub__ = sub
    Tensor.__rsub__ = rsub
    Tensor.__mul__ = mul
    Tensor.__rmul__ = rmul
    Tensor.__truediv__ = div
    Tensor.__rtruediv__ = rdiv
    Tensor.__matmul__ = matmul
    Tensor.__rmatmul__ = rmatmul
    Tensor.__neg__ = neg
    Tensor.__abs__ = abs_
    Tensor.sum = sum_
    Tensor.mean = mean
    Tensor.max = max_
    Tensor.reshape = lambda t, *shape: reshape(t, shape[0] if len(shape) == 1 else shape)
    Tensor.transpose = lambda t, *axes: transpose(t, (axes[0] if len(axes) == 1 else axes) or None)
    Tensor.T = property(lambda t: transpose(t))


_install_tensor_methods()
