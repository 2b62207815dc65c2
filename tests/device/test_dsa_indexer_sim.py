"""DeepSeek-V3.2 lightning indexer kernel on PyPTO's CPU simulator (910B INT8, 950 FP8).

What is asserted, per SoC (910B: the INT8 path; 950: the FP8 path):

1. scores (FP32 ``[T, S]``): bit for bit the independent oracle
   :func:`oracles.dsa_indexer.oracle_indexer` (``tests/oracles/dsa_indexer.py``: one row at a
   time over its visible keys gathered by hand, exact dots, the FP16 roundings of the INT8 path,
   the kernel's pairwise head-sum tree in FP32, the k scale), ``-inf`` at every position a row
   does not see (FP8: on integer E4M3 codes, where every dot is exact in FP32 in any summation
   order; the ``"wide codes"`` case only within the FP32 dot bound: PyPTO's interpreter sums a
   matmul in libtorch's order); against the golden :func:`tilesim.reference.dsa_indexer` (which
   models the same head-sum tree) bit for bit wherever the oracle is exact, else within the FP32
   dot bound; the ids then equal the golden's and the oracle's (the same scores, the same tie
   rule);
2. ids: equal to the shared rule :func:`tilesim.shared.dsa_indexer.select_topk` on the
   kernel's own scores AND to the oracle's independent Python sort on ``(-score, position)``
   (:func:`oracles.dsa_indexer.oracle_topk`) --
   including rows with ties at several levels across the boundary, all-tie rows, rows
   shorter than ``topk`` (``-1`` padding) and rows at ``topk - 1``, ``topk``, ``topk + 1``;
3. NaN-poisoned cache rows the rows never see (other blocks, the tail of the last block,
   INT8 k scales / FP8 codes and scales) change no output bit;
4. NumPy in -> NumPy out, torch in (``validate=False``) -> torch out with the same bits,
   inputs untouched, one compile for several batches / lengths / ``s1``.

The small cases use ``topk = 64`` and 64-token blocks so that each interprets in seconds (the
selection's logic does not depend on ``k``), plus one case at DeepSeek's sizes (topk 2048,
128-token blocks, rows at 2048 / 2049 / 4099 / 4100 visible tokens). Compile checks at the NPU
test shapes (decode b4 s2 and, ``slow``, b64 s2 over 64K). The cost-model rows (decode b4 s2 /
b64 s2 over 64K, cost only, with the HBM bound, the matmul-only probe
``tests/probes/dsa_indexer_probe.py`` and the selection's share = 1 - scores-only build /
kernel) are ``slow``: the four (b4 and b64 on both SoCs) took 15 min in one loaded session.
"""

from __future__ import annotations

import numpy as np
import pytest

TOPK = 64
BS = 64


