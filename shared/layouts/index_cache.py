"""Byte layouts of the DeepSeek-V3.2 lightning-indexer key cache (one 128-value key per token).

Two paged layouts, both addressed through a ``block_table``: the token at logical position
``p`` of batch ``b`` lives in physical block ``block_table[b, p // block_size]``, slot
``p % block_size``.

==========  ================================================  ==================================
layout      arrays                                            source
==========  ================================================  ==================================
``int8``    codes ``int8 [num_blocks, block_size, 128]``;     ``hicann/pypto-gym`` lightning
            scales ``float16 [num_blocks, block_size]``       indexer (``PA_BSND``, n2 = 1)
``fp8``     one ``uint8 [num_blocks, block_size * 132]``      ``deepseek-ai/DeepGEMM:tests/
            array; each page: the ``block_size * 128`` E4M3   test_attention.py``
            codes token-major (bytes ``0 .. 128*bs``), then   (``kv_cache_cast_to_fp8``), vLLM
            the ``block_size`` FP32 scales, little-endian     ``sparse_attn_indexer.py``
            (token ``t``'s at ``128*bs + 4*t``)
==========  ================================================  ==================================

The FP8 scale of a token is therefore NOT in bytes 128..131 of "its row": a page holds no
per-token rows, only the two runs. A kernel addresses a block of either layout through two 2-D
views of the cache memory, codes as 128-byte rows and scales as rows of scale words; the
offsets it needs come from :func:`index_page_view` (no kernel re-derives them). Packing and
unpacking are exact byte moves. Arguments follow :mod:`tilesim.shared.validate` (NumPy arrays
or torch tensors, read without writing); the results are NumPy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import FP8_E4M3
from tilesim.shared.validate import check_array, check_choice, check_int, host_data, shape_of

INDEX_DIM = 128  #: values of one index key (and of one index-query head)
FP8_SCALE_BYTES = 4  #: one FP32 scale per token
FP8_TOKEN_BYTES = INDEX_DIM + FP8_SCALE_BYTES  # 132 bytes of page per token
INDEX_CACHE_LAYOUTS = ("int8", "fp8")
#: the FP8 block sizes whose pages are whole ``INDEX_DIM``-byte code rows are the multiples of
#: this (32): ``block_size * 132`` is a multiple of 128 exactly then
FP8_BLOCK_ALIGN = INDEX_DIM // math.gcd(FP8_TOKEN_BYTES, INDEX_DIM)


def fp8_page_bytes(block_size: int) -> int:
    """Bytes of one FP8 page: ``block_size * 132``."""
    return check_int(block_size, "block_size", lo=1) * FP8_TOKEN_BYTES


def fp8_scale_offset(block_size: int) -> int:
    """Byte offset of the first scale in an FP8 page: ``block_size * 128`` (token ``t``'s scale
    starts ``4 * t`` bytes later)."""
    return check_int(block_size, "block_size", lo=1) * INDEX_DIM


@dataclass(frozen=True)
class IndexPageView:
    """How a kernel addresses block ``phys`` of a key cache in ``layout`` (plain ints): the
    codes as a ``[rows, INDEX_DIM]`` tensor (one byte per code), the block's ``block_size``
    keys at rows ``phys * code_rows ..``; the scales as a ``[num_blocks, scale_cols]`` tensor of
    scale words (float16 for INT8, FP32 for FP8), the block's at row ``phys``, columns
    ``scale_col0 .. scale_col0 + block_size``.

    ``int8``: the two arrays as they are (``code_rows = scale_cols = block_size``,
    ``scale_col0 = 0``). ``fp8``: both views of the one page array: a page is ``block_size *
    132 / 128`` code rows (``block_size`` of codes, then the scale run) and ``block_size * 132
    / 4`` FP32 words, the scales from word ``block_size * 128 / 4`` on."""

    layout: str
    block_size: int
    code_rows: int  #: rows of the ``[*, INDEX_DIM]`` codes view per block (its row stride)
    scale_cols: int  #: scale words per block (the width of the scales view)
    scale_col0: int  #: the word of the block's first scale in its row of the scales view


def index_page_view(layout: str, block_size: int) -> IndexPageView:
    """The kernel-facing view of a block of ``layout`` (``"int8"``/``"fp8"``) caches of
    ``block_size`` keys (:class:`IndexPageView`); FP8 needs ``block_size`` a multiple of
    :data:`FP8_BLOCK_ALIGN` (``ValueError``: else a page is not whole code rows)."""
    check_choice(layout, "layout", INDEX_CACHE_LAYOUTS)
    bs = check_int(block_size, "block_size", lo=1)
    if layout == "int8":
        return IndexPageView(layout, bs, code_rows=bs, scale_cols=bs, scale_col0=0)
    if bs % FP8_BLOCK_ALIGN:
        raise ValueError(
            f"block_size: expected a multiple of {FP8_BLOCK_ALIGN} for a kernel's view of FP8 "
            f"pages (a page of block_size*{FP8_TOKEN_BYTES} bytes as whole {INDEX_DIM}-byte "
            f"code rows), got {bs}"
        )
    page = fp8_page_bytes(bs)
    return IndexPageView(layout, bs, code_rows=page // INDEX_DIM,
                         scale_cols=page // FP8_SCALE_BYTES,
                         scale_col0=fp8_scale_offset(bs) // FP8_SCALE_BYTES)  # fmt: skip


class IndexCachePages(NamedTuple):
    """The two fields of an index-key cache: ``codes [num_blocks, block_size, 128]`` (int8 or
    E4M3) and ``scales [num_blocks, block_size]`` (float16 for INT8, float32 for FP8)."""

    codes: np.ndarray
    scales: np.ndarray


def check_int8_cache(k_cache, k_scale, *, block_size: int) -> tuple[int, int]:
    """Shapes and dtypes of the INT8 cache (metadata only): ``k_cache int8 [num_blocks,
    block_size, 128]``, ``k_scale float16 [num_blocks, block_size]``. Returns ``(num_blocks,
    block_size)``."""
    block_size = check_int(block_size, "block_size", lo=1)
    check_array(k_cache, "k_cache", dtype=np.int8, ndim=3, layout="[num_blocks, block_size, 128]")
    nb = shape_of(k_cache, "k_cache")[0]
    check_array(k_cache, "k_cache", shape=(nb, block_size, INDEX_DIM),
                layout=f"[num_blocks, block_size={block_size}, 128]")  # fmt: skip
    check_array(k_scale, "k_scale", dtype=np.float16, shape=(nb, block_size),
                layout=f"[num_blocks={nb}, block_size={block_size}]")  # fmt: skip
    return nb, block_size


def check_fp8_cache(k_cache, *, block_size: int) -> tuple[int, int]:
    """Shape and dtype of the FP8 paged cache (metadata only): ``uint8 [num_blocks,
    block_size * 132]``. Returns ``(num_blocks, block_size)``."""
    page = fp8_page_bytes(block_size)
    check_array(k_cache, "k_cache", dtype=np.uint8, ndim=2, layout="[num_blocks, block_size*132]")
    lay = f"[num_blocks, block_size*132 = {page}] (block_size={block_size})"
    check_array(k_cache, "k_cache", shape=(None, page), layout=lay)
    return shape_of(k_cache, "k_cache")[0], block_size


def fp8_page_views(pages: np.ndarray, *, block_size: int) -> IndexCachePages:
    """Views, without a copy, of the two runs inside a host ``uint8 [num_blocks,
    block_size*132]`` page array: codes E4M3 ``[num_blocks, block_size, 128]`` and scales FP32
    ``[num_blocks, block_size]`` (writable when ``pages`` is; the one place the offsets are
    applied)."""
    nb, bs = check_fp8_cache(pages, block_size=block_size)
    if not isinstance(pages, np.ndarray):
        raise TypeError(f"pages: expected a numpy array, got {type(pages).__name__}")
    if nb and pages.strides[-1] != 1:  # the FP32 scale view reads 4 adjacent bytes
        raise ValueError(f"pages: expected a contiguous last axis (the views alias it), got "
                         f"strides {pages.strides}")  # fmt: skip
    off = fp8_scale_offset(bs)
    codes = pages[:, :off].view(FP8_E4M3).reshape(nb, bs, INDEX_DIM)
    return IndexCachePages(codes, pages[:, off:].view("<f4"))


def pack_fp8_pages(codes, scales) -> np.ndarray:
    """``codes e4m3 [num_blocks, bs, 128]`` + ``scales float32 [num_blocks, bs]`` -> the paged
    cache ``uint8 [num_blocks, bs*132]`` (codes first, then the little-endian scales)."""
    check_array(codes, "codes", dtype=FP8_E4M3, ndim=3, layout="[num_blocks, block_size, 128]")
    nb, bs, d = shape_of(codes, "codes")
    if d != INDEX_DIM or bs == 0:
        raise ValueError(f"codes: expected shape [num_blocks, block_size >= 1, 128], got "
                         f"{(nb, bs, d)}")  # fmt: skip
    check_array(scales, "scales", dtype=np.float32, shape=(nb, bs), layout="[num_blocks, bs]")
    out = np.empty((nb, bs * FP8_TOKEN_BYTES), dtype=np.uint8)
    views = fp8_page_views(out, block_size=bs)
    views.codes[...] = host_data(codes, "codes")
    views.scales[...] = host_data(scales, "scales")
    return out


def unpack_fp8_pages(k_cache, *, block_size: int) -> IndexCachePages:
    """The paged FP8 cache ``uint8 [num_blocks, block_size*132]`` -> :class:`IndexCachePages`
    (fresh arrays: codes E4M3 ``[num_blocks, block_size, 128]``, scales FP32 ``[num_blocks,
    block_size]``)."""
    check_fp8_cache(k_cache, block_size=block_size)
    pages = np.ascontiguousarray(host_data(k_cache, "k_cache"))  # any layout: same values
    views = fp8_page_views(pages, block_size=block_size)
    return IndexCachePages(views.codes.copy(), views.scales.astype(np.float32))


def pack_int8_cache(codes, scales) -> tuple[np.ndarray, np.ndarray]:
    """The INT8 layout is two arrays already: validated contiguous copies ``(k_cache int8
    [num_blocks, bs, 128], k_scale float16 [num_blocks, bs])``."""
    check_array(codes, "codes", dtype=np.int8, ndim=3, layout="[num_blocks, block_size, 128]")
    nb, bs, d = shape_of(codes, "codes")
    if d != INDEX_DIM or bs == 0:
        raise ValueError(f"codes: expected shape [num_blocks, block_size >= 1, 128], got "
                         f"{(nb, bs, d)}")  # fmt: skip
    check_array(scales, "scales", dtype=np.float16, shape=(nb, bs), layout="[num_blocks, bs]")
    return (np.array(host_data(codes, "codes"), copy=True, order="C"),
            np.array(host_data(scales, "scales"), copy=True, order="C"))  # fmt: skip


def scatter_tokens(values: np.ndarray, table_row: np.ndarray, block_size: int, out: np.ndarray):
    """Write the token-major ``values [n, ...]`` of one sequence into the pages ``out
    [num_blocks, block_size, ...]`` through its block-table row (logical block ``j`` ->
    ``table_row[j]``), in place. The builders' helper; no check."""
    n = values.shape[0]
    for j in range(-(-n // block_size)):
        lo, hi = j * block_size, min((j + 1) * block_size, n)
        out[int(table_row[j]), : hi - lo] = values[lo:hi]


__all__ = [
    "FP8_BLOCK_ALIGN",
    "FP8_SCALE_BYTES",
    "FP8_TOKEN_BYTES",
    "INDEX_CACHE_LAYOUTS",
    "INDEX_DIM",
    "IndexCachePages",
    "IndexPageView",
    "check_fp8_cache",
    "check_int8_cache",
    "fp8_page_bytes",
    "fp8_page_views",
    "fp8_scale_offset",
    "index_page_view",
    "pack_fp8_pages",
    "pack_int8_cache",
    "scatter_tokens",
    "unpack_fp8_pages",
]
