"""The seeds-style torch goldens the bench times the references against.

Plain torch written the way the seeds' tests (hicann/pypto-gym) write their goldens: Python
loops per expert (MoE), per batch (MSA decode), per head x query block x slot (MSA main
branch), per (batch, query token) x KV tile (DeepSeek); FP32 torch math on CPU. MoE and
DeepSeek use the family oracles (``tests/oracles/moe.py``, ``tests/oracles/dsa.py``), the MSA
ops ``tests/oracles/msa_seeds.py`` (see :data:`SOURCES`). Each golden is judged against the
reference with the case's own tolerance (:func:`check`), so the timings compare like with like.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from oracles.msa_seeds import torch_msa_decode, torch_msa_indexer, torch_msa_main
from oracles.torch_io import np_of

# ---------------------------------------------------------------------------------------------
# plain torch goldens, the seeds' way (loops in Python, FP32 math)


def _dsa_tiling(args: dict):
    """The DeepSeek op's tile preset: its ``tiling`` argument or the documented default."""
    cfg = args.get("tiling")
    if cfg is None:
        from tilesim.shared import SaTileShapeConfig

        cfg = SaTileShapeConfig.from_env()
    return cfg


#: where each op's torch golden comes from (listed in the bench report)
SOURCES = {
    "moe_grouped_gemm": "oracles.moe:torch_seed_golden",
    "msa_indexer": "oracles.msa_seeds:torch_msa_indexer",
    "msa_sparse_decode": "oracles.msa_seeds:torch_msa_decode",
    "msa_main_branch": "oracles.msa_seeds:torch_msa_main",
    "sparse_attention_antiquant": "oracles.dsa:torch_golden",
}


def torch_golden_for(built) -> Callable[[], object] | None:
    """A no-argument callable running the torch golden of a built case (``None``: none)."""
    a, op, case = built.op_args, built.op_name, built.case
    if op == "moe_grouped_gemm":
        from oracles.moe import torch_seed_golden

        rnd = bool(built.meta.get("seed_golden_round_activation", True))
        return lambda: torch_seed_golden(case, rnd)
    if op == "msa_indexer":
        return lambda: torch_msa_indexer(a)
    if op == "msa_sparse_decode":
        return lambda: torch_msa_decode(a)
    if op == "msa_main_branch":
        ids = built.meta.get("topk_indices")
        if ids is None:  # the builder did not say which blocks it selected
            return None
        ids = np.asarray(ids).ravel()
        return lambda: torch_msa_main(a, ids)
    if op.startswith("sparse_attention_antiquant"):
        from oracles.dsa import torch_golden

        cfg = _dsa_tiling(a)
        return lambda: torch_golden(case, cfg.s_kv_tile, cfg.softmax)
    return None


def check(built, ref_out: np.ndarray, torch_out) -> str:
    """The torch golden judged against the reference by :func:`tilesim.reference.judge` under
    the case's tolerance (ids as per-row sets; floats by the seeds' rule and the golden-aware
    checks), as one phrase for the report."""
    from tilesim.reference import judge

    tol = built.tolerance
    t = np_of(torch_out)
    r = np.asarray(ref_out)
    if tol["mode"] == "set":
        ok = judge(t, r, tol).passed
        return "same block set" if ok else "DIFFERENT block set"
    if tol["mode"] != "compare":
        return f"not judged (tolerance mode {tol['mode']!r})"
    # the values compared in FP32, the bounds at the reference output's own rounding
    v = judge(t.astype(np.float32), r.astype(np.float32), tol, precision=r.dtype)
    verdict = "agrees" if v.passed else "DISAGREES"
    failed = f"; failed: {', '.join(v.failed)}" if v.failed else ""
    return (
        f"{verdict} ({v.n_fail} > tol, allowed {v.threshold}; "
        f"max abs err {v.max_abs_err:.2g}{failed})"
    )
