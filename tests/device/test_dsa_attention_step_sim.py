"""The DeepSeek-V3.2 layer step on the device (``tilesim.device.dsa_attention_step``): the MLA
prolog, indexer prolog, indexer and sparse attention kernels launched one after the other in
PyPTO's CPU simulator, judged stage by stage against the golden
:func:`tilesim.reference.dsa_attention_step` called with the switches the kernels implement.

What is asserted (CI: the small INT8 case ``dsa_attention_step_short_int8`` on the 910B and the
950, B 2, s1 2, lengths 300 / 1000, with ``index_k_tile=1024``, the indexer prolog kernel's K
tile at H = 7168; one simulator run per SoC, shared by the tests that read it):

1. every output of the three first stages -- the queries, ``q_norm`` and its scale, the latent
   cache triple, the index queries, scales, weights and index cache, the ids and the scores --
   bit for bit the golden's; ``attn_out`` within the sparse attention's budgets (its record's:
   ``bit_exact`` and ``row_ulp``): the attention's softmax ``exp`` is the device intrinsic
   where the golden rounds the float64 ``exp`` once, and its FP32 row sums follow the
   device's order, so a BF16 output may land one ULP off (docs/ops/dsa.md, "Rounding points");
2. the caches, from the inputs alone (independent of the golden): the case poisons every row
   no earlier token holds with NaN, the new tokens' slots included; each cache's rows outside
   the written slots keep their bytes, each written slot's row differs from the poison;
3. NumPy in -> NumPy out, no argument written; each stage kernel built once and no other
   (:func:`tilesim.device.compile_stats`); the outputs' digest is the committed kernel digest
   of the same call (``tests/digests/kernel_digests.json``, entry
   ``dsa_attention_step/short_int8@<soc>``: this run is that entry's CI check, so the digest
   test leaves it to the ``slow`` set instead of interpreting the step a second time);
4. ``tilesim compare`` judges the device outputs, dumped as one ``.npz``, against the golden
   directory of the same call (``tilesim golden`` replayed with ``index_k_tile``): every
   stage passes (910B).

5. the attention's build, a host decision from the lengths (``attention_unmasked``): the CI
   case's rows see fewer than ``topk`` keys, so the step asks for the masked build; the rule
   against an oracle that lists every row's visible keys, and (torch inputs, stages stubbed)
   the step's host reads are ``block_table`` and ``seq_lens`` once each at ``validate=True``
   and ``False``, whichever build (no CPU simulator).

``slow``: the layer at b4 s2 over 64K on both SoCs (cost only, the unmasked attention), each
stage's cost-model time and their sum, the layer's figure (``docs/ops/dsa_attention_step.md``,
"Kernel"); the INT8 case at ``topk`` 256 (every row sees >= topk keys) on the 910B: the
unmasked build, every stage judged as in CI, and the masked build's ``attn_out`` on the same
ids byte for byte the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared.registry.ops import record

ATTENTION_BUDGETS = record("dsa").budgets
CASE = "dsa_attention_step_short_int8"
#: the indexer prolog kernel's K tile of ``x @ w_k`` / ``x @ w_proj`` at H = 7168
INDEX_K_TILE = 1024
#: the four stage kernels' compile-registry names (the INT8 path's kv_split attention)
STAGE_KERNELS = ("dsa_indexer", "dsa_indexer_prolog", "dsa_sparse_attention_kv_split",
                 "mla_prolog")  # fmt: skip
#: each cache of the step: (name, width of its rows in elements)
CACHES = (("kv_cache", 512), ("kr_cache", 64), ("kv_scale_cache", 4), ("k_cache", 128),
          ("k_scale", 1))  # fmt: skip


#: the FP8 path's case (950): the kernels' latent cache form and K-block promotion
FP8_CASE = ("dsa_attention_step_short_fp8", {"cache_layout": "kv_split"},
            {"cache_layout": "kv_split", "fp8_promotion": "two_roundings"})  # fmt: skip


def _case(name: str = CASE, build: dict | None = None,
          call: dict | None = None) -> tuple[dict, dict, dict]:  # fmt: skip
    """``(inputs, params, tolerance)`` of the named case built with ``build`` (builder
    parameters), its params with ``index_k_tile`` and ``call``."""
    from tilesim.reference import dsa_attention_step_make_case

    case = dsa_attention_step_make_case(name, **(build or {}))
    prm = {k: v for k, v in case["params"].items() if k != "progress"}
    prm = {**prm, "index_k_tile": INDEX_K_TILE, **(call or {})}
    return dict(case["inputs"]), prm, case["tolerance"]


def _bytes(a) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a))
    return a.view(np.uint8).reshape(a.shape[0], -1) if a.ndim else a.view(np.uint8)


def _rows(a, width: int) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a))
    return a.reshape(-1, width).view(np.uint8)


def _cache_rows(ins: dict, out, slots: np.ndarray, block_size: int) -> dict:
    """Per cache: every row outside ``slots`` byte-equal to the input's, every slot's row
    changed (the input holds NaN there). The FP8 index cache (132-byte pages, codes then
    scales) is compared by page: the pages no slot falls in, the pages slots fall in."""
    found = {}
    for name, width in CACHES:
        if ins.get(name) is None:  # FP8: the k scales live in the pages
            continue
        rows, width = slots, width
        if np.asarray(ins[name]).dtype == np.uint8:  # FP8 pages [blocks, block_size * 132]
            rows, width = np.unique(slots // block_size), ins[name].shape[1]
        old, new = _rows(ins[name], width), _rows(getattr(out, name), width)
        other = np.ones(old.shape[0], bool)
        other[rows] = False
        found[name] = (bool(np.array_equal(old[other], new[other])),
                       bool((old[rows] != new[rows]).any(axis=1).all()))  # fmt: skip
    return found


def _attention_verdict(got, ref, tolerance: dict) -> dict:
    from tilesim.reference import judge

    rows = got.shape[0] * got.shape[1]
    g, r = got.reshape(rows, -1), ref.reshape(rows, -1)
    v = judge(g, r, {**tolerance, "row_ulp": ATTENTION_BUDGETS["row_ulp"]}, kind="dsa")
    return {"passed": bool(v.passed), "summary": v.summary(),
            "bit_exact": float(np.mean(g.view(np.uint16) == r.view(np.uint16)))}  # fmt: skip


def _spy_attention_builds() -> list:
    """In the simulator child: wraps the step's two attention wrappers so that each call
    appends the build the step asked for (its ``unmasked`` keyword) to the returned list."""
    import importlib

    step = importlib.import_module("tilesim.device.dsa_attention_step")  # the module

    asked = []

    def spy(real):
        def call(*args, **kw):
            asked.append("unmasked" if kw.get("unmasked") else "masked")
            return real(*args, **kw)

        return call

    for name in ("sparse_attention_antiquant", "sparse_attention_antiquant_kv_split"):
        setattr(step, name, spy(getattr(step, name)))
    return asked


def _masked_rerun_same_bits(out, ins: dict, prm: dict, soc: str) -> bool:
    """The kv_split attention's masked build (``validate=False``, no ``unmasked``) on the
    step's own queries, latent cache copies and ids: byte for byte the step's ``attn_out``."""
    from tilesim.device.dsa import sparse_attention_antiquant_kv_split
    from tilesim.shared.dsa_attention_step import latent_views
    from tilesim.shared.models import DEEPSEEK_V32

    t, nq = out.attn_out.shape[:2]
    caches = latent_views("kv_split", out.kv_cache, out.kr_cache, out.kv_scale_cache)
    got, _us = sparse_attention_antiquant_kv_split(
        out.query_nope.reshape(t * nq, -1), out.query_rope.reshape(t * nq, -1), *caches,
        out.topk_indices, ins["block_table"], ins["seq_lens"], nq=nq,
        softmax_scale=prm.get("softmax_scale", DEEPSEEK_V32.model_softmax_scale),
        topk=prm["topk"], block_size=prm["block_size"], tiling=prm.get("tiling"),
        backend="sim", soc=soc, validate=False)  # fmt: skip
    return bool(np.array_equal(_bytes(got), _bytes(out.attn_out.reshape(t * nq, -1))))


def run_step(dump: str, soc: str, case: tuple = (CASE, None, None), remask: bool = False) -> dict:
    """In the simulator child: the device step on the case (``(name, build, call)`` of
    :func:`_case`; NumPy in), the golden with the same arguments, the checks of the module
    docstring, the attention build the step asked for (``"attention_builds"``); writes the
    device outputs to ``dump`` (``.npz``, the step's output names). ``remask``: also the
    masked build on the step's ids (:func:`_masked_rerun_same_bits`)."""
    from digests.golden_digests import digest_of
    from tilesim.cli.tensorio import write_npz
    from tilesim.device import compile_stats, dsa_attention_step, reset_compile_stats
    from tilesim.reference import dsa_attention_step as golden
    from tilesim.reference.dsa_attention_step import step_args

    ins, prm, tol = _case(*case)
    before = {k: _bytes(v).copy() for k, v in ins.items() if isinstance(v, np.ndarray)}
    reset_compile_stats()
    asked = _spy_attention_builds()
    out, us = dsa_attention_step(**ins, **prm, backend="sim", soc=soc)
    builds = compile_stats()
    remasked = _masked_rerun_same_bits(out, ins, prm, soc) if remask else None
    kept = all(np.array_equal(before[k], _bytes(ins[k])) for k in before)
    ref = golden(**ins, **prm)
    exact = {f: bool(np.array_equal(_bytes(getattr(ref, f)), _bytes(getattr(out, f))))
             for f in out._fields if f != "attn_out" and getattr(ref, f) is not None}  # fmt: skip
    slots = step_args(**ins, **prm).slots
    write_npz(dump, {f: np.asarray(v) for f, v in out._asdict().items() if v is not None})
    return {"exact": exact, "attention": _attention_verdict(out.attn_out, ref.attn_out, tol),
            "caches": _cache_rows(ins, out, slots, prm["block_size"]), "kept": kept,
            "builds": builds, "us": us, "digest": digest_of(out), "attention_builds": asked,
            "masked_rerun_same_bits": remasked,
            "numpy_out": all(isinstance(v, np.ndarray) for v in out if v is not None),
            "metrics_attn": {"max_abs": float(np.max(np.abs(
                out.attn_out.astype(np.float64) - ref.attn_out.astype(np.float64))))}}  # fmt: skip


@pytest.fixture(scope="module")
def step_runs(tmp_path_factory):
    """``run(soc) -> (root, result)``: :func:`run_step` on the INT8 case, once per SoC and
    module (the device outputs dumped to ``root / "device.npz"``)."""
    from tilesim.device import sim

    done = {}

    def run(soc: str):
        if soc not in done:
            root = tmp_path_factory.mktemp(f"step_{soc}")
            dump = str(root / "device.npz")
            done[soc] = root, sim.isolated(run_step, dump, soc, soc=soc, timeout=1800)
        return done[soc]

    return run


def _committed_digest(soc: str) -> str:
    import json

    from digests.kernel_digests import DIGEST_FILE

    return json.loads(DIGEST_FILE.read_text())[f"dsa_attention_step/short_int8@{soc}"]


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("soc", [
    pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
    pytest.param("950", marks=pytest.mark.soc_950, id="950"),
])  # fmt: skip
def test_every_stage_on_the_device_is_the_goldens(step_runs, soc, sim_report, capsys):
    """Every stage's outputs against the golden, the caches' untouched rows, one build per
    stage, the kernel digest, and ``tilesim compare`` on the dump: one simulator run per SoC
    in one test (a second test reading the same run could land on another xdist worker and
    interpret the step again)."""
    root, r = step_runs(soc)
    a = r["attention"]
    sim_report.add(kernel="dsa_attention_step", soc=soc,
                   case="int8 b2 s2 short (T 4, four launches)",
                   bit_exact=a["bit_exact"], max_ulp=None, max_abs=r["metrics_attn"]["max_abs"],
                   us=r["us"])  # fmt: skip
    assert all(r["exact"].values()), r["exact"]
    assert a["passed"] and a["bit_exact"] >= ATTENTION_BUDGETS["bit_exact"], a
    for name, (untouched, written) in r["caches"].items():
        assert untouched and written, (name, r["caches"])
    assert r["kept"] and r["numpy_out"], r
    assert r["builds"] == dict.fromkeys(STAGE_KERNELS, 1), r["builds"]
    # rows that see fewer than topk keys (300 / 1000 < 2048): the indexer writes -1 padding,
    # the attention keeps its masked build
    assert r["attention_builds"] == ["masked"], r["attention_builds"]
    assert r["us"] > 0
    assert r["digest"] == _committed_digest(soc), "the step's output bits moved"
    _compare_passes_stage_by_stage(root, capsys)


def _compare_passes_stage_by_stage(root, capsys):
    """``tilesim compare`` judges the device dump against the CLI's golden of the case (the
    step's ``index_k_tile``) and passes every stage."""
    from tilesim.__main__ import main

    assert main(["golden", CASE, "-o", str(root / "case")]) == 0
    replay = ["golden", "--inputs", str(root / "case" / CASE), "--params",
              f'{{"index_k_tile": {INDEX_K_TILE}}}', "-o", str(root / "golden")]  # fmt: skip
    assert main(replay) == 0
    capsys.readouterr()
    code = main(["compare", str(root / "device.npz"), str(root / "golden" / CASE)])
    out = capsys.readouterr().out
    assert code == 0, out
    for stage in ("mla_prolog", "dsa_indexer_prolog", "dsa_indexer", "sparse_attention"):
        assert f"stage {stage}: PASS" in out, out


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.soc_950
def test_the_fp8_step_on_the_950_is_the_goldens(tmp_path):
    """The FP8 path (DeepSeek's prologs' kernels, the kv_split latent cache, FP8 index pages)
    on the 950: the same checks as the INT8 CI test."""
    from tilesim.device import sim

    r = sim.isolated(run_step, str(tmp_path / "fp8.npz"), "950", FP8_CASE, soc="950",
                     timeout=1800)  # fmt: skip
    assert all(r["exact"].values()), r["exact"]
    a = r["attention"]
    assert a["passed"] and a["bit_exact"] >= ATTENTION_BUDGETS["bit_exact"], a
    for name, (untouched, written) in r["caches"].items():
        assert untouched and written, (name, r["caches"])
    assert r["kept"] and r["numpy_out"] and r["us"] > 0, r
    assert len(r["builds"]) == 4 and set(r["builds"].values()) == {1}, r["builds"]
    assert r["attention_builds"] == ["masked"], r["attention_builds"]


#: the INT8 case with topk 256: every row sees at least topk keys (299 .. 1000 >= 256), so the
#: indexer fills every id and the step runs the attention's unmasked build
FULL_ROWS_CASE = (CASE, {"topk": 256}, None)


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.soc_910b
def test_rows_that_see_topk_keys_run_the_unmasked_attention(tmp_path):
    """Every row sees >= topk keys: the step asks for the attention's unmasked build, every
    stage passes the CI test's checks against the golden (the same topk), and the masked
    build on the same ids gives the same ``attn_out`` bytes (ids without ``-1``: the mask
    selects nothing)."""
    from tilesim.device import sim

    r = sim.isolated(run_step, str(tmp_path / "full.npz"), "910b", FULL_ROWS_CASE, True,
                     soc="910b", timeout=1800)  # fmt: skip
    assert r["attention_builds"] == ["unmasked"], r["attention_builds"]
    assert all(r["exact"].values()), r["exact"]
    a = r["attention"]
    assert a["passed"] and a["bit_exact"] >= ATTENTION_BUDGETS["bit_exact"], a
    assert r["masked_rerun_same_bits"] is True, r["masked_rerun_same_bits"]
    for name, (untouched, written) in r["caches"].items():
        assert untouched and written, (name, r["caches"])
    assert r["builds"] == dict.fromkeys(STAGE_KERNELS, 1), r["builds"]


# ----------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def small_case():
    ins, prm, _tol = _case()
    return ins, prm


def _both(ins: dict, prm: dict, **device_kw) -> list:
    """The golden's and the device step's exception for the same call (type, message)."""
    import tilesim.device as dev
    import tilesim.reference as ref

    got = []
    device = {"backend": "sim", "soc": "910b", **device_kw}
    for fn, kw in ((ref.dsa_attention_step, {}), (dev.dsa_attention_step, device)):
        with pytest.raises((ValueError, TypeError)) as e:
            fn(**ins, **prm, **kw)
        got.append((type(e.value), str(e.value)))
    return got


BAD = {
    "x rank": lambda i: i.update(x=i["x"][0]),
    "slot not the table's": lambda i: i.update(slot_mapping=np.array([5, 6, 7, 8], np.int64)),
    "w_qb dtype": lambda i: i.update(w_qb=i["w_qb"].astype(np.float32)),
    "seq_lens past the table": lambda i: i.update(seq_lens=np.array([300, 5000], np.int32)),
    "k_scale missing": lambda i: i.update(k_scale=None),
}


@pytest.mark.torch
@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_input_gets_the_goldens_message(small_case, bad):
    """The contract's checks with the golden's messages, before any kernel is built; nothing
    written."""
    ins, prm = small_case
    ins = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in ins.items()}
    BAD[bad](ins)
    before = {k: _bytes(v).copy() for k, v in ins.items() if isinstance(v, np.ndarray)}
    (tg, mg), (td, md) = _both(ins, prm)
    assert td is tg and md == mg
    assert all(np.array_equal(v, _bytes(ins[k])) for k, v in before.items())


