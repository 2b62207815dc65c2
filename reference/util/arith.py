"""The arithmetic models of the goldens: one place for every model of a kernel's arithmetic.

Every op in :mod:`tilesim.reference` computes with these functions; ``docs/numerics.md`` has
the table of which op uses which model.

* :func:`matmul_fp32` — a cube matmul with an FP32 accumulator. The K axis is cut into tiles of
  ``k_tile`` columns (``None``: one tile). A tile's products are formed exactly and summed in
  float64 from the exactly widened operands, then rounded ONCE to FP32; the tile partials are
  added in FP32 in ascending K order (``acc = p0; acc = fp32(acc + p1); ...``), which is the
  L0C accumulation over K steps. For BF16 / FP16 / FP8 / INT8 operands (and FP32 x BF16) every
  product is exact in float64, so a tile partial is the correctly rounded FP32 value of its
  float64 sum, whatever order the BLAS adds in (up to a double-rounding coincidence when the
  float64 sum lands within ~2^-53 of an FP32 midpoint).
* :func:`block_scaled_matmul_fp32` — DeepSeek's ``fp8_gemm``: one :func:`matmul_fp32` partial
  per 128-deep K block of block-scaled FP8 operands, scaled by the product of the two blocks'
  scales and added in FP32 in ascending K order; the promotion ``acc + partial * scale`` is
  one fused multiply-add (``promotion="fma"``, one rounding: :func:`fma_fp32`) or a product
  and a sum (``"two_roundings"``).
* :func:`fma_fp32` — an exact FP32 fused multiply-add ``FP32(a * b + c)`` (one rounding),
  computed in float64 with an error-free sum and rounding to odd.
* Two ``exp`` models, named for what they are:

  - :func:`exp_fp32_correctly_rounded` — float64 ``exp`` rounded once to FP32 (the correctly
    rounded FP32 value, except for double-rounding coincidences). Independent of the CPU.
  - :func:`exp_fp32_numpy` — NumPy's float32 ``exp`` (a SIMD kernel on x86-64; within 2 FP32
    ulp of correctly rounded on the softmax domain, see ``tests/reference/test_arith.py``).
    Its last bit may depend on the CPU's SIMD width; the ops that use it (the MSA attention
    goldens) state a budget for P, not a bit promise.

* :func:`rowsum_fp32` — a float64 sum of FP32 values rounded once to FP32.
* :func:`rowsum_fp32_cascade` — an FP32 row sum in the order of the PyPTO CPU interpreter's
  reduction (libtorch's cascade: 8 lanes x 4 accumulators x 4 levels, every add one FP32
  rounding); the DeepSeek attention's ``accumulation="k_steps"`` golden uses it.
* :func:`tile_softmax` — ``m = rowmax(S)``, ``P = exp(S - m)`` (one FP32 subtraction, the
  chosen exp), ``l = rowsum_fp32(P)`` over the unrounded P.
* :class:`SoftmaxMerge` — the running ``(m, l, O)`` of a flash-attention loop over key tiles,
  in the two modes the kernels use (``"online"``: unnormalised tile outputs;
  ``"per_tile"``: normalised tile outputs merged with softmax weights).

Every other vector step of a kernel (a scale multiply, a subtraction, a division) is one IEEE
FP32 NumPy operation in the kernel's order and is written where the op does it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tilesim.shared.quant import FP8_PROMOTIONS
from tilesim.shared.validate import check_choice

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

ExpModel = Callable[[np.ndarray], np.ndarray]


# ----------------------------------------------------------------------------- matmul
def _check_k_tile(k_tile) -> None:
    if k_tile is not None and (isinstance(k_tile, bool) or int(k_tile) != k_tile or k_tile <= 0):
        raise ValueError(f"matmul_fp32(k_tile): expected a positive int or None, got {k_tile!r}")


def matmul_fp32(a, b, *, k_tile: int | None, out: np.ndarray | None = None) -> np.ndarray:
    """``a [..., M, K] @ b [..., K, N]`` as the cube computes it, FP32 ``[..., M, N]``.

    ``a`` and ``b`` hold values whose pairwise products are exact in float64 (BF16, FP16, FP8,
    INT8 or FP32-times-BF16 data, in any float dtype; float64 arrays are taken to be exact
    widenings already). ``k_tile``: width of the cube's K tile — each tile is summed in
    float64 and rounded once to FP32, tile partials are added in FP32 in ascending K order;
    the last tile may be shorter. ``None``: the whole K is one tile. Leading dimensions
    broadcast as in ``np.matmul``. ``K == 0`` gives zeros.

    Work memory is bounded by one K tile: each tile of ``a`` and ``b`` is widened to float64
    when its turn comes, never the whole operand. ``out``: optional FP32 array of the result's
    shape (a view is fine) that receives the result; returned when given.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    kdim = a.shape[-1]
    if b.shape[-2] != kdim:
        raise ValueError(f"matmul_fp32(b): expected {kdim} rows (the K of a), got shape {b.shape}")
    _check_k_tile(k_tile)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if out is not None and (out.shape != shape or out.dtype != F32):
        raise ValueError(f"matmul_fp32(out): expected float32 {shape}, got {out.dtype} {out.shape}")
    acc = np.zeros(shape, dtype=F32) if out is None else out
    if kdim == 0:
        acc[...] = 0
        return acc
    step = kdim if k_tile is None else int(k_tile)
    for k0 in range(0, kdim, step):  # the cube's K loop: one FP32 rounding per tile partial
        a_t = np.asarray(a[..., k0 : k0 + step], dtype=F64)
        b_t = np.asarray(b[..., k0 : k0 + step, :], dtype=F64)
        part = np.matmul(a_t, b_t).astype(F32)
        if k0 == 0:
            acc[...] = part  # the first partial, rounded once
        else:
            np.add(acc, part, out=acc)  # FP32 accumulator update
    return acc


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum of float64 arrays: ``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e``
    exactly (no overflow in float64 for FP32-range inputs)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fma_fp32(a, b, c) -> np.ndarray:
    """``FP32(a * b + c)`` with ONE rounding (IEEE ``fusedMultiplyAdd``, round to nearest even)
    of FP32 arrays (broadcast), FP32 result.

    ``a * b`` is exact in float64 (24 + 24 significand bits); ``a * b + c`` is then an exact
    float64 TwoSum ``s + e``. Rounding ``s`` straight to FP32 would be a double rounding
    (wrong when ``s`` is an FP32 midpoint and ``e != 0``), so ``s`` is first rounded to odd
    (``e != 0`` and ``s``'s last bit even: the float64 neighbour of ``s`` toward ``e``), and
    the odd-rounded float64 value, 53 >= 24 + 2 bits, rounds correctly to FP32 (Boldo and
    Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding
    to odd", IEEE Trans. Computers 57(4), 2008). Non-finite sums (an inf or NaN operand) are
    the float64 sum's, as the FMA's. ``tests/reference/test_arith_block_scaled.py`` checks it
    against exact rational arithmetic."""
    prod = np.asarray(a, dtype=F32).astype(F64) * np.asarray(b, dtype=F32).astype(F64)
    c64 = np.asarray(c, dtype=F32).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        s, e = _two_sum(prod, c64)
    s, e = np.broadcast_arrays(s, e)
    even = (s.view(np.int64) & 1) == 0
    fix = np.isfinite(s) & (e != 0) & even
    odd = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    with np.errstate(over="ignore"):
        return odd.astype(F32)


