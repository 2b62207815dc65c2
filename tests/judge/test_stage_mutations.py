"""The stage verdict of the DeepSeek-V3.2 layer step (``tilesim.reference.judging.stages``): each
prolog fault fails at its own stage, every earlier stage passes and a later one fails only against
the stored golden (its upstream failed); every correct output passes.

The wrong outputs are made by the stage goldens themselves: the step run with one wrong switch
or input (a RoPE pairing, a missing epsilon, an identity matrix for the Hadamard), or a golden
output edited (a slot's row moved to another row, the q scale divided back out of the index
weights) with the later stages recomputed from the edited output by the step's own stage calls,
as a device whose later stages are right would compute them. The correct outputs: the golden,
and the golden recomputed with every prolog matmul accumulated in FP32 per 128-deep K tile
(another valid summation order, the cube's).
"""

from __future__ import annotations

import functools
import importlib

import numpy as np
import pytest
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.reference.judging.stages import judge_stages
from tilesim.reference.util import arith
from tilesim.shared.casts import BF16, to_bf16
from tilesim.shared.dsa_attention_step import STAGES
from tilesim.shared.layouts.index_cache import fp8_page_views

STEP = importlib.import_module("tilesim.reference.dsa_attention_step")
STAGE_OF = {n: st.name for st in STAGES for n in st.outputs}
STAGE_ORDER = [st.name for st in STAGES]


@functools.lru_cache(maxsize=4)
def _case(path: str, tiny_token: bool = False) -> dict:
    """The small step case of ``path``; ``tiny_token``: token 0's hidden state scaled by
    2^-24 (exact in BF16), so that an epsilon dominates its norms."""
    case = dsa_attention_step_make_case(f"dsa_attention_step_short_{path}")
    if tiny_token:
        x = case["inputs"]["x"].astype(np.float32)
        x[0] *= np.float32(2.0**-24)
        case["inputs"] = {**case["inputs"], "x": to_bf16(x)}
    return case


def _run(case: dict, **changes) -> dict:
    """Every output of the step on the case with ``changes`` to its inputs / switches."""
    inputs = {**case["inputs"], **{k: v for k, v in changes.items() if k in case["inputs"]}}
    params = {**case["params"], **{k: v for k, v in changes.items() if k not in inputs}}
    res = STEP.dsa_attention_step(**inputs, **params)
    return {k: np.asarray(v) for k, v in zip(res._fields, res, strict=True) if v is not None}


@functools.lru_cache(maxsize=4)
def _golden(path: str, tiny_token: bool = False) -> dict:
    return _run(_case(path, tiny_token))


def _verdict(path: str, actual: dict, tiny_token: bool = False):
    case = _case(path, tiny_token)
    return judge_stages("dsa_attention_step", actual, _golden(path, tiny_token), case["inputs"],
                        case["params"], case_tolerance=case["tolerance"])  # fmt: skip


def _args(path: str, tiny_token: bool = False):
    case = _case(path, tiny_token)
    return STEP.step_args(**case["inputs"], **case["params"], trace=None, progress=False)


def _downstream(path: str, dev: dict, tiny_token: bool = False) -> dict:
    """``dev`` with the indexer's and the attention's outputs recomputed from its (edited)
    upstream by the step's own stage calls: a device whose later stages are right."""
    a = _args(path, tiny_token)
    got = STEP.run_stage("dsa_indexer", a, dev, progress=False)
    got.update(STEP.run_stage("sparse_attention", a, {**dev, **got}, progress=False))
    return {**dev, **{k: np.asarray(v) for k, v in got.items()}}


def _assert_fails_at(rep, stage: str) -> None:
    """The fault is named at its stage: every earlier stage passes; a later stage fails only
    where it is judged against the stored golden because an upstream output it reads failed
    (no golden is recomputed from a failed upstream: judge_stages' rule)."""
    bad = rep.first_failure
    assert bad is not None, rep.summary()
    assert bad.stage == stage, rep.summary()
    order = [s.stage for s in rep.stages]
    for s in rep.stages:
        if order.index(s.stage) < order.index(stage):
            assert s.passed, rep.summary()
        elif s.stage != stage and not s.passed:
            assert s.against.startswith("the stored golden: the device's"), rep.summary()
            assert "failed at" in s.against, rep.summary()


# ----------------------------------------------------------------------------- correct outputs
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_the_golden_passes_every_stage(path):
    rep = _verdict(path, dict(_golden(path)))
    assert rep.passed and rep.first_failure is None, rep.summary()
    assert [s.stage for s in rep.stages] == STAGE_ORDER
    assert all(s.judged for s in rep.stages)


def _k_tiled(a, b, *, k_tile=None, out=None):
    """``matmul_fp32`` accumulated in FP32 over 16-deep K tiles (the golden: one exact sum)."""
    return arith.matmul_fp32(a, b, k_tile=16, out=out)


