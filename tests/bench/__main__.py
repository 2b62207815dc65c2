"""``python -m bench`` (from ``tests/``): time the references, write the report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from tilesim.shared.registry import ops

from bench import report, timing

_DESCRIPTION = "Benchmark of the NumPy references (a development tool; see bench/__init__.py)."
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "build" / "perf"

#: the seeds' cases timed, family by family (a case's family is its registry entry's:
#: :func:`bench.timing.case_info`); quick mode times :data:`QUICK_CASES`, the first of each group
BENCH_CASES = (
    "m27_case_001",
    timing.M3_SIZE_CASE,
    "m3_case_smoke_edge",
    "msa_indexer_nb17",
    "msa_decode_e2e_nb17",
    "msa_decode_b64_nb17",
    "msa_main_aligned_4096",
    "msa_main_aligned_2048",
    "msa_main_unaligned_1500",
    "msa_main_aligned_1024",
    "msa_main_unaligned_500",
    "msa_main_unaligned_100",
    "sfa_bf16_b4_s2_seq64K_total_fp8_d",
    "sfa_bf16_b4_s2_seq64K_total_int8_d",
    "sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d",
    "sfa_bf16_b4_s2_seq64K_per_fp8_d",
    "sfa_bf16_b64_s2_seq64K_per_fp8_d",
)
QUICK_CASES = (
    "m3_case_smoke_edge",
    "msa_indexer_nb17",
    "msa_main_unaligned_100",
    "sfa_bf16_b4_s2_seq64K_total_fp8_d",
)
#: goldens built and run once each in a fresh process for wall time and peak RSS, with the
#: memory target each must meet (GiB): the b64 sparse attention, and the b4 s2 64K layer step
#: on both paths (docs/ops/dsa_attention_step.md promises it fits in 4 GiB)
MEMORY_CASES = {
    "sfa_bf16_b64_s2_seq64K_per_fp8_d": 8.0,
    "dsa_attention_step_b4_s2_64k_int8": 4.0,
    "dsa_attention_step_b4_s2_64k_fp8": 4.0,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=_DESCRIPTION)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory for reference.md/.png")
    p.add_argument("--quick", action="store_true", help="small cases only, no memory run")
    p.add_argument("--family", action="append", choices=ops.families(),
                   help="time this family's cases only (repeatable; default: every family "
                   "the bench has cases of)")  # fmt: skip
    p.add_argument("--no-torch", action="store_true", help="skip the torch goldens")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=timing.usable_cpus(),
        help="intra-op threads of the torch goldens (default: every usable core, as the "
        "references use; OpenMP timings on an oversubscribed shared machine are erratic)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the b64 memory subprocess")
    p.add_argument("--memory-child", metavar="CASE", help=argparse.SUPPRESS)
    p.add_argument("--case-child", metavar="CASE", help=argparse.SUPPRESS)
    p.add_argument("--peak", type=float, help=argparse.SUPPRESS)
    return p


def _progress_line(name: str, r) -> str:
    f, x = report.fmt_s, report.fmt_x
    return (
        f"{name:<45} ref {f(r.ref_s):>9}  torch {f(r.torch_s):>9}  speed-up "
        f"{x(r.speedup):>7}  x roofline {x(r.roofline_ratio):>7}  x floor "
        f"{x(r.floor_ratio):>6}  {r.check}"
    )


def _chosen(cases: tuple[str, ...], families: list[str] | None) -> list[str]:
    """``cases`` of ``families`` (``None``: all), family by family in that order (a family's
    cases in their order); ``SystemExit`` naming a family the bench has no case of."""
    family = {name: timing.case_info(name).family for name in cases}
    have = list(dict.fromkeys(family.values()))
    missing = [f for f in families or () if f not in have]
    if missing:
        raise SystemExit(f"--family: the bench times no case of {missing}; it has cases of {have}")
    return [name for f in families or have for name in cases if family[name] == f]


def _run_all(args) -> int:
    started = time.time()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    names = _chosen(QUICK_CASES if args.quick else BENCH_CASES, args.family)
    fams = args.family or list(ops.families())
    timing.warm_torch()
    sgemm = timing.measure_sgemm()
    torch_threads = timing.set_torch_threads(args.torch_threads)
    print(
        f"sgemm peak {sgemm['peak']:.1f} GFLOP/s, dgemm peak {sgemm['dgemm_peak']:.1f} "
        f"GFLOP/s, widening {sgemm['widen']['best'] / 1e9:.2f} G elements/s",
        flush=True,
    )
    results, failed = [], []
    for name in names:
        try:
            r = timing.run_case_child(name, sgemm["peak"], args)
        except RuntimeError as err:  # one broken case must not lose the whole run
            failed.append((name, str(err).strip().splitlines()[-1]))
            print(f"{name:<45} FAILED: {failed[-1][1]}", flush=True)
            continue
        r.floor_s = timing.design_floor_s(r, sgemm)
        results.append(r)
        print(_progress_line(name, results[-1]), flush=True)
    mem = []
    if not args.quick and not args.no_memory and "dsa" in fams:
        for name, gib in MEMORY_CASES.items():
            mem.append({**timing.run_memory(name), "target_gib": gib})
            print(f"memory: {mem[-1]}", flush=True)
    from tilesim.reference.util.blas_pool import ref_workers

    info = {**report.machine_info(), "torch_threads": torch_threads, "ref_workers": ref_workers()}
    info["failed"] = failed
    md = report.write_report(Path(args.out), results, sgemm, mem, info, started, load_before)
    print(f"wrote {md} and {md.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.memory_child:
        timing.memory_child(args.memory_child)
        return 0
    if args.case_child:
        timing.set_torch_threads(args.torch_threads)
        timing.warm_torch()
        r = timing.bench_case(args.case_child, args.peak, with_torch=not args.no_torch)
        print(json.dumps(dataclasses.asdict(r)))
        return 0
    return _run_all(args)


if __name__ == "__main__":
    sys.exit(main())
