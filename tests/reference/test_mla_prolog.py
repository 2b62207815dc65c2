"""The MLA prolog golden against the public goldens it claims, restated in torch.

INT8 path: pypto-gym's ``mla_prolog_quant_v32_compute`` (hicann/pypto-gym
``tests/ops/deepseek_v32_exp/test_mla_prolog_quant.py``) step by step in torch. FP8 path:
DeepSeek's ``MLA.forward`` pieces (deepseek-ai/DeepSeek-V3.2-Exp ``inference/model.py``:
``RMSNorm``, ``apply_rotary_emb``, the FP8 KV-cache simulation; ``inference/kernel.py``:
``act_quant``, ``fp8_gemm``) in torch. Each restatement takes two hooks, the FP32 matmul and
the FP32 row sum: with the exact-sum hooks (float64, rounded once: the golden's documented
model of an FP32 accumulator) every output must be bit-identical, which proves every other
step (norm form, quant chain, RoPE, dequant order, cache scatter) bit for bit; with torch's
own FP32 matmul and sum the outputs must stay within pypto-gym's per-output limits.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles.torch_io import np_of, t_of
from tilesim.reference import compare
from tilesim.reference.cases.mla_prolog import GYM_TOLERANCES, mla_prolog_make_case
from tilesim.reference.mla_prolog import mla_prolog
from tilesim.shared.casts import FP8_E4M3
from tilesim.shared.layouts.mla_cache import unpack_rows

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
BF = torch.bfloat16


def _exact_mm(a, b):
    return torch.matmul(a.double(), b.double()).float()


def _exact_sum(v):
    return v.double().sum(dim=-1, keepdim=True).float()


def _torch_mm(a, b):
    return torch.matmul(a, b)


def _torch_sum(v):
    return torch.sum(v, dim=-1, keepdim=True)


@pytest.fixture(scope="module")
def int8_case():
    case = mla_prolog_make_case("mla_prolog_int8_b4_s2", seed=3)
    return case, mla_prolog(**case["inputs"], **case["params"])


@pytest.fixture(scope="module")
def fp8_case():
    """The FP8 case under ``fp8_promotion="two_roundings"``: the restatement below adds the
    K-block products as torch on CPU does (``acc + part * scale``, the product rounded first);
    the default FMA promotion is restated in ``test_fp8_promotion_torch.py``."""
    case = mla_prolog_make_case("mla_prolog_fp8_b4_s2", seed=4)
    params = {**case["params"], "fp8_promotion": "two_roundings"}
    return case, mla_prolog(**case["inputs"], **params)


# ----------------------------------------------------------------------------- pypto-gym
def _gym_rms(v, gamma, rsum):
    v32 = v.float()
    ms = rsum((v32 * v32) * (1.0 / v.shape[-1]))  # scaled squares, then the sum; no epsilon
    return ((v32 / torch.sqrt(ms)) * gamma.float()).to(BF)


def _gym_quant(v):
    v32 = v.float()
    s = 127 / v32.abs().amax(dim=-1, keepdim=True)
    codes = torch.trunc(torch.round(v32 * s).to(torch.int32).to(torch.float16)).to(torch.int8)
    return codes, 1 / s


def _gym_rope(v, cos, sin):
    """De-interleave (pairs -> halves), ``v*cos + rotate_half(v)*sin`` in FP32, BF16 out."""
    v32 = v.float()
    d = v32.shape[-1]
    v32 = v32.reshape(*v32.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(v32.shape)
    half = torch.cat([-v32[..., d // 2 :], v32[..., : d // 2]], dim=-1)
    return (v32 * cos.float() + half * sin.float()).to(BF)


def _gym_golden(inp: dict, mm, rsum) -> dict:
    """pypto-gym's INT8 ("quant_b") MLA prolog golden in torch, with the two hooks."""
    t = {k: t_of(v) for k, v in inp.items() if isinstance(v, np.ndarray)}
    n = t["x"].shape[0]
    q_a = mm(t["x"].float(), t["w_dq"].float()).to(BF)
    qn = _gym_rms(q_a, t["gamma_cq"], rsum)
    qc, qs = _gym_quant(qn)
    acc = torch.matmul(qc.to(torch.int32), t["w_uq_qr"].to(torch.int32)).float()
    q = ((acc * qs) * t["w_uq_qr_scale"].reshape(1, -1)).to(BF).reshape(n, 128, 192)
    nope = mm(q[:, :, :128].permute(1, 0, 2).float(), t["w_uk"].float()).to(BF).permute(1, 0, 2)
    cos, sin = t["cos"][:, None, :], t["sin"][:, None, :]
    kv_a = mm(t["x"].float(), t["w_dkv_kr"].float()).to(BF)
    kvc, kvs = _gym_quant(_gym_rms(kv_a[:, :512], t["gamma_ckv"], rsum).reshape(n, 4, 128))
    kr = _gym_rope(kv_a[:, 512:], t["cos"], t["sin"])
    out = {"query_nope": nope, "query_rope": _gym_rope(q[:, :, 128:], cos, sin),
           "q_norm": qc, "q_norm_scale": qs}  # fmt: skip
    idx = t["slot_mapping"]
    for name, rows in (("kv_cache", kvc.reshape(n, 512)), ("kr_cache", kr),
                       ("kv_scale_cache", kvs.reshape(n, 4))):  # fmt: skip
        cache = t[name].clone()
        flat = cache.reshape(-1, rows.shape[-1])
        for i in range(n):
            flat[int(idx[i])] = rows[i]
        out[name] = cache
    return {k: np_of(v) for k, v in out.items()}


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def test_int8_path_is_pypto_gyms_golden_bit_for_bit(int8_case):
    """With the exact-sum hooks the restated pypto-gym golden and tilesim agree in every bit
    of all seven outputs (NaN-poisoned cache rows included)."""
    case, out = int8_case
    want = _gym_golden(case["inputs"], _exact_mm, _exact_sum)
    for name, w in want.items():
        got = getattr(out, name)
        assert got.dtype == w.dtype and got.shape == w.shape, name
        assert np.array_equal(_bits(got), _bits(w)), name


