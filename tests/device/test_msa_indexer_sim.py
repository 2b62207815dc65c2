"""MSA lightning-indexer score kernel on PyPTO's CPU simulator (910B, 950) vs tilesim.reference.

Budget (docs/ops/msa_indexer.md#kernel), against ``tilesim.reference.msa_indexer_scores`` /
``msa_indexer``:

1. scores (FP32): every element within ``128 * 2**-24 * sum_d |q_d k_d|`` of the reference (the
   FP32 dot-product error bound for any summation order: the reference rounds the exact sum
   once, PyPTO's interpreter sums in libtorch's FP32 order); the fraction of bit-identical
   scores is reported, not promised;
2. block ids: identical to the reference's (same ids, same order) on every case, ranked on
   the device (``rank="device"``, the default: the fused select kernel) and on the host; and
   the verdict of :func:`tilesim.reference.judge` passes on the ids (per-row sets) and on the
   scores (relative-L2 / cosine bounds per head and over the tensor);
3. ``block_max="device"`` (block max fused into the kernel): per-head block maxima equal to
   those of the unfused kernel's scores bit for bit, ids identical to the reference's;
3b. the device ranking on crafted block maxima (ties across the selection boundary, all-equal
   rows, -inf and NaN blocks with ``validate=False``) equals an independent Python sort and
   the shared rule, and builds one kernel per head mode over nb 17, 18, 40;
4. the host tail (:func:`tilesim.shared.msa_indexer.select_blocks`, the one rule the reference
   and the wrapper both apply, re-exported by the device module) reproduces an independent
   Python ``sorted`` selection on given scores -- including ties, +-1e20 and one-BF16-step
   neighbours -- for torch and NumPy scores alike;
5. the wrapper takes NumPy arrays as well as torch tensors and returns the same kind.
"""

from __future__ import annotations

import pytest

# name -> (nb, seq_len, data). Every case has a partial last block where seq_len is given.
CASES = {
    "nb5 seq600": (5, 600, "randn"),  # short context: arange(nb), scores still checked
    "nb17 seq2100": (17, 2100, "randn"),  # the shortest sparse path, 52 keys in the last block
    "nb40 seq5050": (40, 5050, "randn"),
    "nb18 all-zero ties": (18, None, "zeros"),  # MiniMax's tie test: [0..14, 17]
}


