"""DeepSeek sparse attention kernels, deployability and NaN-robust masking.

* One compile per configuration: the packed INT8 wrapper driven over several batches, lengths
  and ``cur_seq`` (one fixed cache pool, as a serving process has) builds ONE kernel
  (``tilesim.device.compile_stats()``); ``validate=False`` plans the index tensor on the
  inputs' device and runs the masked build (one more variant), with the same bits.
* NaN robustness: every cache row no live entry reads -- unreached rows, the pool's spare rows
  and the stand-in rows that ``-1`` entries gather -- poisoned with NaN, and the entries past
  ``cur_seq`` overwritten with garbage, give output bit-identical to the clean run.
* CPU (no sim): ``kernel_indices_torch`` equals the host plan; shape-only inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

POOL_ROWS = 2048  # the fixed cache pool (rows) every call of the compile-once check uses


def _case(b, acts, seed, *, invalid_frac=0.0):
    import tilesim.reference as reference
    from tilesim.shared.tiling import SaTileShapeConfig

    return reference.dsa_make_case(
        seed=seed, b=b, s1=1, actual_seq=acts, topk=256, quant="int8", layout="pypto",
        tiling=SaTileShapeConfig.preset("decode"), topk_rule="causal",
        invalid_frac=invalid_frac,
    )  # fmt: skip


def _pool(cache: np.ndarray, rows: int = POOL_ROWS) -> np.ndarray:
    """The cache grown to ``rows`` rows of zeros (spare pool rows)."""
    out = np.zeros((rows, cache.shape[1]), dtype=cache.dtype)
    out[: cache.shape[0]] = cache
    return out


def check_compiles_once(soc) -> dict:
    import tilesim.reference as reference
    from tilesim.device import compile_stats, reset_compile_stats
    from tilesim.device.dsa import sparse_attention_antiquant

    reset_compile_stats()
    same = []
    for i, (b, acts) in enumerate([(1, (700,)), (2, (300, 1000)), (3, (40, 513, 256))]):
        case = _case(b, acts, seed=20 + i)
        inp, prm = dict(case["inputs"]), case["params"]
        inp["nope_cache"] = _pool(inp["nope_cache"])
        got, _ = sparse_attention_antiquant(**inp, **prm, backend="sim", soc=soc)
        ref = reference.sparse_attention_antiquant(**inp, **prm)
        same.append(bool(reference.judge(got, ref, case["tolerance"], kind="dsa").passed))
    validated = compile_stats()
    got_nv, _ = sparse_attention_antiquant(**inp, **prm, backend="sim", soc=soc, validate=False)
    return {"validated": validated, "all": compile_stats(), "passed": same,
            "validate_false_same": got_nv.tobytes() == got.tobytes()}  # fmt: skip


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_910b
def test_one_compile_over_batches_and_lengths():
    from tilesim.device import sim

    r = sim.isolated(check_compiles_once, "910b", soc="910b")
    assert r["validated"] == {"dsa_sparse_attention": 1}, r
    assert r["all"] == {"dsa_sparse_attention": 2}, r  # + the masked build of validate=False
    assert all(r["passed"]) and r["validate_false_same"], r


def _poison_unread(inp: dict, prm: dict) -> tuple[dict, int]:
    """A copy of ``inp`` whose every cache row no live entry reads is NaN (reference
    ``poison_rows``), and whose entries past ``cur_seq`` are garbage; returns it and the
    number of poisoned rows."""
    from tilesim.reference.cases.dsa import poison_rows
    from tilesim.shared.layouts.dsa_rows import plan_physical_rows

    rows = inp["nope_cache"].shape[0]
    phys, cur = plan_physical_rows(
        inp["topk_indices"], inp["block_table"], inp["kv_act_seqs"], s1=1, topk=prm["topk"],
        block_size=prm["block_size"], cache_rows=rows,
    )  # fmt: skip
    hit = np.zeros(rows, dtype=bool)
    hit[phys[phys >= 0]] = True
    out = {k: np.array(v, copy=True) for k, v in inp.items()}
    cache = {"nope_cache": out["nope_cache"]}
    poison_rows(cache, ~hit, "pypto")
    past = np.arange(prm["topk"])[None, :] >= cur[:, None]
    out["topk_indices"][:, : prm["topk"]][past] = 10**6  # never read: garbage is fine
    return out, int((~hit).sum())


def check_nan_poison(soc) -> dict:
    from tilesim.device.dsa import sparse_attention_antiquant

    case = _case(2, (300, 600), seed=5, invalid_frac=0.3)
    inp, prm = dict(case["inputs"]), case["params"]
    inp["nope_cache"] = _pool(inp["nope_cache"], inp["nope_cache"].shape[0] + 256)
    ti = inp["topk_indices"]
    ti[ti[:, :256] == 0] = -1  # nobody reads position 0: the stand-in rows are unread
    ti[1, 64:128] = -1
    poisoned, n = _poison_unread(inp, prm)
    clean, _ = sparse_attention_antiquant(**inp, **prm, backend="sim", soc=soc)
    dirty, _ = sparse_attention_antiquant(**poisoned, **prm, backend="sim", soc=soc)
    return {"poisoned": n, "nan": int(np.isnan(clean.astype(np.float32)).sum()),
            "same": clean.tobytes() == dirty.tobytes()}  # fmt: skip


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_910b
def test_nan_in_unread_rows_changes_no_bit():
    from tilesim.device import sim

    r = sim.isolated(check_nan_poison, "910b", soc="910b")
    assert r["poisoned"] > 256 and r["nan"] == 0 and r["same"], r


# ----------------------------------------------------------------------------- builds
def check_builds_by_token_count(soc) -> dict:
    """Child: the wrapper over one cache pool in the large-batch tiling (given, so it runs at
    any count) at ``LARGE_TILING_BUILD_ITEMS[soc] - 1`` and ``LARGE_TILING_BUILD_ITEMS[soc]``
    tokens (s1 1, one group tile per token), judged against the golden twin of the call
    (``golden_keywords``: that tiling and the ``k_steps`` golden) and counted bit for bit;
    then the larger call again with the seeds' build forced (``prepared_launch(jit=)``)."""
    import tilesim.reference as reference
    import torch
    from tilesim.device import _dsa_kernel as kernels
    from tilesim.device import compile_stats, dsa, reset_compile_stats, sim
    from tilesim.shared.dsa import LARGE_TILING_BUILD_ITEMS, golden_keywords
    from tilesim.shared.tiling import SaTileShapeConfig

    reset_compile_stats()
    res = {"passed": [], "differ": [], "twin": []}
    n = LARGE_TILING_BUILD_ITEMS[soc]
    for i, b in enumerate((n - 1, n)):
        case = _case(b, tuple(range(200, 200 + 37 * b, 37)), seed=40 + i)
        inp = dict(case["inputs"])
        prm = {**case["params"], "tiling": SaTileShapeConfig.large_batch()}
        inp["nope_cache"] = _pool(inp["nope_cache"], 4096)
        got, _ = dsa.sparse_attention_antiquant(**inp, **prm, backend="sim", soc=soc)
        twin = golden_keywords(tokens=b, nq=prm["nq"], tiling=prm["tiling"], soc=soc)
        ref = reference.sparse_attention_antiquant(**inp, **{**prm, **twin})
        res["passed"].append(bool(reference.judge(got, ref, case["tolerance"], kind="dsa").passed))
        res["differ"].append(int((got.view(np.uint16) != ref.view(np.uint16)).sum()))
        res["twin"].append(twin.get("accumulation", "exact"))
        res[f"builds_{b}"] = compile_stats()
    seeds = kernels.jit_spec(soc, "online", "seeds")
    run = dsa.prepared_launch("sparse_attention_antiquant", **inp, **prm, jit=seeds,
                              backend="sim", soc=soc)  # fmt: skip
    sim.run_kernel(run["kernel"], [*run["inputs"], *run["outputs"]])
    forced = run["outputs"][0].view(torch.int16).numpy()
    res["same_bits"] = forced.tobytes() == np.asarray(got).view(np.int16).tobytes()
    res["builds"] = compile_stats()
    return res


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_910b
def test_wrapper_picks_the_build_by_token_count():
    """In the large-batch tiling, below ``LARGE_TILING_BUILD_ITEMS`` tokens the seeds' build,
    from it on the large-batch build: a second compiled kernel (the JIT spec is in the compile
    key), with the seeds' bits; both calls bit for bit their golden twin's (``k_steps``)."""
    from tilesim.device import sim
    from tilesim.shared.dsa import LARGE_TILING_BUILD_ITEMS

    n = LARGE_TILING_BUILD_ITEMS["910b"]
    r = sim.isolated(check_builds_by_token_count, "910b", soc="910b")
    assert r[f"builds_{n - 1}"] == {"dsa_sparse_attention": 1}, r
    assert r[f"builds_{n}"] == {"dsa_sparse_attention": 2}, r
    assert r["builds"] == {"dsa_sparse_attention": 2}, r  # the forced seeds' build is reused
    assert r["twin"] == ["k_steps", "k_steps"], r  # the large-batch tiling's golden twin
    assert all(r["passed"]) and r["same_bits"], r
    assert r["differ"] == [0, 0], r  # every element the large-batch tiling's golden twin's


