"""One DeepSeek-V3.2 attention layer step, stage by stage, every stage's outputs kept
(``docs/ops/dsa_attention_step.md``; the contract is :mod:`tilesim.shared.dsa_attention_step`).

Each stage is the existing golden, called as it is; nothing is computed here::

    x ─ mla_prolog ─────────► query_nope, query_rope, q_norm (+ q_norm_scale),
                              latent cache copy with the new rows      (reference/mla_prolog.py)
    x, q_norm ─ dsa_indexer_prolog ─► index q (+ q_scale), weights,
                              index cache copy with the new keys (reference/dsa_indexer_prolog.py)
    index q, weights, new index cache ─ dsa_indexer ─► topk_indices, scores
                                                                      (reference/dsa_indexer.py)
    ids, queries, new latent cache ─ step_attention ─► attn_out       (reference/dsa_step.py:
                  sparse_attention_antiquant / _kv_split of reference/dsa.py)

Both prologs write the new tokens at the slot the block table gives them (``-1`` in a
caller's ``slot_mapping``: not written); the indexer and the attention then read the updated
copies through the same ``block_table`` and ``seq_lens``. Every argument of every stage is
checked before the first stage runs (:func:`tilesim.shared.dsa_attention_step.check_meta`,
``check_values``); no argument is written.

The later stages are public on their own too (the stage judge recomputes a stage's golden from
a device's upstream outputs with them): :func:`step_args` checks a call's arguments as the step
does and :func:`run_stage` runs one stage on given upstream outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import NamedTuple

from tilesim.reference.dsa_indexer import dsa_indexer
from tilesim.reference.dsa_indexer_prolog import dsa_indexer_prolog
from tilesim.reference.dsa_step import step_attention
from tilesim.reference.mla_prolog import mla_prolog
from tilesim.shared import dsa_attention_step as contract
from tilesim.shared.mla_cache import NOPE, ROPE, is_packed
from tilesim.shared.validate import op_signature

OP = "dsa_attention_step"
#: the stages :func:`run_stage` runs, in step order
STAGES = ("dsa_indexer_prolog", "dsa_indexer", "sparse_attention")


class AttentionStepResult(NamedTuple):
    """Every stage output of :func:`dsa_attention_step`, in stage order
    (:data:`tilesim.shared.dsa_attention_step.STEP_FIELDS`). ``None`` where the stage returns
    none: ``q_norm_scale`` on the FP8 path, ``kr_cache`` / ``kv_scale_cache`` for a packed
    latent cache, ``k_scale`` is the FP8 pages' scales (a copy, to read)."""

    query_nope: object  #: BF16 ``[T, 128, 512]`` (MLA prolog)
    query_rope: object  #: BF16 ``[T, 128, 64]``
    q_norm: object  #: INT8 / BF16 ``[T, 1536]``
    q_norm_scale: object  #: FP32 ``[T, 1]`` (INT8) or None
    kv_cache: object  #: the updated copy of ``kv_cache``
    kr_cache: object  #: the updated copy of ``kr_cache`` (kv_split) or None
    kv_scale_cache: object  #: the updated copy of ``kv_scale_cache`` (kv_split) or None
    index_q: object  #: INT8 / E4M3 ``[T, 64, 128]`` (indexer prolog)
    index_q_scale: object  #: FP16 / FP32 ``[T, 64]``
    index_weights: object  #: FP16 / FP32 ``[T, 64]``
    k_cache: object  #: the updated copy of ``k_cache``
    k_scale: object  #: the updated copy of ``k_scale`` (INT8) / the new pages' scales (FP8)
    topk_indices: object  #: INT32 ``[T, topk]`` (indexer)
    scores: object  #: FP32 ``[T, max_blocks * block_size]``
    attn_out: object  #: BF16 ``[T, 128, 512]`` (sparse attention, before ``wo``)


def _run_mla(a, trace):
    ins = a.ins
    ns = contract.mla_namespace(ins, a.slots)
    return mla_prolog(**vars(ns), **contract.mla_switches(ins), trace=trace)


def _run_iprolog(a, mla, trace):
    ins = a.ins
    qs = mla.q_norm_scale if a.path == "int8" else None
    ns = contract.iprolog_namespace(ins, a.slots, mla.q_norm, qs)
    return dsa_indexer_prolog(**vars(ns), **contract.iprolog_switches(ins), trace=trace)


def _run_indexer(a, ip, trace, progress):
    ins, int8 = a.ins, a.path == "int8"
    return dsa_indexer(
        ip.q, ip.weights, ip.k_cache, ins.block_table, ins.seq_lens,
        q_scale=ip.q_scale if int8 else None, k_scale=ip.k_scale if int8 else None,
        q_lens=ins.q_lens, path=a.path, int8_order=ins.int8_order, topk=ins.topk,
        block_size=ins.block_size, trace=trace, progress=progress,
    )  # fmt: skip