@pytest.mark.torch
def test_nan_in_a_weight_is_refused_with_validate_full(small_case):
    ins, prm = small_case
    w = np.array(ins["w_k"], copy=True)
    w[5, 3] = np.nan
    (tg, mg), (td, md) = _both({**ins, "w_k": w}, prm, validate="full")
    assert td is tg and md == mg and md.startswith("w_k")


LACKS = {"index_k_tile": None, "int8_order": "pypto", "rms_form": "deepseek",
         "index_rope_pairing": "interleaved"}  # fmt: skip


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(LACKS))
def test_switch_values_the_kernels_lack_are_refused_by_name(small_case, name):
    """The golden takes the value; the device step refuses it before any work, naming the
    step's argument and the value."""
    import tilesim.device as dev

    ins, prm = small_case
    value = LACKS[name]
    kw = {**prm, name: value}
    if name == "index_rope_pairing":  # the interleaved pairing reads [T, 32] tables
        ins = {**ins, "cos": ins["cos"][:, :32].copy(), "sin": ins["sin"][:, :32].copy()}
    with pytest.raises(ValueError, match=rf"^{name}: the device step's stage kernels implement "
                       rf".*, got {value!r}"):  # fmt: skip
        dev.dsa_attention_step(**ins, **kw, backend="sim", soc="910b")


