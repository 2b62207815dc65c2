"""DeepSeek-V3.2 attention layer step on Ascend: the four stage kernels launched one after the
other, every stage's device outputs fed to the next as tensors.

Same arguments as the golden :func:`tilesim.reference.dsa_attention_step` (contract:
:mod:`tilesim.shared.dsa_attention_step`, the same ``check_meta`` and value checks with the same
messages), plus ``backend`` / ``soc`` / ``validate``; NumPy arrays or torch tensors in, the same
kind out (:mod:`tilesim.device.backend`). Returns the golden's
:class:`~tilesim.shared.dsa_attention_step.AttentionStepResult` (one field per stage output,
:data:`~tilesim.shared.dsa_attention_step.STEP_FIELDS`), the caches as updated copies::

    x ─ mla_prolog kernel ─────────► query_nope, query_rope, q_norm, q_norm_scale,
                                      kv_cache / kr_cache / kv_scale_cache copies
    x, q_norm ─ dsa_indexer_prolog kernel ─► index_q, index_q_scale, index_weights,
                                      k_cache / k_scale copies
    index_q, ..., new index cache ─ dsa_indexer kernel ─► topk_indices, scores
    ids, queries, new latent cache ─ sparse attention kernel (kv_split) ─► attn_out

Each stage is its op's public wrapper (:mod:`tilesim.device.mla_prolog`,
:mod:`~tilesim.device.dsa_indexer_prolog`, :mod:`~tilesim.device.dsa_indexer`,
:mod:`~tilesim.device.dsa`), so each compiles once per model configuration under its own
compile key (:func:`tilesim.device.compile_stats`) and the step adds none. PyPTO 0.2.0 runs
four separate launches: the step's cost is the sum of the four kernels' cost-model times
(:func:`run_stages` returns them by stage). Between the stages nothing goes to the host: the
stages are called with ``validate=False`` (the step checked every input before the first
launch), so the indexer's ids reach the attention kernel's index plan on the device
(:func:`tilesim.shared.layouts.dsa_kernel_index.kernel_indices_torch`). That plan is the
attention's unmasked build (no skip columns) when every query row sees at least ``topk`` keys
-- the indexer then fills every id with a position, no ``-1`` -- and the masked build
otherwise: a host decision from the ``seq_lens`` the step's checks or slot rule already
copied (:func:`attention_unmasked`; a caller's ``slot_mapping`` with ``validate=False``
reads no length: masked). What PyPTO reads on
the host is each kernel's ``ready_on_host`` inputs, all of them the caller's or the host slot
rule's: the slots (both prologs), ``block_table`` and ``seq_lens`` (indexer, attention)
(:func:`tilesim.device._dsa_attention_step_kernel.ready_on_host`).

What the kernels cover (every other value: ``ValueError`` before any work, naming the step's
argument, :func:`check_kernel_limits`): ``path="int8"`` with the MLA prolog kernel's switches
(``rope_pairing="deinterleave"``, ``rms_form`` ``"gym_golden"`` / ``"gym_kernel"``,
``kv_quant="int8_gym"``, ``cache_layout="kv_split"``), the indexer prolog's ``"halves"`` RoPE
and a K tile ``index_k_tile`` of its linears (at most 1024 rows dividing ``H``; DeepSeek's
7168 needs one: 1024), the indexer's ``int8_order="gym"`` in decode rows (``q_lens=None``,
``topk`` a multiple of 32), and the attention's tiling with ``g_tile`` dividing the 128 heads.
``path="fp8"`` on a SoC with FP8 (the 950): FP8 E4M3 ``w_dq``, ``w_uq_qr``, ``w_dkv_kr`` and
the MLA prolog's FP8 kernel switches (``rope_pairing="interleaved"``, ``rms_form="deepseek"``,
``kv_quant="fp8_ue8m0_deepseek"``, ``cache_layout="kv_split"``,
``fp8_promotion="two_roundings"``, :data:`tilesim.device.mla_prolog.FP8_KERNEL_SWITCHES`),
``ue8m0=True`` and a ``block_size`` multiple of 32 (the 132-byte FP8 index pages), the same
``index_k_tile``; the attention then reads the FP8 kv_split triple.

``validate``: ``True`` (default) runs the contract's integer checks (``seq_lens``,
``q_lens``, the visible blocks of ``block_table``, the slots, every visible block inside the
latent cache; ``check_int_values``), ``"full"`` every value check of the golden too (finite
activations, every weight of both prologs, the index cache's read tokens), ``False``
metadata only (the slots are still derived on the host from ``block_table``; a bad table is
then undefined behaviour). No argument is written.
"""

