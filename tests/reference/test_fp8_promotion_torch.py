"""DeepSeek's FP8 block GEMM with its fused multiply-add, restated in torch, against the FP8
MLA prolog and the FP8 indexer prolog.

``deepseek-ai/DeepSeek-V3.2-Exp:inference/kernel.py`` ``fp8_gemm`` promotes each 128-deep K
block as ``C_local_accum += C_local * Scale_C_shared`` (``Scale_C = scales_a * scales_b``, an
FP32 product); nvcc's default ``--fmad=true`` contracts the multiply-add into one FMA, one
rounding. torch has no FMA on CPU, so :func:`_fma32` emulates it exactly, written apart from
the golden's (:func:`tilesim.reference.util.arith.fma_fp32`, TwoSum and rounding to odd): the
exact product in float64, Fast2Sum for the error of the float64 sum, and where the float64
sum is an FP32 midpoint the error's sign picks the neighbour.

The prologs' other steps (``act_quant`` with UE8M0 scales, DeepSeek's RMSNorm, complex RoPE,
the FP8 KV simulation; the indexer's LayerNorm, halves RoPE, fast Hadamard transform) are
restated here too, with the exact-sum model of an FP32 accumulator (float64, rounded once),
and every FP8 output must equal the golden's bit for bit with ``amax / 448`` and with
power-of-two weight scales. With ``fp8_promotion="two_roundings"`` the golden must differ on
the ``amax / 448`` case: the switch matters.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles.deepseek_torch import ds_rope
from tilesim.reference import dsa_indexer_prolog, dsa_indexer_prolog_make_case
from tilesim.reference.cases.mla_prolog import mla_prolog_make_case
from tilesim.reference.mla_prolog import mla_prolog
from tilesim.shared.interop import to_numpy, to_torch
from tilesim.shared.layouts.index_cache import unpack_fp8_pages
from tilesim.shared.layouts.mla_cache import unpack_rows

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
BF = torch.bfloat16


# ----------------------------------------------------------------------------- the FMA
def _fma32(p, s, c):
    """FP32 ``p * s + c`` rounded once (round to nearest even) for finite FP32 tensors."""
    prod = p.double() * s.double()  # exact: 24 + 24 significand bits
    c64 = c.double().expand_as(prod)
    big = torch.where(prod.abs() >= c64.abs(), prod, c64)
    small = torch.where(prod.abs() >= c64.abs(), c64, prod)
    s64 = big + small
    err = small - (s64 - big)  # Fast2Sum: big + small == s64 + err exactly
    r = s64.float()
    toward = torch.nextafter(r, torch.where(s64 > r.double(), torch.inf, -torch.inf).float())
    mid = (r.double() + toward.double()) / 2 == s64  # s64 sits halfway between r and toward
    up = torch.maximum(r, toward)
    down = torch.minimum(r, toward)
    fixed = torch.where(err > 0, up, down)
    return torch.where(mid & (err != 0), fixed, r)


def test_fma32_is_one_rounding():
    """The emulation on hand-made cases: a double-rounding trap either way, an exact
    midpoint (ties to even), a product that is not exact in FP32."""
    one = torch.tensor([1.0])
    odd = torch.tensor([1.0 + 2.0**-23])
    a = torch.tensor([1.0 + 2.0**-23])
    b = torch.tensor([2.0**-24 * (1 - 2.0**-23)])  # a * b = 2^-24 - 2^-70
    assert _fma32(a, b, odd).item() == 1.0 + 2.0**-23  # float64 sum is a midpoint; below it
    assert _fma32(a, b, one).item() == 1.0
    assert _fma32(-a, b, -odd).item() == -(1.0 + 2.0**-23)
    half = torch.tensor([2.0**-24])
    assert _fma32(half, one, odd).item() == 1.0 + 2.0**-22  # a true tie: to even
    x = torch.tensor([1.0 + 2.0**-12])  # x * x = 1 + 2^-11 + 2^-24: FP32 rounds off 2^-24
    base = torch.tensor([1.0 + 2.0**-11])
    assert _fma32(x, x, -base).item() == 2.0**-24
    assert (x * x - base).item() == 0.0


# ----------------------------------------------------------------------------- fp8_gemm
def _mm(a, b):
    """The FP32 accumulator's model: the exact float64 sum of exact products, rounded once."""
    return torch.matmul(a.double(), b.double()).float()


