"""Register-tiled micro-kernels written in LLVM IR, for the convolutions.

LLVM vectorizes a plain loop one vector at a time and keeps a running sum in
memory; a convolution (a product contracting over channels and kernel taps) runs
at its full speed only when a tile of outputs -- here 12 or 16 vectors -- stays in
registers while the whole contraction streams past it.  Numba cannot say "these 16
vectors live in registers", so the two kernels below are emitted as IR by
``numba.extending.intrinsic``: SSA vector values carried by loop phis, one
``llvm.fma`` per output vector and step, loads of whole vectors and broadcasts of
scalars.  They are inlined into the runners of ``ops/conv.py``, which choose the
tiles and do all the bookkeeping in ordinary Numba code.

* ``fma_tile(MR, R, V, vbytes)``: a tile of MR output rows (channels) x R rows x V
  vectors, ``out = sum_{i, j, c} w(m, i, j, c) * x(i, j, c, r, v)`` over a nest of
  three counted loops (kernel row i, kernel column j, channel c) whose addresses are
  linear in the indices.  The caller places the tile inside the output (clamping
  its start so it never leaves it: a tile overlapping its neighbour recomputes the
  same values, in the same order).
* ``dot_tile(MR, NK, vbytes)``: MR x NK sums of products over a nest of (image, row,
  vector) -- a weight gradient's contraction over every output position -- added
  to the output; the last vector of a row that is not a whole vector is read ending
  at the row's end, its lanes already counted masked to zero.  The lanes are added
  in a fixed order at the end.
* ``transpose_tile(vbytes)``: an L x L block copied transposed (L lanes), by L vector loads,
  log2(L) rounds of shuffles and L vector stores -- a transpose's strided copy, ~4x fewer
  instructions than one element at a time.
* ``channel_tile(MV, NK, vbytes)``: the same sums with the vectors across MV vectors of
  output channels instead of positions, for a gradient laid out channels last: each step
  (one output position) adds a vector of g's channels times a broadcast input element to
  each of NK taps' accumulators -- no horizontal sums, and planes of any width fill the
  lanes.  Each lane is a plain running sum over the positions in order.

A tile's vectors are ``vbytes`` bytes of the graph's dtype (``lanes_of``): VECTOR_BYTES,
or WIDE_BYTES on a host with AVX-512, or single elements (``vbytes=0``) for rows narrower
than a vector.  Every address is computed from
the arguments; the callers check that tiles stay inside their arrays.  Results do
not depend on where a tile starts or which thread runs it: each output element is
a fixed sequence of fused multiply-adds.
"""
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from . import _target

VECTOR_BYTES = 32            # 256-bit vectors: AVX2, and as fast as 512-bit ones on Zen 4 (measured)
WIDE_BYTES = 64              # 512-bit vectors: 1.85x the convolutions' speed on Zen 5 (measured)


def _host_has_avx512() -> bool:
    """Do the tiles get 512-bit vectors here?  Not when the user picked a CPU for Numba
    (NUMBA_CPU_NAME: a portable cache; without AVX-512 a 512-bit tile is split in two
    and spills).  Numba's cache records the CPU's features: code compiled with wide
    tiles never loads on a machine without them.  (Features jitgraph set itself, _target,
    are the host's own.)"""
    if getattr(config, "CPU_NAME", None) or (getattr(config, "CPU_FEATURES", None) and not _target.SET_BY_JITGRAPH):
        return False
    return bool(binding.get_host_cpu_features().get("avx512f", False))


WIDE = _host_has_avx512()
I64 = ir.IntType(64)
I32 = ir.IntType(32)


