"""Timing of the references and the torch goldens: best-of wall/CPU time, the machine's sgemm
rate (the roofline), one fresh interpreter per case, and the peak memory of one big golden.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import goldens
from bench.flops import flop_count, live_flop_count, widen_count

#: interleaved timing rounds of a small case (see bench_case)
ROUNDS = 3
#: the folder holding the ``bench`` package (put on a child interpreter's path)
TESTS_DIR = Path(__file__).resolve().parents[1]


def child_env() -> dict:
    """The environment of a child ``python -m bench``: this one, with tests/ on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), env.get("PYTHONPATH")) if p)
    return env


def _torch():
    import torch

    return torch


def _best_time(fn: Callable[[], object], *, budget: float = 2.0, max_reps: int = 5):
    """(best wall seconds, CPU seconds of that run, result): one untimed warm-up run when
    ``budget`` > 0, then repeat while the total stays under ``budget`` seconds. CPU time
    (all threads of this process) is far less sensitive to other users of a shared machine."""
    if budget > 0:
        fn()
    best = cpu_best = math.inf
    spent, reps, res = 0.0, 0, None
    while reps == 0 or (reps < max_reps and spent + best < budget):
        t0, c0 = time.perf_counter(), time.process_time()
        res = fn()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if dt < best:
            best, cpu_best = dt, dc
        spent += dt
        reps += 1
    return best, cpu_best, res


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def set_torch_threads(n: int) -> int | None:
    try:
        torch = _torch()
    except ImportError:
        return None
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def warm_torch() -> None:
    """Pay torch's one-time initialisation outside every timed region."""
    try:
        torch = _torch()
    except ImportError:
        return
    x = torch.ones(64, 64)
    torch.nn.functional.linear(x, x).softmax(-1).bfloat16().float().exp().sum()


def measure_sgemm() -> dict:
    """Best FP32 GEMM rate of NumPy and torch on this machine (GFLOP/s)."""
    rates = {}
    shapes = ((2048, 2048, 2048), (4096, 1024, 4096))
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        t, _, _ = _best_time(lambda a=a, b=b: a @ b, budget=3.0)
        rates[f"numpy {m}x{k}x{n}"] = 2 * m * k * n / t / 1e9
        try:
            torch = _torch()
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            t, _, _ = _best_time(lambda ta=ta, tb=tb: ta @ tb, budget=3.0)
            rates[f"torch {m}x{k}x{n}"] = 2 * m * k * n / t / 1e9
        except ImportError:
            pass
    peak = max(rates.values())
    # for context: one core's rate (the references run their BLAS on one thread, blas_pool)
    m, k, n = shapes[0]
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    with _one_blas_thread():
        t, _, _ = _best_time(lambda: a @ b, budget=3.0)
    rates[f"numpy {m}x{k}x{n}, 1 thread (not used as the roofline)"] = 2 * m * k * n / t / 1e9
    dgemm = measure_dgemm()
    return {"rates": rates, "peak": peak, **dgemm, "widen": measure_widening()}


def measure_dgemm() -> dict:
    """Best float64 GEMM rate of NumPy (the goldens' K-tile sums; GFLOP/s)."""
    rng = np.random.default_rng(1)
    rates = {}
    for m, k, n in ((2048, 2048, 2048), (4096, 1024, 4096)):
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        t, _, _ = _best_time(lambda a=a, b=b: a @ b, budget=3.0)
        rates[f"numpy float64 {m}x{k}x{n}"] = 2 * m * k * n / t / 1e9
    return {"dgemm_rates": rates, "dgemm_peak": max(rates.values())}


def _widen_tiles(w: np.ndarray) -> None:
    """Widen BF16 ``w`` to float64 one 128-row tile at a time into one reused buffer (what
    reference.arith.matmul_fp32_widening does)."""
    buf = np.empty((128, w.shape[1]), dtype=np.float64)
    for k0 in range(0, w.shape[0], 128):
        np.copyto(buf, w[k0 : k0 + 128], casting="unsafe")


