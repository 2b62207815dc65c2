"""DeepSeek-V3.2 checkpoint tensors -> the weight arguments of the prologs and the layer step.

One layer's attention tensors, by their published names, become the weight arguments of
:func:`tilesim.reference.mla_prolog`, :func:`tilesim.reference.dsa_indexer_prolog` and
:func:`tilesim.reference.dsa_attention_step` (``docs/ops/dsa_attention_step.md#from-a-checkpoint``):
:func:`dsv32_weights_int8` for the 910B path (pypto-gym's INT8 prologs), :func:`dsv32_weights_fp8`
for DeepSeek's reference path, :func:`convert_dsv32_weights` choosing by ``path``.

Names. Both schemes are read (the one whose ``q_a`` weight is present is used):

* Hugging Face (the published checkpoint, ``model.safetensors.index.json``):
  ``model.layers.{i}.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
  kv_a_layernorm, kv_b_proj}.weight``, ``indexer.{wq_b, wk, weights_proj}.weight``,
  ``indexer.k_norm.{weight, bias}``; FP8 weights carry ``.weight_scale_inv``.
* DeepSeek's inference names (``deepseek-ai/DeepSeek-V3.2-Exp:inference/convert.py``, its
  ``mapping``: ``self_attn`` -> ``attn``, ``weight_scale_inv`` -> ``scale``, the ``model.``
  prefix dropped): ``layers.{i}.attn.{wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b}.weight``,
  ``attn.indexer.*`` as above, scales ``.scale``.

Dtypes and shapes (``deepseek-ai/DeepSeek-V3.2-Exp:inference/model.py``: ``Linear`` holds an
E4M3 weight ``[out, in]`` with FP32 block scales ``[ceil(out/128), ceil(in/128)]``;
``vllm-project/vllm:vllm/model_executor/models/deepseek_v2.py``: the indexer's ``wk`` and
``wq_b`` FP8 with ``weight_scale_inv``, ``weights_proj`` unquantized BF16): every linear may be
FP8 E4M3 with its scale or BF16 without one; norms BF16 or FP32 ``[n]``; ``weights_proj`` BF16
or FP32 ``[64, hidden]``. Sizes come from :class:`Dsv32Dims` (DeepSeek-V3.2's
``config_671B_v3.2.json`` by default; a smaller one for synthetic layers), each tensor checked
against it.

Transforms (all exact except the three roundings named):

* ``[out, in]`` -> ``[in, out]`` (the goldens compute ``x @ w``); FP8 block scales transposed
  with it (``[in/128, out/128]``, the goldens' ``[K/128, N/128]``).
* ``dequant``: DeepSeek's ``weight_dequant``: ``BF16(FP32(code) * scale)`` per 128 x 128 block
  (one FP32 product, one BF16 rounding; a BF16 weight is taken as it is).
* ``w_uk [heads, qk_nope, kv_lora]`` = ``dequant(kv_b)`` viewed ``[heads, qk_nope + v_head,
  kv_lora]``, first ``qk_nope`` rows of each head (``MLA.forward``'s decode ``wkv_b[:,
  :qk_nope_head_dim]``).
* INT8 path: ``q_a`` and ``kv_a`` dequantized to BF16; ``q_b`` and the indexer's ``wq_b``
  dequantized, transposed and quantized per output channel as pypto-gym quantizes
  ``w_uqqr`` (``hicann/pypto-gym:tests/ops/deepseek_v32_exp/test_mla_prolog_quant.py``,
  ``quant(w, False)``): per column ``amax`` over K, ``s = FP32(FP32(1 / amax) * 127)``
  (torch's ``127 / amax``), codes ``int8(trunc(fp16(int32(rint(FP32(w * s))))))``, scale
  ``FP32(1 / s)``; an all-zero column gives codes 0 and scale 0. The indexer's ``wk``
  dequantized to BF16, ``weights_proj`` BF16 (an FP32 one rounded once), the Hadamard
  matrices ``BF16(H * 128^-0.5)`` (:func:`tilesim.shared.hadamard.scaled_hadamard_bf16`,
  DeepSeek's ``rotate_activation`` as a matrix).
* FP8 path: the E4M3 codes and their scales, transposed; a BF16 MLA linear stays BF16 (the
  prolog's BF16 linear); the indexer's ``wq_b`` and ``wk`` must be FP8 (the FP8 indexer
  prolog takes no other); ``weights_proj`` widened exactly to FP32 (DeepSeek's FP32
  ``weights_proj`` layer).

Input: a mapping of name -> NumPy array or torch tensor, a ``.safetensors`` file, or a
checkpoint directory (``model.safetensors.index.json``'s ``weight_map``, or one
``.safetensors`` file), read lazily -- only this layer's tensors -- through ``safetensors``
and torch (the ``checkpoint`` extra: ``pip install "tilesim[checkpoint]"``; safetensors'
NumPy reader has no BF16 or FP8). Nothing given is written; every result is a fresh NumPy
array. Bad input raises ``ValueError`` / ``TypeError`` naming the checkpoint key, the expected
and the actual value, before any arithmetic.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3, to_bf16
from tilesim.shared.hadamard import scaled_hadamard_bf16
from tilesim.shared.mla_prolog import BLOCK  # DeepSeek's FP8 weight block (128 x 128)
from tilesim.shared.quant import e4m3_to_fp32, quant_int8_gym
from tilesim.shared.validate import (
    check_array,
    check_choice,
    check_finite,
    check_int,
    check_positive,
    dtype_of,
    e4m3_nan_codes,
    host_data,
    shape_of,
)

PATHS = ("int8", "fp8")
F32 = np.float32
#: the extra that reads safetensors checkpoints
EXTRA = 'pip install "tilesim[checkpoint]"'


class Dsv32Dims(NamedTuple):
    """The sizes of one DeepSeek-V3.2 attention layer (defaults: ``config_671B_v3.2.json``)."""

    hidden: int = 7168  #: ``dim`` / ``hidden_size``
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    heads: int = 128  #: ``n_heads`` / ``num_attention_heads``
    qk_nope: int = 128  #: ``qk_nope_head_dim``
    qk_rope: int = 64  #: ``qk_rope_head_dim``
    v_head: int = 128  #: ``v_head_dim``
    index_heads: int = 64  #: ``index_n_heads``
    index_dim: int = 128  #: ``index_head_dim``

    @classmethod
    def from_config(cls, config: Mapping) -> Dsv32Dims:
        """The sizes of a Hugging Face ``config.json`` or DeepSeek's inference config (their
        own key names; a missing key keeps the default). Both names of one size given
        (``hidden_size`` and ``dim``, ``num_attention_heads`` and ``n_heads``) must agree."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config: expected a mapping, got {type(config).__name__}")
        aliases = {"hidden": ("hidden_size", "dim"), "heads": ("num_attention_heads", "n_heads"),
                   "qk_nope": ("qk_nope_head_dim",), "qk_rope": ("qk_rope_head_dim",),
                   "v_head": ("v_head_dim",), "index_heads": ("index_n_heads",),
                   "index_dim": ("index_head_dim",), "q_lora_rank": ("q_lora_rank",),
                   "kv_lora_rank": ("kv_lora_rank",)}  # fmt: skip
        got = {}
        for field, keys in aliases.items():
            vals = {k: check_int(config[k], f"config[{k!r}]", lo=1) for k in keys if k in config}
            if len(set(vals.values())) > 1:
                given = " and ".join(f"{k!r}={v}" for k, v in vals.items())
                raise ValueError(f"config: expected one value for {field} (aliases "
                                 f"{' / '.join(map(repr, keys))}), got {given}")  # fmt: skip
            if vals:
                got[field] = next(iter(vals.values()))
        return cls(**got)


