"""The selection stage of the DeepSeek-V3.2 indexer kernel (op ``dsa_indexer``): from a row's
scores, its top-k ids under the contract's tie rule (score descending, equal scores lower
position first; :mod:`tilesim.shared.ranking`). The kernel's loop nest, which calls these per
span (SP, SP') and per row (MG, ORD), is :mod:`tilesim.device._dsa_indexer_kernel`; ``p`` is
its :class:`~tilesim.device._dsa_indexer_kernel.IndexerParams` and ``ins`` its inputs
(``negpos``: ``-position`` for every column of the widest row and one more; ``slots``: ``0 ..
k-1`` as FP32). Private; importing it needs neither torch nor pypto.

Selection with the documented tie rule from PyPTO's ``topk`` alone: 0.2.0's ``topk`` breaks
ties arbitrarily (in the interpreter it is ``torch.topk``), so every ``topk`` whose order
matters is fed UNIQUE keys, where any correct top-k gives the same answer. A top-k of a list
of values (a span of the row, or the spans' candidates) with their positions:

1. ``(v1, i1) = topk(values)``: the values are right whatever the tie order; ``tau =
   v1[k-1]``, the k-th best value, and ``n_gt = #{v1 > tau}``;
2. ``topk(where(values == tau, -position, -inf))``: the positions valued ``tau``, lowest
   first (unique keys) -- slots ``n_gt ..`` take them, so the tied boundary keeps the lower
   positions (:func:`boundary_ids`);
3. the order, once per row (:func:`order_ids`): a ``topk`` of the negated ids lists them
   ascending; a ``topk`` of ``-(dense_rank(value) * k + slot in that list)`` (both below
   ``k``, exact in FP32 and unique) orders the list: score descending, equal scores lower
   position first.

Steps 1 and 2 run per span (a span's top-k under the tie rule: its candidates), then once
over the spans' ``spans * k`` candidates. The merge is exact: a position of the row's top-k
has fewer than ``k`` positions of the row, so of its span, before it in (score descending,
position ascending), so it is among its span's candidates, and the merge orders the
candidates by the same rule. A whole-span chunk masks its last span's scores to the columns
the row sees (:func:`visible_only`; a row group's other spans are seen whole by its rows, the
kernel's ``score_group`` says why); the span after it is read from the score row, whose unwritten
columns hold the ``-inf`` the wrapper prefilled; spans past the row keep ``-inf`` candidates
at positions above every real one.
"""

from tilesim.shared.dsa_indexer import MAX_POSITIONS  # 2^24: positions are exact in FP32

NEG_INF = float("-inf")


def boundary_ids(pypto, ins, v1, p1, v2, k: int):
    """FP32 ``[1, k]`` negated positions of a top-k under the tie rule: slots below ``n_gt =
    #{v1 > tau}`` (``tau = v1[k-1]``) take ``p1`` (the positions of ``v1``, ties in any
    order), the rest the tied positions ``v2`` (negated, lowest first)."""
    pypto.set_vec_tile_shapes(1, k)
    tau = pypto.view(v1, [1, 1], [0, k - 1])
    n_gt = pypto.sum(pypto.where(pypto.gt(v1, tau), 1.0, 0.0), -1, True)
    slots = pypto.view(ins.slots, [1, k], [0, 0])
    shift = pypto.cast(pypto.maximum(pypto.sub(slots, n_gt), 0.0), pypto.DT_INT32)
    return pypto.where(pypto.lt(slots, n_gt), p1, pypto.gather(v2, -1, shift))


def tied_lowest(pypto, vals, negpos, tau, width: int, p):
    """Step 2 of the selection over ``width`` columns: the negated positions of the ``k``
    lowest positions whose value is ``tau`` (one ``topk`` of unique keys; slots past them
    hold ``-inf`` or higher positions)."""
    k = p.topk
    pypto.set_vec_tile_shapes(1, min(width, p.tiling.topk_tile))
    key = pypto.where(pypto.eq(vals, tau), negpos, NEG_INF)
    v2, _i2 = pypto.topk(key, k, -1, True)
    return v2


def visible_only(pypto, ins, src, col0, visible, p):
    """``src [1, w]`` (columns ``col0 ..`` of a row) with ``-inf`` at every column the row
    does not see (``negpos`` is one column longer than the row: ``negpos[visible] =
    -visible``); the scores past it, computed from slots the table does not hold, never
    reach a top-k. ``w`` = the span's columns."""
    w = p.span
    pypto.set_vec_tile_shapes(1, min(w, p.tiling.topk_tile))
    npos = pypto.view(ins.negpos, [1, w], [0, col0])
    nvis = pypto.view(ins.negpos, [1, 1], [0, visible])
    return pypto.where(pypto.gt(npos, nvis), src, NEG_INF)


def span_topk(pypto, ins, src, s, p):
    """The top-k of span ``s`` of a row (``src [1, span]``: its scores, ``-inf`` at the
    columns the row does not see) under the tie rule: ``(values [1, k] descending, negated
    positions [1, k])``. The full span is read, never a ``valid_shape`` view: under
    ``pass_verify`` of every pass the tile-level top-k read its padding as 0, which outranks
    negative scores (PyPTO's own indexer pads its top-k input explicitly too)."""
    k, w = p.topk, p.span
    pypto.set_vec_tile_shapes(1, min(w, p.tiling.topk_tile))
    npos = pypto.view(ins.negpos, [1, w], [0, s * w])
    v1, i1 = pypto.topk(src, k, -1, True)
    pypto.set_vec_tile_shapes(1, k)
    tau = pypto.view(v1, [1, 1], [0, k - 1])
    v2 = tied_lowest(pypto, src, npos, tau, w, p)
    pypto.set_vec_tile_shapes(1, k)
    # -(s * span); its broadcast to [1, k] reads inputs only, so it is a task of its own, ready
    # at the launch (the forms that avoid it fail the cost model: docs/ops/dsa_indexer.md)
    base = pypto.view(ins.negpos, [1, 1], [0, s * w])
    p1 = pypto.sub(base, pypto.cast(i1, pypto.DT_FP32))
    return v1, boundary_ids(pypto, ins, v1, p1, v2, k)