def test_int8_path_within_pypto_gyms_limits_with_torch_sums(int8_case):
    """With torch's own FP32 matmul and sum (libtorch's order), every output passes
    pypto-gym's own per-output limits, and most elements are still bit-equal."""
    case, out = int8_case
    want = _gym_golden(case["inputs"], _torch_mm, _torch_sum)
    for name, (atol, rtol, ratio) in GYM_TOLERANCES.items():
        got, w = getattr(out, name), want[name]
        live = np.isfinite(w.astype(np.float32)) if w.dtype != np.int8 else slice(None)
        rep = compare(got.astype(np.float32)[live], w.astype(np.float32)[live],
                      atol=atol, rtol=rtol, ratio=ratio)  # fmt: skip
        assert rep.passed, (name, rep.summary())
        assert (_bits(got) == _bits(w)).mean() > 0.9, name


# ----------------------------------------------------------------------------- DeepSeek
def _ds_act_quant(v):
    """``act_quant(v, 128, "ue8m0")``: amax floor 1e-4, scale the power of two above
    ``amax * fp32(1/448)`` (the kernel's exponent bit trick), codes ``clamp(v / s)`` -> E4M3."""
    g = v.float().reshape(*v.shape[:-1], -1, 128)
    amax = g.abs().amax(dim=-1).clamp_min(1e-4)
    bits = (amax * (1 / 448.0)).view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    s = ((e + 127) << 23).view(torch.float32)
    codes = (g / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes.reshape(v.shape), s


def _ds_linear(a, w, ws, mm):
    """``fp8_gemm(act_quant(a))``: per 128-deep K block ``acc += (a_k @ w_k) * (sa * sb)``."""
    codes, sa = _ds_act_quant(a)
    sb = ws.repeat_interleave(128, dim=1)[:, : w.shape[1]]
    acc = torch.zeros(a.shape[0], w.shape[1])
    for k in range(sa.shape[1]):
        part = mm(codes[:, 128 * k : 128 * k + 128].float(), w[128 * k : 128 * k + 128].float())
        acc = acc + part * (sa[:, k : k + 1] * sb[k][None, :])
    return acc.to(BF)


def _ds_rms(v, gamma, eps, rsum):
    v32 = v.float()
    var = rsum(v32.pow(2)) / v32.shape[-1]
    return (gamma.float() * (v32 * torch.rsqrt(var + eps))).to(BF)


def _ds_rope(v, freqs):
    vc = torch.view_as_complex(v.float().reshape(*v.shape[:-1], -1, 2))
    return torch.view_as_real(vc * freqs).flatten(-2).to(BF)


def _ds_golden(inp: dict, mm, rsum) -> dict:
    t = {k: t_of(v) for k, v in inp.items() if isinstance(v, np.ndarray)}
    n = t["x"].shape[0]
    qr = _ds_rms(_ds_linear(t["x"], t["w_dq"], t["w_dq_scale"], mm), t["gamma_cq"], 1e-6, rsum)
    q = _ds_linear(qr, t["w_uq_qr"], t["w_uq_qr_scale"], mm).reshape(n, 128, 192)
    freqs = torch.complex(t["cos"], t["sin"])  # the complex64 freqs_cis rows of the tokens
    nope = mm(q[:, :, :128].permute(1, 0, 2).float(), t["w_uk"].float()).to(BF).permute(1, 0, 2)
    kv_a = _ds_linear(t["x"], t["w_dkv_kr"], t["w_dkv_kr_scale"], mm)
    kv = _ds_rms(kv_a[:, :512], t["gamma_ckv"], 1e-6, rsum)
    codes, s = _ds_act_quant(kv)
    kv_sim = (codes.float().reshape(n, 4, 128) * s[..., None]).reshape(n, 512).to(BF)
    out = {"q_norm": qr, "query_nope": nope, "query_rope": _ds_rope(q[:, :, 128:], freqs[:, None]),
           "kr": _ds_rope(kv_a[:, 512:], freqs), "scales": s, "kv_sim": kv_sim}  # fmt: skip
    out = {k: np_of(v) for k, v in out.items()}
    out["codes"] = codes.view(torch.uint8).numpy().view(FP8_E4M3)
    return out


def test_fp8_path_is_deepseeks_reference_bit_for_bit(fp8_case):
    """DeepSeek's MLA.forward (FP8 linears, RMSNorm, complex RoPE, FP8 KV simulation) in
    torch with the exact-sum hooks: queries, q_norm, and the cache rows' codes, scales and
    rope all bit-identical; the dequantized rows equal DeepSeek's simulated ``kv``."""
    from tilesim.shared.quant import dequantize_latent

    case, out = fp8_case
    want = _ds_golden(case["inputs"], _exact_mm, _exact_sum)
    for name in ("q_norm", "query_nope", "query_rope"):
        assert np.array_equal(_bits(getattr(out, name)), _bits(want[name])), name
    slots = case["inputs"]["slot_mapping"]
    rows = unpack_rows(out.kv_cache, case["params"]["cache_layout"])
    assert np.array_equal(_bits(rows.nope[slots]), _bits(want["codes"]))
    assert np.array_equal(rows.scales[slots], want["scales"])
    assert np.array_equal(_bits(rows.rope[slots]), _bits(want["kr"]))
    deq = dequantize_latent(rows.nope[slots], rows.scales[slots])
    assert np.array_equal(_bits(deq), _bits(want["kv_sim"]))


def test_fp8_path_close_to_deepseek_with_torch_sums(fp8_case):
    """With torch's FP32 sums the queries stay within pypto-gym's query limits."""
    case, out = fp8_case
    want = _ds_golden(case["inputs"], _torch_mm, _torch_sum)
    for name in ("query_nope", "query_rope"):
        atol, rtol, ratio = GYM_TOLERANCES[name]
        rep = compare(getattr(out, name).astype(np.float32), want[name].astype(np.float32),
                      atol=atol, rtol=rtol, ratio=ratio)  # fmt: skip
        assert rep.passed, (name, rep.summary())