def _act_quant(x):
    """``act_quant(x, 128, "ue8m0")``: amax floor 1e-4, the scale the power of two at or
    above ``amax * (1/448)``, codes ``e4m3(clamp(x / s))``."""
    g = x.float().unflatten(-1, (-1, 128))
    amax = g.abs().amax(-1).clamp(min=1e-4)
    m, e = torch.frexp(amax * (1.0 / 448))
    s = torch.ldexp(torch.ones_like(amax), e - (m == 0.5).to(e.dtype))
    return (g / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).flatten(-2), s


def _fp8_gemm(a, w, w_scale):
    """``fp8_gemm(act_quant(a), w)``: per 128-deep K block the FP32 partial of the FP8
    values, the FP32 scale ``sa * sb`` and one FMA into the FP32 accumulator; BF16 out."""
    codes, sa = _act_quant(a)
    sb = w_scale.repeat_interleave(128, dim=1)[:, : w.shape[1]]
    acc = torch.zeros(a.shape[0], w.shape[1])
    for kb in range(sa.shape[1]):
        ks = slice(128 * kb, 128 * kb + 128)
        part = _mm(codes[:, ks].float(), w[ks].float())
        acc = _fma32(part, sa[:, kb : kb + 1] * sb[kb][None, :], acc)
    return acc.to(BF)


# ----------------------------------------------------------------------------- MLA prolog
def _rms(v, gamma):
    v32 = v.float()
    var = v32.pow(2).double().sum(-1, keepdim=True).float() / v32.shape[-1]
    return (gamma.float() * (v32 * torch.rsqrt(var + 1e-6))).to(BF)


def _rope_pairs(v, freqs):
    vc = torch.view_as_complex(v.float().reshape(*v.shape[:-1], -1, 2))
    return torch.view_as_real(vc * freqs).flatten(-2).to(BF)


def _mla(t) -> dict:
    n = t["x"].shape[0]
    qr = _rms(_fp8_gemm(t["x"], t["w_dq"], t["w_dq_scale"]), t["gamma_cq"])
    q = _fp8_gemm(qr, t["w_uq_qr"], t["w_uq_qr_scale"]).reshape(n, 128, 192)
    freqs = torch.complex(t["cos"], t["sin"])
    nope = _mm(q[:, :, :128].permute(1, 0, 2).float(), t["w_uk"].float()).to(BF).permute(1, 0, 2)
    kv_a = _fp8_gemm(t["x"], t["w_dkv_kr"], t["w_dkv_kr_scale"])
    codes, s = _act_quant(_rms(kv_a[:, :512], t["gamma_ckv"]))
    return {"q_norm": qr, "query_nope": nope, "query_rope": _rope_pairs(q[:, :, 128:],
            freqs[:, None]), "kr": _rope_pairs(kv_a[:, 512:], freqs), "codes": codes,
            "scales": s}  # fmt: skip


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(to_numpy(a) if torch.is_tensor(a) else a)
    return a.view(f"u{a.dtype.itemsize}")


def _mla_outputs(case, promotion) -> dict:
    out = mla_prolog(**case["inputs"], **case["params"], fp8_promotion=promotion)
    rows = unpack_rows(out.kv_cache, case["params"]["cache_layout"])
    slots = case["inputs"]["slot_mapping"]
    return {"q_norm": out.q_norm, "query_nope": out.query_nope, "query_rope": out.query_rope,
            "kr": rows.rope[slots], "codes": rows.nope[slots],
            "scales": rows.scales[slots]}  # fmt: skip


@pytest.fixture(scope="module", params=["amax448", "ue8m0"])
def mla_case(request):
    case = mla_prolog_make_case(None, path="fp8", b=2, s1=2, seq_lens=(300, 1000), seed=5,
                                weight_scale=request.param)  # fmt: skip
    want = _mla({k: to_torch(v) for k, v in case["inputs"].items() if isinstance(v, np.ndarray)})
    return request.param, case, want