DSV32_DIMS = Dsv32Dims()

#: argument role -> (Hugging Face module, DeepSeek inference module), under the layer's prefix
MODULES = {
    "q_a": ("q_a_proj", "wq_a"),
    "q_norm": ("q_a_layernorm", "q_norm"),
    "q_b": ("q_b_proj", "wq_b"),
    "kv_a": ("kv_a_proj_with_mqa", "wkv_a"),
    "kv_norm": ("kv_a_layernorm", "kv_norm"),
    "kv_b": ("kv_b_proj", "wkv_b"),
    "index_q_b": ("indexer.wq_b", "indexer.wq_b"),
    "index_k": ("indexer.wk", "indexer.wk"),
    "index_k_norm": ("indexer.k_norm", "indexer.k_norm"),
    "index_proj": ("indexer.weights_proj", "indexer.weights_proj"),
}
SCHEMES = ("huggingface", "deepseek")
_PREFIX = {"huggingface": "model.layers.{}.self_attn.", "deepseek": "layers.{}.attn."}
_SCALE = {"huggingface": "weight_scale_inv", "deepseek": "scale"}


class Dsv32LayerWeights(NamedTuple):
    """The converted weights: ``mla`` (the keyword arguments of ``mla_prolog``), ``indexer``
    (of ``dsa_indexer_prolog``); :attr:`step` merges both (``dsa_attention_step``'s).
    ``scheme`` and ``keys`` say which checkpoint names were read."""

    path: str
    mla: dict
    indexer: dict
    scheme: str
    keys: tuple

    @property
    def step(self) -> dict:
        return {**self.mla, **self.indexer}


