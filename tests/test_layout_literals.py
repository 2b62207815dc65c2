"""Byte layouts reach the kernels as data: no layout literal in ``device/``.

The MLA cache rows (``tilesim.shared.layouts.mla_cache``: ``packed_row_view``, ``KV_SPLIT_VIEW``)
and the indexer's key-cache pages (``tilesim.shared.layouts.index_cache``: ``index_page_view``)
export the sizes, pitches and offsets a kernel needs, each derived once from the layout tables
there.
Checked on the source tree (code only: docstrings and comments may describe shapes):

* no ``device/`` module writes a row / page size as a number (656, 672, 132, the tail's
  144 / 160, the FP8 page's 33 words per token);
* no ``device/`` module derives a page offset from the block size by hand (``32 * bs``,
  ``bs // 32``, ``33 * block_size``: a number multiplied or divided with a block size);
* the DeepSeek modules (``dsa*``, ``_dsa*``) write none of the element counts the layouts
  define (64, 128, 512, 576) either, except where :data:`ALLOWED` says why the number is not
  a layout;
* the exported views locate the bytes the packers write.
"""

from __future__ import annotations

import ast
import struct
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "device"

#: row / page sizes of the two layouts: never a literal anywhere in device/
LAYOUT_SIZES = {656, 672, 132, 144, 160, 33}
#: element counts of the layouts (INDEX_HEADS, INDEX_DIM / SCALE_GROUP, NOPE, NOPE + ROPE):
#: not literals in the DeepSeek modules, apart from ALLOWED
ELEMENT_COUNTS = {64, 128, 512, 576}
#: names a block size goes by in device/
BLOCK_SIZE_NAMES = {"bs", "block_size"}
#: (file, number, a fragment of its source line): numbers that are provably not a layout
ALLOWED = {
    # PyPTO runtime option value (the seeds' and PyPTO's indexer example's)
    ("_dsa_kernel.py", 128, '"stitch_function_max_num", 128'),
    ("_dsa_indexer_kernel.py", 128, '"stitch_function_max_num", 128'),
    # keys per V0 task: a tuning measured against 32 and 128 (docs/ops/dsa.md#kernel)
    ("_dsa_kernel.py", 64, "V0_ROWS = 64"),
    # vector-tile rows of the zero fill of a cur_seq = 0 token (a UB tile shape)
    ("_dsa_kernel.py", 64, "min(gt, 64)"),
    # UB bytes one fold task may hold, and the widest fold column block (UB budgets)
    ("_dsa_kernel.py", 128, "FOLD_UB = 128 * 1024"),
    ("_dsa_kernel.py", 128, "w = 128"),
    # the indexer prolog: PyPTO's runtime option, the cube's M-tile cap of the Hadamard
    # matmul, the q_b matmul's cube tiles (pypto-gym's L0 K 512 and N 128; its L1 K holds the
    # whole rank, QB_K_L1) and the RoPE's vector-tile rows
    ("_dsa_indexer_prolog_kernel.py", 128, '"stitch_function_max_num", 128'),
    ("_dsa_indexer_prolog_kernel.py", 128, "mt = min(m, 128)"),
    (
        "_dsa_indexer_prolog_kernel.py",
        512,
        "set_cube_tile_shapes([16, 16], [min(512, kl1), kl1], [128, 128])",
    ),
    (
        "_dsa_indexer_prolog_kernel.py",
        128,
        "set_cube_tile_shapes([16, 16], [min(512, kl1), kl1], [128, 128])",
    ),
    ("_dsa_indexer_prolog_kernel.py", 64, "set_vec_tile_shapes(min(rows, 64), DIM)"),
    # the FP8 indexer prolog: the UE8M0 ladder's exponent steps (powers of two, not sizes),
    # the cube's M-tile cap of the FWHT stages, the vector-tile row caps, the N-tile cap of
    # the FP8 linears (cube and UB tile shapes)
    ("_dsa_indexer_prolog_fp8_kernel.py", 64, "LADDER = (64, 64, 64, 32"),
    ("_dsa_indexer_prolog_fp8_kernel.py", 128, "mt = min(m, 128)"),
    ("_dsa_indexer_prolog_fp8_kernel.py", 64, "set_vec_tile_shapes(min(m, 64), DIM)"),
    ("_dsa_indexer_prolog_fp8_kernel.py", 512, "[min(n, 512), min(n, 512)]"),
}


