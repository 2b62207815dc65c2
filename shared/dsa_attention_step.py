"""The contract of one DeepSeek-V3.2 attention layer step (op ``dsa_attention_step``), written
once for the golden (:mod:`tilesim.reference.dsa_attention_step`) and the device step
(:mod:`tilesim.device.dsa_attention_step`).

The step chains five stages (``docs/ops/dsa_attention_step.md``), each the contract of its
own op: the MLA prolog (:mod:`tilesim.shared.mla_prolog`), the indexer prolog
(:mod:`tilesim.shared.dsa_indexer_prolog`), both writing the new tokens into copies of their
caches, the lightning indexer with its top-k (:mod:`tilesim.shared.dsa_indexer`) and the
sparse attention (:mod:`tilesim.shared.dsa`). Here every argument of every stage is checked
before any stage runs, in the step's own argument names; the stages' outputs that feed later
stages (``q_norm``, the index ``q``, the ids, the queries) are checked through stand-ins of
their shapes and dtypes, which no data can make wrong.

* :data:`STAGES`: the stages, in order, each with its outputs (its op record's, under the
  step's names) and the earlier outputs it reads -- written once, read by the golden, the stage
  judge, the CLI and the docs (:data:`STEP_FIELDS`, :data:`STAGE_OF` derive from it);
* :func:`step_inputs` / :func:`step_keywords`: the arguments, declared once;
* :class:`Args`, :func:`check_meta` (dtypes, shapes, switches; no value read),
  :func:`check_values` (lengths, block table, slots, finite inputs, the index-cache tokens
  the indexer reads and no prolog writes); :func:`check_latent_blocks` (every visible token's
  latent row inside the cache, also the decode step's check);
* the decode step (``dsa_decode_step``), the step entered at the indexer
  (:data:`DECODE_START`): :func:`decode_step_inputs`, :func:`check_decode_step` (the indexer's
  checks and the attention's, before the indexer runs), :func:`decode_upstream`;
* :func:`host_plan`: the slot, batch and position of each new token, each row's visible length;
* :func:`cost`: the stages' FLOPs and bytes, summed and per stage.

Two paths (``path``): ``"int8"`` (910B: pypto-gym's prologs, INT8 latent cache in the
``kv_split`` triple, INT8 index cache with FP16 scales) and ``"fp8"`` (950: DeepSeek's
reference prologs, 656-byte packed latent rows or the ``kv_split`` triple, 132-byte FP8 index
pages). One block table and one ``seq_lens`` (counting the new tokens) address both caches;
the new tokens of batch ``b`` are its last ``q_lens[b]`` positions (decode ``q_lens=None``:
``s1 = T // B`` each) and are written to the slot the block table gives them, the one rule of
:mod:`tilesim.shared.layouts.slots`; a caller's ``slot_mapping`` may only replace a slot by ``-1``
(the token's rows are not written; the caches must already hold them). ``cos`` / ``sin`` are
one table for both prologs (DeepSeek's ``freqs_cis`` is shared by ``MLA`` and ``Indexer``).
"""

from __future__ import annotations

import inspect
import types
from typing import NamedTuple

import numpy as np
from tilesim.shared import dsa as attn_contract
from tilesim.shared import dsa_indexer as idx_contract
from tilesim.shared import dsa_indexer_prolog as iprolog_contract
from tilesim.shared import mla_prolog as mla_contract
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.layouts.index_cache import INDEX_DIM, fp8_page_views
from tilesim.shared.layouts.mla_cache import (
    CACHE_LAYOUTS,
    KV_SPLIT_NAMES,
    NOPE,
    PYPTO_ROW_BYTES,
    ROPE,
    is_packed,
)
from tilesim.shared.layouts.slots import NO_SLOT, check_slot_mapping_meta, slots_from_block_table
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.registry.op_record import Call, OpRecord, Output
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import (
    INT32_MAX,
    check_array,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_pos_int,
    dtype_of,
    host_array,
    host_ints,
    raise_at_first,
    shape_of,
)

PATHS = ("int8", "fp8")
HEADS = mla_contract.HEADS  #: 128 attention heads (the MLA prolog's query heads)
#: the indexer prolog's output names (its record's, in order) -> the step's
IPROLOG_NAMES = {"q": "index_q", "q_scale": "index_q_scale", "weights": "index_weights",
                 "k_cache": "k_cache", "k_scale": "k_scale"}  # fmt: skip
#: the sparse attention's output name (its record's ``out``) -> the step's
ATTENTION_NAMES = {"out": "attn_out"}


class Stage(NamedTuple):
    """One stage of the step: ``name``; ``outputs``, its op's outputs (the op record's, in
    its order) under the step's names; ``reads``, the earlier stages' outputs (the step's
    names) its golden reads; ``own``, the same outputs under the op's own names; ``op``, its
    op (whose device wrapper the device step runs for it)."""

    name: str
    outputs: tuple[str, ...]
    reads: tuple[str, ...]
    own: tuple[str, ...]
    op: str  #: the op of the stage (its record's name; its device wrapper's module)


def _stage(name: str, rec, call: str, reads: tuple, rename: dict | None = None) -> Stage:
    own = rec.call(call).output_names
    return Stage(name, tuple((rename or {}).get(n, n) for n in own), reads, own, rec.name)


