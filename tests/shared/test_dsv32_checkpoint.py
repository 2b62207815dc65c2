"""The DeepSeek-V3.2 checkpoint converter (``tilesim.shared.dsv32_checkpoint``).

Synthetic layers are written with the published names (Hugging Face and DeepSeek inference)
and scaled-down shapes; every argument the converter produces is checked against an
independent oracle of what the model computes with the original tensors:

* the FP8 linears: the projection the golden's ``[K, N]`` codes and ``[K/128, N/128]``
  scales imply, in float64, against DeepSeek's ``F.linear(x, weight_dequant(w, s))`` with
  the scales expanded by torch's ``repeat_interleave`` (equal up to summation order);
* ``weight_dequant`` and pypto-gym's per-channel ``quant(w, False)`` restated in torch (bit
  for bit), and the INT8 projection within the quantization bound of the BF16 one;
* ``w_uk``: DeepSeek's decode absorption ``einsum("thd,hdc->thc", q_nope, wkv_b.view(heads,
  -1, kv_lora)[:, :qk_nope])`` against the golden's per-head ``q_nope[:, h] @ w_uk[h]``;
* at DeepSeek-V3.2's real sizes, the MLA prolog and the indexer prolog goldens run on the
  converted weights, and their queries and index weights match the model's float64
  projections of the original tensors (a wrong mapping -- the value rows for ``w_uk`` --
  fails the same bound).

No test downloads anything.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from tilesim.shared.casts import BF16, FP8_E4M3, to_bf16, to_fp8_e4m3
from tilesim.shared.dsv32_checkpoint import (
    DSV32_DIMS,
    Dsv32Dims,
    convert_dsv32_weights,
    dsv32_weights_fp8,
    dsv32_weights_int8,
    quant_int8_per_channel,
)

#: scaled down, with partial FP8 blocks (q_b: 192 rows, kv_a: 160, index wk: 64) and more
#: than one block along every scaled axis of q_a (2 x 3)
SMALL = Dsv32Dims(hidden=384, q_lora_rank=256, kv_lora_rank=128, heads=2, qk_nope=64,
                  qk_rope=32, v_head=64, index_heads=2, index_dim=64)  # fmt: skip
HF = "model.layers.{}.self_attn."
DS = "layers.{}.attn."
#: role -> (Hugging Face module, DeepSeek module), the published pairs
#: (deepseek-ai/DeepSeek-V3.2-Exp:inference/convert.py ``mapping``)
NAMES = {"q_a": ("q_a_proj", "wq_a"), "q_b": ("q_b_proj", "wq_b"),
         "kv_a": ("kv_a_proj_with_mqa", "wkv_a"), "kv_b": ("kv_b_proj", "wkv_b"),
         "iq_b": ("indexer.wq_b", "indexer.wq_b"), "ik": ("indexer.wk", "indexer.wk"),
         "q_norm": ("q_a_layernorm", "q_norm"), "kv_norm": ("kv_a_layernorm", "kv_norm"),
         "k_norm": ("indexer.k_norm", "indexer.k_norm"),
         "proj": ("indexer.weights_proj", "indexer.weights_proj")}  # fmt: skip


def _shapes(d: Dsv32Dims) -> dict:
    return {
        "q_a": (d.q_lora_rank, d.hidden),
        "q_b": (d.heads * (d.qk_nope + d.qk_rope), d.q_lora_rank),
        "kv_a": (d.kv_lora_rank + d.qk_rope, d.hidden),
        "kv_b": (d.heads * (d.qk_nope + d.v_head), d.kv_lora_rank),
        "iq_b": (d.index_heads * d.index_dim, d.q_lora_rank),
        "ik": (d.index_dim, d.hidden),
    }


def _fp8(rng, shape) -> tuple[np.ndarray, np.ndarray]:
    codes = to_fp8_e4m3(np.clip(rng.standard_normal(shape, dtype=np.float32) * 64, -448, 448))
    blocks = tuple(-(-n // 128) for n in shape)
    return codes, (rng.uniform(0.5, 1.0, blocks) * 2.0**-13).astype(np.float32)


def layer_tensors(d: Dsv32Dims, rng, *, layer=0, scheme="hf", linear="fp8") -> dict:
    """One layer's attention tensors under their published names: FP8 (or BF16) linears
    ``[out, in]`` with ``weight_scale_inv`` / ``scale`` ``[out/128, in/128]``, BF16 RMSNorm
    weights, FP32 LayerNorm weight and bias, BF16 ``weights_proj``."""
    pre, side, scale = (HF, 0, "weight_scale_inv") if scheme == "hf" else (DS, 1, "scale")
    pre = pre.format(layer)
    out = {}
    for role, shape in _shapes(d).items():
        key = pre + NAMES[role][side]
        codes, s = _fp8(rng, shape)
        if linear == "bf16":
            out[key + ".weight"] = to_bf16(codes.astype(np.float32) * np.float32(2.0**-13))
            continue
        out[key + ".weight"], out[f"{key}.{scale}"] = codes, s
    for role, n in (("q_norm", d.q_lora_rank), ("kv_norm", d.kv_lora_rank)):
        out[pre + NAMES[role][side] + ".weight"] = to_bf16(
            rng.uniform(0.5, 1.5, n).astype(np.float32)
        )
    out[pre + "indexer.k_norm.weight"] = rng.uniform(0.5, 1.5, d.index_dim).astype(np.float32)
    out[pre + "indexer.k_norm.bias"] = rng.uniform(-0.1, 0.1, d.index_dim).astype(np.float32)
    out[pre + "indexer.weights_proj.weight"] = to_bf16(
        rng.standard_normal((d.index_heads, d.hidden)).astype(np.float32) * np.float32(0.02)
    )
    return out


def _key(role, leaf="weight", scheme="hf", layer=0):
    pre, side = (HF, 0) if scheme == "hf" else (DS, 1)
    leaf = {"scale": "weight_scale_inv" if scheme == "hf" else "scale"}.get(leaf, leaf)
    return f"{pre.format(layer)}{NAMES[role][side]}.{leaf}"


# ----------------------------------------------------------------------------- torch oracles
try:
    import torch
except ImportError:  # the tests that need it are marked ``torch`` and skipped
    torch = None


def _t(a: np.ndarray):
    from tilesim.shared.interop import to_torch

    return to_torch(np.ascontiguousarray(a))


def _expanded(w: np.ndarray, s: np.ndarray):
    """``(codes, scales)`` as torch tensors ``[out, in]``: the block scales expanded by
    ``repeat_interleave`` (DeepSeek's ``[out/128, in/128]`` orientation)."""
    wt, st = _t(w), _t(s)
    return wt, st.repeat_interleave(128, 0)[: wt.shape[0]].repeat_interleave(128, 1)[
        :, : wt.shape[1]
    ]


def ds_weight_dequant(w: np.ndarray, s: np.ndarray):
    """DeepSeek's ``weight_dequant`` restated in torch (FP32 product, BF16): a BF16 torch
    tensor ``[out, in]``."""
    wt, full = _expanded(w, s)
    return (wt.float() * full).to(torch.bfloat16)


def ds_fp8_weight_f64(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The weight ``fp8_gemm`` multiplies by, ``code * scale`` per block, in float64 (exact)."""
    wt, full = _expanded(w, s)
    return (wt.double() * full.double()).numpy()


def gym_quant_per_channel(w_kn):
    """pypto-gym's ``quant(w, is_pertoken=False)`` as its test writes it, in torch."""
    x = w_kn.to(torch.float32)
    amax = torch.max(torch.abs(x), dim=-2, keepdim=True)[0]
    scale_quant = 127 / amax
    out = torch.trunc(torch.round(x * scale_quant).to(torch.int32).to(torch.float16))
    return out.to(torch.int8), 1 / scale_quant


def _f64(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a.astype(np.float64)
    return a.double().numpy()


def _golden_fp8_dense(codes_kn: np.ndarray, scale_kb: np.ndarray) -> np.ndarray:
    """What the golden's FP8 arguments mean: ``w[k, n] = code[k, n] * scale[k // 128, n //
    128]`` (float64, indexed rather than expanded)."""
    k, n = codes_kn.shape
    return codes_kn.astype(np.float64) * scale_kb[np.arange(k)[:, None] // 128,
                                                  np.arange(n)[None, :] // 128]  # fmt: skip


# ----------------------------------------------------------------------------- FP8 path
@pytest.mark.torch
@pytest.mark.parametrize("role, arg", [("q_a", "w_dq"), ("q_b", "w_uq_qr"), ("kv_a", "w_dkv_kr"),
                                       ("iq_b", "w_qb"), ("ik", "w_k")])  # fmt: skip
def test_fp8_linears_give_the_models_projection(rng, role, arg):
    sd = layer_tensors(SMALL, rng)
    w = dsv32_weights_fp8(sd, 0, dims=SMALL).step
    assert w[arg].dtype == FP8_E4M3
    dense = _golden_fp8_dense(w[arg], w[arg + "_scale"])
    ref = ds_fp8_weight_f64(sd[_key(role)], sd[_key(role, "scale")])
    x = rng.standard_normal((5, dense.shape[0]))
    y_model = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(ref)).numpy()
    np.testing.assert_allclose(x @ dense, y_model, rtol=1e-12, atol=1e-12)
    # the codes and scales are the checkpoint's, moved (transposed), not re-rounded
    assert np.array_equal(w[arg].view(np.uint8), sd[_key(role)].T.view(np.uint8))
    assert np.array_equal(w[arg + "_scale"], sd[_key(role, "scale")].T)


@pytest.mark.torch
def test_w_uk_is_deepseeks_decode_absorption(rng):
    sd = layer_tensors(SMALL, rng)
    d = SMALL
    for w in (dsv32_weights_fp8(sd, 0, dims=d), dsv32_weights_int8(sd, 0, dims=d)):
        w_uk = w.mla["w_uk"]
        assert w_uk.dtype == BF16 and w_uk.shape == (d.heads, d.qk_nope, d.kv_lora_rank)
        wkv_b = ds_weight_dequant(sd[_key("kv_b")], sd[_key("kv_b", "scale")])
        q_nope = torch.randn(3, d.heads, d.qk_nope, dtype=torch.float64)
        model = torch.einsum(
            "thd,hdc->thc", q_nope, wkv_b.double().view(d.heads, -1, d.kv_lora_rank)[:, : d.qk_nope]
        )
        golden = np.matmul(q_nope.numpy().transpose(1, 0, 2), _f64(w_uk)).transpose(1, 0, 2)
        np.testing.assert_allclose(golden, model.numpy(), rtol=1e-12, atol=1e-12)
        values = wkv_b.double().view(d.heads, -1, d.kv_lora_rank)[:, d.qk_nope :]
        assert not np.array_equal(_f64(w_uk), values.numpy())  # the value rows are not taken


@pytest.mark.torch
def test_fp8_indexer_and_norms(rng):
    sd = layer_tensors(SMALL, rng)
    w = dsv32_weights_fp8(sd, 0, dims=SMALL)
    proj = sd[_key("proj")]
    assert w.indexer["w_proj"].dtype == np.float32
    assert np.array_equal(w.indexer["w_proj"], proj.astype(np.float32).T)  # exact widening
    assert w.indexer["w_k_scale"].shape == (SMALL.hidden // 128, 1)
    for arg, key in (("ln_gamma", _key("k_norm")), ("ln_beta", _key("k_norm", "bias"))):
        assert w.indexer[arg].dtype == sd[key].dtype and np.array_equal(w.indexer[arg], sd[key])
    for arg, role in (("gamma_cq", "q_norm"), ("gamma_ckv", "kv_norm")):
        assert np.array_equal(w.mla[arg].view(np.uint16), sd[_key(role)].view(np.uint16))


# ----------------------------------------------------------------------------- INT8 path
@pytest.mark.torch
@pytest.mark.parametrize("role, arg", [("q_a", "w_dq"), ("kv_a", "w_dkv_kr"), ("ik", "w_k")])
def test_int8_bf16_weights_are_weight_dequant_transposed(rng, role, arg):
    sd = layer_tensors(SMALL, rng)
    got = dsv32_weights_int8(sd, 0, dims=SMALL).step[arg]
    ref = ds_weight_dequant(sd[_key(role)], sd[_key(role, "scale")]).t().contiguous()
    assert got.dtype == BF16
    assert np.array_equal(got.view(np.uint16), ref.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.torch
@pytest.mark.parametrize("role, arg", [("q_b", "w_uq_qr"), ("iq_b", "w_qb")])
def test_int8_per_channel_quant_is_pypto_gyms(rng, role, arg):
    sd = layer_tensors(SMALL, rng)
    w = dsv32_weights_int8(sd, 0, dims=SMALL).step
    bf = ds_weight_dequant(sd[_key(role)], sd[_key(role, "scale")]).t()
    codes, scale = gym_quant_per_channel(bf)
    assert w[arg].dtype == np.int8 and np.array_equal(w[arg], codes.numpy())
    got_scale = w[arg + "_scale"].reshape(-1)
    assert np.array_equal(got_scale.view(np.uint32), scale.reshape(-1).numpy().view(np.uint32))
    want = (codes.shape[1],) if arg == "w_uq_qr" else (codes.shape[1], 1)
    assert w[arg + "_scale"].shape == want
    # the INT8 projection is the BF16 one within half a code step per product
    x = rng.standard_normal((4, bf.shape[0]))
    exact = x @ bf.double().numpy()
    deq = x @ (w[arg].astype(np.float64) * got_scale.astype(np.float64)[None, :])
    bound = np.abs(x) @ np.broadcast_to(np.abs(bf.double().numpy()).max(0) / 254 * 1.0001,
                                        bf.shape)  # fmt: skip
    assert (np.abs(deq - exact) <= bound).all()


def test_int8_quant_matches_the_mla_prologs_own_quantizer(rng):
    """The converter's per-channel quant is the MLA prolog golden's per-token INT8 quant of
    the transpose (one formula, two axes)."""
    from tilesim.reference.mla_prolog import quant_int8_gym

    w = to_bf16(rng.standard_normal((256, 96)).astype(np.float32))
    w[:, 5] = 0  # an all-zero channel: codes 0, scale 0
    codes, scale = quant_int8_per_channel(w)
    ref_codes, ref_scale = quant_int8_gym(w.T, w.shape[0])
    assert np.array_equal(codes, ref_codes.T)
    assert np.array_equal(scale.view(np.uint32), ref_scale.reshape(-1).view(np.uint32))
    assert not codes[:, 5].any() and scale[5] == 0


def test_int8_indexer_extras(rng):
    from tilesim.shared.hadamard import scaled_hadamard_bf16

    sd = layer_tensors(SMALL, rng)
    w = dsv32_weights_int8(sd, 0, dims=SMALL).indexer
    assert w["w_proj"].dtype == BF16
    assert np.array_equal(w["w_proj"].view(np.uint16), sd[_key("proj")].T.view(np.uint16))
    h = scaled_hadamard_bf16(SMALL.index_dim)
    assert np.array_equal(w["hadamard_q"].view(np.uint16), h.view(np.uint16))
    assert np.array_equal(w["hadamard_k"].view(np.uint16), h.view(np.uint16))


# ----------------------------------------------------------------------------- names, inputs
def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(
            np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8)))
        for x, y in ((a[k], b[k]) for k in a))  # fmt: skip


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_deepseek_names_give_the_hugging_face_result(path):
    hf = layer_tensors(SMALL, np.random.default_rng(3), layer=5, scheme="hf")
    ds = layer_tensors(SMALL, np.random.default_rng(3), layer=5, scheme="ds")
    a = convert_dsv32_weights(hf, 5, path=path, dims=SMALL)
    b = convert_dsv32_weights(ds, 5, path=path, dims=SMALL)
    assert (a.scheme, b.scheme) == ("huggingface", "deepseek")
    assert _same(a.step, b.step)
    assert all(k.startswith("layers.5.attn.") for k in b.keys)


@pytest.mark.torch
def test_torch_tensors_give_the_numpy_result(rng):
    from tilesim.shared.interop import to_torch

    sd = layer_tensors(SMALL, rng)
    as_torch = {k: to_torch(v) for k, v in sd.items()}
    for path in ("int8", "fp8"):
        assert _same(convert_dsv32_weights(sd, path=path, dims=SMALL).step,
                     convert_dsv32_weights(as_torch, path=path, dims=SMALL).step)  # fmt: skip


def test_bf16_checkpoint_linears(rng):
    sd = layer_tensors(SMALL, rng, linear="bf16")
    w8 = dsv32_weights_int8(sd, 0, dims=SMALL).mla
    assert np.array_equal(w8["w_dq"].view(np.uint16), sd[_key("q_a")].T.view(np.uint16))
    with pytest.raises(TypeError, match=r"indexer\.wq_b\.weight: expected float8_e4m3fn"):
        dsv32_weights_fp8(sd, 0, dims=SMALL)


def test_inputs_are_never_written(rng):
    sd = layer_tensors(SMALL, rng)
    before = {k: v.copy() for k, v in sd.items()}
    for path in ("int8", "fp8"):
        out = convert_dsv32_weights(sd, path=path, dims=SMALL).step
        for v in out.values():  # no result shares memory with an input
            assert v is None or not any(np.shares_memory(v, s) for s in sd.values())
    assert all(np.array_equal(before[k].view(np.uint8), sd[k].view(np.uint8)) for k in sd)


# ----------------------------------------------------------------------------- errors
def test_missing_tensor_names_both_keys(rng):
    sd = layer_tensors(SMALL, rng)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.q_a_proj\.weight.*"
                                         r"layers\.1\.attn\.wq_a\.weight"):  # fmt: skip
        convert_dsv32_weights(sd, 1, dims=SMALL)
    del sd[_key("kv_b", "scale")]
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.0\.self_attn\.kv_b_proj\."
        r"weight_scale_inv'.*'layers\.0\.attn\.wkv_b\.scale'",
    ):
        convert_dsv32_weights(sd, 0, dims=SMALL)