from __future__ import annotations

import inspect
import types

import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._dsa_indexer_prolog_kernel import MAX_K_TILE
from tilesim.device.dsa import sparse_attention_antiquant, sparse_attention_antiquant_kv_split
from tilesim.device.dsa_indexer import ALIGN, dsa_indexer
from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog
from tilesim.device.mla_prolog import kernel_switches, mla_prolog
from tilesim.shared import dsa_attention_step as contract
from tilesim.shared.dsa_attention_step import (
    INPUT_NAMES,
    STAGE_NAMES,
    STEP_FIELDS,
    AttentionStepResult,
)
from tilesim.shared.layouts.index_cache import FP8_BLOCK_ALIGN
from tilesim.shared.layouts.mla_cache import NOPE, ROPE, is_packed
from tilesim.shared.layouts.slots import slots_from_block_table
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.soc import DEFAULT_SOC, require_fp8
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import host_ints

#: the device-only keywords (the rest of the signature is the golden's)
DEVICE_KEYWORDS = ("backend", "soc", "validate")


# ----------------------------------------------------------------------------- kernel limits
def _refuse(name: str, supports: str, got) -> None:
    raise ValueError(
        f"{name}: the device step's stage kernels implement {supports}, got {got!r}; the golden "
        "covers the rest (tilesim.reference.dsa_attention_step)"
    )


def _check_mla_limits(a) -> None:
    """The MLA prolog kernel of the path (:func:`tilesim.device.mla_prolog.kernel_switches`):
    its linears (an FP8 step takes FP8 ``w_dq``, ``w_uq_qr`` and ``w_dkv_kr``), its switches
    as the step resolved them (``None``: the path's default)."""
    table = kernel_switches(a.mla)
    weights = {"q_a": "w_dq", "q_b": "w_uq_qr", "kv_a": "w_dkv_kr"}
    for linear, want in table["linears"].items():
        if a.mla.linears[linear] != want:
            _refuse(weights[linear], f"a {want} {linear} linear in the MLA prolog",
                    a.mla.linears[linear])  # fmt: skip
    for name in ("rope_pairing", "rms_form", "kv_quant", "cache_layout", "fp8_promotion"):
        got, ok = getattr(a.mla, name), table.get(name)
        if ok is not None and got not in ok:
            _refuse(name, f"{ok} in the MLA prolog ({a.path} path)", got)


def _check_fp8_index_limits(a) -> None:
    """The FP8 indexer prolog's and indexer's: UE8M0 scales, pages of whole code rows."""
    if not a.ins.ue8m0:
        _refuse("ue8m0", "UE8M0 scales (True) in the FP8 indexer prolog", a.ins.ue8m0)
    if a.indexer.block_size % FP8_BLOCK_ALIGN:
        _refuse("block_size", f"a multiple of {FP8_BLOCK_ALIGN} on the FP8 path (index pages "
                "of whole code rows)", a.indexer.block_size)  # fmt: skip


