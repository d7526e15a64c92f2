"""Compiled programs: an execution order plus a memory plan, runnable with feeds.

``build_forward(outputs)`` returns a ForwardGraph; ``build_backward``
(autodiff.py) returns a BackwardGraph, a Program whose order also holds the
gradient nodes.
"""
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import blas, compiler
from .cost import total_flops
from .errors import GraphError
from .fuse import fuse_and_plan, is_group
from .graph import Graph, Tensor, as_numeric_array
from .interpreter import block_runner, needs_blocks, run_nodes, run_nodes_debug
from .ir import F_INDEX, F_INPUT, F_OUTPUT, F_RECOMPUTED, LOC_ARENA, LOC_STORE, aligned_zeros
from .ops.group import members_of
from .order import topo_order
from .plan import K_VIEW, backward_orders
from .registry import OPS, table
from .running import RunningStats, io_slots
from .status import ERR_INDEX, ERR_NOT_COMPILED
from .threads import enter_run, held_blas
from .viz import plot_memory, render_svg, rich_html, to_dot

Feeds = Mapping[Any, Any]     # {input tensor or its name: array}


def _salt(seed):
    if seed is None:
        return 0
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise GraphError(f"run: seed must be an int, got {seed!r}")
    return int(seed) & 0x3FFFFFFFFFFFFFFF


def _output_list(outputs, what):
    if isinstance(outputs, Tensor):
        return [outputs], True
    try:
        outs = list(outputs)
    except TypeError:
        raise GraphError(f"{what}: expects a Tensor or a list of Tensors, got {type(outputs).__name__}") from None
    if not outs:
        raise GraphError(f"{what}: needs at least one output tensor")
    for t in outs:
        if not isinstance(t, Tensor):
            raise GraphError(f"{what}: outputs must be Tensors, got {type(t).__name__}")
        if t.graph is not outs[0].graph:
            raise GraphError(f"{what}: {outs[0].label!r} and {t.label!r} belong to different graphs")
    return outs, False


def execution_order(graph, roots, what):
    status, order = topo_order(graph.nodes.src, graph.nodes.n, np.asarray(roots, np.int64))
    if status:
        raise GraphError(f"{what}: node id {int(order[0])} is not a node of this graph")
    return order


def _timed(fn, G, order, args, clock):
    t0 = clock()
    fn(G, order, *args)
    return clock() - t0


