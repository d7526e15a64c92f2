"""Module.summary: a table of a model's layers -- parameters, output shapes and, with a
backward program, the bytes of each layer's forward tensors the memory plan keeps for the
backward pass."""
from typing import Any, Dict, List

import numpy as np

from ..ir import LOC_ARENA, MAX_SRC
from ..program import BackwardGraph


def saved_bytes(program: BackwardGraph) -> np.ndarray:
    """Per node id: the bytes of each forward tensor the plan keeps in the arena until a
    backward node reads it (0 for the rest)."""
    G = program.run_table
    order = program.run_order
    n = program.graph.nodes.n
    pos = np.full(max(n, int(G.src.shape[0])), -1, np.int64)
    pos[order] = np.arange(order.size)
    last = np.full(pos.size, -1, np.int64)
    src = G.src[order, :MAX_SRC]
    readers = np.repeat(np.arange(order.size), MAX_SRC)
    flat = src.reshape(-1)
    ok = flat >= 0
    np.maximum.at(last, flat[ok], readers[ok])
    fwd = program.forward.order
    boundary = int(pos[fwd].max()) if fwd.size else -1
    kept = fwd[(last[fwd] > boundary) & (program.loc[fwd] == LOC_ARENA)]
    out = np.zeros(n, np.int64)
    sizes = np.array([int(np.prod(program.graph.shape_of(int(k)))) for k in kept], np.int64)
    out[kept] = sizes * program.itemsize
    return out


def summary_table(model: Any, program: Any = None) -> str:
    saved = saved_bytes(program) if isinstance(program, BackwardGraph) else None
    rows: List[Dict[str, str]] = []
    total_params = 0
    for path, m in model.named_modules():
        own = sum(p.data.size for p in m._parameters.values())
        total_params += own
        itemsize = m.graph.dtype.itemsize if m.graph is not None else 4
        row = {"layer": path or "(model)", "type": type(m).__name__, "params": f"{own:,}" if own else "",
               "param bytes": _bytes(own * itemsize) if own else "",
               "output": str(m._built[-1][2]) if m._built and m._built[-1][2] is not None else ""}
        if saved is not None:
            ids = [np.arange(a, min(b, saved.size)) for a, b, _ in m._built]
            own_nodes = np.concatenate(ids) if ids else np.zeros(0, np.int64)
            row["kept for backward"] = _bytes(int(saved[own_nodes].sum())) if own_nodes.size else ""
        rows.append(row)
    cols = list(rows[0])
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols), "  ".join("-" * width[c] for c in cols)]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
    lines.append(f"{total_params:,} parameters")
    if isinstance(program, BackwardGraph):
        lines.append(f"planned peak {_bytes(program.peak_bytes)} (the arena), {program.stats().get('plan', 'none')}")
    return "\n".join(lines)


def _bytes(b: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b} B"