def _check_index_limits(a) -> None:
    """The indexer prolog's RoPE and K tile, the indexer's rounding order, rows and ``topk``."""
    ins = a.ins
    if ins.index_rope_pairing != "halves":
        _refuse("index_rope_pairing", "'halves' in the indexer prolog", ins.index_rope_pairing)
    hidden, kt = a.iprolog.hidden, ins.index_k_tile
    if kt is None and hidden > MAX_K_TILE or kt is not None and (
            kt > MAX_K_TILE or hidden % kt):  # fmt: skip
        _refuse("index_k_tile", f"a K tile <= {MAX_K_TILE} dividing H = {hidden} in the "
                "indexer prolog (x @ w_k, x @ w_proj; 1024 at DeepSeek's H = 7168, judged "
                "against the golden with the same index_k_tile)", kt)  # fmt: skip
    if a.path == "int8" and ins.int8_order != "gym":
        _refuse("int8_order", "'gym' in the indexer", ins.int8_order)
    if ins.q_lens is not None:
        _refuse("q_lens", "decode rows only (q_lens=None, s1 = T // B) in the indexer",
                "an array")  # fmt: skip
    if a.indexer.topk % ALIGN:
        _refuse("topk", f"a multiple of {ALIGN} in the indexer", a.indexer.topk)


def check_kernel_limits(a, soc: str) -> None:
    """Every switch value a stage kernel lacks, before any work (``ValueError`` naming the
    step's argument, the value and what the kernels implement): ``path`` (FP8 needs a SoC
    with FP8), the MLA prolog's linears and switches of the path, the indexer
    prolog's and the indexer's (:func:`_check_index_limits`), the attention's ``g_tile``.
    ``a``: the contract's checked :class:`~tilesim.shared.dsa_attention_step.Args`."""
    if a.path == "fp8":
        require_fp8(soc, "path", "'fp8'", "use path='int8', or soc='950' in the simulator")
        _check_fp8_index_limits(a)
    _check_mla_limits(a)
    _check_index_limits(a)
    g = a.attention.tiling.g_tile
    if a.attention.nq % g:
        _refuse("tiling", f"g_tile dividing the {a.attention.nq} heads in the attention", g)


# ----------------------------------------------------------------------------- checks
def _host_slots(a) -> tuple[np.ndarray, np.ndarray | None]:
    """``validate=False``: ``(slots, seq_lens)``, the slots the prologs write, derived on the
    host (their kernels read them there) by the one slot rule from ``block_table`` /
    ``seq_lens`` (decode: ``s1 = T // B`` new tokens per batch), with the host copy of
    ``seq_lens`` that rule read; or the caller's ``slot_mapping`` and ``None`` (no length
    read); unchecked."""
    if a.ins.slot_mapping is not None:
        return host_ints(a.ins.slot_mapping, "slot_mapping", ndim=1), None
    ia = a.indexer
    q_lens = np.full(ia.n_b, ia.s1, np.int64) if a.ins.q_lens is None else a.ins.q_lens
    lens = host_ints(a.ins.seq_lens, "seq_lens", ndim=1)
    return slots_from_block_table(a.ins.block_table, lens, q_lens=q_lens,
                                  block_size=ia.block_size), lens  # fmt: skip


def attention_unmasked(seq_lens, s1: int, topk: int) -> bool:
    """Whether the attention can run its unmasked build: every query token sees at least
    ``topk`` keys (its causal count ``seq_lens[b] - s1 + 1 + s``, ``s`` in ``0..s1-1``; the
    least is ``s = 0``), so the indexer fills all ``topk`` ids of every row with positions and
    writes no ``-1`` (docs/ops/dsa_indexer.md). ``seq_lens``: the host copy the step already
    holds (int ``[B]``), or ``None`` (none read: ``False``, the masked build)."""
    if seq_lens is None or s1 is None or len(seq_lens) == 0:
        return False
    return bool(np.min(np.asarray(seq_lens, dtype=np.int64)) - s1 + 1 >= topk)


def _checked(ins, validate) -> tuple:
    """``(a, unmasked)``: the contract's ``check_meta`` (the golden's), then the value checks
    ``validate`` asks for (:func:`tilesim.device.backend.value_checks` over the record's
    ``int_checks`` / ``scan_checks``; ``validate=False``: the host slots, unchecked), and the
    attention's build from the ``seq_lens`` those read on the host
    (:func:`attention_unmasked`; no other read)."""
    _backend.validate_level(validate)
    a = contract.check_meta(ins)
    a = _backend.value_checks(contract.RECORD, a, validate)
    lens = a.indexer.seq_lens if a.slots is not None else None
    if a.slots is None:
        slots, lens = _host_slots(a)
        a = a._replace(slots=slots)
    return a, attention_unmasked(lens, a.indexer.s1, a.indexer.topk)


