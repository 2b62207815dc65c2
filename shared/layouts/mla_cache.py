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
(``PYPTO_UB_PITCH``). All multi-byte fields are little-endian. Every byte count and offset here
is derived once from the field sizes and orders (:data:`FIELD_SIZES`, :data:`FIELD_ORDER`); the
kernels read their views of a row from :func:`packed_row_view` and :data:`KV_SPLIT_VIEW`. The
layouts an op takes, and the one each quant path uses unless a call says otherwise, are one
table (:data:`CACHE_LAYOUTS`, :data:`PATH_CACHE_LAYOUT`, :func:`is_packed`) that every golden,
wrapper and case reads. A packed cache is an array of shape ``[rows, 656]`` whose dtype is the
quantized type (float8_e4m3fn or int8), exactly like the tensors the kernels take. Packing and
unpacking are exact byte moves. The unpackers also accept raw ``uint8`` bytes and then decode
the nope field as float8_e4m3fn (view an INT8 cache as ``int8`` first). Arguments follow
:mod:`tilesim.shared.validate`: NumPy arrays or torch tensors (FP8/BF16 and ``requires_grad``
tensors included, read without writing); the results are NumPy arrays.

Sources: ``pypto`` = ``hicann/pypto:models/deepseek_v32_exp/sparse_attention_antiquant_impl.py``
and the seeds' ``sparse_attention_antiquant_*`` kernels (hicann/pypto-gym); ``flashmla`` =
``deepseek-ai/FlashMLA:README.md`` and ``tests/quant.py`` (also vLLM ``fp8_ds_mla``). See
docs/sources.md#deepseek-sparse-attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.validate import check_array, check_choice, host_data, shape_of

NOPE = 512  #: quantized latent values per row (one byte each, E4M3 or INT8)
ROPE = 64  #: BF16 rope values per row
NSCALES = 4  #: FP32 dequantization scales per row
SCALE_GROUP = NOPE // NSCALES  #: nope values per scale: scale ``g`` covers ``128g .. 128g+127``
#: bytes of each field of a row (element count times element size)
FIELD_SIZES = {
    "nope": NOPE * FP8_E4M3.itemsize,
    "rope": ROPE * BF16.itemsize,
    "scales": NSCALES * np.dtype(np.float32).itemsize,
}
#: the order of the fields inside a packed row, per layout
FIELD_ORDER = {"pypto": ("nope", "rope", "scales"), "flashmla": ("nope", "scales", "rope")}
PYPTO_ROW_BYTES = sum(FIELD_SIZES.values())  # 656
FLASHMLA_ROW_BYTES = PYPTO_ROW_BYTES  # 656, different order
#: bytes a UB tile row is aligned to: a row gathered into the UB is padded to a multiple
UB_ALIGN = 32