# ----------------------------------------------------------------------------- sources
class _Tensors:
    """Name -> host NumPy array, from a mapping or safetensors files (read on demand)."""

    def __init__(self, source):
        self.files: dict | None = None
        if isinstance(source, Mapping):
            self.mapping = source
        elif isinstance(source, (str, os.PathLike)):
            self.mapping, self.files = None, _safetensors_files(Path(source))
        else:
            raise TypeError(f"source: expected a mapping of name -> array, a .safetensors file "
                            f"or a checkpoint directory, got {type(source).__name__}")  # fmt: skip

    def __contains__(self, key: str) -> bool:
        return key in (self.mapping if self.files is None else self.files)

    def meta(self, key: str):
        """The tensor as given (a mapping's value) or read from its file."""
        if self.files is None:
            return self.mapping[key]
        file = self.files[key]
        if not file.is_file():
            raise ValueError(f"{key}: expected the file {str(file)!r} (its weight_map entry), got "
                             f"no such file")  # fmt: skip
        safe_open, errors = _safe_open()
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                return f.get_tensor(key)
        except errors as e:
            raise ValueError(f"{key}: expected a tensor readable from {str(file)!r}, got "
                             f"{type(e).__name__}: {e}") from e  # fmt: skip


def _safe_open():
    """``(safetensors.safe_open, the errors its reading raises)``."""
    try:
        import torch  # noqa: F401 (safetensors' "pt" reader returns torch tensors)
        from safetensors import SafetensorError, safe_open
    except ImportError as e:
        raise ImportError(f"source: reading a .safetensors checkpoint needs safetensors and "
                          f"torch ({EXTRA}); missing: {e.name}") from e  # fmt: skip
    return safe_open, (OSError, SafetensorError)


def _file_keys(path: Path) -> dict:
    safe_open, errors = _safe_open()
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return dict.fromkeys(f.keys(), path)
    except errors as e:
        raise ValueError(f"source: expected a readable .safetensors file, got {str(path)!r} "
                         f"({type(e).__name__}: {e})") from e  # fmt: skip


def _index_files(path: Path, index: Path) -> dict:
    """key -> file of ``index`` (``model.safetensors.index.json``): its ``weight_map`` object
    of key -> file name (relative to ``path``)."""
    try:
        doc = json.loads(index.read_bytes())
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError: ValueError
        got = "an unreadable file" if isinstance(e, OSError) else "invalid JSON"
        raise ValueError(f"source: expected a JSON object in {index}, got {got} "
                         f"({type(e).__name__}: {e})") from e  # fmt: skip
    if not isinstance(doc, dict):
        raise ValueError(f"source: expected a JSON object in {index}, got {type(doc).__name__}")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        got = "none" if weight_map is None else type(weight_map).__name__
        raise ValueError(f"source: expected a 'weight_map' object in {index}, got {got}")
    for k, v in weight_map.items():
        if not isinstance(v, str):
            raise ValueError(f"source: expected weight_map[{k!r}] to be a file name (str) in "
                             f"{index}, got {type(v).__name__} {v!r}")  # fmt: skip
    return {k: path / v for k, v in weight_map.items()}


def _safetensors_files(path: Path) -> dict:
    """key -> file: a ``.safetensors`` file, or a directory with ``model.safetensors.index.json``
    (its ``weight_map``) or exactly one ``.safetensors`` file."""
    if path.is_file():
        return _file_keys(path)
    if not path.is_dir():
        raise ValueError(f"source: expected a .safetensors file or a checkpoint directory, got "
                         f"{str(path)!r} (no such file or directory)")  # fmt: skip
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return _index_files(path, index)
    files = sorted(path.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"source: expected model.safetensors.index.json or exactly one "
                         f".safetensors file in {str(path)!r}, got {len(files)} files")  # fmt: skip
    return _file_keys(files[0])


