"""MSA main branch: one compiled kernel per model configuration, NaN-proof unread key rows on
the simulator, compile checks at the NPU tests' shapes, torch.compile.

* The prefill length ``n`` is a runtime value of the kernel (a dynamic row axis walked by a
  ``pypto.loop`` with a symbolic trip count), so driving the wrapper over n = 1, 100, 500,
  1500 builds ONE kernel (``tilesim.device.compile_stats()``), and each output still passes
  the judge with the sim budget of ``test_msa_main_sim.py`` against the reference (and empty
  rows are +0).
* The key rows no query row sees (padding slots, token positions past ``n``) are zeroed by
  the wrapper: poisoning them with NaN / inf gives the same output bits on the simulator.
* Every shape of the ``npu`` tests (``test_msa_main_sim.py::SEED_CASES``: n 1 ... 4096 at the
  M3 shape, fp32) is compiled through the full pass pipeline on the CPU (compile only; slow).
* torch.compile (CPU, no simulator): a function calling the wrapper traces with
  ``fullgraph=True`` on ``meta`` / FakeTensor inputs (no data to read), and the result has
  the documented shape and dtype.
"""

from __future__ import annotations

import pytest

NS = (1, 100, 500, 1500)
HQ, HKV, TOPK = 16, 1, 4  # one KV group, topk 4 = one 512-key chunk


