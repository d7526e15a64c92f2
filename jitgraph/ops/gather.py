"""Row gathers by integer indices: embedding (rows of a table) and scatter_add
(its gradient: rows added back into a table).

Calling convention: source 0 is the float table (or the gradient rows), source 1
the index tensor, whose values the graph stores as floats (exact below 2**24 in
float32).  A kernel meeting an index that is out of range or not an integer
stops and reports its position, which the run turns into a GraphError.
"""
from typing import Union

import numpy as np
from numba import njit

from ..errors import GraphError
from ..graph import Tensor
from ..ir import F_INDEX, MAX_DIMS
from ..native import RUN_DETAIL, operand, output, run_view, span
from ..registry import EMBEDDING, ROWS, SCATTER_ADD, defop
from ..rules import op
from ..status import ERR_INDEX, OK
from .common import as_tensor, need_tensor


# the largest index a float of the graph's dtype holds exactly (indices are stored as floats)
MAX_EXACT_INDEX = {np.dtype(np.float32): 1 << 24, np.dtype(np.float64): 1 << 53}


def _index_operand(g, indices, rows, what, owner):
    """An integer index tensor: an index input, an integer const, or an int array (made a const)."""
    if isinstance(indices, Tensor):
        idx = as_tensor(indices, g, what)
        if not int(g.nodes.flags[idx.id]) & F_INDEX:
            raise GraphError(f"{what}: indices {idx.label!r} must be an integer input "
                             "(g.input(shape, dtype=np.int64)) or an integer constant")
        return idx
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":
        raise GraphError(f"{what}: indices for {owner.label!r} must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= rows):
        raise GraphError(f"{what}: indices for {owner.label!r} must lie in [0, {rows}), "
                         f"got values in [{arr.min()}, {arr.max()}]")
    return g.const(arr)


# ---- embedding ------------------------------------------------------------------------------------
def embedding(table: Tensor, indices: Union[Tensor, np.ndarray]) -> Tensor:
    """Rows of ``table`` (V, D) picked by integer ``indices`` -> shape indices.shape + (D,).

    ``indices`` is an integer input (``g.input(shape, dtype=np.int64)``) or an
    integer array (made a const).  Indices outside [0, V) raise at run time.
    """
    table = need_tensor(table, "embedding")
    g = table.graph
    if table.ndim != 2:
        raise GraphError(f"embedding: table {table.label!r} must be 2-D (V, D), got shape {table.shape}")
    V, D = table.shape
    if V > MAX_EXACT_INDEX[g.dtype]:
        raise GraphError(f"embedding: table {table.label!r} has {V} rows, more than {g.dtype} indexes exactly")
    idx = _index_operand(g, indices, V, "embedding", table)
    if idx.ndim + 1 > MAX_DIMS:
        raise GraphError(f"embedding: indices {idx.label!r} {idx.shape} would give more than {MAX_DIMS} dims")
    return g._node(EMBEDDING, (table.id, idx.id), idx.shape + (D,))


@njit(cache=True, error_model="numpy")
def embedding_kernel(out, table, idx, v, d, lo, hi):
    """Gather rows [lo, hi); returns the position of a bad index, or -1."""
    for i in range(lo, hi):
        f = idx[i]
        k = int(f)
        if not (0 <= f < v) or k != f:
            return i
        y = out[i * d:(i + 1) * d]
        row = table[k * d:(k + 1) * d]
        for j in range(d):
            y[j] = row[j]
    return -1


def _run_embedding(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    table = v.src[n, 0]
    idx = operand(v, n, 1)
    lo, hi = span(lo, hi, idx.size)
    bad = embedding_kernel(output(v, n), operand(v, n, 0), idx, v.shape[table, 2], v.shape[table, 3], lo, hi)
    if bad >= 0:
        v.ctx[RUN_DETAIL] = bad
        return ERR_INDEX
    return OK


defop(EMBEDDING, "embedding", embedding, _run_embedding, arity=2, split=ROWS, sources=("table", "indices"),
      vjp=lambda g, table, indices: (op.scatter_add(g, indices, like=table), None))   # rows of g into the table's


# ---- scatter_add: embedding's table gradient ------------------------------------------------------
def scatter_add(rows: Tensor, indices: Union[Tensor, np.ndarray], n_rows: int) -> Tensor:
    """A (n_rows, D) table of zeros with row ``indices[i]`` += ``rows[i]`` (embedding's adjoint);
    ``rows`` has shape indices.shape + (D,)."""
    rows = need_tensor(rows, "scatter_add")
    idx = _index_operand(rows.graph, indices, int(n_rows), "scatter_add", rows)
    if rows.shape != idx.shape + rows.shape[-1:]:
        raise GraphError(f"scatter_add: rows {rows.label!r} {rows.shape} must have the shape of the indices "
                         f"{idx.shape} plus one last axis")
    return rows.graph._node(SCATTER_ADD, (rows.id, idx.id), (int(n_rows), rows.shape[-1]))


@njit(cache=True, error_model="numpy")
def scatter_add_kernel(out, g, idx, v, d):
    for i in range(out.size):
        out[i] = 0.0
    for i in range(idx.size):
        f = idx[i]
        k = int(f)
        if not (0 <= f < v) or k != f:
            return i
        for j in range(d):
            out[k * d + j] += g[i * d + j]
    return -1


def _run_scatter_add(n, lo, hi, ctx, mem, store):
    v = run_view(ctx, mem, store)
    bad = scatter_add_kernel(output(v, n), operand(v, n, 0), operand(v, n, 1), v.shape[n, 2], v.shape[n, 3])
    if bad >= 0:
        v.ctx[RUN_DETAIL] = bad
        return ERR_INDEX
    return OK


defop(SCATTER_ADD, "scatter_add", scatter_add, _run_scatter_add, arity=2, public=False, sources=("rows", "indices"),
      vjp=lambda h, rows, indices: (op.embedding(h, indices, like=rows), None))