# ----------------------------------------------------------------------------- reading
def _scheme(tensors: _Tensors, layer: int) -> str:
    keys = [_key(s, layer, "q_a", "weight") for s in SCHEMES]
    for scheme, key in zip(SCHEMES, keys, strict=True):
        if key in tensors:
            return scheme
    raise ValueError(f"source: expected layer {layer}'s tensor {keys[0]!r} (Hugging Face) or "
                     f"{keys[1]!r} (DeepSeek inference), got neither")  # fmt: skip


def _key(scheme: str, layer: int, role: str, leaf: str) -> str:
    module = MODULES[role][SCHEMES.index(scheme)]
    leaf = _SCALE[scheme] if leaf == "scale" else leaf
    return f"{_PREFIX[scheme].format(layer)}{module}.{leaf}"


def _get(tensors: _Tensors, scheme: str, layer: int, role: str, leaf: str = "weight"):
    key = _key(scheme, layer, role, leaf)
    if key not in tensors:
        other = _key(SCHEMES[1 - SCHEMES.index(scheme)], layer, role, leaf)
        raise ValueError(f"source: expected tensor {key!r} ({scheme} names, as the layer's other "
                         f"tensors; {other!r} in the other scheme), got none")  # fmt: skip
    return key, tensors.meta(key)


class _Linear(NamedTuple):
    key: str
    weight: np.ndarray  #: host ``[out, in]``, E4M3 or BF16
    scale: np.ndarray | None  #: host FP32 ``[ceil(out/128), ceil(in/128)]`` (E4M3 only)
    scale_key: str | None = None


def _no_scale(tensors, scheme, layer, role, key: str, dtype) -> None:
    """A weight stored unscaled (BF16 / FP32) has no block scale beside it: a scale there
    means FP8 codes widened without their scale, or a stale scale (ambiguous either way)."""
    s_key = _key(scheme, layer, role, "scale")
    if s_key in tensors:
        dt = np.dtype(dtype)
        raise ValueError(
            f"{key}: expected a {dt} weight without a block scale (only an FP8 E4M3 weight "
            f"carries one), got {dt} with {s_key!r} beside it"
        )


def _check_fp8_block(codes: np.ndarray, c_name: str, scales: np.ndarray, s_name: str) -> None:
    """The value rule of an E4M3 weight and its FP32 block scales (the loader's and
    :func:`dequant_bf16`'s): no NaN code, every scale finite and ``> 0``."""
    bad = e4m3_nan_codes(codes)
    if bad.any():
        idx = [int(i) for i in np.argwhere(bad)[0]]
        raise ValueError(f"{c_name}: expected finite E4M3 codes, got a NaN code at index {idx}")
    check_positive(scales, s_name, "finite scales")  # NaN and inf fail too (inf: finite check)
    check_finite(scales, s_name)