def _case(n, seed, *, hq=HQ, hkv=HKV, topk=TOPK):
    """Random q/k/v; the selected blocks: the last one and up to topk-1 others in a shuffled
    slot order (block 0 left out when n > 256, so the first rows see no key)."""
    import torch
    from tilesim.reference import build_msa_block_mask

    g = torch.Generator().manual_seed(seed)
    nbq = -(-n // 128)
    others = torch.randperm(nbq - 1, generator=g)[: topk - 1].tolist() if nbq > 1 else []
    if n > 256:
        others = [b for b in others if b != 0] or [1]
    ids = [*others, nbq - 1]
    q = torch.randn(n, hq, 128, generator=g)
    kb = torch.randn(topk * 128, hkv, 128, generator=g)
    vb = torch.randn(topk * 128, hkv, 128, generator=g)
    mask = build_msa_block_mask(n, torch.tensor(ids, dtype=torch.int32), topk=topk)
    return q, kb, vb, mask, ids


def _unread_rows(n, ids, topk=TOPK):
    """bool ``[topk*128]``: padding slots and token positions past ``n`` (from the ids, not
    from the mask)."""
    import torch

    slot = torch.arange(topk * 128) // 128
    pos = (
        torch.tensor([*ids, *([0] * (topk - len(ids)))])[slot] * 128
        + torch.arange(topk * 128) % 128
    )
    return (slot >= len(ids)) | (pos >= n)


def check_one_compile_over_n(soc) -> dict:
    import torch
    from test_msa_main_sim import _judged
    from tilesim.device import compile_stats, reset_compile_stats
    from tilesim.device.msa_main import msa_main_branch
    from tilesim.reference import msa_main_branch as reference

    reset_compile_stats()
    res = {}
    for n in NS:
        q, kb, vb, mask, ids = _case(n, seed=n)
        out, us = msa_main_branch(q, kb, vb, mask, backend="sim", soc=soc)
        gold = reference(q, kb, vb, mask)
        empty = ~(
            mask.view(-1, TOPK, 128, 128).permute(0, 2, 1, 3).reshape(-1, TOPK * 128)[:n] > -1e9
        ).any(1)
        res[n] = {
            "us": us,
            "bit_exact": float((out.view(torch.int32) == gold.view(torch.int32)).float().mean()),
            "max_abs": float((out.double() - gold.double()).abs().max()),
            "scaled": float((out.double() - gold.double()).abs().max() / gold.abs().max()),
            "empty_rows": int(empty.sum()),
            "empty_zero": bool((out[empty].view(torch.int32) == 0).all()),
        }
        v = _judged(out, gold, "fp32", f"n{n}")
        res[n].update(judged=v.passed, verdict=v.summary())
    return {"stats": compile_stats(), "cases": res}


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
def test_main_branch_one_compile_over_n(sim_soc, sim_report):
    from tilesim.device import sim

    r = sim.isolated(check_one_compile_over_n, sim_soc, soc=sim_soc, timeout=1800)
    assert r["stats"] == {"msa_main_branch": 1}, r
    for n, c in r["cases"].items():
        sim_report.add(kernel="msa_main_branch", soc=sim_soc,
                       case=f"one compile n{n} fp32 HQ{HQ}/HKV{HKV} topk{TOPK}",
                       bit_exact=c["bit_exact"], max_ulp=-1, max_abs=c["max_abs"], us=c["us"],
                       extra={"err / max|golden|": c["scaled"]})  # fmt: skip
        assert c["judged"], (n, c["verdict"])
        assert c["empty_zero"] and c["us"] > 0.0, (n, c)
    assert r["cases"][500]["empty_rows"] == 128  # block 0 not selected: rows 0..127 see nothing
    # the cost follows n (a runtime trip count), not a static bound
    assert r["cases"][1]["us"] < r["cases"][500]["us"] < r["cases"][1500]["us"], r


def check_unread_rows_poisoned(soc, dtype) -> dict:
    import torch
    from tilesim.device.msa_main import msa_main_branch

    n = 200
    q, kb, vb, mask, ids = _case(n, seed=7, topk=3)
    ids_unread = _unread_rows(n, ids, topk=3)
    res = {"unread": int(ids_unread.sum())}
    want, _ = msa_main_branch(q, kb, vb, mask, dtype=dtype, backend="sim", soc=soc)
    for name, value in (("nan", float("nan")), ("inf", float("inf"))):
        kp, vp = kb.clone(), vb.clone()
        kp[ids_unread], vp[ids_unread] = value, -value
        got, _ = msa_main_branch(q, kp, vp, mask, dtype=dtype, backend="sim", soc=soc)
        res[name] = bool(torch.equal(got.view(torch.int32), want.view(torch.int32)))
    # the control: a key row that IS read (slot 0, token 0, seen by every later row)
    vp = vb.clone()
    vp[0] = float("nan")
    got, _ = msa_main_branch(q, kb, vp, mask, dtype=dtype, backend="sim", soc=soc)
    res["control_nan_rows"] = int((~torch.isfinite(got)).any(dim=(1, 2)).sum())
    res["finite"] = bool(torch.isfinite(want).all())
    return res


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_main_branch_unread_rows_never_reach_the_output(dtype, sim_soc):
    from tilesim.device import sim

    r = sim.isolated(check_unread_rows_poisoned, sim_soc, dtype, soc=sim_soc)
    assert r["unread"] == 128 + 56, r  # one padding slot + rows 200..255 of block 1
    assert r["finite"] and r["nan"] and r["inf"], r
    assert r["control_nan_rows"] > 0, r


def compile_npu_shapes(soc) -> dict:
    """Compile (no interpretation) the kernel of every ``npu`` test's launch, with the
    wrapper's own operands (row padding included); the registry must build one kernel."""
    from test_msa_main_sim import SEED_CASES
    from tilesim.device import compile_stats, reset_compile_stats, sim
    from tilesim.device.msa_main import npu_launch_args

    reset_compile_stats()
    seconds = {}
    for name, (n, _, max_n, _) in SEED_CASES.items():
        kernel, args = npu_launch_args(n, max_n, soc)
        seconds[name] = sim.run_compile(kernel, args)
    return {"seconds": seconds, "stats": compile_stats()}


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
def test_main_branch_compiles_at_npu_test_shapes(sim_soc):
    from test_msa_main_sim import SEED_CASES
    from tilesim.device import sim

    r = sim.isolated(compile_npu_shapes, sim_soc, soc=sim_soc, timeout=3600)
    assert set(r["seconds"]) == set(SEED_CASES) and all(s > 0 for s in r["seconds"].values()), r
    assert r["stats"] == {"msa_main_branch": 1}, r


# ----------------------------------------------------------------------------- torch.compile
torch = pytest.importorskip("torch")


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.torch
def test_main_branch_traces_without_graph_break():
    import tilesim.device as d

    assert "msa_main_branch" in d.allow_in_graph()
    torch._dynamo.reset()

    def prefill(q, kb, vb, mask):
        out = d.msa_main_branch(q, kb, vb, mask, dtype="bf16")
        return out * 2.0  # the graph goes on after the call

    n = 300  # 3 query blocks, topk 16 -> [2048, 4, 128] key blocks
    args = (_meta(n, 64, 128), _meta(2048, 4, 128), _meta(2048, 4, 128), _meta(3, 16, 128, 128))
    out = torch.compile(prefill, backend="eager", fullgraph=True)(*args)
    assert out.shape == (n, 64, 128) and out.dtype == torch.float32 and out.device.type == "meta"


@pytest.mark.torch
def test_main_branch_fake_tensors_and_metadata_checks():
    from tilesim.device.msa_main import msa_main_branch
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    with FakeTensorMode():
        q = torch.empty(5, 16, 128, dtype=torch.bfloat16)
        kb = torch.empty(256, 1, 128, dtype=torch.bfloat16)
        mask = torch.empty(1, 2, 128, 128)
        out = msa_main_branch(q, kb, kb, mask)
    assert is_fake(out) and out.shape == (5, 16, 128) and out.dtype == torch.float32
    q, kb = _meta(5, 16, 128), _meta(256, 1, 128)
    with pytest.raises(ValueError, match="block_mask: expected shape"):
        msa_main_branch(q, kb, kb, _meta(2, 2, 128, 128))
    with pytest.raises(TypeError, match="block_mask: expected dtype"):
        msa_main_branch(q, kb, kb, _meta(1, 2, 128, 128, dtype=torch.float16))
    with pytest.raises(ValueError, match="backend: expected one of"):
        msa_main_branch(q, kb, kb, _meta(1, 2, 128, 128), backend="cuda")
