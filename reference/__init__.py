"""tilesim.reference — bit-accurate NumPy + ml_dtypes goldens of the fused operators.

Every op emulates its kernel's tile loop nest and rounding points (see ``docs/numerics.md`` and
``docs/ops/``). Needs only numpy and ml_dtypes; torch is optional (interop, test oracles).

Each public name is imported here from the module that defines it: each op's calls and other
names and each family's case builder (the registry of ops, :mod:`tilesim.shared.registry.ops`;
``tests/test_op_records.py`` holds this list equal to it), then the judge. The goldens import
nothing heavier than the contracts do, so ``import tilesim.reference`` stays cheap. An op
named like its module (``msa_indexer``) is the op here; reach the module with
``importlib.import_module("tilesim.reference.msa_indexer")``.
"""

from __future__ import annotations

from tilesim.reference.cases.dsa import DSA_CASES, dsa_make_case
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.reference.cases.dsa_indexer import dsa_indexer_make_case
from tilesim.reference.cases.dsa_indexer_prolog import dsa_indexer_prolog_make_case
from tilesim.reference.cases.mla_prolog import mla_prolog_make_case
from tilesim.reference.cases.moe import MOE_CASES, moe_make_case
from tilesim.reference.cases.msa import MSA_CASES, msa_make_case
from tilesim.reference.dsa import sparse_attention_antiquant, sparse_attention_antiquant_kv_split
from tilesim.reference.dsa_attention_step import (
    AttentionStepResult,
    dsa_attention_step,
    dsa_decode_step,
)
from tilesim.reference.dsa_indexer import dsa_indexer
from tilesim.reference.dsa_indexer_prolog import dsa_indexer_prolog
from tilesim.reference.judging import Verdict, judge
from tilesim.reference.judging.compare import CompareReport, compare
from tilesim.reference.mla_prolog import MlaPrologOutputs, mla_prolog
from tilesim.reference.moe import (
    MoeTileRecord,
    moe_flop_count,
    moe_grouped_gemm,
    moe_tile_schedule,
)
from tilesim.reference.msa_decode import msa_sparse_decode, msa_sparse_decode_flop
from tilesim.reference.msa_indexer import msa_indexer, msa_indexer_flop, msa_indexer_scores
from tilesim.reference.msa_main import build_msa_block_mask, msa_main_branch
from tilesim.reference.util.moe_routing import MoeDispatch, moe_combine, moe_dispatch
from tilesim.reference.util.numerics import (
    bf16_round_trip,
    to_bf16,
    to_fp8_e4m3,
    ulp_distance,
    widen_to_fp32,
)

__all__ = [
    "DSA_CASES",
    "MOE_CASES",
    "MSA_CASES",
    "AttentionStepResult",
    "CompareReport",
    "MlaPrologOutputs",
    "MoeDispatch",
    "MoeTileRecord",
    "Verdict",
    "bf16_round_trip",
    "build_msa_block_mask",
    "compare",
    "dsa_attention_step",
    "dsa_attention_step_make_case",
    "dsa_decode_step",
    "dsa_indexer",
    "dsa_indexer_make_case",
    "dsa_indexer_prolog",
    "dsa_indexer_prolog_make_case",
    "dsa_make_case",
    "judge",
    "mla_prolog",
    "mla_prolog_make_case",
    "moe_combine",
    "moe_dispatch",
    "moe_flop_count",
    "moe_grouped_gemm",
    "moe_make_case",
    "moe_tile_schedule",
    "msa_indexer",
    "msa_indexer_flop",
    "msa_indexer_scores",
    "msa_main_branch",
    "msa_make_case",
    "msa_sparse_decode",
    "msa_sparse_decode_flop",
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
    "to_bf16",
    "to_fp8_e4m3",
    "ulp_distance",
    "widen_to_fp32",
]