class Program:
    """An execution order over a graph's nodes with a memory plan."""

    def __init__(self, graph: Graph, order: Any, outputs: List[Tensor], single: bool, io_nodes: Any = (),
                 in_place: bool = True, fuse: Union[bool, str] = "auto") -> None:
        """``order``: an execution order, or a list of candidate orders (the one whose
        plan peaks lowest is kept); ``fuse``: group elementwise nodes (fuse.py)."""
        self.graph = graph
        self.outputs = outputs            # Tensors returned by run()
        self._single = single
        self.in_place = bool(in_place)
        nodes = graph.nodes
        candidates = order if isinstance(order, list) else [order]
        # batch statistics outlive the run in io slots: the running statistics are updated from them after it
        io = io_slots(nodes, candidates[0], io_nodes)
        outs = np.asarray([t.id for t in outputs], np.int64)
        # order: every node, as built and differentiated; each candidate fused, then planned
        self.order, self._fused, plan = fuse_and_plan(nodes.arrays(), nodes.n, candidates, io, outs,
                                                      self.in_place, fuse)
        self.run_order = self._fused.order              # what runs and is planned: a group in its last member's place
        (self.loc, self.off, arena_elems, io_elems, n_in_place,
         self._free_at, self._free_off, self._free_size, self._alloc_size) = plan
        self.arena_elems = int(arena_elems)
        self.io_elems = int(io_elems)
        self.n_in_place = int(n_in_place)
        self._running = RunningStats.of(graph, self.order, self.off)   # None: no training batch_norm to update
        self._mem: Optional[np.ndarray] = None          # run buffer [arena | io] of the last finished run
        self._spare: List[np.ndarray] = []               # run buffers free for the next concurrent runs
        self.lock = threading.RLock()                    # guards the buffers (and a backward program's grads)
        in_order = (nodes.flags[self.order] & F_INPUT) != 0
        self.inputs = [int(i) for i in self.order[in_order]]
        self._input_set = set(self.inputs)
        # what runs: the runners of run_order's ops and epilogues' producers, chunk runners of other members
        inside = nodes.op[np.flatnonzero(self._fused.root >= 0)]   # every group's members (fuse.py's root column)
        chunked = table("fuse")[inside] != 0
        self._op_codes = np.union1d(self._fused.nodes.op[self.run_order], inside[~chunked])
        self._chunk_codes = np.unique(inside[chunked])
        self._calls_blas = any(OPS[int(c)].blas for c in np.union1d(self._op_codes, self._chunk_codes))
        self._tables: Optional[tuple] = None    # (runners, natives, blocks, chunk runners) once compiled

    # ---- sizes --------------------------------------------------------------------
    @property
    def itemsize(self) -> int:
        return self.graph.dtype.itemsize

    def _is_view(self):
        return table("kind")[self.graph.nodes.op[self.run_order]] == K_VIEW

    @property
    def peak_bytes(self) -> int:
        """Bytes of the arena that run() allocates: the plan's high-water mark."""
        return self.arena_elems * self.itemsize

    @property
    def persistent_bytes(self) -> int:
        """Inputs (io buffer) plus the params and consts this program reads."""
        nodes = self.graph.nodes
        leaf = self.run_order[(self.loc[self.run_order] == LOC_STORE) & ~self._is_view()]  # views: no bytes
        sizes = nodes.shape[leaf].prod(axis=1)
        return int(self.io_elems + sizes.sum()) * self.itemsize

    def memory_timeline(self) -> np.ndarray:
        """Live arena bytes after each step of the execution order (from the plan)."""
        freed = np.zeros(self.run_order.size, np.int64)
        counts = np.diff(self._free_at)
        steps = np.repeat(np.arange(self.run_order.size), counts)
        np.add.at(freed, steps, self._free_size)
        return (np.cumsum(self._alloc_size) - np.cumsum(freed)) * self.itemsize

    @property
    def unplanned_bytes(self) -> int:
        """What the arena would need without reuse: every computed tensor its own buffer."""
        nodes = self.graph.nodes
        arena = self.run_order[(self.loc[self.run_order] == LOC_ARENA) & ~self._is_view()]
        return int(nodes.shape[arena].prod(axis=1).sum()) * self.itemsize

    @property
    def run_table(self) -> Any:
        """The node table (ir.Nodes) runs read, with ``run_order``: the program's own copy when it
        has groups (a GROUP or EPILOGUE node in the last member's row), else the graph's."""
        return self._fused.nodes if self._fused.n_groups else self.graph.nodes.arrays()

    def groups(self) -> Dict[int, List[int]]:
        """{group node: its member nodes in order} (the group node is its last member)."""
        G, code = self._fused.nodes, self._fused.code
        return {int(n): members_of(code, int(G.ip[n, 0])) for n in self.run_order[is_group(G.op[self.run_order])]}

    def stats(self) -> Dict[str, Any]:
        return {
            "n_nodes": int(self.order.size),
            "n_groups": self._fused.n_groups,
            "n_fused": int(self.order.size - self.run_order.size) + self._fused.n_groups,
            "n_forward": int(self.order.size),
            "n_backward": 0, "n_recomputed": 0, "recompute_steps": 0, "max_recomputations": 0,
            "peak_bytes": self.peak_bytes,
            "persistent_bytes": self.persistent_bytes,
            "unplanned_bytes": self.unplanned_bytes,
            "n_in_place": self.n_in_place,
        }

    # ---- running ------------------------------------------------------------------------
    def _resolve_feed_key(self, key):
        g = self.graph
        if isinstance(key, Tensor):
            if key.graph is not g:
                raise GraphError(f"feed for {key.label!r}: the tensor belongs to a different graph")
            return key.id
        if isinstance(key, str):
            return g.tensor(key).id
        raise GraphError(f"feed key {key!r} must be a Tensor or a tensor name")

    def _bind(self, feeds, mem):
        g = self.graph
        if feeds is None:
            feeds = {}
        if not hasattr(feeds, "items"):
            raise GraphError(f"feeds must be a dict {{tensor: array}}, got {type(feeds).__name__}")
        given = {}
        for key, value in feeds.items():
            n = self._resolve_feed_key(key)
            if n not in self._input_set:
                what = "an input this program does not read" if g.nodes.flags[n] & F_INPUT else \
                    f"not an input (it is a {OPS[int(g.nodes.op[n])].name} node)"
                raise GraphError(f"feed for {g.label(n)!r}: {what}")
            given[n] = value
        for n in self.inputs:
            if n not in given:
                raise GraphError(f"missing feed for input {g.label(n)!r} of shape {g.shape_of(n)}")
            self._write_input(n, given[n], mem)

    def _write_input(self, n, value, mem):
        g = self.graph
        label = g.label(n)
        arr = as_numeric_array(value, f"feed for {label!r}")
        shape = g.shape_of(n)
        if arr.shape != shape:
            raise GraphError(f"feed for {label!r}: shape {arr.shape} does not match the input's shape {shape}")
        if g.nodes.flags[n] & F_INDEX:
            if arr.dtype.kind not in "iu":
                raise GraphError(f"feed for index input {label!r}: dtype must be an integer type, got {arr.dtype}")
        elif not np.can_cast(arr.dtype, g.dtype, "same_kind"):
            raise GraphError(f"feed for {label!r}: dtype {arr.dtype} cannot be cast to the graph's {g.dtype}")
        o = int(self.off[n])
        mem[o:o + arr.size] = arr.reshape(-1)

    @property
    def mem(self) -> np.ndarray:
        """The run buffer of the last finished run: the arena (peak_bytes), then the io slots."""
        if self._mem is None:
            self._mem = self._new_buffer()
        return self._mem

    def _new_buffer(self):
        return aligned_zeros(self.arena_elems + self.io_elems, self.graph.dtype)

    def _take_buffer(self):
        """A run buffer of its own for one call: runs from several threads never share one."""
        with self.lock:
            return self._spare.pop() if self._spare else self._new_buffer()

    def _give_buffer(self, mem):
        with self.lock:
            self._spare.append(mem)

    def _execute(self, feeds, debug=False, seed=None, mem=None):
        mem = self.mem if mem is None else mem
        self._bind(feeds, mem)
        g = self.graph
        salt = _salt(seed)
        split = table("split")
        runners, natives, blocks, chunks = self._kernels(mem, salt, split)
        enter_run()
        with self._blas_held(natives):
            if debug:
                status, node, detail = run_nodes_debug(self.run_table, self.run_order, self.loc, self.off, mem,
                                                       g.store, salt, runners, natives, split, blocks,
                                                       self._fused.code, chunks, self.arena_elems, self._free_at,
                                                       self._free_off, self._free_size)
            else:
                status, node, detail = run_nodes(self.run_table, self.run_order, self.loc, self.off, mem, g.store,
                                                 salt, runners, natives, split, blocks, self._fused.code, chunks)
        if status:
            raise self._run_error(int(status), int(node), int(detail), mem)
        if self._running is not None:        # once per successful run, never for a failed one
            self._running.apply(mem, g.store)

    def _blas_held(self, natives):
        """The BLAS held at one thread for a run, if this program calls it (threads.hold_blas)."""
        return held_blas(int(natives[1]) if self._calls_blas else 0)

    def _kernels(self, mem, salt, split):
        """(runner table, natives, block runner, chunk runner table) for this program: on its first run the
        interpreter compiles (or loads) first, then the block runner if a node is big
        enough to split, while worker processes compile the kernels build_forward asked
        for; then the kernels it uses are waited for.  Kept: asking again each run cost
        ~8 us."""
        tables = self._tables
        if tables is None:
            g = self.graph
            G = self.run_table
            natives = blas.natives(g.dtype)
            if g.dtype.name not in _interpreter_ready:
                run_nodes(G, self.run_order[:0], self.loc, self.off, mem, g.store, salt,
                          np.zeros(1, np.int64), natives, split, 0, self._fused.code, np.zeros(1, np.int64))
                _interpreter_ready.add(g.dtype.name)
            blocks = block_runner(g.dtype) if needs_blocks(G, self.run_order, split) else 0
            runners, chunks = compiler.tables(g.dtype, self._op_codes, self._chunk_codes)
            tables = self._tables = (runners, natives, blocks, chunks)
        return tables

    def node_seconds(self, feeds: Optional[Feeds] = None, repeats: int = 3, seed: Optional[int] = None) -> np.ndarray:
        """Seconds of each step of ``run_order`` run alone (after one whole run, in order,
        ``repeats`` times, the fastest kept, less the cost of an empty call; 0 at least)."""
        self._bind(feeds, self.mem)
        g = self.graph
        G = self.run_table
        salt = _salt(seed)
        split = table("split")
        runners, natives, blocks, chunks = self._kernels(self.mem, salt, split)
        args = (self.loc, self.off, self.mem, g.store, salt, runners, natives, split, blocks, self._fused.code,
                chunks)
        enter_run()
        clock = time.perf_counter
        empty = self.run_order[:0]
        with self._blas_held(natives):
            run_nodes(G, self.run_order, *args)          # every step's sources hold their values
            base = min(_timed(run_nodes, G, empty, args, clock) for _ in range(20))
            best = np.full(self.run_order.size, np.inf)
            for _ in range(max(1, repeats)):
                for t in range(self.run_order.size):
                    best[t] = min(best[t], _timed(run_nodes, G, self.run_order[t:t + 1], args, clock) - base)
        return np.maximum(best, 0.0)

    def profile(self, feeds: Optional[Feeds] = None, repeats: int = 3, seed: Optional[int] = None) -> List[Dict[str, Any]]:
        """Where a run's time goes, by op: every node is run alone (in order, ``repeats``
        times, the fastest kept, minus the cost of an empty call) and the times summed per
        op and phase (forward, backward, recomputed).  Rows, slowest first: op, phase,
        nodes, seconds, share of the total, elements and ns per element.  A diagnostic:
        its Python loop over nodes makes it slower than ``run``."""
        best = self.node_seconds(feeds, repeats, seed)
        g = self.graph
        nodes = g.nodes
        forward = set(getattr(self, "forward", self).order.tolist())
        members = self.groups()
        run = self.run_table
        groups: Dict[tuple, list] = {}
        for t, n in enumerate(self.run_order.tolist()):
            phase = ("recomputed" if nodes.flags[n] & F_RECOMPUTED else
                     "forward" if n in forward else "backward")
            label = OPS[int(run.op[n])].label           # a group's or an epilogue's with its members
            if n in members:
                label += "(" + ", ".join(OPS[int(nodes.op[m])].name for m in members[n]) + ")"
            row = groups.setdefault((label, phase), [0, 0.0, 0])
            row[0] += 1
            row[1] += float(best[t])
            row[2] += int(np.prod(g.shape_of(n), dtype=np.int64))
        total = sum(r[1] for r in groups.values()) or 1.0
        rows = [{"op": op, "phase": phase, "nodes": c, "seconds": sec, "share": sec / total, "elements": el,
                 "ns_per_element": 1e9 * sec / max(el, 1)} for (op, phase), (c, sec, el) in groups.items()]
        return sorted(rows, key=lambda r: -r["seconds"])

    def _run_error(self, status, node, detail, mem):
        g = self.graph
        label = g.label(node)
        if status == ERR_INDEX:
            idx = int(g.nodes.src[node, 1])
            value = self.value_of(idx, mem).reshape(-1)[detail]
            op = OPS[int(g.nodes.op[node])].name
            src = int(g.nodes.src[node, 0])
            # the valid range: the table's rows (embedding), the output's (scatter_add), the classes
            bound = int(g.nodes.shape[node, 2] if op == "scatter_add" else
                        g.nodes.shape[src, 3] if op.startswith("cross_entropy") else g.nodes.shape[src, 2])
            params = OPS[int(g.nodes.op[node])].params(g.nodes.ip[node], g.nodes.fp[node])
            ignore = f" nor ignore_index {params['ignore_index']}" if params.get("has_ignore") else ""
            return GraphError(f"{op} {label!r}: index {value:g} at position {detail} of {g.label(idx)!r} "
                              f"is not an integer in [0, {bound}){ignore}")
        if status == ERR_NOT_COMPILED:
            return GraphError(f"node {label!r}: opcode {detail} has no compiled runner")
        return GraphError(f"run failed at node {label!r} (status {status})")

    def value_of(self, n: int, mem: Optional[np.ndarray] = None) -> np.ndarray:
        """The data of node n after a run (a copy, shaped): of the last finished run, or of
        run buffer ``mem``."""
        g = self.graph
        root = int(self._fused.root[n]) if 0 <= n < self._fused.root.size else -1
        if root not in (-1, n):
            raise GraphError(f"{g.label(n)!r} was fused into the group of {g.label(root)!r} and has no buffer: "
                             "build the program with fuse=False to read it")
        size = int(np.prod(g.shape_of(n), dtype=np.int64))
        o = int(self.off[n])
        k = int(self.loc[n])
        buf = g.store if k == LOC_STORE else (self.mem if mem is None else mem)
        return buf[o:o + size].reshape(g.shape_of(n)).copy()

    def run(self, feeds: Optional[Feeds] = None, debug: bool = False, seed: Optional[int] = None) -> Any:
        """Run with ``feeds`` ({input tensor or name: array}); returns the outputs as numpy arrays.

        ``seed`` (an int) is added to every dropout's seed for this run: pass the step
        number while training for fresh masks each step.  ``debug=True`` fills the
        arena with NaN first and every block with NaN as soon as the plan frees it:
        results that match a normal run prove no node read memory after it was freed."""
        mem = self._take_buffer()
        try:
            self._execute(feeds, debug, seed, mem)
            vals = [self.value_of(t.id, mem) for t in self.outputs]
        finally:
            self._give_buffer(mem)
        self._mem = mem
        return vals[0] if self._single else vals

    # ---- looking at it ---------------------------------------------------------------------
    def nodes(self) -> List[Dict[str, Any]]:
        """One dict per node in execution order: id, name, describe (what it is; for a
        gradient node, the forward node and rule it comes from), op, shape, bytes,
        sources, flags, loc and offset (planned, in bytes; loc "group" and the group
        node's id for a member that runs inside its group, and flag "group" -- "epilogue" for
        an epilogue -- on the group's last member, which runs it: fuse.py)."""
        rows = self.graph.node_rows(self.order)
        root = self._fused.root
        for row in rows:
            n = row["id"]
            if 0 <= root[n] != n:               # runs inside its group: no buffer of its own
                row.update(loc="group", offset=int(root[n]))
            else:
                row.update(loc=("arena", "store", "io")[int(self.loc[n])], offset=int(self.off[n]) * self.itemsize)
                if root[n] == n:                # the group's node: its flags say so ("group" or "epilogue")
                    row["flags"] = row["flags"] + [OPS[int(self.run_table.op[n])].label]
        return rows

    # ---- pictures (Jupyter shows _repr_html_: the picture and a folded node table) ----
    def to_dot(self, max_nodes: int = 300, fold_forward: bool = False, legend: bool = True,
               rankdir: str = "TB") -> str:
        """Graphviz DOT text of this program (see README, "Looking at graphs").

        ``max_nodes`` caps the nodes drawn (the last ones); ``fold_forward=True``
        draws a backward program's forward part as one box."""
        fold = None
        if fold_forward and hasattr(self, "forward"):
            fold = set(self.forward.order.tolist())
        param_of = {n: p for p, n in zip(getattr(self, "params", ()), getattr(self, "grad_nodes", ())) if n >= 0}
        return to_dot(self.graph, self.order, max_nodes=max_nodes, fold_forward=fold, legend=legend,
                      rankdir=rankdir, title=self._title(), param_of=param_of, groups=self.groups())

    def _title(self):
        outs = ", ".join(t.label for t in self.outputs)
        return f"{type(self).__name__} -> {outs}"

    def _summary(self):
        st = self.stats()
        return (f"{st['n_nodes']} nodes, arena peak {self.peak_bytes:,} B, persistent {self.persistent_bytes:,} B, "
                f"{st['n_in_place']} in place" + (f", {st['n_recomputed']} recomputed" if st["n_recomputed"] else ""))

    def _repr_svg_(self):
        if self.order.size > 300:
            return None          # too big for a default picture: use to_dot(max_nodes=...) or fold_forward
        return render_svg(self.to_dot())

    def _repr_html_(self):
        big = self.order.size > 300
        dot = self.to_dot(max_nodes=150, fold_forward=big)
        return rich_html(self._title(), dot, self.nodes(), self._summary())

    def plot_memory(self, *others: "Program", labels: Optional[Sequence[str]] = None, ax: Any = None) -> Any:
        """Live arena bytes along the execution order, beside ``others`` (matplotlib)."""
        return plot_memory([self, *others], labels=labels, ax=ax)

    def format_table(self, limit: int = 50) -> str:
        rows = self.nodes()
        head = f"{'id':>5}  {'name':<10} {'op':<13} {'shape':<16} {'bytes':>9}  {'sources':<14} {'where':<14} flags"
        lines = [head, "-" * len(head)]
        for r in rows[:limit]:
            where = f"{r['loc']}@{r['offset']}"
            lines.append(f"{r['id']:>5}  {r['name'][:10]:<10} {r['op']:<13} {str(r['shape']):<16} {r['bytes']:>9}  "
                         f"{','.join(map(str, r['sources'])):<14} {where:<14} {','.join(r['flags'])}")
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more nodes")
        return "\n".join(lines)