def block_scaled_matmul_fp32(
    a, a_scale, b, b_scale, *, block: int, promotion: str = "fma"
) -> np.ndarray:
    """DeepSeek's ``fp8_gemm`` on the FP32 values of FP8 codes, FP32 ``[M, N]``: ``a [M, K]``
    with one scale per row and K block, ``a_scale [M, K/block]``, and ``b [K, N]`` with one
    scale per ``block x block`` tile, ``b_scale [K/block, ceil(N/block)]`` (``K`` a multiple of
    ``block``). Per K block ``kb``, in ascending order, with ``P_kb`` the block's
    :func:`matmul_fp32` with one K tile and ``S = FP32(a_scale[:, kb] * b_scale[kb, n //
    block])``:

    * ``promotion="fma"`` (default; DeepSeek's kernel as nvcc builds it): ``acc = FP32(acc +
      P_kb * S)``, one rounding (:func:`fma_fp32`);
    * ``"two_roundings"``: ``acc = FP32(acc + FP32(P_kb * S))``.

    The two agree whenever every ``P_kb * S`` is exact in FP32, e.g. power-of-two (UE8M0)
    scales away from underflow; ``amax / 448`` weight scales make them differ in the last bit
    on some elements (``docs/numerics.md``)."""
    check_choice(promotion, "promotion", FP8_PROMOTIONS)
    n = b.shape[1]
    sb = np.repeat(b_scale, block, axis=1)[:, :n]  # [K/block, N]: one scale per column
    acc = np.zeros((a.shape[0], n), dtype=F32)
    for kb in range(a_scale.shape[1]):  # the K loop: one FP32 partial per block
        ks = slice(kb * block, (kb + 1) * block)
        part = matmul_fp32(a[:, ks], b[ks], k_tile=None)
        scale = a_scale[:, kb : kb + 1] * sb[kb][None, :]  # FP32(sa * sb)
        if promotion == "fma":
            acc = fma_fp32(part, scale, acc)  # one rounding
        else:
            acc = acc + part * scale  # FP32 product, then FP32 add
    return acc


