"""The kernel-output digest guard: SHA-256 of the interpreted kernel output of a handful of small
cases, one or more per op, on both SoCs.

Each entry builds a case with its family's public builder, hands its inputs and parameters to
the public device wrapper of the case's op (``tilesim.device.<op>``, ``backend="sim"``) in a
spawned simulator process, and hashes the output's dtype, shape and bytes (the same
:func:`digests.golden_digests.digest_of` as the golden guard). ``kernel_digests.json`` beside
this file holds the values; ``tests/digests/test_kernel_digests.py`` asserts them, so a
refactor that moves a single bit of a kernel's output fails there. They are machine-independent
by construction: the simulator's child process is pinned and its matmuls sum each K tile
exactly (docs/device.md, "A deterministic interpreter"), and
``tests/device/test_sim_determinism.py`` reproduces one entry per family (:data:`LOADED_RUNS`)
under other thread settings and load -- the CI check of those entries' digests.

Regenerate (only when a change is meant to move kernel bits, and say so in the commit)::

    python tests/digests/kernel_digests.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIGEST_FILE = HERE / "kernel_digests.json"
SOCS = ("910b", "950")


def _large_batch_case(quant: str, seed: int) -> dict:
    """Builder overrides of a large-batch-tiling entry: b 2, s1 1, 1000 and 600 keys of top-k
    1024 in one 2048-key tile, 20 % -1 entries, unreached rows poisoned."""
    from tilesim.shared.tiling import SaTileShapeConfig

    return {
        "quant": quant, "layout": "pypto", "b": 2, "s1": 1, "actual_seq": (1000, 600),
        "topk": 1024, "tiling": SaTileShapeConfig.large_batch(), "topk_rule": "causal",
        "invalid_frac": 0.2, "poison_unreached": True, "seed": seed,
    }  # fmt: skip


#: entry -> (family, case name or None, builder overrides, SoCs)
_ENTRIES = {
    "moe/m3_case_smoke_edge": ("moe", "m3_case_smoke_edge", {}, SOCS),
    "msa_indexer/nb17": ("msa", "msa_indexer_nb17", {}, SOCS),
    "msa_decode/partial_nb17": ("msa", "msa_decode_partial_nb17", {}, SOCS),
    "msa_main/unaligned_100": ("msa", "msa_main_unaligned_100", {}, SOCS),
    "dsa/int8_pypto": (
        "dsa",
        None,
        {"quant": "int8", "layout": "pypto", "actual_seq": (300, 700), "seed": 21},
        SOCS,
    ),
    "dsa/fp8_kv_split": (
        "dsa",
        None,
        {"quant": "fp8", "layout": "kv_split", "actual_seq": (300, 700), "seed": 22},
        ("950",),
    ),
    # the large-batch tiling (SaTileShapeConfig.large_batch, its own bits), with -1 entries
    "dsa/large_batch_int8": ("dsa", None, _large_batch_case("int8", 31), ("910b",)),
    "dsa/large_batch_fp8": ("dsa", None, _large_batch_case("fp8", 32), ("950",)),
    "dsa_indexer/short_int8": ("dsa_indexer", "dsa_indexer_short_int8", {}, ("910b",)),
    "dsa_indexer/short_fp8": ("dsa_indexer", "dsa_indexer_short_fp8", {}, ("950",)),
    "mla_prolog/int8_b4_s2": ("mla_prolog", "mla_prolog_int8_b4_s2", {}, ("910b",)),
    "mla_prolog/fp8_kv_split_b4_s2": (
        "mla_prolog",
        None,
        {"path": "fp8", "cache_layout": "kv_split", "seq_lens": (1024, 5000, 2048, 130)},
        ("950",),
    ),
    "dsa_indexer_prolog/int8_pad_h256": (
        "dsa_indexer_prolog",
        None,
        {
            "path": "int8",
            "seq_lens": (1, 17, 40),
            "s1": 1,
            "pad": 2,
            "block_size": 16,
            "hidden": 256,
            "rank": 256,
            "seed": 23,
        },
        ("910b",),
    ),  # fmt: skip
    # the FP8 kernel's branches: a padding token (slot -1), a token in the first slot of a
    # second 32-token page, two K blocks per FP8 linear, two K tiles of x @ w_proj (CALL_PARAMS)
    "dsa_indexer_prolog/fp8_pad_h256": (
        "dsa_indexer_prolog",
        None,
        {
            "path": "fp8",
            "seq_lens": (1, 33),
            "s1": 1,
            "pad": 1,
            "block_size": 32,
            "hidden": 256,
            "rank": 256,
            "seed": 24,
        },
        ("950",),
    ),  # fmt: skip
    "dsa_attention_step/short_int8": (
        "dsa_attention_step",
        "dsa_attention_step_short_int8",
        {},
        SOCS,
    ),  # fmt: skip
}
#: one small entry per kernel family (the SoCs alternating) that
#: tests/device/test_sim_determinism.py interprets under other thread settings and load,
#: asserting its committed digest
LOADED_RUNS = (
    "moe/m3_case_smoke_edge@910b",
    "msa_indexer/nb17@950",
    "msa_decode/partial_nb17@910b",
    "msa_main/unaligned_100@950",
    "dsa/int8_pypto@910b",
    "dsa_indexer/short_fp8@950",
    "mla_prolog/int8_b4_s2@910b",
    "dsa_indexer_prolog/int8_pad_h256@910b",
)
#: entries whose CI check is another sim test's run of the same call, asserting this digest
#: (one interpretation instead of two): tests/digests/test_kernel_digests.py runs them in the
#: ``slow`` set only
SHARED_RUNS = {
    "dsa_attention_step/short_int8@910b": "tests/device/test_dsa_attention_step_sim.py",
    "dsa_attention_step/short_int8@950": "tests/device/test_dsa_attention_step_sim.py",
    "dsa/large_batch_int8@910b": "tests/device/test_dsa_sim.py",
    "dsa/large_batch_fp8@950": "tests/device/test_dsa_sim.py",
    **{key: "tests/device/test_sim_determinism.py" for key in LOADED_RUNS},
}
#: the call parameters an entry adds to its case's: a switch value the kernel is judged with
#: where the case's default is golden-only (the FP8 MLA prolog kernel promotes in two
#: roundings; the layer step's indexer prolog needs a K tile of its linears at H = 7168,
#: docs/ops/dsa_attention_step.md, "Kernel")
CALL_PARAMS = {
    "dsa_attention_step/short_int8": {"index_k_tile": 1024},
    # the FP8 MLA prolog kernel's K-block promotion (docs/ops/mla_prolog.md, "Kernel")
    "mla_prolog/fp8_kv_split_b4_s2": {"fp8_promotion": "two_roundings"},
    # the FP8 indexer prolog kernel's promotion and a K tile of x @ w_proj
    # (docs/ops/dsa_indexer_prolog.md, "Kernel")
    "dsa_indexer_prolog/fp8_pad_h256": {"fp8_promotion": "two_roundings", "k_tile": 128},
}


def entries() -> list[tuple[str, tuple]]:
    """``[(entry id "op/case@soc", (family, name, overrides, soc)), ...]``, fixed order."""
    out = []
    for key, (family, name, over, socs) in _ENTRIES.items():
        for soc in socs:
            out.append((f"{key}@{soc}", (family, name, over, soc)))
    return out


def _case(family, name, over):
    from digests.golden_digests import _build

    return _build(family, name, over)


def kernel_digest(family, name, over, soc, call=None) -> str:
    """Runs in the simulator child: the device op's output digest for one entry (``call``:
    its :data:`CALL_PARAMS`)."""
    import tilesim.device as dev

    from digests.golden_digests import digest_of

    op_name, case = _case(family, name, over)
    kw = {k: v for k, v in case["params"].items() if k != "progress"}
    kw.update(call or {})
    out = getattr(dev, op_name)(**case["inputs"], **kw, backend="sim", soc=soc)
    if isinstance(out, tuple):
        out = out[0]
    if hasattr(out, "detach"):
        from tilesim.shared.interop import to_numpy

        out = to_numpy(out)
    return digest_of(out)


def run_entry(key: str) -> str:
    """The digest of entry ``key`` computed in an isolated simulator process."""
    from tilesim.device import sim

    family, name, over, soc = dict(entries())[key]
    call = CALL_PARAMS.get(key.split("@")[0])
    return sim.isolated(kernel_digest, family, name, over, soc, call, soc=soc)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    got = {}
    for key, _ in entries():
        got[key] = run_entry(key)
        print(key, got[key][:16], file=sys.stderr, flush=True)
    if "--write" in sys.argv:
        DIGEST_FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} digests to {DIGEST_FILE}")