#: the stages of the step, in order: each stage's name and outputs, written once (the stage
#: ops' records); the golden, the stage judge, the CLI and the docs read them here
STAGES = (
    _stage("mla_prolog", mla_contract.RECORD, "mla_prolog", ()),
    _stage("dsa_indexer_prolog", iprolog_contract.RECORD, "dsa_indexer_prolog",
           ("q_norm", "q_norm_scale"), IPROLOG_NAMES),
    _stage("dsa_indexer", idx_contract.RECORD, "dsa_indexer",
           ("index_q", "index_q_scale", "index_weights", "k_cache", "k_scale")),
    _stage("sparse_attention", attn_contract.RECORD, "sparse_attention_antiquant",
           ("topk_indices", "query_nope", "query_rope", "kv_cache", "kr_cache",
            "kv_scale_cache"), ATTENTION_NAMES),
)  # fmt: skip
#: the stage names, in step order
STAGE_NAMES = tuple(s.name for s in STAGES)
#: the outputs of the step, one per stage output, in stage order (the result's fields)
STEP_FIELDS = tuple(n for s in STAGES for n in s.outputs)
#: the stage of each step output
STAGE_OF = {n: s.name for s in STAGES for n in s.outputs}
#: where the decode step (``dsa_decode_step``) enters the step: the indexer, on given index
#: queries, index cache, attention queries and latent cache
DECODE_START = "dsa_indexer"
#: the stages the decode step runs
DECODE_STAGES = STAGES[STAGE_NAMES.index(DECODE_START) :]
#: the decode step's outputs: those of its stages under the stage ops' own names
DECODE_OUTPUTS = tuple(n for s in DECODE_STAGES for n in s.own)
#: the latent cache forms the decode step takes (``layout``): the packed rows, then the
#: kv_split triple (``nope_cache`` / ``kn_quant, kr, kn_scales``, the attention's names)
DECODE_LAYOUTS = CACHE_LAYOUTS


def stage(name: str) -> Stage:
    """The :class:`Stage` called ``name`` (``ValueError`` naming ``stage``)."""
    check_choice(name, "stage", STAGE_NAMES)
    return STAGES[STAGE_NAMES.index(name)]


# ----------------------------------------------------------------------------- signature
def step_inputs(x, block_table, seq_lens, kv_cache, k_cache, w_dq, w_uq_qr, w_uk, w_dkv_kr,
                gamma_cq, gamma_ckv, w_qb, w_k, w_proj, ln_gamma, ln_beta, cos, sin,
                kr_cache=None, kv_scale_cache=None, k_scale=None, w_dq_scale=None,
                w_uq_qr_scale=None, w_dkv_kr_scale=None, w_qb_scale=None, w_k_scale=None,
                hadamard_q=None, hadamard_k=None, q_lens=None, slot_mapping=None):  # fmt: skip
    """The arrays of ``dsa_attention_step``: BF16 hidden states ``x [T, 7168]``; int
    ``block_table [B, max_blocks]`` and ``seq_lens [B]`` (cached tokens including the new
    ones), shared by both caches; the latent cache ``kv_cache`` (+ ``kr_cache``,
    ``kv_scale_cache`` for ``kv_split``) as :func:`tilesim.shared.mla_prolog.prolog_inputs`
    takes it; the index cache ``k_cache`` (+ ``k_scale`` on INT8) as
    :func:`tilesim.shared.dsa_indexer_prolog.prolog_inputs` takes it; the MLA prolog's
    weights (``w_dq``, ``w_uq_qr``, ``w_uk``, ``w_dkv_kr``, ``gamma_cq``, ``gamma_ckv`` and
    their scales), the indexer prolog's (``w_qb``, ``w_k``, ``w_proj``, ``ln_gamma``,
    ``ln_beta``, scales, INT8 Hadamard matrices); one RoPE table ``cos``/``sin`` for both;
    ``q_lens [B]`` (None: decode) and ``slot_mapping [T]`` (None: from the block table)."""


def step_keywords(*, path: str = "int8", rope_pairing: str | None = None,
                  rms_form: str | None = None, rms_eps: float | None = None,
                  kv_quant: str | None = None, cache_layout: str | None = None,
                  index_rope_pairing: str = "halves", ln_eps: float = 1e-6, ue8m0: bool = True,
                  amax_floor: float | None = None, int8_order: str = "gym",
                  topk: int = DEEPSEEK_V32.topk, block_size: int = DEEPSEEK_V32.block_size,
                  softmax_scale: float = DEEPSEEK_V32.model_softmax_scale,
                  tiling: SaTileShapeConfig | None = None,
                  fp8_promotion: str = "fma", index_k_tile: int | None = None):  # fmt: skip
    """The switches: ``path`` for every stage; the MLA prolog's ``rope_pairing``, ``rms_form``,
    ``rms_eps``, ``kv_quant``, ``cache_layout`` (None: the path's default,
    :data:`tilesim.shared.mla_prolog.PATH_DEFAULTS`); the indexer prolog's
    ``index_rope_pairing`` (its ``rope_pairing``), ``ln_eps`` (its ``eps``), ``ue8m0``,
    ``amax_floor``; the indexer's ``int8_order`` and ``topk``; ``block_size`` of both caches;
    the attention's ``softmax_scale`` (default DeepSeek-V3.2's ``192^-0.5 * mscale^2``) and
    ``tiling`` (None: ``SaTileShapeConfig.from_env()`` at call time); ``fp8_promotion``, the
    K-block promotion of both prologs' FP8 linears (``"fma"``: DeepSeek's ``fp8_gemm``, one
    rounding; ``"two_roundings"``; :data:`tilesim.shared.quant.FP8_PROMOTIONS`);
    ``index_k_tile``, the indexer prolog's ``k_tile`` (the K tile of its FP32 linears over
    ``H``, ``x @ w_k`` and ``x @ w_proj``, tile partials added in FP32; None: one tile, the
    exact sum rounded once; the device kernel's tile at ``H = 7168`` is 1024)."""