def measure_widening() -> dict:
    """BF16 -> float64 widening rate (elements/s) into a cache-resident reused buffer, on one
    thread and on every usable core at once (the best is the floor's rate)."""
    from concurrent.futures import ThreadPoolExecutor

    import ml_dtypes

    cores = usable_cpus()
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal((3072, 3072), dtype=np.float32).astype(ml_dtypes.bfloat16)
          for _ in range(cores)]  # fmt: skip
    n = ws[0].size
    t1, _, _ = _best_time(lambda: _widen_tiles(ws[0]), budget=2.0)
    rates = {"1 thread": n / t1}
    if cores > 1:
        with ThreadPoolExecutor(cores) as pool:
            tn, _, _ = _best_time(lambda: list(pool.map(_widen_tiles, ws)), budget=2.0)
        rates[f"{cores} threads"] = cores * n / tn
    return {"rates": rates, "best": max(rates.values())}


def design_floor_s(r: CaseResult, sgemm: dict) -> float | None:
    """The design floor of one case: the live FLOPs at this machine's dgemm rate (every K-tile
    sum is float64) plus the operand elements the golden widens to float64 at the measured
    widening rate; both rates measured in the same run. ``None`` without the rates."""
    if "dgemm_peak" not in sgemm or "widen" not in sgemm:
        return None
    return r.live_flop / (sgemm["dgemm_peak"] * 1e9) + r.widen_elems / sgemm["widen"]["best"]


def _one_blas_thread():
    """NumPy's OpenBLAS on one thread for the duration (a no-op context if unavailable)."""
    import contextlib

    try:
        from tilesim.reference.util.blas_pool import blas_threads
    except ImportError:
        return contextlib.nullcontext()
    old = os.environ.get("TILESIM_BLAS_THREADS")
    os.environ["TILESIM_BLAS_THREADS"] = "1"
    try:
        return blas_threads()
    finally:  # blas_threads() reads the variable when called, i.e. above
        if old is None:
            os.environ.pop("TILESIM_BLAS_THREADS", None)
        else:
            os.environ["TILESIM_BLAS_THREADS"] = old


@dataclass
class CaseResult:
    name: str
    family: str
    op: str
    flop: int
    live_flop: int
    ref_s: float
    torch_s: float | None
    ref_cpu: float
    torch_cpu: float | None
    roofline_s: float
    check: str
    build_s: float
    notes: list = field(default_factory=list)
    widen_elems: int = 0
    floor_s: float | None = None  # design floor (design_floor_s), set by the parent process

    @property
    def speedup(self) -> float | None:
        return None if self.torch_s is None else self.torch_s / self.ref_s

    @property
    def roofline_ratio(self) -> float:
        return self.ref_s / self.roofline_s if self.roofline_s > 0 else math.inf

    @property
    def floor_ratio(self) -> float | None:
        return None if not self.floor_s else self.ref_s / self.floor_s

    def target_rate(self, speedup: float) -> float | None:
        """GFLOP/s (of the live work) of a reference ``speedup`` x faster than the torch loop."""
        if self.torch_s is None or not math.isfinite(self.torch_s):
            return None
        return speedup * self.live_flop / self.torch_s / 1e9


def _bench_only_cases() -> dict:
    """Cases the bench times that are not in the registry (built by the family builder)."""
    from tilesim.shared.registry.case_schema import CaseInfo

    m3 = {"num_experts": 8, "hidden_size": 6144, "intermediate_size": 3072,
          "activation": "swigluoai", "counts": (32,) * 8, "seed": 7, "input_scale": 0.5,
          "weight_scale": 0.02, "rtol": 0.015, "atol": 0.5}  # fmt: skip
    return {
        M3_SIZE_CASE: CaseInfo(
            name=M3_SIZE_CASE,
            family="moe",
            op="moe_grouped_gemm",
            model="MiniMax-M3",
            summary="M3-size: E 8, H 6144, I 3072, swigluoai, 32 rows per expert",
            seed=7,
            size="medium",
            tolerance={"mode": "compare", "atol": 0.5, "rtol": 0.015, "ratio": 0.0},
            builder="tilesim.reference.cases.moe:moe_make_case",
            status="tilesim extra",
            builder_params={"case": None, **m3},
        )
    }


