"""Byte layouts of the DeepSeek-V3.2 quantized MLA cache (one row per token).

===========  ==============================  ================================================
layout       bytes of one row                 content
===========  ==============================  ================================================
``pypto``    0..511 | 512..639 | 640..655    512 quantized nope | 64 BF16 rope | 4 FP32 scales
``flashmla`` 0..511 | 512..527 | 528..655    512 quantized nope | 4 FP32 scales | 64 BF16 rope
kv_split     three tensors                    ``kn_quant [rows,512]`` (e4m3 or int8),
                                              ``kr [rows,64]`` BF16, ``kn_scales [rows,4]`` FP32
===========  ==============================  ================================================

Rows are 656 bytes in memory; PyPTO kernels pad each row to a 672-byte pitch in the UB only
(``PYPTO_UB_PITCH``). All multi-byte fields are little-endian. A packed cache is an array of
shape ``[rows, 656]`` whose dtype is the quantized type (float8_e4m3fn or int8), exactly like
the tensors the kernels take. Packing and unpacking are exact byte moves. The unpackers also
accept raw ``uint8`` bytes and then decode the nope field as float8_e4m3fn (view an INT8 cache
as ``int8`` first). Arguments follow :mod:`tilesim.shared.validate`: NumPy arrays or torch
tensors (FP8/BF16 and ``requires_grad`` tensors included, read without writing); the results
are NumPy arrays.

Sources: ``pypto`` = ``hicann/pypto:models/deepseek_v32_exp/sparse_attention_antiquant_impl.py``
and the seeds' ``sparse_attention_antiquant_*`` kernels (hicann/pypto-gym); ``flashmla`` =
``deepseek-ai/FlashMLA:README.md`` and ``tests/quant.py`` (also vLLM ``fp8_ds_mla``). See
docs/sources.md#deepseek-sparse-attention.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.validate import check_array, check_choice, host_data, shape_of

NOPE = 512
ROPE = 64
NSCALES = 4
PYPTO_ROW_BYTES = NOPE + 2 * ROPE + 4 * NSCALES  # 656
FLASHMLA_ROW_BYTES = PYPTO_ROW_BYTES  # 656, different order
PYPTO_UB_PITCH = 672  # 656 rounded up to a 32-byte multiple (UB tile pitch only)

#: ``(start, stop)`` byte ranges of each field of a packed row, per layout (the one table: the
#: packers here, the kernel's V0 stage and the CLI's byte-layout notes read it)
FIELD_BYTES = {
    "pypto": {"nope": (0, 512), "rope": (512, 640), "scales": (640, 656)},
    "flashmla": {"nope": (0, 512), "scales": (512, 528), "rope": (528, 656)},
}
LAYOUTS = ("pypto", "flashmla")
#: byte offsets ``(rope, scales)`` inside a packed row, per layout (the kernel's view offsets)
LAYOUT_OFFSETS = {k: (f["rope"][0], f["scales"][0]) for k, f in FIELD_BYTES.items()}
QUANT_DTYPES = (FP8_E4M3, np.dtype(np.int8))


class MlaCacheRows(NamedTuple):
    """The three fields of a quantized MLA cache: ``nope [rows,512]`` (e4m3/int8),
    ``rope [rows,64]`` BF16, ``scales [rows,4]`` FP32."""

    nope: np.ndarray
    rope: np.ndarray
    scales: np.ndarray


def check_cache_fields(
    nope, rope, scales, *, names: tuple[str, str, str] = ("nope", "rope", "scales")
) -> MlaCacheRows:
    """Validate the three cache fields (dtype and shape, errors name ``names``) and return them
    as NumPy arrays. Used by the packers here and by ops taking the kv_split triple."""
    n_name, r_name, s_name = names
    check_array(nope, n_name, dtype=QUANT_DTYPES)
    nshape = shape_of(nope, n_name)
    if len(nshape) != 2 or nshape[1] != NOPE:
        raise ValueError(f"{n_name}: expected shape [rows, {NOPE}], got {nshape}")
    rows = nshape[0]
    check_array(rope, r_name, dtype=BF16, shape=(rows, ROPE), layout="[rows, 64]")
    check_array(scales, s_name, dtype=np.float32, shape=(rows, NSCALES), layout="[rows, 4]")
    n = host_data(nope, n_name)
    r = host_data(rope, r_name)
    s = host_data(scales, s_name)
    return MlaCacheRows(n, r, s)


_check_fields = check_cache_fields


def _le_bytes(a: np.ndarray) -> np.ndarray:
    """Row-wise little-endian bytes of a 2-D array as uint8 ``[rows, cols*itemsize]``."""
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else None)
    return a.view(np.uint8).reshape(a.shape[0], a.shape[1] * a.dtype.itemsize)


def _pack(layout: str, nope, rope, scales) -> np.ndarray:
    f = _check_fields(nope, rope, scales)
    rows = f.nope.shape[0]
    out = np.empty((rows, PYPTO_ROW_BYTES), dtype=np.uint8)
    fields = FIELD_BYTES[layout]
    out[:, slice(*fields["nope"])] = f.nope.view(np.uint8)
    out[:, slice(*fields["rope"])] = _le_bytes(f.rope)
    out[:, slice(*fields["scales"])] = _le_bytes(f.scales.astype("<f4"))
    return out.view(f.nope.dtype)


def _unpack(layout: str, cache) -> MlaCacheRows:
    check_array(cache, "cache", dtype=QUANT_DTYPES + (np.dtype(np.uint8),))
    cshape = shape_of(cache, "cache")
    if len(cshape) != 2 or cshape[1] != PYPTO_ROW_BYTES:
        raise ValueError(
            f"cache: expected shape [rows, {PYPTO_ROW_BYTES}] ({layout} layout), got {cshape}"
        )
    c = host_data(cache, "cache")
    qdtype = c.dtype if c.dtype in QUANT_DTYPES else FP8_E4M3
    b = np.ascontiguousarray(c).view(np.uint8)
    fields = FIELD_BYTES[layout]
    nope = np.ascontiguousarray(b[:, slice(*fields["nope"])]).view(qdtype)
    rope = np.ascontiguousarray(b[:, slice(*fields["rope"])]).view("<u2").view(BF16)
    scales = np.ascontiguousarray(b[:, slice(*fields["scales"])]).view("<f4").astype(np.float32)
    return MlaCacheRows(nope, rope.reshape(-1, ROPE), scales.reshape(-1, NSCALES))


def pack_pypto_rows(nope, rope, scales) -> np.ndarray:
    """Fields -> PyPTO packed cache ``[rows, 656]`` (dtype of ``nope``): nope | rope | scales."""
    return _pack("pypto", nope, rope, scales)


def unpack_pypto_rows(cache) -> MlaCacheRows:
    """PyPTO packed cache ``[rows, 656]`` -> :class:`MlaCacheRows` (fresh arrays)."""
    return _unpack("pypto", cache)


def pack_flashmla_rows(nope, rope, scales) -> np.ndarray:
    """Fields -> FlashMLA ``fp8_ds_mla`` cache ``[rows, 656]``: nope | scales | rope."""
    return _pack("flashmla", nope, rope, scales)


def unpack_flashmla_rows(cache) -> MlaCacheRows:
    """FlashMLA cache ``[rows, 656]`` -> :class:`MlaCacheRows` (fresh arrays)."""
    return _unpack("flashmla", cache)


def pack_kv_split(nope, rope, scales) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fields -> the kv_split triple ``(kn_quant, kr, kn_scales)`` (validated contiguous copies)."""
    f = _check_fields(nope, rope, scales)
    return tuple(np.array(a, copy=True, order="C") for a in f)  # type: ignore[return-value]


