"""Named grouped-GEMM cases (the seeds' test matrix) and a case builder.

The seeds: hicann/pypto-gym, tests/ops/minimax_m27/test_minimax_m27_grouped_gemm.py and
tests/ops/minimax_m3/test_minimax_m3_grouped_gemm.py with their ``test_cases.json``
(docs/sources.md#moe-grouped-gemm, docs/ops/moe.md).

``moe_make_case(name)`` returns the case dict of :mod:`tilesim.shared.registry.case_schema`:
``moe_grouped_gemm(**case["inputs"], **case["params"])`` is the golden, ``case["tolerance"]``
says how a device result is judged (the seeds' ``assert_allclose`` for named cases: every
element, ``ratio`` 0; ``mode="ulp"`` for custom cases, which have no published tolerance).
:data:`CASE_INFO` describes the named cases for the registry.

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
from tilesim.shared.models import ACTIVATIONS, MoeDims
from tilesim.shared.moe import OP_NAME
from tilesim.shared.registry.case_schema import CaseInfo, make_case, tolerance
from tilesim.shared.tiling import MoeTiling
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_elements,
    check_float,
    check_int,
    check_pos_int,
)
from tilesim.shared.weights import convert_minimax_weights

#: the seeds' named cases. ``rtol``/``atol`` apply elementwise as
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
_BUILDER = "tilesim.reference.cases.moe:moe_make_case"

#: registry facts of the named cases (the seeds' tests carry no SoC marker; their README
#: targets the 910B)
_CASE_FACTS = {
    "m27_case_001": {
        "model": "MiniMax-M2.7",
        "size": "medium",
        "summary": "E 8, H 3072, I 1536, silu, counts [0,1,2,4,8,16,32,0], scales 0.02/0.02",
    },
    "m3_case_smoke_edge": {
        "model": "MiniMax-M3",
        "size": "small",
        "summary": "E 4, H 256, I 128, swigluoai, counts [1,0,3,4], scales 0.5/0.3, "
        "unroll 1,2,4 (clamp fires)",
    },
}


def _case_tolerance(spec: dict) -> dict:
    """The seeds' ``assert_allclose`` (every element) when rtol and atol are known, else the
    op's ULP budget (``mode="ulp"``)."""
    if spec["atol"] is None or spec["rtol"] is None:
        return tolerance(mode="ulp")
    return tolerance(spec["atol"], spec["rtol"], ratio=0.0, mode="compare")


CASE_INFO: dict[str, CaseInfo] = {
    name: CaseInfo(
        name=name,
        family="moe",
        op=OP_NAME,
        model=facts["model"],
        summary=facts["summary"],
        seed=MOE_CASES[name]["seed"],
        size=facts["size"],
        tolerance=_case_tolerance(MOE_CASES[name]),
        builder=_BUILDER,
        notes={"soc_note": "no marker (README targets 910B)"},
    )
    for name, facts in _CASE_FACTS.items()
}


