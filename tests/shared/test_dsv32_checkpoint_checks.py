"""shared/dsv32_checkpoint.py under the argument policy of :mod:`tilesim.shared.validate`: a
weight / scale pair the loader does not expect, non-finite or empty weights given to the
per-channel INT8 quant, block scales and E4M3 codes given to ``dequant_bf16``, config aliases
that disagree, and unreadable checkpoint files are each a ``ValueError`` naming the tensor,
argument, key or file, before any arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_dsv32_checkpoint import SMALL, _key, _save, layer_tensors
from tilesim.shared.casts import to_bf16, to_fp8_e4m3
from tilesim.shared.dsv32_checkpoint import (
    Dsv32Dims,
    convert_dsv32_weights,
    dequant_bf16,
    quant_int8_per_channel,
)


# ----------------------------------------------------------------------------- weight / scale
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_a_block_scale_beside_a_bf16_weight_is_refused_naming_both_keys(rng, path):
    """A BF16 linear that still has its ``weight_scale_inv`` (FP8 codes widened but not
    dequantized, or a stale scale file) is ambiguous: a ValueError names the weight's key and
    the scale's, instead of using the weight with the scale ignored."""
    sd = layer_tensors(SMALL, rng)
    sd[_key("q_b")] = to_bf16(sd[_key("q_b")].astype(np.float32))  # codes widened, not scaled
    with pytest.raises(
        ValueError,
        match=r"^model\.layers\.0\.self_attn\.q_b_proj\.weight: expected .*without a block "
        r"scale.*got bfloat16 with 'model\.layers\.0\.self_attn\.q_b_proj\.weight_scale_inv'",
    ):
        convert_dsv32_weights(sd, path=path, dims=SMALL)


def test_a_scale_beside_a_bf16_weight_is_refused_in_deepseek_names_and_for_weights_proj(rng):
    """The same rule under DeepSeek's inference names (``.scale``), and for the indexer's
    ``weights_proj`` (never block-scaled): the weight's key and the scale's are named."""
    sd = layer_tensors(SMALL, rng, scheme="ds", linear="bf16")
    bad = {**sd, _key("kv_a", "scale", "ds"): np.ones((2, 3), np.float32)}
    with pytest.raises(ValueError, match=r"^layers\.0\.attn\.wkv_a\.weight: .*'layers\.0\.attn"
                                         r"\.wkv_a\.scale'"):  # fmt: skip
        convert_dsv32_weights(bad, dims=SMALL)
    bad = {**sd, _key("proj", "scale", "ds"): np.ones((1, 3), np.float32)}
    proj = r"layers\.0\.attn\.indexer\.weights_proj\."
    with pytest.raises(ValueError, match=rf"^{proj}weight: .*'{proj}scale'"):
        convert_dsv32_weights(bad, dims=SMALL)


@pytest.mark.parametrize("path, role", [("int8", "q_b"), ("int8", "q_a"), ("fp8", "kv_b")])
def test_a_dequantized_weight_past_the_bf16_range_is_refused_naming_both_keys(rng, path, role):
    """Finite codes times a finite scale can pass BF16's largest value (about 3.39e38); the
    BF16 weight the loader dequantizes (q_b / q_a on the INT8 path, kv_b's ``w_uk`` on both)
    would hold inf. The loader names the weight's key and the scale's, not the internal
    quantizer's argument."""
    sd = layer_tensors(SMALL, rng)
    scale = np.array(sd[_key(role, "scale")], copy=True)
    scale[0, 0] = np.float32(1e37)  # |code| up to 448: 4.5e39 > BF16 max
    sd[_key(role, "scale")] = scale
    weight, scale_key = _key(role).replace(".", r"\."), _key(role, "scale").replace(".", r"\.")
    want = rf"^{weight}: expected finite values, got -?inf .*\(codes times {scale_key} past"
    with pytest.raises(ValueError, match=want):
        convert_dsv32_weights(sd, path=path, dims=SMALL)


# ----------------------------------------------------------------------------- per-channel quant
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_per_channel_quant_refuses_non_finite_weights_naming_w_and_the_index(bad):
    """A NaN (codes 0, scale NaN) or an inf (code -128, scale inf) in ``w`` is a ValueError
    naming ``w`` and the first bad index ``[K, N]``."""
    w = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    w[2, 1] = bad
    with pytest.raises(ValueError, match=r"^w: expected finite values, got .* at index \[2, 1\]"):
        quant_int8_per_channel(w)


@pytest.mark.parametrize("shape", [(0, 3), (8, 0)])
def test_per_channel_quant_refuses_an_empty_weight_naming_w(shape):
    """An empty ``[0, N]`` or ``[K, 0]`` weight is a ValueError naming ``w`` (not NumPy's
    reshape error)."""
    with pytest.raises(ValueError, match=r"^w: expected a non-empty \[K, N\] array, got shape"):
        quant_int8_per_channel(np.zeros(shape, np.float32))


# ----------------------------------------------------------------------------- dequant_bf16
def _codes(n: int = 128) -> np.ndarray:
    return to_fp8_e4m3(np.ones((n, n), np.float32))


@pytest.mark.parametrize("value, want", [(np.nan, "finite scales > 0, got nan"),
                                         (np.inf, "finite values, got inf"),
                                         (-0.5, "finite scales > 0, got -0.5"),
                                         (0.0, "finite scales > 0, got 0.0")])  # fmt: skip