def _device_files():
    return sorted(DEVICE.glob("*.py"))


def _is_deepseek(path: Path) -> bool:
    return path.name.lstrip("_").startswith("dsa")


def _int_constants(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            yield node


def _is_block_size(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and len(node.args) == 1:  # int(block_size)
        node = node.args[0]
    if isinstance(node, ast.Name):
        return node.id in BLOCK_SIZE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in BLOCK_SIZE_NAMES


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _block_size_derivations(tree: ast.AST):
    """``<number> op <block size>`` / ``<block size> op <number>`` for ``* / // %``."""
    ops = (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ops):
            pair = (node.left, node.right)
            if any(_is_number(a) and _is_block_size(b) for a, b in (pair, pair[::-1])):
                yield node


def _allowed(path: Path, value: int, line: str) -> bool:
    return any(f == path.name and v == value and frag in line for f, v, frag in ALLOWED)


@pytest.mark.parametrize("path", _device_files(), ids=lambda p: p.name)
def test_no_layout_literal_in_device(path):
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    refused = set(LAYOUT_SIZES) | (ELEMENT_COUNTS if _is_deepseek(path) else set())
    bad = [
        f"{path.name}:{n.lineno}: {n.value} in `{lines[n.lineno - 1].strip()}`"
        for n in _int_constants(tree)
        if n.value in refused and not _allowed(path, n.value, lines[n.lineno - 1])
    ]
    bad += [
        f"{path.name}:{n.lineno}: `{ast.unparse(n)}` derives a page offset from the block size"
        for n in _block_size_derivations(tree)
    ]
    assert not bad, (
        "layout literals in device/ (read the views of tilesim.shared.layouts.mla_cache / "
        "tilesim.shared.layouts.index_cache instead):\n" + "\n".join(bad)
    )


def test_every_allowed_literal_is_still_there():
    """A stale allow-list entry would silently allow a later literal on a similar line."""
    for name, value, frag in ALLOWED:
        path = DEVICE / name
        lines = [ln for ln in path.read_text().splitlines() if frag in ln]
        assert lines, f"ALLOWED: {name} has no line with {frag!r}"
        tree = ast.parse(path.read_text())
        src = path.read_text().splitlines()
        assert any(n.value == value and frag in src[n.lineno - 1] for n in _int_constants(tree)), (
            f"ALLOWED: {name} has no {value} on a line with {frag!r}"
        )


def test_the_checks_catch_the_derivations_they_name():
    src = "def f(bs, p):\n    return bs + bs // 32, 32 * bs, 33 * p.block_size, 656, 672\n"
    tree = ast.parse(src)
    assert len(list(_block_size_derivations(tree))) == 3
    assert {n.value for n in _int_constants(tree)} & LAYOUT_SIZES == {33, 656, 672}


# ----------------------------------------------------------------------------- the views
@pytest.mark.parametrize("layout", ["pypto", "flashmla"])
def test_packed_row_view_locates_the_packed_fields(layout):
    """The kernel's view of a packed row against bytes the packer writes: rope element 0 =
    BF16 1.5 (0x3FC0), scale 0 = FP32 2.0, both found at the view's row and tail offsets."""
    import ml_dtypes
    from tilesim.shared.layouts.mla_cache import (
        FIELD_BYTES,
        PYPTO_ROW_BYTES,
        PYPTO_UB_PITCH,
        pack_rows,
        packed_row_view,
    )

    v = packed_row_view(layout)
    rope = np.zeros((1, 64), dtype=ml_dtypes.bfloat16)
    rope[0, 0] = 1.5
    scales = np.zeros((1, 4), dtype=np.float32)
    scales[0, 0] = 2.0
    nope = np.zeros((1, 512), dtype=np.int8)
    row = pack_rows(nope, rope, scales, layout).view(np.uint8)[0].tobytes()
    assert (v.row_bytes, v.ub_pitch) == (PYPTO_ROW_BYTES, PYPTO_UB_PITCH) == (len(row), 672)
    assert row[v.rope_off : v.rope_off + 2] == struct.pack("<H", 0x3FC0)
    assert row[v.scale_off : v.scale_off + 4] == struct.pack("<f", 2.0)
    tail = row[v.nope_bytes :]
    assert len(tail) == v.tail_bytes == v.rope_bytes + v.scale_bytes == 144
    assert tail[v.tail_rope_off : v.tail_rope_off + 2] == struct.pack("<H", 0x3FC0)
    assert tail[v.tail_scale_off : v.tail_scale_off + 4] == struct.pack("<f", 2.0)
    assert v.tail_pitch == 160 and v.tail_pitch % 32 == 0 and v.ub_pitch % 32 == 0
    assert FIELD_BYTES[layout]["nope"] == (0, v.nope_bytes) == (0, 512)


def test_kv_split_view():
    from tilesim.shared.layouts.mla_cache import KV_SPLIT_VIEW as v

    assert (v.nope_cols, v.rope_cols, v.scale_cols, v.scale_group) == (512, 64, 4, 128)
    assert v.scale_pitch == 8 and v.scale_pitch * 4 % 32 == 0  # 32 bytes of FP32 in UB


@pytest.mark.parametrize("bs", [32, 64, 128])
def test_fp8_page_view_addresses_the_codes_and_scales_of_a_block(bs):
    """Block ``phys``'s codes and scales read through the kernel's two views of the page array
    (128-byte code rows, FP32 words) as the kernel reads them equal what was packed."""
    import ml_dtypes
    from tilesim.shared.layouts.index_cache import index_page_view, pack_fp8_pages

    g = np.random.default_rng(bs)
    nb = 3
    codes = g.integers(-16, 17, (nb, bs, 128)).astype(ml_dtypes.float8_e4m3fn)
    scales = g.uniform(0.001, 0.02, (nb, bs)).astype(np.float32)
    pages = pack_fp8_pages(codes, scales)
    v = index_page_view("fp8", bs)
    assert (v.code_rows, v.scale_cols, v.scale_col0) == (bs + bs // 32, 33 * bs, 32 * bs)
    code_rows = pages.view(ml_dtypes.float8_e4m3fn).reshape(-1, 128)
    words = pages.view("<f4")
    assert words.shape == (nb, v.scale_cols)
    for phys in range(nb):
        got = code_rows[phys * v.code_rows : phys * v.code_rows + bs]
        assert np.array_equal(got.view(np.uint8), codes[phys].view(np.uint8))
        assert np.array_equal(words[phys, v.scale_col0 : v.scale_col0 + bs], scales[phys])


def test_int8_page_view_and_the_fp8_block_alignment():
    from tilesim.shared.layouts.index_cache import FP8_BLOCK_ALIGN, index_page_view

    v = index_page_view("int8", 48)
    assert (v.code_rows, v.scale_cols, v.scale_col0) == (48, 48, 0)
    assert FP8_BLOCK_ALIGN == 32
    with pytest.raises(ValueError, match="block_size: expected a multiple of 32"):
        index_page_view("fp8", 48)


def test_the_packed_layouts_differ_only_in_their_offsets():
    """The kernel reads the sizes from one view (``_dsa_kernel``'s module ints) and the
    offsets per layout: every size must be the same in both."""
    from tilesim.shared.layouts.mla_cache import PACKED_ROW_VIEWS

    sizes = {
        (v.row_bytes, v.ub_pitch, v.nope_bytes, v.rope_bytes, v.scale_bytes, v.tail_bytes,
         v.tail_pitch)
        for v in PACKED_ROW_VIEWS.values()
    }  # fmt: skip
    assert len(sizes) == 1
