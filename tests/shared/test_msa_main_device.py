"""The torch twins of the main-branch mask rules (``tilesim.shared.msa_main``) against the
NumPy rules they copy, bit for bit, and the device wrapper's "no host read" contract.

* :func:`kernel_mask_torch` equals :func:`kernel_mask` (and the wrapper's padded form: rows
  ``< n`` of it, then -1e9) on random finite masks with awkward bits (-0.0, subnormals, the
  FP32 neighbours of -1e9), on the block masks of :func:`build_msa_block_mask`, for several
  block sizes, row counts below / at / above ``nbq*bk`` and non-contiguous inputs; both are
  also checked against the layout written out element by element.
* :func:`mask_flags_torch` equals :func:`read_keys` of the kernel-mask rows ``< n`` and the
  rows' "sees some key" flags computed from those rows by NumPy.
* :func:`check_mask_finite` raises the message of the shared check; the contract
  (``Args`` / ``check_meta`` / ``check_values`` / ``host_plan`` / ``cost``): ``check_meta``
  reads no data (``meta`` tensors pass it), ``check_values`` catches the non-finite mask it
  cannot see, ``host_plan_torch`` is ``host_plan`` bit for bit, ``cost`` counts.
* The device wrapper's operands are built by torch ops alone: on ``meta`` tensors (no data
  exists, so any host read would fail) they come out with the right shapes; with
  ``validate=False`` or ``True`` no host-array helper is called, with ``validate="full"`` the
  finiteness check is (on CPU tensors, in place).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilesim.shared import msa_main as msa_mask  # noqa: E402
from tilesim.shared.msa_main import (  # noqa: E402
    MASK_NEG,
    build_msa_block_mask,
    check_mask_finite,
    kernel_mask,
    kernel_mask_torch,
    mask_flags_torch,
    read_keys,
)

NEG = np.float32(-1e9)
#: FP32 values next to -1e9: one is visible (> -1e9), one is not
ABOVE, BELOW = np.nextafter(NEG, np.float32(0)), np.nextafter(NEG, np.float32(-np.inf))


def _bits(a) -> np.ndarray:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return np.ascontiguousarray(a).view(np.uint32)


def _random_mask(rng, nbq, topk, bk) -> np.ndarray:
    """Finite FP32 ``[nbq, topk, bk, bk]``: mostly 0 / -1e9, plus -0.0, subnormals, the two
    neighbours of -1e9 and ordinary values, so a reordering or a value change shows."""
    pool = np.array([0.0, -0.0, NEG, ABOVE, BELOW, 1e-45, -3.5, 2.0**-130, 7.25], np.float32)
    return pool[rng.integers(0, pool.size, size=(nbq, topk, bk, bk))].astype(np.float32)


def _by_element(bm: np.ndarray, rows: int, n: int) -> np.ndarray:
    """The kernel-mask layout written out element by element (the independent oracle):
    ``[qb*bk + r, i*bk + c] = bm[qb, i, r, c]`` for rows ``< n``, -1e9 elsewhere."""
    nbq, topk, bk, _ = bm.shape
    want = np.full((rows, topk * bk), NEG, dtype=np.float32)
    for row in range(min(rows, n, nbq * bk)):
        qb, r = divmod(row, bk)
        for i in range(topk):
            want[row, i * bk : (i + 1) * bk] = bm[qb, i, r]
    return want


# (nbq, topk, bk, n, rows): n <= nbq*bk, n > (nbq-1)*bk; rows below, at and above nbq*bk
SHAPES = [
    (1, 1, 128, 1, 128),
    (1, 2, 128, 128, 128),
    (3, 4, 128, 300, 384),
    (3, 4, 128, 300, 512),
    (2, 3, 64, 100, 128),
    (1, 2, 256, 100, 128),  # rows (n_pad) < nbq*bk: bk larger than the wrapper's row tile
    (4, 2, 32, 97, 256),
    (5, 1, 8, 33, 40),
]


@pytest.mark.torch
@pytest.mark.parametrize(("nbq", "topk", "bk", "n", "rows"), SHAPES)
def test_kernel_mask_torch_is_the_numpy_rule_bit_for_bit(nbq, topk, bk, n, rows):
    rng = np.random.default_rng(nbq * 1000 + topk * 100 + bk + n)
    bm = _random_mask(rng, nbq, topk, bk)
    padded = _by_element(bm, rows, n)
    for src in (bm, torch.from_numpy(bm.copy())):
        got = kernel_mask_torch(src, rows, n=n)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        assert got.shape == (rows, topk * bk)
        np.testing.assert_array_equal(_bits(got), _bits(padded))
        if rows >= nbq * bk:  # the plain twin: kernel_mask(bm, rows), every row of the mask
            plain = kernel_mask(bm, rows)
            np.testing.assert_array_equal(_bits(kernel_mask_torch(src, rows)), _bits(plain))
            np.testing.assert_array_equal(_bits(plain), _bits(_by_element(bm, rows, nbq * bk)))
            want = np.full_like(plain, NEG)
            want[:n] = plain[:n]
            np.testing.assert_array_equal(_bits(got), _bits(want))  # the wrapper's old rule


@pytest.mark.torch
@pytest.mark.parametrize(("nbq", "topk", "bk", "n", "rows"), SHAPES)
def test_mask_flags_torch_are_read_keys_and_row_flags(nbq, topk, bk, n, rows):
    rng = np.random.default_rng(7 + nbq + topk + bk + n)
    bm = _random_mask(rng, nbq, topk, bk)
    bm[rng.random(bm.shape[:2]) < 0.4] = NEG  # whole (block, slot) pairs invisible
    rows_n = kernel_mask(bm, nbq * bk)[:n]
    for src in (bm, torch.from_numpy(bm.copy())):
        read, seen = mask_flags_torch(src, n)
        assert read.dtype == torch.bool and read.shape == (topk * bk,)
        assert seen.dtype == torch.bool and seen.shape == (n,)
        np.testing.assert_array_equal(read.numpy(), read_keys(rows_n))
        np.testing.assert_array_equal(seen.numpy(), (rows_n > MASK_NEG).any(axis=1))


@pytest.mark.torch
@pytest.mark.parametrize(
    ("n", "ids", "topk"),
    [(1, [0], 16), (100, [0], 16), (200, [1], 3), (300, [2, 0], 4), (500, [3, 1, 0, 2], 16),
     (1500, [5, 3, 9, 8, 0, 10, 2, 1, 11, 7, 6, 4], 16)],
)  # fmt: skip
def test_twins_on_built_block_masks(n, ids, topk):
    """The masks the callers pass (``build_msa_block_mask``): the wrapper's padded kernel mask
    and flags; the keys read are exactly those of a real slot at a position below ``n``."""
    bm = build_msa_block_mask(n, torch.tensor(ids, dtype=torch.int32), topk=topk)
    n_pad = -(-n // 128) * 128
    want = np.full((n_pad, topk * 128), NEG, dtype=np.float32)
    want[:n] = kernel_mask(bm, n_pad)[:n]
    np.testing.assert_array_equal(_bits(kernel_mask_torch(bm, n_pad, n=n)), _bits(want))
    read, seen = mask_flags_torch(bm, n)
    slot, tok = np.divmod(np.arange(topk * 128), 128)
    ids_p = np.array([*ids, *([0] * (topk - len(ids)))])
    np.testing.assert_array_equal(read.numpy(), (slot < len(ids)) & (ids_p[slot] * 128 + tok < n))
    np.testing.assert_array_equal(seen.numpy(), np.arange(n) >= min(ids) * 128)


@pytest.mark.torch
def test_twins_on_non_contiguous_tensors():
    rng = np.random.default_rng(3)
    base = torch.from_numpy(_random_mask(rng, 3, 6, 64))
    view = base[:, ::2]  # [3, 3, 64, 64], strided slots
    assert not view.is_contiguous()
    dense = view.contiguous().numpy()
    np.testing.assert_array_equal(
        _bits(kernel_mask_torch(view, 192)), _bits(kernel_mask(dense, 192))
    )
    read, seen = mask_flags_torch(view, 150)
    rows_n = kernel_mask(dense, 192)[:150]
    np.testing.assert_array_equal(read.numpy(), read_keys(rows_n))
    np.testing.assert_array_equal(seen.numpy(), (rows_n > MASK_NEG).any(axis=1))


@pytest.mark.torch
def test_kernel_mask_torch_stays_on_the_device_and_copies():
    bm = torch.zeros(2, 2, 128, 128)
    got = kernel_mask_torch(bm, 256)
    got[0, 0] = 5.0
    assert float(bm[0, 0, 0, 0]) == 0.0  # a new tensor, the input is not written
    meta = kernel_mask_torch(bm.to("meta"), 256, n=200)
    assert meta.device.type == "meta" and meta.shape == (256, 256)
    read, seen = mask_flags_torch(bm.to("meta"), 200)
    assert read.device.type == "meta" and read.shape == (256,) and seen.shape == (200,)


@pytest.mark.torch
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_check_mask_finite_is_the_shared_check(bad):
    bm = np.zeros((1, 2, 128, 128), dtype=np.float32)
    bm[0, 1, 3, 5] = bad
    with pytest.raises(ValueError) as want:
        from tilesim.shared.validate import check_finite

        check_finite(bm, "block_mask")
    for src in (bm, torch.from_numpy(bm)):
        with pytest.raises(ValueError) as got:
            check_mask_finite(src)
        assert str(got.value) == str(want.value) and "[0, 1, 3, 5]" in str(got.value)
    check_mask_finite(np.full((1, 2, 128, 128), NEG))  # finite: passes


@pytest.mark.torch
def test_contract_meta_reads_no_data_values_catch_the_rest():
    for name in ("Args", "check_meta", "check_values", "host_plan", "cost"):
        assert name in msa_mask.__all__ and callable(getattr(msa_mask, name))
    q = torch.empty(3, 16, 128, device="meta")
    kb = torch.empty(256, 1, 128, device="meta")
    mask = torch.empty(1, 2, 128, 128, device="meta")
    with pytest.raises(ValueError, match="block_mask: expected a tensor holding data"):
        msa_mask.check_values(msa_mask.check_meta(q, kb, kb, mask))  # the value check needs data
    a = msa_mask.check_meta(q, kb, kb, mask)
    assert isinstance(a, msa_mask.Args) and (a.n, a.kv_len, a.nbq) == (3, 256, 1)
    with pytest.raises(ValueError, match="key_blocks: expected shape"):
        msa_mask.check_meta(q, torch.empty(255, 1, 128, device="meta"), kb, mask)
    q, kb = torch.zeros(3, 16, 128), torch.zeros(256, 1, 128)
    inf = torch.full((1, 2, 128, 128), -torch.inf)
    a = msa_mask.check_meta(q, kb, kb, inf)  # metadata fine: the values are not read
    with pytest.raises(ValueError, match="block_mask: expected finite"):
        msa_mask.check_values(a)


@pytest.mark.torch
def test_contract_host_plan_twin_and_cost():
    n, bk, topk = 200, 128, 2
    bm = build_msa_block_mask(n, np.array([1]), bk=bk, topk=topk)  # slot 1: padding
    q, kb = np.zeros((n, 16, 128), np.float32), np.zeros((topk * bk, 1, 128), np.float32)
    a = msa_mask.check_values(msa_mask.check_meta(q, kb, kb, bm, dtype="bf16", max_n=256))
    mask2d, read, seen = msa_mask.host_plan(a)
    assert mask2d.shape == (n, topk * bk) and read.shape == (topk * bk,) and seen.shape == (n,)
    assert not seen[:128].any() and seen[128:].all()  # block 1 is seen by query block 1 only
    assert read[:72].all() and not read[72:].any()  # tokens 128..199 of block 1; slot 1 unread
    mask_t, read_t, seen_t = msa_mask.host_plan_torch(a, 256, torch.from_numpy(bm))
    assert mask_t[:n].numpy().tobytes() == mask2d.tobytes() and (mask_t[n:] == NEG).all()
    assert (read_t.numpy() == read).all() and (seen_t.numpy() == seen).all()
    c = msa_mask.cost(a)
    assert c["flop"] == 2 * n * 16 * 256 * 2 * 128
    assert c["live_flop"] == 2 * 16 * 2 * 128 * 128 * (200 - 128)  # (qb 1, slot 0) only
    # bf16 q, k, v in; FP32 mask rows < n and FP32 output
    assert c["bytes"] == 2 * (n * 16 * 128 + 2 * 256 * 128) + 4 * n * 256 + 4 * n * 16 * 128


# ----------------------------------------------------------------------------- device wrapper
def _case(n=300, ids=(2, 0), topk=4):
    q = torch.randn(n, 16, 128, generator=torch.Generator().manual_seed(n))
    kb = torch.randn(topk * 128, 1, 128, generator=torch.Generator().manual_seed(1))
    bm = build_msa_block_mask(n, torch.tensor(ids, dtype=torch.int32), topk=topk)
    return q, kb, kb.clone(), bm


@pytest.mark.torch
def test_wrapper_operands_are_torch_ops_only():
    """On ``meta`` tensors no data exists: a host read (``.cpu()``, ``.numpy()``, ``.item()``,
    ``.tolist()``) would raise. The operands come out as meta tensors of the kernel's shapes."""
    from tilesim.device import msa_main as dev

    q, kb, vb, bm = (t.to("meta") for t in _case())
    a = msa_mask.check_meta(q, kb, vb, bm, dtype="bf16")
    (q2, k2, v2, mask), seen = dev._operands(a, q, kb, vb, bm)
    assert [t.device.type for t in (q2, k2, v2, mask, seen)] == ["meta"] * 5
    assert q2.shape == (384, 16 * 128) and q2.dtype == torch.bfloat16
    assert k2.shape == v2.shape == (512, 128) and k2.dtype == torch.bfloat16
    assert mask.shape == (384, 512) and mask.dtype == torch.float32 and seen.shape == (300,)


