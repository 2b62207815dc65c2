"""One DeepSeek-V3.2 decode step end to end: lightning indexer -> top-k -> sparse attention.

:func:`dsa_decode_step` runs :func:`tilesim.reference.dsa_indexer.dsa_indexer` and feeds its
ids to :func:`tilesim.reference.dsa.sparse_attention_antiquant` (packed ``"pypto"`` /
``"flashmla"`` latent cache) or ``..._kv_split`` (``layout="kv_split"``), in one call, with
nothing in between: the index-key cache and the latent cache share ``block_table`` and
``seq_lens`` (= the attention's ``kv_act_seqs``), query row ``b*s1 + s`` of the indexer is
query token ``b*s1 + s`` of the attention. Row ``r`` of the ids holds ``min(topk, visible)``
positions and then ``-1``; the attention uses exactly its first ``min(topk, visible)`` entries
(``tilesim.shared.dsa_rows.cur_seq_lengths``), so no ``-1`` is ever used. Both goldens keep their
own arithmetic (``docs/ops/dsa_indexer.md``, ``docs/ops/dsa.md``). :func:`step_attention` is
that attention half alone, from given ids (``tilesim compare`` recomputes the golden attention
with a device's ids that differ from the golden's only by score ties).
"""

from __future__ import annotations

import inspect

import numpy as np
from tilesim.reference.dsa import sparse_attention_antiquant, sparse_attention_antiquant_kv_split
from tilesim.reference.dsa_indexer import indexer_from_args
from tilesim.shared import dsa as dsa_contract
from tilesim.shared import dsa_indexer as indexer_contract
from tilesim.shared.casts import BF16
from tilesim.shared.dsa_attention_step import check_latent_blocks
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import check_array, check_choice, check_pos_int, op_signature, shape_of

#: the step's output names, in order
STEP_OUTPUTS = ("topk_indices", "scores", "out")
#: the step's ``layout`` choices: the packed latent caches, then the kv_split triple
STEP_LAYOUTS = ("pypto", "flashmla", "kv_split")
_SPLIT = ("kn_quant", "kr", "kn_scales")
#: the indexer's arguments (the step passes those it takes; decode: no ``q_lens``)
_INDEXER_NAMES = tuple(inspect.signature(indexer_contract.indexer_inputs).parameters)


def _attention_cache(layout, nope_cache, split: dict):
    """``(nope_cache,)`` or ``(kn_quant, kr, kn_scales)``, checked against ``layout`` (one of
    :data:`STEP_LAYOUTS`; ``ValueError`` naming the argument)."""
    check_choice(layout, "layout", STEP_LAYOUTS)
    given = [k for k, v in split.items() if v is not None]
    if layout == "kv_split":
        if nope_cache is not None or len(given) != 3:
            raise ValueError(
                "layout: 'kv_split' takes kn_quant, kr and kn_scales and no nope_cache, got "
                f"{given + (['nope_cache'] if nope_cache is not None else [])}"
            )
        return tuple(split[k] for k in _SPLIT)
    if given or nope_cache is None:
        raise ValueError(f"layout: {layout!r} takes nope_cache and none of {_SPLIT}, got "
                         f"{given or 'no nope_cache'}")  # fmt: skip
    return (nope_cache,)


@op_signature(indexer_contract.decode_step_inputs)
def dsa_decode_step(ins, *, trace=None, progress=None) -> dict:
    """Indexer -> top-k -> sparse attention of one decode step (``s1 = T // B``, 1..4).

    Args:
        q, weights, k_cache, block_table, seq_lens, q_scale, k_scale, path, int8_order, topk,
            block_size: the indexer's (:func:`tilesim.reference.dsa_indexer.dsa_indexer`,
            decode: no ``q_lens``).
        query_nope, query_rope: BF16 ``[T*nq, 512]`` / ``[T*nq, 64]``; nope_cache (packed,
            ``layout`` ``"pypto"`` / ``"flashmla"``) or kn_quant, kr, kn_scales
            (``layout="kv_split"``); nq, softmax_scale, tiling: the attention's
            (:func:`tilesim.reference.dsa.sparse_attention_antiquant`).
        trace: passed to both goldens (their records carry their own ``op``).
        progress: the two goldens' bars.

    Returns:
        ``{"topk_indices": INT32 [T, topk], "scores": FP32 [T, S], "out": BF16 [T*nq, 512]}``
        (:data:`STEP_OUTPUTS`; the ids and scores exactly those of ``dsa_indexer``).
    """
    args = vars(ins)
    caches = _attention_cache(ins.layout, ins.nope_cache, {k: args[k] for k in _SPLIT})
    indexer_args = {k: args[k] for k in _INDEXER_NAMES if k in args}
    ia = indexer_contract.check_values(
        indexer_contract.check_meta(**indexer_args, trace=trace, progress=progress)
    )
    _check_attention_half(
        ia, ins.query_nope, ins.query_rope, caches, layout=ins.layout, nq=ins.nq,
        softmax_scale=ins.softmax_scale, tiling=ins.tiling,
    )  # fmt: skip
    ids, scores = indexer_from_args(ia, ins.q, trace=trace, progress=progress)
    out = step_attention(ids, **attention_arguments(args), trace=trace, progress=progress)
    return dict(zip(STEP_OUTPUTS, (ids, scores, out), strict=True))


