"""jg.save / jg.load: graphs, tensors, programs and optimizer state in one .npz.

No pickled code: only numpy arrays (allow_pickle=False) and JSON text.  Ops are
stored by *name*, so a file survives opcode renumbering.  A SHA-256 over every
array detects corruption; a truncated file fails to open as a zip.  Before any
loaded array reaches jitted code it is checked structurally (source ids, op
arities, shapes, store offsets, program orders), so a bad file raises
GraphError instead of crashing the process.
"""
import hashlib
import json
import os
import zipfile
from typing import Any, Dict, Union

import numpy as np

from .errors import GraphError
from .graph import Graph, Tensor
from .ir import FIELDS, F_LEAF, MAX_DIMS, MAX_SRC, N_FP, N_IP, aligned_zeros
from .optim import AdamW, Optimizer, SGD
from .program import BackwardGraph, ForwardGraph, Program
from .ops.conv import PHASES, ConvIP
from .registry import BY_NAME, INPUT, OPS, LeafIP, table

MAGIC = "jitgraph"
VERSION = 2          # 2: parameters stored by name (``meta["params"]``); 1: by slot, before they had names


def _checksum(arrays):
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _graph_of(obj):
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, (Tensor, Program, Optimizer)):
        return obj.graph
    raise GraphError(f"save: cannot save a {type(obj).__name__}; save a Graph, Tensor, program, optimizer, "
                     "or a dict of them")


def save(path: Union[str, "os.PathLike[str]"], obj: Any) -> None:
    """Save ``obj`` -- a Graph, a Tensor, a ForwardGraph / BackwardGraph, an optimizer,
    or a dict {name: any of these} sharing one graph -- to ``path`` (.npz)."""
    items = obj if isinstance(obj, dict) else {"": obj}
    if not items:
        raise GraphError("save: nothing to save (an empty dict)")
    graphs = {id(_graph_of(v)): _graph_of(v) for v in items.values()}
    if len(graphs) != 1:
        raise GraphError("save: the objects belong to different graphs; save each graph to its own file")
    g = next(iter(graphs.values()))
    n = g.nodes.n
    arrays = {f"ir_{f}": getattr(g.nodes, f)[:n] for f in FIELDS}
    arrays["store"] = g.store[: g.store_used]
    arrays["params"] = np.asarray(g.params, np.int64)
    arrays["opnames"] = np.array([OPS[c].name if c in OPS else "" for c in range(max(OPS) + 1)])
    objects = []
    for i, (key, v) in enumerate(items.items()):
        if not isinstance(key, str):
            raise GraphError(f"save: dict keys must be strings, got {key!r}")
        rec: Dict[str, Any] = {"key": key}
        if isinstance(v, Graph):
            rec["kind"] = "graph"
        elif isinstance(v, Tensor):
            rec.update(kind="tensor", id=v.id)
        elif isinstance(v, BackwardGraph):
            rec.update(kind="backward", outputs=[t.id for t in v.forward.outputs], params=v.params,
                       grad_nodes=v.grad_nodes, in_place=v.in_place)
            arrays[f"obj{i}_forward_order"] = v.forward.order
        elif isinstance(v, ForwardGraph):
            rec.update(kind="forward", outputs=[t.id for t in v.outputs], single=v._single, in_place=v.in_place)
            arrays[f"obj{i}_order"] = v.order
        elif isinstance(v, Optimizer):
            state = v.state_dict()
            rec.update(kind="optimizer", cls=v.kind, params=[p.id for p in v.params], step=state["step"],
                       hyper=state["hyper"])
            for name, a in state["state"].items():
                arrays[f"obj{i}_state_{name}"] = a
        else:
            raise GraphError(f"save: cannot save {key!r}, a {type(v).__name__}")
        objects.append(rec)
    used = {OPS[int(c)] for c in np.unique(g.nodes.op[:n])}
    meta = {"magic": MAGIC, "version": VERSION, "dtype": g.dtype.name,
            "names": {str(k): v for k, v in sorted(g.names.items())}, "objects": objects,
            "single": not isinstance(obj, dict),
            "params": {op.name: [list(op.ip_names), list(op.fp_names)] for op in sorted(used, key=lambda o: o.code)}}
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["checksum"] = np.array(_checksum(arrays))
    with open(path, "wb") as f:               # a file object: numpy adds no .npz suffix
        np.savez(f, **arrays)