def _case(nb, data, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    if data == "zeros":
        return torch.zeros(4, 128, dtype=torch.bfloat16), torch.zeros(
            nb * 128, 128, dtype=torch.bfloat16
        )
    q = (torch.randn(4, 128, generator=g) * 0.1).bfloat16()
    k = (torch.randn(nb * 128, 128, generator=g) * 0.1).bfloat16()
    return q, k


def check_indexer(spec, soc, seed=11) -> dict:
    import numpy as np
    import torch
    from tilesim.device.backend import resolve
    from tilesim.device.msa_indexer import _run_block_max, msa_indexer, msa_indexer_scores
    from tilesim.reference import msa_indexer as ref_ids
    from tilesim.reference import msa_indexer_scores as ref_scores
    from tilesim.shared.interop import to_numpy
    from tilesim.shared.msa_indexer import check_meta, check_values

    nb, seq_len, data = spec
    q, k = _case(nb, data, seed)
    before = (q.clone(), k.clone())
    s, us = msa_indexer_scores(q, k, nb, backend="sim", soc=soc)
    gold = ref_scores(q, k, nb)
    bound = 128 * 2.0**-24 * (q.double().abs() @ k.double().abs().T)
    err = (s.double() - gold.double()).abs()
    ids, us_ids = msa_indexer(q, k, nb, seq_len=seq_len, backend="sim", soc=soc)
    want = ref_ids(q, k, nb, seq_len=seq_len)
    # NumPy in -> NumPy out (the reference's input policy)
    q_np, k_np = to_numpy(q), to_numpy(k)
    per_head, _ = msa_indexer(
        q_np, k_np, nb, seq_len=seq_len, head_reduce="none", backend="sim", soc=soc
    )
    want_ph = ref_ids(q, k, nb, seq_len=seq_len, head_reduce="none")
    # the fused variant: block maxima on the device, ids from them
    args = check_values(check_meta(q, k, nb, seq_len=seq_len))
    hm, us_fused = _run_block_max(q, k, args, resolve("sim", soc, q))
    masked = s.clone()
    masked[:, seq_len or nb * 128 :] = -torch.inf
    # rank="host": the shared rule on a host copy of the fused kernel's block maxima
    ids_f, _ = msa_indexer(q, k, nb, seq_len=seq_len, rank="host", block_max="device",
                           backend="sim", soc=soc)  # fmt: skip
    ph_f, _ = msa_indexer(q, k, nb, seq_len=seq_len, head_reduce="none", rank="host",
                          block_max="device", backend="sim", soc=soc)  # fmt: skip
    return {
        "us": us,
        "us_fused": us_fused,
        "fused_max_exact": bool(torch.equal(hm, masked.reshape(4, nb, 128).amax(dim=2))),
        "fused_same_ids": bool(torch.equal(ids_f, want)) and bool(torch.equal(ph_f, want_ph)),
        "us_ids": us_ids,
        "bit_exact": float(np.mean(s.view(torch.int32).numpy() == gold.view(torch.int32).numpy())),
        "max_abs": float(err.max()),
        "bound_ratio": float((err / bound.clamp_min(2.0**-149)).max()),
        "max_ulp": int(_ulp32(s, gold)),
        "ids": ids.tolist(),
        "same_ids": bool(torch.equal(ids, want)),
        "same_per_head": isinstance(per_head, np.ndarray)
        and per_head.dtype == np.int32
        and np.array_equal(per_head, want_ph.numpy()),
        "ids_dtype": str(ids.dtype),
        "inputs_kept": torch.equal(before[0], q) and torch.equal(before[1], k),
        **_judged(s, gold, ids, want),
    }


def _judged(s, gold, ids, want) -> dict:
    """The judge's verdicts of the scores and the ids against the reference's."""
    from tilesim.reference import judge
    from tilesim.shared.interop import to_numpy

    scores = judge(to_numpy(s), to_numpy(gold), {"mode": "ulp"}, kind="msa_indexer_scores")
    tol = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "set"}
    sets = judge(to_numpy(ids), to_numpy(want), tol, kind="msa_indexer")
    return {"judged": scores.passed and sets.passed,
            "verdict": f"{scores.summary()}\n{sets.summary()}"}  # fmt: skip


def _ulp32(a, b) -> int:
    from tilesim.reference.util.numerics import ulp_distance

    return int(ulp_distance(a.numpy(), b.numpy()).max())


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("name", list(CASES))
def test_indexer_kernel_matches_reference(name, sim_soc, sim_report):
    from tilesim.device import sim

    r = sim.isolated(check_indexer, CASES[name], sim_soc, soc=sim_soc)
    sim_report.add(
        kernel="msa_indexer_scores",
        soc=sim_soc,
        case=name,
        bit_exact=r["bit_exact"],
        max_ulp=r["max_ulp"],
        max_abs=r["max_abs"],
        us=r["us"],
        extra={
            "error / FP32 dot bound": r["bound_ratio"],
            "ids = reference": r["same_ids"],
            "fused block-max µs": r["us_fused"],
        },
    )
    assert r["inputs_kept"]
    assert r["judged"], r["verdict"]
    assert r["bound_ratio"] <= 1.0, r
    assert r["same_ids"], r
    assert r["same_per_head"], r
    assert r["ids_dtype"] == "torch.int32"
    # fused block max (block_max="device"): max is exact, so the maxima equal those of the
    # unfused kernel's scores bit for bit and the ids are the reference's
    assert r["fused_max_exact"], r
    assert r["fused_same_ids"], r
    nb = CASES[name][0]
    assert len(r["ids"][0]) == min(16, nb) and r["ids"][0][-1] == nb - 1
    assert len(set(r["ids"][0])) == len(r["ids"][0])
    if "ties" in name:
        assert r["ids"] == [list(range(15)) + [17]]
    if nb <= 16:
        assert r["us_ids"] == 0.0  # short context launches nothing
    else:
        assert r["us"] > 0.0 and r["us_ids"] > 0.0