def test_dequant_bf16_refuses_the_scales_the_loader_refuses(value, want):
    """NaN, inf, negative and zero block scales are refused by ``dequant_bf16`` with the
    loader's rule and messages, naming ``scale`` and the block."""
    s = np.ones((2, 1), np.float32)
    s[1, 0] = value
    with pytest.raises(ValueError, match=rf"^scale: expected {want} at index \[1, 0\]"):
        dequant_bf16(_codes(256)[:, :128], s)


def test_dequant_bf16_refuses_a_nan_code_as_the_loader_does(rng):
    """An E4M3 NaN code (``0x7F`` / ``0xFF``) in ``weight`` is refused naming ``weight`` and
    its index, with the loader's message; the loader's own message is unchanged."""
    w = _codes()
    w.view(np.uint8)[5, 6] = 0xFF
    with pytest.raises(ValueError, match=r"^weight: expected finite E4M3 codes, got a NaN code "
                                         r"at index \[5, 6\]"):  # fmt: skip
        dequant_bf16(w, np.ones((1, 1), np.float32))
    sd = layer_tensors(SMALL, rng)
    codes = sd[_key("kv_b")].copy()
    codes.view(np.uint8)[1, 2] = 0x7F
    with pytest.raises(ValueError, match=r"kv_b_proj\.weight: expected finite E4M3 codes, got "
                                         r"a NaN code at index \[1, 2\]"):  # fmt: skip
        convert_dsv32_weights({**sd, _key("kv_b"): codes}, dims=SMALL)


# ----------------------------------------------------------------------------- from_config
@pytest.mark.parametrize("config, keys", [
    ({"hidden_size": 7168, "dim": 1024}, ("hidden_size", 7168, "dim", 1024)),
    ({"n_heads": 64, "num_attention_heads": 128}, ("num_attention_heads", 128, "n_heads", 64)),
])  # fmt: skip
def test_dims_from_config_refuses_aliases_that_disagree(config, keys):
    """Two aliases of one size (``hidden_size`` / ``dim``, ``num_attention_heads`` /
    ``n_heads``) with different values are a ValueError naming both keys and both values;
    equal values are accepted."""
    k1, v1, k2, v2 = keys
    with pytest.raises(ValueError, match=rf"^config: expected .*got '{k1}'={v1} and "
                                         rf"'{k2}'={v2}"):  # fmt: skip
        Dsv32Dims.from_config(config)
    same = Dsv32Dims.from_config({"hidden_size": 1024, "dim": 1024, "n_heads": 4,
                                  "num_attention_heads": 4})  # fmt: skip
    assert (same.hidden, same.heads) == (1024, 4)


# ----------------------------------------------------------------------------- files
INDEX = "model.safetensors.index.json"
KEY = "model.layers.0.self_attn.q_a_proj.weight"


@pytest.mark.parametrize("text, want, got", [
    ("{not json", "a JSON object", "invalid JSON"),
    ("[1, 2]", "a JSON object", "list"),
    (json.dumps({"weight_map": [KEY]}), "a 'weight_map' object", "list"),
    (json.dumps({"weight_map": {KEY: 5}}), r"weight_map\['.*q_a_proj\.weight'\] to be a file "
                                           r"name \(str\)", "int 5"),
])  # fmt: skip
def test_a_bad_index_json_is_a_value_error_naming_the_file(tmp_path, text, want, got):
    """An index.json that is not JSON, not an object, with a ``weight_map`` that is not an
    object, or with a non-string file name is a ValueError naming the index file."""
    (tmp_path / INDEX).write_text(text)
    with pytest.raises(ValueError, match=rf"^source: expected {want} in .*{INDEX}, got {got}"):
        convert_dsv32_weights(tmp_path)


@pytest.mark.torch
def test_a_missing_shard_or_key_is_a_value_error_naming_the_key_and_file(tmp_path):
    """A ``weight_map`` naming a file that does not exist, or a file that lacks the key, is a
    ValueError naming the key and the file."""
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {KEY: "x.safetensors"}}))
    with pytest.raises(ValueError, match=rf"^{KEY}: expected the file .*x\.safetensors.*, got "
                                         r"no such file"):  # fmt: skip
        convert_dsv32_weights(tmp_path)
    _save(tmp_path, {"other": np.zeros(1, np.float32)}, "p.safetensors")
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {KEY: "p.safetensors"}}))
    with pytest.raises(ValueError, match=rf"^{KEY}: expected a tensor readable from .*p\."
                                         r"safetensors', got SafetensorError"):  # fmt: skip
        convert_dsv32_weights(tmp_path)


@pytest.mark.torch
@pytest.mark.parametrize("form", ["truncated", "garbage"])
def test_a_corrupt_safetensors_file_is_a_value_error_naming_it(tmp_path, form):
    """A truncated or garbage ``.safetensors`` file (given directly or as a directory's only
    file) is a ValueError naming the file, chained to the reader's error."""
    if form == "truncated":
        data = _save(tmp_path, {KEY: np.zeros((4, 4), np.float32)}, "g.safetensors").read_bytes()
        (tmp_path / "g.safetensors").unlink()
        data = data[: len(data) // 2]
    else:
        data = b"\0" * 100
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "f.safetensors").write_bytes(data)
    for source in (d / "f.safetensors", d):
        with pytest.raises(ValueError, match=r"^source: expected a readable \.safetensors file,"
                                             r" got .*f\.safetensors") as e:  # fmt: skip
            convert_dsv32_weights(source)
        assert e.value.__cause__ is not None