def test_wrong_shape_and_dtype_name_the_key(rng):
    sd = layer_tensors(SMALL, rng)
    with pytest.raises(ValueError, match=r"q_b_proj\.weight: expected shape \(192, 256\).*"
                                         r"got \(192, 128\)"):  # fmt: skip
        convert_dsv32_weights({**sd, _key("q_b"): sd[_key("q_b")][:, :128]}, dims=SMALL)
    bad = {**sd, _key("q_norm"): sd[_key("q_norm")].astype(np.float16)}
    with pytest.raises(TypeError, match=r"q_a_layernorm\.weight: expected dtype .*float16"):
        convert_dsv32_weights(bad, dims=SMALL)
    with pytest.raises(ValueError, match=r"kv_a_proj_with_mqa\.weight_scale_inv: expected "
                                         r"shape \(2, 3\)"):  # fmt: skip
        convert_dsv32_weights({**sd, _key("kv_a", "scale"): sd[_key("kv_a", "scale")].T},
                              dims=SMALL)  # fmt: skip
    with pytest.raises(ValueError, match=r"q_a_proj\.weight: expected shape \(1536, 7168\)"):
        convert_dsv32_weights(sd)  # the real sizes by default


def test_bad_values_are_refused_before_any_work(rng):
    sd = layer_tensors(SMALL, rng)
    codes = sd[_key("q_b")].copy()
    codes.view(np.uint8)[3, 4] = 0x7F
    with pytest.raises(ValueError, match=r"q_b_proj\.weight: expected finite E4M3 codes.*\[3, 4\]"):
        convert_dsv32_weights({**sd, _key("q_b"): codes}, dims=SMALL)
    s = sd[_key("ik", "scale")].copy()
    s[0, 1] = 0
    with pytest.raises(ValueError, match=r"indexer\.wk\.weight_scale_inv: expected finite "
                                         r"scales > 0, got 0\.0 at index \[0, 1\]"):  # fmt: skip
        convert_dsv32_weights({**sd, _key("ik", "scale"): s}, path="fp8", dims=SMALL)
    with pytest.raises(ValueError, match="path"):
        convert_dsv32_weights(sd, path="bf16", dims=SMALL)
    with pytest.raises(TypeError, match="source"):
        convert_dsv32_weights([sd], dims=SMALL)