def large_batch_digest(key: str) -> str:
    """Child: the digest of kernel-digest entry ``key``'s case run with the large-batch build
    forced (``prepared_launch(jit=)``; the case itself is too small to pick it)."""
    import tilesim.device as dev
    from digests.golden_digests import digest_of
    from digests.kernel_digests import _case, entries
    from tilesim.device import _dsa_kernel as kernels
    from tilesim.device import dsa, sim
    from tilesim.shared.interop import to_numpy

    family, name, over, soc = dict(entries())[key]
    op_name, case = _case(family, name, over)
    assert hasattr(dev, op_name)
    kw = {k: v for k, v in case["params"].items() if k != "progress"}
    spec = kernels.jit_spec(soc, "online", "large_batch")
    run = dsa.prepared_launch(op_name, **case["inputs"], **kw, jit=spec, backend="sim", soc=soc)
    sim.run_kernel(run["kernel"], [*run["inputs"], *run["outputs"]])
    return digest_of(to_numpy(run["outputs"][0]))


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize(
    "key",
    [
        pytest.param("dsa/int8_pypto@910b", marks=pytest.mark.soc_910b),
        pytest.param("dsa/fp8_kv_split@950", marks=pytest.mark.soc_950),
        pytest.param("dsa/int8_pypto@950", marks=[pytest.mark.soc_950, pytest.mark.slow]),
    ],
)
def test_large_batch_build_keeps_the_committed_digests(key):
    """The large-batch build's output on the kernel-digest cases is the committed digest of the
    seeds' build (tests/digests/kernel_digests.json): its task merges change no bit."""
    import json

    from digests.kernel_digests import DIGEST_FILE
    from tilesim.device import sim

    expected = json.loads(DIGEST_FILE.read_text())[key]
    assert sim.isolated(large_batch_digest, key, soc=key.split("@")[1]) == expected


