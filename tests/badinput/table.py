"""The valid base call of every public op / builder / helper / device wrapper, and the role of
each argument (what a corruption may do to it).

Base inputs are tiny (a few KB; the MSA ops keep their fixed 128-wide heads) so the whole grid
runs in seconds: a rejected call does no work, and the only full calls are one control per op
and the torch / non-contiguous equivalence checks of the reference ops and helpers. The
DeepSeek-V3.2 layer ops (MLA prolog, layer step) keep the model's fixed weights (up to 100 MB
per case, built once per worker): their arrays of 1 MiB and more are frozen read-only and
shared between cells (``_frozen``), and their equivalence checks are left out (``full=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3

from badinput.corrupt import FROZEN_BYTES

N_MOE = 5  # rows of the MoE case
DSA_BS, DSA_TOPK = 16, 16


@dataclass(frozen=True)
class Arg:
    """One argument of an op.

    role: ``data`` (an array of a fixed dtype), ``real`` (any real dtype), ``index``,
        ``length``, ``mask`` (finite FP32), ``out`` (written in place), ``int``, ``scale``
        (an FP32 scalar), ``float``, ``flag``, ``mode``, ``trace``, ``object`` (a config
        instance), ``seq`` (a sequence of ints).
    names: the message must contain one of them.
    """

    role: str
    names: tuple[str, ...]
    bad_dtype: object = None
    fixed_rank: bool = True
    fixed_shape: bool = True
    oob: object = None  #: an out-of-range value (first element for arrays)
    optional: bool = False  #: ``None`` is a valid value
    huge: bool = True  #: ``2**40`` is out of range for this int
    int32_only: bool = False  #: only INT32 is taken: a widened copy is a dtype error
    contiguous: bool = False  #: a kernel writes it in place: a strided view is refused
    finite: bool = False  #: float data whose every value must be finite (checked before work)


@dataclass(frozen=True)
class Op:
    name: str
    fn: Callable
    base: Callable[[], dict]
    args: dict = field(default_factory=dict)  #: key: argument, or ``"arg.i"`` for a tuple item
    work: tuple = ()  #: ``(path suffix, function name)`` of the op's work: never reached
    device: bool = False
    full: bool = True  #: the base call is cheap enough for the torch / layout checks
    #: the wrapper has a shape-only mode (``meta`` / FakeTensor inputs give empty outputs)
    meta: bool = True


def A(role, *names, **kw) -> Arg:
    return Arg(role, names, **kw)


def data(*names, bad=np.int32, **kw):
    return Arg("data", names, bad_dtype=bad, **kw)


TRACE = A("trace", "trace")


# ----------------------------------------------------------------------------- base inputs
def _inputs(case) -> dict:
    return {**case["inputs"], **case["params"]}


@cache
def _moe_case():
    from tilesim.reference import moe_make_case

    return moe_make_case(None, seed=1, num_experts=2, hidden_size=64, intermediate_size=32,
                         counts=(2, 3))  # fmt: skip


def moe_base() -> dict:
    kw = _inputs(_moe_case())
    return {**kw, "out": np.zeros((N_MOE, 64), BF16)}


@cache
def _msa_case(op):
    from tilesim.reference import msa_make_case

    if op == "msa_indexer":
        return msa_make_case(None, op=op, seed=1, nb=3, seq_len=300)
    if op == "msa_sparse_decode":
        return msa_make_case(None, op=op, seed=1, nb=2, seq_len=200, select="random")
    return msa_make_case(None, op=op, seed=1, n=5, topk=2, bk=16, hq=2, hkv=1, dh=128, max_n=16)


def indexer_base() -> dict:
    return _inputs(_msa_case("msa_indexer"))


def decode_base() -> dict:
    return _inputs(_msa_case("msa_sparse_decode"))


def decode_array_base() -> dict:
    return {**decode_base(), "seq_len": np.array([200], np.int32)}


def main_base() -> dict:
    return _inputs(_msa_case("msa_main_branch"))


@cache
def _dsa_case(layout):
    from tilesim.reference import dsa_make_case
    from tilesim.shared.tiling import SaTileShapeConfig

    return dsa_make_case(None, seed=1, actual_seq=[20, 9], s1=1, nq=2, topk=DSA_TOPK,
                         block_size=DSA_BS, quant="int8", layout=layout,
                         tiling=SaTileShapeConfig(g_tile=2, s_kv_tile=16),
                         progress=False)  # fmt: skip


def dsa_base() -> dict:
    return _inputs(_dsa_case("pypto"))


def dsa_split_base() -> dict:
    return _inputs(_dsa_case("kv_split"))


@cache
def _iprolog_case(path):
    from tilesim.reference import dsa_indexer_prolog_make_case

    return dsa_indexer_prolog_make_case(None, path=path, hidden=256, rank=256, block_size=16,
                                        seq_lens=(5, 6), s1=1)  # fmt: skip


def iprolog_base(path: str) -> dict:
    """The DeepSeek indexer prolog at a small hidden size and rank (2 tokens, 2 blocks of 16)."""
    return _inputs(_iprolog_case(path))


@cache
def _iprolog_fp8_device_case():
    from tilesim.reference import dsa_indexer_prolog_make_case

    return dsa_indexer_prolog_make_case(None, path="fp8", hidden=256, rank=256, block_size=32,
                                        seq_lens=(5, 6), s1=1)  # fmt: skip


def iprolog_device_base(path: str) -> dict:
    """The indexer prolog's device base: the FP8 kernel's switches (``block_size`` a multiple
    of 32, ``fp8_promotion="two_roundings"``, the 950) on the FP8 path."""
    if path == "int8":
        return iprolog_base("int8")
    return {**_inputs(_iprolog_fp8_device_case()), "fp8_promotion": "two_roundings"}


# DeepSeek-V3.2 layer ops: the lightning indexer, the MLA prolog, the layer step and the
# decode step. Their weights have the model's fixed sizes (``x`` is ``[T, 7168]``, ``w_uq_qr``
# ``[1536, 24576]``: 100 MB per step case), so T, the batch and the caches are tiny instead.
#: block size and top-k of the indexer and the steps: the device kernels' multiples (the FP8
#: index pages of whole 128-byte rows, the top-k's 32-element sort groups)
LAYER_BS, LAYER_TOPK = 32, 32
LAYER_SEQ = (40, 9)  #: 2 + 1 blocks of 32
LAYER_BLOCKS = 3  #: physical blocks of the LAYER_SEQ caches (an out-of-range block id)
MLA_ROWS = 16  #: latent cache rows of the MLA prolog cases (1 block of 16)


def _frozen(case: dict) -> dict:
    """``case`` with its arrays of at least ``corrupt.FROZEN_BYTES`` read-only: the grid
    shares them between cells instead of copying them (``test_grid._fresh``) and snapshots
    them by their memory; a library that writes into one fails there."""
    for v in case["inputs"].values():
        if isinstance(v, np.ndarray) and v.nbytes >= FROZEN_BYTES:
            v.setflags(write=False)
    return case


@cache
def _idx_case(path: str, prefill: bool = False):
    from tilesim.reference import dsa_indexer_make_case

    rows = dict(q_lens=(2, 1)) if prefill else dict(s1=1)
    return dsa_indexer_make_case(None, seed=1, path=path, seq_lens=LAYER_SEQ, topk=LAYER_TOPK,
                                 block_size=LAYER_BS, ue8m0=path == "fp8", progress=False,
                                 **rows)  # fmt: skip


def idx_base(path: str) -> dict:
    """The lightning indexer in decode (2 batches, 1 row each, 40 / 9 cached tokens)."""
    return _inputs(_idx_case(path))


def idx_prefill_base() -> dict:
    """The INT8 indexer with ``q_lens`` (prefill rows: 2 + 1)."""
    return _inputs(_idx_case("int8", True))


@cache
def _mla_case(path: str):
    from tilesim.reference import mla_prolog_make_case

    # FP8: the kv_split triple (the FP8 kernel's cache form; the packed row is the step's)
    layout = dict(cache_layout="kv_split") if path == "fp8" else {}
    return _frozen(mla_prolog_make_case(None, seed=1, path=path, b=1, s1=2, seq_lens=(2,),
                                        block_size=MLA_ROWS, **layout))  # fmt: skip


def mla_base(path: str) -> dict:
    """The MLA prolog: 2 tokens, one cache block of 16 rows."""
    return _inputs(_mla_case(path))


def _layer_tiling():
    from tilesim.shared.tiling import SaTileShapeConfig

    return SaTileShapeConfig(g_tile=128, s_kv_tile=32)  # g_tile divides the 128 heads


@cache
def _step_case(path: str):
    from tilesim.reference import dsa_attention_step_make_case

    return _frozen(dsa_attention_step_make_case(
        None, seed=1, path=path, seq_lens=LAYER_SEQ, s1=1, block_size=LAYER_BS, topk=LAYER_TOPK,
        progress=False))  # fmt: skip


def step_base(path: str) -> dict:
    """The layer step: INT8 with the kv_split latent cache, FP8 with packed 656-byte rows."""
    return {**_inputs(_step_case(path)), "tiling": _layer_tiling()}


def step_slots_base() -> dict:
    """The INT8 step with ``slot_mapping`` given (the block table's own slots)."""
    return {**step_base("int8"), "slot_mapping": _step_case("int8")["meta"]["slots"].copy()}


def step_q_lens_base() -> dict:
    """The INT8 step with ``q_lens`` given (one new token per batch, as decode)."""
    return {**step_base("int8"), "q_lens": np.ones(len(LAYER_SEQ), np.int32)}


@cache
def _decode_step_case(path: str):
    from tilesim.reference import dsa_attention_step_make_case

    layout = "kv_split" if path == "int8" else "pypto"
    return _frozen(dsa_attention_step_make_case(
        None, seed=1, op="dsa_decode_step", path=path, seq_lens=LAYER_SEQ, s1=1,
        topk=LAYER_TOPK, block_size=LAYER_BS, ue8m0=path == "fp8", attn_quant=path,
        layout=layout, progress=False))  # fmt: skip


def decode_step_base(path: str) -> dict:
    """The step entered at the indexer: INT8 kv_split attention, FP8 packed rows."""
    return {**_inputs(_decode_step_case(path)), "tiling": _layer_tiling()}


# ----------------------------------------------------------------------------- reference ops
MOE_ARGS = {
    "sorted_tokens": data("sorted_tokens"),
    "weights.0": data("w13_flat", "weights"),
    "weights.1": data("w2_flat", "weights"),
    "expert_cumsum": A("length", "expert_cumsum", oob=N_MOE + 1, int32_only=True),
    "dims": A("object", "dims"),
    "tiling": A("object", "tiling", optional=True),
    "out": A("out", "out", bad_dtype=np.float32, optional=True),
    "round_activation": A("flag", "round_activation"),
    "trace": TRACE,
}
INDEXER_ARGS = {
    "idx_q": data("idx_q"),
    "idx_k": data("idx_k"),
    "nb": A("int", "nb", oob=4),
    "seq_len": A("int", "seq_len", oob=3 * 128 + 1, optional=True),
    "head_reduce": A("mode", "head_reduce"),
    "trace": TRACE,
}
DECODE_ARGS = {
    "q": data("q"),
    "k_blocks": data("k_blocks"),
    "v_blocks": data("v_blocks"),
    "block_ids": A("index", "block_ids", oob=2, fixed_shape=False),
    "seq_len": A("int", "seq_len", oob=2 * 128 + 1),
    "tiling": A("object", "tiling", optional=True),
    "seeds_compat": A("flag", "seeds_compat"),
    "trace": TRACE,
}
DECODE_ARRAY_ARGS = {"seq_len": A("length", "seq_len", oob=2 * 128 + 1)}
MAIN_ARGS = {
    "query": data("query"),
    "key_blocks": data("key_blocks"),
    "value_blocks": data("value_blocks"),
    "block_mask": A("mask", "block_mask", bad_dtype=np.int32),
    "dtype": A("mode", "dtype", optional=True),
    "max_n": A("int", "max_n", oob=8, optional=True),
    "tiling": A("object", "tiling", optional=True),
    "seeds_compat": A("flag", "seeds_compat"),
    "trace": TRACE,
}
DSA_COMMON = {
    "query_nope": data("query_nope", bad=np.float32),
    "query_rope": data("query_rope", bad=np.float32),
    "topk_indices": A("index", "topk_indices", oob=10**6),
    "block_table": A("index", "block_table", oob=3, fixed_shape=False),
    "kv_act_seqs": A("length", "kv_act_seqs", oob=2 * DSA_BS + 1),
    "nq": A("int", "nq", oob=3),
    "n_kv": A("int", "n_kv", oob=2),
    "softmax_scale": A("scale", "softmax_scale"),
    "topk": A("int", "topk", oob=DSA_TOPK + 1),
    "block_size": A("int", "block_size", oob=8),
    "tiling": A("object", "tiling", optional=True),
}
DSA_REF = {"trace": TRACE, "progress": A("flag", "progress", optional=True),
           "accumulation": A("mode", "accumulation")}  # fmt: skip
DSA_PACKED = {
    "nope_cache": data("nope_cache", bad=np.int16),
    "layout": A("mode", "layout"),
}
DSA_SPLIT = {
    "kn_quant": data("kn_quant", bad=np.int16),
    "kr": data("kr", bad=np.float32),
    "kn_scales": data("kn_scales", bad=np.float64),
}

#: the indexer prolog's arguments; ``x`` and ``q_norm`` set T, H and R (a cut last axis is a
#: shape error of the weight that must match it), so their shapes are free here
IPROLOG_COMMON = {
    "x": data("x", fixed_shape=False, finite=True),
    "q_norm": data("q_norm", bad=np.int16, fixed_shape=False, finite=True),
    "w_qb": data("w_qb", bad=np.int16, finite=True),
    "w_k": data("w_k", finite=True),
    "w_proj": data("w_proj", finite=True),
    "ln_gamma": data("ln_gamma", finite=True),
    "ln_beta": data("ln_beta", finite=True),
    "cos": data("cos", finite=True),
    "sin": data("sin", finite=True),
    "w_qb_scale": data("w_qb_scale", finite=True),
    "slot_mapping": A("index", "slot_mapping", oob=32),
    "path": A("mode", "path"),
    "rope_pairing": A("mode", "rope_pairing"),
    "block_size": A("int", "block_size"),
    "trace": TRACE,
}
IPROLOG_INT8 = {
    "k_cache": data("k_cache", bad=np.float32),
    "k_scale": data("k_scale", bad=np.float32),
    "q_norm_scale": data("q_norm_scale", finite=True),
    "hadamard_q": data("hadamard_q", finite=True),
    "hadamard_k": data("hadamard_k", finite=True),
}
IPROLOG_FP8 = {
    "k_cache": data("k_cache", bad=np.int8),
    "w_k_scale": data("w_k_scale", finite=True),
    "ue8m0": A("flag", "ue8m0"),
}

#: the indexer prolog's scalar keywords (``shared/dsa_indexer_prolog.py``, ``prolog_keywords``)
IPROLOG_KW = {
    "ue8m0": A("flag", "ue8m0"),  # checked on both paths
    "eps": A("scale", "eps"),
    "amax_floor": A("scale", "amax_floor", optional=True),
    "fp8_promotion": A("mode", "fp8_promotion"),
    "k_tile": A("int", "k_tile", optional=True),
}

#: the lightning indexer (``shared/dsa_indexer.py``); a cut ``block_table`` is a narrower
#: table (then ``seq_lens`` is out of range), so its shape is free here
IDX_COMMON = {
    "q": data("q", finite=True),  # FP8: no NaN code (INT8 codes are all valid)
    "weights": data("weights", finite=True),
    "block_table": A("index", "block_table", oob=LAYER_BLOCKS, fixed_shape=False),
    "seq_lens": A("length", "seq_lens", oob=2 * LAYER_BS + 1),
    "path": A("mode", "path"),
    "int8_order": A("mode", "int8_order"),
    "topk": A("int", "topk"),
    "block_size": A("int", "block_size"),
}
IDX_INT8 = {
    "q_scale": data("q_scale", bad=np.float32, finite=True),
    "k_cache": data("k_cache", bad=np.float32),
    "k_scale": data("k_scale", bad=np.float32, finite=True),
}
IDX_FP8 = {"k_cache": data("k_cache", bad=np.int8)}
IDX_Q_LENS = {"q_lens": A("length", "q_lens", oob=LAYER_SEQ[0] + 1, optional=True)}
LAYER_REF = {"trace": TRACE, "progress": A("flag", "progress", optional=True)}

#: the MLA prolog (``shared/mla_prolog.py``)
MLA_COMMON = {
    "x": data("x", finite=True),
    "w_uk": data("w_uk", finite=True),
    "gamma_cq": data("gamma_cq", finite=True),
    "gamma_ckv": data("gamma_ckv", finite=True),
    "cos": data("cos", finite=True),
    "sin": data("sin", finite=True),
    "slot_mapping": A("index", "slot_mapping", oob=MLA_ROWS),
    "kv_cache": data("kv_cache", bad=np.float32),
    "kr_cache": data("kr_cache", bad=np.float32),
    "kv_scale_cache": data("kv_scale_cache", bad=np.float64),
    "path": A("mode", "path"),
    "rope_pairing": A("mode", "rope_pairing", optional=True),
    "rms_form": A("mode", "rms_form", optional=True),
    "rms_eps": A("scale", "rms_eps", optional=True),
    "kv_quant": A("mode", "kv_quant", optional=True),
    "cache_layout": A("mode", "cache_layout", optional=True),
    "fp8_promotion": A("mode", "fp8_promotion"),
}
MLA_INT8 = {
    "w_dq": data("w_dq", finite=True),
    "w_uq_qr": data("w_uq_qr"),
    # [N], [N, 1] and [1, N] are all per-channel scales: a leading axis is no error
    "w_uq_qr_scale": data("w_uq_qr_scale", bad=np.float64, fixed_rank=False, finite=True),
    "w_dkv_kr": data("w_dkv_kr", finite=True),
}
MLA_FP8 = {
    name: data(name, bad=np.float64 if name.endswith("_scale") else np.int32, finite=True)
    for name in ("w_dq", "w_dq_scale", "w_uq_qr", "w_uq_qr_scale", "w_dkv_kr", "w_dkv_kr_scale")
}

#: the layer step (``shared/dsa_attention_step.py``): every stage's arrays and switches
STEP_COMMON = {
    **{k: v for k, v in MLA_COMMON.items() if k not in ("slot_mapping", "kv_cache", "kr_cache",
                                                        "kv_scale_cache")},
    "block_table": IDX_COMMON["block_table"],
    "seq_lens": IDX_COMMON["seq_lens"],
    "w_qb": data("w_qb", bad=np.int16, finite=True),
    "w_k": data("w_k", finite=True),
    "w_proj": data("w_proj", finite=True),
    "ln_gamma": data("ln_gamma", finite=True),
    "ln_beta": data("ln_beta", finite=True),
    "index_rope_pairing": A("mode", "index_rope_pairing"),
    "ln_eps": A("scale", "ln_eps"),
    "ue8m0": A("flag", "ue8m0"),
    "amax_floor": A("scale", "amax_floor", optional=True),
    "int8_order": A("mode", "int8_order"),
    "topk": A("int", "topk"),
    "block_size": A("int", "block_size"),
    "softmax_scale": A("scale", "softmax_scale"),
    "tiling": A("object", "tiling", optional=True),
    "index_k_tile": A("int", "index_k_tile", optional=True),
}  # fmt: skip
STEP_INT8 = {
    **MLA_INT8,
    "kv_cache": data("kv_cache", bad=np.float32),
    "kr_cache": data("kr_cache", bad=np.float32),
    "kv_scale_cache": data("kv_scale_cache", bad=np.float64),
    "k_cache": data("k_cache", bad=np.float32),
    "k_scale": data("k_scale", bad=np.float32, finite=True),
    "w_qb_scale": data("w_qb_scale", finite=True),
    "hadamard_q": data("hadamard_q", finite=True),
    "hadamard_k": data("hadamard_k", finite=True),
}
STEP_FP8 = {
    **MLA_FP8,
    "kv_cache": data("kv_cache", bad=np.float32),
    "k_cache": data("k_cache", bad=np.int8),
    "w_qb_scale": data("w_qb_scale", finite=True),
    "w_k_scale": data("w_k_scale", finite=True),
}
#: ``None`` is valid for both: the block table's slots, decode rows
STEP_SLOTS = {"slot_mapping": A("index", "slot_mapping", oob=LAYER_BLOCKS * LAYER_BS,
                                optional=True)}  # fmt: skip
STEP_Q_LENS = {"q_lens": A("length", "q_lens", oob=2, optional=True)}

#: the decode step (``dsa_decode_step``: the indexer's arguments, the attention's)
DECODE_STEP_COMMON = {
    **IDX_COMMON,
    "query_nope": data("query_nope", bad=np.float32),
    "query_rope": data("query_rope", bad=np.float32),
    "layout": A("mode", "layout"),
    "nq": A("int", "nq"),
    "softmax_scale": A("scale", "softmax_scale"),
    "tiling": A("object", "tiling", optional=True),
    **LAYER_REF,
}
DECODE_STEP_INT8 = {**IDX_INT8, **DSA_SPLIT}
DECODE_STEP_FP8 = {**IDX_FP8, "nope_cache": DSA_PACKED["nope_cache"]}

_REF = "reference/"
WORK = {
    "moe": (
        (_REF + "_moe_fast.py", "run"),
        (_REF + "moe.py", "_expert_ffn"),
        (_REF + "moe.py", "_deliver"),
    ),  # fmt: skip
    "indexer": ((_REF + "msa_indexer.py", "_scores"),),
    "decode": ((_REF + "msa_decode.py", "_run"),),
    "main": ((_REF + "msa_main.py", "_plan"), (_REF + "msa_main.py", "_run")),
    "dsa": (
        (_REF + "util/progress.py", "progress_bar"),
        (_REF + "dsa.py", "token"),
    ),  # after the plan
    "iprolog": (
        (_REF + "dsa_indexer_prolog.py", "_queries"),
        (_REF + "dsa_indexer_prolog.py", "_keys"),
    ),  # fmt: skip
    "dsa_indexer": (
        (_REF + "dsa_indexer.py", "indexer_from_args"),
        (_REF + "dsa_indexer.py", "dsa_indexer_scores"),
    ),  # fmt: skip
    "mla_prolog": (
        (_REF + "mla_prolog.py", "prolog_from_args"),
        (_REF + "mla_prolog.py", "_queries"),
    ),  # fmt: skip
    "step": (
        (_REF + "dsa_attention_step.py", "_run"),
        (_REF + "mla_prolog.py", "prolog_from_args"),
        (_REF + "dsa_indexer_prolog.py", "prolog_from_args"),
        (_REF + "dsa_indexer.py", "indexer_from_args"),
        (_REF + "dsa.py", "token"),
    ),  # fmt: skip
    "case": (("shared/registry/case_schema.py", "make_case"),),
    "device": (
        ("device/backend.py", "resolve"),
        ("device/backend.py", "to_tensors"),
        ("device/backend.py", "launch"),
    ),  # fmt: skip
}


def _ref(name):
    import tilesim.reference as ref

    return getattr(ref, name)


def reference_ops() -> list[Op]:
    R = _ref
    return [
        Op("moe_grouped_gemm", R("moe_grouped_gemm"), moe_base, MOE_ARGS, WORK["moe"]),
        Op("msa_indexer", R("msa_indexer"), indexer_base, INDEXER_ARGS, WORK["indexer"]),
        Op(
            "msa_indexer_scores",
            R("msa_indexer_scores"),
            lambda: {k: v for k, v in indexer_base().items() if k in ("idx_q", "idx_k", "nb")},
            {k: INDEXER_ARGS[k] for k in ("idx_q", "idx_k", "nb", "trace")},
            WORK["indexer"],
        ),  # fmt: skip
        Op(
            "msa_sparse_decode", R("msa_sparse_decode"), decode_base, DECODE_ARGS, WORK["decode"]
        ),  # fmt: skip
        Op(
            "msa_sparse_decode[seq_len array]",
            R("msa_sparse_decode"),
            decode_array_base,
            DECODE_ARRAY_ARGS,
            WORK["decode"],
        ),  # fmt: skip
        Op("msa_main_branch", R("msa_main_branch"), main_base, MAIN_ARGS, WORK["main"]),
        Op(
            "sparse_attention_antiquant",
            R("sparse_attention_antiquant"),
            dsa_base,
            {**DSA_COMMON, **DSA_REF, **DSA_PACKED},
            WORK["dsa"],
        ),  # fmt: skip
        Op(
            "sparse_attention_antiquant_kv_split",
            R("sparse_attention_antiquant_kv_split"),
            dsa_split_base,
            {**DSA_COMMON, **DSA_REF, **DSA_SPLIT},
            WORK["dsa"],
        ),  # fmt: skip
        Op(
            "dsa_indexer_prolog[int8]",
            R("dsa_indexer_prolog"),
            lambda: iprolog_base("int8"),
            {**IPROLOG_COMMON, **IPROLOG_INT8, **IPROLOG_KW},
            WORK["iprolog"],
        ),  # fmt: skip
        Op(
            "dsa_indexer_prolog[fp8]",
            R("dsa_indexer_prolog"),
            lambda: iprolog_base("fp8"),
            {**IPROLOG_COMMON, **IPROLOG_FP8, **IPROLOG_KW},
            WORK["iprolog"],
        ),  # fmt: skip
        *layer_ops(),
    ]


def layer_ops() -> list[Op]:
    """The DeepSeek-V3.2 layer ops. The MLA prolog and the layer step are ``full=False``: up
    to 100 MB of fixed-size weights in 20+ arrays make their torch / strided checks ~10 s."""
    R, w = _ref, WORK
    return [
        Op("dsa_indexer[int8]", R("dsa_indexer"), lambda: idx_base("int8"),
           {**IDX_COMMON, **IDX_INT8, **LAYER_REF}, w["dsa_indexer"]),
        Op("dsa_indexer[fp8]", R("dsa_indexer"), lambda: idx_base("fp8"),
           {**IDX_COMMON, **IDX_FP8, **LAYER_REF}, w["dsa_indexer"]),
        Op("dsa_indexer[q_lens]", R("dsa_indexer"), idx_prefill_base, IDX_Q_LENS,
           w["dsa_indexer"]),
        Op("mla_prolog[int8]", R("mla_prolog"), lambda: mla_base("int8"),
           {**MLA_COMMON, **MLA_INT8, "trace": TRACE}, w["mla_prolog"], full=False),
        Op("mla_prolog[fp8]", R("mla_prolog"), lambda: mla_base("fp8"),
           {**MLA_COMMON, **MLA_FP8, "trace": TRACE}, w["mla_prolog"], full=False),
        Op("dsa_attention_step[int8]", R("dsa_attention_step"), lambda: step_base("int8"),
           {**STEP_COMMON, **STEP_INT8, **LAYER_REF}, w["step"], full=False),
        Op("dsa_attention_step[fp8]", R("dsa_attention_step"), lambda: step_base("fp8"),
           {**STEP_COMMON, **STEP_FP8, **LAYER_REF}, w["step"], full=False),
        Op("dsa_attention_step[slot_mapping]", R("dsa_attention_step"), step_slots_base,
           STEP_SLOTS, w["step"], full=False),
        Op("dsa_attention_step[q_lens]", R("dsa_attention_step"), step_q_lens_base,
           STEP_Q_LENS, w["step"], full=False),
        Op("dsa_decode_step[int8]", R("dsa_decode_step"), lambda: decode_step_base("int8"),
           {**DECODE_STEP_COMMON, **DECODE_STEP_INT8}, w["step"]),
        Op("dsa_decode_step[fp8]", R("dsa_decode_step"), lambda: decode_step_base("fp8"),
           {**DECODE_STEP_COMMON, **DECODE_STEP_FP8}, w["step"]),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- builders
def _moe_builder_base():
    return dict(name=None, seed=1, num_experts=2, hidden_size=64, intermediate_size=32,
                counts=(2, 3), activation="silu", input_scale=1.0, weight_scale=0.0625,
                round_activation=True, gate_up_layout="halves", progress=False)  # fmt: skip


def _msa_builder_base(op):
    common = dict(name=None, op=op, seed=1, progress=False)
    if op == "msa_indexer":
        return {**common, "nb": 3, "seq_len": 300, "head_reduce": "max", "scale": 0.1}
    if op == "msa_sparse_decode":
        return {**common, "batch": 1, "nb": 2, "seq_len": 200, "select": "random",
                "scale": 0.05, "idx_scale": 0.1}  # fmt: skip
    return {**common, "n": 5, "max_n": 16, "dtype": "fp32", "topk": 2, "bk": 16, "hq": 2,
            "hkv": 1, "dh": 16}  # fmt: skip


def _dsa_builder_base():
    from tilesim.shared.tiling import SaTileShapeConfig

    return dict(name=None, seed=1, actual_seq=(20, 9), s1=1, nq=2, topk=DSA_TOPK,
                block_size=DSA_BS, softmax_scale=0.05, quant="int8", layout="pypto",
                topk_rule="seeds", invalid_frac=0.0, poison_unreached=False,
                tiling=SaTileShapeConfig(g_tile=2, s_kv_tile=16), progress=False)  # fmt: skip


SEED = A("int", "seed", oob=-1, huge=False)
SEED_OPT = A("int", "seed", oob=-1, huge=False, optional=True)  #: None: the case's own seed
PROGRESS = A("flag", "progress", optional=True)
NAME = A("mode", "name", optional=True)
BUILDER_ARGS = {
    "moe_make_case": {
        "name": NAME, "seed": SEED_OPT, "progress": PROGRESS,
        "num_experts": A("int", "num_experts", oob=0),
        "hidden_size": A("int", "hidden_size", oob=0),
        "intermediate_size": A("int", "intermediate_size", oob=0),
        "counts": A("seq", "counts"), "activation": A("mode", "activation"),
        "input_scale": A("float", "input_scale", oob=-1.0),
        "weight_scale": A("float", "weight_scale", oob=-1.0),
        "round_activation": A("flag", "round_activation"),
        "gate_up_layout": A("mode", "gate_up_layout"),
    },
    "msa_indexer": {
        "name": NAME, "op": A("mode", "op"), "seed": SEED_OPT, "progress": PROGRESS,
        "nb": A("int", "nb", oob=0), "seq_len": A("int", "seq_len", oob=0, optional=True),
        "head_reduce": A("mode", "head_reduce"), "scale": A("float", "scale", oob=-1.0),
    },
    "msa_sparse_decode": {
        "name": NAME, "op": A("mode", "op"), "seed": SEED_OPT, "progress": PROGRESS,
        "batch": A("int", "batch", oob=0), "nb": A("int", "nb", oob=0),
        "seq_len": A("int", "seq_len", oob=2 * 128 + 1, optional=True),
        "select": A("mode", "select"),
        "scale": A("float", "scale", oob=-1.0), "idx_scale": A("float", "idx_scale", oob=-1.0),
    },
    "msa_main_branch": {
        "name": NAME, "op": A("mode", "op"), "seed": SEED_OPT, "progress": PROGRESS,
        "n": A("int", "n", oob=0), "max_n": A("int", "max_n", oob=8, optional=True),
        "dtype": A("mode", "dtype"), "topk": A("int", "topk", oob=0),
        "bk": A("int", "bk", oob=0), "hq": A("int", "hq", oob=3), "hkv": A("int", "hkv", oob=3),
        "dh": A("int", "dh", oob=0),
    },
    "dsa_make_case": {
        "name": NAME, "seed": SEED, "progress": PROGRESS,
        "actual_seq": A("seq", "actual_seq", fixed_shape=False),
        "s1": A("int", "s1", oob=0), "nq": A("int", "nq", oob=0),
        "topk": A("int", "topk", oob=0), "block_size": A("int", "block_size", oob=0),
        "softmax_scale": A("scale", "softmax_scale"), "quant": A("mode", "quant"),
        "layout": A("mode", "layout"), "topk_rule": A("mode", "topk_rule"),
        "invalid_frac": A("float", "invalid_frac", oob=1.5),
        "poison_unreached": A("flag", "poison_unreached"),
        "tiling": A("object", "tiling", optional=True),
    },
}  # fmt: skip


#: the DeepSeek-V3.2 layer builders' parameters (their bases: the grid's own cases)
_COMMON_BUILDER = dict(name=None, seed=1, progress=False)
_IDX_BUILDER = dict(op="dsa_indexer", path="int8", int8_order="gym", seq_lens=LAYER_SEQ, s1=1,
                    topk=LAYER_TOPK, block_size=LAYER_BS, ue8m0=False, all_tie=False,
                    poison_unused=False, spare_blocks=0)  # fmt: skip
COMMON_BUILDER_ARGS = {"name": NAME, "seed": SEED, "progress": PROGRESS}
IDX_BUILDER_ARGS = {
    **COMMON_BUILDER_ARGS, "op": A("mode", "op"), "path": A("mode", "path"),
    "int8_order": A("mode", "int8_order"),
    "seq_lens": A("seq", "seq_lens", fixed_shape=False), "s1": A("int", "s1"),
    "topk": A("int", "topk"), "block_size": A("int", "block_size"),
    "ue8m0": A("flag", "ue8m0"), "all_tie": A("flag", "all_tie"),
    "poison_unused": A("flag", "poison_unused"), "spare_blocks": A("int", "spare_blocks"),
}  # fmt: skip
LAYER_BUILDERS = {
    "dsa_indexer_make_case": (
        "dsa_indexer_make_case", {**_COMMON_BUILDER, **_IDX_BUILDER}, IDX_BUILDER_ARGS),
    "dsa_indexer_make_case[q_lens]": (
        "dsa_indexer_make_case", {**_COMMON_BUILDER, **_IDX_BUILDER, "q_lens": (2, 1)},
        {"q_lens": A("seq", "q_lens")}),
    "dsa_indexer_prolog_make_case": (
        "dsa_indexer_prolog_make_case",
        dict(_COMMON_BUILDER, path="int8", seq_lens=(5, 6), s1=1, pad=0, block_size=16,
             rope_pairing="halves", recipe="model", hidden=256, rank=256, poison_unused=True,
             spare_blocks=0, ue8m0=True, weight_scale="ue8m0"),
        {**COMMON_BUILDER_ARGS, "path": A("mode", "path"),
         "seq_lens": A("seq", "seq_lens", fixed_shape=False), "s1": A("int", "s1"),
         "pad": A("int", "pad"), "block_size": A("int", "block_size"),
         "rope_pairing": A("mode", "rope_pairing"), "recipe": A("mode", "recipe"),
         "hidden": A("int", "hidden"), "rank": A("int", "rank"),
         "poison_unused": A("flag", "poison_unused"), "spare_blocks": A("int", "spare_blocks"),
         "ue8m0": A("flag", "ue8m0"), "weight_scale": A("mode", "weight_scale")}),
    "dsa_attention_step_make_case[dsa_decode_step]": (
        "dsa_attention_step_make_case",
        {**_COMMON_BUILDER, **_IDX_BUILDER, "op": "dsa_decode_step", "attn_quant": None,
         "layout": None},
        {**IDX_BUILDER_ARGS, "attn_quant": A("mode", "attn_quant", optional=True),
         "layout": A("mode", "layout", optional=True)}),
    "dsa_attention_step_make_case": (
        "dsa_attention_step_make_case",
        dict(_COMMON_BUILDER, path="int8", seq_lens=LAYER_SEQ, s1=1, block_size=LAYER_BS,
             topk=LAYER_TOPK, poison_unused=True, spare_blocks=0, cache_layout=None,
             weight_scale="amax448"),
        {**COMMON_BUILDER_ARGS, "path": A("mode", "path"),
         "seq_lens": A("seq", "seq_lens", fixed_shape=False), "s1": A("int", "s1"),
         "block_size": A("int", "block_size"), "topk": A("int", "topk"),
         "poison_unused": A("flag", "poison_unused"), "spare_blocks": A("int", "spare_blocks"),
         "cache_layout": A("mode", "cache_layout", optional=True),
         "weight_scale": A("mode", "weight_scale")}),
    "mla_prolog_make_case": (
        "mla_prolog_make_case",
        dict(_COMMON_BUILDER, path="fp8", b=1, s1=2, seq_lens=(2,), rope=None,
             cache_layout=None, pad=0, block_size=16, weight_scale="amax448"),
        {**COMMON_BUILDER_ARGS, "path": A("mode", "path"), "b": A("int", "b"),
         "s1": A("int", "s1"), "seq_lens": A("seq", "seq_lens"), "rope": A("mode", "rope",
         optional=True), "cache_layout": A("mode", "cache_layout", optional=True),
         "pad": A("int", "pad"), "block_size": A("int", "block_size"),
         "weight_scale": A("mode", "weight_scale")}),
}  # fmt: skip


def builder_ops() -> list[Op]:
    work = WORK["case"]
    moe, msa, dsa = _ref("moe_make_case"), _ref("msa_make_case"), _ref("dsa_make_case")
    ops = [Op("moe_make_case", moe, _moe_builder_base, BUILDER_ARGS["moe_make_case"], work)]
    for op in ("msa_indexer", "msa_sparse_decode", "msa_main_branch"):
        ops.append(Op(f"msa_make_case[{op}]", msa, lambda op=op: _msa_builder_base(op),
                      BUILDER_ARGS[op], work))  # fmt: skip
    ops.append(Op("dsa_make_case", dsa, _dsa_builder_base, BUILDER_ARGS["dsa_make_case"], work))
    for name, (fn, base, args) in LAYER_BUILDERS.items():
        ops.append(Op(name, _ref(fn), lambda base=base: dict(base), args, work))
    return ops


# ----------------------------------------------------------------------------- host helpers
@cache
def _host_values() -> dict:
    from tilesim.shared.casts import to_bf16
    from tilesim.shared.layouts.mla_cache import pack_pypto_rows
    from tilesim.shared.quant import quantize_latent_fp8
    from tilesim.shared.weights import convert_minimax_weights

    rng = np.random.default_rng(15)
    x32 = rng.uniform(-3, 3, size=(2, 512)).astype(np.float32)
    xb = to_bf16(x32)
    q8, s8 = quantize_latent_fp8(xb)
    rope = to_bf16(rng.uniform(-1, 1, size=(2, 64)).astype(np.float32))
    gu = to_bf16(rng.standard_normal((2, 8, 4)).astype(np.float32))
    dn = to_bf16(rng.standard_normal((2, 4, 4)).astype(np.float32))
    w13, w2 = convert_minimax_weights(gu, dn)
    logits = rng.standard_normal((3, 4)).astype(np.float32)
    hidden = to_bf16(rng.standard_normal((3, 8)).astype(np.float32))
    return dict(x32=x32, xb=xb, q8=q8, s8=s8, rope=rope, cache=pack_pypto_rows(q8, rope, s8),
                gu=gu, dn=dn, w13=w13, w2=w2, logits=logits, hidden=hidden)  # fmt: skip


def _h(**names):
    """A base factory: argument -> key of :func:`_host_values` (or a literal in a 1-tuple)."""

    def base():
        v = _host_values()
        return {k: (x[0] if isinstance(x, tuple) else v[x]) for k, x in names.items()}

    return base


ANY = dict(fixed_rank=False, fixed_shape=False)
LATENT = {"nope": data("nope", bad=np.float32), "rope": data("rope", bad=np.float32),
          "scales": data("scales", bad=np.float64)}  # fmt: skip
CACHE = {"cache": data("cache", bad=np.float32)}


def _dispatch_base():
    from tilesim.reference import moe_dispatch

    v = _host_values()
    d = moe_dispatch(v["hidden"], v["logits"], 2)
    return {"expert_out": d.sorted_tokens.copy(), "dispatch": d, "routed_scaling_factor": 1.0}


def _judge_float_base() -> dict:
    v = _host_values()
    return {"actual": v["xb"], "golden": v["xb"].copy(), "tolerance": dict(JUDGE_TOL),
            "kind": "float", "rule": "default", "arithmetic": "float64",
            "row_shape": (2,)}  # fmt: skip


def _judge_ids_base() -> dict:
    """Two rows of 3 ids over 6 candidates (distinct scores), each row seeing all 6."""
    rng = np.random.default_rng(16)
    scores = rng.permutation(12).reshape(2, 6).astype(np.float32)
    ids = np.argsort(-scores, axis=-1)[:, :3].astype(np.int32)
    return {"actual": ids, "golden": ids.copy(), "tolerance": dict(JUDGE_TOL, mode="set"),
            "scores": scores, "kind": "ids", "visible": np.array([6, 6], np.int32)}  # fmt: skip


def _index_pages_base() -> dict:
    """Two FP8 index-cache pages of 4 tokens: E4M3 codes and FP32 scales."""
    from tilesim.shared.casts import to_fp8_e4m3

    rng = np.random.default_rng(17)
    codes = to_fp8_e4m3(rng.uniform(-2, 2, size=(2, 4, 128)).astype(np.float32))
    return {"codes": codes, "scales": rng.uniform(0.5, 1, size=(2, 4)).astype(np.float32)}


def _index_cache_base() -> dict:
    from tilesim.shared import pack_fp8_pages

    return {"k_cache": pack_fp8_pages(**_index_pages_base()), "block_size": 4}


def _index_vectors_base(**kw):
    def base():
        rng = np.random.default_rng(18)
        return {"x": rng.uniform(-3, 3, size=(2, 3, 128)).astype(np.float32), **kw}

    return base


#: unroll factors: any number of them
UNROLL = A("seq", "unroll", fixed_shape=False)
#: the index quantizers' activations: BF16 / FP32 ``[..., 128]``, any rank, finite
INDEX_X = {"x": data("x", bad=np.int32, fixed_rank=False, finite=True)}
JUDGE_TOL = {"mode": "compare", "atol": 1e-3, "rtol": 1e-3, "ratio": 0.005}
JUDGE_COMMON = {"kind": A("mode", "kind", optional=True)}


def host_ops() -> list[Op]:
    from tilesim.reference import (
        build_msa_block_mask,
        compare,
        judge,
        moe_combine,
        moe_dispatch,
        moe_flop_count,
        moe_tile_schedule,
        msa_indexer_flop,
        msa_sparse_decode_flop,
    )
    from tilesim.reference.util.numerics import bf16_round_trip, ulp_distance
    from tilesim.shared import casts, quant, weights
    from tilesim.shared.layouts import index_cache, mla_cache
    from tilesim.shared.tiling import loop_unroll_chunks

    m = mla_cache
    ops = [
        Op("to_bf16", casts.to_bf16, _h(x="x32", nan=("keep",)),
           {"x": A("real", "x", **ANY), "nan": A("mode", "nan")}),
        Op("to_fp8_e4m3", casts.to_fp8_e4m3, _h(x="x32", saturate=(True,)),
           {"x": A("real", "x", **ANY), "saturate": A("flag", "saturate")}),
        Op("widen_to_fp32", casts.widen_to_fp32, _h(x="xb"),
           {"x": A("real", "x", bad_dtype=np.int64, **ANY)}),
        Op("bf16_round_trip", bf16_round_trip, _h(x="x32"), {"x": A("real", "x", **ANY)}),
        Op("ulp_distance", ulp_distance, _h(a="xb", b="xb"),
           {"a": A("real", "a", fixed_rank=True), "b": A("real", "b", fixed_rank=True)}),
        Op("quantize_latent_fp8", quant.quantize_latent_fp8, _h(x="xb"),
           {"x": data("x", bad=np.complex64)}),
        Op("quantize_latent_fp8_ue8m0", quant.quantize_latent_fp8_ue8m0, _h(x="x32"),
           {"x": data("x", bad=np.complex64)}),
        Op("quantize_latent_int8", quant.quantize_latent_int8, _h(x="xb"),
           {"x": data("x", bad=np.complex64)}),
        Op("dequantize_latent", quant.dequantize_latent, _h(q="q8", scales="s8"),
           {"q": data("q", bad=np.float32), "scales": data("scales", bad=np.float64)}),
        Op("pack_pypto_rows", m.pack_pypto_rows, _h(nope="q8", rope="rope", scales="s8"), LATENT),
        Op("pack_flashmla_rows", m.pack_flashmla_rows, _h(nope="q8", rope="rope", scales="s8"),
           LATENT),
        Op("pack_kv_split", m.pack_kv_split, _h(nope="q8", rope="rope", scales="s8"), LATENT),
        Op("pack_rows", m.pack_rows, _h(nope="q8", rope="rope", scales="s8", layout=("pypto",)),
           {**LATENT, "layout": A("mode", "layout")}),
        Op("unpack_pypto_rows", m.unpack_pypto_rows, _h(cache="cache"), CACHE),
        Op("unpack_flashmla_rows", m.unpack_flashmla_rows, _h(cache="cache"), CACHE),
        Op("unpack_rows", m.unpack_rows, _h(cache="cache", layout=("pypto",)),
           {**CACHE, "layout": A("mode", "layout")}),
        Op("convert_cache_layout", m.convert_cache_layout,
           _h(cache="cache", src=("pypto",), dst=("flashmla",)),
           {**CACHE, "src": A("mode", "src"), "dst": A("mode", "dst")}),
        Op("unpack_kv_split", m.unpack_kv_split, _h(kn_quant="q8", kr="rope", kn_scales="s8"),
           {"kn_quant": data("kn_quant", "nope", bad=np.float32),
            "kr": data("kr", "rope", bad=np.float32),
            "kn_scales": data("kn_scales", "scales", bad=np.float64)}),
        Op("convert_minimax_weights", weights.convert_minimax_weights,
           _h(gate_up_proj="gu", down_proj="dn"),
           {"gate_up_proj": data("gate_up_proj", bad=np.complex64),
            "down_proj": data("down_proj", bad=np.complex64)}),
        Op("unconvert_minimax_weights", weights.unconvert_minimax_weights,
           _h(w13_flat="w13", w2_flat="w2", num_experts=(2,)),
           {"w13_flat": data("w13_flat", bad=np.complex64),
            "w2_flat": data("w2_flat", bad=np.complex64),
            "num_experts": A("int", "num_experts", oob=3)}),
        Op("compare", compare,
           _h(actual="xb", golden="xb", atol=(1e-3,), rtol=(1e-3,), ratio=(0.005,),
              check_dtype=(True,), arithmetic=("float64",), n_worst=(3,)),
           {"actual": A("real", "actual", fixed_rank=False),
            "golden": A("real", "golden", fixed_rank=False),
            "atol": A("float", "atol", oob=-1.0), "rtol": A("float", "rtol", oob=-1.0),
            "ratio": A("float", "ratio", oob=1.5), "check_dtype": A("flag", "check_dtype"),
            "arithmetic": A("mode", "arithmetic"),
            "n_worst": A("int", "n_worst", oob=-1, huge=False)}),
        Op("moe_dispatch", moe_dispatch,
           _h(hidden_states="hidden", router_logits="logits", top_k=(2,), normalize=(False,),
              scores=("logits",), pad_rows=(0,)),
           {"hidden_states": data("hidden_states", bad=np.int32, fixed_shape=False),
            "router_logits": data("router_logits", bad=np.int32, fixed_shape=False),
            "top_k": A("int", "top_k", oob=5), "normalize": A("flag", "normalize"),
            "scores": A("mode", "scores"), "pad_rows": A("int", "pad_rows", oob=-1),
            "trace": TRACE}),
        Op("msa_indexer_flop", msa_indexer_flop, _h(nb=(3,), padded=(True,)),
           {"nb": A("int", "nb", oob=0, huge=False), "padded": A("flag", "padded")}),
        Op("msa_sparse_decode_flop", msa_sparse_decode_flop,
           _h(batch=(2,), hq=(64,), keys=(256,), dim=(128,)),
           {n: A("int", n, oob=0, huge=False) for n in ("batch", "hq", "keys", "dim")}),
        Op("quantize_index_int8", quant.quantize_index_int8,
           _index_vectors_base(amax_floor=1e-8, scale_rule="amax/127"),
           {**INDEX_X, "amax_floor": A("float", "amax_floor", oob=-1.0),
            "scale_rule": A("mode", "scale_rule")}),
        Op("quantize_index_fp8", quant.quantize_index_fp8,
           _index_vectors_base(ue8m0=False, amax_floor=1e-4),
           {**INDEX_X, "ue8m0": A("flag", "ue8m0"),
            "amax_floor": A("float", "amax_floor", oob=-1.0)}),
        Op("pack_fp8_pages", index_cache.pack_fp8_pages, _index_pages_base,
           {"codes": data("codes", bad=np.int8), "scales": data("scales", bad=np.float64)}),
        Op("unpack_fp8_pages", index_cache.unpack_fp8_pages, _index_cache_base,
           {"k_cache": data("k_cache", bad=np.float32),
            "block_size": A("int", "block_size", oob=3)}),
        Op("loop_unroll_chunks", loop_unroll_chunks, _h(count=(100,), unroll=((8, 1),)),
           {"count": A("int", "count", oob=-1), "unroll": UNROLL}),
        Op("build_msa_block_mask", build_msa_block_mask,
           lambda: {"n": 300, "topk_indices": np.array([2, 0], np.int32), "bk": 128, "topk": 4},
           {"n": A("int", "n", oob=0),
            "topk_indices": A("index", "topk_indices", oob=3, fixed_shape=False),
            "bk": A("int", "bk", oob=0), "topk": A("int", "topk", oob=1)}),
        Op("moe_flop_count", moe_flop_count,
           lambda: {k: moe_base()[k] for k in ("expert_cumsum", "dims")},
           {"expert_cumsum": MOE_ARGS["expert_cumsum"], "dims": MOE_ARGS["dims"]}),
        Op("moe_tile_schedule", moe_tile_schedule,
           lambda: {"expert_cumsum": moe_base()["expert_cumsum"], "unroll": (8, 1)},
           # no dims: any expert count and any integer dtype; the first entry must be 0
           {"expert_cumsum": A("index", "expert_cumsum", oob=1, fixed_shape=False),
            "unroll": UNROLL}),
        Op("judge[float]", judge, _judge_float_base,
           {**JUDGE_COMMON, "actual": A("real", "actual", fixed_rank=False),
            "golden": A("real", "golden", fixed_rank=False),
            "rule": A("mode", "rule"), "arithmetic": A("mode", "arithmetic"),
            "row_shape": A("seq", "row_shape")}),
        Op("judge[ids]", judge, _judge_ids_base,
           {**JUDGE_COMMON,
            # ids out of range are a dump's wrong answer (a FAIL), not bad input: dtypes only
            "actual": data("actual", bad=np.float32, fixed_rank=False),
            "golden": data("golden", bad=np.float32, fixed_rank=False),
            "scores": data("scores", bad=np.int32, fixed_rank=False, optional=True),
            "visible": A("length", "visible", oob=7, optional=True)}),
        Op("moe_combine", moe_combine, _dispatch_base,
           {"expert_out": data("expert_out", bad=np.float32, fixed_shape=False),
            "dispatch": A("object", "dispatch"),
            "routed_scaling_factor": A("scale", "routed_scaling_factor"), "trace": TRACE}),
    ]  # fmt: skip
    return ops


# ----------------------------------------------------------------------------- device wrappers
def _without(args: dict, *names) -> dict:
    return {k: v for k, v in args.items() if k not in names}


DEVICE_COMMON = {"backend": A("mode", "backend"), "soc": A("mode", "soc")}
VALIDATE = {"validate": A("flag", "validate")}


def _dev(name):
    import tilesim.device as dev

    return getattr(dev, name)


#: the device-only keywords at their defaults (NumPy inputs + ``backend="auto"``: a call that
#: passes every check fails in ``resolve`` with a message naming ``backend``, never a kernel)
DEVICE_DEFAULTS = dict(backend="auto", soc="910b")


def _strip(base, *names, **extra):
    return lambda: {**{k: v for k, v in base().items() if k not in names}, **DEVICE_DEFAULTS,
                    **extra}  # fmt: skip


def _torch_out(rows: int):
    """A BF16 ``[rows, 512]`` torch ``out`` for the DeepSeek wrappers (None without torch:
    those cells are then skipped with the rest of the device grid)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.zeros(rows, 512, dtype=torch.bfloat16)


DSA_OUT = {"out": A("out", "out", bad_dtype=np.float32, optional=True, contiguous=True)}


def device_ops() -> list[Op]:
    D, w = _dev, WORK["device"]
    ref_only = ("seeds_compat", "trace", "progress")
    idx_base = _strip(indexer_base, "seq_len", "head_reduce", validate=True)
    return [
        Op("device.moe_grouped_gemm", D("moe_grouped_gemm"), _strip(moe_base, validate=True),
           {**MOE_ARGS, **DEVICE_COMMON, **VALIDATE}, w, True),
        Op("device.msa_indexer", D("msa_indexer"),
           _strip(indexer_base, validate=True, block_max="host"),
           {**_without(INDEXER_ARGS, "trace"), **DEVICE_COMMON, **VALIDATE,
            "block_max": A("mode", "block_max")}, w, True),
        Op("device.msa_indexer_scores", D("msa_indexer_scores"), idx_base,
           {**{k: INDEXER_ARGS[k] for k in ("idx_q", "idx_k", "nb")}, **DEVICE_COMMON,
            **VALIDATE}, w, True),
        Op("device.msa_sparse_decode", D("msa_sparse_decode"),
           _strip(decode_base, *ref_only, validate=True, gather="device"),
           {**_without(DECODE_ARGS, *ref_only), **DEVICE_COMMON, **VALIDATE,
            "gather": A("mode", "gather")}, w, True),
        Op("device.msa_sparse_decode[seq_len array]", D("msa_sparse_decode"),
           _strip(decode_array_base, *ref_only, validate=True), DECODE_ARRAY_ARGS, w, True),
        Op("device.msa_main_branch", D("msa_main_branch"),
           _strip(main_base, *ref_only, validate="full"),  # the mask's scan: "full" only
           {**_without(MAIN_ARGS, *ref_only), **DEVICE_COMMON}, w, True),
        Op("device.sparse_attention_antiquant", D("sparse_attention_antiquant"),
           _strip(dsa_base, *ref_only, validate=True, out=_torch_out(4)),
           {**DSA_COMMON, **DSA_PACKED, **DEVICE_COMMON, **VALIDATE, **DSA_OUT}, w, True),
        Op("device.sparse_attention_antiquant_kv_split", D("sparse_attention_antiquant_kv_split"),
           _strip(dsa_split_base, *ref_only, validate=True, out=_torch_out(4)),
           {**DSA_COMMON, **DSA_SPLIT, **DEVICE_COMMON, **VALIDATE, **DSA_OUT}, w, True),
        *device_layer_ops(),
    ]  # fmt: skip


def device_layer_ops() -> list[Op]:
    """The DeepSeek-V3.2 layer wrappers, with ``validate="full"`` (the golden's float scans:
    the default checks the integer inputs only) and the kernels' switches (the 950 for FP8)."""
    D, w = _dev, WORK["device"]
    dev = {**DEVICE_COMMON, **VALIDATE}
    fp8 = dict(validate="full", soc="950")
    iprolog = _without(IPROLOG_COMMON, "trace")
    return [
        Op("device.dsa_indexer[int8]", D("dsa_indexer"),
           _strip(lambda: idx_base("int8"), validate="full"),
           {**IDX_COMMON, **IDX_INT8, **dev}, w, True),
        Op("device.dsa_indexer[fp8]", D("dsa_indexer"), _strip(lambda: idx_base("fp8"), **fp8),
           {**IDX_COMMON, **IDX_FP8, **dev}, w, True),
        Op("device.dsa_indexer_prolog[int8]", D("dsa_indexer_prolog"),
           _strip(lambda: iprolog_device_base("int8"), validate="full"),
           {**iprolog, **IPROLOG_INT8, **IPROLOG_KW, **dev}, w, True),
        Op("device.dsa_indexer_prolog[fp8]", D("dsa_indexer_prolog"),
           _strip(lambda: iprolog_device_base("fp8"), **fp8),
           {**iprolog, **IPROLOG_FP8, **IPROLOG_KW, **dev,
            "slot_mapping": A("index", "slot_mapping", oob=64)}, w, True),  # 2 blocks of 32
        Op("device.mla_prolog[int8]", D("mla_prolog"),
           _strip(lambda: mla_base("int8"), validate="full"),
           {**MLA_COMMON, **MLA_INT8, **dev}, w, True, meta=False),
        Op("device.mla_prolog[fp8]", D("mla_prolog"),
           _strip(lambda: mla_base("fp8"), fp8_promotion="two_roundings", **fp8),
           {**MLA_COMMON, **MLA_FP8, **dev}, w, True, meta=False),
        Op("device.dsa_attention_step[int8]", D("dsa_attention_step"),
           _strip(lambda: step_base("int8"), validate="full", index_k_tile=1024),
           {**STEP_COMMON, **STEP_INT8, **dev}, w, True, meta=False),
        Op("device.dsa_attention_step[slot_mapping]", D("dsa_attention_step"),
           _strip(step_slots_base, validate="full", index_k_tile=1024), STEP_SLOTS, w, True,
           meta=False),
        Op("device.dsa_attention_step[q_lens]", D("dsa_attention_step"),
           _strip(step_q_lens_base, validate="full", index_k_tile=1024), STEP_Q_LENS, w, True,
           meta=False),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- tile configs
def _tile_ints(*names, **oob):
    return {n: A("int", n, oob=oob.get(n, 0)) for n in names}


def tiling_ops() -> list[Op]:
    """The tile configs every op takes (``shared/tiling.py``): their constructors and the
    DeepSeek ``prefill`` / ``decode`` presets."""
    from tilesim.shared.tiling import MoeTiling, MsaTiling, SaTileShapeConfig

    moe_ints = ("mm1_k", "mm1_n", "mm2_k", "mm2_n", "vec_tile")
    return [
        Op("MoeTiling", MoeTiling, lambda: {k: getattr(MoeTiling(), k) for k in moe_ints},
           _tile_ints(*moe_ints)),
        Op("MsaTiling", MsaTiling, lambda: dict(ntile=512, max_n=2048, dtype="fp32"),
           {**_tile_ints("ntile", "max_n"), "dtype": A("mode", "dtype")}),
        Op("SaTileShapeConfig", SaTileShapeConfig,
           lambda: dict(g_tile=128, s_kv_tile=512, softmax="online", kv_splits=1),
           {**_tile_ints("g_tile", "s_kv_tile", "kv_splits"), "softmax": A("mode", "softmax")}),
        Op("SaTileShapeConfig.preset", SaTileShapeConfig.preset, lambda: dict(name="prefill"),
           {"name": A("mode", "name", "preset")}),
    ]  # fmt: skip


def all_ops() -> list[Op]:
    return reference_ops() + builder_ops() + host_ops() + tiling_ops() + device_ops()


FP8 = FP8_E4M3