# ----------------------------------------------------------------------------- exp
def exp_fp32_correctly_rounded(x) -> np.ndarray:
    """FP32 ``exp`` of FP32 ``x``: evaluated in float64, rounded once to FP32 (overflow: +inf)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(np.asarray(x).astype(F64)).astype(F32)


def exp_fp32_numpy(x, out: np.ndarray | None = None) -> np.ndarray:
    """NumPy's float32 ``exp`` of FP32 ``x`` (SIMD on x86-64; ``out`` as in ``np.exp``)."""
    x = np.asarray(x)
    if x.dtype != F32:
        raise TypeError(f"exp_fp32_numpy(x): expected float32, got {x.dtype}")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.exp(x, out=out)


EXP_MODELS: dict[str, ExpModel] = {
    "correctly_rounded": exp_fp32_correctly_rounded,
    "numpy_fp32": exp_fp32_numpy,
}


# ----------------------------------------------------------------------------- reductions
def rowsum_fp32(x, axis: int = -1) -> np.ndarray:
    """FP32 row sum over ``axis`` (kept as a length-1 axis): float64 sum, one FP32 rounding."""
    return np.asarray(x).astype(F64).sum(axis=axis, keepdims=True).astype(F32)


#: the cascade of :func:`rowsum_fp32_cascade`: vector lanes, accumulators per vector, levels
_CASCADE_LANES, _CASCADE_ILP, _CASCADE_LEVELS = 8, 4, 4