def decode_step_inputs(q, weights, k_cache, block_table, seq_lens, query_nope, query_rope, *,
                       q_scale=None, k_scale=None, nope_cache=None, kn_quant=None, kr=None,
                       kn_scales=None, layout: str = "pypto", path: str = "int8",
                       int8_order: str = "gym", topk: int = DEEPSEEK_V32.topk,
                       block_size: int = DEEPSEEK_V32.block_size,
                       nq: int = DEEPSEEK_V32.num_q_heads,
                       softmax_scale: float = DEEPSEEK_V32.test_softmax_scale,
                       tiling: SaTileShapeConfig | None = None):  # fmt: skip
    """The arguments of ``dsa_decode_step``, the step entered at the indexer
    (:data:`DECODE_START`): the indexer's (:func:`tilesim.shared.dsa_indexer.indexer_inputs`,
    decode: no ``q_lens``; ``q``, ``q_scale``, ``weights`` are the step's ``index_q``,
    ``index_q_scale``, ``index_weights``) and the sparse attention's queries ``[T*nq, 512]`` /
    ``[T*nq, 64]``, latent cache in its own names (``nope_cache`` for the packed ``layout``
    ``"pypto"`` / ``"flashmla"``, ``kn_quant`` / ``kr`` / ``kn_scales`` for ``"kv_split"``)
    and keywords (:func:`tilesim.shared.dsa.model_keywords`: ``nq``, ``softmax_scale``,
    ``tiling``); ``topk`` and ``block_size`` are shared by both stages. The names both ops
    have take their defaults (tests/test_op_records.py checks it)."""


INPUT_NAMES = tuple(inspect.signature(step_inputs).parameters)
KEYWORD_NAMES = tuple(inspect.signature(step_keywords).parameters)
_MLA_ARRAYS = tuple(inspect.signature(mla_contract.prolog_inputs).parameters)
_IPRO_ARRAYS = iprolog_contract.INPUT_NAMES


class Args(NamedTuple):
    """The checked arguments of one step (:func:`check_meta`; :func:`check_values` fills the
    host copies, the slots and the value-checked stage Args)."""

    ins: object  #: the namespace of :func:`step_inputs` and :func:`step_keywords`
    path: str
    tokens: int  #: T
    layout: str  #: the latent cache layout (``"kv_split"``, ``"pypto"``, ``"flashmla"``)
    latent_rows: int
    mla: object  #: the MLA prolog's Args
    iprolog: object  #: the indexer prolog's Args
    indexer: object  #: the indexer's Args
    attention: object  #: the sparse attention's Args (on stand-in queries and ids)
    slots: object = None  #: int64 ``[T]`` after check_values (None: the decode step)
    values: bool = False
    #: the stage the call enters at: ``"mla_prolog"`` (``dsa_attention_step``) or
    #: :data:`DECODE_START` (``dsa_decode_step``: ``mla`` / ``iprolog`` None, ``ins`` the
    #: namespace of :func:`decode_step_inputs`)
    start: str = "mla_prolog"


class AttentionStepResult(NamedTuple):
    """Every stage output of the step, in stage order (:data:`STEP_FIELDS`): the result of
    the golden and of the device step. ``None`` where the stage returns none:
    ``q_norm_scale`` on the FP8 path, ``kr_cache`` / ``kv_scale_cache`` for a packed latent
    cache; and every output of a stage the call did not run (entered at the indexer: the
    prologs'). ``k_scale`` is the FP8 pages' scales (a copy, to read)."""

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
    attn_out: object  #: BF16 ``[T, nq, 512]`` (sparse attention, before ``wo``)


class Plan(NamedTuple):
    """Host rules of a checked step (:func:`host_plan`), int64."""

    slots: np.ndarray  #: ``[T]`` the row each token's latent and index key go to (-1: none)
    row_batch: np.ndarray  #: ``[T]`` batch of each token
    position: np.ndarray  #: ``[T]`` logical position of each token in its sequence
    visible: np.ndarray  #: ``[T]`` tokens each row's indexer and attention see
    q_lens: np.ndarray  #: ``[B]`` new tokens per batch