def _loop(builder, count, carried, body):
    """A counted loop ``for i in range(count)`` carrying SSA values: ``body(i, values)``
    returns the next values; returns the values after the loop (``carried`` if it
    runs zero times)."""
    pre = builder.block
    fn = builder.function
    head = fn.append_basic_block("loop.head")
    step = fn.append_basic_block("loop.body")
    done = fn.append_basic_block("loop.done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(I64)
    i.add_incoming(I64(0), pre)
    phis = []
    for value in carried:
        p = builder.phi(value.type)
        p.add_incoming(value, pre)
        phis.append(p)
    builder.cbranch(builder.icmp_signed("<", i, count), step, done)
    builder.position_at_end(step)
    new = body(i, phis)
    latch = builder.block
    i.add_incoming(builder.add(i, I64(1)), latch)
    for p, value in zip(phis, new):
        p.add_incoming(value, latch)
    builder.branch(head)
    builder.position_at_end(done)
    return phis


def _at(builder, base, offset, vt):
    """A pointer to a vector of type vt at element ``offset`` of ``base``."""
    return builder.bitcast(builder.gep(base, [offset]), vt.as_pointer())


def _splat(builder, scalar, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), scalar, I32(0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, vt.count),
                                                                                  [0] * vt.count))


def _fma(builder, vt):
    suffix = "f32" if vt.element == ir.FloatType() else "f64"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                          f"llvm.fma.v{vt.count}{suffix}")


def lanes_of(itemsize: int, vbytes: int) -> int:
    """Elements in one vector of ``vbytes`` bytes (1: scalars, vbytes = 0)."""
    return vbytes // itemsize if vbytes else 1


def _types(context, dtype, vbytes):
    ft = context.get_value_type(dtype)
    size = dtype.bitwidth // 8
    lanes = lanes_of(size, vbytes)
    vt = ir.VectorType(ft, lanes)
    return lanes, vt, ir.Constant(vt, [ir.Constant(ft, 0.0)] * lanes), size


