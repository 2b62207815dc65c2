"""Benchmark of the NumPy references (``nox -s bench``; not part of CI).

For each family, on the seeds' named cases (``tilesim/cases.json``), measured in one run:

* the reference's wall time (``tilesim.reference`` op on the case's inputs, what ``tilesim
  golden`` runs);
* a plain torch golden written the way the seeds' tests write theirs: Python loops per expert
  (MoE), per batch (MSA decode), per head x query block x slot (MSA main branch), per (batch,
  query token) x KV tile (DeepSeek); our own code, FP32 torch math on CPU. Each one is checked
  against the reference with the case's tolerance, so the timing compares like with like;
* the FLOP roofline: the op's FLOP count divided by this machine's measured sgemm rate (best
  of NumPy and torch FP32 matmul on 2048^3 and 4096x4096x1024, all threads);
* peak memory (``ru_maxrss``) and wall time of the DeepSeek b64 s2 64K golden, built and run in
  a fresh subprocess.

Writes ``docs/perf/reference.md`` and ``docs/perf/reference.png``. Run
``python -m tilesim.bench --help`` for the options (``--quick`` for the small cases only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: the seeds' cases timed per family (quick mode keeps the first of each group)
BENCH_CASES = {
    "moe": ["m27_case_001", "m3_case_smoke_edge"],
    "msa": [
        "msa_indexer_nb17",
        "msa_decode_e2e_nb17",
        "msa_decode_b64_nb17",
        "msa_main_aligned_4096",
        "msa_main_aligned_2048",
        "msa_main_unaligned_1500",
        "msa_main_aligned_1024",
        "msa_main_unaligned_500",
        "msa_main_unaligned_100",
    ],
    "dsa": [
        "sfa_bf16_b4_s2_seq64K_total_fp8_d",
        "sfa_bf16_b4_s2_seq64K_total_int8_d",
        "sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d",
        "sfa_bf16_b4_s2_seq64K_per_fp8_d",
        "sfa_bf16_b64_s2_seq64K_per_fp8_d",
    ],
}
QUICK_CASES = {
    "moe": ["m3_case_smoke_edge"],
    "msa": ["msa_indexer_nb17", "msa_main_unaligned_100"],
    "dsa": ["sfa_bf16_b4_s2_seq64K_total_fp8_d"],
}
MEMORY_CASE = "sfa_bf16_b64_s2_seq64K_per_fp8_d"
#: interleaved timing rounds of a small case (see bench_case)
ROUNDS = 3
TARGETS = {"speedup_vs_torch": 10.0, "roofline_ratio": 3.0, "big_seconds": 60.0, "big_gib": 8.0}


# ---------------------------------------------------------------------------------------------
# torch helpers


def _torch():
    import torch

    return torch


def t_of(a: np.ndarray):
    """NumPy/ml_dtypes array -> torch tensor with the same bits (bf16, fp8 via raw views)."""
    torch = _torch()
    a = np.ascontiguousarray(a)
    name = a.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def np_of(t) -> np.ndarray:
    """torch tensor -> NumPy (bf16 via ml_dtypes)."""
    import ml_dtypes

    torch = _torch()
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------------------------------------
# plain torch goldens, the seeds' way (loops in Python, FP32 math)


def torch_moe(args: dict, round_activation: bool):
    """Per-expert F.linear golden (op-facts 1.7) on the kernel-layout weights."""
    torch = _torch()
    F = torch.nn.functional
    dims = args["dims"]
    e_cnt, h, i = dims.num_experts, dims.hidden_size, dims.intermediate_size
    x = t_of(args["sorted_tokens"])
    w13, w2 = (t_of(w) for w in args["weights"])
    cs = args["expert_cumsum"].tolist()
    out = torch.zeros(x.shape, dtype=torch.bfloat16)
    for e in range(e_cnt):
        s, t = cs[e], cs[e + 1]
        if t == s:
            continue
        gate_up = w13[e * h : (e + 1) * h].T  # checkpoint layout [2I, H]
        down = w2[e * i : (e + 1) * i].T  # [H, I]
        gu = F.linear(x[s:t].float(), gate_up.float())
        gate, up = gu[:, :i], gu[:, i:]
        if dims.activation == "silu":
            act = F.silu(gate) * up
        else:
            g = gate.clamp(max=dims.limit)
            u = up.clamp(-dims.limit, dims.limit)
            act = (u + dims.beta) * g * torch.sigmoid(dims.alpha * g)
        if round_activation:
            act = act.bfloat16().float()
        out[s:t] = F.linear(act, down.float()).bfloat16()
    return out


def torch_msa_indexer(args: dict):
    """BF16 score matmul, block max, head max, top-15 + local block (op-facts 2.7)."""
    torch = _torch()
    q, k, nb = t_of(args["idx_q"]), t_of(args["idx_k"]), int(args["nb"])
    sc = torch.matmul(q, k.T)  # BF16 result, as the seeds' reference
    blk = sc.float().view(q.shape[0], nb, 128).amax(-1).amax(0)
    if nb <= 16:
        return torch.arange(nb, dtype=torch.int32).view(1, nb)
    top = torch.topk(blk[: nb - 1], 15).indices
    return torch.cat([top, torch.tensor([nb - 1])]).to(torch.int32).view(1, 16)


def torch_msa_decode(args: dict):
    """The seeds' ``_gather_oracle``, one batch row at a time (op-facts 3.7)."""
    torch = _torch()
    q, kb, vb = t_of(args["q"]), t_of(args["k_blocks"]), t_of(args["v_blocks"])
    ids = np.asarray(args["block_ids"]).astype(np.int64)
    bsz, hq, d = q.shape
    hkv, by = kb.shape[1], kb.shape[3]
    seq = np.broadcast_to(np.asarray(args["seq_len"]), (bsz,))
    out = torch.zeros(bsz, hq, d)
    scale = d**-0.5
    for b in range(bsz):
        sel = torch.from_numpy(ids[b])
        cur = (int(seq[b]) - 1) // by
        valid = int(seq[b]) - cur * by
        kg = kb[b][:, sel].reshape(hkv, -1, d).repeat_interleave(hq // hkv, 0).float()
        vg = vb[b][:, sel].reshape(hkv, -1, d).repeat_interleave(hq // hkv, 0).float()
        s = (q[b].float().unsqueeze(1) @ kg.transpose(1, 2)).squeeze(1) * scale  # [HQ, keys]
        for j, blk in enumerate(ids[b].tolist()):
            if blk == cur:
                s[:, j * by + valid : (j + 1) * by] = -torch.inf
            elif blk > cur:
                s[:, j * by : (j + 1) * by] = -torch.inf
        p = torch.softmax(s, -1)
        out[b] = (p.unsqueeze(1) @ vg).squeeze(1)
    return out


def torch_msa_main(args: dict, topk_indices: np.ndarray):
    """The seeds' main-branch golden: per head, per query block, per reachable slot
    (op-facts 4.7): scores of each slot, causal mask on the diagonal block, one softmax over
    the concatenated slots, times the concatenated V."""
    torch = _torch()
    q = torch.from_numpy(np.asarray(args["query"], dtype=np.float32))
    kb = torch.from_numpy(np.asarray(args["key_blocks"], dtype=np.float32))
    vb = torch.from_numpy(np.asarray(args["value_blocks"], dtype=np.float32))
    n, hq, d = q.shape
    bk = 128
    nbk = -(-n // bk)
    hkv = kb.shape[1]
    sel = [int(x) for x in topk_indices]
    qpad = torch.zeros(nbk * bk, hq, d)
    qpad[:n] = q
    causal = torch.triu(torch.full((bk, bk), -1e9), diagonal=1)
    scale = d**-0.5
    out = torch.zeros(n, hq, d)
    for h in range(hq):
        hk = h // (hq // hkv)
        for qb in range(nbk):
            qh = qpad[qb * bk : (qb + 1) * bk, h]
            ss, vs = [], []
            for i, kv in enumerate(sel):
                if kv > qb:
                    continue
                s = qh @ kb[i * bk : (i + 1) * bk, hk].T * scale
                if kv == qb:
                    s = s + causal
                ss.append(s)
                vs.append(vb[i * bk : (i + 1) * bk, hk])
            if not ss:
                continue
            p = torch.softmax(torch.cat(ss, -1), -1)
            o = p @ torch.cat(vs, 0)
            rows = min(bk, n - qb * bk)
            out[qb * bk : qb * bk + rows, h] = o[:rows]
    return out


def torch_dsa(args: dict, op_name: str):
    """The seeds' DeepSeek golden (op-facts 5.8): per (batch, query token), gather the used
    rows through the block table, dequantize, then per KV tile S = Q K^T, softmax pieces, and
    the online merge (decode preset) or the per-tile normalised output (prefill preset)."""
    torch = _torch()
    cfg = args["tile_config"]
    nq, topk, bs = int(args["nq"]), int(args["topk"]), int(args["block_size"])
    scale = float(args["softmax_scale"])
    qn, qr = t_of(args["query_nope"]), t_of(args["query_rope"])
    ti = torch.from_numpy(np.asarray(args["topk_indices"]).astype(np.int64))
    bt = torch.from_numpy(np.asarray(args["block_table"]).astype(np.int64))
    acts = np.asarray(args["kv_act_seqs"]).tolist()
    if op_name.endswith("kv_split"):
        kq = args["kn_quant"]
        nope_all = t_of(kq) if kq.dtype.name != "int8" else torch.from_numpy(kq)
        rope_all, sc_all = t_of(args["kr"]), torch.from_numpy(args["kn_scales"])
        packed = None
    else:
        layout = args.get("layout", "pypto")
        if layout != "pypto":
            raise ValueError(f"torch golden: layout {layout!r} not covered")
        packed = torch.from_numpy(np.ascontiguousarray(args["nope_cache"]).view(np.uint8))
        is_int8 = args["nope_cache"].dtype.name == "int8"
    n_b = len(acts)
    s1 = qn.shape[0] // (n_b * nq)
    stile = cfg.s_kv_tile
    out = torch.zeros(qn.shape[0], 512, dtype=torch.bfloat16)
    for b in range(n_b):
        for s in range(s1):
            cur = min(max(acts[b] - s1 + 1 + s, 0), topk)
            r = b * s1 + s
            if cur == 0:
                continue
            idx = ti[r, :cur]
            phys = bt[b, idx // bs] * bs + idx % bs
            if packed is not None:
                rows = packed[phys]
                raw = rows[:, :512]
                nope = raw.view(torch.int8).float() if is_int8 else raw.view(torch.float8_e4m3fn)
                nope = nope.float()
                kr = rows[:, 512:640].contiguous().view(torch.bfloat16)
                sc = rows[:, 640:656].contiguous().view(torch.float32)
            else:
                nope, kr, sc = nope_all[phys].float(), rope_all[phys], sc_all[phys]
            kn = (nope.view(cur, 4, 128) * sc.view(cur, 4, 1)).view(cur, 512).bfloat16()
            k = torch.cat([kn, kr], 1).float()
            q = torch.cat([qn[r * nq : (r + 1) * nq], qr[r * nq : (r + 1) * nq]], 1).float()
            o_acc = m_acc = l_acc = None
            res = None
            for t0 in range(0, cur, stile):
                kt, vt = k[t0 : t0 + stile], kn[t0 : t0 + stile].float()
                sc_t = (q @ kt.T) * scale
                m = sc_t.amax(-1, keepdim=True)
                p = torch.exp(sc_t - m)
                lsum = p.sum(-1, keepdim=True)
                if cfg.softmax == "per_tile":
                    res = ((p / lsum).bfloat16().float() @ vt).bfloat16()  # last tile wins
                    continue
                o_t = p.bfloat16().float() @ vt
                if o_acc is None:
                    o_acc, m_acc, l_acc = o_t, m, lsum
                else:
                    m_new = torch.maximum(m_acc, m)
                    a, c = torch.exp(m_acc - m_new), torch.exp(m - m_new)
                    l_acc = a * l_acc + c * lsum
                    o_acc = o_acc * a + o_t * c
                    m_acc = m_new
            if cfg.softmax != "per_tile":
                res = (o_acc / l_acc).bfloat16()
            out[r * nq : (r + 1) * nq] = res
    return out


# ---------------------------------------------------------------------------------------------
# FLOP counts (what the kernel computes, masked columns included)


def flop_count(built) -> int:
    a, op = built.op_args, built.op_name
    if op == "moe_grouped_gemm":
        d = a["dims"]
        n = int(np.diff(a["expert_cumsum"]).sum())
        return 6 * n * d.hidden_size * d.intermediate_size  # mm1 2*H*2I + mm2 2*I*H per row
    if op in ("msa_indexer", "msa_indexer_scores"):
        return 2 * a["idx_q"].shape[0] * a["idx_k"].shape[0] * a["idx_k"].shape[1]
    if op == "msa_sparse_decode":
        bsz, hq, d = a["q"].shape
        keys = np.asarray(a["block_ids"]).shape[1] * a["k_blocks"].shape[3]
        return 2 * bsz * hq * keys * 2 * d  # QK^T and PV
    if op == "msa_main_branch":
        n, hq, d = a["query"].shape
        return 2 * n * hq * a["key_blocks"].shape[0] * 2 * d
    if op.startswith("sparse_attention_antiquant"):
        nq, topk = int(a["nq"]), int(a["topk"])
        acts = np.asarray(a["kv_act_seqs"], dtype=np.int64)
        s1 = a["query_nope"].shape[0] // (acts.size * nq)
        s = np.arange(s1)
        cur = np.clip(acts[:, None] - s1 + 1 + s[None, :], 0, topk)
        return int(2 * nq * cur.sum() * (576 + 512))
    raise ValueError(f"no FLOP formula for {op}")


def live_flop_count(built) -> int:
    """FLOPs any golden has to do: the kernel's count minus the keys no query row of a block
    can see (MSA main branch: future blocks and padding slots, which the seeds' golden and the
    reference both skip). Equal to :func:`flop_count` for the other ops."""
    a, op = built.op_args, built.op_name
    if op != "msa_main_branch":
        return flop_count(built)
    n, hq, d = a["query"].shape
    mask = np.asarray(a["block_mask"])  # [ceil(n/bk), topk, bk, bk]
    nbq, _, bk, _ = mask.shape
    rows = np.minimum(bk, n - np.arange(nbq) * bk)  # real query rows per query block
    live = (mask > np.float32(-1e9)).any(axis=(2, 3))  # [nbq, topk]
    return int(2 * hq * 2 * d * bk * (rows[:, None] * live).sum())


# ---------------------------------------------------------------------------------------------
# measurement


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


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _set_torch_threads(n: int) -> int | None:
    try:
        torch = _torch()
    except ImportError:
        return None
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def _warm_torch() -> None:
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
    return {"rates": rates, "peak": peak}


def _one_blas_thread():
    """NumPy's OpenBLAS on one thread for the duration (a no-op context if unavailable)."""
    import contextlib

    try:
        from tilesim.reference.blas_pool import blas_threads
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

    @property
    def speedup(self) -> float | None:
        return None if self.torch_s is None else self.torch_s / self.ref_s

    @property
    def roofline_ratio(self) -> float:
        return self.ref_s / self.roofline_s if self.roofline_s > 0 else math.inf

    def target_rate(self, speedup: float) -> float | None:
        """GFLOP/s (of the live work) of a reference ``speedup`` x faster than the torch loop."""
        if self.torch_s is None or not math.isfinite(self.torch_s):
            return None
        return speedup * self.live_flop / self.torch_s / 1e9


def _check(built, ref_out: np.ndarray, torch_out) -> str:
    """The torch golden agrees with the reference under the case's tolerance rule."""
    from tilesim.reference import compare

    spec = built.spec
    t = np_of(torch_out)
    r = np.asarray(ref_out)
    if spec.tolerance.get("mode") == "set":
        ok = sorted(r.ravel().tolist()) == sorted(t.ravel().tolist())
        return "same block set" if ok else "DIFFERENT block set"
    rep = compare(
        r.astype(np.float32),
        t.astype(np.float32),
        atol=spec.atol,
        rtol=spec.rtol,
        ratio=spec.ratio,
        check_dtype=False,
    )
    verdict = "agrees" if rep.passed else "DISAGREES"
    return (
        f"{verdict} ({rep.n_fail} > tol, allowed {rep.threshold}; "
        f"max abs err {rep.max_abs_err:.2g})"
    )


def torch_golden_for(built) -> Callable[[], object] | None:
    a, op = built.op_args, built.op_name
    if op == "moe_grouped_gemm":
        meta = built.extra.get("meta", {})
        rnd = bool(meta.get("seed_golden_round_activation", True))
        return lambda: torch_moe(a, rnd)
    if op == "msa_indexer":
        return lambda: torch_msa_indexer(a)
    if op == "msa_sparse_decode":
        return lambda: torch_msa_decode(a)
    if op == "msa_main_branch":
        ids = (built.extra.get("meta") or {}).get("topk_indices")
        if ids is None:  # the builder did not say which blocks it selected
            return None
        ids = np.asarray(ids).ravel()
        return lambda: torch_msa_main(a, ids)
    if op.startswith("sparse_attention_antiquant"):
        return lambda: torch_dsa(a, op)
    return None


def bench_case(name: str, peak_gflops: float, *, with_torch: bool = True) -> CaseResult:
    from tilesim.cli.registry import get_case
    from tilesim.cli.runner import build_case, run_reference

    spec = get_case(name)
    built = build_case(spec)
    flop = flop_count(built)
    # Small cases: three interleaved rounds (reference, torch, reference, torch, ...) of
    # best-of timing, so a burst of load from other users hits both sides alike; the minimum
    # over all rounds is reported. Big cases (> 50 GFLOP): one run each.
    rounds, budget = (ROUNDS, 1.0) if flop < 5e10 else (1, 0.0)
    fn = torch_golden_for(built) if with_torch else None
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
        check = _check(built, ref, tout)
    return CaseResult(
        name=name,
        family=spec.family,
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
    )


def memory_child(name: str) -> None:
    """Build + run one case in this (fresh) process; print timings and ru_maxrss as JSON."""
    from tilesim.cli.registry import get_case
    from tilesim.cli.runner import build_case, run_reference

    t0 = time.perf_counter()
    built = build_case(get_case(name))
    t1 = time.perf_counter()
    out = run_reference(built)["out"]
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
    cmd = [sys.executable, "-m", "tilesim.bench", "--case-child", name, "--peak", repr(peak),
           "--torch-threads", str(args.torch_threads)]  # fmt: skip
    if args.no_torch:
        cmd.append("--no-torch")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"bench of {name} failed:\n{p.stderr[-2000:]}")
    return CaseResult(**json.loads(p.stdout.strip().splitlines()[-1]))


def run_memory(name: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "tilesim.bench", "--memory-child", name],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if p.returncode != 0:
        return {"case": name, "error": p.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# report


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        torch = _torch()
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["torch"] = "not installed"
    try:
        la = os.getloadavg()
        info["load_avg"] = f"{la[0]:.1f} {la[1]:.1f} {la[2]:.1f}"
    except OSError:
        pass
    return info


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def _fmt_x(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}x"


def _fmt_target_rate(r: CaseResult, peak: float) -> str:
    rate = r.target_rate(TARGETS["speedup_vs_torch"])
    if rate is None:
        return "-"
    return f"{rate:.0f}" + (" (> peak)" if rate > peak else "")


def write_report(
    out_dir: Path,
    results: list[CaseResult],
    sgemm: dict,
    mem: dict | None,
    info: dict,
    started: float,
    load_before: str,
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "reference.png"
    _plot(png, results)
    lines = [
        "# Reference performance (generated by `nox -s bench`)",
        "",
        "Generated by `python -m tilesim.bench` (the `bench` nox session) on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}. **Numbers are noisy**: "
        "the machine is shared (up to 8 engineers on 2 cores; load average "
        f"{load_before} before the run, {info.get('load_avg', '?')} after). Read ratios, "
        "not absolute times, and re-run before relying on a number.",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, NumPy "
        f"{info['numpy']}, torch {info.get('torch')}. The torch goldens run with "
        f"{info.get('torch_threads', '?')} intra-op thread(s) (`--torch-threads`, default: every "
        "usable core, like the references); the DeepSeek reference runs its query "
        f"tokens on {info.get('ref_workers', '?')} worker thread(s) with one BLAS thread each "
        "(`TILESIM_REF_THREADS`, `TILESIM_BLAS_THREADS`), the other references use NumPy's "
        "default BLAS threads. Each case is timed in a fresh interpreter. On a 2-core machine "
        "shared with other jobs, multi-threaded OpenMP/BLAS timings swing by 10-100x.",
        "",
        "## sgemm roofline",
        "",
        "| FP32 GEMM | GFLOP/s |",
        "|---|---|",
        *[f"| {k} | {v:.1f} |" for k, v in sgemm["rates"].items()],
        "",
        f"Roofline rate used below: **{sgemm['peak']:.1f} GFLOP/s** (the best of the above). "
        "Roofline time = the op's FLOP count (what the kernel computes, masked keys included) "
        "/ that rate.",
        "",
        "## Reference vs plain torch golden vs roofline",
        "",
        "`reference` = the `tilesim.reference` op on the case's inputs (input building "
        "excluded; small cases: the best of 3 interleaved rounds of up to 5 runs each, big "
        "cases (> 50 GFLOP): one run). `torch loop` = "
        "our plain torch golden written the way the seeds' tests write theirs (Python loops "
        "per expert / per batch / per head x query block / per query token x KV tile, FP32). "
        "`speed-up` = torch loop / reference (target >= "
        f"{TARGETS['speedup_vs_torch']:.0f}x on DeepSeek and MSA); `x roofline` = reference / "
        f"roofline time (target <= {TARGETS['roofline_ratio']:.0f}x). `check` = the torch golden "
        "judged against the reference with the case's own tolerance rule. Times are wall "
        "clock; in brackets the CPU time of the same run (all threads), which other users of "
        "the machine disturb much less.",
        "",
        f"`{TARGETS['speedup_vs_torch']:.0f}x needs` = the GFLOP/s a reference "
        f"{TARGETS['speedup_vs_torch']:.0f}x faster than the torch loop would run at, counting "
        "only the live work both must do (the MSA main branch's goldens skip blocks no query "
        "row can see); `(> peak)` marks a target above this machine's sgemm peak.",
        "",
        "| case | op | GFLOP | reference (cpu) | torch loop (cpu) | speed-up | roofline "
        f"| x roofline | {TARGETS['speedup_vs_torch']:.0f}x needs (GFLOP/s) | check |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.op} | {r.flop / 1e9:.2f} | {_fmt_s(r.ref_s)} ({_fmt_s(r.ref_cpu)}) "
            f"| {_fmt_s(r.torch_s)} ({_fmt_s(r.torch_cpu)}) "
            f"| {_fmt_x(r.speedup)} | {_fmt_s(r.roofline_s)} | {_fmt_x(r.roofline_ratio)} "
            f"| {_fmt_target_rate(r, sgemm['peak'])} | {r.check} |"
        )
    lines += ["", "## Targets", ""]
    for fam in ("msa", "dsa"):
        fam_r = [r for r in results if r.family == fam and r.speedup is not None]
        if not fam_r:
            continue
        slow = [r.name for r in fam_r if r.speedup < TARGETS["speedup_vs_torch"]]
        beyond = [
            r.name
            for r in fam_r
            if r.name in slow and r.target_rate(TARGETS["speedup_vs_torch"]) > sgemm["peak"]
        ]
        far = [r.name for r in fam_r if r.roofline_ratio > TARGETS["roofline_ratio"]]
        lines.append(
            f"- {fam.upper()}: speed-up >= {TARGETS['speedup_vs_torch']:.0f}x on "
            f"{len(fam_r) - len(slow)} of {len(fam_r)} cases"
            + (f" (missed: {', '.join(slow)})" if slow else "")
            + (
                f"; for {len(beyond)} of the missed ones that speed would be above the sgemm "
                f"peak of {sgemm['peak']:.0f} GFLOP/s"
                if beyond
                else ""
            )
            + f"; within {TARGETS['roofline_ratio']:.0f}x of the roofline on "
            f"{len(fam_r) - len(far)} of {len(fam_r)}"
            + (f" (missed: {', '.join(far)})" if far else "")
            + "."
        )
    if mem:
        if "error" in mem:
            lines.append(f"- {mem['case']} golden in a subprocess FAILED: {mem['error']}")
        else:
            ok_t = mem["total_s"] < TARGETS["big_seconds"]
            ok_m = mem["maxrss_gib"] < TARGETS["big_gib"]
            lines.append(
                f"- {mem['case']} golden (fresh subprocess, inputs built + reference run): "
                f"{mem['total_s']:.1f} s wall (build {mem['build_s']:.1f} s, run "
                f"{mem['run_s']:.1f} s; {mem.get('cpu_s', float('nan')):.1f} s of CPU time; "
                f"target < {TARGETS['big_seconds']:.0f} s: {'met' if ok_t else 'MISSED'}), peak "
                f"RSS {mem['maxrss_gib']:.2f} GiB (target < {TARGETS['big_gib']:.0f} GiB: "
                f"{'met' if ok_m else 'MISSED'}); output finite: {mem['out_finite']}."
            )
    lines += [
        "",
        f"![reference vs torch loop vs roofline]({png.name})",
        "",
        "Reproduce: `nox -s bench` (or `python -m tilesim.bench --out docs/perf`); "
        "`--quick` runs only the small cases.",
        "",
    ]
    md = out_dir / "reference.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return md


def _plot(png: Path, results: list[CaseResult]) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    names = [r.name.replace("sfa_bf16_", "").replace("_seq64K", "") for r in results]
    y = np.arange(len(results))
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(results) + 1.6), dpi=90, layout="constrained")
    h = 0.27
    ax.barh(y - h, [r.roofline_s for r in results], h, label="FLOP roofline", color="tab:gray")
    ax.barh(y, [r.ref_s for r in results], h, label="tilesim reference", color="tab:blue")
    ax.barh(
        y + h,
        [r.torch_s or 0 for r in results],
        h,
        label="plain torch golden (seeds' loops)",
        color="tab:orange",
    )
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale; shared 2-core machine, noisy)")
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)
    ax.set_title("tilesim reference wall time vs the seeds-style torch golden and the roofline")
    fig.savefig(png)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilesim.bench", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs/perf", help="directory for reference.md/.png")
    p.add_argument("--quick", action="store_true", help="small cases only, no memory run")
    p.add_argument("--family", action="append", choices=sorted(BENCH_CASES))
    p.add_argument("--no-torch", action="store_true", help="skip the torch goldens")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=_usable_cpus(),
        help="intra-op threads of the torch goldens (default: every usable core, as the "
        "references use; OpenMP timings on an oversubscribed shared machine are erratic)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the b64 memory subprocess")
    p.add_argument("--memory-child", metavar="CASE", help=argparse.SUPPRESS)
    p.add_argument("--case-child", metavar="CASE", help=argparse.SUPPRESS)
    p.add_argument("--peak", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        memory_child(args.memory_child)
        return 0
    if args.case_child:
        _set_torch_threads(args.torch_threads)
        _warm_torch()
        r = bench_case(args.case_child, args.peak, with_torch=not args.no_torch)
        print(json.dumps(dataclasses.asdict(r)))
        return 0
    started = time.time()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    table = QUICK_CASES if args.quick else BENCH_CASES
    fams = args.family or list(table)
    _warm_torch()
    sgemm = measure_sgemm()
    torch_threads = _set_torch_threads(args.torch_threads)
    print(f"sgemm peak {sgemm['peak']:.1f} GFLOP/s", flush=True)
    results = []
    for fam in fams:
        for name in table[fam]:
            r = run_case_child(name, sgemm["peak"], args)
            results.append(r)
            print(
                f"{name:<45} ref {_fmt_s(r.ref_s):>9}  torch {_fmt_s(r.torch_s):>9}  "
                f"speed-up {_fmt_x(r.speedup):>7}  x roofline {_fmt_x(r.roofline_ratio):>7}  "
                f"{r.check}",
                flush=True,
            )
    mem = None
    if not args.quick and not args.no_memory and "dsa" in fams:
        mem = run_memory(MEMORY_CASE)
        print(f"memory: {mem}", flush=True)
    info = machine_info()
    info["torch_threads"] = torch_threads
    from tilesim.reference.blas_pool import ref_workers

    info["ref_workers"] = ref_workers()
    md = write_report(Path(args.out), results, sgemm, mem, info, started, load_before)
    print(f"wrote {md} and {md.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