# ----------------------------------------------------------------------------- stand-ins
def _zeros(shape, dtype) -> np.ndarray:
    """A read-only array of zeros that takes no memory (a stage output's stand-in)."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def mla_namespace(ins, slots) -> types.SimpleNamespace:
    """The MLA prolog's arrays from the step's (``slot_mapping`` = ``slots``)."""
    d = {n: getattr(ins, n) for n in _MLA_ARRAYS if n != "slot_mapping"}
    return types.SimpleNamespace(**d, slot_mapping=slots)


def iprolog_namespace(ins, slots, q_norm, q_norm_scale) -> types.SimpleNamespace:
    """The indexer prolog's arrays from the step's and the MLA prolog's ``q_norm`` (+ scale)."""
    skip = ("slot_mapping", "q_norm", "q_norm_scale")
    d = {n: getattr(ins, n) for n in _IPRO_ARRAYS if n not in skip}
    return types.SimpleNamespace(**d, slot_mapping=slots, q_norm=q_norm, q_norm_scale=q_norm_scale)


def mla_switches(ins) -> dict:
    """The MLA prolog's keyword switches of the step."""
    return {k: getattr(ins, k) for k in ("path", "rope_pairing", "rms_form", "rms_eps",
                                          "kv_quant", "cache_layout",
                                          "fp8_promotion")}  # fmt: skip


def iprolog_switches(ins) -> dict:
    """The indexer prolog's keyword switches of the step (under its own names)."""
    return {"path": ins.path, "rope_pairing": ins.index_rope_pairing, "eps": ins.ln_eps,
            "ue8m0": ins.ue8m0, "amax_floor": ins.amax_floor,
            "block_size": ins.block_size, "fp8_promotion": ins.fp8_promotion,
            "k_tile": ins.index_k_tile}  # fmt: skip


def latent_views(layout: str, kv_cache, kr_cache, kv_scale_cache) -> tuple:
    """The latent cache as the attention reads it: ``(nope_cache,)`` for a packed layout, or
    the ``kv_split`` triple as 2-D ``[rows, d]`` views (pypto-gym's ``[blocks, bs, 1, d]``
    forms reshaped; no copy for contiguous arrays)."""
    if is_packed(layout):
        return (kv_cache,)
    return tuple(v.reshape(-1, w) for v, w in ((kv_cache, NOPE), (kr_cache, ROPE),
                                                (kv_scale_cache, 4)))  # fmt: skip


# ----------------------------------------------------------------------------- meta checks
#: the weights whose dtype follows ``path`` (the arrays a path mismatch shows first):
#: ``w_uq_qr`` decides the MLA prolog's ``q_norm`` dtype, which the indexer prolog of the
#: path reads (INT8 + per-token scale on ``"int8"``, BF16 on ``"fp8"``); ``w_qb`` is the
#: indexer prolog's (INT8 per-channel / E4M3 blocks)
PATH_WEIGHTS = {
    "int8": {"w_uq_qr": (np.int8,), "w_qb": (np.int8,)},
    "fp8": {"w_uq_qr": (FP8_E4M3, BF16), "w_qb": (FP8_E4M3,)},
}
_PATH_TEXT = {
    "int8": "INT8 with per-channel scales (pypto-gym's 910B path)",
    "fp8": "FP8 E4M3 with block scales (DeepSeek's path; w_uq_qr may also be BF16)",
}


def _check_path_weights(ins, path: str) -> None:
    """The weights of :data:`PATH_WEIGHTS` against ``path``, first of all the arrays: a dump
    of the other path's weights is named by its weight, not by a later switch default (the
    path's RoPE table, its latent cache layout) that it happens to contradict."""
    for name, dtypes in PATH_WEIGHTS[path].items():
        got = dtype_of(getattr(ins, name), name)
        if got not in tuple(np.dtype(d) for d in dtypes):
            raise TypeError(f"{name}: expected {_PATH_TEXT[path]} for path={path!r}, got {got}")


def _check_index_rope_table(ins, t: int) -> None:
    """``index_rope_pairing="interleaved"`` takes one angle per pair (``cos`` / ``sin`` ``[T,
    32]``); the step checks it under its own switch name before the indexer prolog's check
    (which names its ``rope_pairing``)."""
    if ins.index_rope_pairing != "interleaved":
        return
    for name in ("cos", "sin"):
        check_array(getattr(ins, name), name, ndim=2, layout="[T, 32|64]")
        shp = shape_of(getattr(ins, name), name)
        if shp[1] != iprolog_contract.ROPE_DIM // 2:
            raise ValueError(
                f"index_rope_pairing: expected 'halves' for a {name} table of shape {shp} (the "
                f"indexer prolog's 'interleaved' layout takes [{t}, 32], one angle per pair), "
                f"got 'interleaved'"
            )


def _check_latent_block_size(ins, layout: str, bs: int) -> None:
    if not is_packed(layout) and len(shape_of(ins.kv_cache, "kv_cache")) == 4:
        got = shape_of(ins.kv_cache, "kv_cache")
        if got[1] != bs:
            raise ValueError(f"kv_cache: expected [blocks, block_size = {bs}, 1, 512] (the "
                             f"block_size of both caches), got {got}")  # fmt: skip


def _meta_prologs(ins, t: int, trace):
    stand_slots = _zeros((t,), np.int64)
    mla = mla_contract.check_meta(mla_namespace(ins, stand_slots), **mla_switches(ins),
                                  trace=trace)  # fmt: skip
    _check_index_rope_table(ins, t)
    qdt, qs = (np.int8, _zeros((t, 1), np.float32)) if ins.path == "int8" else (BF16, None)
    q_norm = _zeros((t, mla_contract.Q_LORA), qdt)
    ip = iprolog_contract.check_meta(iprolog_namespace(ins, stand_slots, q_norm, qs),
                                     **iprolog_switches(ins), trace=trace)  # fmt: skip
    return mla, ip


