"""The golden-digest guard: SHA-256 of the golden bytes of every named case and op mode.

Each entry builds a case with its family's public builder (named cases are reduced where the
full size would take minutes: fewer batches, shorter sequences, same quant / layout / preset),
runs the public reference op once without and once with a trace hook, and hashes the output's
dtype, shape and bytes. ``digests.json`` beside this file holds the values committed before
the consolidation of the goldens; ``tests/digests/test_golden_digests.py`` asserts them.

Regenerate (only when a change is meant to move bits, and say so in the commit)::

    python tests/digests/golden_digests.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIGEST_FILE = HERE / "digests.json"


def _moe_entries():
    yield "moe/m27_case_001", ("moe", "m27_case_001", {})
    yield "moe/m3_case_smoke_edge", ("moe", "m3_case_smoke_edge", {})
    for act in ("silu", "swigluoai"):
        for layout in ("halves", "interleaved"):
            yield (
                f"moe/custom_{act}_{layout}",
                (
                    "moe",
                    None,
                    {"activation": act, "gate_up_layout": layout, "seed": 5},
                ),
            )
    yield "moe/custom_round_activation_false", ("moe", None, {"round_activation": False})
    yield "moe/custom_k_tiles", ("moe", None, {"mm1_k": 64, "mm2_k": 32, "seed": 3})
    yield "moe/custom_empty_experts", ("moe", None, {"counts": (0, 7, 0, 0), "seed": 4})


def _msa_entries():
    from tilesim.reference.cases.msa import MSA_CASES

    for name, spec in MSA_CASES.items():
        over = {}
        if spec["op"] == "msa_main_branch" and spec["params"]["n"] >= 1024:
            over = {"n": 300 + spec["params"]["n"] % 97}  # reduced; seed and max_n kept
        yield f"msa/{name}", ("msa", name, over)
    for head_reduce in ("max", "none"):
        yield (
            f"msa/indexer_nb20_partial_{head_reduce}",
            (
                "msa",
                None,
                {
                    "op": "msa_indexer",
                    "nb": 20,
                    "seq_len": 19 * 128 + 5,
                    "head_reduce": head_reduce,
                },
            ),
        )
    yield (
        "msa/decode_b3_random_rows",
        (
            "msa",
            None,
            {
                "op": "msa_sparse_decode",
                "batch": 3,
                "nb": 19,
                "seq_len": [19 * 128, 2100, 2300],
                "select": "random",
                "seed": 2,
            },
        ),
    )
    yield (
        "msa/decode_ntile256_seeds_compat",
        (
            "msa",
            "msa_decode_partial_nb17",
            {},
            {"tiling": {"ntile": 256}, "seeds_compat": True},
        ),
    )
    yield (
        "msa/main_n300_ntile256_seeds_compat",
        (
            "msa",
            None,
            {"op": "msa_main_branch", "n": 300, "seed": 10},
            {"tiling": {"ntile": 256}, "seeds_compat": True},
        ),
    )
    for dtype in ("fp32", "fp16", "bf16"):
        yield (
            f"msa/main_n260_{dtype}",
            (
                "msa",
                None,
                {"op": "msa_main_branch", "n": 260, "dtype": dtype, "seed": 9},
            ),
        )


def _dsa_entries():
    from tilesim.reference.cases.dsa import DSA_CASES

    for i, (name, case) in enumerate(DSA_CASES.items()):
        b = min(case.b, 2)
        acts = tuple(min(a, 3000 + 917 * j) for j, a in enumerate(case.actual_seq[:b]))
        over = {"b": b, "actual_seq": acts, "s1": min(case.s1, 2), "seed": 100 + i}
        yield f"dsa/{name}", ("dsa", name, over)
    tiles = {
        "g64_kv256": dict(g_tile=64, s_kv_tile=256),
        "per_tile_kv1024": dict(s_kv_tile=1024, softmax="per_tile"),
    }
    for tag, kw in tiles.items():
        yield f"dsa/adhoc_tile_{tag}", ("dsa", None, {"seed": 13}, {"tiling": kw})
    for quant in ("fp8", "fp8_ue8m0", "int8"):
        for layout in ("pypto", "flashmla", "kv_split"):
            yield (
                f"dsa/adhoc_{quant}_{layout}",
                (
                    "dsa",
                    None,
                    {"quant": quant, "layout": layout, "seed": 11},
                ),
            )
    for preset in ("decode", "prefill"):
        yield (
            f"dsa/adhoc_causal_invalid_{preset}",
            (
                "dsa",
                None,
                {
                    "topk_rule": "causal",
                    "invalid_frac": 0.3,
                    "preset": preset,
                    "seed": 12,
                    "actual_seq": (5, 700, 2500),
                    "poison_unreached": True,
                },
            ),
        )


def _dsa_indexer_entries():
    from tilesim.reference.cases.dsa_indexer import CASE_INFO

    for name, info in CASE_INFO.items():
        if info.size == "small":
            yield f"dsa_indexer/{name}", ("dsa_indexer", name, {})


def _dsa_indexer_prolog_entries():
    from tilesim.reference.cases.dsa_indexer_prolog import CASE_INFO

    for name, info in CASE_INFO.items():
        if info.size == "small":
            yield f"dsa_indexer_prolog/{name}", ("dsa_indexer_prolog", name, {})


def _mla_prolog_entries():
    from tilesim.reference.cases.mla_prolog import CASE_INFO

    for name, info in CASE_INFO.items():
        if info.size == "small":
            yield f"mla_prolog/{name}", ("mla_prolog", name, {})


def _dsa_attention_step_entries():
    from tilesim.reference.cases.dsa_attention_step import CASE_INFO

    for name, info in CASE_INFO.items():
        if info.size == "small":
            yield f"dsa_attention_step/{name}", ("dsa_attention_step", name, {})


def entries():
    """``[(entry id, (family, case name, builder overrides[, op overrides])), ...]``, fixed order:
    the entries of each case family of the registry of ops, in its order (``_<family>_entries``).

    Op overrides replace op parameters after the build; a ``tiling`` given as a dict is built
    as ``MsaTiling(**d)`` (``SaTileShapeConfig(**d)`` for the ``dsa`` family)."""
    from tilesim.shared.registry.ops import families

    out = []
    for family in families():
        family_entries = globals().get(f"_{family}_entries")
        if family_entries is None:
            raise LookupError(f"no golden digest entries for the case family {family!r}")
        out += family_entries()
    return out


def _build(family, name, over):
    """``(op, case)``: the case built by ``family``'s builder (the registry of ops names it)."""
    import importlib

    from tilesim.shared.registry.ops import case_builder

    module, builder = case_builder(family)
    case = getattr(importlib.import_module(module), builder)(name, **dict(over))
    return case["op"], case