def _run_attention(a, mla, ids, trace, progress):
    ins, t = a.ins, a.tokens
    caches = contract.latent_views(a.layout, mla.kv_cache, mla.kr_cache, mla.kv_scale_cache)
    kw = ({"kn_quant": caches[0], "kr": caches[1], "kn_scales": caches[2]}
          if not is_packed(a.layout) else {"nope_cache": caches[0]})  # fmt: skip
    out = step_attention(
        ids, mla.query_nope.reshape(t * contract.HEADS, NOPE),
        mla.query_rope.reshape(t * contract.HEADS, ROPE), ins.block_table, ins.seq_lens,
        layout=a.layout, topk=ins.topk, block_size=ins.block_size, nq=contract.HEADS,
        softmax_scale=ins.softmax_scale, tiling=ins.tiling, trace=trace, progress=progress,
        **kw,
    )  # fmt: skip
    return out.reshape(t, contract.HEADS, NOPE)


@op_signature(contract.step_inputs, contract.step_keywords)
def dsa_attention_step(ins, *, trace: Callable[[dict], None] | None = None,
                       progress=None) -> AttentionStepResult:  # fmt: skip
    """One attention layer step: MLA prolog -> indexer prolog -> (cache writes) -> indexer ->
    top-k -> sparse attention (module docstring; ``docs/ops/dsa_attention_step.md``).

    Args: the arrays of :func:`tilesim.shared.dsa_attention_step.step_inputs` and the
    switches of :func:`~tilesim.shared.dsa_attention_step.step_keywords`. ``trace``: passed to
    every stage (each record carries its stage's ``op``); ``progress``: the indexer's and the
    attention's bars.

    Returns :class:`AttentionStepResult` (the stages' own output kinds: NumPy arrays, or CPU
    torch tensors when ``x`` is one). Every check of every stage runs before the first stage;
    no argument is written (the caches in the result are copies).
    """
    a = contract.check_values(contract.check_meta(ins, trace=trace, progress=progress))
    mla = _run_mla(a, trace)
    ip = _run_iprolog(a, mla, trace)
    ids, scores = _run_indexer(a, ip, trace, progress)
    out = _run_attention(a, mla, ids, trace, progress)
    return AttentionStepResult(
        mla.query_nope, mla.query_rope, mla.q_norm, mla.q_norm_scale, mla.kv_cache,
        mla.kr_cache, mla.kv_scale_cache, ip.q, ip.q_scale, ip.weights, ip.k_cache,
        ip.k_scale, ids, scores, out,
    )  # fmt: skip


def step_args(*args, **kwargs):
    """The checked arguments (:class:`tilesim.shared.dsa_attention_step.Args`) of a call of
    :func:`dsa_attention_step` with these arguments: every check of every stage
    (``check_meta``, then ``check_values``), no stage run. :func:`run_stage` takes them."""
    bound = dsa_attention_step.__signature__.bind(*args, **kwargs)
    bound.apply_defaults()
    got = dict(bound.arguments)
    trace, progress = got.pop("trace"), got.pop("progress")
    ns = SimpleNamespace(**got)
    return contract.check_values(contract.check_meta(ns, trace=trace, progress=progress))


def run_stage(stage: str, args, upstream: Mapping, *, trace=None, progress=None) -> dict:
    """One later stage of a step, run by its golden on given upstream outputs.

    ``stage``: one of :data:`STAGES`; ``args``: the step's checked arguments
    (:func:`step_args`); ``upstream``: ``{step output name: array}`` of the earlier stages'
    outputs the stage reads -- ``"dsa_indexer_prolog"``: ``q_norm``, ``q_norm_scale``;
    ``"dsa_indexer"``: ``index_q``, ``index_q_scale``, ``index_weights``, ``k_cache``,
    ``k_scale``; ``"sparse_attention"``: ``topk_indices``, ``query_nope``, ``query_rope``,
    ``kv_cache`` and, for a ``kv_split`` latent cache, ``kr_cache``, ``kv_scale_cache``.
    ``trace`` / ``progress``: the stage golden's. Returns ``{step output name: output}``, the
    stage's outputs under the names of :class:`AttentionStepResult`; the step itself runs the
    same calls on its own upstream outputs."""
    if stage == "dsa_indexer_prolog":
        mla = SimpleNamespace(q_norm=upstream["q_norm"], q_norm_scale=upstream["q_norm_scale"])
        ip = _run_iprolog(args, mla, trace)
        return {contract.IPROLOG_NAMES[k]: v for k, v in zip(ip._fields, ip, strict=True)}
    if stage == "dsa_indexer":
        ip = SimpleNamespace(**{k: upstream[n] for k, n in contract.IPROLOG_NAMES.items()})
        ids, scores = _run_indexer(args, ip, trace, progress)
        return {"topk_indices": ids, "scores": scores}
    if stage == "sparse_attention":
        mla = SimpleNamespace(
            **{
                k: upstream.get(k)
                for k in ("query_nope", "query_rope", "kv_cache", "kr_cache", "kv_scale_cache")
            }
        )
        return {"attn_out": _run_attention(args, mla, upstream["topk_indices"], trace, progress)}
    raise ValueError(f"stage: expected one of {STAGES}, got {stage!r}")


__all__ = ["STAGES", "AttentionStepResult", "dsa_attention_step",
           "run_stage", "step_args"]  # fmt: skip