FP8_REFUSED = {
    "910b": ({}, r"^path: 'fp8' needs a SoC with FP8"),
    "950": ({}, r"^cache_layout: the device step's stage kernels implement \('kv_split',\)"),
    "950 fma": (FP8_CASE[1], r"^fp8_promotion: .*\('two_roundings',\)"),
}


@pytest.mark.torch
@pytest.mark.parametrize("which", sorted(FP8_REFUSED))
def test_fp8_values_without_a_kernel_are_refused_by_name(which):
    """FP8 on the 910B (no FP8 on the SoC); on the 950 the FP8 path's default packed latent
    rows and ``"fma"`` promotion, which its prolog kernels do not compute."""
    import tilesim.device as dev

    build, match = FP8_REFUSED[which]
    ins, prm, _tol = _case(FP8_CASE[0], build=build, call=build)
    with pytest.raises(ValueError, match=match):
        dev.dsa_attention_step(**ins, **prm, backend="sim", soc=which.split()[0])


# ----------------------------------------------------------------------------- attention build
def _visible_keys(seq_lens, s1: int) -> list[int]:
    """Every decode row's visible keys, row by row (batch ``b``'s ``s``-th new token sees
    ``seq_lens[b] - s1 + 1 + s``): the oracle of the build rule."""
    return [int(n) - s1 + 1 + s for n in seq_lens for s in range(s1)]