@pytest.mark.sim
def test_large_batch_build_is_the_seeds_options_with_two_merges():
    """The large-batch spec differs from the seeds' online spec only in the L1 reuse and the
    vector n-buffer merge (docs/ops/dsa.md#kernel, "Builds by token count"), the many-token
    spec from the large-batch one only in the cube n-buffer merge; per-tile mode has neither."""
    pytest.importorskip("pypto")
    from tilesim.device import _dsa_kernel as k

    for soc in ("910b", "950"):
        big = k.jit_spec(soc, "online", "large_batch")
        diff = set(big) ^ set(k.jit_spec(soc, "online"))
        assert {o[1] for o in diff} == {"cube_l1_reuse_setting", "vec_nbuffer_setting"}, diff
        assert dict((o[1], o[2]) for o in big)["cube_l1_reuse_setting"] == ((-1, 4),)
        assert k.jit_spec(soc, "per_tile", "large_batch") == k.jit_spec(soc, "per_tile")
        many = k.jit_spec(soc, "online", "many_tokens")  # one more merge: the cube n-buffer
        diff = set(many) ^ set(big)
        assert {o[1] for o in diff} == {"cube_nbuffer_setting"}, diff
        assert dict((o[1], o[2]) for o in many)["cube_nbuffer_setting"] == ((-1, 4),)
    with pytest.raises(ValueError, match="build"):
        k.jit_spec("950", "online", "huge")


