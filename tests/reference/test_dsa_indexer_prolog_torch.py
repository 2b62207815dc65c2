"""The two public goldens restated in torch, to prove the bit-for-bit claims of
``dsa_indexer_prolog``.

* INT8 path = pypto-gym's prolog golden (``hicann/pypto-gym:tests/ops/deepseek_v32_exp/
  test_lightning_indexer_prolog_quant.py``: ``_indexer_compute_q/_k/_weights``,
  ``quant_int8``, ``single_rope``, ``layer_norm``), restated on its own input recipe (torch's
  generator, its shapes: hidden 7168, q_lora_rank 1536, the random stand-ins).
* FP8 path = DeepSeek-V3.2's ``Indexer`` after the RoPE fix
  (``deepseek-ai/DeepSeek-V3.2-Exp:inference/model.py`` and ``kernel.py``: ``act_quant`` with
  UE8M0 scales, ``fp8_gemm``'s per-128 K loop, ``F.layer_norm`` on the BF16 key,
  ``apply_rotary_emb(interleaved=False)`` through complex numbers, ``rotate_activation``,
  the weights in FP32), restated on the case builder's data. The Hadamard kernel is CUDA
  only: its FP32 butterfly is restated (ascending strides).

Each restatement runs twice: with exact-sum hooks (every matmul and row sum as float64,
rounded once to FP32: the golden's model of an FP32 accumulator) it must give the golden's
bits on every output; as written (torch's own FP32 sums and ``F.layer_norm``) it must pass
pypto-gym's own limits (INT8) or the FP32 summation bound (FP8 weights), and agree bit for
bit on nearly every element.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles.deepseek_torch import ds_rope
from tilesim.reference import dsa_indexer_prolog, dsa_indexer_prolog_make_case
from tilesim.reference.cases.dsa_indexer_prolog import GYM_TOLERANCES
from tilesim.shared.layouts.index_cache import unpack_fp8_pages

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.torch


def _mm(a, b, exact):
    if exact:
        return torch.matmul(a.double(), b.double()).float()
    return torch.matmul(a.float(), b.float())


def _mean(v, exact):
    return v.double().sum(-1, keepdim=True).float() / 128 if exact else v.mean(-1, keepdim=True)


# ----------------------------------------------------------------------------- pypto-gym
def _gym_inputs(seed, b=4, s=2, h=7168, r=1536, nb=16, bs=128):
    torch.manual_seed(seed)
    bf, t = torch.bfloat16, b * s
    u = lambda *shape, dt=torch.float32: torch.empty(shape, dtype=dt).uniform_(-1, 1)  # noqa: E731
    ang = torch.rand(t, 64) * 2 * torch.pi
    return {
        "x": u(t, h, dt=bf), "q_norm": torch.randint(-128, 128, (t, r), dtype=torch.int8),
        "q_norm_scale": u(t, 1), "w_qb": torch.randint(-128, 128, (r, 8192), dtype=torch.int8),
        "w_qb_scale": u(8192, 1), "w_k": u(h, 128, dt=bf), "w_proj": u(h, 64, dt=bf),
        "ln_gamma": torch.ones(128, dtype=bf), "ln_beta": torch.zeros(128, dtype=bf),
        "cos": torch.cos(ang).to(bf), "sin": torch.sin(ang).to(bf),
        "hadamard_q": u(128, 128, dt=bf), "hadamard_k": u(128, 128, dt=bf),
        "k_cache": torch.randint(-128, 128, (nb, bs, 128), dtype=torch.int8),
        "k_scale": u(nb, bs, dt=torch.float16), "slot_mapping": torch.randperm(nb * bs)[:t],
    }  # fmt: skip


def _gym_rope(v, cos, sin):
    c, s = cos.float(), sin.float()
    while c.dim() < v.dim():
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    v32 = v.float()
    a, b = v32.chunk(2, -1)
    return (v32 * c + torch.cat((-b, a), -1) * s).to(torch.bfloat16)


def _gym_quant(v):
    v32 = v.float()
    sq = 127.0 / v32.abs().amax(-1, keepdim=True)
    y = torch.round(v32 * sq).to(torch.int32)
    return torch.trunc(y.to(v.dtype)).to(torch.int8), (1.0 / sq).to(torch.float16)


def _gym_golden(i, exact):
    t = i["x"].shape[0]
    q = torch.matmul(i["q_norm"].to(torch.int32), i["w_qb"].to(torch.int32)).float()
    q = (q * i["q_norm_scale"] * i["w_qb_scale"].reshape(1, -1)).reshape(t, 64, 128)
    qr, qn = q.to(torch.bfloat16).split([64, 64], -1)
    q = torch.cat([_gym_rope(qr, i["cos"], i["sin"]), qn], -1)
    qc, qs = _gym_quant(_mm(q, i["hadamard_q"], exact).to(torch.bfloat16))
    k = _mm(i["x"], i["w_k"], exact)
    m = _mean(k, exact)
    var = _mean((k - m) ** 2, exact)
    k = ((k - m) / torch.sqrt(var + 1e-6)) * i["ln_gamma"].float() + i["ln_beta"].float()
    kr, kn = k.to(torch.bfloat16).split([64, 64], -1)
    k = torch.cat([_gym_rope(kr, i["cos"], i["sin"]), kn], -1)
    kc, ks = _gym_quant(_mm(k, i["hadamard_k"], exact).to(torch.bfloat16))
    cache, sc = i["k_cache"].clone().reshape(-1, 128), i["k_scale"].clone().reshape(-1)
    cache[i["slot_mapping"]] = kc
    sc[i["slot_mapping"]] = ks[:, 0]
    w = _mm(i["x"], i["w_proj"], exact).to(torch.bfloat16).float() * (64**-0.5) * (128**-0.5)
    shp, sshp = i["k_cache"].shape, i["k_scale"].shape
    return {"q": qc, "q_scale": qs[..., 0], "weights": w.to(torch.float16),
            "k_cache": cache.reshape(shp), "k_scale": sc.reshape(sshp)}  # fmt: skip


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8 if a.dtype.itemsize == 1 else f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("seed", [0, 7])
def test_int8_path_is_pypto_gyms_torch_golden_bit_for_bit(seed):
    from tilesim.shared.interop import to_numpy

    i = _gym_inputs(seed)
    res = dsa_indexer_prolog(**{k: to_numpy(v) for k, v in i.items()}, path="int8")
    exact = _gym_golden(i, exact=True)
    for name, want in exact.items():  # the golden's model of the FP32 sums: every bit
        assert np.array_equal(_bits(getattr(res, name)), _bits(to_numpy(want))), name
    literal = _gym_golden(i, exact=False)  # torch's own FP32 sums
    for name, want in literal.items():
        got, w = np.asarray(getattr(res, name), np.float64), to_numpy(want).astype(np.float64)
        atol, rtol, ratio = GYM_TOLERANCES[name]
        fails = (np.abs(got - w) > atol + rtol * np.abs(w)).sum()
        assert fails <= round(ratio * got.size), name  # pypto-gym's own verdict passes
        assert (_bits(getattr(res, name)) == _bits(to_numpy(want))).mean() >= 0.999, name


def test_the_gym_restatement_sees_a_wrong_quant_rule(monkeypatch):
    """The check has teeth: the golden with the quantizer's default rule (``127 / amax``
    divided, where torch multiplies ``127`` by the reciprocal) misses pypto-gym's bits."""
    import importlib

    from tilesim.shared.interop import to_numpy
    from tilesim.shared.quant import quantize_index_int8

    def divided(v, *, amax_floor, scale_rule):
        return quantize_index_int8(v, amax_floor=amax_floor)

    mod = importlib.import_module("tilesim.reference.dsa_indexer_prolog")
    i = _gym_inputs(0)
    want = _gym_golden(i, exact=True)
    monkeypatch.setattr(mod, "quantize_index_int8", divided)
    res = mod.dsa_indexer_prolog(**{k: to_numpy(v) for k, v in i.items()}, path="int8")
    assert not np.array_equal(res.q, to_numpy(want["q"]))


