"""tilesim.device — PyPTO kernels for Ascend 910B and 950 with thin torch wrappers.

Importing this package needs neither torch, torch_npu nor pypto: the kernel modules are
imported on first use of one of their public names (``_LAZY`` below), and they import the
device stack through :mod:`tilesim.device._lazy`, whose ``ImportError`` says what to install.
:mod:`tilesim.device.sim` runs any kernel on a CPU (PyPTO's interpreter + cost model).

Also public here (from :mod:`tilesim.device.backend`): ``compile_stats()`` -> {kernel name:
distinct compiled variants}, ``reset_compile_stats()``, and ``allow_in_graph()`` (registers
every wrapper with ``torch._dynamo.allow_in_graph`` for torch.compile).
"""

from __future__ import annotations

from tilesim.shared.lazy import lazy_names

# public name -> module of this package that defines it (add one line per public kernel)
_LAZY = {
    "moe_grouped_gemm": "moe",
    "msa_indexer_scores": "msa_indexer",
    "msa_indexer": "msa_indexer",
    "msa_sparse_decode": "msa_decode",
    "msa_main_branch": "msa_main",
    "sparse_attention_antiquant": "dsa",
    "sparse_attention_antiquant_kv_split": "dsa",
    "dsa_indexer": "dsa_indexer",
    "compile_stats": "backend",
    "reset_compile_stats": "backend",
    "allow_in_graph": "backend",
}


__getattr__, __dir__ = lazy_names("tilesim.device", _LAZY, globals())

__all__ = [*_LAZY]