@pytest.mark.sim
@pytest.mark.torch
def test_many_token_tiles_keep_the_k_steps():
    """The many-token build's C1 tiles (``build_tiling``) change only the N / L0 split: the K
    steps (``kL1`` of C1 and C2, which set the bits) and every other build's tiles are the
    call's; a forced build must be one of ``BUILDS`` (``ValueError`` naming ``build``)."""
    from tilesim.device import sim
    from tilesim.shared.dsa import build_tiling
    from tilesim.shared.tiling import SaTileShapeConfig

    big = SaTileShapeConfig.large_batch()
    many = build_tiling(big, "many_tokens")
    assert many.c1_tile[3] == big.c1_tile[3] and many.c2_tile == big.c2_tile
    assert many.c1_tile[2] * many.c1_tile[4] == big.c1_tile[2] * big.c1_tile[4]  # L0B size
    assert many.replace(c1_tile=big.c1_tile) == big
    for build in ("seeds", "large_batch"):
        assert build_tiling(big, build) == big
    assert "build" in sim.isolated(forced_build_error, "910b", soc="910b")


def forced_build_error(soc) -> str:
    """Child: the ``ValueError`` message of a ``prepared_launch`` that forces an unknown
    build beside an option spec of its own (so no ``jit_spec`` lookup sees the name; raised
    before anything compiles); ``""`` if none is raised."""
    from tilesim.device import dsa

    case = _case(1, (200,), seed=3)
    try:
        dsa.prepared_launch("sparse_attention_antiquant", **case["inputs"], **case["params"],
                            jit=(), build="huge", backend="sim", soc=soc)  # fmt: skip
    except ValueError as err:
        return str(err) if "huge" in str(err) else ""
    return ""