# ----------------------------------------------------------------------------- DeepSeek
def _act_quant(x):
    g = x.float().unflatten(-1, (-1, 128))
    amax = g.abs().amax(-1).clamp(min=1e-4)
    m, e = torch.frexp(amax * (1.0 / 448))  # kernel.py: amax * (1/448), ceil to a power of 2
    s = torch.ldexp(torch.ones_like(amax), e - (m == 0.5).to(e.dtype))
    return (g / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).flatten(-2), s


def _fp8_linear(a, w, ws, exact):
    codes, sa = _act_quant(a)
    acc = torch.zeros(a.shape[0], w.shape[1])
    for kb in range(a.shape[1] // 128):
        ks = slice(kb * 128, (kb + 1) * 128)
        part = _mm(codes[:, ks].float(), w[ks].float(), exact)
        acc += part * (sa[:, kb : kb + 1] * ws[kb].repeat_interleave(128)[None, :])
    return acc.to(torch.bfloat16)


def _fwht(x):  # fast_hadamard_transform(x, scale=128^-0.5): FP32 butterflies, scale, BF16
    y, n, h = x.float(), x.shape[-1], 1
    while h < n:
        v = y.unflatten(-1, (n // (2 * h), 2, h))
        y = torch.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]], -2)
        y, h = y.flatten(-3), 2 * h
    return (y * 128**-0.5).to(torch.bfloat16)