# ----------------------------------------------------------------------------- device ranking
def _keys_from_head_max(hm, e=0):
    """BF16 ``q [4, 128]``, ``k [nb*128, 128]`` with per-head block maxima ``2**e * hm``
    (``hm`` ``[4, nb]``, BF16 values), and those maxima as FP32 ``[4, nb]`` from the BF16 data
    in float64. Head ``h`` reads column ``h`` only (``q`` = ``2**e`` one-hot) and every key of
    block ``b`` holds ``hm[h, b]`` there, so each score is one product, exact up to FP32
    overflow (``e = 100`` turns +-3e38 into +-inf), and a block's max is that product."""
    import numpy as np
    import torch

    nb = hm.shape[1]
    q = torch.zeros(4, 128, dtype=torch.bfloat16)
    q[torch.arange(4), torch.arange(4)] = 2.0**e
    k = torch.zeros(nb * 128, 128, dtype=torch.bfloat16)
    k[:, :4] = torch.from_numpy(hm).T.repeat_interleave(128, dim=0).bfloat16()
    with np.errstate(over="ignore", invalid="ignore"):
        want = (k[::128, :4].T.double().numpy() * 2.0**e).astype(np.float32)
    return q, k, want


def _sorted_rule(score, nb):
    """Independent oracle: Python ``sorted`` on (NaN last, score descending, lower id first)
    over blocks ``0 .. nb-2``, the best 15, then the local block."""
    import math

    def key(b):
        v = float(score[b])
        return (math.isnan(v), 0.0 if math.isnan(v) else -v, b)

    return sorted(range(nb - 1), key=key)[:15] + [nb - 1]


def _rank_cases(rng):
    """name -> (BF16 values [4, nb] for :func:`_keys_from_head_max`, head_reduce, e)."""
    import numpy as np

    cases = {}
    hm = np.zeros((4, 40), dtype=np.float32)  # ties across the boundary: 12 at 1.0, 8 at 0.5
    order = rng.permutation(39)
    hm[rng.integers(4, size=12), order[:12]] = 1.0
    hm[rng.integers(4, size=8), order[12:20]] = 0.5
    hm[:, 39] = 2.0  # the local block: kept, never ranked
    cases["nb40 boundary ties"] = (hm, "max", 0)
    hm = rng.choice(np.array([0.5, 0.25, -0.0, 0.0], dtype=np.float32), (4, 18))
    cases["nb18 per-head ties"] = (hm, "none", 0)
    cases["nb40 all-zero per head"] = (np.zeros((4, 40), dtype=np.float32), "none", 0)
    # 17 ranked blocks, 15 picked: +inf first, then the numbers, the -inf blocks, the
    # lowest NaN block; two NaN blocks left out (NaN: validate=False only)
    hm = rng.choice(np.array([1.0, 0.5, -1.0], dtype=np.float32), (4, 18))
    hm[:, [1, 4]] = -3e38  # * 2**100: -inf in every head
    hm[0, 6] = 3e38  # +inf in one head
    hm[:, [0, 3, 8]] = np.nan
    cases["nb18 inf and NaN"] = (hm, "max", 100)
    cases["nb17 random"] = (rng.standard_normal((4, 17)).astype(np.float32), "none", 0)
    return cases


def check_device_rank(soc) -> dict:
    import numpy as np
    from tilesim.device import compile_stats, reset_compile_stats
    from tilesim.device.msa_indexer import msa_indexer
    from tilesim.shared.msa_indexer import select_from_head_max

    reset_compile_stats()
    res = {}
    for name, (vals, hr, e) in _rank_cases(np.random.default_rng(5)).items():
        q, k, hm = _keys_from_head_max(vals, e)
        nb = hm.shape[1]
        ids, us = msa_indexer(q, k, nb, seq_len=nb * 128 - 3, head_reduce=hr, backend="sim",
                              soc=soc, validate=False)  # fmt: skip
        rows = [hm.max(axis=0)] if hr == "max" else list(hm)  # np.max: NaN propagates
        res[name] = {
            "ids": ids.tolist(),
            "sorted": [_sorted_rule(r, nb) for r in rows],
            "shared": select_from_head_max(hm, nb, head_reduce=hr).tolist(),
            "us": us,
            "device": str(ids.device),
        }
    for nb in (1, 16):  # short contexts: arange, no kernel
        q, k, _ = _keys_from_head_max(np.zeros((4, nb), dtype=np.float32))
        ids, us = msa_indexer(q, k, nb, backend="sim", soc=soc)
        res[f"nb{nb}"] = {"ids": ids.tolist(), "us": us}
    res["stats"] = compile_stats()
    return res