def scaled_bf16_normal(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    """``bf16(fp32(bf16(randn)) * fp32(scale))`` — a BF16 randn times a Python float."""
    base = to_bf16(rng.standard_normal(shape, dtype=np.float32))
    return to_bf16(widen_to_fp32(base) * np.float32(scale))


def _check_sequence(v, name: str) -> None:
    if not isinstance(v, (tuple, list, np.ndarray)):
        raise TypeError(f"{name}: expected a tuple of ints, got {type(v).__name__} {v!r}")


def _check_counts(counts, num_experts: int) -> tuple[int, ...]:
    _check_sequence(counts, "counts")
    check_elements((num_experts,), "num_experts", "counts")
    if len(counts) != num_experts:
        raise ValueError(f"counts: expected {num_experts} non-negative ints, got {counts!r}")
    return tuple(check_int(c, f"counts[{j}]", lo=0) for j, c in enumerate(counts))


def _check_spec(spec: dict) -> dict:
    """The case fields, checked and normalised (``ValueError`` / ``TypeError`` naming one)."""
    for key in ("num_experts", "hidden_size", "intermediate_size"):
        spec[key] = check_pos_int(spec[key], key)
    spec["activation"] = check_choice(spec["activation"], "activation", ACTIVATIONS)
    spec["counts"] = _check_counts(spec["counts"], spec["num_experts"])
    spec["seed"] = check_int(spec["seed"], "seed", lo=0)
    for key in ("input_scale", "weight_scale"):
        spec[key] = check_float(spec[key], key, fp32=True)
    for key in ("rtol", "atol"):
        if spec[key] is not None:
            spec[key] = check_float(spec[key], key)
            if spec[key] < 0:
                raise ValueError(f"{key}: expected a number >= 0, got {spec[key]!r}")
    _check_sequence(spec["unroll"], "unroll")
    spec["unroll"] = tuple(check_pos_int(f, f"unroll[{j}]") for j, f in enumerate(spec["unroll"]))
    for key in ("assert_clamp", "seed_golden_round_activation"):
        spec[key] = check_bool(spec[key], key)
    e, h, i = spec["num_experts"], spec["hidden_size"], spec["intermediate_size"]
    check_elements((sum(spec["counts"]), h), "counts, hidden_size", "sorted_tokens")
    check_elements((e, 2 * i, h), "num_experts, hidden_size, intermediate_size", "gate_up_proj")
    return spec


def _case_spec(name, seed, params: dict, progress):
    """(spec, dims overrides, tiling overrides, round_activation) of one request."""
    if progress is not None:
        check_bool(progress, "progress")
    if name is None:
        spec = dict(_CUSTOM_DEFAULTS)
    elif isinstance(name, str) and name in MOE_CASES:
        spec = dict(MOE_CASES[name])
    else:
        raise ValueError(f"name: expected None or one of {sorted(MOE_CASES)}, got {name!r}")
    dim_over = {k: params.pop(k) for k in _DIM_KEYS if k in params}
    tile_over = {k: params.pop(k) for k in _TILING_KEYS if k in params}
    round_activation = check_bool(params.pop("round_activation", True), "round_activation")
    unknown = set(params) - set(spec)
    if unknown:
        raise ValueError(f"moe_make_case: unknown parameter(s) {sorted(unknown)}")
    spec.update(params)
    if seed is not None:
        spec["seed"] = seed
    return _check_spec(spec), dim_over, tile_over, round_activation


def _draw_inputs(spec: dict, dims: MoeDims) -> dict:
    e, h, i = dims.num_experts, dims.hidden_size, dims.intermediate_size
    rng = np.random.default_rng(spec["seed"])
    tokens = scaled_bf16_normal(rng, (sum(spec["counts"]), h), spec["input_scale"])
    gate_up = scaled_bf16_normal(rng, (e, 2 * i, h), spec["weight_scale"])
    down = scaled_bf16_normal(rng, (e, h, i), spec["weight_scale"])
    cumsum = np.zeros(e + 1, dtype=np.int32)
    cumsum[1:] = np.cumsum(spec["counts"])
    return {
        "sorted_tokens": tokens,
        "weights": convert_minimax_weights(gate_up, down),
        "expert_cumsum": cumsum,
    }


def moe_make_case(
    name: str | None = None, *, seed: int | None = None, progress: bool | None = None, **params
) -> dict:
    """Build a grouped-GEMM case (the schema of
    :func:`tilesim.shared.registry.case_schema.make_case`).

    Args:
        name: a key of :data:`MOE_CASES`, or None for a custom case (defaults: E 4, H 256,
            I 128, silu, counts (3, 0, 5, 8), input scale 1, weight scale 1/16).
        seed: overrides the case's seed (a non-negative int).
        progress: ``None`` or a bool; the builder draws no progress bar (checked, ignored).
        **params: overrides of the case fields (``num_experts``, ``hidden_size``,
            ``intermediate_size``, ``activation``, ``counts``, ``input_scale``,
            ``weight_scale``, ``rtol``, ``atol``, ``unroll``), of :class:`MoeDims` fields
            (``alpha``, ``limit``, ``beta``, ``gate_up_layout``), of :class:`MoeTiling` K/N
            tiles (``mm1_k``, ``mm2_k``, ``mm1_n``, ``mm2_n``, ``vec_tile``) and
            ``round_activation`` (default True, the kernel).

    Returns:
        ``{"name", "op": "moe_grouped_gemm", "inputs": {"sorted_tokens", "weights",
        "expert_cumsum"}, "params": {"dims", "tiling", "round_activation"}, "tolerance",
        "meta": {...the case fields...}}``. ``name`` is None for a custom case; its tolerance
        is ``mode="ulp"`` (judge with the ULP budget of ``docs/ops/moe.md``) unless both
        ``rtol`` and ``atol`` are given.
    """
    spec, dim_over, tile_over, round_activation = _case_spec(name, seed, dict(params), progress)
    dims = MoeDims(
        spec["num_experts"],
        spec["hidden_size"],
        spec["intermediate_size"],
        spec["activation"],
        **dim_over,
    )
    tiling = MoeTiling.default(dims.activation).replace(unroll=spec["unroll"], **tile_over)
    if dims.activation == "swigluoai":
        tiling = tiling.replace(swiglu_alpha=float(dims.alpha), swiglu_limit=float(dims.limit))
    return make_case(
        name=name,
        op=OP_NAME,
        inputs=_draw_inputs(spec, dims),
        params={"dims": dims, "tiling": tiling, "round_activation": round_activation},
        tolerance=_case_tolerance(spec),
        meta=spec,
    )


__all__ = ["CASE_INFO", "MOE_CASES", "moe_make_case", "scaled_bf16_normal"]