_interpreter_ready: set = set()     # dtypes whose run_nodes this process has compiled or loaded


class ForwardGraph(Program):
    """The nodes that ``outputs`` need, in execution order, with a memory plan."""

    def __repr__(self):
        outs = ", ".join(repr(t.label) for t in self.outputs)
        return f"<ForwardGraph {self.order.size} nodes -> {outs}, peak {self.peak_bytes} B>"


def build_forward(outputs: Union[Tensor, Sequence[Tensor]], in_place: bool = True,
                  fuse: Union[bool, str] = "auto") -> "ForwardGraph":
    """Topologically order everything ``outputs`` (a Tensor or list) depend on, fuse
    connected elementwise nodes into groups and plan its memory (``in_place=False``: no
    elementwise op overwrites a source).  ``fuse``: ``"auto"`` groups where it pays (every
    group when there are many fusable nodes, groups of 3+ members when one is big:
    fuse.wants_fusion), ``True`` every group, ``False`` none; the bits are the same."""
    outs, single = _output_list(outputs, "build_forward")
    g = outs[0].graph
    # a first run's kernels (and, with params, gradient rules) start compiling in other processes now
    compiler.prefetch(g.dtype, g.nodes.op[:g.nodes.n])
    order = execution_order(g, [t.id for t in outs], "build_forward")
    for t in outs:
        g.nodes.flags[t.id] |= F_OUTPUT
    return ForwardGraph(g, order, outs, single, in_place=in_place, fuse=fuse)