def keep_span(pypto, top, cand, i: int, s, k: int):
    """Store a span's candidates ``top`` (values, negated positions) in row ``i`` of
    ``cand``, slots ``s*k ..``."""
    pypto.set_vec_tile_shapes(1, k)
    pypto.assemble(top[0], [i, s * k], cand[0])
    pypto.assemble(top[1], [i, s * k], cand[1])


def merge_spans(pypto, ins, cand, p):
    """The top-k of the spans' candidates (``cand``: values, negated positions; ``[1, spans *
    k]``) under the tie rule: exact, because every position of the row's top-k is among the
    top-k of its own span (fewer than ``k`` positions of the row, so of the span, precede it)."""
    k, m = p.topk, p.spans * p.topk
    vals, negpos = cand
    pypto.set_vec_tile_shapes(1, min(m, p.tiling.topk_tile))
    v1, j1 = pypto.topk(vals, k, -1, True)
    pypto.set_vec_tile_shapes(1, k)
    tau = pypto.view(v1, [1, 1], [0, k - 1])
    v2 = tied_lowest(pypto, vals, negpos, tau, m, p)
    pypto.set_vec_tile_shapes(1, k)
    p1 = pypto.gather(negpos, -1, j1)
    return v1, boundary_ids(pypto, ins, v1, p1, v2, k)


def order_ids(pypto, ins, v1, negids, k: int, cumsum_tile: int):
    """Step 3: the ids (given negated, unique, their scores ``v1`` descending) ordered by
    (score descending, id ascending): one ``topk`` of ``-id`` lists the ids ascending, and a
    second one of the unique key ``dense_rank(score) * k + that list's slot`` (both below
    ``k``, exact in FP32) orders the list."""
    pypto.set_vec_tile_shapes(1, k)
    newrun = pypto.where(pypto.ne(pypto.view(v1, [1, k - 1], [0, 1]),
                                  pypto.view(v1, [1, k - 1], [0, 0])), 1.0, 0.0)  # fmt: skip
    first = pypto.full([1, 1], 0.0, pypto.DT_FP32)
    runs = pypto.concat([first, newrun], -1)
    pypto.set_vec_tile_shapes(1, min(k, cumsum_tile))
    rank = pypto.cumsum(runs, -1)
    pypto.set_vec_tile_shapes(1, k)
    neg_up, by_id = pypto.topk(negids, k, -1, True)  # -ids ascending, their slots
    key = pypto.add(
        pypto.mul(pypto.gather(rank, -1, by_id), float(k)), pypto.view(ins.slots, [1, k], [0, 0])
    )
    _v, perm = pypto.topk(pypto.mul(key, -1.0), k, -1, True)
    return pypto.mul(pypto.gather(neg_up, -1, perm), -1.0)


def past_spans_out(pypto, ins, mine, written, p):
    """A row's candidates ``mine`` (values, negated positions; ``[1, spans * k]``) with the
    slots of the spans from ``written`` on replaced by ``-inf`` values at the negated
    position ``-MAX_POSITIONS`` (above every real one): those spans were never written (the
    row group ends before them), so their slots are never read."""
    m = p.spans * p.topk
    pypto.set_vec_tile_shapes(1, min(m, p.tiling.topk_tile))
    slot = pypto.view(ins.negpos, [1, m], [0, 0])  # -slot
    end = pypto.view(ins.negpos, [1, 1], [0, written * p.topk])  # -(written * k)
    kept = pypto.gt(slot, end)
    return (pypto.where(kept, mine[0], NEG_INF), pypto.where(kept, mine[1], -float(MAX_POSITIONS)))


def select_row(pypto, ins, cand, i: int, row, visible, written, ids, p):
    """The rest of SEL for one row: its candidates (row ``i`` of ``cand``; the spans from
    ``written`` on, past the group, as ``-inf`` values at positions above every real one)
    merged into the row's top-k (one span: that span's own), the order on ``[1, k]``, and
    the first ``min(visible, k)`` ids written to ``ids[row]`` (the rest keeps the caller's
    -1)."""
    k, m = p.topk, p.spans * p.topk
    pypto.set_vec_tile_shapes(1, min(m, p.tiling.topk_tile))
    mine = [pypto.view(c, [1, m], [i, 0]) for c in cand]
    if p.spans == 1:
        v1, negids = mine
    else:
        v1, negids = merge_spans(pypto, ins, past_spans_out(pypto, ins, mine, written, p), p)
    pypto.set_vec_tile_shapes(1, k)
    out = pypto.cast(order_ids(pypto, ins, v1, negids, k, p.tiling.cumsum_tile), pypto.DT_INT32)
    pypto.assemble(pypto.view(out, [1, k], [0, 0], valid_shape=[1, visible.min(k)]),
                   [row, 0], ids)  # fmt: skip