#: (seq_lens, s1, topk): the unmasked build exactly when every row sees >= topk keys
BUILD_RULE = {
    "64K b4 s2": ((65536,) * 4, 2, 2048),
    "short rows (CI case)": ((300, 1000), 2, 2048),
    "short rows, topk 256": ((300, 1000), 2, 256),
    "first row one key short": ((2048, 4000), 2, 2048),
    "first row exactly topk": ((2049, 4000), 2, 2048),
    "s1 3 boundary": ((2049,), 3, 2048),
    "s1 1": ((2048,), 1, 2048),
}


@pytest.mark.parametrize("which", sorted(BUILD_RULE))
def test_the_unmasked_build_exactly_when_every_row_sees_topk_keys(which):
    from tilesim.device.dsa_attention_step import attention_unmasked

    lens, s1, topk = BUILD_RULE[which]
    want = all(n >= topk for n in _visible_keys(lens, s1))
    assert attention_unmasked(np.array(lens, np.int32), s1, topk) is want
    assert attention_unmasked(None, s1, topk) is False  # no lengths read: masked


def _host_reads(inputs: dict):
    """A torch function mode counting host reads (``numpy``, ``__array__``, ``tolist``,
    ``item``: each a device-to-host copy on an NPU) of the watched torch inputs' storage, by
    input name (``.calls``; ``"<other>"``: a tensor that is no input)."""
    import collections

    import torch
    from torch.overrides import TorchFunctionMode

    owner = {t.untyped_storage().data_ptr(): n for n, t in inputs.items()
             if isinstance(t, torch.Tensor)}  # fmt: skip

    class Mode(TorchFunctionMode):
        calls = collections.Counter()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in {"numpy", "__array__", "tolist", "item"}:
                if args and isinstance(args[0], torch.Tensor):
                    ptr = args[0].untyped_storage().data_ptr()
                    self.calls[owner.get(ptr, "<other>")] += 1
            return func(*args, **(kwargs or {}))

    return Mode()