def _ds_layer_norm(k, g, b, exact):
    if not exact:
        return F.layer_norm(k.float(), (128,), g, b, 1e-6).to(torch.bfloat16)
    k = k.float()
    d = k - _mean(k, True)
    return ((d / torch.sqrt(_mean(d * d, True) + 1e-6)) * g + b).to(torch.bfloat16)


def _ds_golden(i, exact):
    t = i["x"].shape[0]
    q = _fp8_linear(i["q_norm"], i["w_qb"], i["w_qb_scale"], exact).view(t, 64, 128)
    qp, qn = q.split([64, 64], -1)
    qc, qs = _act_quant(_fwht(torch.cat([ds_rope(qp, i["cos"], i["sin"]), qn], -1)))
    k = _fp8_linear(i["x"], i["w_k"], i["w_k_scale"], exact)
    k = _ds_layer_norm(k, i["ln_gamma"], i["ln_beta"], exact)
    kp, kn = k.split([64, 64], -1)
    kc, ks = _act_quant(_fwht(torch.cat([ds_rope(kp, i["cos"], i["sin"]), kn], -1)))
    w = _mm(i["x"], i["w_proj"], exact) * 64**-0.5  # weights_proj(x.float()), FP32
    w = (w.unsqueeze(-1) * qs * 128**-0.5)[..., 0]
    return {"q": qc, "q_scale": qs[..., 0], "weights": w, "k": kc, "k_scale": ks[..., 0]}


def test_fp8_path_is_deepseeks_reference_bit_for_bit():
    from tilesim.shared.interop import to_numpy, to_torch

    case = dsa_indexer_prolog_make_case(None, path="fp8", seq_lens=(40, 70), s1=2,
                                        block_size=16, seed=1)  # fmt: skip
    res = dsa_indexer_prolog(**case["inputs"], **case["params"])
    pages = unpack_fp8_pages(res.k_cache, block_size=16)
    sl = case["inputs"]["slot_mapping"]
    rows = (sl // 16, sl % 16)
    got = {"q": res.q, "q_scale": res.q_scale, "weights": res.weights,
           "k": pages.codes[rows], "k_scale": pages.scales[rows]}  # fmt: skip
    i = {k: to_torch(v) for k, v in case["inputs"].items()}
    for name, want in _ds_golden(i, exact=True).items():
        assert np.array_equal(_bits(got[name]), _bits(to_numpy(want))), name
    literal = _ds_golden(i, exact=False)
    for name in ("q", "q_scale", "k", "k_scale"):
        assert (_bits(got[name]) == _bits(to_numpy(literal[name]))).mean() >= 0.99, name
    # the FP32 weights: torch sums 7168 products in FP32 in its own order; the golden rounds
    # the exact sum once. Bound: 7168 u sum|x w| times the (exact) scale factors.
    x = case["inputs"]["x"].astype(np.float64)
    mag = np.abs(x) @ np.abs(case["inputs"]["w_proj"].astype(np.float64))
    fac = np.asarray(res.q_scale, np.float64) * 64**-0.5 * 128**-0.5
    diff = np.abs(res.weights.astype(np.float64) - to_numpy(literal["weights"]))
    assert (diff <= 7168 * 2.0**-24 * mag * fac + 2 * 2.0**-24 * np.abs(res.weights)).all()