def test_dims_from_configs():
    hf = {"hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536,
          "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
          "v_head_dim": 128, "index_n_heads": 64, "index_head_dim": 128}  # fmt: skip
    assert Dsv32Dims.from_config(hf) == DSV32_DIMS
    ds = {"dim": 384, "n_heads": 2, "q_lora_rank": 256, "kv_lora_rank": 128,
          "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
          "index_n_heads": 2, "index_head_dim": 64, "vocab_size": 10}  # fmt: skip
    assert Dsv32Dims.from_config(ds) == SMALL
    with pytest.raises(ValueError, match=r"config\['n_heads'\]"):
        Dsv32Dims.from_config({"n_heads": 0})


# ----------------------------------------------------------------------------- safetensors
def _save(tmp_path, tensors: dict, name: str):
    st = pytest.importorskip("safetensors.torch")
    from tilesim.shared.interop import to_torch

    st.save_file({k: to_torch(np.ascontiguousarray(v)) for k, v in tensors.items()},
                 str(tmp_path / name))  # fmt: skip
    return tmp_path / name


@pytest.mark.torch
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_safetensors_file_round_trip(tmp_path, rng, path, monkeypatch):
    from tilesim.shared import dsv32_checkpoint as mod

    sd = layer_tensors(SMALL, rng, layer=2)
    other = layer_tensors(SMALL, np.random.default_rng(9), layer=3)
    file = _save(tmp_path, {**sd, **other}, "model.safetensors")
    read = []
    orig = mod._Tensors.meta
    monkeypatch.setattr(mod._Tensors, "meta", lambda self, k: read.append(k) or orig(self, k))
    got = convert_dsv32_weights(file, 2, path=path, dims=SMALL)
    assert _same(got.step, convert_dsv32_weights(sd, 2, path=path, dims=SMALL).step)
    assert read and all(k in sd for k in read)  # only layer 2's tensors were read


