"""tilesim.device — PyPTO kernels for Ascend 910B and 950 with thin torch wrappers.

Importing this package needs neither torch, torch_npu nor pypto: each wrapper is imported here
from its module by name (the device calls of the registry of ops,
:mod:`tilesim.shared.registry.ops`; ``tests/test_op_records.py`` holds this list equal to it), and
the wrapper modules import the device stack only when a kernel is built or called, through
:mod:`tilesim.device._lazy`, whose ``ImportError`` says what to install. :mod:`tilesim.device.sim`
runs any kernel on a CPU
(PyPTO's interpreter + cost model).

Also public here (from :mod:`tilesim.device.backend`): ``compile_stats()`` -> {kernel name:
distinct compiled variants}, ``reset_compile_stats()``, and ``allow_in_graph()`` (registers
every wrapper with ``torch._dynamo.allow_in_graph`` for torch.compile).
"""

from __future__ import annotations

from tilesim.device.backend import allow_in_graph, compile_stats, reset_compile_stats
from tilesim.device.dsa import sparse_attention_antiquant, sparse_attention_antiquant_kv_split
from tilesim.device.dsa_attention_step import dsa_attention_step
from tilesim.device.dsa_indexer import dsa_indexer
from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog
from tilesim.device.mla_prolog import mla_prolog
from tilesim.device.moe import moe_grouped_gemm
from tilesim.device.msa_decode import msa_sparse_decode
from tilesim.device.msa_indexer import msa_indexer, msa_indexer_scores
from tilesim.device.msa_main import msa_main_branch

__all__ = [
    "allow_in_graph",
    "compile_stats",
    "dsa_attention_step",
    "dsa_indexer",
    "dsa_indexer_prolog",
    "mla_prolog",
    "moe_grouped_gemm",
    "msa_indexer",
    "msa_indexer_scores",
    "msa_main_branch",
    "msa_sparse_decode",
    "reset_compile_stats",
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
]