def _check_attention_half(ia, query_nope, query_rope, caches: tuple, *, layout, nq,
                          softmax_scale, tiling) -> None:  # fmt: skip
    """Every check of the attention half, before the indexer runs, in the step's own
    arguments: ``nq``, the queries (``T*nq`` rows, ``T`` = the rows of ``q``), the latent
    cache, ``softmax_scale``, ``tiling`` (:func:`tilesim.shared.dsa.check_meta` on a stand-in
    of the ids the indexer will return: ``-1`` everywhere, shape ``[T, topk]``), and that every
    visible block of ``block_table`` lies inside the latent cache (the ids may pick any
    visible position). ``ia``: the indexer's value-checked Args."""
    nq = check_pos_int(nq, "nq")
    check_array(query_nope, "query_nope", dtype=BF16, ndim=2, layout="[T*nq, 512]")
    rows = shape_of(query_nope, "query_nope")[0]
    if rows != ia.rows * nq:
        raise ValueError(
            f"query_nope: expected T*nq = {ia.rows}*{nq} = {ia.rows * nq} rows (T = the {ia.rows} "
            f"query rows of q, nq heads each), got {rows}"
        )
    ids = np.broadcast_to(np.int32(indexer_contract.NO_ID), (ia.rows, ia.topk))  # no memory
    a = dsa_contract.check_meta(
        query_nope, query_rope, caches, ids, ia.block_table, ia.seq_lens, layout=layout,
        nq=nq, n_kv=1, softmax_scale=softmax_scale, topk=ia.topk, block_size=ia.block_size,
        tiling=tiling,
    )  # fmt: skip
    check_latent_blocks(ia, a.cache_rows, "kn_quant" if layout == "kv_split" else "nope_cache")


def step_attention(topk_indices, query_nope, query_rope, block_table, seq_lens, *,
                   nope_cache=None, kn_quant=None, kr=None, kn_scales=None, layout="pypto",
                   topk=2048, block_size=128, nq=128,
                   softmax_scale=DEEPSEEK_V32.test_softmax_scale,
                   tiling: SaTileShapeConfig | None = None, trace=None, progress=None):  # fmt: skip
    """The attention half of :func:`dsa_decode_step` from given ids: the step's own call of
    :func:`tilesim.reference.dsa.sparse_attention_antiquant` (``layout`` ``"pypto"`` /
    ``"flashmla"``, ``nope_cache``) or ``..._kv_split`` (``layout="kv_split"``: ``kn_quant``,
    ``kr``, ``kn_scales``). ``topk_indices``: int ``[T, topk]`` (``-1`` = empty; row ``r``'s
    first ``min(topk, visible)`` entries are used, in their order); the other arguments as in
    :func:`dsa_decode_step`. ``tilesim compare`` calls it with a device's ids. Returns BF16
    ``[T*nq, 512]``."""
    caches = _attention_cache(layout, nope_cache, dict(zip(_SPLIT, (kn_quant, kr, kn_scales),
                                                           strict=True)))  # fmt: skip
    kw = dict(nq=nq, softmax_scale=softmax_scale, topk=topk, block_size=block_size,
              tiling=tiling, trace=trace, progress=progress)  # fmt: skip
    if layout == "kv_split":
        return sparse_attention_antiquant_kv_split(
            query_nope, query_rope, *caches, topk_indices, block_table, seq_lens, **kw
        )
    return sparse_attention_antiquant(
        query_nope, query_rope, caches[0], topk_indices, block_table, seq_lens, layout=layout,
        **kw,
    )  # fmt: skip


def attention_arguments(step_args: dict) -> dict:
    """The keyword arguments of :func:`step_attention` among ``step_args`` (a full
    :func:`dsa_decode_step` argument dict, e.g. a golden's inputs and params; the indexer's
    own are dropped). ``topk_indices`` is never among them."""
    names = set(inspect.signature(step_attention).parameters) - {"topk_indices"}
    return {k: v for k, v in step_args.items() if k in names}


def step_case_inputs(p: dict, inputs: dict, n_blocks: int, seed: int) -> tuple[dict, dict]:
    """The attention half of a step case (``tilesim.reference.dsa_indexer_cases``): grid-uniform
    BF16 queries and a latent cache of ``n_blocks * block_size`` rows built by
    :func:`tilesim.reference.dsa_cases.build_cache` (quant ``p["attn_quant"]``, default the
    indexer's path; layout ``p["layout"]``, default ``"pypto"``), its own streams from
    ``seed``. Returns ``(inputs, params)``."""
    from tilesim.reference.dsa_cases import build_cache, grid_bf16, random_bytes
    from tilesim.shared.mla_cache import NOPE, ROPE

    quant = p["attn_quant"] or p["path"]
    layout = p["layout"] or "pypto"
    nq = DEEPSEEK_V32.num_q_heads
    rng_q, rng_nope, rng_rope = (
        np.random.default_rng(s) for s in np.random.SeedSequence([seed, 1]).spawn(3)
    )
    n_q = inputs["q"].shape[0] * nq
    qv = grid_bf16(random_bytes(rng_q, n_q * (NOPE + ROPE))).reshape(n_q, NOPE + ROPE)
    cache = build_cache(n_blocks * p["block_size"], quant, layout, rng_nope, rng_rope)
    out = {"query_nope": np.ascontiguousarray(qv[:, :NOPE]),
           "query_rope": np.ascontiguousarray(qv[:, NOPE:]), **cache}  # fmt: skip
    params = {"layout": layout, "nq": nq, "softmax_scale": DEEPSEEK_V32.test_softmax_scale,
              "tiling": SaTileShapeConfig.preset("decode")}  # fmt: skip
    return out, params


__all__ = [
    "STEP_LAYOUTS",
    "STEP_OUTPUTS",
    "attention_arguments",
    "dsa_decode_step",
    "step_attention",
    "step_case_inputs",
]