# ----------------------------------------------------------------------------- the stages
def _call(fn, target, *args, **kwargs) -> tuple:
    """One stage wrapper called on ``target`` with ``validate=False`` (the step checked every
    input): ``(outputs, cost_us)`` on the simulator, ``(outputs, None)`` on the NPU."""
    out = fn(*args, **kwargs, backend=target.backend, soc=target.soc, validate=False)
    return out if target.sim else (out, None)


def _mla_stage(a, t, up, target) -> tuple:
    ns = contract.mla_namespace(t, up["slots"])
    res, us = _call(mla_prolog, target, **vars(ns), **contract.mla_switches(a.ins))
    return dict(zip(contract.stage("mla_prolog").outputs, res, strict=True)), us


def _iprolog_stage(a, t, up, target) -> tuple:
    qs = up["q_norm_scale"] if a.path == "int8" else None
    ns = contract.iprolog_namespace(t, up["slots"], up["q_norm"], qs)
    res, us = _call(dsa_indexer_prolog, target, **vars(ns), **contract.iprolog_switches(a.ins))
    return dict(zip(contract.stage("dsa_indexer_prolog").outputs, res, strict=True)), us


def _indexer_stage(a, t, up, target) -> tuple:
    int8, ia = a.path == "int8", a.indexer
    (ids, scores), us = _call(
        dsa_indexer, target, up["index_q"], up["index_weights"], up["k_cache"], t.block_table,
        t.seq_lens, q_scale=up["index_q_scale"] if int8 else None,
        k_scale=up["k_scale"] if int8 else None, path=a.path, int8_order=ia.int8_order,
        topk=ia.topk, block_size=ia.block_size,
    )  # fmt: skip
    return {"topk_indices": ids, "scores": scores}, us


def _attention_stage(a, t, up, target) -> tuple:
    """The sparse attention on the indexer's ids, the MLA prolog's queries (``[T*nq, d]``
    views) and its latent cache copies (2-D views); ``attn_out`` ``[T, nq, 512]``."""
    rows, nq, ia = a.tokens * a.attention.nq, a.attention.nq, a.indexer
    caches = contract.latent_views(a.layout, up["kv_cache"], up["kr_cache"], up["kv_scale_cache"])
    fn = sparse_attention_antiquant if is_packed(a.layout) else sparse_attention_antiquant_kv_split
    extra = {"layout": a.layout} if is_packed(a.layout) else {}
    out, us = _call(fn, target, up["query_nope"].reshape(rows, NOPE),
                    up["query_rope"].reshape(rows, ROPE), *caches, up["topk_indices"],
                    t.block_table, t.seq_lens, nq=nq, softmax_scale=a.ins.softmax_scale,
                    topk=ia.topk, block_size=ia.block_size, tiling=a.ins.tiling,
                    unmasked=up["unmasked"], **extra)  # fmt: skip
    return {"attn_out": out.reshape(a.tokens, nq, NOPE)}, us


#: the runner of each stage (:data:`tilesim.shared.dsa_attention_step.STAGES`' order)
_RUNNERS = {"mla_prolog": _mla_stage, "dsa_indexer_prolog": _iprolog_stage,
            "dsa_indexer": _indexer_stage, "sparse_attention": _attention_stage}  # fmt: skip


def _launch_stages(a, target, unmasked: bool = False) -> tuple[dict, dict]:
    """Every stage in order on torch tensors (the caller's as zero-copy views); ``unmasked``:
    the attention's build (:func:`attention_unmasked`). Returns ``({step output: tensor},
    {stage: cost_us or None})``."""
    t = types.SimpleNamespace(**dict(zip(INPUT_NAMES, _backend.to_tensors(
        *(getattr(a.ins, n) for n in INPUT_NAMES)), strict=True)))  # fmt: skip
    (slots,) = _backend.to_tensors(np.asarray(a.slots, dtype=np.int64))
    up, costs = {"slots": slots.to(t.x.device), "unmasked": unmasked}, {}
    for name in STAGE_NAMES:
        outs, costs[name] = _RUNNERS[name](a, t, up, target)
        up.update(outs)
    return up, costs


