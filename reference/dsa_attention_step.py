"""One DeepSeek-V3.2 attention layer step, stage by stage, every stage's outputs kept
(``docs/ops/dsa_attention_step.md``; the contract is :mod:`tilesim.shared.dsa_attention_step`).

Each stage is the existing golden's arithmetic, called on the arguments the step checked;
nothing is computed here. The stages and their outputs are the contract's
:data:`~tilesim.shared.dsa_attention_step.STAGES`::

    x ─ mla_prolog ─────────► query_nope, query_rope, q_norm (+ q_norm_scale),
                              latent cache copy with the new rows      (reference/mla_prolog.py)
    x, q_norm ─ dsa_indexer_prolog ─► index q (+ q_scale), weights,
                              index cache copy with the new keys (reference/dsa_indexer_prolog.py)
    index q, weights, new index cache ─ dsa_indexer ─► topk_indices, scores
                                                                      (reference/dsa_indexer.py)
    ids, queries, new latent cache ─ sparse_attention ─► attn_out     (reference/dsa.py:
                  sparse_attention_antiquant / _kv_split, through step_attention)

Two entries, one run of the stages (:func:`_run`), one result type
(:class:`AttentionStepResult`):

* :func:`dsa_attention_step` enters at the MLA prolog (the hidden states ``x``);
* :func:`dsa_decode_step` enters at the indexer
  (:data:`~tilesim.shared.dsa_attention_step.DECODE_START`): the index queries, index cache,
  attention queries and latent cache are given, not computed; it returns the published
  ``{"topk_indices", "scores", "out"}`` (the stage ops' own names,
  :data:`~tilesim.shared.dsa_attention_step.DECODE_OUTPUTS`).

Both prologs write the new tokens at the slot the block table gives them (``-1`` in a
caller's ``slot_mapping``: not written); the indexer and the attention then read the updated
copies through the same ``block_table`` and ``seq_lens``. Every argument of every stage is
checked once, before the first stage runs (``check_meta``, ``check_values`` of the contract);
the stages then run on the checked arguments and never scan again what an earlier stage
produced: a NaN / inf an overflow made on legal input (reported by the stage that made it, a
:class:`~tilesim.reference.util.numerics.NumericsWarning`) is computed through to the outputs. No
argument is written.

The stages are public on their own too (the stage judge recomputes a stage's golden from a
device's upstream outputs with them): :func:`step_args` checks a call's arguments as the step
does and :func:`run_stage` runs one stage on given upstream outputs, checking them as the
stage's own golden does.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from types import SimpleNamespace

import numpy as np
from tilesim.reference.dsa import sparse_attention_antiquant, sparse_attention_antiquant_kv_split
from tilesim.reference.dsa_indexer import dsa_indexer, indexer_from_args
from tilesim.reference.dsa_indexer_prolog import dsa_indexer_prolog
from tilesim.reference.dsa_indexer_prolog import prolog_from_args as iprolog_from_args
from tilesim.reference.mla_prolog import prolog_from_args as mla_from_args
from tilesim.reference.util.numerics import NumericsWarning
from tilesim.shared import dsa_attention_step as contract
from tilesim.shared.dsa_attention_step import (
    DECODE_STAGES,
    DECODE_START,
    STAGE_NAMES,
    STAGE_OF,
    STAGES,
    STEP_FIELDS,
    AttentionStepResult,
)
from tilesim.shared.layouts.mla_cache import NOPE, ROPE, is_packed
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.tiling import SaTileShapeConfig

OP = "dsa_attention_step"


# ----------------------------------------------------------------------------- the stages
# Each takes the step's checked Args, the earlier stages' outputs ``up`` ({step name: array})
# and ``scan``: False inside the step (nothing an earlier stage produced is scanned again),
# True in run_stage (a device's upstream is checked as the stage's own golden checks it).
# Each returns {step name: output}.
def _outputs(name: str, values) -> dict:
    return dict(zip(contract.stage(name).outputs, values, strict=True))


def _mla_stage(a, up, trace, progress, scan) -> dict:
    """The MLA prolog on the step's checked arguments (its inputs are the caller's)."""
    return _outputs("mla_prolog", mla_from_args(a.mla, trace=trace))


def _iprolog_stage(a, up, trace, progress, scan) -> dict:
    qs = up["q_norm_scale"] if a.path == "int8" else None
    ns = contract.iprolog_namespace(a.ins, a.slots, up["q_norm"], qs)
    if scan:
        res = dsa_indexer_prolog(**vars(ns), **contract.iprolog_switches(a.ins), trace=trace)
    else:
        res = iprolog_from_args(a.iprolog._replace(ins=ns), trace=trace)
    return _outputs("dsa_indexer_prolog", res)


def _indexer_stage(a, up, trace, progress, scan) -> dict:
    int8, ia = a.path == "int8", a.indexer
    given = dict(q=up["index_q"], weights=up["index_weights"], k_cache=up["k_cache"],
                 q_scale=up["index_q_scale"] if int8 else None,
                 k_scale=up["k_scale"] if int8 else None)  # fmt: skip
    if scan:
        res = dsa_indexer(
            **given, block_table=a.ins.block_table, seq_lens=a.ins.seq_lens,
            q_lens=getattr(a.ins, "q_lens", None), path=a.path, int8_order=ia.int8_order,
            topk=ia.topk, block_size=ia.block_size, trace=trace, progress=progress,
        )  # fmt: skip
        return _outputs("dsa_indexer", res)
    res = indexer_from_args(ia._replace(**given), given["q"], trace=trace, progress=progress,
                            nan_last=True)  # fmt: skip
    _warn_nan_scores(res.scores, contract.host_plan(a).visible)
    return _outputs("dsa_indexer", res)


def _warn_nan_scores(scores, visible) -> None:
    """A :class:`NumericsWarning` naming the ``dsa_indexer`` stage when a visible score is NaN
    (an earlier stage's NaN reached the index queries or weights): those rows are ranked by
    the one ranking rule, NaN last, lower position first."""
    s = np.asarray(scores)
    bad = [r for r, v in enumerate(np.asarray(visible).tolist()) if np.isnan(s[r, :v]).any()]
    if bad:
        warnings.warn(
            f"{OP}: stage dsa_indexer (index q, weights, index cache) has NaN scores in token "
            f"rows {bad[:8]}{' ...' if len(bad) > 8 else ''}, from an earlier stage's NaN: their "
            f"ids rank NaN last, lower position first (tilesim's ranking rule; the kernel's topk "
            f"states no NaN order) (docs/ops/{OP}.md, 'Bad input and overflow')",
            NumericsWarning,
            stacklevel=5,
        )


def _attention_stage(a, up, trace, progress, scan) -> dict:
    """The sparse attention (:func:`step_attention`) on the ids, the queries and the latent
    cache of ``up``; ``attn_out`` ``[T, nq, 512]``."""
    t, nq, ia = a.tokens, a.attention.nq, a.indexer
    caches = contract.latent_views(a.layout, up["kv_cache"], up.get("kr_cache"),
                                   up.get("kv_scale_cache"))  # fmt: skip
    kw = ({"kn_quant": caches[0], "kr": caches[1], "kn_scales": caches[2]}
          if not is_packed(a.layout) else {"nope_cache": caches[0]})  # fmt: skip
    out = step_attention(
        up["topk_indices"], up["query_nope"].reshape(t * nq, NOPE),
        up["query_rope"].reshape(t * nq, ROPE), a.ins.block_table, a.ins.seq_lens,
        layout=a.layout, topk=ia.topk, block_size=ia.block_size, nq=nq,
        softmax_scale=a.ins.softmax_scale, tiling=a.ins.tiling, trace=trace, progress=progress,
        **kw,
    )  # fmt: skip
    return {"attn_out": out.reshape(t, nq, NOPE)}


#: the runner of each stage (:data:`tilesim.shared.dsa_attention_step.STAGES`)
_RUNNERS = {"mla_prolog": _mla_stage, "dsa_indexer_prolog": _iprolog_stage,
            "dsa_indexer": _indexer_stage, "sparse_attention": _attention_stage}  # fmt: skip


def _entry(a) -> dict:
    """The outputs of the stages before ``a.start`` that a call entered there gives."""
    return contract.decode_upstream(a) if a.start == DECODE_START else {}


def _run(a, trace, progress) -> AttentionStepResult:
    """Every stage from ``a.start`` on, in order, each on the outputs of those before it."""
    outs = _entry(a)
    ran = STAGES[STAGE_NAMES.index(a.start) :]
    for st in ran:
        outs.update(_RUNNERS[st.name](a, outs, trace, progress, False))
    done = {s.name for s in ran}
    return AttentionStepResult(*(outs[f] if STAGE_OF[f] in done else None for f in STEP_FIELDS))


def _checked(call: dict, start: str):
    """The contract's checked Args of a call's bound arguments (``trace`` / ``progress``
    among them), entered at ``start``."""
    call = dict(call)
    trace, progress = call.pop("trace"), call.pop("progress")
    ns = SimpleNamespace(**call)
    if start == DECODE_START:
        return contract.check_decode_step(ns, trace=trace, progress=progress)
    return contract.check_values(contract.check_meta(ns, trace=trace, progress=progress))


# ----------------------------------------------------------------------------- public ops
def dsa_attention_step(x, block_table, seq_lens, kv_cache, k_cache, w_dq, w_uq_qr, w_uk,
                       w_dkv_kr, gamma_cq, gamma_ckv, w_qb, w_k, w_proj, ln_gamma, ln_beta,
                       cos, sin, kr_cache=None, kv_scale_cache=None, k_scale=None,
                       w_dq_scale=None, w_uq_qr_scale=None, w_dkv_kr_scale=None,
                       w_qb_scale=None, w_k_scale=None, hadamard_q=None, hadamard_k=None,
                       q_lens=None, slot_mapping=None, *, path: str = "int8",
                       rope_pairing: str | None = None, rms_form: str | None = None,
                       rms_eps: float | None = None, kv_quant: str | None = None,
                       cache_layout: str | None = None, index_rope_pairing: str = "halves",
                       ln_eps: float = 1e-6, ue8m0: bool = True,
                       amax_floor: float | None = None, int8_order: str = "gym",
                       topk: int = DEEPSEEK_V32.topk, block_size: int = DEEPSEEK_V32.block_size,
                       softmax_scale: float = DEEPSEEK_V32.model_softmax_scale,
                       tiling: SaTileShapeConfig | None = None, fp8_promotion: str = "fma",
                       index_k_tile: int | None = None,
                       trace: Callable[[dict], None] | None = None,
                       progress: bool | None = None) -> AttentionStepResult:  # fmt: skip
    """One attention layer step: MLA prolog -> indexer prolog -> (cache writes) -> indexer ->
    top-k -> sparse attention (module docstring; ``docs/ops/dsa_attention_step.md``).

    Args: the arrays of :func:`tilesim.shared.dsa_attention_step.step_inputs` and the
    switches of :func:`~tilesim.shared.dsa_attention_step.step_keywords` (the same names and
    defaults; ``x`` BF16 ``[T, 7168]``). ``trace``: passed to every stage (each record
    carries its stage's ``op``); ``progress``: the indexer's and the attention's bars.

    Returns :class:`AttentionStepResult` (the stages' own output kinds: NumPy arrays, or CPU
    torch tensors when ``x`` is one). Every check of every stage runs once, before the first
    stage; no argument is written (the caches in the result are copies).
    """
    return _run(_checked(locals(), "mla_prolog"), trace, progress)


def dsa_decode_step(q, weights, k_cache, block_table, seq_lens, query_nope, query_rope, *,
                    q_scale=None, k_scale=None, nope_cache=None, kn_quant=None, kr=None,
                    kn_scales=None, layout: str = "pypto", path: str = "int8",
                    int8_order: str = "gym", topk: int = DEEPSEEK_V32.topk,
                    block_size: int = DEEPSEEK_V32.block_size,
                    nq: int = DEEPSEEK_V32.num_q_heads,
                    softmax_scale: float = DEEPSEEK_V32.test_softmax_scale,
                    tiling: SaTileShapeConfig | None = None,
                    trace: Callable[[dict], None] | None = None,
                    progress: bool | None = None) -> dict:  # fmt: skip
    """The layer step entered at the indexer (``s1 = T // B``, 1..4): indexer -> top-k ->
    sparse attention, on given index queries and attention queries.

    Args (:func:`tilesim.shared.dsa_attention_step.decode_step_inputs`):
        q, weights, k_cache, block_table, seq_lens, q_scale, k_scale, path, int8_order, topk,
            block_size: the indexer's (:func:`tilesim.reference.dsa_indexer.dsa_indexer`,
            decode: no ``q_lens``; the step's ``index_q``, ``index_weights``, ...).
        query_nope, query_rope: BF16 ``[T*nq, 512]`` / ``[T*nq, 64]``; nope_cache (packed,
            ``layout`` ``"pypto"`` / ``"flashmla"``) or kn_quant, kr, kn_scales
            (``layout="kv_split"``); nq, softmax_scale, tiling: the attention's
            (:func:`tilesim.reference.dsa.sparse_attention_antiquant`).
        trace: passed to both stages (their records carry their own ``op``).
        progress: the two stages' bars.

    Returns:
        ``{"topk_indices": INT32 [T, topk], "scores": FP32 [T, S], "out": BF16 [T*nq, 512]}``
        (:data:`~tilesim.shared.dsa_attention_step.DECODE_OUTPUTS`: the step's
        ``topk_indices``, ``scores`` and ``attn_out`` under the stage ops' own names, ``out``
        in the attention's ``[T*nq, 512]`` form). Every check runs before the indexer.
    """
    res = _run(_checked(locals(), DECODE_START), trace, progress)
    return decode_outputs(res)


def decode_outputs(res: AttentionStepResult) -> dict:
    """The decode step's published dict of a result entered at the indexer: each of its
    stages' outputs under the stage op's own name (``attn_out`` as ``out``, ``[T*nq, 512]``)."""
    out = {}
    for st in DECODE_STAGES:
        for own, name in zip(st.own, st.outputs, strict=True):
            v = getattr(res, name)
            out[own] = v.reshape(-1, NOPE) if name == "attn_out" else v
    return out


def step_attention(topk_indices, query_nope, query_rope, block_table, seq_lens, *,
                   nope_cache=None, kn_quant=None, kr=None, kn_scales=None, layout="pypto",
                   topk=DEEPSEEK_V32.topk, block_size=DEEPSEEK_V32.block_size,
                   nq=DEEPSEEK_V32.num_q_heads, softmax_scale=DEEPSEEK_V32.test_softmax_scale,
                   tiling: SaTileShapeConfig | None = None, trace=None, progress=None):  # fmt: skip
    """The step's sparse-attention stage from given ids, in the decode step's names:
    :func:`tilesim.reference.dsa.sparse_attention_antiquant` (``layout`` ``"pypto"`` /
    ``"flashmla"``, ``nope_cache``) or ``..._kv_split`` (``layout="kv_split"``: ``kn_quant``,
    ``kr``, ``kn_scales``). ``topk_indices``: int ``[T, topk]`` (``-1`` = empty; row ``r``'s
    first ``min(topk, visible)`` entries are used, in their order); the other arguments as in
    :func:`dsa_decode_step`. ``tilesim compare`` calls it with a device's ids. Returns BF16
    ``[T*nq, 512]``."""
    ns = SimpleNamespace(layout=layout, nope_cache=nope_cache, kn_quant=kn_quant, kr=kr,
                         kn_scales=kn_scales)  # fmt: skip
    caches = contract.decode_caches(ns)
    kw = dict(nq=nq, softmax_scale=softmax_scale, topk=topk, block_size=block_size,
              tiling=tiling, trace=trace, progress=progress)  # fmt: skip
    if not is_packed(layout):
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


# ----------------------------------------------------------------------------- stage by stage
def step_args(*args, start: str = "mla_prolog", **kwargs):
    """The checked arguments (:class:`tilesim.shared.dsa_attention_step.Args`) of a call of
    :func:`dsa_attention_step` (``start="mla_prolog"``) or of :func:`dsa_decode_step`
    (``start`` :data:`~tilesim.shared.dsa_attention_step.DECODE_START`) with these
    arguments: every check of every stage, no stage run. :func:`run_stage` takes them."""
    if start not in ("mla_prolog", DECODE_START):
        raise ValueError(f"start: expected 'mla_prolog' or {DECODE_START!r}, got {start!r}")
    fn = dsa_attention_step if start == "mla_prolog" else dsa_decode_step
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return _checked(bound.arguments, start)


def run_stage(stage: str, args, upstream: Mapping, *, trace=None, progress=None) -> dict:
    """One stage of a step, run by its golden on given upstream outputs.

    ``stage``: a name of :data:`~tilesim.shared.dsa_attention_step.STAGE_NAMES` at or after
    the call's entry; ``args``: the step's checked arguments (:func:`step_args`);
    ``upstream``: ``{step output name: array}`` of the earlier stages' outputs the stage reads
    (its :attr:`~tilesim.shared.dsa_attention_step.Stage.reads`; a call entered at the
    indexer takes the rest from its own inputs). They are checked as the stage's own golden
    checks its inputs (a device's values: ``ValueError`` / ``TypeError`` naming them).
    ``trace`` / ``progress``: the stage golden's. Returns ``{step output name: output}``; the
    step itself runs the same stage functions on its own upstream outputs."""
    st = contract.stage(stage)
    if STAGE_NAMES.index(st.name) < STAGE_NAMES.index(args.start):
        raise ValueError(f"stage: expected a stage from {args.start!r} on (the call's entry), "
                         f"got {stage!r}")  # fmt: skip
    up = {**_entry(args), **upstream}
    return _RUNNERS[st.name](args, up, trace, progress, True)


__all__ = ["AttentionStepResult", "attention_arguments", "decode_outputs", "dsa_attention_step",
           "dsa_decode_step", "run_stage", "step_args",
           "step_attention"]  # fmt: skip