@pytest.mark.sim
@pytest.mark.torch
def test_device_rank_keeps_the_shared_rule(sim_soc):
    from tilesim.device import sim

    r = sim.isolated(check_device_rank, sim_soc, soc=sim_soc)
    for name in ("nb40 boundary ties", "nb18 per-head ties", "nb40 all-zero per head",
                 "nb18 inf and NaN", "nb17 random"):  # fmt: skip
        c = r[name]
        assert c["ids"] == c["sorted"], (name, c)
        assert c["ids"] == c["shared"], (name, c)
        assert c["us"] > 0.0 and c["device"] == "cpu"
    assert r["nb40 all-zero per head"]["ids"] == [list(range(15)) + [39]] * 4
    ties = r["nb40 boundary ties"]["ids"][0]
    assert len(set(ties[12:15])) == 3 and ties[12:15] == sorted(ties[12:15])  # the 0.5 group
    nan_ids = r["nb18 inf and NaN"]["ids"][0]
    assert nan_ids[0] == 6 and nan_ids[-4:] == [1, 4, 0, 17], nan_ids
    assert r["nb1"] == {"ids": [[0]], "us": 0.0}
    assert r["nb16"] == {"ids": [list(range(16))], "us": 0.0}
    # one kernel per head mode over nb 17, 18, 40 (nb is a runtime value)
    assert r["stats"] == {"msa_indexer_select": 2}, r["stats"]


# ----------------------------------------------------------------------------- no simulator
torch = pytest.importorskip("torch")


def _scores_from(block_scores, rng):
    """FP32 [4, nb*128] scores whose per-block max over heads and keys is ``block_scores``."""
    nb = len(block_scores)
    s = torch.full((4, nb * 128), -1e30, dtype=torch.float32)
    for b, v in enumerate(block_scores):
        h, t = int(rng.integers(4)), int(rng.integers(128))
        s[h, b * 128 + t] = float(v)
    return s


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["ties", "huge", "bf16_neighbours", "random", "zeros_signed"])
@pytest.mark.parametrize("nb", [17, 18, 32, 33])
def test_tail_reproduces_reference_selection(kind, nb, rng):
    """select_blocks on given scores == an independent rule (Python sort on (-score, id))."""
    import numpy as np
    from tilesim.shared import msa_indexer as contract
    from tilesim.shared.msa_indexer import select_blocks

    if kind == "ties":
        bs = np.full(nb, 0.5, dtype=np.float32)
        bs[::3] = 0.25
    elif kind == "huge":
        bs = rng.choice(np.array([1e20, -1e20, 0.0], dtype=np.float32), nb)
    elif kind == "bf16_neighbours":  # 1.0 and the next BF16 values above/below
        bs = rng.choice(np.array([1.0, 1.0078125, 0.99609375], dtype=np.float32), nb)
    elif kind == "zeros_signed":
        bs = rng.choice(np.array([0.0, -0.0], dtype=np.float32), nb)
    else:
        bs = rng.standard_normal(nb).astype(np.float32)
    s = _scores_from(bs, rng)
    got = select_blocks(s, nb)
    # independent rule: python sort on (-score, id) -- score descending, lower id first
    ranked = sorted(range(nb - 1), key=lambda b: (-float(bs[b]), b))[:15]
    assert got.tolist() == [ranked + [nb - 1]]
    assert got.dtype == torch.int32
    assert select_blocks is contract.select_blocks  # one rule, not a torch twin
    got_np = select_blocks(s.numpy(), nb)  # NumPy scores -> NumPy ids
    assert isinstance(got_np, np.ndarray) and got_np.tolist() == got.tolist()


@pytest.mark.torch
def test_tail_seq_len_excludes_padding_rows(rng):
    from tilesim.shared.msa_indexer import select_blocks

    nb = 20
    s = torch.zeros(4, nb * 128)
    s[2, (nb - 1) * 128 + 100] = 5.0  # in the local block: never ranked anyway
    s[1, 7 * 128 + 3] = 1.0
    s[:, (nb - 1) * 128 + 10 :] = 9.0  # beyond seq_len = (nb-1)*128 + 10
    got = select_blocks(s, nb, seq_len=(nb - 1) * 128 + 10)
    assert got[0, 0] == 7 and got[0, -1] == nb - 1
    per_head = select_blocks(s, nb, seq_len=(nb - 1) * 128 + 10, head_reduce="none")
    assert per_head.shape == (4, 16) and per_head[1, 0] == 7 and (per_head[:, -1] == nb - 1).all()