def unpack_kv_split(kn_quant, kr, kn_scales) -> MlaCacheRows:
    """The kv_split triple -> :class:`MlaCacheRows` (validated, fresh copies)."""
    return MlaCacheRows(*pack_kv_split(kn_quant, kr, kn_scales))


def unpack_rows(cache, layout: str) -> MlaCacheRows:
    """Unpack a packed cache in ``layout`` (``"pypto"`` or ``"flashmla"``)."""
    check_choice(layout, "layout", LAYOUTS)
    return _unpack(layout, cache)


def pack_rows(nope, rope, scales, layout: str) -> np.ndarray:
    """Pack fields in ``layout`` (``"pypto"`` or ``"flashmla"``)."""
    check_choice(layout, "layout", LAYOUTS)
    return _pack(layout, nope, rope, scales)


def convert_cache_layout(cache, *, src: str, dst: str) -> np.ndarray:
    """Re-pack a ``[rows, 656]`` cache from layout ``src`` to ``dst`` (``"pypto"``/``"flashmla"``).

    A pure byte move (no value is decoded): the result has the dtype of ``cache`` (uint8 input
    gives float8_e4m3fn, as :func:`unpack_rows`). ``src == dst`` returns a fresh copy.
    """
    check_choice(src, "src", LAYOUTS)
    check_choice(dst, "dst", LAYOUTS)
    return _pack(dst, *_unpack(src, cache))