def _rows_load(builder, ptrs, vt, size):
    """One vector from equal parts at ``ptrs`` (element pointers), concatenated in order."""
    part = ir.VectorType(vt.element, vt.count // len(ptrs))
    vals = [builder.load(builder.bitcast(p, part.as_pointer()), align=size) for p in ptrs]
    while len(vals) > 1:
        n = vals[0].type.count
        vals = [builder.shuffle_vector(vals[k], vals[k + 1], ir.Constant(ir.VectorType(I32, 2 * n),
                                                                          list(range(2 * n))))
                for k in range(0, len(vals), 2)]
    return vals[0]


def _rows_store(builder, value, ptrs, size):
    """``value``'s equal parts stored at ``ptrs`` in order."""
    n = value.type.count // len(ptrs)
    part = ir.VectorType(value.type.element, n)
    for k, p in enumerate(ptrs):
        piece = builder.shuffle_vector(value, ir.Constant(value.type, ir.Undefined),
                                       ir.Constant(ir.VectorType(I32, n), list(range(k * n, (k + 1) * n))))
        builder.store(piece, builder.bitcast(p, part.as_pointer()), align=size)


def fma_tile(MR: int, R: int, V: int, vbytes: int, rows: int = 1):
    """The intrinsic ``tile(x, w, o, n_i, n_j, n_c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)``:
    for m < MR, r < R * rows, v < V, with ``step = lanes / rows`` columns per vector and row,
    ``o[m*om + r*orow + v*step : +step] (+)= sum over i < n_i, j < n_j, c < n_c of
    w[m*wm + i*wi + j*wj + c*wc] * x[i*xi + j*xj + c*xc + r*xr + v*step : +step]``
    (x, w, o typed pointers of one float dtype; the rest int64), added to o's values when
    ``acc`` is not 0 (the sums continue from them).  ``rows`` = 2: each vector holds two
    rows' columns (loaded in halves) -- 512-bit vectors for rows of 256 bits."""
    @intrinsic
    def tile(typingctx, x, w, o, n_i, n_j, n_c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc):
        sig = types.void(x, w, o, n_i, n_j, n_c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc)
        dtype = x.dtype

        def codegen(context, builder, signature, args):
            x, w, o, n_i, n_j, n_c, xi, xj, xc, wi, wj, wc, wm, xr, om, orow, acc = args
            lanes, vt, zero, size = _types(context, dtype, vbytes)
            fma = _fma(builder, vt)
            step = lanes // rows
            xrow = [builder.gep(x, [builder.mul(I64(r), xr)]) for r in range(R * rows)]
            wrow = [builder.gep(w, [builder.mul(I64(m), wm)]) for m in range(MR)]
            # each output vector's parts: element pointers, one per row it holds
            at = [[builder.gep(o, [builder.add(builder.add(builder.mul(I64(m), om),
                                                           builder.mul(I64(r * rows + k), orow)), I64(v * step))])
                   for k in range(rows)]
                  for m in range(MR) for r in range(R) for v in range(V)]
            start = builder.icmp_signed("!=", acc, I64(0))
            # the output tile is in bounds either way: loaded always, kept only when continuing
            init = [builder.select(start, _rows_load(builder, p, vt, size), zero) for p in at]

            def over_i(i, accs):
                xb = builder.mul(i, xi)
                wb = builder.mul(i, wi)

                def over_j(j, accs):
                    xjb = builder.add(xb, builder.mul(j, xj))
                    wjb = builder.add(wb, builder.mul(j, wj))

                    def over_c(c, accs):
                        xo = builder.add(xjb, builder.mul(c, xc))
                        wo = builder.add(wjb, builder.mul(c, wc))
                        xs = [[_rows_load(builder, [builder.gep(xrow[r * rows + k], [builder.add(xo, I64(v * step))])
                                                    for k in range(rows)], vt, size)
                               for v in range(V)] for r in range(R)]
                        new = []
                        for m in range(MR):
                            s = _splat(builder, builder.load(builder.gep(wrow[m], [wo])), vt)
                            for r in range(R):
                                for v in range(V):
                                    new.append(builder.call(fma, [s, xs[r][v], accs[(m * R + r) * V + v]]))
                        return new
                    return _loop(builder, n_c, accs, over_c)
                return _loop(builder, n_j, accs, over_j)
            accs = _loop(builder, n_i, init, over_i)
            for p, value in zip(at, accs):
                _rows_store(builder, value, p, size)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def _hsums(builder, vecs, lanes, zero):
    """The lanes of each vector of ``vecs`` added pairwise in a fixed tree ((a0 + a1) + (a2 +
    a3) ...), all vectors at once: each level adds the even and odd lanes of two vectors into
    one, so 16 vectors of 16 lanes take 15 shuffle pairs and adds, not 16 x 15 scalar ones
    (lanes a power of two).  Returns the sums as scalars, in the order of ``vecs``."""
    count = vecs[0].type.count
    level = [(v, [(q, 0)]) for q, v in enumerate(vecs)]   # (vector, what its segments sum: (vector index, 0))
    seg = lanes
    evens = ir.Constant(ir.VectorType(I32, count), list(range(0, 2 * count, 2)))
    odds = ir.Constant(ir.VectorType(I32, count), list(range(1, 2 * count, 2)))
    while seg > 1:
        if len(level) % 2:
            level.append((zero, [(-1, 0)] * len(level[0][1])))
        nxt = []
        for k in range(0, len(level), 2):
            (a, sa), (b, sb) = level[k], level[k + 1]
            nxt.append((builder.fadd(builder.shuffle_vector(a, b, evens), builder.shuffle_vector(a, b, odds)), sa + sb))
        level, seg = nxt, seg // 2
    sums = {}
    for v, segs in level:
        for lane, (q, _) in enumerate(segs):
            if q >= 0:
                sums[q] = builder.extract_element(v, I32(lane))
    return [sums[q] for q in range(len(vecs))]


def dot_tile(MR: int, NK: int, vbytes: int, paired: bool = False):
    """The intrinsic ``tile(g, x, o, xoff, ooff, mv, kv, gm, om, n_img, g_img, x_img, n_rows, g_row,
    x_row, width)``: for m < mv, k < kv (at most MR, NK),
    ``o[m*om + ooff[k]] += sum over images, rows and the ``width`` columns of a row of
    g[img*g_img + m*gm + row*g_row + col] * x[img*x_img + xoff[k] + row*x_row + col]``,
    where ``xoff`` and ``ooff`` are tuples of NK int64 offsets; width >= lanes.  Rows
    m >= mv are read from row mv - 1 and not stored, nor are taps k >= kv (the caller
    gives them the offsets of a valid tap).  ``paired``: rows of half a vector
    (width = g_row = lanes / 2, n_rows even), each vector two rows -- g's two rows one
    load, x's two halves -- so an 8-wide float32 plane fills 512-bit lanes."""
    @intrinsic
    def tile(typingctx, g, x, o, xoff, ooff, mv, kv, gm, om, n_img, g_img, x_img, n_rows, g_row, x_row, width):
        sig = types.void(g, x, o, xoff, ooff, mv, kv, gm, om, n_img, g_img, x_img, n_rows, g_row, x_row, width)
        dtype = g.dtype

        def codegen(context, builder, signature, args):
            g, x, o, xoff, ooff, mv, kv, gm, om, n_img, g_img, x_img, n_rows, g_row, x_row, width = args
            lanes, vt, zero, size = _types(context, dtype, vbytes)
            fma = _fma(builder, vt)

            last = builder.sub(mv, I64(1))
            gbase = [builder.gep(g, [builder.mul(builder.select(builder.icmp_signed("<", I64(m), mv), I64(m), last),
                                                 gm)]) for m in range(MR)]
            xbase = [builder.gep(x, [builder.extract_value(xoff, k)]) for k in range(NK)]
            full = builder.sdiv(width, I64(lanes))
            rest = builder.srem(width, I64(lanes))
            tail = builder.zext(builder.icmp_signed(">", rest, I64(0)), I64)
            # the tail vector ends at the row's end: its first (lanes - rest) lanes were counted already
            tail_at = builder.sub(width, I64(lanes))
            lane_ids = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
            keep = builder.icmp_signed(">=", lane_ids, _splat(builder, builder.sub(I64(lanes), rest),
                                                             ir.VectorType(I64, lanes)))

            def step(accs, go, xo, masked):
                gs = [builder.load(_at(builder, gbase[m], go, vt), align=size) for m in range(MR)]
                xs = [builder.load(_at(builder, xbase[k], xo, vt), align=size) for k in range(NK)]
                if masked:
                    gs = [builder.select(keep, v, zero) for v in gs]
                    xs = [builder.select(keep, v, zero) for v in xs]
                return [builder.call(fma, [gs[m], xs[k], accs[m * NK + k]]) for m in range(MR) for k in range(NK)]

            def paired_step(accs, go, xo):
                gs = [builder.load(_at(builder, gbase[m], go, vt), align=size) for m in range(MR)]
                xs = [_rows_load(builder, [builder.gep(xbase[k], [xo]),
                                           builder.gep(xbase[k], [builder.add(xo, x_row)])], vt, size)
                      for k in range(NK)]
                return [builder.call(fma, [gs[m], xs[k], accs[m * NK + k]]) for m in range(MR) for k in range(NK)]

            def over_img(n, accs):
                gi = builder.mul(n, g_img)
                xi = builder.mul(n, x_img)

                def over_row(r, accs):
                    gr = builder.add(gi, builder.mul(r, g_row))
                    xr = builder.add(xi, builder.mul(r, x_row))

                    def over_vec(v, accs):
                        col = builder.mul(v, I64(lanes))
                        return step(accs, builder.add(gr, col), builder.add(xr, col), False)
                    accs = _loop(builder, full, accs, over_vec)
                    return _loop(builder, tail, accs,
                                 lambda _, accs: step(accs, builder.add(gr, tail_at), builder.add(xr, tail_at), True))
                return _loop(builder, n_rows, accs, over_row)

            def flat(rows, g_step, x_step, body):
                """body(accs, g offset, x offset) over every image's rows in one loop (an image's
                few rows as an inner loop: a mispredicted exit every 4-16 steps), the offsets
                stepped to the next image by a select."""
                g_next = builder.sub(g_img, builder.mul(builder.sub(rows, I64(1)), g_step))
                x_next = builder.sub(x_img, builder.mul(builder.sub(rows, I64(1)), x_step))

                def over(_, carried):
                    r, go, xo = carried[:3]
                    accs = body(carried[3:], go, xo)
                    r = builder.add(r, I64(1))
                    wrap = builder.icmp_signed("==", r, rows)
                    return [builder.select(wrap, I64(0), r), builder.add(go, builder.select(wrap, g_next, g_step)),
                            builder.add(xo, builder.select(wrap, x_next, x_step))] + accs
                return _loop(builder, builder.mul(n_img, rows), [I64(0), I64(0), I64(0)] + [zero] * (MR * NK),
                             over)[3:]

            def row_of(vectors):
                def body(accs, go, xo):
                    for v in range(vectors):
                        accs = step(accs, builder.add(go, I64(v * lanes)), builder.add(xo, I64(v * lanes)), False)
                    return accs
                return body
            fn = builder.function
            if paired:
                accs = flat(builder.sdiv(n_rows, I64(2)), builder.mul(g_row, I64(2)), builder.mul(x_row, I64(2)),
                            paired_step)
            else:
                one, two, wide, join = (fn.append_basic_block(name) for name in ("dot.one", "dot.two", "dot.wide",
                                                                                  "dot.join"))
                second = fn.append_basic_block("dot.test")
                builder.cbranch(builder.icmp_signed("==", width, I64(lanes)), one, second)
                builder.position_at_end(second)
                builder.cbranch(builder.icmp_signed("==", width, I64(2 * lanes)), two, wide)
                ends = []
                for block, vectors in ((one, 1), (two, 2), (wide, 0)):
                    builder.position_at_end(block)
                    got = flat(n_rows, g_row, x_row, row_of(vectors)) if vectors else \
                        _loop(builder, n_img, [zero] * (MR * NK), lambda n, accs: over_img(n, accs))
                    ends.append((builder.block, got))
                    builder.branch(join)
                builder.position_at_end(join)
                accs = []
                for q in range(MR * NK):
                    phi = builder.phi(vt)
                    for block, got in ends:
                        phi.add_incoming(got[q], block)
                    accs.append(phi)
            sums = _hsums(builder, accs, lanes, zero)
            for m in range(MR):
                for k in range(NK):
                    store = fn.append_basic_block("dot.store")
                    after = fn.append_basic_block("dot.after")
                    ok = builder.and_(builder.icmp_signed("<", I64(m), mv), builder.icmp_signed("<", I64(k), kv))
                    builder.cbranch(ok, store, after)
                    builder.position_at_end(store)
                    ptr = builder.gep(o, [builder.add(builder.mul(I64(m), om), builder.extract_value(ooff, k))])
                    builder.store(builder.fadd(builder.load(ptr), sums[m * NK + k]), ptr)
                    builder.branch(after)
                    builder.position_at_end(after)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def channel_tile(MV: int, NK: int, vbytes: int):
    """The intrinsic ``tile(g, x, acc, xoff, kv, steps, g_step, q0, r0, width, rows, x_row, x_img)``:
    for k < NK, v < MV, ``acc[k*MV*lanes + v*lanes : +lanes] += sum over the next ``steps``
    positions of g[p*g_step + v*lanes : +lanes] * x[xoff[k] + at(p)]``, positions taken in
    order from column q0 of row r0 of the first image (rows of ``width`` columns, ``rows``
    rows an image), at(p) their element of x (rows ``x_row``, images ``x_img`` apart); acc holds
    the sums so far (loaded, continued, stored: one running sum however a caller cuts the
    positions).  Taps k >= kv are computed from a valid tap's offset and not stored."""
    @intrinsic
    def tile(typingctx, g, x, acc, xoff, kv, steps, g_step, q0, r0, width, rows, x_row, x_img):
        sig = types.void(g, x, acc, xoff, kv, steps, g_step, q0, r0, width, rows, x_row, x_img)
        dtype = g.dtype

        def codegen(context, builder, signature, args):
            g, x, acc, xoff, kv, steps, g_step, q0, r0, width, rows, x_row, x_img = args
            lanes, vt, zero, size = _types(context, dtype, vbytes)
            fma = _fma(builder, vt)
            xbase = [builder.gep(x, [builder.extract_value(xoff, k)]) for k in range(NK)]
            at = [builder.gep(acc, [I64((k * MV + v) * lanes)]) for k in range(NK) for v in range(MV)]
            init = [builder.load(builder.bitcast(p, vt.as_pointer()), align=size) for p in at]
            # positions run a row at a time: within the part of a row the steps cover, x's offset
            # steps by 1 and g's by g_step, with no bookkeeping per position (counters and
            # selects per position ran AVX2's 12 FMAs at ~9 cycles a position, Zen 3)
            end = builder.add(q0, steps)
            segments = builder.sdiv(builder.add(end, builder.sub(width, I64(1))), width)

            def row(s, accs):
                start = builder.select(builder.icmp_signed("==", s, I64(0)), q0, I64(0))
                here = builder.sub(end, builder.mul(s, width))
                stop = builder.select(builder.icmp_signed("<", here, width), here, width)
                line = builder.add(r0, s)
                xo = builder.add(builder.add(builder.mul(builder.sdiv(line, rows), x_img),
                                             builder.mul(builder.srem(line, rows), x_row)), start)
                go = builder.mul(builder.sub(builder.add(builder.mul(s, width), start), q0), g_step)

                def over(p, accs):
                    gp = builder.add(go, builder.mul(p, g_step))
                    gs = [builder.load(_at(builder, g, builder.add(gp, I64(v * lanes)), vt), align=size)
                          for v in range(MV)]
                    xi = builder.add(xo, p)
                    new = []
                    for k in range(NK):
                        b = _splat(builder, builder.load(builder.gep(xbase[k], [xi])), vt)
                        new += [builder.call(fma, [gs[v], b, accs[k * MV + v]]) for v in range(MV)]
                    return new
                return _loop(builder, builder.sub(stop, start), accs, over)
            accs = _loop(builder, segments, init, row)
            fn = builder.function
            for k in range(NK):
                store = fn.append_basic_block("chan.store")
                after = fn.append_basic_block("chan.after")
                builder.cbranch(builder.icmp_signed("<", I64(k), kv), store, after)
                builder.position_at_end(store)
                for v in range(MV):
                    builder.store(accs[k * MV + v], builder.bitcast(at[k * MV + v], vt.as_pointer()), align=size)
                builder.branch(after)
                builder.position_at_end(after)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def transpose_tile(vbytes: int):
    """The intrinsic ``tile(src, src_row, dst, dst_row)``: dst[a * dst_row + b] = src[b * src_row + a]
    for a, b < L, the lanes of ``vbytes`` of the pointers' dtype.  Rows are swapped in blocks:
    the off-diagonal halves, then the quarters of each half, ... (one shuffle a row a round)."""
    @intrinsic
    def tile(typingctx, src, src_row, dst, dst_row):
        sig = types.void(src, src_row, dst, dst_row)
        dtype = src.dtype

        def codegen(context, builder, signature, args):
            src, src_row, dst, dst_row = args
            lanes, vt, _, size = _types(context, dtype, vbytes)
            rows = [builder.load(_at(builder, src, builder.mul(I64(b), src_row), vt), align=size)
                    for b in range(lanes)]
            s = lanes // 2
            while s:
                low = ir.Constant(ir.VectorType(I32, lanes), [c + lanes - s if c & s else c for c in range(lanes)])
                high = ir.Constant(ir.VectorType(I32, lanes), [c + lanes if c & s else c + s for c in range(lanes)])
                new = list(rows)
                for i in range(lanes):
                    if not i & s:
                        new[i] = builder.shuffle_vector(rows[i], rows[i + s], low)
                        new[i + s] = builder.shuffle_vector(rows[i], rows[i + s], high)
                rows, s = new, s // 2
            for a in range(lanes):
                builder.store(rows[a], _at(builder, dst, builder.mul(I64(a), dst_row), vt), align=size)
            return context.get_dummy_value()
        return sig, codegen
    return tile


# ---- Winograd F(2x2, 3x3): the input and output transforms (ops/winograd.py) ---------------------
# d: a 4 x 4 input tile; B^T d B and A^T m A with B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0],
# [0, 1, 0, -1]] and A^T = [[1, 1, 1, 0], [0, 1, -1, -1]], down the rows first, then across -- each
# a fixed sequence of additions (no multiplications, so nothing to contract into an FMA).
def _bt(builder, a, b, c, d):
    return [builder.fsub(a, c), builder.fadd(b, c), builder.fsub(c, b), builder.fsub(b, d)]


def _at2(builder, a, b, c, d):
    return [builder.fadd(builder.fadd(a, b), c), builder.fsub(builder.fsub(b, c), d)]


def _vector_map(builder, lanes, vt, size, src, reads, dst, writes, n, math):
    """For f = 0, lanes, ... below n * lanes: loads the vectors at src + reads[k] + f, and stores
    ``math(loaded)``'s k-th vector at dst + writes[k] + f (offsets in elements)."""
    def body(i, _):
        f = builder.mul(i, I64(lanes))
        loaded = [builder.load(_at(builder, src, builder.add(r, f), vt), align=size) for r in reads]
        for w, value in zip(writes, math(loaded)):
            builder.store(value, _at(builder, dst, builder.add(w, f), vt), align=size)
        return []
    _loop(builder, n, [], body)


def winograd_input_tile(vbytes: int):
    """The intrinsic ``tile(p, ps, rw, shift, v, vs, n)``: for the tiles f < n * lanes of a plane
    split in its four parities (p + (2 * row parity + column parity) * ps, rows rw long: tile f's
    corner at row f // rw, column f % rw), the 16 values of B^T d B, tile f's value k at
    v[k * vs + f].  A tile's columns 2 and 3 are its parities' next column: ``shift`` elements on
    (1 in rows that hold it, or a copy of the planes shifted one column left)."""
    @intrinsic
    def tile(typingctx, p, ps, rw, shift, v, vs, n):
        sig = types.void(p, ps, rw, shift, v, vs, n)
        dtype = p.dtype

        def codegen(context, builder, signature, args):
            p, ps, rw, shift, v, vs, n = args
            lanes, vt, _, size = _types(context, dtype, vbytes)
            # d[r][c] (read 4 r + c): row r from the row parity's plane, (r // 2) rows down; column c
            # from the column parity's, c // 2 columns on
            reads = [builder.add(builder.add(builder.mul(I64(2 * (r % 2) + c % 2), ps),
                                             builder.mul(I64(c // 2), shift)), builder.mul(I64(r // 2), rw))
                     for r in range(4) for c in range(4)]

            def transform(d):
                cols = [_bt(builder, d[c], d[4 + c], d[8 + c], d[12 + c]) for c in range(4)]        # B^T d
                return [value for a in range(4) for value in _bt(builder, *(col[a] for col in cols))]
            _vector_map(builder, lanes, vt, size, p, reads, v, [builder.mul(I64(k), vs) for k in range(16)], n,
                        transform)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def winograd_output_tile(vbytes: int):
    """The intrinsic ``tile(m, ms, y, ys, n)``: for the tiles f < n * lanes, the 2 x 2 outputs
    A^T m A of the 16 products m[k * ms + f], output (a, b) at y[(2 a + b) * ys + f]."""
    @intrinsic
    def tile(typingctx, m, ms, y, ys, n):
        sig = types.void(m, ms, y, ys, n)
        dtype = m.dtype

        def codegen(context, builder, signature, args):
            m, ms, y, ys, n = args
            lanes, vt, _, size = _types(context, dtype, vbytes)

            def transform(t):
                cols = [_at2(builder, t[c], t[4 + c], t[8 + c], t[12 + c]) for c in range(4)]       # A^T m
                return [value for a in range(2) for value in _at2(builder, *(col[a] for col in cols))]
            _vector_map(builder, lanes, vt, size, m, [builder.mul(I64(k), ms) for k in range(16)],
                        y, [builder.mul(I64(q), ys) for q in range(4)], n, transform)
            return context.get_dummy_value()
        return sig, codegen
    return tile
