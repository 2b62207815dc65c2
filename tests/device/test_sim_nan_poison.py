"""NaN poisoning of the slots a kernel never reads, on PyPTO's CPU simulator (910B and 950).

The kernel twin of ``tests/reference/test_nan_poison.py`` (docs/numerics.md, "Masking and
NaN"): in real serving unwritten cache rows hold garbage, so every slot a kernel must not read
is filled with NaN or +-inf and the output must be the same BITS as with finite data there.
Each test makes one clean and one poisoned call of the kernel (several poison kinds batched
into the same call, since a simulator run costs seconds), and batches a control into the
poisoned call: a slot that IS read, poisoned, must show NaN -- so the comparison is not vacuous.

* MSA decode (``gather`` "device", "paged", "host", and "device" with ``kv_splits`` 2): in K
  and V, the masked tail of the
  current block (keys at or past ``seq_len``), selected future blocks (one of them filling a
  whole key chunk), blocks that are not selected, and every block of a batch row that keeps
  no key (its output stays exactly +0). Controls: a kept key's K row, a kept key's V row.
* MSA lightning indexer: key rows at or past ``seq_len``; ``block_max="device"`` compared on
  the kernel's per-block maxima (the ids cannot show it: the local block ``nb-1``, the only
  one with such rows, is always selected), ``block_max="host"`` on the host tail's maxima of
  the kernel scores and the ids. Control: the kernel's scores of the poisoned rows are
  non-finite (the kernel does read them; the selection must not).
* MoE grouped GEMM: rows of ``sorted_tokens`` past ``expert_cumsum[-1]`` and the weights of
  experts with no tokens (first, middle and last). Control: one routed row.

Each check runs in a spawned process per SoC (``tilesim.device.sim.isolated``).
"""

from __future__ import annotations

import pytest

BY = 128
NAN, INF = float("nan"), float("inf")


def nonfinite_bf16(bits) -> int:
    """How many BF16 values (given as their int16 bits) are NaN or +-inf (exponent all ones)."""
    import numpy as np

    return int(((np.asarray(bits).view(np.uint16) & 0x7F80) == 0x7F80).sum())


# ----------------------------------------------------------------------------- MSA decode
DEC_HQ, DEC_HKV, DEC_NB, DEC_D, DEC_NTILE = 16, 1, 8, 128, 256  # 2 key chunks of 2 blocks
#: per batch row: seq_len, the selected blocks (slot order) and the row's role
DEC_ROWS = (
    # cur 3 (51 masked tail keys); chunk 0 = future blocks 6, 5: a fully masked chunk
    (3 * BY + 77, (6, 5, 3, 0), "poison"),
    # cur 5 (one kept key, 127 masked); future block 7 in chunk 1
    (5 * BY + 1, (5, 1, 7, 2), "poison"),
    # cur 0 not selected: every selected block lies in the future, nothing is kept -> +0
    (5, (4, 1, 7, 2), "empty"),
    # controls: a kept key of block 0 poisoned in K, a kept key of block 1 in V
    (2 * BY + 10, (2, 0, 1, 4), "control_k"),
    (2 * BY + 10, (2, 0, 1, 4), "control_v"),
)
DEC_GATHERS = ("device", "paged", "host")
#: (gather, kv_splits) per run: every variant unsplit, and the default gather with split-KV
#: (2 chunks -> 2 splits: the split combine folds in a fully masked chunk of row 0)
DEC_RUNS = (*((g, 1) for g in DEC_GATHERS), ("device", 2))


def _decode_unread(seq: int, ids) -> list[tuple[int, slice, str]]:
    """``(block, key rows, kind)`` of the slots one batch row never reads (restated from the
    per-token rule ``128*block + t < seq_len``, not from the kernel's mask)."""
    cur = (seq - 1) // BY
    out = [(cur, slice(seq - cur * BY, BY), "tail")] if cur in ids else []
    out += [(b, slice(0, BY), "future") for b in ids if b > cur]
    out += [(b, slice(0, BY), "unselected") for b in range(DEC_NB) if b not in ids]
    return out


def _decode_poisoned(k, v):
    """Copies of ``k``/``v`` with every unread slot of the "poison" / "empty" rows set to NaN
    or +-inf (the value varies with the kind and the tensor), and the two controls."""
    values = {"tail": (NAN, INF), "future": (-INF, NAN), "unselected": (NAN, -INF)}
    k, v = k.clone(), v.clone()
    for r, (seq, ids, role) in enumerate(DEC_ROWS):
        if role in ("poison", "empty"):
            for blk, rows, kind in _decode_unread(seq, ids):
                kv, vv = values[kind] if role == "poison" else (NAN, NAN)
                k[r, :, blk, rows] = kv
                v[r, :, blk, rows] = vv
        elif role == "control_k":
            k[r, :, 0, 5] = NAN
        else:
            v[r, :, 1, 9] = NAN
    return k, v