@pytest.mark.torch
def test_wrapper_host_reads_only_with_validate(monkeypatch):
    """``validate=False`` and ``True`` (default): none of the host-array helpers runs;
    ``validate="full"``: only the finiteness check of the mask. The operands equal the NumPy
    rules' result."""
    from tilesim.device import msa_main as dev

    calls = []

    def spy(name, real):
        def f(*args, **kw):
            calls.append(name)
            return real(*args, **kw)

        return f

    for name in ("host_array", "check_finite", "to_numpy"):
        if hasattr(msa_mask, name):
            monkeypatch.setattr(msa_mask, name, spy(name, getattr(msa_mask, name)))
    q, kb, vb, bm = _case()
    a, _ = dev._check(q, kb, vb, bm, "fp32", None, None, "sim", False)
    (q2, k2, v2, mask), seen = dev._operands(a, q, kb, vb, bm)
    assert calls == []
    dev._check(q, kb, vb, bm, "fp32", None, None, "sim", True)  # the default: no scan
    assert calls == []
    dev._check(q, kb, vb, bm, "fp32", None, None, "sim", "full")
    assert calls == ["host_array", "check_finite"]
    calls.clear()
    bad = bm.clone()
    bad[0, 0, 0, 0] = float("nan")
    dev._check(q, kb, vb, bad, "fp32", None, None, "sim", False)  # not read: no error
    with pytest.raises(ValueError, match="block_mask: expected finite"):
        dev._check(q, kb, vb, bad, "fp32", None, None, "sim", "full")
    rows = kernel_mask(bm, 384)[:300]
    np.testing.assert_array_equal(_bits(mask[:300]), _bits(rows))
    assert bool((mask[300:] == NEG).all())
    np.testing.assert_array_equal(seen.numpy(), (rows > MASK_NEG).any(axis=1))
    read = torch.from_numpy(read_keys(rows))
    assert torch.equal(k2[~read], torch.zeros_like(k2[~read]))  # unread keys: zeroed
    assert torch.equal(k2[read], kb.reshape(512, 128)[read])
    assert torch.equal(q2[:300], q.reshape(300, -1)) and bool((q2[300:] == 0).all())