def ub_pitch(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`UB_ALIGN` (the pitch of a UB tile row)."""
    return -(-nbytes // UB_ALIGN) * UB_ALIGN


PYPTO_UB_PITCH = ub_pitch(PYPTO_ROW_BYTES)  # 672: 656 padded (UB tile pitch only)


def _field_bytes(order: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    spans, at = {}, 0
    for name in order:
        spans[name] = (at, at + FIELD_SIZES[name])
        at += FIELD_SIZES[name]
    return spans


#: ``(start, stop)`` byte ranges of each field of a packed row, per layout (the one table: the
#: packers here, the kernels' views (:func:`packed_row_view`) and the CLI's byte-layout notes
#: read it)
FIELD_BYTES = {layout: _field_bytes(order) for layout, order in FIELD_ORDER.items()}
LAYOUTS = tuple(FIELD_ORDER)  #: the packed ``[rows, 656]`` row layouts: ``pypto``, ``flashmla``
KV_SPLIT = "kv_split"  #: the layout of three tensors, :data:`KV_SPLIT_NAMES`
#: the kv_split triple's tensors as the sparse attention names them (nope codes, rope, scales)
KV_SPLIT_NAMES = ("kn_quant", "kr", "kn_scales")
#: every layout of the latent cache (the one table of cache forms): packed rows, then kv_split
CACHE_LAYOUTS = (*LAYOUTS, KV_SPLIT)
#: the latent cache layout of each quant path when a call names none: INT8 the kv_split triple
#: (pypto-gym's ``mla_prolog_quant`` and INT8 ``sparse_attention_antiquant``), FP8 the packed
#: ``pypto`` row (the seeds' FP8 kernels; docs/ops/mla_prolog.md, docs/ops/dsa.md)
PATH_CACHE_LAYOUT = {"int8": KV_SPLIT, "fp8": "pypto"}
#: byte offsets ``(rope, scales)`` inside a packed row, per layout (the kernel's view offsets)
LAYOUT_OFFSETS = {k: (f["rope"][0], f["scales"][0]) for k, f in FIELD_BYTES.items()}
QUANT_DTYPES = (FP8_E4M3, np.dtype(np.int8))


@dataclass(frozen=True)
class PackedRowView:
    """A kernel's view of one packed layout's ``[rows, 656]`` cache (bytes; plain ints).

    The nope run is first in every layout; the *tail* is the rest of the row (rope and scales,
    in the layout's order), which the FP8 kernel gathers on its own (``tail_*``: offsets
    relative to the tail's first byte)."""

    layout: str
    row_bytes: int  #: 656: bytes of a row in GM
    ub_pitch: int  #: 672: a whole row gathered into the UB, padded to :data:`UB_ALIGN`
    nope_bytes: int  #: 512: the quantized nope run, bytes ``0 .. nope_bytes``
    rope_off: int  #: first byte of the BF16 rope values
    rope_bytes: int  #: 128
    scale_off: int  #: first byte of the FP32 scales
    scale_bytes: int  #: 16
    tail_bytes: int  #: 144: bytes after the nope run (rope + scales)
    tail_pitch: int  #: 160: the tail gathered into the UB, padded to :data:`UB_ALIGN`
    tail_rope_off: int  #: ``rope_off - nope_bytes``
    tail_scale_off: int  #: ``scale_off - nope_bytes``


def _packed_view(layout: str) -> PackedRowView:
    f = FIELD_BYTES[layout]
    nope_end = f["nope"][1]
    if f["nope"][0] != 0:
        raise AssertionError(f"{layout}: the kernels read the nope run at byte 0")
    tail = PYPTO_ROW_BYTES - nope_end
    return PackedRowView(
        layout=layout, row_bytes=PYPTO_ROW_BYTES, ub_pitch=PYPTO_UB_PITCH, nope_bytes=nope_end,
        rope_off=f["rope"][0], rope_bytes=FIELD_SIZES["rope"], scale_off=f["scales"][0],
        scale_bytes=FIELD_SIZES["scales"], tail_bytes=tail, tail_pitch=ub_pitch(tail),
        tail_rope_off=f["rope"][0] - nope_end, tail_scale_off=f["scales"][0] - nope_end,
    )  # fmt: skip


#: the kernel-facing view of each packed layout (:class:`PackedRowView`)
PACKED_ROW_VIEWS = {layout: _packed_view(layout) for layout in LAYOUTS}


def is_packed(layout: str, name: str = "layout") -> bool:
    """Whether the cache ``layout`` (one of :data:`CACHE_LAYOUTS`; ``ValueError`` naming
    ``name`` otherwise) is one packed ``[rows, 656]`` tensor (``False``: the kv_split triple)."""
    check_choice(layout, name, CACHE_LAYOUTS)
    return layout != KV_SPLIT


def packed_row_view(layout: str) -> PackedRowView:
    """The kernel-facing view of packed ``layout`` (``"pypto"`` or ``"flashmla"``)."""
    check_choice(layout, "layout", LAYOUTS)
    return PACKED_ROW_VIEWS[layout]


@dataclass(frozen=True)
class KvSplitView:
    """A kernel's view of the kv_split triple (columns of each tensor; plain ints)."""

    nope_cols: int  #: 512: ``kn_quant [rows, 512]``
    rope_cols: int  #: 64: ``kr [rows, 64]`` BF16
    scale_cols: int  #: 4: ``kn_scales [rows, 4]`` FP32
    scale_pitch: int  #: 8: FP32 columns of a ``kn_scales`` row padded to :data:`UB_ALIGN` bytes
    scale_group: int  #: 128: nope values per scale (:data:`SCALE_GROUP`)


_F32 = np.dtype(np.float32).itemsize
#: the kernel-facing view of the kv_split cache (:class:`KvSplitView`)
KV_SPLIT_VIEW = KvSplitView(
    nope_cols=NOPE, rope_cols=ROPE, scale_cols=NSCALES,
    scale_pitch=ub_pitch(FIELD_SIZES["scales"]) // _F32, scale_group=SCALE_GROUP,
)  # fmt: skip


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