def _patch_k_tiles(monkeypatch) -> None:
    for mod in ("mla_prolog", "dsa_indexer_prolog"):
        monkeypatch.setattr(importlib.import_module(f"tilesim.reference.{mod}"), "matmul_fp32",
                            _k_tiled)  # fmt: skip


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_another_valid_summation_order_passes_the_step(path, monkeypatch):
    """Both prologs' matmuls accumulated in FP32 per 16-deep K tile (the golden sums each
    exactly, rounded once): another order a correct kernel may use. Every stage passes (the
    step cases' grid data keep most partial sums exact; the prolog cases below use
    pypto-gym's random data, where output bits move)."""
    _patch_k_tiles(monkeypatch)
    rep = _verdict(path, _run(_case(path)))
    assert rep.passed, rep.summary()


@pytest.mark.parametrize(
    ("op", "name", "moves"),
    [("mla_prolog", "mla_prolog_int8_b4_s2", True), ("mla_prolog", "mla_prolog_fp8_b4_s2", True),
     ("dsa_indexer_prolog", "dsa_indexer_prolog_short_int8", False),
     ("dsa_indexer_prolog", "dsa_indexer_prolog_short_fp8", True)],
)  # fmt: skip
def test_another_valid_summation_order_passes_the_prologs(op, name, moves, monkeypatch):
    """The prolog ops alone on their cases' random data: the K-tiled order moves output bits
    (``query_nope``; the FP8 index weights; the INT8 indexer prolog's BF16 roundings absorb
    it), and every output passes under the case tables' per-output limits."""
    import tilesim.reference as R

    mod = importlib.import_module(f"tilesim.reference.cases.{op}")
    case = getattr(mod, f"{op}_make_case")(name)

    def run():
        res = getattr(R, op)(**case["inputs"], **case["params"])
        return {k: np.asarray(v) for k, v in zip(res._fields, res, strict=True) if v is not None}

    golden = run()
    _patch_k_tiles(monkeypatch)
    dev = run()
    if moves:
        assert any(dev[k].tobytes() != golden[k].tobytes() for k in golden), "no bit moved"
    rep = judge_stages(op, dev, golden, case["inputs"], case["params"],
                       case_tolerance=case["tolerance"])  # fmt: skip
    assert rep.passed, rep.summary()


def test_a_subset_of_stages_is_judged_alone():
    g = _golden("int8")
    rep = _verdict("int8", {k: g[k] for k in ("index_q", "attn_out")})
    assert rep.passed
    assert [s.stage for s in rep.stages if s.judged] == ["dsa_indexer_prolog", "sparse_attention"]


# ----------------------------------------------------------------------------- the prolog faults
@pytest.mark.parametrize(
    ("path", "changes", "stage"),
    [
        ("int8", {"rope_pairing": "halves"}, "mla_prolog"),  # pypto-gym: de-interleaved
        ("fp8", {"rope_pairing": "halves"}, "mla_prolog"),  # DeepSeek: interleaved
        ("fp8", {"index_rope_pairing": "interleaved"}, "dsa_indexer_prolog"),  # the pre-fix RoPE
    ],
    ids=["mla_int8", "mla_fp8", "indexer_fp8_prefix"],
)
def test_wrong_rope_pairing_fails_at_its_stage(path, changes, stage):
    rep = _verdict(path, _run(_case(path), **changes))
    _assert_fails_at(rep, stage)


@pytest.mark.parametrize(
    ("path", "changes", "stage", "output"),
    [
        ("fp8", {"rms_eps": 0.0}, "mla_prolog", "query_nope"),  # DeepSeek's RMSNorm eps 1e-6
        # the LayerNorm's 1e-6; its contract refuses 0, so 1e-30 stands for a missing one
        ("int8", {"ln_eps": 1e-30}, "dsa_indexer_prolog", "k_cache"),
        ("fp8", {"ln_eps": 1e-30}, "dsa_indexer_prolog", "k_cache"),
    ],
    ids=["mla_rms_fp8", "indexer_ln_int8", "indexer_ln_fp8"],
)
def test_missing_epsilon_fails_at_its_stage(path, changes, stage, output):
    """A token whose hidden state is 2^-24 of the others': its norms are below the epsilon,
    which then decides the normalised values."""
    dev = _run(_case(path, True), **changes)
    rep = _verdict(path, dev, tiny_token=True)
    _assert_fails_at(rep, stage)
    assert output in rep.first_failure.why()


def _move_row(arr: np.ndarray, width: int, src: int, dst: int) -> np.ndarray:
    """``arr`` (rows of ``width`` values) with row ``src`` written to ``dst`` instead."""
    out = arr.copy()
    flat, orig = out.reshape(-1, width), arr.reshape(-1, width)
    flat[dst] = orig[src]
    return out