@pytest.mark.torch
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("topk", [2048, 256])
def test_the_build_comes_from_the_lengths_already_on_the_host(small_case, monkeypatch,
                                                              validate, topk):  # fmt: skip
    """Torch inputs, the launches stubbed: the step hands the attention the unmasked build
    exactly when every row sees ``topk`` keys (300 / 1000 lengths: topk 256 yes, 2048 no),
    and it reads on the host only ``block_table`` and ``seq_lens``, once each -- the reads
    its slot rule (``validate=False``) or integer checks make anyway: no new copy."""
    import importlib

    step = importlib.import_module("tilesim.device.dsa_attention_step")  # the module
    from tilesim.shared.dsa_attention_step import STAGE_NAMES
    from tilesim.shared.interop import to_torch

    ins, prm = small_case
    tins = {k: to_torch(np.ascontiguousarray(v)).clone() if isinstance(v, np.ndarray) else v
            for k, v in ins.items()}  # fmt: skip
    seen = []
    monkeypatch.setattr(step, "_launch_stages", lambda a, target, unmasked: (
        seen.append(unmasked), ({}, dict.fromkeys(STAGE_NAMES)))[1])  # fmt: skip
    with _host_reads(tins) as rec:
        step.run_stages({**tins, **prm, "topk": topk, "backend": "sim", "soc": "910b",
                         "validate": validate})  # fmt: skip
    assert seen == [topk == 256], seen
    assert dict(rec.calls) == {"block_table": 1, "seq_lens": 1}, dict(rec.calls)