@pytest.mark.torch
def test_sharded_checkpoint_directory(tmp_path, rng):
    sd = layer_tensors(SMALL, rng, layer=1)
    keys = sorted(sd)
    half = len(keys) // 2
    parts = {"model-00001-of-00002.safetensors": keys[:half],
             "model-00002-of-00002.safetensors": keys[half:]}  # fmt: skip
    for name, ks in parts.items():
        _save(tmp_path, {k: sd[k] for k in ks}, name)
    index = {"weight_map": {k: name for name, ks in parts.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    got = convert_dsv32_weights(tmp_path, 1, path="fp8", dims=SMALL)
    assert _same(got.step, convert_dsv32_weights(sd, 1, path="fp8", dims=SMALL).step)


def test_missing_safetensors_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "x.safetensors").write_bytes(b"\0" * 16)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(ImportError, match=r'pip install "tilesim\[checkpoint\]"'):
        convert_dsv32_weights(tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="no such file or directory"):
        convert_dsv32_weights(tmp_path / "nope.safetensors")


# ----------------------------------------------------------------------------- the goldens
def _full_layer(rng) -> dict:
    """A layer at DeepSeek-V3.2's real sizes (Hugging Face names): E4M3 codes of magnitude
    below 2 (one random byte each, exponent MSB cleared: no NaN code) with scales about
    2^-7, so that every projection has a moderate range."""
    d, out = DSV32_DIMS, {}
    for role, shape in _shapes(d).items():
        n = shape[0] * shape[1]
        codes = (rng.integers(0, 256, n, dtype=np.uint8) & np.uint8(0xBF)).view(FP8_E4M3)
        out[_key(role)] = codes.reshape(shape)
        blocks = tuple(-(-m // 128) for m in shape)
        out[_key(role, "scale")] = (rng.uniform(0.5, 1.0, blocks) * 2.0**-6).astype(np.float32)
    for role, n in (("q_norm", d.q_lora_rank), ("kv_norm", d.kv_lora_rank)):
        out[_key(role)] = to_bf16(rng.uniform(0.5, 1.5, n).astype(np.float32))
    out[_key("k_norm")] = rng.uniform(0.5, 1.5, d.index_dim).astype(np.float32)
    out[_key("k_norm", "bias")] = rng.uniform(-0.1, 0.1, d.index_dim).astype(np.float32)
    proj = rng.standard_normal((d.index_heads, d.hidden)).astype(np.float32) * np.float32(0.02)
    out[_key("proj")] = to_bf16(proj)
    return out


def _fp8_linear_f64(a: np.ndarray, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``a @ W.T`` for DeepSeek's FP8 ``W [out, in]`` = codes times their ``[out/128,
    in/128]`` block scales, in float64, one 128-wide input block at a time (no float64 copy
    of the whole weight)."""
    y = np.zeros((a.shape[0], codes.shape[0]))
    for j in range(scale.shape[1]):
        cols = slice(128 * j, 128 * (j + 1))
        part = a[:, cols] @ codes[:, cols].astype(np.float64).T
        y += part * np.repeat(scale[:, j].astype(np.float64), 128)[None, : codes.shape[0]]
    return y


def _model_f64(sd: dict, x: np.ndarray) -> tuple:
    """DeepSeek's ``MLA.forward`` (decode) up to the absorbed queries, the same absorbed with
    the value rows of ``wkv_b`` (a wrong mapping), and the indexer's ``weights_proj(x) *
    64^-0.5 * 128^-0.5``, in float64 on the checkpoint's own tensors (``[out, in]``, codes
    times their block scales)."""
    d = DSV32_DIMS

    def lin(a, role):
        return _fp8_linear_f64(a, sd[_key(role)], sd[_key(role, "scale")])

    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * g.astype(np.float64)

    xa = x.astype(np.float64)
    qr = rms(lin(xa, "q_a"), sd[_key("q_norm")])
    q = lin(qr, "q_b").reshape(len(x), d.heads, d.qk_nope + d.qk_rope)[..., : d.qk_nope]
    codes, s = sd[_key("kv_b")], sd[_key("kv_b", "scale")]
    head_rows = np.arange(d.heads)[:, None] * (d.qk_nope + d.v_head) + np.arange(d.qk_nope)

    def absorb(rows):  # rows: [heads, qk_nope] row numbers of wkv_b
        w = codes[rows.reshape(-1)].astype(np.float64)
        w *= np.repeat(s[rows.reshape(-1) // 128], 128, axis=1)
        return np.einsum("thd,hdc->thc", q, w.reshape(d.heads, d.qk_nope, d.kv_lora_rank))

    proj = xa @ sd[_key("proj")].astype(np.float64).T * 64**-0.5 * 128**-0.5
    return absorb(head_rows), absorb(head_rows + d.qk_nope), proj


def _rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _run_prologs(path: str, w, x: np.ndarray):
    from tilesim.reference import dsa_indexer_prolog, mla_prolog
    from tilesim.reference.cases.dsa_common import yarn_rope_inputs

    t = len(x)
    rope = yarn_rope_inputs(path, np.arange(100, 100 + t), 163840)
    slots = np.arange(t, dtype=np.int64)
    if path == "int8":
        caches = {"kv_cache": np.zeros((128, 512), np.int8),
                  "kr_cache": np.zeros((128, 64), BF16),
                  "kv_scale_cache": np.zeros((128, 4), np.float32)}  # fmt: skip
        kcache = {"k_cache": np.zeros((1, 128, 128), np.int8),
                  "k_scale": np.zeros((1, 128), np.float16)}  # fmt: skip
    else:
        caches = {"kv_cache": np.zeros((128, 656), FP8_E4M3)}
        kcache = {"k_cache": np.zeros((1, 128 * 132), np.uint8)}
    mla = mla_prolog(x=x, **rope, slot_mapping=slots, **caches, **w.mla, path=path)
    qs = {"q_norm_scale": mla.q_norm_scale} if path == "int8" else {}
    ip = dsa_indexer_prolog(x=x, q_norm=mla.q_norm, **qs, **rope, slot_mapping=slots,
                            **kcache, **w.indexer, path=path)  # fmt: skip
    return mla, ip


@pytest.mark.slow
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_the_goldens_run_on_a_converted_layer_and_give_the_models_queries(path):
    rng = np.random.default_rng(11)
    sd = _full_layer(rng)
    x = to_bf16(rng.standard_normal((2, DSV32_DIMS.hidden)).astype(np.float32))
    w = convert_dsv32_weights(sd, 0, path=path)
    mla, ip = _run_prologs(path, w, x)
    absorbed, wrong, proj = _model_f64(sd, x)
    # measured: 1.4 % (INT8: q_norm and w_uq_qr quantized) and 3.8 % (FP8 activations); a
    # wrong mapping is unrelated, about sqrt(2) away
    assert _rel_l2(mla.query_nope, absorbed) < 0.1
    assert _rel_l2(mla.query_nope, wrong) > 1.0
    weights = np.asarray(ip.weights, np.float64)
    if path == "fp8":  # the FP8 prolog folds each head's q scale into its weight
        weights = weights / np.asarray(ip.q_scale, np.float64)
    # INT8: BF16 then FP16 roundings (measured 1.7e-3); FP8: FP32 sums only (3.8e-8)
    assert _rel_l2(weights, proj) < (2.0**-8 if path == "int8" else 2.0**-16)