# ----------------------------------------------------------------------------- case builder
def make_case(path, lens, s1, *, seed=0, topk=TOPK, bs=BS, data="randn", num_blocks=40,
              cols=16):  # fmt: skip
    """Inputs of one decode call (NumPy, the contract's dtypes) with random paged blocks.

    ``data``: ``"randn"`` random codes (FP8: integers in [-16, 16], so that every dot is exact
    in FP32 whatever the summation order; ``"wide"``: up to ~+-40, where it is not);
    ``"levels"`` keys drawn from 16 distinct rows and one k
    scale (scores tie at several levels); ``"zeros"`` every score 0 (all-tie rows). The
    ``num_blocks`` physical blocks (a fixed pool: one compile) include some no row uses (the
    NaN-poison test fills them)."""
    from tilesim.shared.casts import FP8_E4M3
    from tilesim.shared.layouts.index_cache import pack_fp8_pages

    g = np.random.default_rng(seed)
    b, t = len(lens), len(lens) * s1
    nblk = [-(-n // bs) for n in lens]
    nb = num_blocks
    bt = np.full((b, cols), -1, np.int32)
    perm = g.permutation(nb)
    start = np.concatenate([[0], np.cumsum(nblk)])
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[start[i] : start[i] + n]
    if path == "int8":
        q = g.integers(-127, 128, (t, 64, 128)).astype(np.int8)
        codes = g.integers(-127, 128, (nb, bs, 128)).astype(np.int8)
    elif data == "wide":  # E4M3 codes up to ~+-40: the FP32 dots may round (order-dependent)
        q = g.standard_normal((t, 64, 128)).astype(FP8_E4M3)
        codes = (g.standard_normal((nb, bs, 128)) * 8).astype(FP8_E4M3)
    else:  # integer E4M3 codes in [-16, 16]: every dot is exact in FP32, in any order
        q = g.integers(-16, 17, (t, 64, 128)).astype(FP8_E4M3)
        codes = g.integers(-16, 17, (nb, bs, 128)).astype(FP8_E4M3)
    ks = g.uniform(0.001, 0.02, (nb, bs))
    if data == "levels":
        codes = codes[0, :16][g.integers(0, 16, (nb, bs))]
        ks[:] = 0.01
    elif data == "zeros":
        codes = np.zeros_like(codes)
    inp = {"block_table": bt, "seq_lens": np.asarray(lens, np.int32)}
    if path == "int8":
        inp.update(q=q, q_scale=g.uniform(0.001, 0.02, (t, 64)).astype(np.float16),
                   weights=g.standard_normal((t, 64)).astype(np.float16), k_cache=codes,
                   k_scale=ks.astype(np.float16))  # fmt: skip
    else:
        scales = (ks * 5).astype(np.float32)
        inp.update(q=q, weights=(g.standard_normal((t, 64)) * 0.1).astype(np.float32),
                   k_cache=pack_fp8_pages(codes, scales))  # fmt: skip
    return inp, {"path": path, "topk": topk, "block_size": bs}


def poison(inp, prm):
    """A copy of the case with NaN in every cache entry no row sees: spare blocks and the
    tail of each batch's last block (INT8: the k scales; FP8: codes and scales)."""
    from tilesim.shared.layouts.index_cache import fp8_scale_offset

    out = {k: np.array(v, copy=True) for k, v in inp.items()}
    bs = prm["block_size"]
    seen = np.zeros((out["k_cache"].shape[0], bs), bool)
    for b, n in enumerate(out["seq_lens"].tolist()):
        for p in range(n):
            seen[out["block_table"][b, p // bs], p % bs] = True
    if prm["path"] == "int8":
        out["k_scale"][~seen] = np.float16(np.nan)
        return out
    off = fp8_scale_offset(bs)
    pages = out["k_cache"]
    blk, tok = np.nonzero(~seen)
    for j in range(128):
        pages[blk, tok * 128 + j] = 0x7F  # E4M3 NaN
    for j in range(4):
        pages[blk, off + 4 * tok + j] = 0xFF  # FP32 NaN (0xFFFFFFFF)
    return out


# ----------------------------------------------------------------------------- the bound
def _visible(inp, s1):
    lens = inp["seq_lens"].astype(np.int64)
    return np.concatenate([[n - (s1 - 1 - r) for r in range(s1)] for n in lens])


def _row_keys(inp, prm, b, n):
    """Codes float64 ``[n, 128]`` and scales float64 ``[n]`` of batch ``b``'s first ``n``
    tokens, read through the block table (the FP8 page split by hand, not by the packer)."""
    from tilesim.shared.casts import FP8_E4M3

    bs = prm["block_size"]
    pos = np.arange(n)
    blk = inp["block_table"][b, pos // bs]
    if prm["path"] == "int8":
        return inp["k_cache"][blk, pos % bs].astype(np.float64), inp["k_scale"][blk, pos % bs]
    pages = inp["k_cache"][blk]
    tok = (pos % bs)[:, None]
    codes = np.take_along_axis(pages, tok * 128 + np.arange(128), 1).view(FP8_E4M3)
    sc = np.take_along_axis(pages, bs * 128 + tok * 4 + np.arange(4), 1).copy().view("<f4")
    return codes.astype(np.float64), sc[:, 0]


# ----------------------------------------------------------------------------- child checks
def run_kernel(inp, prm, soc):
    """``((ids, scores), cost_us)`` of the kernel on the simulator, NumPy in."""
    from tilesim.device.dsa_indexer import dsa_indexer

    return dsa_indexer(**inp, **prm, backend="sim", soc=soc)


def run_traced(inp, prm, soc, tiling=None, build=None):
    """``((ids, scores), us, roots, params, build)`` of one kernel call on the simulator under
    ``sim.record_roots``: ``roots`` = the root functions its device control flow ran,
    ``params`` = the build's static parameters, ``build`` its name. ``tiling`` and ``build``
    None: the public call (:func:`run_kernel`: the production tiling, the call's build); else
    the launch that call makes, built with ``tiling`` and forced to ``build``
    (``prepared_launch``), NumPy out."""
    from tilesim.device import backend, sim
    from tilesim.device.dsa_indexer import prepared_launch

    forced = {k: v for k, v in (("tiling", tiling), ("build", build)) if v is not None}
    run = prepared_launch(**inp, **prm, soc=soc, **forced)
    with sim.record_roots() as roots:
        if not forced:
            out, us = run_kernel(inp, prm, soc)
        else:
            us = backend.launch(run["kernel"], run["inputs"], run["outputs"], run["target"])
            width = inp["block_table"].shape[1] * prm["block_size"]
            out = (run["outputs"][1].numpy(), run["outputs"][0][:, :width].numpy())
    return out, us, roots[0], run["params"], run["build"]


def planned_chunks(inp, s1, params) -> dict:
    """Per row-group size (2: a pair, 1: an odd ``s1``'s last row), the union over batches of
    the kernel's host plan (:func:`tilesim.device._dsa_indexer_kernel.group_chunks`): the
    unroll factors its chunks use, and how many whole-span chunks, tail spans and spans past
    the rows there are."""
    from tilesim.device._dsa_indexer_kernel import group_chunks

    out = {}
    for seq in inp["seq_lens"].tolist():
        groups = [(2, seq - (s1 - 2 - 2 * g)) for g in range(s1 // 2)] + [(1, seq)] * (s1 % 2)
        for rows, last in groups:
            plan = group_chunks(params, -(-last // params.bs))
            acc = out.setdefault(rows, {"factors": set(), "span_chunks": 0, "tail": 0,
                                        "spans_past": 0})  # fmt: skip
            acc["factors"] |= {u for _, u in plan["chunks"]}
            for key in ("span_chunks", "tail", "spans_past"):
                acc[key] += plan[key]
    return out


def branches_ran(roots) -> dict:
    """Per row-group size, from the root functions the control flow ran: the unroll factors
    of the chunks that ran (PyPTO names a ``loop_unroll`` body's root ``TENSOR_<loop>_
    LoopUnroll<u>_...``; the block loop is ``LI_CHUNK<rows>``) and whether a tail span's
    selection (``LI_TAIL<rows>``) ran."""
    import re

    out = {}
    for name in roots:
        m = re.match(r"TENSOR_LI_(CHUNK|TAIL)(\d+)_(?:LoopUnroll(\d+)_)?", name)
        if m is None:
            continue
        acc = out.setdefault(int(m[2]), {"factors": set(), "tail": False})
        if m[1] == "TAIL":
            acc["tail"] = True
        else:
            acc["factors"].add(int(m[3]))
    return out


def check_case(inp, prm, s1, soc, tiling=None, build=None) -> dict:
    from oracles.dsa_indexer import oracle_indexer, oracle_topk
    from tilesim.reference import dsa_indexer as golden
    from tilesim.shared.dsa_indexer import select_topk

    before = {k: np.array(v, copy=True) for k, v in inp.items()}
    (ids, scores), us, roots, params, build_name = run_traced(inp, prm, soc, tiling, build)
    plan = planned_chunks(inp, s1, params)
    vis = _visible(inp, s1)
    want_ids, want = oracle_indexer(inp, **prm)
    g_ids, g_scores = golden(**inp, **prm)
    kernel_rule = select_topk(scores, vis, prm["topk"])
    fin = np.isfinite(want)
    got, gold = scores[fin], g_scores[fin]
    err = np.abs(got.astype(np.float64) - gold)
    k = prm["topk"]
    sorted_ids = np.array([oracle_topk(scores[i], n, k) for i, n in enumerate(vis.tolist())])
    exact = bool(np.array_equal(scores.view(np.uint32), want.view(np.uint32)))
    pad_ok = all((ids[i, min(n, k) :] == -1).all() and (ids[i, : min(n, k)] >= 0).all()
                 for i, n in enumerate(vis))  # fmt: skip
    return {
        "us": us,
        "numpy_out": isinstance(ids, np.ndarray) and ids.dtype == np.int32,
        "shape": (ids.shape, scores.shape),
        "scores_exact": exact,
        "model_exact": float((got.view(np.uint32) == want[fin].view(np.uint32)).mean()),
        "mask_ok": bool(np.array_equal(np.isfinite(scores), fin)),
        "golden_exact": float((got.view(np.uint32) == gold.view(np.uint32)).mean()),
        "golden_within": bool((err <= _tree_bound(inp, prm, s1, want)[fin]).all()),
        "ids_rule": bool(np.array_equal(ids, kernel_rule)),
        "ids_sorted": bool(np.array_equal(ids, sorted_ids.astype(np.int32))),
        "ids_golden": bool(np.array_equal(ids, g_ids)) if np.array_equal(got, gold) else None,
        "ids_oracle": bool(np.array_equal(ids, want_ids)) if exact else None,
        "pad_ok": bool(pad_ok),
        "boundary_ties": _boundary_ties(want, vis, k),
        "inputs_kept": all(np.array_equal(before[n], inp[n], equal_nan=True) for n in inp),
        "plan": plan,
        "ran": branches_ran(roots),
        "build": params.shape(),
        "build_name": build_name,
        "ids": ids,
        "scores": scores,
    }


def _boundary_ties(scores, vis, topk) -> tuple[int, int]:
    """``(rows whose k-th best score is shared with a position left out, rows with a tie
    above it)``: that the case exercises the tie rule at the boundary and inside the list."""
    across = above = 0
    for i, n in enumerate(vis.tolist()):
        if n <= topk:
            continue
        row = np.sort(scores[i, :n])[::-1]
        tau = row[topk - 1]
        across += int((row[topk:] == tau).any())
        top = row[:topk][row[:topk] > tau]
        above += int(np.unique(top).size < top.size)
    return across, above


def _tree_bound(inp, prm, s1, want):
    """|tree - exact sum| <= 6 levels * 2^-24 * sum|terms| (times the scale), per position,
    from the kernel's terms recomputed in float64 (a generous first-order bound)."""
    bt = inp["block_table"]
    out = np.zeros_like(want, dtype=np.float64)
    vis = _visible(inp, s1)
    for row in range(bt.shape[0] * s1):
        k, ks = _row_keys(inp, prm, row // s1, int(vis[row]))
        d = np.maximum(inp["q"][row].astype(np.float64) @ k.T, 0)
        if prm["path"] == "int8":
            w = inp["q_scale"][row].astype(np.float32) * inp["weights"][row].astype(np.float32)
            d = d * 2.0**-11 * np.abs(w.astype(np.float16).astype(np.float64))[:, None]
        else:  # plus the FP32 dot bound: 128 * 2^-24 * sum_d |q_d k_d| per logit
            qk = np.abs(inp["q"][row].astype(np.float64)) @ np.abs(k.T)
            d = (d + 128 * qk) * np.abs(inp["weights"][row].astype(np.float64))[:, None]
        out[row, : vis[row]] = 8 * 2.0**-24 * d.sum(0) * np.abs(ks.astype(np.float64))
    return out


# ----------------------------------------------------------------------------- tests
#: name -> (lens, s1, data): rows below, at and above topk; several batches
CASES = {
    "b2 s2 randn": ((300, 700), 2, "randn"),
    "b4 s1 short rows": ((40, 63, 64, 65), 1, "randn"),  # < topk, topk - 1, topk, topk + 1
    "b1 s4 tie levels": ((900,), 4, "levels"),  # ties within and across both spans
    "b2 s2 all-tie": ((130, 257), 2, "zeros"),
    "b2 s1 wide codes": ((200, 333), 1, "wide"),  # FP8: within the FP32 dot bound only
}


def _soc_path(soc):
    return "int8" if soc == "910b" else "fp8"


def torch_in(inp, prm, want, soc) -> dict:
    """Torch tensors in (``validate=False``: metadata only) -> torch tensors out, the same
    bits as the NumPy call ``want``."""
    import torch
    from tilesim.device.dsa_indexer import dsa_indexer

    tin = {k: torch.from_numpy(np.ascontiguousarray(v).view(np.uint8))
           if v.dtype.kind == "V" else torch.from_numpy(v) for k, v in inp.items()}  # fmt: skip
    if prm["path"] == "fp8":
        tin["q"] = tin["q"].view(torch.float8_e4m3fn)
    (ids, scores), _ = dsa_indexer(**tin, **prm, backend="sim", soc=soc, validate=False)
    return {
        "torch_out": isinstance(ids, torch.Tensor) and ids.dtype == torch.int32,
        "same": bool(np.array_equal(ids.numpy(), want["ids"]))
        and bool(np.array_equal(scores.numpy().view(np.uint32), want["scores"].view(np.uint32))),
    }


def run_cases(soc) -> dict:
    from tilesim.device import compile_stats, reset_compile_stats

    reset_compile_stats()
    res = {}
    for name, (lens, s1, data) in CASES.items():
        inp, prm = make_case(_soc_path(soc), lens, s1, seed=len(name), data=data)
        res[name] = check_case(inp, prm, s1, soc)
    # 500: the last block inside a whole-span chunk (its poisoned tail masked there); 700: in
    # the chunks after the last whole span
    inp, prm = make_case(_soc_path(soc), (500, 700), 2, seed=7)
    clean = check_case(inp, prm, 2, soc)
    (dirty_ids, dirty_scores), _ = run_kernel(poison(inp, prm), prm, soc)
    res["torch in"] = torch_in(inp, prm, clean, soc)
    res["stats"] = compile_stats()
    # DeepSeek's own sizes: topk 2048, 128-token blocks, rows at 2048, 2049, 4099, 4100
    inp2, prm2 = make_case(_soc_path(soc), (2049, 4100), 2, seed=11, topk=2048, bs=128,
                           num_blocks=60, cols=64)  # fmt: skip
    res["b2 s2 topk 2048 seq 2049, 4100"] = check_case(inp2, prm2, 2, soc)
    res["nan poison"] = {
        "same_ids": bool(np.array_equal(clean["ids"], dirty_ids)),
        "same_scores": bool(
            np.array_equal(clean["scores"].view(np.uint32), dirty_scores.view(np.uint32))
        ),  # fmt: skip
    }
    return res


def assert_plan_ran(c) -> None:
    """The chunks and tail spans the host plan lists for a case's lengths are the ones its
    device control flow ran (per row-group size: the same unroll factors, a tail exactly when
    planned)."""
    assert set(c["ran"]) == set(c["plan"]), (c["ran"], c["plan"])
    for rows, plan in c["plan"].items():
        ran = c["ran"][rows]
        assert ran["factors"] == plan["factors"], (rows, ran, plan)
        assert ran["tail"] == (plan["tail"] > 0), (rows, ran, plan)


def assert_exact(c, name) -> None:
    """Scores and ids bit for bit the golden's and the oracle's; ids the shared rule's and
    the oracle's sort on the kernel's own scores; ``-1`` padding; NumPy out, inputs kept."""
    assert c["numpy_out"] and c["inputs_kept"], name
    assert c["scores_exact"] and c["mask_ok"] and c["golden_exact"] == 1.0, name
    assert c["ids_golden"] is True and c["ids_oracle"] is True, name
    assert c["ids_rule"] and c["ids_sorted"] and c["pad_ok"], name


@pytest.mark.sim
@pytest.mark.torch
def test_indexer_kernel(sim_soc, sim_report):
    from tilesim.device import sim

    r = sim.isolated(run_cases, sim_soc, soc=sim_soc, timeout=1800)
    for name in (*CASES, "b2 s2 topk 2048 seq 2049, 4100"):
        c = r[name]
        sim_report.add(kernel="dsa_indexer", soc=sim_soc, case=f"{_soc_path(sim_soc)} {name}",
                       bit_exact=c["model_exact"], max_ulp=None, max_abs=None,
                       us=c["us"], extra={"bit-exact vs golden": c["golden_exact"]})  # fmt: skip
        assert c["numpy_out"] and c["inputs_kept"], name
        exact_promised = not (name.endswith("wide codes") and sim_soc == "950")
        assert c["scores_exact"] or not exact_promised, name
        assert c["mask_ok"], name
        assert c["golden_within"], name
        assert c["golden_exact"] == 1.0 or not exact_promised, (name, c["golden_exact"])
        assert c["ids_rule"] and c["ids_sorted"] and c["pad_ok"], name
        assert c["ids_golden"] is True or not exact_promised, name
        assert c["ids_golden"] in (None, True), name
        assert c["ids_oracle"] is True or not exact_promised, name
        assert c["ids_oracle"] in (None, True), name
        assert c["us"] > 0
        assert_plan_ran(c)
    assert r["b2 s2 all-tie"]["ids"][0, :TOPK].tolist() == list(range(TOPK))
    # the tie cases do tie: at the boundary (all-tie, levels) and above it (levels)
    assert r["b2 s2 all-tie"]["boundary_ties"][0] == 4
    assert min(r["b1 s4 tie levels"]["boundary_ties"]) > 0, r["b1 s4 tie levels"]
    assert r["nan poison"] == {"same_ids": True, "same_scores": True}, r["nan poison"]
    assert r["torch in"] == {"torch_out": True, "same": True}, r["torch in"]
    # one compile over every batch count, s1 and length above (same table width)
    assert r["stats"] == {"dsa_indexer": 1}, r["stats"]


# ----------------------------------------------------------------------------- production path
#: the production path at CI size (``SMALL_TILING``: topk 128, 64-token blocks, 4096 columns,
#: spans of 1024): batch 0 sees 2700 tokens (43 blocks: 2 whole spans, then a tail span in
#: chunks of 8, 2 and 1 blocks, then a span past the rows), batch 1 the whole row (4 whole
#: spans, its first row one column short); the merge reads 512 candidates, one top-k tile
SMALL_PATH = {"lens": (2700, 4096), "topk": 128, "bs": 64, "cols": 64, "tiling": "SMALL_TILING"}
#: the production tiling at DeepSeek's sizes (64K columns of 128-token blocks, topk 2048,
#: spans of 16K, the merge of 8K candidates) through the public call: batch 0 sees 40000
#: tokens (313 blocks: 2 whole spans, a tail span in chunks of 32, 3 x 8 and 1, a span past
#: the rows), batch 1 all 65536
LONG_PATH = {"lens": (40000, 65536), "topk": 2048, "bs": 128, "cols": 512, "tiling": None}


def production_path(soc, case, build=None, path=None) -> dict:
    """Child: one production-path case (:data:`SMALL_PATH` / :data:`LONG_PATH`), decode s1 = 2
    on tie-level keys (16 distinct key rows: ties inside and across the spans and at the
    top-k boundary, so the merge's tie rule decides ids), checked by :func:`check_case`
    (``build``: forced, else the call's; ``path``: the SoC's unless given)."""
    from tilesim.shared import dsa_indexer as contract

    blocks = sum(-(-n // case["bs"]) for n in case["lens"])
    inp, prm = make_case(path or _soc_path(soc), case["lens"], 2, seed=23, topk=case["topk"],
                         bs=case["bs"], data="levels", num_blocks=blocks + 5,
                         cols=case["cols"])  # fmt: skip
    tiling = case["tiling"] and getattr(contract, case["tiling"])
    res = check_case(inp, prm, 2, soc, tiling=tiling, build=build)
    del res["ids"], res["scores"]
    return res


def production_build() -> dict:
    """The static branches of the build every DeepSeek decode call over 64K uses."""
    from tilesim.device._dsa_indexer_kernel import IndexerParams

    return IndexerParams(path="int8", block_size=128, topk=2048, width=65536, soc="910b").shape()


def assert_production_path(r, soc, sim_report, label, path=None) -> None:
    """Bit-exact (:func:`assert_exact`), the ran branches are the planned ones
    (:func:`assert_plan_ran`), and they are the production path's: the build traces the same
    branches as the 64K build (:func:`production_build`), and the rows take whole-span chunks,
    a tail span, a span past the rows, every unroll factor and the merge, with the k-th best
    score shared by positions left out in every row (the tied positions lie in several spans:
    the merge's tie rule picks them)."""
    sim_report.add(kernel="dsa_indexer", soc=soc, case=f"{path or _soc_path(soc)} {label}",
                   bit_exact=r["model_exact"], max_ulp=None, max_abs=None, us=r["us"],
                   extra={"bit-exact vs golden": r["golden_exact"]})  # fmt: skip
    assert_exact(r, label)
    assert_plan_ran(r)
    assert r["build"] == production_build(), r["build"]
    assert r["build"]["merge"] and r["build"]["unroll_factors"] == 5
    plan = r["plan"][2]
    assert (plan["span_chunks"], plan["tail"], plan["spans_past"]) == (6, 1, 1), plan
    assert len(r["ran"][2]["factors"]) == 5, r["ran"]
    assert r["boundary_ties"][0] == 4, r["boundary_ties"]  # every row: tau left out too
    assert r["us"] > 0


#: the CI-size case's SoCs: the 910B's in CI (about 20 s of CPU); the 950's (about as much
#: again; its selection code is the same, only the scores' path differs) in the slow set
SMALL_PATH_SOCS = [
    pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
    pytest.param("950", marks=[pytest.mark.soc_950, pytest.mark.slow], id="950"),
]


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("soc", SMALL_PATH_SOCS)
def test_production_path_at_ci_size(soc, sim_report):
    """The multi-span top-k path (whole-span chunks, the tail span, the merge) at CI size."""
    from tilesim.device import sim

    r = sim.isolated(production_path, soc, SMALL_PATH, soc=soc, timeout=1800)
    assert r["build_name"] == "few_groups"  # 2 row groups x 64 columns: the other builds below
    assert_production_path(r, soc, sim_report, "production path, SMALL_TILING topk 128")


#: the builds the CI-size production case runs forced (its own call runs ``few_groups``), all
#: in the slow set (about 60-130 s of CPU each): the builds differ in task merges only, and CI
#: runs the case in ``few_groups`` on the 910B and in ``many_groups`` on the 950's INT8 path
#: (:func:`test_int8_on_the_950_compiles_in_every_build`)
OTHER_BUILDS = [
    pytest.param(
        "910b", "some_groups", marks=[pytest.mark.soc_910b, pytest.mark.slow], id="910b-some_groups"
    ),  # fmt: skip
    pytest.param(
        "910b", "many_groups", marks=[pytest.mark.soc_910b, pytest.mark.slow], id="910b-many_groups"
    ),  # fmt: skip
    pytest.param(
        "950", "some_groups", marks=[pytest.mark.soc_950, pytest.mark.slow], id="950-some_groups"
    ),  # fmt: skip
    pytest.param(
        "950", "many_groups", marks=[pytest.mark.soc_950, pytest.mark.slow], id="950-many_groups"
    ),  # fmt: skip
]


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize(("soc", "build"), OTHER_BUILDS)
def test_every_build_keeps_the_bits(soc, build, sim_report):
    """The builds differ in task merges only (``BUILD_MERGES``), so each one, forced on the
    CI-size production case, is as bit-exact as the call's own build and runs the same
    branches: the same promise for every batch size."""
    from tilesim.device import sim

    r = sim.isolated(production_path, soc, SMALL_PATH, build, soc=soc, timeout=1800)
    assert r["build_name"] == build
    assert_production_path(r, soc, sim_report, f"production path, SMALL_TILING topk 128, {build}")


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_950
@pytest.mark.parametrize(
    "build", [pytest.param("some_groups", marks=pytest.mark.slow), "many_groups"]
)  # the many_groups build in CI (about 60 s of CPU), the other in the slow set
def test_int8_on_the_950_compiles_in_every_build(build, sim_report):
    """The 950's INT8 path (the layer step's indexer) in the builds of more row groups, on
    the CI-size production case (a cache of 112 blocks): with the key-scale gather inside the
    V1 subgraph, as on the 910B, PyPTO 0.2.0's ``TuneSyncForVF`` pass failed to compile both
    (``gathers_in_slab``); the per-chunk gather compiles and keeps the bits."""
    from tilesim.device import sim

    r = sim.isolated(production_path, "950", SMALL_PATH, build, "int8", soc="950", timeout=1800)
    assert r["build_name"] == build
    label = f"production path, SMALL_TILING topk 128, {build}"
    assert_production_path(r, "950", sim_report, label, path="int8")


def build_names(soc) -> dict:
    """Child: the build ``prepared_launch`` picks for decode s2 calls over 64K (512 table
    columns), by batch."""
    from tilesim.device.dsa_indexer import prepared_launch

    out = {}
    for b in (1, 2, 3, 5, 6):
        inp, prm = decode_case(_soc_path(soc), b, 2)
        out[b] = prepared_launch(**inp, **prm, soc=soc)["build"]
    return out


@pytest.mark.sim
@pytest.mark.torch
def test_the_wrapper_picks_the_build_of_the_rule(sim_soc):
    """The wrapper's build for a call is the shared rule's for its row groups (b x s1 / 2)
    and its 512 columns (the thresholds' test: :func:`test_kernel_build_rule`)."""
    from tilesim.device import sim
    from tilesim.shared.dsa_indexer import kernel_build

    got = sim.isolated(build_names, sim_soc, soc=sim_soc, timeout=600)
    assert got == {b: kernel_build(groups=b, columns=512, soc=sim_soc) for b in got}, got
    assert got[1] == "few_groups" and got[6] == "many_groups", got


def test_kernel_build_rule():
    """The one rule (:func:`tilesim.shared.dsa_indexer.kernel_build`): block visits = row
    groups x table columns against two thresholds per SoC, the measured crossovers at s1 2
    over 64K (512 columns; the op page's "Builds by row groups")."""
    from tilesim.shared.dsa_indexer import (
        FEW_GROUPS_VISITS,
        SOME_GROUPS_VISITS,
        kernel_build,
        row_groups,
    )

    # batch x (pairs + an odd s1's last row), counted by hand
    assert [row_groups(4, s1) for s1 in (1, 2, 3, 4)] == [4, 4, 8, 8]
    assert FEW_GROUPS_VISITS == {"910b": 512, "950": 512}  # one row group over 64K
    assert SOME_GROUPS_VISITS == {"910b": 1536, "950": 2560}  # three / five row groups
    for soc in ("910b", "950"):
        few, some = FEW_GROUPS_VISITS[soc], SOME_GROUPS_VISITS[soc]
        assert kernel_build(groups=1, columns=few, soc=soc) == "few_groups"
        assert kernel_build(groups=2, columns=few // 2, soc=soc) == "few_groups"
        assert kernel_build(groups=1, columns=few + 1, soc=soc) == "some_groups"
        assert kernel_build(groups=some // 512, columns=512, soc=soc) == "some_groups"
        assert kernel_build(groups=some // 512 + 1, columns=512, soc=soc) == "many_groups"
        assert kernel_build(groups=64, columns=512, soc=soc) == "many_groups"
    for bad, match in (({"groups": 0}, "groups"), ({"columns": 0}, "columns"),
                       ({"soc": "h100"}, "soc")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            kernel_build(**{"groups": 1, "columns": 512, "soc": "910b", **bad})
    with pytest.raises(ValueError, match="s1"):
        row_groups(2, 0)


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
def test_production_path_64k(sim_soc, sim_report):
    """The same path at DeepSeek's sizes: spans of 16K columns, the 8K-candidate merge."""
    from tilesim.device import sim

    r = sim.isolated(production_path, sim_soc, LONG_PATH, soc=sim_soc, timeout=3600)
    assert_production_path(r, sim_soc, sim_report, "production path, seq 40000 / 65536 topk 2048")


def odd_block_case(soc) -> dict:
    """Child: 96-token blocks under ``SMALL_TILING`` (64-column slabs), so a one-block chunk
    is 96 columns, a slab and a half; the rows see 287 / 288 and 699 / 700 tokens (the
    one-block chunk's columns all visible)."""
    from tilesim.shared.dsa_indexer import SMALL_TILING

    inp, prm = make_case(_soc_path(soc), (288, 700), 2, seed=3, topk=64, bs=96, num_blocks=16,
                         cols=8)  # fmt: skip
    res = check_case(inp, prm, 2, soc, tiling=SMALL_TILING)
    del res["ids"], res["scores"]
    return res


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
def test_chunk_wider_than_whole_slabs(sim_soc):
    """A chunk whose width is not a multiple of the slab width scores every column (the
    narrower last slab): before it, the last 32 columns of a 96-column chunk held no score."""
    from tilesim.device import sim

    r = sim.isolated(odd_block_case, sim_soc, soc=sim_soc, timeout=1800)
    assert_exact(r, "96-token blocks")
    assert_plan_ran(r)
    assert 1 in r["ran"][2]["factors"], r["ran"]


# ----------------------------------------------------------------------------- cost model
CONTEXT = 65536  # cached tokens per batch row (DeepSeek decode over 64K)


def decode_case(path, b, s1=2, context=CONTEXT, bs=128):
    """A decode call of ``b`` batches x ``s1`` rows over ``context`` tokens each, topk 2048,
    with zero-valued data (the cost model never reads values) and every batch's table
    pointing at the same ``context / bs`` physical blocks (a small cache; same cost)."""
    from tilesim.shared.casts import FP8_E4M3

    nblk = -(-context // bs)
    t = b * s1
    inp = {"block_table": np.tile(np.arange(nblk, dtype=np.int32), (b, 1)),
           "seq_lens": np.full(b, context, np.int32)}  # fmt: skip
    if path == "int8":
        inp.update(q=np.zeros((t, 64, 128), np.int8), q_scale=np.ones((t, 64), np.float16),
                   weights=np.ones((t, 64), np.float16),
                   k_cache=np.zeros((nblk, bs, 128), np.int8),
                   k_scale=np.ones((nblk, bs), np.float16))  # fmt: skip
    else:
        inp.update(q=np.zeros((t, 64, 128), FP8_E4M3), weights=np.ones((t, 64), np.float32),
                   k_cache=np.zeros((nblk, bs * 132), np.uint8))  # fmt: skip
    return inp, {"path": path, "topk": 2048, "block_size": bs}


def cost_decode(soc, b, s1=2) -> dict:
    """Child: kernel, scores-only kernel and probe at decode ``b`` x ``s1`` over 64K, cost
    only (compile + cost model), with the op's traffic counter."""
    from probes.dsa_indexer_probe import matmul_probe
    from probes.floor import floor_us
    from tilesim.device import sim
    from tilesim.device.dsa_indexer import dsa_indexer_traffic, prepared_launch
    from tilesim.shared.dsa_indexer import check_meta, check_values

    inp, prm = decode_case(_soc_path(soc), b, s1)
    res = {}
    for name, only in (("us", False), ("scores_us", True)):
        run = prepared_launch(**inp, **prm, soc=soc, scores_only=only)
        res[name] = sim.run_cost(run["kernel"], [*run["inputs"], *run["outputs"]]).us
    with sim.cost_only():
        _, res["probe_us"] = matmul_probe(inp["seq_lens"], s1=s1, path=prm["path"], soc=soc)
    res.update(dsa_indexer_traffic(check_values(check_meta(**inp, **prm))))
    res["floor_us"] = floor_us(res["bytes"], soc=soc)  # the op's contract bytes
    return res


def _cost_row(sim_report, soc, b, r):
    from tilesim.shared.soc import get_soc

    spec = get_soc(soc)
    sel = r["us"] - r["scores_us"]
    extra = {"HBM-bound µs": spec.hbm_bound_us(r["bytes"])}
    if soc == "950":
        extra["HBM-bound µs 950DT"] = get_soc("950dt").hbm_bound_us(r["bytes"])
    extra.update({"floor µs": r["floor_us"], "kernel / floor": r["us"] / r["floor_us"],
                  "probe µs": r["probe_us"], "kernel / probe": r["us"] / r["probe_us"],
                  "scores-only µs": r["scores_us"], "selection share": sel / r["us"]})  # fmt: skip
    sim_report.add(
        kernel="dsa_indexer", soc=soc,
        case=f"{_soc_path(soc)} decode b{b} s2 seq {CONTEXT} topk 2048 (cost only)",
        bit_exact=None, max_ulp=None, max_abs=None, us=r["us"], extra=extra,
    )  # fmt: skip
    return sel


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("b", [4, 64])
def test_decode_cost(b, sim_soc, sim_report):
    """Decode b4 s2 / b64 s2 over 64K on the cost model: the kernel, its scores-only build and
    the matmul-only probe (numbers asserted for sanity, never a time threshold)."""
    from tilesim.device import sim

    r = sim.isolated(cost_decode, sim_soc, b, soc=sim_soc, timeout=7200)
    sel = _cost_row(sim_report, sim_soc, b, r)
    assert r["us"] > 0 and r["probe_us"] > 0 and r["scores_us"] > 0
    assert r["keys"] == b * CONTEXT
    assert sel >= 0.0


def probe_jits(soc) -> list:
    """Child: ``(probe jit == kernel jit, L1 reuse)`` for a short-span build (4096 columns,
    topk 128: 32-block spans) and the 64K build (128-block spans)."""
    from probes.dsa_indexer_probe import probe_params
    from tilesim.device._dsa_indexer_kernel import IndexerParams, build_jit

    out = []
    for topk, width in ((128, 4096), (2048, CONTEXT)):
        kp = IndexerParams(path=_soc_path(soc), block_size=128, topk=topk, width=width, soc=soc)
        jit = probe_params(kp).jit
        reuse = dict((key, val) for _, key, val in jit)["cube_l1_reuse_setting"][0][1]
        out.append((jit == build_jit(kp), reuse))
    return out


@pytest.mark.sim
def test_probe_compiles_with_the_kernels_options(sim_soc):
    """The matmul-only probe takes the kernel build's jit options at every width: its cube
    tasks pack as many blocks as the kernel's (16 under a short span, 32 at 64K)."""
    from tilesim.device import sim

    assert sim.isolated(probe_jits, sim_soc, soc=sim_soc, timeout=600) == [(True, 16), (True, 32)]


# ----------------------------------------------------------------------------- compile checks
def compile_at(soc, b, s1=2) -> dict:
    """Child: compile only (no interpreter, no cost model) at a decode shape over 64K."""
    from tilesim.device import compile_stats, reset_compile_stats, sim
    from tilesim.device.dsa_indexer import prepared_launch

    reset_compile_stats()
    inp, prm = decode_case(_soc_path(soc), b, s1)
    run = prepared_launch(**inp, **prm, soc=soc)
    seconds = sim.run_compile(run["kernel"], [*run["inputs"], *run["outputs"]])
    return {"seconds": seconds, "stats": compile_stats(), "width": run["width"]}


#: the NPU tests' decode shapes (the DeepSeek decode matrix: b4 s2 and b64 s2 over 64K) per
#: SoC, all in the slow set (a minute or two of CPU each: the whole-row chunk body holds four
#: spans). What CI keeps of them: test_production_path_at_ci_size builds the same branches
#: (its build's :meth:`IndexerParams.shape` equals the 64K build's, asserted), and
#: test_indexer_kernel's topk 2048 case compiles the production tiling's tile sizes (1024-column
#: V1 slabs, the top-k of an 8192-column span)
NPU_SHAPES = [
    pytest.param("910b", 4, marks=[pytest.mark.soc_910b, pytest.mark.slow], id="910b-b4"),
    pytest.param("950", 4, marks=[pytest.mark.soc_950, pytest.mark.slow], id="950-b4"),
    pytest.param("910b", 64, marks=[pytest.mark.soc_910b, pytest.mark.slow], id="910b-b64"),
    pytest.param("950", 64, marks=[pytest.mark.soc_950, pytest.mark.slow], id="950-b64"),
]


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize(("soc", "b"), NPU_SHAPES)
def test_compiles_at_npu_shapes(soc, b):
    from tilesim.device import sim

    r = sim.isolated(compile_at, soc, b, soc=soc, timeout=1800)
    assert r["stats"] == {"dsa_indexer": 1}
    assert r["width"] == CONTEXT and r["seconds"] > 0


# ----------------------------------------------------------------------------- no simulator
def test_shape_only_inputs_answer_without_a_kernel():
    """``meta`` tensors (what torch.compile traces with): the contract's checks, then empty
    outputs of the right shapes and dtypes; no data read, no simulator."""
    torch = pytest.importorskip("torch")
    from tilesim.device.dsa_indexer import dsa_indexer

    inp, prm = make_case("int8", (300, 700), 2)
    meta = {k: torch.from_numpy(v).to("meta") for k, v in inp.items()}
    ids, scores = dsa_indexer(**meta, **prm, backend="sim")
    assert ids.shape == (4, TOPK) and ids.dtype == torch.int32 and ids.device.type == "meta"
    assert scores.shape == (4, 16 * BS) and scores.dtype == torch.float32


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"int8_order": "pypto"}, "int8_order: the kernel implements 'gym' only"),
        ({"topk": 48}, "topk: expected a multiple of 32"),
        ({"q_lens": np.array([2, 2], np.int32)}, "q_lens: expected None"),
        ({"path": "fp8"}, "q: expected"),
    ],
)
def test_kernel_limits_raise_before_launch(over, match):
    pytest.importorskip("torch")
    from tilesim.device.dsa_indexer import dsa_indexer

    inp, prm = make_case("int8", (300, 700), 2)
    kw = {**inp, **prm, **over}
    with pytest.raises((ValueError, TypeError), match=match):
        dsa_indexer(**kw, backend="sim")


def test_slabs_cover_every_column():
    """The V1 slabs of a chunk: ``vec_cols`` wide, the last narrower, every column once."""
    from tilesim.device._dsa_indexer_kernel import slabs

    assert slabs(96, 64) == [(0, 64), (64, 32)]
    assert slabs(1280, 1024) == [(0, 1024), (1024, 256)]
    assert slabs(16384, 1024) == [(j * 1024, 1024) for j in range(16)]
    assert slabs(512, 1024) == [(0, 512)]


def test_small_tiling_traces_the_production_branches():
    """``SMALL_TILING`` at topk 128 over 4096 columns builds the static branches of the
    production build at topk 2048 over 64K (4 spans, each span's top-k over two tiles, one
    merge that fills one top-k tile, 16 slabs per span chunk, two cumsum tiles, unroll
    factors of the whole row, a span and 3 smaller ones); the production tiling keeps the
    kernel's former constants (16K spans, unroll 128 / 32 / 8 / 1 below the row's 512); a
    table of 8 spans chunks 4 of them (``ROW_SPANS``); the topk-2048 case of
    :func:`run_cases` (8192 columns) takes the one-span path, no merge; the tiling keys the
    compile."""
    from tilesim.device._dsa_indexer_kernel import IndexerParams, group_chunks
    from tilesim.shared.dsa_indexer import PRODUCTION_TILING, SMALL_TILING, IndexerTiling

    prod = IndexerParams(path="int8", block_size=128, topk=2048, width=65536, soc="910b")
    small = IndexerParams(path="fp8", block_size=64, topk=128, width=4096, soc="950",
                          tiling=SMALL_TILING)  # fmt: skip
    want = {"spans": 4, "merge": True, "span_topk_tiles": 2, "merge_topk_tiles": 1,
            "merge_fills_tile": True, "span_chunk_slabs": 16, "cumsum_tiles": 2,
            "unroll_factors": 5}  # fmt: skip
    assert prod.shape() == want and small.shape() == want
    assert (prod.span, prod.unroll) == (16384, (512, 128, 32, 8, 1))
    assert (small.span, small.unroll) == (1024, (64, 16, 8, 2, 1))
    assert group_chunks(prod, 512) == {"chunks": [(0, 512)], "span_chunks": 4, "tail": 0,
                                       "spans_past": 0}  # fmt: skip
    wide = IndexerParams(path="int8", block_size=128, topk=2048, width=131072, soc="910b")
    assert (wide.spans, wide.unroll) == (8, (512, 128, 32, 8, 1))
    assert group_chunks(wide, 1000)["span_chunks"] == 7
    one = IndexerParams(path="int8", block_size=128, topk=2048, width=8192, soc="910b")
    assert (one.spans, one.shape()["merge"], one.unroll) == (1, False, (64, 32, 8, 1))
    assert group_chunks(one, 33) == {"chunks": [(0, 32), (32, 1)], "span_chunks": 0,
                                     "tail": 1, "spans_past": 0}  # fmt: skip
    assert group_chunks(small, 43) == {"chunks": [(0, 16), (16, 16), (32, 8), (40, 2), (42, 1)],
                                       "span_chunks": 2, "tail": 1, "spans_past": 1}  # fmt: skip
    assert PRODUCTION_TILING == IndexerTiling() and prod.tiling is PRODUCTION_TILING
    other = IndexerParams(path="int8", block_size=128, topk=2048, width=65536, soc="910b",
                          tiling=SMALL_TILING)  # fmt: skip
    assert other.key != prod.key and repr(other) != repr(prod)
    # the INT8 V1 gathers its key scales on the 910B only (SLAB_GATHER_SOCS); the SoC keys
    # the compile
    on950 = IndexerParams(path="int8", block_size=128, topk=2048, width=65536, soc="950")
    assert prod.slab_gather and not on950.slab_gather and not small.slab_gather
    assert on950.key != prod.key and on950.shape() == prod.shape()


@pytest.mark.parametrize(
    ("over", "err", "match"),
    [
        ({"span_ratio": 0}, ValueError, r"IndexerTiling.span_ratio: expected an int in \[1,"),
        ({"span_ratio": True}, TypeError, "IndexerTiling.span_ratio: expected an int"),
        ({"topk_tile": 100}, ValueError, "IndexerTiling.topk_tile: expected a power of two"),
        ({"vec_cols": 16}, ValueError, "IndexerTiling.vec_cols: expected a power of two >= 32"),
        ({"cumsum_tile": 1.0}, TypeError, "IndexerTiling.cumsum_tile: expected an int"),
        ({"chunk_steps": (6, 4)}, ValueError, "chunk_steps: expected each factor to divide"),
        ({"chunk_steps": (8, "2")}, TypeError, r"IndexerTiling.chunk_steps\[1\]"),
    ],
)
def test_tiling_rejects_bad_fields(over, err, match):
    from tilesim.shared.dsa_indexer import IndexerTiling

    with pytest.raises(err, match=match):
        IndexerTiling(**over)


def test_prepared_launch_checks_the_tiling():
    pytest.importorskip("torch")
    from tilesim.device.dsa_indexer import prepared_launch

    inp, prm = make_case("int8", (300, 700), 2)
    with pytest.raises(TypeError, match="tiling: expected a IndexerTiling, got"):
        prepared_launch(**inp, **prm, tiling=(8, 512, 64, 64, (8, 2, 1)))