def _result(up: dict, target) -> AttentionStepResult:
    """The step's result from the stage outputs (``None`` where a stage returns none; NumPy
    copies for NumPy input)."""
    vals = [up.get(f) for f in STEP_FIELDS]
    if target.numpy_io:
        from tilesim.shared.interop import to_numpy

        vals = [None if v is None else to_numpy(v).copy() for v in vals]
    return AttentionStepResult(*vals)


# ----------------------------------------------------------------------------- public
def _prepared(ins, backend: str, soc: str, validate):
    """``(a, target, unmasked)``: the contract's checks and the attention's build
    (:func:`_checked`), the call's target, the kernels' limits; nothing launched (each stage's
    wrapper configures the simulator)."""
    a, unmasked = _checked(ins, validate)
    target = _backend.resolve(backend, soc, ins.x, configure=False)
    check_kernel_limits(a, target.soc)
    return a, target, unmasked


def run_stages(arguments: dict) -> tuple[AttentionStepResult, dict]:
    """One call of :func:`dsa_attention_step` (``arguments``: its arguments by name, the
    device keywords included; absent ones take their defaults) returning ``(result, {stage:
    cost_us})``: the four launches' cost-model times in µs (``None`` on the NPU). The layer's
    figure is their sum (PyPTO runs four separate launches)."""
    bound = _SIGNATURE.bind(**arguments)
    bound.apply_defaults()
    call = dict(bound.arguments)
    backend, soc, validate = (call.pop(k) for k in DEVICE_KEYWORDS)
    a, target, unmasked = _prepared(types.SimpleNamespace(**call), backend, soc, validate)
    up, costs = _launch_stages(a, target, unmasked)
    return _result(up, target), costs


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
                       index_k_tile: int | None = None, backend: str = "auto",
                       soc: str = DEFAULT_SOC, validate=True):  # fmt: skip
    """One attention layer step on the device: MLA prolog -> indexer prolog -> indexer ->
    sparse attention, four kernels, each stage's outputs fed to the next on the device
    (module docstring; ``docs/ops/dsa_attention_step.md``, "Kernel").

    Arguments as :func:`tilesim.reference.dsa_attention_step` (the arrays of
    :func:`tilesim.shared.dsa_attention_step.step_inputs`, the switches of
    :func:`~tilesim.shared.dsa_attention_step.step_keywords`), checked by the same contract
    with the same messages before any work; a switch value a stage kernel lacks is a
    ``ValueError`` naming it (:func:`check_kernel_limits`: INT8 path, ``index_k_tile`` 1024
    at ``H = 7168``, decode rows). Device-only keywords: ``backend`` (``"npu"``, ``"sim"``
    or ``"auto"``), ``soc`` (the simulator's target, ``"910b"`` or ``"950"``) and
    ``validate`` (``True``: the integer checks; ``"full"``: every value check of the golden;
    ``False``: metadata only).

    Returns :class:`~tilesim.shared.dsa_attention_step.AttentionStepResult` (every stage's
    outputs under the step's names, bit for bit the golden's with the same switches in the
    simulator; the caches updated copies in the caller's shapes; NumPy for NumPy input);
    with ``backend="sim"`` the pair ``(result, cost_us)``, ``cost_us`` the sum of the four
    launches' cost-model times (:func:`run_stages` gives them by stage). Inputs are never
    modified.
    """
    res, costs = run_stages(dict(locals()))
    if costs["mla_prolog"] is None:
        return res
    return res, float(sum(costs.values()))


_SIGNATURE = inspect.signature(dsa_attention_step)


__all__ = [
    "DEVICE_KEYWORDS",
    "attention_unmasked",
    "check_kernel_limits",
    "dsa_attention_step",
    "run_stages",
]