def test_mla_prolog_fp8_is_deepseeks_fma_bit_for_bit(mla_case):
    kind, case, want = mla_case
    got = _mla_outputs(case, "fma")
    for name, w in want.items():
        assert np.array_equal(_bits(got[name]), _bits(w)), (kind, name)


def test_mla_prolog_two_roundings_differs_on_amax448_scales(mla_case):
    """The switch matters where the scale products are not powers of two: two roundings
    move bits of the queries; with UE8M0 weight scales both promotions agree."""
    kind, case, want = mla_case
    got = _mla_outputs(case, "two_roundings")
    same = {n: np.array_equal(_bits(got[n]), _bits(want[n])) for n in want}
    if kind == "amax448":
        assert not same["query_nope"], same
    else:
        assert all(same.values()), same


# ----------------------------------------------------------------------------- indexer prolog
def _hadamard(x):
    """The fast Walsh-Hadamard transform in FP32 (ascending strides), times 128^-0.5, BF16."""
    y, n, h = x.float(), x.shape[-1], 1
    while h < n:
        v = y.unflatten(-1, (n // (2 * h), 2, h))
        y = torch.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]], -2)
        y, h = y.flatten(-3), 2 * h
    return (y * 128**-0.5).to(BF)


def _layer_norm(k, g, b):
    k = k.float()
    mean = k.double().sum(-1, keepdim=True).float() / 128
    d = k - mean
    var = (d * d).double().sum(-1, keepdim=True).float() / 128
    return ((d / torch.sqrt(var + 1e-6)) * g + b).to(BF)


def _indexer(t) -> dict:
    n = t["x"].shape[0]
    q = _fp8_gemm(t["q_norm"], t["w_qb"], t["w_qb_scale"]).view(n, 64, 128)
    qp, qn = q.split([64, 64], -1)
    qc, qs = _act_quant(_hadamard(torch.cat([ds_rope(qp, t["cos"], t["sin"]), qn], -1)))
    k = _layer_norm(_fp8_gemm(t["x"], t["w_k"], t["w_k_scale"]), t["ln_gamma"], t["ln_beta"])
    kp, kn = k.split([64, 64], -1)
    kc, ks = _act_quant(_hadamard(torch.cat([ds_rope(kp, t["cos"], t["sin"]), kn], -1)))
    w = (_mm(t["x"], t["w_proj"]) * 64**-0.5).unsqueeze(-1) * qs * 128**-0.5
    return {"q": qc, "q_scale": qs[..., 0], "weights": w[..., 0], "k": kc, "k_scale": ks[..., 0]}


def _indexer_outputs(case, promotion) -> dict:
    res = dsa_indexer_prolog(**case["inputs"], **case["params"], fp8_promotion=promotion)
    pages = unpack_fp8_pages(res.k_cache, block_size=16)
    sl = case["inputs"]["slot_mapping"]
    rows = (sl // 16, sl % 16)
    return {"q": res.q, "q_scale": res.q_scale, "weights": res.weights,
            "k": pages.codes[rows], "k_scale": pages.scales[rows]}  # fmt: skip


@pytest.mark.parametrize("kind", ["amax448", "ue8m0"])
def test_indexer_prolog_fp8_is_deepseeks_fma_bit_for_bit(kind):
    """Every FP8 output of the indexer prolog (q codes and scales, weights, the written
    key's codes and scale) equals the restatement's bits, with either kind of weight
    scale."""
    case = dsa_indexer_prolog_make_case(None, path="fp8", seq_lens=(40, 70), s1=2,
                                        block_size=16, seed=1, weight_scale=kind)  # fmt: skip
    want = _indexer({k: to_torch(v) for k, v in case["inputs"].items()
                     if isinstance(v, np.ndarray)})  # fmt: skip
    got = _indexer_outputs(case, "fma")
    for name, w in want.items():
        assert np.array_equal(_bits(got[name]), _bits(w)), (kind, name)
