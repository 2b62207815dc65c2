"""Named grouped-GEMM cases (the seeds' test matrix, ``op-facts`` §1.8) and a case builder.

``moe_make_case(name)`` returns ``{"inputs": {...}, "params": {...}, ...}`` such that
``moe_grouped_gemm(**case["inputs"], **case["params"])`` runs; the extra keys carry the seed
tolerance and the case description.

Data: ``numpy.random.default_rng(seed)`` standard-normal draws in FP32, rounded to BF16, then
scaled the way the seeds do it — a BF16 tensor times a Python float, i.e. ``bf16(fp32(x) *
fp32(scale))``. Draw order as in the seeds: ``sorted_tokens [N, H]``, ``gate_up_proj
[E, 2I, H]``, ``down_proj [E, H, I]``, then :func:`tilesim.shared.convert_minimax_weights`.
The seeds draw with torch's device RNG on the NPU (``torch.manual_seed``), so the same seed
gives DIFFERENT numbers here; the distributions, shapes, scales and tolerances are the seeds'.
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.casts import to_bf16, widen_to_fp32
from tilesim.shared.models import MoeDims
from tilesim.shared.tiling import MoeTiling
from tilesim.shared.weights import convert_minimax_weights

#: the seeds' named cases (``op-facts`` §1.8). ``rtol``/``atol`` apply elementwise as
#: ``|a - g| <= atol + rtol * |g|`` to every element (numpy ``assert_allclose``).
MOE_CASES: dict[str, dict] = {
    "m27_case_001": {
        "num_experts": 8,
        "hidden_size": 3072,
        "intermediate_size": 1536,
        "activation": "silu",
        "counts": (0, 1, 2, 4, 8, 16, 32, 0),
        "seed": 321,
        "input_scale": 0.02,
        "weight_scale": 0.02,
        "rtol": 0.008,
        "atol": 0.008,
        "unroll": (1, 2, 4, 8, 16, 32, 64),
        "assert_clamp": False,
        # the M2.7 seed golden keeps the activation in FP32 (the kernel rounds it)
        "seed_golden_round_activation": False,
    },
    "m3_case_smoke_edge": {
        "num_experts": 4,
        "hidden_size": 256,
        "intermediate_size": 128,
        "activation": "swigluoai",
        "counts": (1, 0, 3, 4),
        "seed": 99,
        "input_scale": 0.5,
        "weight_scale": 0.3,
        "rtol": 0.015,
        "atol": 0.5,
        "unroll": (1, 2, 4),
        "assert_clamp": True,
        "seed_golden_round_activation": True,
    },
}

#: defaults of a custom case (``name=None``): small, O(1) outputs (weight scale 1/sqrt(H))
_CUSTOM_DEFAULTS = {
    "num_experts": 4,
    "hidden_size": 256,
    "intermediate_size": 128,
    "activation": "silu",
    "counts": (3, 0, 5, 8),
    "seed": 0,
    "input_scale": 1.0,
    "weight_scale": 0.0625,
    "rtol": None,
    "atol": None,
    "unroll": (1, 2, 4, 8, 16, 32, 64),
    "assert_clamp": False,
    "seed_golden_round_activation": True,
}

_DIM_KEYS = ("alpha", "limit", "beta", "gate_up_layout")
_TILING_KEYS = ("mm1_k", "mm2_k", "mm1_n", "mm2_n", "vec_tile")


def scaled_bf16_normal(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    """``bf16(fp32(bf16(randn)) * fp32(scale))`` — a BF16 randn times a Python float."""
    base = to_bf16(rng.standard_normal(shape, dtype=np.float32))
    return to_bf16(widen_to_fp32(base) * np.float32(scale))


def moe_make_case(name: str | None = None, *, seed: int | None = None, **params) -> dict:
    """Build a grouped-GEMM case.

    Args:
        name: a key of :data:`MOE_CASES`, or None for a custom case (defaults: E 4, H 256,
            I 128, silu, counts (3, 0, 5, 8), input scale 1, weight scale 1/16).
        seed: overrides the case's seed.
        **params: overrides of the case fields (``num_experts``, ``hidden_size``,
            ``intermediate_size``, ``activation``, ``counts``, ``input_scale``,
            ``weight_scale``, ``rtol``, ``atol``, ``unroll``), of :class:`MoeDims` fields
            (``alpha``, ``limit``, ``beta``, ``gate_up_layout``), of :class:`MoeTiling` K/N
            tiles (``mm1_k``, ``mm2_k``, ``mm1_n``, ``mm2_n``, ``vec_tile``) and
            ``round_activation`` (default True, the kernel).

    Returns:
        ``{"name", "inputs": {"sorted_tokens", "weights", "expert_cumsum"},
        "params": {"dims", "tiling", "round_activation"}, "tolerance": {"rtol", "atol"},
        "meta": {...the case fields...}}``. ``tolerance`` values are None for custom cases
        (no seed tolerance exists; judge those with ULP bounds, see ``docs/ops/moe.md``).
    """
    if name is None:
        spec = dict(_CUSTOM_DEFAULTS)
    elif name in MOE_CASES:
        spec = dict(MOE_CASES[name])
    else:
        raise ValueError(f"name: expected None or one of {sorted(MOE_CASES)}, got {name!r}")
    dim_over = {k: params.pop(k) for k in _DIM_KEYS if k in params}
    tile_over = {k: params.pop(k) for k in _TILING_KEYS if k in params}
    round_activation = params.pop("round_activation", True)
    unknown = set(params) - set(spec)
    if unknown:
        raise ValueError(f"moe_make_case: unknown parameter(s) {sorted(unknown)}")
    spec.update(params)
    if seed is not None:
        spec["seed"] = seed
    counts = tuple(int(c) for c in spec["counts"])
    if len(counts) != spec["num_experts"] or any(c < 0 for c in counts):
        raise ValueError(
            f"counts: expected {spec['num_experts']} non-negative ints, got {spec['counts']!r}"
        )
    spec["counts"] = counts

    dims = MoeDims(
        spec["num_experts"],
        spec["hidden_size"],
        spec["intermediate_size"],
        spec["activation"],
        **dim_over,
    )
    tiling = MoeTiling.default(dims.activation).replace(unroll=tuple(spec["unroll"]), **tile_over)
    if dims.activation == "swigluoai":
        tiling = tiling.replace(swiglu_alpha=float(dims.alpha), swiglu_limit=float(dims.limit))

    e, h, i = dims.num_experts, dims.hidden_size, dims.intermediate_size
    rng = np.random.default_rng(spec["seed"])
    tokens = scaled_bf16_normal(rng, (sum(counts), h), spec["input_scale"])
    gate_up = scaled_bf16_normal(rng, (e, 2 * i, h), spec["weight_scale"])
    down = scaled_bf16_normal(rng, (e, h, i), spec["weight_scale"])
    w13, w2 = convert_minimax_weights(gate_up, down)
    cumsum = np.zeros(e + 1, dtype=np.int32)
    cumsum[1:] = np.cumsum(counts)
    return {
        "name": name or "custom",
        "inputs": {"sorted_tokens": tokens, "weights": (w13, w2), "expert_cumsum": cumsum},
        "params": {"dims": dims, "tiling": tiling, "round_activation": round_activation},
        "tolerance": {"rtol": spec["rtol"], "atol": spec["atol"]},
        "meta": spec,
    }


__all__ = ["MOE_CASES", "moe_make_case", "scaled_bf16_normal"]