def load(path: Union[str, "os.PathLike[str]"]) -> Any:
    """Load what ``save`` wrote: the same kind of object (or dict of objects)."""
    if not os.path.exists(path):
        raise GraphError(f"load: no file {path!r}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError, Exception) as e:
        raise GraphError(f"load {path!r}: not a jitgraph file, or it is truncated or corrupted "
                         f"({type(e).__name__}: {e})") from None
    if "checksum" not in arrays or "meta" not in arrays:
        raise GraphError(f"load {path!r}: not a jitgraph file (no checksum or metadata)")
    stored = str(arrays.pop("checksum"))
    if _checksum(arrays) != stored:
        raise GraphError(f"load {path!r}: the file is corrupted (checksum mismatch)")
    try:
        meta = json.loads(str(arrays["meta"]))
    except ValueError:
        raise GraphError(f"load {path!r}: unreadable metadata") from None
    if meta.get("magic") != MAGIC or meta.get("version") not in (1, VERSION):
        raise GraphError(f"load {path!r}: not a jitgraph file of version 1 or {VERSION}")
    g = _rebuild_graph(path, arrays, meta)
    out = {}
    for i, rec in enumerate(meta["objects"]):
        out[rec["key"]] = _rebuild_object(path, g, arrays, i, rec)
    return out[""] if meta.get("single") else out


def _fail(path, what):
    raise GraphError(f"load {path!r}: invalid graph data: {what}")


def _rebuild_graph(path, arrays, meta):
    try:
        g = Graph(np.dtype(meta["dtype"]))
    except (GraphError, TypeError):
        _fail(path, f"dtype {meta.get('dtype')!r}")
    ir = {f: arrays.get(f"ir_{f}") for f in FIELDS}
    if any(a is None for a in ir.values()):
        _fail(path, "node arrays are missing")
    n = ir["op"].shape[0]
    if ir["ip"].ndim == 2 and ir["ip"].shape[0] == n and ir["ip"].shape[1] < N_IP:   # files of 0.1: 4 int params
        ir["ip"] = np.pad(ir["ip"], [(0, 0), (0, N_IP - ir["ip"].shape[1])])
    shapes = {"src": (n, MAX_SRC), "shape": (n, MAX_DIMS), "ip": (n, N_IP), "fp": (n, N_FP)}
    for f, a in ir.items():
        if a.shape != shapes.get(f, (n,)) or a.dtype.kind not in "iuf":
            _fail(path, f"node array {f!r} has shape {a.shape}")
    # ops by name -> this version's codes
    names = [str(s) for s in arrays["opnames"]]
    remap = np.empty(len(names), np.int64)
    for code, name in enumerate(names):
        if name not in BY_NAME:     # an op this version does not have (or an unused code)
            if np.any(ir["op"] == code):
                _fail(path, f"unknown op {name!r}")
            remap[code] = 0
        else:
            remap[code] = BY_NAME[name].code
    op = ir["op"].astype(np.int64)
    if n and (op.min() < 0 or op.max() >= len(names)):
        _fail(path, "an opcode out of range")
    op = remap[op]
    _params_by_name(path, ir, op, meta)
    src = ir["src"].astype(np.int64)
    if np.any(src < -1) or np.any(src >= n):
        _fail(path, "a source id outside the graph")
    arity = table("arity")[op]
    n_src = (src >= 0).sum(axis=1)
    fixed = arity >= 0
    if np.any(fixed & (n_src != np.maximum(arity, 0))) or np.any(~fixed & (n_src < 2)) \
            or np.any((src[:, 1:] >= 0) & (src[:, :-1] < 0)):
        _fail(path, "a node with the wrong number of sources")
    ndim = ir["ndim"].astype(np.int64)
    shape = ir["shape"].astype(np.int64)
    if np.any(ndim < 0) or np.any(ndim > MAX_DIMS) or np.any(shape < 1):
        _fail(path, "a bad shape")
    pad = np.arange(MAX_DIMS)[None, :] < (MAX_DIMS - ndim)[:, None]
    if np.any(shape[pad] != 1):
        _fail(path, "a shape not padded with 1s")
    store = aligned_zeros(arrays["store"].size, g.dtype)
    store[:] = arrays["store"]
    flags = ir["flags"].astype(np.int64)
    leaf = (flags & F_LEAF) != 0
    valued = leaf & (op != INPUT)
    at = ir["ip"][:, LeafIP.offset]
    ends = at + shape.prod(axis=1)
    if np.any(valued & ((at < 0) | (ends > store.size))):
        _fail(path, "a param or const outside the value store")
    nodes = g.nodes
    nodes.reserve(n)
    for f in FIELDS:
        getattr(nodes, f)[:n] = {"op": op, "src": src, "ndim": ndim, "shape": shape, "flags": flags}.get(f, ir[f])
    nodes.n = n
    g._store, g._packed, g.store_used = store, store.size, store.size
    g.params = [int(p) for p in arrays["params"] if 0 <= p < n]
    for k, v in meta.get("names", {}).items():
        g._set_name(int(k), v)
    return g


def _params_by_name(path, ir, op, meta):
    """Put each node's parameters in this version's slots, read by the names the file gives
    them (``meta["params"]``, {op: [int names, float names]}); a file written before
    parameters had names holds them in the slots of its day, where conv2d kept a PHASES
    stride in slots 4 and 5."""
    layouts = meta.get("params")
    if layouts is None:
        phases = (op == BY_NAME["conv2d"].code) & (ir["ip"][:, ConvIP.source] == PHASES)
        ir["ip"][phases, ConvIP.stride_h], ir["ip"][phases, ConvIP.stride_w] = ir["ip"][phases, 4], ir["ip"][phases, 5]
        ir["ip"][phases, 4] = ir["ip"][phases, 5] = 0
        return
    if not isinstance(layouts, dict):
        _fail(path, "the parameter layouts are not a mapping")
    for name, layout in layouts.items():
        spec = BY_NAME.get(name)
        rows = op == spec.code if spec is not None else np.zeros(op.size, bool)
        if not rows.any():
            continue
        if not (isinstance(layout, list) and len(layout) == 2 and all(isinstance(x, list) for x in layout)):
            _fail(path, f"the parameter layout of op {name!r}")
        for field, saved, now in (("ip", layout[0], spec.ip_names), ("fp", layout[1], spec.fp_names)):
            old = ir[field][rows]
            new = np.zeros_like(old)
            if len(saved) > old.shape[1]:
                _fail(path, f"op {name!r} has {len(saved)} {field} parameters")
            for i, param in enumerate(saved):
                if param in now and param:
                    new[:, now.index(param)] = old[:, i]
                elif np.any(old[:, i] != 0):
                    _fail(path, f"op {name!r}: parameter {param!r} is not one of this version's {now}")
            ir[field][rows] = new


def _tensor(path, g, i):
    if not isinstance(i, int) or not 0 <= i < g.nodes.n:
        _fail(path, f"a tensor id {i!r} outside the graph")
    return Tensor(g, i)


def _order(path, g, arrays, key):
    order = arrays.get(key)
    if order is None or order.ndim != 1:
        _fail(path, f"missing program order {key!r}")
    order = order.astype(np.int64)
    n = g.nodes.n
    if order.size and (order.min() < 0 or order.max() >= n or np.unique(order).size != order.size):
        _fail(path, "a program order with bad node ids")
    pos = np.full(n, -1, np.int64)
    pos[order] = np.arange(order.size)
    src = g.nodes.src[order]
    srcpos = np.where(src >= 0, pos[np.maximum(src, 0)], -2)
    if np.any((src >= 0) & ((srcpos < 0) | (srcpos >= np.arange(order.size)[:, None]))):
        _fail(path, "a program order that runs a node before its sources")
    return order


def _rebuild_object(path, g, arrays, i, rec):
    kind = rec.get("kind")
    if kind == "graph":
        return g
    if kind == "tensor":
        return _tensor(path, g, rec["id"])
    if kind == "forward":
        order = _order(path, g, arrays, f"obj{i}_order")
        outs = [_tensor(path, g, t) for t in rec["outputs"]]
        return ForwardGraph(g, order, outs, bool(rec["single"]), in_place=bool(rec["in_place"]))
    if kind == "backward":
        order = _order(path, g, arrays, f"obj{i}_forward_order")
        outs = [_tensor(path, g, t) for t in rec["outputs"]]
        fwd = ForwardGraph(g, order, outs, True, in_place=bool(rec["in_place"]))
        for p in rec["params"]:
            _tensor(path, g, p)
        for gn in rec["grad_nodes"]:
            if gn != -1:
                _tensor(path, g, gn)
        return BackwardGraph(fwd, rec["params"], rec["grad_nodes"], in_place=bool(rec["in_place"]))
    if kind == "optimizer":
        cls = {"SGD": SGD, "AdamW": AdamW}.get(rec.get("cls"))
        if cls is None:
            _fail(path, f"unknown optimizer {rec.get('cls')!r}")
        params = [_tensor(path, g, p) for p in rec["params"]]
        opt = cls(params)
        state = {k[len(f"obj{i}_state_"):]: arrays[k] for k in arrays if k.startswith(f"obj{i}_state_")}
        opt.load_state_dict({"kind": cls.kind, "step": rec["step"], "hyper": rec["hyper"],
                             "params": [(p.label, p.shape) for p in params], "state": state})
        return opt
    _fail(path, f"unknown object kind {kind!r}")