def _op(name):
    import tilesim.reference as ref

    return getattr(ref, name)


def digest_of(arr) -> str:
    """SHA-256 of one array's dtype, shape and bytes; a tuple or dict of outputs (the
    indexer's ids and scores, the decode step's three outputs) is hashed member by member; a
    ``None`` member (an output the op's path lacks) hashes as the word ``None``."""
    if arr is None:
        return "None"
    if isinstance(arr, dict):
        return digest_of(tuple(f"{k}={digest_of(v)}" for k, v in sorted(arr.items())))
    if isinstance(arr, tuple):
        h = hashlib.sha256("|".join(v if isinstance(v, str) else
                                    digest_of(v if v is None else np.asarray(v))
                                    for v in arr).encode())  # fmt: skip
        return h.hexdigest()
    a = np.ascontiguousarray(np.asarray(arr))
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}|{a.dtype.name}|{a.shape}|".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _op_overrides(op_over: dict, family: str = "") -> dict:
    from tilesim.shared import MsaTiling, SaTileShapeConfig

    kw = dict(op_over)
    if isinstance(kw.get("tiling"), dict):  # the DeepSeek ops' tiling is a SaTileShapeConfig
        kw["tiling"] = (SaTileShapeConfig if family == "dsa" else MsaTiling)(**kw["tiling"])
    return kw


def golden_digest(family, name, over, op_over=None) -> dict:
    """``{"plain": sha, "traced": sha}`` of the op's output without and with a trace hook."""
    op_name, case = _build(family, name, over)
    op = _op(op_name)
    out = {}
    for mode in ("plain", "traced"):
        kw = {**case["params"], **_op_overrides(op_over or {}, family)}
        if mode == "traced":
            kw["trace"] = lambda rec: None
        res = op(**case["inputs"], **kw)
        out[mode] = digest_of(res)
    return out


def compute_all(progress=False) -> dict:
    res = {}
    for key, spec in entries():
        res[key] = golden_digest(*spec)
        if progress:
            print(key, res[key]["plain"][:16], file=sys.stderr)
    return res


if __name__ == "__main__":
    got = compute_all(progress=True)
    if "--write" in sys.argv:
        DIGEST_FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} digests to {DIGEST_FILE}")