def test_kernel_build_rule():
    """The one rule (tilesim.shared.dsa.kernel_build): work items = tokens x group tiles, the
    threshold per SoC."""
    from tilesim.shared.dsa import LARGE_BATCH_ITEMS, kernel_build
    from tilesim.shared.tiling import SaTileShapeConfig

    dec = SaTileShapeConfig.decode()
    assert LARGE_BATCH_ITEMS == {"910b": 7, "950": 6}  # the measured crossovers (the op page)
    for soc, n in LARGE_BATCH_ITEMS.items():
        assert kernel_build(tokens=n - 1, nq=128, tiling=dec, soc=soc) == "seeds"
        assert kernel_build(tokens=n, nq=128, tiling=dec, soc=soc) == "large_batch"
        assert kernel_build(tokens=128, nq=128, tiling=dec, soc=soc) == "large_batch"
        half = dec.replace(g_tile=64)  # two group tiles per token: half the tokens
        assert kernel_build(tokens=-(-n // 2), nq=128, tiling=half, soc=soc) == "large_batch"
        assert kernel_build(tokens=n // 2 - 1, nq=128, tiling=half, soc=soc) == "seeds"
        pre = SaTileShapeConfig.prefill()
        assert kernel_build(tokens=10 * n, nq=128, tiling=pre, soc=soc) == "seeds"
    with pytest.raises(ValueError, match="tokens"):
        kernel_build(tokens=0, nq=128, tiling=dec, soc="950")
    with pytest.raises(ValueError, match="soc"):
        kernel_build(tokens=8, nq=128, tiling=dec, soc="h100")


# ----------------------------------------------------------------------------- CPU only
@pytest.mark.torch
def test_device_plan_equals_the_host_plan():
    import torch
    from tilesim.shared.dsa import check_meta, check_values
    from tilesim.shared.layouts.dsa_kernel_index import kernel_indices, kernel_indices_torch

    case = _case(2, (300, 600), seed=5, invalid_frac=0.3)
    inp, prm = case["inputs"], case["params"]
    a = check_values(check_meta(
        inp["query_nope"], inp["query_rope"], (inp["nope_cache"],), inp["topk_indices"],
        inp["block_table"], inp["kv_act_seqs"], layout=prm["layout"], nq=prm["nq"], n_kv=1,
        softmax_scale=prm["softmax_scale"], topk=prm["topk"], block_size=prm["block_size"],
        tiling=prm["tiling"],
    ))  # fmt: skip
    rows = inp["nope_cache"].shape[0]
    host, col0 = kernel_indices(a)
    assert col0 is not None  # the case has used -1 entries
    dev, dcol0 = kernel_indices_torch(
        *(torch.from_numpy(np.asarray(inp[k])) for k in ("topk_indices", "block_table",
                                                           "kv_act_seqs")),
        s1=1, topk=256, block_size=128, s_kv_tile=prm["tiling"].s_kv_tile, cache_rows=rows,
    )  # fmt: skip
    assert dcol0 == col0 and np.array_equal(dev.numpy(), host)


@pytest.mark.torch
def test_shape_only_inputs_give_the_output_shape():
    import torch
    from tilesim.device.dsa import (
        sparse_attention_antiquant,
        sparse_attention_antiquant_kv_split,
    )

    def m(*shape, dt=torch.bfloat16):
        return torch.empty(*shape, dtype=dt, device="meta")

    ints = (m(3, 2048, dt=torch.int32), m(3, 20, dt=torch.int32), m(3, dt=torch.int32))
    out = sparse_attention_antiquant(m(384, 512), m(384, 64), m(4096, 656, dt=torch.int8), *ints,
                                     softmax_scale=0.04)  # fmt: skip
    assert out.shape == (384, 512) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    fp8 = torch.float8_e4m3fn
    out = sparse_attention_antiquant_kv_split(
        m(384, 512), m(384, 64), m(4096, 512, dt=fp8), m(4096, 64), m(4096, 4, dt=torch.float32),
        *ints, softmax_scale=0.04,
    )  # fmt: skip
    assert out.shape == (384, 512)
    bad = m(3, 100, dt=torch.int32)
    with pytest.raises(ValueError, match="topk_indices"):
        sparse_attention_antiquant(m(384, 512), m(384, 64), m(4096, 656, dt=torch.int8), bad,
                                   *ints[1:], softmax_scale=0.04)  # fmt: skip


#: the seeds' options as docs/ops/dsa.md#kernel records them ("Options per SoC and mode")
_SEEDS_DOC = {
    "online": {
        "pass_options": {"vec_nbuffer_setting": {-1: 1}, "cube_l1_reuse_setting": {-1: 1},
                         "cube_nbuffer_setting": {-1: 1}},
        "runtime_options": {"stitch_function_max_num": 128, "device_sched_mode": 1},
    },
    "per_tile": {
        "pass_options": {"vec_nbuffer_setting": {-1: 2, 0: 4}, "cube_l1_reuse_setting": {-1: 2}},
        "runtime_options": {"stitch_function_max_num": 128, "device_sched_mode": 3},
    },
}  # fmt: skip


@pytest.mark.sim
@pytest.mark.parametrize("mode", ["online", "per_tile"])
def test_jit_options_per_soc_are_seeds_options(mode):
    """Every SoC's option set is a subset of the seeds' (as documented), always with the
    ``ready_on_host`` contract; ``combine_axis`` goes to the kernel body, not to jit."""
    pytest.importorskip("pypto")
    from tilesim.device import _dsa_kernel as k
    from tilesim.device._pypto_common import jit_options

    seeds = jit_options(k.SEED_JIT[mode], ready_on_host=k.READY_ON_HOST)
    host = seeds["runtime_options"].pop("ready_on_host_tensors")
    assert host == ["block_table", "kv_act_seqs"]
    assert seeds == _SEEDS_DOC[mode]
    assert k.combine_axis(k.SEED_JIT[mode]) and not k.combine_axis(())
    for soc in ("910b", "950"):
        spec = k.jit_spec(soc, mode)
        assert set(spec) <= set(k.SEED_JIT[mode]), (soc, spec)
        opts = jit_options(spec, ready_on_host=k.READY_ON_HOST)
        assert opts["runtime_options"]["ready_on_host_tensors"] == host