#: an M3-size grouped GEMM (the second MoE case of the bench), built with moe_make_case
M3_SIZE_CASE = "bench_m3_e8_h6144_i3072_r256"


def case_info(name: str):
    """The registry's case, or one of the bench's own (:func:`_bench_only_cases`)."""
    from tilesim.cli.registry import get_case

    extra = _bench_only_cases()
    return extra[name] if name in extra else get_case(name)


def bench_case(name: str, peak_gflops: float, *, with_torch: bool = True) -> CaseResult:
    from tilesim.cli.runner import build_case, run_reference

    built = build_case(case_info(name))
    flop = flop_count(built)
    # Small cases: three interleaved rounds (reference, torch, reference, torch, ...) of
    # best-of timing, so a burst of load from other users hits both sides alike; the minimum
    # over all rounds is reported. Big cases (> 50 GFLOP): one run each.
    rounds, budget = (ROUNDS, 1.0) if flop < 5e10 else (1, 0.0)
    fn = goldens.torch_golden_for(built) if with_torch else None
    ref_s = ref_cpu = math.inf
    torch_s, torch_cpu, check = (math.inf, math.inf, "") if fn else (None, None, "not run")
    for _ in range(rounds):
        t, c, ref = _best_time(lambda: run_reference(built)["out"], budget=budget)
        if t < ref_s:
            ref_s, ref_cpu = t, c
        if fn is not None:
            t, c, tout = _best_time(fn, budget=budget)
            if t < torch_s:
                torch_s, torch_cpu = t, c
    if fn is not None:
        check = goldens.check(built, ref, tout)
    return CaseResult(
        name=name,
        family=built.info.family,
        op=built.op_name,
        flop=flop,
        live_flop=live_flop_count(built),
        ref_s=ref_s,
        torch_s=torch_s,
        ref_cpu=ref_cpu,
        torch_cpu=torch_cpu,
        roofline_s=flop / (peak_gflops * 1e9),
        check=check,
        build_s=built.build_seconds,
        widen_elems=widen_count(built),
    )


def memory_child(name: str) -> None:
    """Build + run one case in this (fresh) process; print timings and ru_maxrss as JSON."""
    from tilesim.cli.registry import get_case
    from tilesim.cli.runner import build_case, run_reference

    t0 = time.perf_counter()
    built = build_case(get_case(name))
    t1 = time.perf_counter()
    outs = run_reference(built)
    out = outs["attn_out" if "attn_out" in outs else "out"]  # the layer step's / the op's
    t2 = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss_kib = ru.ru_maxrss  # KiB on Linux
    print(
        json.dumps(
            {
                "case": name,
                "build_s": t1 - t0,
                "run_s": t2 - t1,
                "total_s": t2 - t0,
                "cpu_s": ru.ru_utime + ru.ru_stime,
                "maxrss_gib": rss_kib / 2**20,
                "out_finite": bool(np.isfinite(out.astype(np.float32)).all()),
            }
        )
    )


def run_case_child(name: str, peak: float, args: argparse.Namespace) -> CaseResult:
    """Time one case in a fresh interpreter. In one long process, the torch goldens measured
    after many other cases were seen to take 10-50x more CPU time than in a fresh process
    (cause not pinned down); a process per case keeps every measurement independent."""
    cmd = [sys.executable, "-m", "bench", "--case-child", name, "--peak", repr(peak),
           "--torch-threads", str(args.torch_threads)]  # fmt: skip
    if args.no_torch:
        cmd.append("--no-torch")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=child_env())
    if p.returncode != 0:
        raise RuntimeError(f"bench of {name} failed:\n{p.stderr[-2000:]}")
    return CaseResult(**json.loads(p.stdout.strip().splitlines()[-1]))


def run_memory(name: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "bench", "--memory-child", name],
        capture_output=True,
        text=True,
        timeout=1800,
        env=child_env(),
    )
    if p.returncode != 0:
        return {"case": name, "error": p.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(p.stdout.strip().splitlines()[-1])