def check_decode_poison(soc) -> dict:
    """In the isolated child: a clean and a poisoned call per gather variant."""
    import torch
    from tilesim.device.msa_decode import msa_sparse_decode
    from tilesim.shared.tiling import MsaTiling

    g = torch.Generator().manual_seed(21)
    b = len(DEC_ROWS)
    q = (torch.randn(b, DEC_HQ, DEC_D, generator=g) * 0.5).bfloat16()
    k = (torch.randn(b, DEC_HKV, DEC_NB, BY, DEC_D, generator=g) * 0.5).bfloat16()
    v = torch.randn(b, DEC_HKV, DEC_NB, BY, DEC_D, generator=g).bfloat16()
    ids = torch.tensor([r[1] for r in DEC_ROWS], dtype=torch.int32)
    seq = torch.tensor([r[0] for r in DEC_ROWS])
    k_bad, v_bad = _decode_poisoned(k, v)
    res = {}
    for gather, splits in DEC_RUNS:
        tiling = MsaTiling(ntile=DEC_NTILE, kv_splits=splits)
        outs = [
            msa_sparse_decode(
                q, kk, vv, ids, seq, tiling=tiling, gather=gather, backend="sim", soc=soc
            )[0]  # fmt: skip
            for kk, vv in ((k, v), (k_bad, v_bad))
        ]
        res[f"{gather} kv_splits={splits}"] = [o.view(torch.int16).numpy() for o in outs]
    return res


@pytest.mark.sim
@pytest.mark.torch
def test_decode_kernel_unread_slots_never_reach_the_output(sim_soc):
    import numpy as np
    from tilesim.device import sim

    r = sim.isolated(check_decode_poison, sim_soc, soc=sim_soc)
    roles = [row[2] for row in DEC_ROWS]
    for gather, (clean, dirty) in r.items():
        assert nonfinite_bf16(clean) == 0, gather
        for i, role in enumerate(roles):
            if role in ("poison", "empty"):
                np.testing.assert_array_equal(dirty[i], clean[i], err_msg=f"{gather} row {i}")
            else:  # the control: a poisoned slot that is read shows
                assert nonfinite_bf16(dirty[i]) > 0, f"{gather} {role}: the poison vanished"
        empty = roles.index("empty")
        assert not clean[empty].any() and not dirty[empty].any(), "no kept key: exactly +0"
    kept = [i for i, role in enumerate(roles) if not role.startswith("control")]
    first = next(iter(r.values()))[1][kept]
    assert all(np.array_equal(o[1][kept], first) for o in r.values()), "gathers differ"


# ----------------------------------------------------------------------------- MSA indexer
IDX_NB, IDX_PARTIAL = 17, 64  # just past the short-context guard; 64 keys count in block 16
IDX_SEQ = (IDX_NB - 1) * BY + IDX_PARTIAL


def check_indexer_poison(soc) -> dict:
    """In the isolated child: clean (finite garbage past ``seq_len``) and poisoned keys
    through the fused block-max kernel, the score kernel and the public ``msa_indexer``."""
    import torch
    from tilesim.device.backend import resolve
    from tilesim.device.msa_indexer import _run_block_max, msa_indexer, msa_indexer_scores
    from tilesim.shared.msa_indexer import block_head_max, check_meta, check_values

    g = torch.Generator().manual_seed(9)
    q = (torch.randn(4, 128, generator=g) * 0.1).bfloat16()
    k = (torch.randn(IDX_NB * BY, 128, generator=g) * 0.1).bfloat16()
    k[IDX_SEQ:] = torch.randn(k.shape[0] - IDX_SEQ, 128, generator=g).bfloat16()  # garbage
    bad = k.clone()
    tail = bad[IDX_SEQ:]  # NaN, +inf, -inf row after row, and one NaN in a single column
    tail[0::3], tail[1::3], tail[2::3, 7] = NAN, INF, NAN
    tail[2::3, 8] = -INF
    args = check_values(check_meta(q, k, IDX_NB, seq_len=IDX_SEQ))
    target = resolve("sim", soc, q)
    res = {}
    for name, keys in (("clean", k), ("dirty", bad)):
        hm, _ = _run_block_max(q, keys, args, target)  # block_max="device": the raw maxima
        s, _ = msa_indexer_scores(q, keys, IDX_NB, backend="sim", soc=soc, validate=False)
        ids = {
            mode: msa_indexer(
                q, keys, IDX_NB, seq_len=IDX_SEQ, block_max=mode, backend="sim", soc=soc
            )[0].numpy()  # fmt: skip
            for mode in ("device", "host")
        }
        res[name] = {
            "device_max": hm.numpy().view("int32"),
            "host_max": block_head_max(s.numpy(), IDX_NB, IDX_SEQ).view("int32"),
            "scores": s.numpy(),
            "ids": ids,
        }
    return res