def _linear(tensors, scheme, layer, role, shape) -> _Linear:
    """One linear's weight (checked ``shape`` = ``(out, in)``) and, for FP8, its scale; a BF16
    weight with a scale beside it is refused."""
    key, w = _get(tensors, scheme, layer, role)
    check_array(w, key, dtype=(FP8_E4M3, BF16), shape=shape, layout="[out, in]")
    a = host_data(w, key)
    if dtype_of(w, key) == BF16:
        _no_scale(tensors, scheme, layer, role, key, BF16)
        check_finite(a, key)
        return _Linear(key, a, None)
    s_key, s = _get(tensors, scheme, layer, role, "scale")
    blocks = tuple(-(-n // BLOCK) for n in shape)
    check_array(s, s_key, dtype=np.float32, shape=blocks, layout="[ceil(out/128), ceil(in/128)]")
    sa = host_data(s, s_key)
    _check_fp8_block(a, key, sa, s_key)
    return _Linear(key, a, sa, s_key)


def _vector(tensors, scheme, layer, role, leaf, n: int, dtypes=(BF16, np.float32)):
    key, v = _get(tensors, scheme, layer, role, leaf)
    check_array(v, key, dtype=dtypes, shape=(n,), layout="[n]")
    a = host_data(v, key)
    check_finite(a, key)
    return key, np.array(a, copy=True)


def _read(tensors: _Tensors, layer: int, dims: Dsv32Dims) -> tuple[str, dict]:
    """Every tensor of the layer, checked: role -> :class:`_Linear` or (key, array)."""
    layer = check_int(layer, "layer", lo=0)
    scheme = _scheme(tensors, layer)
    d = dims
    q_head = d.qk_nope + d.qk_rope
    shapes = {"q_a": (d.q_lora_rank, d.hidden), "q_b": (d.heads * q_head, d.q_lora_rank),
              "kv_a": (d.kv_lora_rank + d.qk_rope, d.hidden),
              "kv_b": (d.heads * (d.qk_nope + d.v_head), d.kv_lora_rank),
              "index_q_b": (d.index_heads * d.index_dim, d.q_lora_rank),
              "index_k": (d.index_dim, d.hidden)}  # fmt: skip
    got = {r: _linear(tensors, scheme, layer, r, shp) for r, shp in shapes.items()}
    got["q_norm"] = _vector(tensors, scheme, layer, "q_norm", "weight", d.q_lora_rank)
    got["kv_norm"] = _vector(tensors, scheme, layer, "kv_norm", "weight", d.kv_lora_rank)
    got["k_gamma"] = _vector(tensors, scheme, layer, "index_k_norm", "weight", d.index_dim)
    got["k_beta"] = _vector(tensors, scheme, layer, "index_k_norm", "bias", d.index_dim)
    key, p = _get(tensors, scheme, layer, "index_proj")
    check_array(p, key, dtype=(BF16, np.float32), shape=(d.index_heads, d.hidden),
                layout="[index_heads, hidden]")  # fmt: skip
    _no_scale(tensors, scheme, layer, "index_proj", key, dtype_of(p, key))
    check_finite(host_data(p, key), key)
    got["index_proj"] = (key, host_data(p, key))
    return scheme, got


# ----------------------------------------------------------------------------- transforms
def dequant_bf16(weight, scale) -> np.ndarray:
    """DeepSeek's ``weight_dequant`` of E4M3 ``weight [out, in]`` with FP32 block scales
    ``[ceil(out/128), ceil(in/128)]``: ``BF16(FP32(code) * scale)`` (one FP32 product, one
    BF16 rounding, round to nearest even); returns BF16 ``[out, in]``. The loader's value
    rule applies: no E4M3 NaN code, every scale finite and ``> 0``."""
    check_array(weight, "weight", dtype=FP8_E4M3, ndim=2, layout="[out, in]")
    out_n, in_n = shape_of(weight, "weight")
    blocks = (-(-out_n // BLOCK), -(-in_n // BLOCK))
    check_array(scale, "scale", dtype=np.float32, shape=blocks, layout="[out/128, in/128] blocks")
    w, s = host_data(weight, "weight"), host_data(scale, "scale")
    _check_fp8_block(w, "weight", s, "scale")
    return _dequant(w, s)


def _dequant(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """:func:`dequant_bf16` of checked host arrays."""
    out_n, in_n = w.shape
    out = np.empty((out_n, in_n), dtype=BF16)
    for i in range(s.shape[0]):  # one 128-row band at a time: no full-size FP32 copy of w
        rows = slice(i * BLOCK, min((i + 1) * BLOCK, out_n))
        band = np.repeat(s[i], BLOCK)[:in_n].astype(F32)
        with np.errstate(over="ignore"):  # IEEE: a product past FP32 is inf, as in torch
            out[rows] = to_bf16(e4m3_to_fp32(w[rows]) * band[None, :])
    return out


def _bf16(lin: _Linear) -> np.ndarray:
    """The weight as BF16 ``[out, in]`` (dequantized if FP8; a fresh array). A product
    ``code * scale`` past the BF16 range is refused, naming both keys: every consumer of
    the loader's BF16 weights needs them finite."""
    if lin.scale is None:
        return np.array(lin.weight, copy=True)
    out = _dequant(lin.weight, lin.scale)  # checked by _linear
    try:
        check_finite(out, lin.key)  # on the BF16 bits: no full-size FP32 copy
    except ValueError as e:
        raise ValueError(f"{e} (codes times {lin.scale_key} past the BF16 range)") from None
    return out


def _t(a: np.ndarray) -> np.ndarray:
    """``a.T`` as a fresh C-contiguous array."""
    return np.array(a.T, order="C", copy=True)


def quant_int8_per_channel(w) -> tuple[np.ndarray, np.ndarray]:
    """pypto-gym's per-output-channel INT8 quant of ``w [K, N]`` (BF16 or FP32): the one INT8
    rule :func:`tilesim.shared.quant.quant_int8_gym` over each column's ``K`` values, ``(codes
    int8 [K, N], dequant scales FP32 [N])``. ``w`` is not modified; it must be non-empty and
    finite."""
    check_array(w, "w", dtype=(BF16, np.float32), ndim=2, layout="[K, N]")
    shp = shape_of(w, "w")
    if 0 in shp:
        raise ValueError(f"w: expected a non-empty [K, N] array, got shape {shp}")
    a = host_data(w, "w")
    check_finite(a, "w")
    codes_t, scale = quant_int8_gym(np.ascontiguousarray(a.T), a.shape[0])  # [N, K], [N, 1]
    return np.ascontiguousarray(codes_t.T), scale.reshape(-1)


def _as_bf16(a: np.ndarray) -> np.ndarray:
    """BF16 ``a`` as it is, FP32 ``a`` rounded once to BF16 (fresh arrays)."""
    return np.array(a, copy=True) if a.dtype == BF16 else to_bf16(a)


def _w_uk(kv_b: _Linear, d: Dsv32Dims) -> np.ndarray:
    w = _bf16(kv_b).reshape(d.heads, d.qk_nope + d.v_head, d.kv_lora_rank)
    return np.array(w[:, : d.qk_nope], order="C", copy=True)


def _fp8_args(lin: _Linear) -> tuple[np.ndarray, np.ndarray | None]:
    """``([in, out] weight, [in/128, out/128] scale or None)`` as the FP8 path takes them."""
    return _t(lin.weight), (None if lin.scale is None else _t(lin.scale))


# ----------------------------------------------------------------------------- the paths
def dsv32_weights_int8(source, layer: int = 0, *, dims: Dsv32Dims = DSV32_DIMS):
    """The 910B path's weights (``path="int8"``: pypto-gym's prologs) of layer ``layer``.

    ``mla``: BF16 ``w_dq [hidden, q_lora]`` and ``w_dkv_kr [hidden, kv_lora + qk_rope]``
    (dequantized, transposed), INT8 ``w_uq_qr [q_lora, heads * (qk_nope + qk_rope)]`` with FP32
    ``w_uq_qr_scale [N]`` (per channel), BF16 ``w_uk [heads, qk_nope, kv_lora]``, ``gamma_cq``,
    ``gamma_ckv`` as stored. ``indexer``: INT8 ``w_qb [q_lora, index_heads * index_dim]`` with
    FP32 ``w_qb_scale [N, 1]``, BF16 ``w_k [hidden, index_dim]``, BF16 ``w_proj [hidden,
    index_heads]``, ``ln_gamma`` / ``ln_beta`` as stored, BF16 ``hadamard_q`` / ``hadamard_k``
    ``[index_dim, index_dim]``. Returns :class:`Dsv32LayerWeights` (module docstring)."""
    dims = _dims(dims)
    scheme, t = _read(_Tensors(source), layer, dims)
    w_uq_qr, uq_scale = quant_int8_per_channel(_bf16(t["q_b"]).T)  # a view: [K, N]
    w_qb, qb_scale = quant_int8_per_channel(_bf16(t["index_q_b"]).T)
    mla = {"w_dq": _t(_bf16(t["q_a"])), "w_uq_qr": w_uq_qr, "w_uq_qr_scale": uq_scale,
           "w_uk": _w_uk(t["kv_b"], dims), "w_dkv_kr": _t(_bf16(t["kv_a"])),
           "gamma_cq": t["q_norm"][1], "gamma_ckv": t["kv_norm"][1]}  # fmt: skip
    indexer = {"w_qb": w_qb, "w_qb_scale": qb_scale.reshape(-1, 1),
               "w_k": _t(_bf16(t["index_k"])), "w_proj": _t(_as_bf16(t["index_proj"][1])),
               "ln_gamma": t["k_gamma"][1], "ln_beta": t["k_beta"][1],
               "hadamard_q": scaled_hadamard_bf16(dims.index_dim),
               "hadamard_k": scaled_hadamard_bf16(dims.index_dim)}  # fmt: skip
    return Dsv32LayerWeights("int8", mla, indexer, scheme, _keys(t))


def dsv32_weights_fp8(source, layer: int = 0, *, dims: Dsv32Dims = DSV32_DIMS):
    """DeepSeek's reference path's weights (``path="fp8"``) of layer ``layer``.

    ``mla``: ``w_dq``, ``w_uq_qr``, ``w_dkv_kr`` ``[in, out]`` as stored (E4M3 with
    ``w_dq_scale``, ``w_uq_qr_scale``, ``w_dkv_kr_scale`` ``[in/128, out/128]``, or BF16 with
    ``None``), BF16 ``w_uk [heads, qk_nope, kv_lora]`` (``weight_dequant``), ``gamma_cq``,
    ``gamma_ckv`` as stored. ``indexer``: E4M3 ``w_qb [q_lora, index_heads * index_dim]`` with
    ``w_qb_scale [q_lora/128, N/128]``, E4M3 ``w_k [hidden, index_dim]`` with ``w_k_scale
    [hidden/128, 1]``, FP32 ``w_proj [hidden, index_heads]`` (exact), ``ln_gamma`` /
    ``ln_beta`` as stored. Returns :class:`Dsv32LayerWeights` (module docstring)."""
    dims = _dims(dims)
    scheme, t = _read(_Tensors(source), layer, dims)
    for role in ("index_q_b", "index_k"):
        if t[role].scale is None:
            raise TypeError(f"{t[role].key}: expected float8_e4m3fn with its block scale for "
                            f"path='fp8' (the FP8 indexer prolog takes FP8 weights only), got "
                            f"bfloat16")  # fmt: skip
    (w_dq, s_dq), (w_uq, s_uq), (w_kv, s_kv) = (_fp8_args(t[r]) for r in ("q_a", "q_b", "kv_a"))
    (w_qb, s_qb), (w_k, s_k) = _fp8_args(t["index_q_b"]), _fp8_args(t["index_k"])
    mla = {"w_dq": w_dq, "w_dq_scale": s_dq, "w_uq_qr": w_uq, "w_uq_qr_scale": s_uq,
           "w_uk": _w_uk(t["kv_b"], dims), "w_dkv_kr": w_kv, "w_dkv_kr_scale": s_kv,
           "gamma_cq": t["q_norm"][1], "gamma_ckv": t["kv_norm"][1]}  # fmt: skip
    indexer = {"w_qb": w_qb, "w_qb_scale": s_qb, "w_k": w_k, "w_k_scale": s_k,
               "w_proj": _t(t["index_proj"][1].astype(F32)),
               "ln_gamma": t["k_gamma"][1], "ln_beta": t["k_beta"][1]}  # fmt: skip
    return Dsv32LayerWeights("fp8", mla, indexer, scheme, _keys(t))


def convert_dsv32_weights(source, layer: int = 0, *, path: str = "int8",
                          dims: Dsv32Dims = DSV32_DIMS) -> Dsv32LayerWeights:  # fmt: skip
    """:func:`dsv32_weights_int8` (``path="int8"``) or :func:`dsv32_weights_fp8` (``"fp8"``)."""
    check_choice(path, "path", PATHS)
    fn = dsv32_weights_int8 if path == "int8" else dsv32_weights_fp8
    return fn(source, layer, dims=dims)


def _dims(dims) -> Dsv32Dims:
    if not isinstance(dims, Dsv32Dims):
        raise TypeError(f"dims: expected a Dsv32Dims, got {type(dims).__name__}")
    for name, v in dims._asdict().items():
        check_int(v, f"dims.{name}", lo=1)
    if dims.qk_rope > dims.index_dim:
        raise ValueError(f"dims.qk_rope: expected <= index_dim ({dims.index_dim}), got "
                         f"{dims.qk_rope}")  # fmt: skip
    return dims


def _keys(t: dict) -> tuple:
    """The checkpoint keys read, weights before their scales."""
    lin = [v for v in t.values() if isinstance(v, _Linear)]
    return (*(v.key for v in lin), *(v.scale_key for v in lin if v.scale_key),
            *(v[0] for v in t.values() if not isinstance(v, _Linear)))  # fmt: skip


__all__ = [
    "DSV32_DIMS",
    "EXTRA",
    "MODULES",
    "PATHS",
    "SCHEMES",
    "Dsv32Dims",
    "Dsv32LayerWeights",
    "convert_dsv32_weights",
    "dequant_bf16",
    "dsv32_weights_fp8",
    "dsv32_weights_int8",
    "quant_int8_per_channel",
]