def _meta_indexer(ins, t: int, trace, progress):
    int8 = ins.path == "int8"
    q = _zeros((t, idx_contract.INDEX_HEADS, INDEX_DIM), np.int8 if int8 else FP8_E4M3)
    w = _zeros((t, idx_contract.INDEX_HEADS), np.float16 if int8 else np.float32)
    qs = _zeros((t, idx_contract.INDEX_HEADS), np.float16) if int8 else None
    return idx_contract.check_meta(
        q, w, ins.k_cache, ins.block_table, ins.seq_lens, q_scale=qs,
        k_scale=ins.k_scale if int8 else None, q_lens=ins.q_lens, path=ins.path,
        int8_order=ins.int8_order, topk=ins.topk, block_size=ins.block_size, trace=trace,
        progress=progress,
    )  # fmt: skip


def _meta_attention(ins, mla, ia):
    rows = ia.rows * HEADS
    qn, qr = _zeros((rows, NOPE), BF16), _zeros((rows, ROPE), BF16)
    caches = latent_views(mla.cache_layout, ins.kv_cache, ins.kr_cache, ins.kv_scale_cache)
    ids = _zeros((ia.rows, ia.topk), np.int32)
    return attn_contract.check_meta(
        qn, qr, caches, ids, ins.block_table, ins.seq_lens, layout=mla.cache_layout, nq=HEADS,
        n_kv=1, softmax_scale=ins.softmax_scale, topk=ia.topk, block_size=ia.block_size,
        tiling=ins.tiling,
    )  # fmt: skip


def _check_decode_rows(ins, t: int) -> None:
    """Decode (``q_lens=None``): ``T = B * s1`` tokens with ``1 <= s1 <= 4`` (the indexer's
    decode rows; more new tokens per batch need ``q_lens``)."""
    if ins.q_lens is not None:
        return
    check_array(ins.seq_lens, "seq_lens", ndim=1, layout="[B]")
    n_b = shape_of(ins.seq_lens, "seq_lens")[0]
    s1, rem = divmod(t, max(n_b, 1))
    if n_b and (rem or not 1 <= s1 <= idx_contract.MAX_DECODE_S1):
        raise ValueError(
            f"x, seq_lens: expected T = B*s1 tokens with 1 <= s1 <= "
            f"{idx_contract.MAX_DECODE_S1} for decode (q_lens=None, B = len(seq_lens) = {n_b}), "
            f"got T = {t}; pass q_lens for prefill rows"
        )


def check_meta(ins, *, trace=None, progress=None) -> Args:
    """Dtypes, shapes and switches of every stage, before any value is read (``ins``: the
    namespace of :func:`step_inputs` and :func:`step_keywords`): ``path``, the indexer
    prolog's renamed switches, ``x`` (``T >= 1``), the dtypes of :data:`PATH_WEIGHTS` against
    ``path``; the MLA prolog's checks; ``index_rope_pairing`` against ``cos``; the indexer
    prolog's (on a stand-in ``q_norm``); the indexer's (stand-in ``q``, ``weights``,
    ``q_scale``); ``slot_mapping`` an integer ``[T]``; the latent cache's block size; the
    attention's (stand-in queries and ids: ``softmax_scale``, ``tiling``, the latent cache as
    it reads it). ``ValueError`` / ``TypeError`` naming the step's argument, expected and
    actual."""
    check_choice(ins.path, "path", PATHS)
    # the indexer prolog's switches the step renames, checked under the step's names
    pairings = iprolog_contract.PROLOG_ROPE_PAIRINGS
    check_choice(ins.index_rope_pairing, "index_rope_pairing", pairings)
    check_float(ins.ln_eps, "ln_eps", positive=True, fp32=True)
    if ins.index_k_tile is not None:
        check_int(ins.index_k_tile, "index_k_tile", lo=1, hi=INT32_MAX)
    if progress is not None:
        check_bool(progress, "progress")
    check_array(ins.x, "x", dtype=BF16, ndim=2, layout="[T, 7168]")
    t = shape_of(ins.x, "x")[0]
    if t == 0:
        raise ValueError(f"x: expected at least one token, got shape {shape_of(ins.x, 'x')}")
    _check_path_weights(ins, ins.path)
    mla, ip = _meta_prologs(ins, t, trace)
    _check_decode_rows(ins, t)
    ia = _meta_indexer(ins, t, trace, progress)
    if ins.slot_mapping is not None:
        check_slot_mapping_meta(ins.slot_mapping, t)
    _check_latent_block_size(ins, mla.cache_layout, ia.block_size)
    aa = _meta_attention(ins, mla, ia)
    return Args(ins, ins.path, t, mla.cache_layout, mla.cache_rows, mla, ip, ia, aa)


# ----------------------------------------------------------------------------- value checks
def _uniform_q_lens(ia) -> None:
    """The sparse attention takes one ``s1`` per call: every batch the same new tokens."""
    ql = ia.q_lens
    if (ql != ql[0]).any():
        b = int(np.flatnonzero(ql != ql[0])[0])
        raise ValueError(
            f"q_lens[{b}]: expected {int(ql[0])} like q_lens[0] (the sparse attention takes the "
            f"same number of new tokens in every batch), got {int(ql[b])}"
        )