@pytest.mark.sim
@pytest.mark.torch
def test_indexer_kernel_key_rows_past_seq_len_never_reach_the_selection(sim_soc):
    import numpy as np
    from tilesim.device import sim

    r = sim.isolated(check_indexer_poison, sim_soc, soc=sim_soc)
    clean, dirty = r["clean"], r["dirty"]
    # block_max="device": the kernel's per-block maxima are the same bits
    np.testing.assert_array_equal(dirty["device_max"], clean["device_max"])
    assert np.isfinite(clean["device_max"].view(np.float32)).all()
    # block_max="host": the host tail on the kernel's scores gives the same maxima
    np.testing.assert_array_equal(dirty["host_max"], clean["host_max"])
    np.testing.assert_array_equal(dirty["host_max"], clean["device_max"])  # max is exact
    for mode in ("device", "host"):
        np.testing.assert_array_equal(dirty["ids"][mode], clean["ids"][mode], err_msg=mode)
    # the control: the score kernel DOES read the poisoned rows (NaN/inf scores there) and
    # gives the same bits on the rows below seq_len
    assert np.isfinite(clean["scores"]).all()
    assert (~np.isfinite(dirty["scores"][:, IDX_SEQ:])).all(axis=0).any()
    np.testing.assert_array_equal(
        dirty["scores"][:, :IDX_SEQ].view(np.int32), clean["scores"][:, :IDX_SEQ].view(np.int32)
    )


# ----------------------------------------------------------------------------- MoE
MOE_COUNTS = (0, 3, 0, 5, 0)  # empty first, middle and last experts
MOE_H, MOE_I, MOE_TAIL = 256, 128, 4  # 4 rows of sorted_tokens past expert_cumsum[-1]
MOE_CONTROL_ROW = 4  # expert 3's second row


def check_moe_poison(soc) -> dict:
    """In the isolated child: a clean call and one with the unrouted rows and the empty
    experts' weights poisoned, plus the routed control row."""
    import numpy as np
    import torch
    from tilesim.device.moe import moe_grouped_gemm
    from tilesim.shared.models import MoeDims
    from tilesim.shared.soc import moe_tiling

    e, n = len(MOE_COUNTS), sum(MOE_COUNTS)
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(n + MOE_TAIL, MOE_H, generator=g) * 0.5).bfloat16()
    w13 = (torch.randn(e * MOE_H, 2 * MOE_I, generator=g) * 0.3).bfloat16()
    w2 = (torch.randn(e * MOE_I, MOE_H, generator=g) * 0.3).bfloat16()
    cs = torch.tensor(np.concatenate([[0], np.cumsum(MOE_COUNTS)]), dtype=torch.int32)
    x_bad, w13_bad, w2_bad = x.clone(), w13.clone(), w2.clone()
    x_bad[n::2], x_bad[n + 1 :: 2] = NAN, -INF  # the rows past the last expert
    for ex, count in enumerate(MOE_COUNTS):
        if count == 0:  # an expert with no tokens: its weights are never read
            w13_bad[ex * MOE_H : (ex + 1) * MOE_H] = NAN if ex % 2 else INF
            w2_bad[ex * MOE_I : (ex + 1) * MOE_I] = NAN
    x_bad[MOE_CONTROL_ROW, 3] = NAN
    dims = MoeDims(e, MOE_H, MOE_I, "silu")
    tiling = moe_tiling("silu", soc)
    outs = [
        moe_grouped_gemm(xx, (a, b), cs, dims, tiling=tiling, backend="sim", soc=soc)[0]
        for xx, a, b in ((x, w13, w2), (x_bad, w13_bad, w2_bad))
    ]
    return {"n": n, "clean": outs[0].view(torch.int16).numpy(),
            "dirty": outs[1].view(torch.int16).numpy()}  # fmt: skip


@pytest.mark.sim
@pytest.mark.torch
def test_moe_kernel_unrouted_rows_and_empty_experts_never_reach_the_output(sim_soc):
    import numpy as np
    from tilesim.device import sim

    r = sim.isolated(check_moe_poison, sim_soc, soc=sim_soc)
    clean, dirty, n = r["clean"], r["dirty"], r["n"]
    assert nonfinite_bf16(clean) == 0 and clean[:n].any()
    others = np.delete(np.arange(clean.shape[0]), MOE_CONTROL_ROW)
    np.testing.assert_array_equal(dirty[others], clean[others])
    assert not dirty[n:].any(), "rows past the last expert keep the fresh output's zeros"
    assert nonfinite_bf16(dirty[MOE_CONTROL_ROW]) > 0, "the control: a routed NaN row shows"