class BackwardGraph(Program):
    """Forward plus backward nodes of a scalar loss, with a memory plan.

    ``run(feeds)`` returns the loss and computes every param's gradient, read with
    ``W.grad`` or ``bwd.grad(W)``.
    """

    def __init__(self, fwd: ForwardGraph, params: Any, grad_nodes: Any, in_place: bool = True,
                 fuse: Union[bool, str] = "auto") -> None:
        g = fwd.graph
        self.forward = fwd
        self.loss = fwd.outputs[0]
        self.params = np.asarray(params, np.int64).tolist()
        self.grad_nodes = np.asarray(grad_nodes, np.int64).tolist()     # -1: the gradient is zero
        self._zero_grad_extra: Dict[int, np.ndarray] = {}
        self._index = None                      # param id -> position, built when first asked
        self.plan: Dict[str, Any] = {"plan": "none"}     # what build_backward's strategy chose (stats)
        gn = np.asarray(self.grad_nodes, np.int64)
        live = np.sort(gn[gn >= 0])
        nodes = g.nodes
        is_forward = np.zeros(nodes.n, np.uint8)
        is_forward[fwd.order] = 1
        orders = backward_orders(nodes.arrays(), nodes.n, fwd.order, live, is_forward)
        if orders is None:
            raise GraphError("build_backward: the graph refers to a node outside it")
        super().__init__(g, orders, [self.loss], True, io_nodes=live, in_place=in_place, fuse=fuse)

    def __repr__(self):
        return (f"<BackwardGraph {self.order.size} nodes ({self.forward.order.size} forward), "
                f"loss {self.loss.label!r}, {len(self.params)} params, peak {self.peak_bytes} B>")

    def stats(self) -> Dict[str, Any]:
        st = super().stats()
        nodes = self.graph.nodes
        recomputed = self.order[(nodes.flags[self.order] & F_RECOMPUTED) != 0]
        n_fwd = int(self.forward.order.size)
        st.update(n_forward=n_fwd, n_backward=int(self.order.size) - n_fwd - int(recomputed.size),
                  n_recomputed=int(recomputed.size),
                  recompute_flops=total_flops(nodes.arrays(), recomputed),
                  # a copy's rule field numbers the recomputation of one forward step it belongs to
                  recompute_steps=int(np.unique(nodes.rule[recomputed]).size),
                  max_recomputations=int(np.bincount(nodes.origin[recomputed]).max()) if recomputed.size else 0)
        st.update(self.plan)
        return st

    def _param_index(self, param, what):
        if not isinstance(param, Tensor) or param.graph is not self.graph:
            raise GraphError(f"{what}: expects a param Tensor of this graph, got {param!r}")
        if self._index is None:
            self._index = {p: i for i, p in enumerate(self.params)}
        i = self._index.get(param.id)
        if i is None:
            raise GraphError(f"{what}: {param.label!r} is not a param this backward graph "
                             "differentiates (it is not a param, or the loss does not depend on it)")
        return i

    def grad(self, param: Tensor) -> np.ndarray:
        """The gradient of ``param`` from this program's last run (a numpy array)."""
        i = self._param_index(param, "grad")
        return self._grad_value(i)

    def _grad_value(self, i):
        p, n = self.params[i], self.grad_nodes[i]
        shape = self.graph.shape_of(p)
        with self.lock:
            if n < 0:
                extra = self._zero_grad_extra.get(p)
                return np.zeros(shape, self.graph.dtype) if extra is None else extra.copy()
            return self.value_of(n).reshape(shape)

    def grad_tensor(self, param: Tensor) -> Tensor:
        """The gradient of ``param`` as a Tensor, to build on (gradient penalties,
        Hessian-vector products: differentiate a function of it again)."""
        i = self._param_index(param, "grad_tensor")
        n = self.grad_nodes[i]
        if n < 0:
            return self.graph.const(np.zeros(self.graph.shape_of(self.params[i])))
        return Tensor(self.graph, n)

    def run(self, feeds: Optional[Feeds] = None, accumulate: bool = False, debug: bool = False,  # type: ignore[override]
            seed: Optional[int] = None) -> np.ndarray:
        """Forward and backward.  Returns the loss; gradients are fresh, or added to
        the current ``W.grad`` values with ``accumulate=True``.  ``seed``, ``debug``:
        see Program.run.

        The gradients are this program's state, so runs of one backward program are
        serialized by ``self.lock``; to read the gradients of *your* run while other
        threads run the same program, hold the lock around both:
        ``with bwd.lock: bwd.run(feeds); g = W.grad``."""
        with self.lock:
            return self._run_locked(feeds, accumulate, debug, seed)

    def _run_locked(self, feeds, accumulate, debug, seed):
        g = self.graph
        if not accumulate:
            self._execute(feeds, debug, seed)
            self._zero_grad_extra.clear()
            if g.grads_owner is not self:       # W.grad now reads this program (once per switch)
                g.grads.update({p: (self, i) for i, p in enumerate(self.params)})
                g.grads_owner = self
                g.grads_version += 1
            return self.value_of(self.loss.id)
        old = {}
        for p in self.params:
            source = g.grads.get(p)
            if source is not None:
                old[p] = source[0]._grad_value(source[1])
        self._execute(feeds, debug, seed)
        for i, (p, n) in enumerate(zip(self.params, self.grad_nodes)):
            if p in old:
                if n >= 0:
                    o = int(self.off[n])
                    self.mem[o:o + old[p].size] += old[p].reshape(-1)
                else:
                    self._zero_grad_extra[p] = old[p]
            elif n < 0:
                self._zero_grad_extra.pop(p, None)
            g.grads[p] = (self, i)
        g.grads_owner = self
        g.grads_version += 1
        return self.value_of(self.loss.id)