@pytest.mark.torch
@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"nb": 0}, ValueError, r"nb: expected an int in \[1, inf\]"),
        ({"nb": 2.0}, TypeError, "nb: expected an int"),
        ({"nb": 3}, ValueError, r"idx_k: expected shape \(384, 128\)"),
        ({"seq_len": 128}, ValueError, "seq_len: expected an int with 128 < seq_len <= 256"),
        ({"head_reduce": "mean"}, ValueError, "head_reduce: expected one of"),
        ({"block_max": "npu"}, ValueError, "block_max: expected one of"),
        ({"rank": "npu"}, ValueError, "rank: expected one of"),
        ({"rank": "device", "block_max": "host"}, ValueError, "block_max: 'host' puts"),
        ({"backend": "tpu"}, ValueError, "backend: expected one of"),
        ({"q": torch.zeros(4, 128)}, TypeError, "idx_q: expected dtype bfloat16"),
        ({"q": [[0.0] * 128] * 4}, TypeError, "idx_q: expected a numpy array or a torch tensor"),
        ({"seq_len": 200.0}, TypeError, "seq_len: expected an int"),
        ({"backend": "auto"}, ValueError, "backend='sim'"),
        ({"q": torch.zeros(5, 128, dtype=torch.bfloat16)}, ValueError, "idx_q: expected shape"),
    ],
)
def test_bad_arguments_name_the_argument(kw, exc, match):
    from tilesim.device.msa_indexer import msa_indexer

    a = {"q": torch.zeros(4, 128, dtype=torch.bfloat16), "nb": 2, "backend": "sim"}
    a.update(kw)
    k = torch.zeros(256, 128, dtype=torch.bfloat16)
    extra = {x: a[x] for x in ("seq_len", "head_reduce", "rank", "block_max") if x in a}
    with pytest.raises(exc, match=match):
        msa_indexer(a["q"], k, a["nb"], backend=a["backend"], **extra)


@pytest.mark.parametrize(
    ("rank", "block_max", "nb", "want"),
    [
        (None, None, 17, ("device", "device")),
        (None, "device", 17, ("device", "device")),
        (None, "host", 17, ("host", "host")),
        ("host", None, 17, ("host", "host")),
        ("host", "device", 40, ("host", "device")),
        ("device", None, 1024, ("device", "device")),
        (None, None, 1025, ("host", "host")),  # beyond the widest device row
    ],
)
def test_rank_modes(rank, block_max, nb, want):
    from tilesim.device.msa_indexer import rank_width, resolve_rank

    assert resolve_rank(rank, block_max, nb) == want
    assert [rank_width(n) for n in (1, 17, 40, 1024, 1025)] == [1024] * 4 + [None]


def test_rank_device_refuses_rows_wider_than_its_buckets():
    from tilesim.device.msa_indexer import resolve_rank

    with pytest.raises(ValueError, match="rank: 'device' ranks at most nb=1024"):
        resolve_rank("device", None, 1025)


@pytest.mark.torch
def test_key_tile_env_and_soc_defaults():
    from tilesim.device.msa_indexer import KTILE, key_tile

    assert key_tile("910b", env={}) == KTILE["910b"]
    assert key_tile("950", env={}) == KTILE["950"]
    assert key_tile("910b", env={"MSA_INDEXER_KTILE": "256"}) == 256
    with pytest.raises(ValueError, match="MSA_INDEXER_KTILE: expected a positive multiple"):
        key_tile("910b", env={"MSA_INDEXER_KTILE": "200"})


# ----------------------------------------------------------------------------- NPU (nox -s device)
@pytest.mark.npu
@pytest.mark.torch
@pytest.mark.parametrize("nb", [8, 17])
def test_npu_indexer_seed_cases(nb):
    """The seeds' indexer cases on an NPU: ``torch.manual_seed(nb)``, idx q/k ``randn * 0.1``;
    pass rule as the seeds (shape and SET equality with the reference). Not run on CPU."""
    from tilesim.device.msa_indexer import msa_indexer
    from tilesim.reference import msa_indexer as reference

    torch.manual_seed(nb)
    q = (torch.randn(4, 128) * 0.1).bfloat16()
    k = (torch.randn(nb * 128, 128) * 0.1).bfloat16()
    ids = msa_indexer(q.npu(), k.npu(), nb)
    want = reference(q, k, nb)
    assert tuple(ids.shape) == (1, min(16, nb))
    assert set(ids.flatten().tolist()) == set(want.flatten().tolist())
