"""shared/rope.py: the YaRN table against DeepSeek's ``precompute_freqs_cis`` restated in
torch, and the pairings against torch's complex product and rotate-half."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tilesim.shared.casts import to_bf16
from tilesim.shared.rope import apply_rope, halves_table, yarn_inv_freq, yarn_rope_table


def _ds_freqs_cis(seqlen: int):
    """deepseek-ai/DeepSeek-V3.2-Exp inference/model.py ``precompute_freqs_cis``, restated."""
    torch = pytest.importorskip("torch")
    dim, base, factor, orig = 64, 10000.0, 40, 4096

    def corr(r):
        return dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), dim - 1)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if seqlen > orig:
        smooth = 1 - torch.clamp(
            (torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1
        )
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    ang = torch.outer(torch.arange(seqlen), freqs)
    return freqs, torch.polar(torch.ones_like(ang), ang)


@pytest.mark.torch
def test_inverse_frequencies_are_deepseeks_bits():
    freqs, _ = _ds_freqs_cis(16384)
    assert np.array_equal(yarn_inv_freq().view(np.int32), freqs.numpy().view(np.int32))


@pytest.mark.torch
def test_table_within_one_fp32_ulp_of_torch_polar():
    """torch.polar's FP32 cos/sin differ from the correctly rounded ones by at most 1 ulp on a
    few percent of the entries (measured: about 1 %); never more."""
    _, fc = _ds_freqs_cis(16384)
    cos, sin = yarn_rope_table(np.arange(16384))
    for ours, theirs in ((cos, fc.real.numpy()), (sin, fc.imag.numpy())):
        d = np.abs(ours.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
        assert d.max() <= 1 and (d == 0).mean() > 0.95


@pytest.mark.torch
def test_interleaved_is_deepseeks_complex_product_bit_for_bit():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = to_bf16(rng.standard_normal((5, 3, 64)).astype(np.float32))
    cos, sin = yarn_rope_table(np.array([0, 7, 4095, 4096, 16000]))
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    f = torch.complex(torch.from_numpy(cos), torch.from_numpy(sin))[:, None, :]
    want = torch.view_as_real(torch.view_as_complex(xt.float().reshape(5, 3, 32, 2)) * f)
    want = want.flatten(-2).to(torch.bfloat16).view(torch.int16).numpy()
    got = apply_rope(x, cos, sin, pairing="interleaved")
    assert np.array_equal(got.view(np.int16), want)


def test_deinterleave_is_the_interleaved_result_permuted():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 64)).astype(np.float32)
    cos, sin = yarn_rope_table(np.array([1, 2, 3000, 9000]))
    inter = apply_rope(x, cos, sin, pairing="interleaved")
    de = apply_rope(x, cos, sin, pairing="deinterleave")
    perm = np.concatenate([inter[..., 0::2], inter[..., 1::2]], axis=-1)
    assert np.array_equal(de.view(np.int32), perm.view(np.int32))
    c2, s2 = halves_table(cos, sin, dtype=np.float32)
    assert np.array_equal(apply_rope(x, c2, s2, pairing="deinterleave").view(np.int32),
                          de.view(np.int32))  # fmt: skip


def test_halves_rotates_pairs_i_and_i_plus_half():
    x = np.zeros((1, 64), np.float32)
    x[0, 3], x[0, 35] = 1.0, 3.0
    cos = np.full((1, 64), 0.5, np.float32)
    sin = np.full((1, 64), 0.25, np.float32)
    out = apply_rope(x, cos, sin, pairing="halves")
    assert out[0, 3] == np.float32(1.0 * 0.5 - 3.0 * 0.25)
    assert out[0, 35] == np.float32(3.0 * 0.5 + 1.0 * 0.25)
    assert np.count_nonzero(out) == 2


@pytest.mark.parametrize(
    ("kw", "exc", "pattern"),
    [
        (dict(pairing="neox"), ValueError, r"pairing: expected one of"),
        (dict(pairing="interleaved", cos=np.zeros((2, 64), np.float32)), ValueError,
         r"cos: expected shape \[2, 32\] for pairing 'interleaved', got \(2, 64\)"),
        (dict(pairing="halves", x=np.zeros((2, 63), np.float32)), ValueError, r"x: expected"),
        (dict(pairing="halves", x=np.zeros((2, 64), np.float64)), TypeError, r"x: expected dtype"),
    ],
)  # fmt: skip
def test_bad_rope_arguments(kw, exc, pattern):
    args = dict(x=np.zeros((2, 64), np.float32), cos=np.ones((2, 32), np.float32),
                sin=np.zeros((2, 32), np.float32))  # fmt: skip
    args.update(kw)
    with pytest.raises(exc, match=pattern):
        apply_rope(args.pop("x"), args.pop("cos"), args.pop("sin"), **args)


def test_positions_out_of_range():
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 16384\).*16384"):
        yarn_rope_table(np.array([0, 16384]))


def test_table_takes_the_yarn_keywords_of_the_frequencies():
    yarn = dict(rope_dim=32, factor=8.0, original_max_position_embeddings=1024, max_seq_len=8192)
    pos = np.array([0, 5, 1500, 8191])
    cos, sin = yarn_rope_table(pos, **yarn)
    angle = (pos.astype(np.float32)[:, None] * yarn_inv_freq(**yarn)[None, :]).astype(np.float64)
    assert cos.shape == (4, 16)
    assert np.array_equal(cos, np.cos(angle).astype(np.float32))
    assert np.array_equal(sin, np.sin(angle).astype(np.float32))
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 8192\)"):
        yarn_rope_table(np.array([8192]), **yarn)
    with pytest.raises(TypeError, match="rope_base"):
        yarn_rope_table(pos, rope_base=1.0)


@pytest.mark.parametrize("dtype", [None, "bogus", np.float16])
def test_halves_table_dtype_is_named(dtype):
    """``dtype=None`` (NumPy would read float64), unknown names and dtypes other than BF16 /
    FP32 are a ``TypeError`` naming ``dtype`` (the shared dtype-choice rule)."""
    from tilesim.shared.rope import halves_table

    a = np.zeros((2, 4), np.float32)
    with pytest.raises(TypeError, match="^dtype: expected one of bfloat16 or float32, got"):
        halves_table(a, a, dtype=dtype)