def _wrong_slot(path: str, g: dict, inputs: dict, src: int, dst: int) -> dict:
    """The latent and index caches with token 0's row at ``dst`` and the cache given at
    ``src`` (the row the op should have written keeps its old bytes)."""
    original = dict(inputs)
    if g["k_cache"].dtype == np.uint8:  # FP8: k_scale is the pages' scales, read back
        original["k_scale"] = fp8_page_views(inputs["k_cache"], block_size=128).scales.copy()
    out = {}
    for name in ("kv_cache", "kr_cache", "kv_scale_cache", "k_cache", "k_scale"):
        if name not in g:
            continue
        v = g[name]
        if name == "k_cache" and v.dtype == np.uint8:  # FP8 pages: codes and scales
            new = v.copy()
            gv, nv = fp8_page_views(v, block_size=128), fp8_page_views(new, block_size=128)
            ov = fp8_page_views(original[name], block_size=128)
            (sb, so), (db, do) = divmod(src, 128), divmod(dst, 128)
            for fld in ("codes", "scales"):  # the views are strided: index (block, offset)
                getattr(nv, fld)[db, do] = getattr(gv, fld)[sb, so]
                getattr(nv, fld)[sb, so] = getattr(ov, fld)[sb, so]
            out[name] = new
            continue
        width = v.shape[-1] if name in ("kv_cache", "kr_cache", "kv_scale_cache") else 1
        width = 128 if name == "k_cache" else width
        new = _move_row(v, width, src, dst)
        new.reshape(-1, width)[src] = original[name].reshape(-1, width)[src]
        out[name] = new
    return out


@pytest.mark.parametrize("path", ["int8", "fp8"])
@pytest.mark.parametrize("cache", ["latent", "index"])
def test_slot_written_to_the_wrong_row_fails_at_its_stage(path, cache):
    """Token 0 written one row past its slot (a free row): the rows-not-written check names the
    row, the written row's fields fail (the slot still holds the poisoned bytes given)."""
    a, g, case = _args(path), _golden(path), _case(path)
    src = int(a.slots[0])
    dst = src + 1
    while dst in set(a.slots.tolist()):
        dst += 1
    moved = _wrong_slot(path, g, case["inputs"], src, dst)
    names = (("kv_cache", "kr_cache", "kv_scale_cache") if cache == "latent"
             else ("k_cache", "k_scale"))  # fmt: skip
    stage = "mla_prolog" if cache == "latent" else "dsa_indexer_prolog"
    dev = {k: (moved[k] if k in names else v) for k, v in g.items() if STAGE_OF[k] == stage}
    rep = _verdict(path, dev)
    _assert_fails_at(rep, stage)
    out = next(o for o in rep.first_failure.outputs if o.name == names[0])
    assert not out.checks[0].passed and out.checks[0].where == dst, out.lines()


@pytest.mark.parametrize("which", ["hadamard_q", "hadamard_k"])
def test_skipped_hadamard_fails_at_the_indexer_prolog(which):
    """INT8 path (the Hadamard is a matrix input): the identity instead skips the rotation."""
    eye = np.eye(128, dtype=np.float32).astype(BF16)
    dev = _run(_case("int8"), **{which: eye})
    rep = _verdict("int8", dev)
    _assert_fails_at(rep, "dsa_indexer_prolog")
    assert ("index_q" if which == "hadamard_q" else "k_cache") in rep.first_failure.why()


def test_q_scale_not_folded_into_the_weights_fails_at_the_indexer_prolog():
    """FP8 path: DeepSeek folds the q scale into the index weights; a device that does not
    (its weights divided back by the power-of-two scale, exact) fails the indexer prolog, and
    its indexer is judged against the stored golden (no golden recomputed from failed
    weights)."""
    g = _golden("fp8")
    dev = dict(g)
    dev["index_weights"] = (g["index_weights"] / g["index_q_scale"]).astype(np.float32)
    dev = _downstream("fp8", dev)
    assert not np.array_equal(dev["topk_indices"], g["topk_indices"]) or not np.array_equal(
        dev["scores"], g["scores"], equal_nan=True)  # fmt: skip
    rep = _verdict("fp8", dev)
    _assert_fails_at(rep, "dsa_indexer_prolog")
    assert rep.first_failure.why().startswith("index_weights")
    indexer = next(s for s in rep.stages if s.stage == "dsa_indexer")
    assert indexer.judged and indexer.against.startswith("the stored golden"), indexer.against
    assert "index_weights" in indexer.against and "failed at dsa_indexer_prolog" in indexer.against


def test_a_wrong_indexer_is_named_and_the_attention_judged_against_the_stored_golden():
    """One selected id dropped (``-1``; beyond ties): the indexer stage fails and is the one
    named; the attention computed with those ids is judged against the stored golden (the
    ids failed: no golden is recomputed from them), where its row of the dropped id fails."""
    g = _golden("int8")
    dev = dict(g)
    dev["topk_indices"] = g["topk_indices"].copy()
    dev["topk_indices"][1, 0] = -1
    got = STEP.run_stage("sparse_attention", _args("int8"), dev, progress=False)
    dev["attn_out"] = np.asarray(got["attn_out"])
    rep = _verdict("int8", dev)
    _assert_fails_at(rep, "dsa_indexer")
    att = rep.stages[-1]
    assert att.stage == "sparse_attention" and not att.passed, rep.summary()
    assert "topk_indices failed at dsa_indexer" in att.against, att.against
    worst = next(c for c in att.outputs[0].verdicts[0][1].checks if "worst row" in c.name)
    assert not worst.passed and str(worst.where).startswith("token 1,"), worst.line()
