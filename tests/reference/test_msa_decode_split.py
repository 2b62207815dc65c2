"""MSA block-sparse decode with split-KV (``MsaTiling.kv_splits``): the reference's split twin.

Oracles (``tests/oracles/msa.py``):
* ``loop_kernel(..., kv_splits=k)`` — the kernel written the plain way, with the chunk runs and
  their merge spelled out in Python loops; the reference must equal it bit for bit;
* ``dense_oracle`` — float64 softmax attention (no chunks, no split), the per-element budget.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles.msa import assert_in_budget, dense_oracle, loop_kernel
from tilesim.reference import msa_sparse_decode
from tilesim.shared.casts import to_bf16
from tilesim.shared.tiling import MsaTiling

BY = 128


def make(rng, batch, nb, topk, *, hq=64, hkv=4, d=128):
    def r(shape):
        return to_bf16(rng.standard_normal(shape).astype(np.float32))

    q, k, v = r((batch, hq, d)), r((batch, hkv, nb, BY, d)), r((batch, hkv, nb, BY, d))
    ids = np.stack([rng.permutation(nb)[:topk] for _ in range(batch)]).astype(np.int32)
    return q, k, v, ids


def _short_ids(nb, topk):
    """A row whose first three slots hold blocks 2, 0, 1 and the others later blocks: with
    ``seq_len`` in block 2 every key of slots 3.. is masked (the later splits fully masked)."""
    return np.array([2, 0, 1, *range(nb - 1, nb - 1 - (topk - 3), -1)], dtype=np.int32)


@pytest.mark.parametrize(
    ("ntile", "kv_splits"), [(512, 2), (512, 3), (256, 2), (256, 3), (256, 4), (128, 5)]
)
def test_split_equals_plain_loop_bitwise(rng, ntile, kv_splits):
    nb, topk = 18, 16
    q, k, v, ids = make(rng, 3, nb, topk)
    ids[1] = _short_ids(nb, topk)  # row 1: seq_len 300, only slots 0..2 see keys
    ids[2, 0] = ids[2, 0] if 17 in ids[2] else 17  # row 2's current block selected
    seq = np.array([nb * BY, 300, 17 * BY + 9])
    t = MsaTiling(ntile=ntile, kv_splits=kv_splits)
    got = msa_sparse_decode(q, k, v, ids, seq, tiling=t)
    want = loop_kernel(q, k, v, ids, seq, ntile=ntile, kv_splits=kv_splits)
    assert got.tobytes() == want.tobytes()
    ref, amag, vis = dense_oracle(q, k, v, ids, seq)
    assert vis.all()
    assert_in_budget(got, ref, amag)


def test_one_split_and_one_chunk_per_split_keep_the_unsplit_bits(rng):
    """``kv_splits = 1`` is the chunk loop; so is a split with one chunk per range (folding
    single-chunk states in order IS the chunk loop's merge sequence). Two chunks per range
    fold in another order, so its bits differ somewhere -- the split is not a no-op."""
    q, k, v, ids = make(rng, 2, 17, 16)
    seq = np.array([17 * BY - 20, 2100])
    plain = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=512))
    for k_splits in (1, 4, 7):  # 4 chunks: 1 range; 4 and 7 ranges of one chunk
        got = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=512, kv_splits=k_splits))
        assert got.tobytes() == plain.tobytes(), k_splits
    two = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=512, kv_splits=2))
    assert two.tobytes() != plain.tobytes()
    ref, amag, _ = dense_oracle(q, k, v, ids, seq)
    assert_in_budget(two, ref, amag)


def test_fully_masked_split_and_empty_row(rng):
    """seq_len inside split 0: split 1 has no visible key and folds in with weight 0 (the
    output equals the unsplit one within the budget, and the plain loop bit for bit); a row
    that sees nothing is exactly +0 with splits too."""
    nb, topk = 17, 16
    q, k, v, ids = make(rng, 2, nb, topk)
    ids[0] = _short_ids(nb, topk)
    ids[1] = np.arange(nb - topk, nb)  # blocks 1..16: row 1 with seq_len 100 sees nothing
    seq = np.array([300, 100])
    t = MsaTiling(ntile=512, kv_splits=2)
    got = msa_sparse_decode(q, k, v, ids, seq, tiling=t)
    assert got.tobytes() == loop_kernel(q, k, v, ids, seq, ntile=512, kv_splits=2).tobytes()
    assert not np.any(got[1].view(np.uint16))  # +0, every bit
    ref, amag, vis = dense_oracle(q, k, v, ids, seq)
    assert vis.tolist() == [True, False]
    assert_in_budget(got[:1], ref[:1], amag[:1])


def test_split_with_nan_in_dropped_slots(rng):
    """NaN in the masked tail of the current block and in a fully masked split's blocks do not
    reach the output (selects, zeroed V rows), with or without the split."""
    nb, topk = 17, 16
    q, k, v, ids = make(rng, 1, nb, topk)
    ids[0] = _short_ids(nb, topk)
    seq = 300  # block 2 keeps 44 keys
    clean = msa_sparse_decode(q, k, v, ids, seq, tiling=MsaTiling(ntile=512, kv_splits=2))
    k2, v2 = k.copy(), v.copy()
    for arr in (k2, v2):
        arr[:, :, 2, 44:] = np.nan  # the current block's masked tail
        arr[:, :, 3:] = np.nan  # every later block (split 1 reads only these)
    got = msa_sparse_decode(q, k2, v2, ids, seq, tiling=MsaTiling(ntile=512, kv_splits=2))
    assert got.tobytes() == clean.tobytes()


def test_trace_names_the_split(rng):
    q, k, v, ids = make(rng, 1, 17, 16)
    recs = []
    msa_sparse_decode(q, k, v, ids, 2100, tiling=MsaTiling(ntile=512, kv_splits=2),
                      trace=recs.append)  # fmt: skip
    assert len(recs) == 4 * 4
    assert [r["lane"]["kv_split"] for r in recs[:4]] == [0, 0, 1, 1]
    plain = []
    msa_sparse_decode(q, k, v, ids, 2100, tiling=MsaTiling(ntile=512), trace=plain.append)
    assert "kv_split" not in plain[0]["lane"]


def test_kv_splits_field_and_env():
    assert MsaTiling().kv_splits == 1
    assert MsaTiling.from_env({"MSA_KV_SPLITS": "3"}).kv_splits == 3
    with pytest.raises(ValueError, match="MsaTiling.kv_splits"):
        MsaTiling(kv_splits=0)
    with pytest.raises(ValueError, match="MSA_KV_SPLITS"):
        MsaTiling.from_env({"MSA_KV_SPLITS": "0"})
