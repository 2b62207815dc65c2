"""The bench's own pieces (tests/bench, a development tool outside the package): FLOP counts
(each op record's ``cost``) against published numbers, and the seeds-style torch goldens
agreeing with the references (so the timings compare like with like)."""

from __future__ import annotations

import numpy as np
import pytest
from bench.flops import flop_count, live_flop_count
from bench.goldens import check, torch_golden_for
from tilesim.cli.registry import get_case
from tilesim.cli.runner import build_case, run_reference


def test_moe_flop_count_matches_the_issue():
    built = build_case(get_case("m27_case_001"))  # 8 experts with 0, 1, 2, ..., 32, 0 tokens
    cs = np.concatenate([[0], np.cumsum([0, 1, 2, 4, 8, 16, 32, 0])])
    assert np.asarray(built.op_args["expert_cumsum"]).tolist() == cs.tolist()
    # 63 tokens x (mm1 2*H*2I + mm2 2*I*H) = about 1.8 GFLOP
    assert flop_count(built) == 63 * (2 * 3072 * 3072 + 2 * 1536 * 3072)
    assert 1.7e9 < flop_count(built) < 1.9e9


def test_dsa_flop_count_matches_the_attended_keys():
    built = build_case(get_case("sfa_bf16_b4_s2_seq64K_total_fp8_d"))
    # cur_seq per token: [2048,2048],[2048,2048],[665,666],[14,15] (docs/ops/dsa.md)
    attended = 4 * 2048 + 665 + 666 + 14 + 15
    assert flop_count(built) == 2 * 128 * attended * (576 + 512)


@pytest.mark.parametrize(
    "name, ids, n",
    [
        # the seeds' published block ids (docs/sources.md, "MSA main branch")
        ("msa_main_aligned_1024", [6, 7, 4, 3, 1, 5, 2, 0], 1024),
        ("msa_main_unaligned_1500", [5, 3, 9, 8, 0, 10, 2, 1, 11, 7, 6, 4], 1500),
    ],
)
def test_msa_main_live_flop_count_from_the_block_ids(name, ids, n):
    """Live work = (query block, slot) pairs whose block is not in the future, each with the
    query block's real rows; padding slots and future blocks are dead."""
    built = build_case(get_case(name))
    rows = [min(128, n - qb * 128) for qb in range(-(-n // 128))]
    pairs_rows = sum(rows[qb] for qb in range(len(rows)) for kv in ids if kv <= qb)
    assert live_flop_count(built) == 2 * 64 * 2 * 128 * 128 * pairs_rows
    assert flop_count(built) == 2 * n * 64 * 16 * 128 * 2 * 128  # every slot, every row
    assert live_flop_count(built) < flop_count(built)
    other = build_case(get_case("sfa_bf16_b4_s2_seq64K_total_fp8_d"))
    assert live_flop_count(other) == flop_count(other)


@pytest.mark.torch
@pytest.mark.parametrize(
    "name",
    [
        "m3_case_smoke_edge",
        "sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d",
        "msa_indexer_nb17",
        "msa_decode_partial_nb17",
        "msa_main_unaligned_1",
    ],
)
def test_torch_goldens_agree_with_the_references(name):
    built = build_case(get_case(name))
    ref = run_reference(built)["out"]
    out = torch_golden_for(built)()
    verdict = check(built, ref, out)
    assert verdict.startswith(("agrees", "same block set")), verdict
    assert np.asarray(ref).shape == tuple(out.shape)


@pytest.mark.torch
def test_torch_golden_disagreement_is_reported():
    built = build_case(get_case("m3_case_smoke_edge"))
    ref = run_reference(built)["out"]
    bad = torch_golden_for(built)()
    bad[0, 0] = 1e4
    assert check(built, ref, bad).startswith("DISAGREES")


def test_report_flags_targets_beyond_the_sgemm_peak(tmp_path):
    """write_report: the '10x needs' rate is 10 x live FLOPs / torch time, flagged above the
    sgemm peak, and the Targets lines count met and missed cases."""
    from bench.report import write_report
    from bench.timing import CaseResult

    def result(name, live_gflop, ref_s, torch_s):
        flop = int(2 * live_gflop * 1e9)  # kernel count: twice the live work
        return CaseResult(
            name=name,
            family="msa",
            op="msa_main_branch",
            flop=flop,
            live_flop=int(live_gflop * 1e9),
            ref_s=ref_s,
            torch_s=torch_s,
            ref_cpu=ref_s,
            torch_cpu=torch_s,
            roofline_s=flop / 250e9,
            check="agrees",
            build_s=0.0,
        )

    results = [
        result("loop_bound", 1.0, 0.01, 1.0),  # 10x needs 10 GFLOP/s; 100x faster: met
        result("blas_bound", 100.0, 2.0, 1.0),  # 10x needs 1000 GFLOP/s > 250: beyond peak
    ]
    assert results[0].target_rate(10.0) == pytest.approx(10.0)
    assert results[1].target_rate(10.0) == pytest.approx(1000.0)
    sgemm = {"rates": {"numpy 2048x2048x2048": 250.0}, "peak": 250.0}
    info = {"cpu": "test", "cores": 2, "python": "3", "numpy": "2", "load_avg": "0"}
    md = write_report(tmp_path, results, sgemm, None, info, 0.0, "0").read_text()
    rows = {ln.split("|")[1].strip(): ln for ln in md.splitlines() if ln.startswith("| ")}
    assert "| 10 |" in rows["loop_bound"] and "(> peak)" not in rows["loop_bound"]
    assert "| 1000 (> peak) |" in rows["blas_bound"]
    target = next(ln for ln in md.splitlines() if ln.startswith("- MSA:"))
    assert "speed-up >= 10x on 1 of 2 cases (missed: blas_bound)" in target
    assert "for 1 of the missed ones that speed would be above the sgemm peak" in target
    assert (tmp_path / "reference.png").stat().st_size > 0


def test_the_bench_is_not_part_of_the_package():
    import importlib.util

    assert importlib.util.find_spec("tilesim.bench") is None
