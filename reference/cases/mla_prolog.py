"""Named cases of the DeepSeek-V3.2 MLA prolog (``mla_prolog``, docs/ops/mla_prolog.md).

One builder, :func:`mla_prolog_make_case`, draws every input of a call from a seeded NumPy
generator (the same arguments give the same arrays):

* ``path="int8"`` -- pypto-gym's ``test_mla_prolog_quant.py`` parameters (hicann/pypto-gym
  ``tests/ops/deepseek_v32_exp/``): ``x ~ U(-1, 1)``, ``w_dq``, ``w_uq_qr``, ``w_uk``,
  ``w_dkv_kr ~ U(-0.1, 0.1)`` in BF16, ``w_uq_qr`` then INT8-quantized per output column with
  its own rule (dequant scale ``1 / (127 / colmax)``), ``gamma ~ U(-1, 1)``, block size 128,
  blocks in a random permutation, INT8 / BF16 / FP32 caches in its ``[blocks, 128, 1, d]``
  shapes. ``cos``/``sin``: ``rope="random"`` is its ``U(-0.1, 0.1)`` stand-in ``[T, 64]``
  BF16; ``rope="yarn"`` the real YaRN table (:mod:`tilesim.shared.rope`) in halves, BF16.
* ``path="fp8"`` -- DeepSeek's reference: FP8 E4M3 weights with FP32 128 x 128 block scales
  (``amax / 448`` per block of the same BF16 draws, or with ``weight_scale="ue8m0"`` the power
  of two at or above it, as DeepSeek-V3.2's checkpoints hold), ``w_uk`` BF16, the YaRN table in FP32
  ``[T, 32]`` at the tokens' positions, a packed ``[rows, 656]`` cache (``cache_layout``).

Unwritten cache rows are poisoned (FP32 / BF16 NaN, FP8 NaN codes, INT8 -128) so that a
golden or kernel that reads or writes a row it should not is visible. ``pad`` tokens get slot
``-1`` (vLLM padding). ``progress``: accepted for the family's interface (the build takes
seconds); ``True`` prints one line per stage.
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.cases.dsa_common import (
    builder_arguments,
    check_paged_cache,
    table_case_info,
    yarn_rope_inputs,
)
from tilesim.reference.mla_prolog import quant_int8_gym
from tilesim.shared.casts import BF16, FP8_E4M3, FP8_E4M3_MAX, to_bf16, to_fp8_e4m3
from tilesim.shared.layouts.mla_cache import (
    CACHE_LAYOUTS,
    NOPE,
    NSCALES,
    PATH_CACHE_LAYOUT,
    PYPTO_ROW_BYTES,
    ROPE,
    is_packed,
)
from tilesim.shared.layouts.slots import NO_SLOT, slots_from_block_table
from tilesim.shared.mla_prolog import (
    BLOCK,
    HEADS,
    HIDDEN,
    KV_A,
    KV_LORA,
    Q_HEAD,
    Q_LORA,
    QK_NOPE,
)
from tilesim.shared.quant import _ue8m0
from tilesim.shared.registry.case_schema import CaseInfo, make_case, tolerance
from tilesim.shared.validate import check_choice, check_int, check_int_sequence

BUILDER = "tilesim.reference.cases.mla_prolog:mla_prolog_make_case"
#: the FP8 weights' block scales a case draws: ``"amax448"`` (``amax / 448`` per block, every
#: significand bit in use) and ``"ue8m0"`` (the power of two at or above it, the
#: ``"scale_fmt": "ue8m0"`` of DeepSeek-V3.2's checkpoints; docs/ops/mla_prolog.md)
WEIGHT_SCALES = ("amax448", "ue8m0")
#: pypto-gym's per-output limits of test_mla_prolog_quant.py: name -> (atol, rtol, ratio)
GYM_TOLERANCES = {
    "query_nope": (0.005, 2.0**-7, 0.005),
    "query_rope": (0.005, 2.0**-7, 0.005),
    "q_norm": (1.0, 0.0, 0.005),
    "q_norm_scale": (2.5e-5, 0.005, 0.005),
    "kv_cache": (1.0, 0.0, 0.0),
    "kr_cache": (1e-4, 2.0**-7, 0.0),
    "kv_scale_cache": (2.5e-5, 0.005, 0.0),
}

_DEFAULTS = {"path": "int8", "b": 4, "s1": 2, "seq_lens": (1024,) * 4, "rope": None,
             "cache_layout": None, "pad": 0, "block_size": 128,
             "weight_scale": "amax448"}  # fmt: skip

# name -> (builder params, size, status, summary)
_TABLE = {
    "mla_prolog_int8_b4_s2": (dict(), "small", "runs",
                              "pypto-gym shape: B 4, s1 2, s2 1024, INT8, random cos/sin"),
    "mla_prolog_int8_b4_s2_yarn": (dict(rope="yarn", seq_lens=(1024, 5000, 2048, 130)),
                                   "small", "tilesim extra",
                                   "B 4, s1 2, INT8, real YaRN table (BF16 halves)"),
    "mla_prolog_int8_pad": (dict(b=2, seq_lens=(300, 1), pad=2), "small", "tilesim extra",
                            "B 2, s1 2, a 1-token sequence and 2 padding tokens (slot -1)"),
    "mla_prolog_fp8_b4_s2": (dict(path="fp8", seq_lens=(1024, 5000, 2048, 130)), "small",
                             "tilesim extra", "DeepSeek reference, FP8, pypto 656-byte rows"),
    "mla_prolog_fp8_b4_s2_flashmla": (dict(path="fp8", cache_layout="flashmla"), "small",
                                      "tilesim extra", "FP8, FlashMLA 656-byte rows"),
    "mla_prolog_fp8_b4_s2_ue8m0": (dict(path="fp8", seq_lens=(1024, 5000, 2048, 130),
                                        weight_scale="ue8m0"), "small", "tilesim extra",
                                   "FP8, power-of-two (UE8M0) weight block scales"),
    "mla_prolog_int8_b64_s2": (dict(b=64, seq_lens=(1024,) * 64), "medium", "skip: large",
                               "pypto-gym shape: B 64, s1 2 (T 128), INT8"),
    "mla_prolog_int8_b128_s1_p": (dict(b=128, s1=1, seq_lens=(1024,) * 128), "medium",
                                  "skip: large", "pypto-gym prefill shape: B 128, s1 1, INT8"),
}  # fmt: skip


def _checked(p: dict) -> dict:
    """``p`` (the merged builder parameters) checked, in place; returns ``p``."""
    check_choice(p["path"], "path", ("int8", "fp8"))
    p["b"] = check_int(p["b"], "b", lo=1, hi=256)
    p["s1"] = check_int(p["s1"], "s1", lo=1, hi=16)
    p["pad"] = check_int(p["pad"], "pad", lo=0, hi=64)
    p["seq_lens"] = check_int_sequence(p["seq_lens"], "seq_lens", lo=1, hi=1 << 20)
    if len(p["seq_lens"]) != p["b"]:
        raise ValueError(f"seq_lens: expected {p['b']} lengths (b), got {len(p['seq_lens'])}")
    if p["rope"] is None:
        p["rope"] = "random" if p["path"] == "int8" else "yarn"
    check_choice(p["rope"], "rope", ("random", "yarn"))
    if p["path"] == "fp8" and p["rope"] != "yarn":
        raise ValueError(f"rope: expected 'yarn' on the fp8 path, got {p['rope']!r}")
    if p["cache_layout"] is not None:
        check_choice(p["cache_layout"], "cache_layout", CACHE_LAYOUTS)
    check_paged_cache(p, PYPTO_ROW_BYTES, "kv_cache")
    check_choice(p["weight_scale"], "weight_scale", WEIGHT_SCALES)
    if p["path"] == "int8" and p["weight_scale"] != "amax448":
        raise ValueError(f"weight_scale: expected 'amax448' on the int8 path (no FP8 weights), "
                         f"got {p['weight_scale']!r}")  # fmt: skip
    return p


def _bf16_uniform(rng, lo: float, hi: float, shape) -> np.ndarray:
    return to_bf16(rng.uniform(lo, hi, shape).astype(np.float32))


def _fp8_blocks(w: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """BF16 ``w [K, N]`` -> FP8 codes and FP32 ``[K/128, ceil(N/128)]`` scales: ``amax / 448``
    (``kind="amax448"``) or the power of two at or above it (``"ue8m0"``, DeepSeek's
    ``scale_fmt`` of V3.1 / V3.2 checkpoints)."""
    k, n = w.shape
    nb = -(-n // BLOCK)
    wp = np.zeros((k, nb * BLOCK), np.float32)
    wp[:, :n] = w.astype(np.float32)
    g = wp.reshape(k // BLOCK, BLOCK, nb, BLOCK)
    s = np.maximum(np.abs(g).max(axis=(1, 3)), np.float32(1e-8)) / np.float32(FP8_E4M3_MAX)
    if kind == "ue8m0":
        s = _ue8m0(s)
    codes = to_fp8_e4m3(g / s[:, None, :, None]).reshape(k, nb * BLOCK)[:, :n]
    return np.ascontiguousarray(codes), s.astype(np.float32)


def _weights(p: dict, rng) -> dict:
    w_dq = _bf16_uniform(rng, -0.1, 0.1, (HIDDEN, Q_LORA))
    w_uq = _bf16_uniform(rng, -0.1, 0.1, (Q_LORA, HEADS * Q_HEAD))
    w_dkv = _bf16_uniform(rng, -0.1, 0.1, (HIDDEN, KV_A))
    out = {
        "w_uk": _bf16_uniform(rng, -0.1, 0.1, (HEADS, QK_NOPE, KV_LORA)),
        "gamma_cq": _bf16_uniform(rng, -1, 1, (Q_LORA,)),
        "gamma_ckv": _bf16_uniform(rng, -1, 1, (KV_LORA,)),
    }
    if p["path"] == "int8":
        codes_t, scale = quant_int8_gym(np.ascontiguousarray(w_uq.T), Q_LORA)  # per column
        out.update(w_dq=w_dq, w_uq_qr=np.ascontiguousarray(codes_t.T), w_dkv_kr=w_dkv,
                   w_uq_qr_scale=scale.reshape(-1))  # fmt: skip
        return out
    for name, w in (("w_dq", w_dq), ("w_uq_qr", w_uq), ("w_dkv_kr", w_dkv)):
        out[name], out[name + "_scale"] = _fp8_blocks(w, p["weight_scale"])
    return out


def _caches(p: dict, n_blocks: int, layout: str) -> dict:
    rows, bs = n_blocks * p["block_size"], p["block_size"]
    if is_packed(layout):  # FP8 packed rows, every byte a NaN code / NaN scale
        return {"kv_cache": np.full((rows, PYPTO_ROW_BYTES), 0x7F, np.uint8).view(FP8_E4M3)}
    qdt = np.int8 if p["path"] == "int8" else FP8_E4M3
    kv = np.full((n_blocks, bs, 1, NOPE), 0x80 if qdt == np.int8 else 0x7F, np.uint8)
    kr = np.full((n_blocks, bs, 1, ROPE), 0x7FC0, np.uint16).view(BF16)
    ks = np.full((n_blocks, bs, 1, NSCALES), np.nan, np.float32)
    return {"kv_cache": kv.view(qdt), "kr_cache": kr, "kv_scale_cache": ks}


def _rope_inputs(p: dict, rng, positions: np.ndarray) -> dict:
    t = positions.size
    if p["rope"] == "random":
        return {"cos": _bf16_uniform(rng, -0.1, 0.1, (t, ROPE)),
                "sin": _bf16_uniform(rng, -0.1, 0.1, (t, ROPE))}  # fmt: skip
    return yarn_rope_inputs(p["path"], np.maximum(positions, 0), 1 << 20)


def _say(progress, what: str) -> None:
    if progress:
        print(f"mla_prolog case: {what}", flush=True)


def _slots(table, lens, s1: int, bs: int) -> np.ndarray:
    """The slots of each sequence's ``s1`` newest positions, batch-major ``[B * s1]``: a
    sequence shorter than ``s1`` pads its missing leading tokens with ``-1`` (not written)."""
    real = np.minimum(lens, s1)
    slots = np.full((lens.size, s1), NO_SLOT, np.int64)
    slots[np.arange(s1)[None, :] >= s1 - real[:, None]] = slots_from_block_table(
        table, lens, q_lens=real, block_size=bs
    )
    return slots.reshape(-1)


def mla_prolog_make_case(name: str | None = None, *, seed: int = 0, progress=None,
                         **params) -> dict:  # fmt: skip
    """Build one case: a named entry of :data:`CASE_INFO` (``params`` override its builder
    parameters) or, with ``name=None``, an ad-hoc one.

    Builder parameters: ``path`` (``"int8"`` / ``"fp8"``), ``b``, ``s1`` (new tokens per
    sequence), ``seq_lens`` (lengths after the new tokens), ``rope`` (``"random"`` /
    ``"yarn"``), ``cache_layout`` (``None``: the path's default), ``pad`` (padding tokens with
    slot ``-1``), ``block_size``, ``weight_scale`` (FP8 weight block scales: ``"amax448"``,
    ``amax / 448``; ``"ue8m0"``, powers of two). Returns the case dict (op ``mla_prolog``);
    ``meta`` holds the seed, the parameters, the block table and the positions."""
    seed, p = builder_arguments("mla_prolog_make_case", name, seed, progress, params, _DEFAULTS,
                                _TABLE)  # fmt: skip
    p = _checked(p)
    rng = np.random.default_rng(seed)
    bs = p["block_size"]
    per = [-(-n // bs) for n in p["seq_lens"]]
    n_blocks = sum(per)
    perm = rng.permutation(n_blocks)
    table = np.full((p["b"], max(per)), -1, np.int32)
    for b, start in enumerate(np.cumsum([0] + per[:-1])):
        table[b, : per[b]] = perm[start : start + per[b]]
    slots = _slots(table, np.asarray(p["seq_lens"]), p["s1"], bs)
    pos = (np.asarray(p["seq_lens"])[:, None] - p["s1"] + np.arange(p["s1"])).reshape(-1)
    slots = np.concatenate([slots, np.full(p["pad"], -1, np.int64)])
    pos = np.concatenate([pos, np.zeros(p["pad"], np.int64)])
    _say(progress, "weights")
    inputs = {"x": _bf16_uniform(rng, -1, 1, (slots.size, HIDDEN)), **_weights(p, rng)}
    inputs.update(_rope_inputs(p, rng, pos))
    layout = p["cache_layout"] or PATH_CACHE_LAYOUT[p["path"]]
    inputs.update(slot_mapping=slots, **_caches(p, n_blocks, layout))
    _say(progress, "caches")
    params_ = {"path": p["path"], "cache_layout": layout}
    meta = {"seed": seed, "builder_params": p, "block_table": table, "positions": pos}
    return make_case(name=name, op="mla_prolog", inputs=inputs, params=params_,
                     tolerance=_tol(), meta=meta)  # fmt: skip


def _tol() -> dict:
    atol, rtol, ratio = GYM_TOLERANCES["query_nope"]
    return tolerance(atol=atol, rtol=rtol, ratio=ratio, mode="compare")


def _case_info(name: str) -> CaseInfo:
    return table_case_info(name, _TABLE, op="mla_prolog", builder=BUILDER, tolerance=_tol(),
                           rule="pypto-gym's per-output limits (GYM_TOLERANCES); queries "
                                "shown")  # fmt: skip


#: every named case (``mla_prolog_make_case(name)`` builds it), for the CLI registry
CASE_INFO: dict[str, CaseInfo] = {n: _case_info(n) for n in _TABLE}

__all__ = ["CASE_INFO", "GYM_TOLERANCES", "WEIGHT_SCALES", "mla_prolog_make_case"]
