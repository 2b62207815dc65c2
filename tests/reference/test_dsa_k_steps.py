"""The DeepSeek sparse-attention golden's ``accumulation="k_steps"`` switch (reference/dsa.py).

``"k_steps"`` is the kernel's arithmetic as PyPTO's CPU interpreter runs it (docs/ops/dsa.md,
"Accumulation"): C1 / C2 in K steps of the tiling's ``kL1`` (each step summed exactly, rounded
once to FP32, the steps added in FP32), the row sum in the interpreter's cascade order
(:func:`tilesim.reference.util.arith.rowsum_fp32_cascade`), the skipped (``-1``) columns kept in
place. Checked here:

* the cascade row sum is libtorch's one-thread ``sum`` bit for bit (the interpreter's reduction;
  the oracle is libtorch itself, which shares no code with the model);
* the switched golden stays within the op's calibrated budget against the independent float64
  oracle (``tests/oracles/dsa.py``), in both softmax modes, with ``-1`` entries and tiles whose
  K steps are shorter than the KV tile;
* it is a different rounding from the default (so the switch is not a no-op), and the default
  is the ``"exact"`` model (the committed golden digests hold its bits);
* a bad value is refused before any work, naming the argument.

Its bit-exactness against the kernels is proved in the simulator
(``tests/device/test_dsa_sim.py``, ``test_large_batch_preset_bit_exact``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tilesim.reference as R
from oracles.dsa import check_budget, oracle
from tilesim.reference.util.arith import rowsum_fp32, rowsum_fp32_cascade
from tilesim.shared.tiling import SaTileShapeConfig

SMALL = dict(nq=16, topk=256, block_size=16)
#: 64-key KV tiles whose C1 K steps (576 = 2 x 256 + 64) and C2 K steps (2 x 32) both round
ONLINE_STEPS = SaTileShapeConfig.decode().replace(
    s_kv_tile=64, c1_tile=(16, 16, 256, 256, 64, 64), c2_tile=(16, 16, 32, 32, 128, 128)
)
PER_TILE_STEPS = SaTileShapeConfig.prefill().replace(
    s_kv_tile=64, c1_tile=(16, 16, 128, 128, 64, 64), c2_tile=(16, 16, 16, 16, 128, 128)
)


def _case(**over):
    return R.dsa_make_case(
        actual_seq=[700, 90, 3, 256], s1=2, quant="fp8", topk_rule="causal", invalid_frac=0.1,
        seed=7, **{**SMALL, **over},
    )  # fmt: skip


def _run(case: dict, **over) -> np.ndarray:
    return getattr(R, case["op"])(**case["inputs"], **{**case["params"], **over})


@pytest.mark.torch
@pytest.mark.parametrize("n", [*range(1, 70), 127, 128, 129, 511, 512, 1000, 2047, 2048, 4100])
def test_cascade_rowsum_is_libtorchs_sum(n):
    """Row sums of positive FP32 values (softmax-like, spread over 2^±9) of every length class
    (the scalar path below 8, tails of 1..7 values, 1..4 levels) equal libtorch's ``sum`` on
    one thread, bit for bit; the once-rounded float64 sum differs somewhere (not a no-op)."""
    import torch

    rng = np.random.default_rng(n)
    x = np.exp(rng.normal(0.0, 3.0, size=(64, n))).astype(np.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = torch.from_numpy(x).sum(dim=-1, keepdim=True).numpy()
    finally:
        torch.set_num_threads(threads)
    got = rowsum_fp32_cascade(x)
    assert got.shape == (64, 1) and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if n >= 512:
        assert (got != rowsum_fp32(x)).any()


@pytest.mark.parametrize("cfg", [ONLINE_STEPS, PER_TILE_STEPS], ids=["online", "per_tile"])
def test_k_steps_within_oracle_budget(cfg):
    """The switched golden against the independent float64 oracle, the op's hard and typical
    budgets (docs/ops/dsa.md, "Promises"), with -1 entries (the masked columns kept in place)."""
    case = _case()
    ref = _run(case, tiling=cfg, accumulation="k_steps")
    o, m1, m2 = oracle(case)
    check_budget(ref, o, m1, m2)


def test_k_steps_is_another_rounding_and_exact_is_the_default():
    """The switch moves bits (K steps that round, the cascade row sum), but only by roundings:
    almost every element agrees (128 heads: 6 of 524 288 differ); the default is ``"exact"``."""
    case = _case(nq=128)
    exact = _run(case, tiling=ONLINE_STEPS)
    named = _run(case, tiling=ONLINE_STEPS, accumulation="exact")
    assert np.array_equal(exact.view(np.uint16), named.view(np.uint16))
    steps = _run(case, tiling=ONLINE_STEPS, accumulation="k_steps")
    same = exact.view(np.uint16) == steps.view(np.uint16)
    assert 0.999 < same.mean() < 1.0


def test_k_steps_with_one_step_per_tile_keeps_the_products():
    """With every K range one step (kL1 >= 576 and >= the KV tile) the C1 / C2 sums are the
    exact model's; only the row sum's order differs, so the outputs agree within one BF16 ulp."""
    cfg = SaTileShapeConfig.decode().replace(
        s_kv_tile=64, c1_tile=(16, 16, 256, 1024, 64, 64), c2_tile=(16, 16, 64, 64, 128, 128)
    )
    case = _case()
    a = _run(case, tiling=cfg).astype(np.float64)
    b = _run(case, tiling=cfg, accumulation="k_steps").astype(np.float64)
    ulp = np.spacing(np.maximum(np.abs(a), np.abs(b)).astype(np.float32)) * 2.0**16
    assert (np.abs(a - b) <= ulp + 1e-38).all()


@pytest.mark.parametrize("bad", ["kstep", "", None, 1])
def test_bad_accumulation_names_the_argument(bad):
    case = _case()
    with pytest.raises((ValueError, TypeError), match="accumulation"):
        _run(case, accumulation=bad)
