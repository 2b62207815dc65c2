"""The host-side plan of the DeepSeek-V3.2 indexer kernel (op ``dsa_indexer``): its static
parameters per build (:class:`IndexerParams`, whose ``repr`` keys the compile), how a row is
cut into spans, chunks and score slabs (:func:`span_count`, :func:`chunk_unroll`,
:func:`slabs`), which branches a row group takes (:func:`group_chunks`) and where the V1
subgraphs gather their key scales (:func:`gathers_in_slab`). The kernel that traces them is
:mod:`tilesim.device._dsa_indexer_kernel`. Private; importing it needs neither torch nor
pypto.
"""

from tilesim.shared.dsa_indexer import PRODUCTION_TILING
from tilesim.shared.layouts.index_cache import index_page_view

#: the most whole spans one chunk of the block loop holds (its first unroll factor): every
#: root-function call of the block loop is one entry of the runtime's stitched batches
#: (``stitch_function_max_num``), whose boundaries leave the cores idle, so a full-context
#: row group runs as one chunk of its 4 spans at 64K and topk 2048; the cap bounds the
#: chunk body that longer tables compile
ROW_SPANS = 4
#: the SoCs whose INT8 V1 subgraph gathers its slab's key scales itself
#: (:func:`~tilesim.device._dsa_indexer_kernel.slab_kscales`;
#: no task reads only kernel inputs). Elsewhere, and on the FP8 path, a chunk's key scales are
#: gathered by a vector task of their own
#: (:func:`~tilesim.device._dsa_indexer_kernel.chunk_kscales`): on the 950, PyPTO 0.2.0's
#: ``TuneSyncForVF`` pass (its vector-function fusion) fails to compile the INT8 V1 with the
#: gather inside for some cache sizes and task merges ("Cannot find ... GATHER in PIPE_MTE2
#: oplist"; the CI-size production case in ``some_groups`` and ``many_groups``, 64K tables
#: over caches of up to ~750 blocks), and the per-chunk gather compiles at every size tried
SLAB_GATHER_SOCS = ("910b",)


def gathers_in_slab(path: str, soc: str) -> bool:
    """Whether the V1 subgraphs gather their key scales (:data:`SLAB_GATHER_SOCS`)."""
    return path == "int8" and soc in SLAB_GATHER_SOCS


class IndexerParams:
    """Static (trace-time) parameters of one build on ``soc``; ``repr`` keys pypto's
    compiled-kernel cache (equal parameters reuse a kernel)."""

    def __init__(self, *, path, block_size, topk, width, soc, tiling=PRODUCTION_TILING,
                 select=True):  # fmt: skip
        self.path, self.bs, self.topk, self.width = path, block_size, topk, width
        self.soc = soc
        self.slab_gather = gathers_in_slab(path, soc)  # else a task per chunk (chunk_kscales)
        self.tiling = tiling  # a shared.dsa_indexer.IndexerTiling (checked by its constructor)
        self.select = bool(select)  # False: the scores only (the cost split of the reports)
        self.spans = span_count(topk, width, block_size, tiling.span_ratio)
        self.span = width // self.spans
        self.span_blocks = self.span // block_size
        self.unroll = chunk_unroll(self.span_blocks, tiling.chunk_steps, self.spans)
        # how the kernel addresses a block of the cache (tilesim.shared.layouts.index_cache): the
        # codes view's rows per block, the scales view's first column of a block
        page = index_page_view(path, block_size)
        self.rows_per_block, self.scale_col0 = page.code_rows, page.scale_col0

    @property
    def key(self) -> tuple:
        return (self.path, self.bs, self.topk, self.width, self.soc, self.tiling, self.select)

    def __repr__(self) -> str:
        return ("IndexerParams(path={}, bs={}, topk={}, width={}, soc={}, tiling={}, select={})"
                .format(*self.key))  # fmt: skip

    def shape(self) -> dict:
        """The static branches of this build, as counts (``tiles`` of a top-k input or a
        cumsum, ``slabs`` = V1 subgraphs of one row in a whole-span chunk): what makes two
        builds trace the same code paths at different sizes."""
        t, k = self.tiling, self.topk
        return {
            "spans": self.spans,
            "merge": self.spans > 1,
            "span_topk_tiles": -(-self.span // t.topk_tile),
            "merge_topk_tiles": -(-(self.spans * k) // t.topk_tile),
            "merge_fills_tile": self.spans * k == t.topk_tile,
            "span_chunk_slabs": len(slabs(self.span, t.vec_cols)),
            "cumsum_tiles": -(-k // t.cumsum_tile),
            "unroll_factors": len(self.unroll),
        }


def group_chunks(p: IndexerParams, nblk: int) -> dict:
    """The block loop of one row group over ``nblk`` blocks, on the host: ``chunks``, the
    ``(first block, blocks)`` of each chunk (``pypto.loop_unroll``'s split,
    :func:`tilesim.shared.tiling.loop_unroll_chunks`), ``span_chunks`` (whole spans: their
    chunk selects the span's candidates), ``tail`` (a span the smaller chunks end: selected
    from the written score row) and ``spans_past`` (spans past the group: ``-inf``
    candidates)."""
    from tilesim.shared.tiling import loop_unroll_chunks

    chunks = loop_unroll_chunks(nblk, p.unroll)
    whole = sum(u // p.span_blocks for _, u in chunks)
    tail = int(nblk % p.span_blocks > 0)
    return {"chunks": chunks, "span_chunks": whole, "tail": tail,
            "spans_past": p.spans - whole - tail}  # fmt: skip


def span_count(topk: int, width: int, block_size: int, ratio: int) -> int:
    """Spans of the selection over a ``width``-column row: ``width / (ratio * topk)`` (at
    least one; fewer when that does not divide the row's blocks), so every span is whole
    blocks and holds at least ``topk`` columns."""
    cols = int(width) // int(block_size)
    n = max(1, int(width) // (int(ratio) * int(topk)))
    while n > 1 and cols % n:
        n -= 1
    return n


def chunk_unroll(span_blocks: int, steps, spans: int = 1) -> tuple:
    """The block loop's unroll factors: ``min(spans, ROW_SPANS)`` whole spans first (the
    whole row at 64K and topk 2048: a full-context row group is one chunk, so one
    root-function call), then a whole span (both select the spans' candidates in their chunk
    bodies), then the factors of ``steps`` dividing a span, then 1 (``pypto.loop_unroll``
    needs each factor to divide the previous one)."""
    rest = {f for f in steps if f < span_blocks and span_blocks % f == 0} | {1}
    row = span_blocks * max(1, min(int(spans), ROW_SPANS))
    return tuple(sorted({row, span_blocks, *rest}, reverse=True))


def slabs(w: int, vec_cols: int) -> list:
    """``(first column, columns)`` of the V1 slabs of a ``w``-column chunk: ``vec_cols`` wide,
    the last one narrower when ``vec_cols`` does not divide ``w`` (a block size such as 96
    or 160 makes such chunks; every column is scored)."""
    return [(c0, min(vec_cols, w - c0)) for c0 in range(0, w, vec_cols)]


__all__ = [
    "ROW_SPANS",
    "SLAB_GATHER_SOCS",
    "IndexerParams",
    "chunk_unroll",
    "gathers_in_slab",
    "group_chunks",
    "slabs",
    "span_count",
]