# ----------------------------------------------------------------------------- slow: the layer
#: the 64K case (INT8 path: the prolog kernels' path, on both SoCs)
LAYER_CASE = "dsa_attention_step_b4_s2_64k_int8"


def cost_layer(soc: str) -> dict:
    """In the simulator child: each stage's cost-model µs of the 64K case (cost only, no
    interpretation) and the step's ``{flop, bytes}`` (the contract's ``cost``)."""
    import types

    from tilesim.device import sim
    from tilesim.device.dsa_attention_step import run_stages
    from tilesim.shared import dsa_attention_step as contract

    ins, prm, _tol = _case(LAYER_CASE)
    with sim.cost_only():
        _res, stages = run_stages({**ins, **prm, "backend": "sim", "soc": soc})
    ns = types.SimpleNamespace(**{**dict.fromkeys(contract.INPUT_NAMES), **ins,
                                  **_keywords(prm)})  # fmt: skip
    args = contract.check_values(contract.check_meta(ns))
    return {"stages": stages, "cost": contract.cost(args)}


def _keywords(prm: dict) -> dict:
    """The step's keywords: their defaults, then ``prm``."""
    import inspect

    from tilesim.shared.dsa_attention_step import step_keywords

    sig = inspect.signature(step_keywords).parameters
    return {**{k: p.default for k, p in sig.items()}, **prm}


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("soc", [
    pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
    pytest.param("950", marks=pytest.mark.soc_950, id="950"),
])  # fmt: skip
def test_layer_cost_at_b4_s2_64k(soc, sim_report):
    """The layer at b4 s2 over 64K (topk 2048), cost only: four launches, the layer's figure
    their sum, each stage's µs beside it (the targets, <= 500 µs on the 910B and <= 450 µs on
    the 950, are the committed figures')."""
    from tilesim.device import sim

    r = sim.isolated(cost_layer, soc, soc=soc, timeout=7200)
    total = sum(r["stages"].values())
    extra = {f"{k} µs": v for k, v in r["stages"].items()}
    sim_report.add(kernel="dsa_attention_step", soc=soc,
                   case="int8 b4 s2 64K topk 2048 (four launches, cost only)", bit_exact=None,
                   max_ulp=None, max_abs=None, us=total,
                   cost={k: r["cost"][k] for k in ("flop", "bytes")},
                   extra=extra)  # fmt: skip
    assert all(v > 0 for v in r["stages"].values()), r