def _cascade(terms: np.ndarray) -> np.ndarray:
    """Sum ``terms [rows, n, ...]`` over axis 1 in FP32 with the cascade's levels: level 0
    adds terms one by one; after every ``2**p`` terms (``p = max(4, ceil(log2 n) // 4)``)
    level 0 is added into level 1 and cleared, level 1 into level 2 when the count is a
    multiple of ``2**(2p)``, and so on; the leftover terms go into level 0; then levels 1..3
    are added into level 0 in order. Every add is one FP32 rounding."""
    n = terms.shape[1]
    power = max(4, int(n - 1).bit_length() // _CASCADE_LEVELS if n > 1 else 0)
    step, mask = 1 << power, (1 << power) - 1
    acc = np.zeros((_CASCADE_LEVELS, terms.shape[0], *terms.shape[2:]), dtype=F32)
    i = 0
    while i + step <= n:
        for _ in range(step):
            acc[0] += terms[:, i]
            i += 1
        for j in range(1, _CASCADE_LEVELS):
            acc[j] += acc[j - 1]
            acc[j - 1] = 0
            if i & (mask << (j * power)):
                break
    for k in range(i, n):
        acc[0] += terms[:, k]
    for j in range(1, _CASCADE_LEVELS):
        acc[0] += acc[j]
    return acc[0]


def _ilp_sum(units: np.ndarray) -> np.ndarray:
    """``units [rows, n, ...]`` (vectors or scalars) summed as ``_CASCADE_ILP`` interleaved
    cascades (unit ``4i + k`` into accumulator ``k``), the units past the last whole group
    added into accumulator 0, then accumulators 1..3 added into 0, in FP32."""
    rows, n = units.shape[:2]
    groups = n // _CASCADE_ILP
    grouped = units[:, : groups * _CASCADE_ILP].reshape(rows, groups, _CASCADE_ILP,
                                                        *units.shape[2:])  # fmt: skip
    part = _cascade(grouped)  # [rows, ILP, ...]
    total = part[:, 0].copy()
    for k in range(groups * _CASCADE_ILP, n):
        total += units[:, k]
    for k in range(1, _CASCADE_ILP):
        total += part[:, k]
    return total


def rowsum_fp32_cascade(x) -> np.ndarray:
    """FP32 sum of the last axis of FP32 ``x [rows, n]`` (kept as a length-1 axis) in the order
    of the PyPTO CPU interpreter's row sum, which is libtorch's ``sum`` on one thread
    (``pytorch/pytorch:aten/src/ATen/native/cpu/SumKernel.cpp``, the cascade sum of an inner
    reduction, AVX2 width): with ``n >= 8`` the row is read as ``n // 8`` vectors of 8 lanes
    summed lane-wise by :func:`_ilp_sum`, then a scalar accumulator starting at 0 adds the
    ``n % 8`` tail values and the 8 lanes in order; with ``n < 8`` the values are summed as
    scalars by :func:`_ilp_sum`. Every add is one FP32 rounding (no float64), so the result
    differs from :func:`rowsum_fp32` in the last places. ``tests/reference/test_arith.py``
    checks it against libtorch's ``sum``."""
    x = np.asarray(x, dtype=F32)
    rows, n = x.shape
    if n < _CASCADE_LANES:
        return _ilp_sum(x)[:, None]
    nv = n // _CASCADE_LANES
    lanes = _ilp_sum(x[:, : nv * _CASCADE_LANES].reshape(rows, nv, _CASCADE_LANES))
    total = np.zeros(rows, dtype=F32)
    for k in range(nv * _CASCADE_LANES, n):
        total += x[:, k]
    for k in range(_CASCADE_LANES):
        total += lanes[:, k]
    return total[:, None]


def halving_sum_fp32(x, axis: int) -> np.ndarray:
    """FP32 sum over ``axis`` (removed) as a vector unit's halving tree computes it: the upper
    half is added to the lower half element-wise in FP32 until one slice is left
    (``n -> n/2 -> ... -> 1``; every add rounds once). ``x``: FP32 values, the axis length a
    power of two (the DeepSeek indexer's 64 heads). The order is fixed, so the bits are too;
    they differ from :func:`rowsum_fp32` (one rounding) in the last places."""
    t = np.moveaxis(np.asarray(x, dtype=F32), axis, 0)
    n = t.shape[0]
    if n < 1 or n & (n - 1):
        raise ValueError(f"x: expected a power-of-two length on axis {axis}, got {n}")
    while t.shape[0] > 1:
        h = t.shape[0] // 2
        t = t[:h] + t[h:]
    return t[0]


def tile_softmax(s, *, exp: ExpModel, inplace: bool = False):
    """The softmax statistics of one key tile of FP32 scores ``s [..., rows, w]``.

    ``m = rowmax(s)``; ``P = exp(s - m)`` (FP32 subtraction, then the ``exp`` model);
    ``l = rowsum_fp32(P)`` over the unrounded P. ``inplace=True`` reuses ``s`` for P (``s`` is
    consumed; only with :func:`exp_fp32_numpy`). Returns ``(m, P, l)``, FP32, with ``m`` and
    ``l`` of shape ``[..., rows, 1]``.
    """
    m = s.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        if inplace:
            if exp is not exp_fp32_numpy:
                raise ValueError("tile_softmax(inplace=True) needs exp=exp_fp32_numpy")
            p = np.subtract(s, m, out=s)
            p = exp_fp32_numpy(p, out=p)
        else:
            p = exp(s - m)
    return m, p, rowsum_fp32(p)


# ----------------------------------------------------------------------------- merge
SOFTMAX_MERGE_MODES = ("online", "per_tile")


class SoftmaxMerge:
    """The running softmax state ``(M, L, O)`` of a loop over key tiles, FP32.

    ``update(o_t, l_t, m_t)`` folds in one tile: its output ``o_t``, row sum ``l_t`` and row
    max ``m_t`` (``[..., rows, 1]``). The first tile is stored as it is. Later tiles, with the
    ``exp`` model given (every step one FP32 operation, in this order)::

        M' = max(M, m_t);  a = exp(M - M');  c = exp(m_t - M')
        online:    L = a*L + c*l_t;        O = O*a + o_t*c
        per_tile:  A = a*L;  C = c*l_t;  L = A + C;  O = (O*A + o_t*C) / L

    ``"online"``: ``o_t = P @ V`` unnormalised; the answer is ``O / L`` (:meth:`normalized`).
    ``"per_tile"``: ``o_t`` is the tile's normalised output (FP32 or BF16, widened exactly);
    the answer is ``O`` itself (:attr:`o`). A tile whose rows are all masked must not be
    folded in (skip it); such rows would put ``-inf - -inf`` into ``exp``.
    """

    def __init__(self, mode: str = "online", *, exp: ExpModel = exp_fp32_correctly_rounded):
        if mode not in SOFTMAX_MERGE_MODES:
            raise ValueError(f"mode: expected one of {SOFTMAX_MERGE_MODES}, got {mode!r}")
        self.mode = mode
        self.exp = exp
        self.m = self.l = self.o = None
        self.tiles = 0

    @property
    def empty(self) -> bool:
        """True until the first tile is folded in."""
        return self.tiles == 0

    def update(self, o_t, l_t, m_t) -> None:
        """Fold one tile in (see the class docstring for the formulas)."""
        o_t = np.asarray(o_t)
        if self.mode == "per_tile":
            o_t = o_t.astype(F32)
        self.tiles += 1
        if self.m is None:
            self.m, self.l, self.o = m_t, l_t, o_t
            return
        with np.errstate(invalid="ignore", over="ignore"):
            m_new = np.maximum(self.m, m_t)
            a = self.exp(self.m - m_new)
            c = self.exp(m_t - m_new)
            if self.mode == "online":
                self.l = a * self.l + c * l_t
                self.o = self.o * a + o_t * c
            else:
                big_a = a * self.l
                big_c = c * l_t
                self.l = big_a + big_c
                self.o = (self.o * big_a + o_t * big_c) / self.l
        self.m = m_new

    def normalized(self) -> np.ndarray:
        """The FP32 attention output: ``O / L`` (online) or ``O`` (per_tile)."""
        if self.m is None:
            raise ValueError("SoftmaxMerge.normalized: no tile was folded in")
        if self.mode == "per_tile":
            return self.o
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.o / self.l


__all__ = [
    "EXP_MODELS",
    "F32",
    "F64",
    "SOFTMAX_MERGE_MODES",
    "ExpModel",
    "SoftmaxMerge",
    "block_scaled_matmul_fp32",
    "fma_fp32",
    "exp_fp32_correctly_rounded",
    "exp_fp32_numpy",
    "halving_sum_fp32",
    "matmul_fp32",
    "rowsum_fp32",
    "rowsum_fp32_cascade",
    "tile_softmax",
]