def _slots(ins, ia) -> np.ndarray:
    """The block table's slot of every new token, or ``-1`` where ``slot_mapping`` says so."""
    slots = slots_from_block_table(
        ia.block_table, ia.seq_lens, q_lens=ia.q_lens, block_size=ia.block_size
    )
    if ins.slot_mapping is None:
        return slots
    given = host_ints(ins.slot_mapping, "slot_mapping", ndim=1)
    raise_at_first((given != slots) & (given != NO_SLOT), lambda t: (
        f"slot_mapping[{t}]: expected -1 (not written) or {int(slots[t])} (the slot "
        f"block_table gives token {t}: the indexer and the attention read it there), got "
        f"{int(given[t])}"))  # fmt: skip
    return given


def check_latent_blocks(ia, cache_rows: int, cache: str = "kv_cache") -> None:
    """Every visible token of every batch has its row inside the latent cache ``cache`` of
    ``cache_rows`` rows (``ia``: the indexer's value-checked Args: ``block_table``, ``seq_lens``,
    ``block_size``). ``ValueError`` naming the ``block_table`` entry, the cache and its rows."""
    bs = ia.block_size
    for b in range(ia.n_b):
        n_tok = int(ia.seq_lens[b])
        for j in range(-(-n_tok // bs)):
            entry, last = int(ia.block_table[b, j]), min(bs, n_tok - j * bs) - 1
            if entry * bs + last >= cache_rows:
                raise ValueError(
                    f"block_table[{b}, {j}]: expected a block whose visible tokens lie inside the "
                    f"latent cache ({cache}: {cache_rows} rows; seq_lens[{b}] = {n_tok}), got "
                    f"{entry} (rows {entry * bs}..{entry * bs + last})"
                )


def _check_read_index_keys(ins, ia, slots: np.ndarray) -> None:
    """Among the tokens the indexer reads and no prolog writes: finite ``>= 0`` k scales and
    no E4M3 NaN code (the indexer's rule, ``tilesim.shared.dsa_indexer.check_data_values``;
    the rows the indexer prolog writes may hold anything before the step)."""
    written = np.zeros(ia.num_blocks * ia.block_size, dtype=bool)
    written[slots[slots >= 0]] = True
    int8 = ia.path == "int8"
    cache = host_array(ins.k_cache, "k_cache")
    views = None if int8 else fp8_page_views(cache, block_size=ia.block_size)
    scales = host_array(ins.k_scale, "k_scale") if int8 else views.scales
    name = "k_scale" if int8 else "k_cache"
    for b in range(ia.n_b):
        n_tok = int(ia.seq_lens[b])
        pos = np.arange(n_tok)
        row = ia.block_table[b, pos // ia.block_size].astype(np.int64) * ia.block_size
        row += pos % ia.block_size
        pos, row = pos[~written[row]], row[~written[row]]
        blk, off = row // ia.block_size, row % ia.block_size
        s = scales[blk, off].astype(np.float32)
        bad = ~(s >= 0) | ~np.isfinite(s)
        if not int8:
            codes = views.codes.view(np.uint8)[blk, off]
            bad |= ((codes & np.uint8(0x7F)) == np.uint8(0x7F)).any(axis=-1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{name}: expected a finite scale >= 0{'' if int8 else ' and finite E4M3 codes'}"
                f" in every cached token the indexer reads, got scale {float(s[i])!r} at batch "
                f"{b}, position {int(pos[i])} (block {int(blk[i])}, slot {int(off[i])})"
            )


def check_int_values(args: Args) -> Args:
    """The checks of the small integer inputs (host copies; a device wrapper's default, the
    record's ``int_checks``): the indexer's (``seq_lens``, ``q_lens``, every visible block of
    ``block_table``); the same ``q_lens`` in every batch; ``slot_mapping`` entries (``-1`` or
    the block table's slot); both prologs' slot checks with those slots; every visible block
    inside the latent cache. Returns ``args`` with ``slots`` and ``values=True`` (what
    :func:`host_plan` needs; :func:`cost` needs :func:`check_values`: the float inputs are not
    read here)."""
    ins = args.ins
    ia = idx_contract.check_int_values(args.indexer)
    _uniform_q_lens(ia)
    slots = _slots(ins, ia)
    mla = mla_contract.check_int_values(args.mla._replace(ins=mla_namespace(ins, slots),
                                                          slot_mapping=slots))  # fmt: skip
    ipn = iprolog_namespace(ins, slots, args.iprolog.ins.q_norm, args.iprolog.ins.q_norm_scale)
    ip = iprolog_contract.check_int_values(args.iprolog._replace(ins=ipn, slot_mapping=slots))
    check_latent_blocks(ia, args.latent_rows)
    return args._replace(mla=mla, iprolog=ip, indexer=ia, slots=slots, values=True)


def check_data_values(args: Args) -> Args:
    """The scans of the float data after :func:`check_int_values` (the record's
    ``scan_checks``): both prologs' (finite activations, gammas, RoPE tables; every weight
    and its scales), and the index-cache tokens the indexer reads that no prolog writes
    (:func:`_check_read_index_keys`). Returns ``args``."""
    _require_values(args, "check_data_values")
    mla = mla_contract.check_data_values(args.mla)
    ip = iprolog_contract.check_data_values(args.iprolog)._replace(values=True)
    _check_read_index_keys(args.ins, args.indexer, args.slots)
    return args._replace(mla=mla, iprolog=ip)


def check_values(args: Args) -> Args:
    """Every value check, before any stage runs (the golden's): :func:`check_int_values`
    then :func:`check_data_values`. Returns ``args`` with ``slots`` and ``values=True``."""
    return check_data_values(check_int_values(args))


# ----------------------------------------------------------------------------- decode step
#: the kv_split triple of the decode step (the attention's names)
_SPLIT = KV_SPLIT_NAMES


def decode_caches(ins) -> tuple:
    """``(nope_cache,)`` or ``(kn_quant, kr, kn_scales)`` of a decode-step namespace
    (:func:`decode_step_inputs`), checked against its ``layout`` (one of
    :data:`DECODE_LAYOUTS`): a cache the layout reads given as ``None`` is a ``TypeError``, one
    it does not read given as an array a ``ValueError``, each naming the cache and the layout."""
    check_choice(ins.layout, "layout", DECODE_LAYOUTS)
    packed = ("nope_cache",)
    wanted, unread = (packed, _SPLIT) if is_packed(ins.layout) else (_SPLIT, packed)
    reads = f"layout={ins.layout!r} reads {', '.join(wanted)}"
    for k in wanted:
        if getattr(ins, k) is None:
            raise TypeError(f"{k}: expected an array ({reads}), got None")
    for k in unread:
        if getattr(ins, k) is not None:
            raise ValueError(f"{k}: expected None ({reads}), got {type(getattr(ins, k)).__name__}")
    return tuple(getattr(ins, k) for k in wanted)


def _meta_decode_attention(ins, ia, caches: tuple):
    """Every check of the decode step's attention, before the indexer runs, in the step's
    own arguments: ``nq``, the queries (``T*nq`` rows, ``T`` = the rows of ``q``), the latent
    cache, ``softmax_scale``, ``tiling`` (:func:`tilesim.shared.dsa.check_meta` on a stand-in
    of the ids the indexer will return: ``-1`` everywhere, shape ``[T, topk]``). ``ia``: the
    indexer's Args. Reads no value."""
    nq = check_pos_int(ins.nq, "nq")
    check_array(ins.query_nope, "query_nope", dtype=BF16, ndim=2, layout="[T*nq, 512]")
    rows = shape_of(ins.query_nope, "query_nope")[0]
    if rows != ia.rows * nq:
        raise ValueError(
            f"query_nope: expected T*nq = {ia.rows}*{nq} = {ia.rows * nq} rows (T = the {ia.rows} "
            f"query rows of q, nq heads each), got {rows}"
        )
    ids = np.broadcast_to(np.int32(idx_contract.NO_ID), (ia.rows, ia.topk))  # no memory
    aa = attn_contract.check_meta(
        ins.query_nope, ins.query_rope, caches, ids, ia.block_table, ia.seq_lens,
        layout=ins.layout, nq=nq, n_kv=1, softmax_scale=ins.softmax_scale, topk=ia.topk,
        block_size=ia.block_size, tiling=ins.tiling,
    )  # fmt: skip
    return aa


#: the indexer's arguments among the decode step's (decode: no ``q_lens``)
_INDEXER_NAMES = tuple(inspect.signature(idx_contract.indexer_inputs).parameters)


def check_decode_meta(ins, *, trace=None, progress=None) -> Args:
    """The decode step's metadata checks (``ins``: the namespace of
    :func:`decode_step_inputs`; no value read): the latent cache against ``layout``, the
    indexer's ``check_meta``, the attention's (:func:`_meta_decode_attention`)."""
    caches = decode_caches(ins)
    given = {k: getattr(ins, k) for k in _INDEXER_NAMES if hasattr(ins, k)}
    ia = idx_contract.check_meta(**given, trace=trace, progress=progress)
    aa = _meta_decode_attention(ins, ia, caches)
    return Args(ins, ia.path, ia.rows, ins.layout, aa.cache_rows, None, None, ia, aa,
                start=DECODE_START)  # fmt: skip


def check_decode_step(ins, *, trace=None, progress=None) -> Args:
    """Every check of the decode step (``ins``: the namespace of :func:`decode_step_inputs`)
    before its first stage: the latent cache against ``layout``; the indexer's
    ``check_meta`` and ``check_values`` (the caller's index queries, weights and index cache);
    the attention's (:func:`_meta_decode_attention`); every visible block of ``block_table``
    inside the latent cache (the ids may pick any visible position). Returns the
    :class:`Args` of a call entered at :data:`DECODE_START` (values checked)."""
    caches = decode_caches(ins)
    given = {k: getattr(ins, k) for k in _INDEXER_NAMES if hasattr(ins, k)}
    ia = idx_contract.check_values(idx_contract.check_meta(**given, trace=trace, progress=progress))
    aa = _meta_decode_attention(ins, ia, caches)
    check_latent_blocks(ia, aa.cache_rows, "nope_cache" if is_packed(ins.layout) else "kn_quant")
    return Args(ins, ia.path, ia.rows, ins.layout, aa.cache_rows, None, None, ia, aa,
                values=True, start=DECODE_START)  # fmt: skip


def decode_upstream(args: Args) -> dict:
    """The decode step's given arrays under the step's names (``{index_q: q, ...,
    kv_cache: nope_cache or kn_quant, kr_cache: kr, kv_scale_cache: kn_scales}``): the
    outputs of the stages before :data:`DECODE_START`, as the later stages read them."""
    ins = args.ins
    caches = decode_caches(ins) + (None, None)
    return {"index_q": ins.q, "index_q_scale": ins.q_scale, "index_weights": ins.weights,
            "k_cache": ins.k_cache, "k_scale": ins.k_scale, "query_nope": ins.query_nope,
            "query_rope": ins.query_rope, "kv_cache": caches[0], "kr_cache": caches[1],
            "kv_scale_cache": caches[2]}  # fmt: skip


# ----------------------------------------------------------------------------- plan and cost
def _require_values(args: Args, what: str) -> None:
    if not (isinstance(args, Args) and args.values):
        raise TypeError(f"args: {what} needs the Args of check_values, got {type(args).__name__}")


def host_plan(args: Args) -> Plan:
    """Slots, batch, position and visible length of each new token (:func:`check_values`
    first)."""
    _require_values(args, "host_plan")
    ia = args.indexer
    ip = idx_contract.host_plan(ia)
    pos = (
        ia.seq_lens[ip.row_batch]
        - ia.q_lens[ip.row_batch]
        + (np.arange(ia.rows) - ip.row_start[ip.row_batch])
    )
    return Plan(args.slots, ip.row_batch, pos, ip.visible, ia.q_lens)


def cost(args: Args) -> dict:
    """``{"flop", "bytes", "stages"}``: each stage's own counter (the MLA prolog's, the indexer
    prolog's, the indexer's; a call entered at :data:`DECODE_START` counts the stages it runs)
    and the attention's FlashMLA accounting over the ids the indexer returns (``min(topk,
    visible)`` per row, none ``-1``): ``flop = attention_flop(nq, attended)``, ``bytes`` = Q +
    attended x 656 + O. ``stages`` maps each stage to its ``{flop, bytes}``."""
    _require_values(args, "cost")
    attended = int(np.minimum(host_plan(args).visible, args.indexer.topk).sum())
    t, nq = args.tokens, args.attention.nq
    stages = {}
    if args.start == "mla_prolog":
        stages["mla_prolog"] = mla_contract.cost(args.mla)
        stages["dsa_indexer_prolog"] = iprolog_contract.cost(args.iprolog)
    stages["dsa_indexer"] = idx_contract.cost(args.indexer)
    stages["sparse_attention"] = {
        "flop": attn_contract.attention_flop(nq, attended),
        "bytes": t * nq * (NOPE + ROPE) * 2 + attended * PYPTO_ROW_BYTES + t * nq * NOPE * 2,
    }
    stages = {k: {"flop": int(v["flop"]), "bytes": int(v["bytes"])} for k, v in stages.items()}
    return {"flop": sum(v["flop"] for v in stages.values()),
            "bytes": sum(v["bytes"] for v in stages.values()), "stages": stages}  # fmt: skip


# ----------------------------------------------------------------------------- record
#: the output kinds of the step's outputs (the rest: float)
_KINDS = {
    "q_norm": "codes",
    "index_q": "codes",
    "topk_indices": "ids",
    **{f: "cache" for f in ("kv_cache", "kr_cache", "kv_scale_cache", "k_cache")},
}
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="dsa_attention_step",
    calls=(
        Call("dsa_attention_step", "dsa_attention_step",
             tuple(Output(f, _KINDS.get(f, "float")) for f in STEP_FIELDS),
             signature=(step_inputs, step_keywords), judged_by="stages", device=True),
        # the step entered at the indexer: its stages' outputs under their ops' own names,
        # judged by the indexer's plan (ids first, then the attention)
        Call("dsa_decode_step", "dsa_attention_step",
             idx_contract.RECORD.call("dsa_indexer").outputs
             + attn_contract.RECORD.call("sparse_attention_antiquant").outputs,
             signature=(decode_step_inputs,), judged_by="indexer"),
    ),
    cost=cost,
    names={"AttentionStepResult": "dsa_attention_step"},
    int_checks=check_int_values,
    scan_checks=check_data_values,
)  # fmt: skip


__all__ = [
    "RECORD",
    "AttentionStepResult",
    "ATTENTION_NAMES",
    "DECODE_LAYOUTS",
    "DECODE_OUTPUTS",
    "DECODE_STAGES",
    "DECODE_START",
    "HEADS",
    "INPUT_NAMES",
    "IPROLOG_NAMES",
    "KEYWORD_NAMES",
    "PATHS",
    "PATH_WEIGHTS",
    "STAGES",
    "STAGE_NAMES",
    "STAGE_OF",
    "STEP_FIELDS",
    "Args",
    "Stage",
    "Plan",
    "check_data_values",
    "check_int_values",
    "check_latent_blocks",
    "check_decode_meta",
    "check_decode_step",
    "check_meta",
    "check_values",
    "cost",
    "decode_caches",
    "decode_step_inputs",
    "decode_upstream",
    "host_plan",
    "iprolog_namespace",
    "iprolog_switches",
    "latent_views",
    "mla_namespace",
    "mla_switches",
    "stage",
    "step_inputs",
    "step_keywords",
]
