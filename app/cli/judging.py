"""The verdict of ``tilesim compare``: :func:`tilesim.reference.judge` under the golden's
tolerance, and the error distribution the report adds.

* :func:`judge` — the one judge (floats: the seeds' element rule and, under the default rule,
  the golden-aware checks; ids: per-row sets, tie-aware with the golden's block scores).
* :func:`distribution` — percentiles (50/90/99/max) of ``|err|`` and of the ULP distance, and
  the relative L2 error.
* the lightning indexer and the decode step (:data:`DSA_OPS`): :func:`judge_scores` (the
  ``-inf`` visibility mask, then the float checks) and :func:`attention_golden` (the step's
  attention judged against the golden recomputed with the device's ids when those differ from
  the golden's only by score ties, else against the stored golden; ``docs/cli.md``, "Judging
  the indexer and the decode step").
"""

from __future__ import annotations

import numpy as np
from tilesim.cli import CliError

#: the percentiles the report gives (plus the max)
PERCENTILES = (50, 90, 99)


# ---------------------------------------------------------------------------------------------
# the error distribution


def _percentiles(x: np.ndarray) -> dict:
    """``{"p50", "p90", "p99", "max"}`` of ``x`` (the inverted-CDF percentile: a value some
    element actually has), ``None`` values for an empty ``x``."""
    keys = [f"p{p}" for p in PERCENTILES] + ["max"]
    if x.size == 0:
        return dict.fromkeys(keys)
    vals = np.percentile(x, PERCENTILES, method="inverted_cdf").tolist() + [x.max()]
    return {k: float(v) for k, v in zip(keys, vals, strict=True)}


def ulp_distances(actual: np.ndarray, golden: np.ndarray) -> np.ndarray | None:
    """ULP distance per element in the golden's float dtype when ACTUAL is wider (ACTUAL
    rounded once to it), else in ACTUAL's dtype (the golden rounded once to it when the dtypes
    differ); ``-1`` where either is NaN; ``None`` for integer / bool outputs."""
    from tilesim.reference import ulp_distance

    if actual.dtype.kind not in "fV":
        return None
    g = golden
    if golden.dtype.kind in "fV" and actual.dtype.itemsize > golden.dtype.itemsize:
        with np.errstate(all="ignore"):
            a32 = actual.astype(np.float64).astype(np.float32)
            actual = a32.astype(golden.dtype) if golden.dtype != np.float32 else a32
    if g.dtype != actual.dtype:
        with np.errstate(all="ignore"):
            g64 = golden.astype(np.float64)
            g = g64 if actual.dtype == np.float64 else g64.astype(np.float32).astype(actual.dtype)
    try:
        return ulp_distance(actual, g)
    except (TypeError, ValueError):
        return None


def distribution(actual: np.ndarray, golden: np.ndarray) -> dict:
    """``{"abs_err": percentiles, "ulp": percentiles or None, "rel_l2": float}`` over the
    elements where both tensors are finite (``n_finite`` of ``numel``)."""
    a = actual.astype(np.float64)
    g = golden.astype(np.float64)
    ok = np.isfinite(a) & np.isfinite(g)
    err = np.abs(a[ok] - g[ok])
    gn = float(np.sqrt(np.sum(g[ok] ** 2)))
    en = float(np.sqrt(np.sum(err**2)))
    rel = en / gn if gn > 0 else (0.0 if en == 0 else float("inf"))
    ulps = ulp_distances(actual, golden)
    return {
        "numel": int(a.size),
        "n_finite": int(ok.sum()),
        "abs_err": _percentiles(err),
        "ulp": None if ulps is None else _percentiles(ulps[ok & (ulps >= 0)].astype(np.float64)),
        "rel_l2": rel,
    }


def distribution_text(d: dict) -> str:
    def row(p: dict, fmt: str) -> str:
        return " ".join(f"{k} {'-' if v is None else format(v, fmt)}" for k, v in p.items())

    line = f"  |err| {row(d['abs_err'], '.4g')}"
    if d["ulp"] is not None:
        line += f"; ULP {row(d['ulp'], '.0f')}"
    line += f"; relative L2 {d['rel_l2']:.4g}"
    if d["n_finite"] != d["numel"]:
        line += f" (over the {d['n_finite']} of {d['numel']} elements finite in both)"
    return line


# ---------------------------------------------------------------------------------------------
# the verdict

#: the reference op of a golden's manifest -> the judge's ``kind`` (names the report's
#: coordinates)
_OP_KINDS = {
    "moe_grouped_gemm": "moe",
    "msa_sparse_decode": "msa_decode",
    "msa_main_branch": "msa_main",
    "msa_indexer": "msa_indexer",
    "sparse_attention_antiquant": "dsa",
    "sparse_attention_antiquant_kv_split": "dsa",
    "dsa_indexer": "dsa_indexer",
}
#: the ops whose judged output is ids
_ID_KINDS = ("msa_indexer", "dsa_indexer")


def golden_scores(scores: dict):
    """The golden's scores for the id judge: its ``block_scores`` (the MSA indexer), else its
    only ``scores`` tensor whatever its name, else ``None``."""
    if "block_scores" in scores:
        return scores["block_scores"]
    return next(iter(scores.values())) if len(scores) == 1 else None


def kind_of(manifest: dict | None, tol: dict) -> str | None:
    """The judge's ``kind`` for a golden's manifest (``None``: inferred from the tolerance).
    A float op under mode ``"set"`` (or ids under another mode) keeps ``None``."""
    kind = _OP_KINDS.get((manifest or {}).get("op"))
    if kind is None or (kind in _ID_KINDS) != (tol["mode"] == "set"):
        return None
    return kind


def judge(actual, golden, tol: dict, *, name: str, arithmetic="float64", rule="default",
          scores=None, kind=None):  # fmt: skip
    """:func:`tilesim.reference.judge` of ``actual`` vs ``golden`` under the tolerance dict
    ``tol``; bad tolerance values or data become a :class:`CliError` (the CLI checks dtypes
    before judging)."""
    from tilesim.reference.judge import judge as reference_judge

    try:
        return reference_judge(actual, golden, tol, scores=scores, rule=rule, name=name,
                               arithmetic=arithmetic, kind=kind)  # fmt: skip
    except (ValueError, TypeError) as e:
        raise CliError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# the lightning indexer and the decode step (``dsa_indexer``, ``dsa_decode_step``)

#: the ops whose goldens hold ``topk_indices`` + ``scores`` (+ the step's attention ``out``)
DSA_OPS = ("dsa_indexer", "dsa_decode_step")
#: the id, score and attention outputs of those goldens
IDS, SCORES, OUT = "topk_indices", "scores", "out"
#: the indexer's scores: no published numbers, the golden-aware checks judge them
SCORES_TOLERANCE = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "ulp"}


def ids_tolerance(tol: dict) -> dict:
    """The id judge's tolerance: set equality, the ``ratio`` of a set-mode golden (the
    indexer's) or 0 (the step's ``ratio`` is the attention's, per element)."""
    ratio = tol["ratio"] if tol["mode"] == "set" else 0.0
    return {"atol": 0.0, "rtol": 0.0, "ratio": ratio, "mode": "set"}


def judge_scores(actual: np.ndarray, golden: np.ndarray, *, name: str, arithmetic="float64"):
    """The indexer's FP32 scores ``[T, S]``: ``-inf`` (a position the row does not see) in
    the golden must be ``-inf`` in ``actual`` too (the check "visibility (-inf)"); every other
    element is judged by :func:`judge` under :data:`SCORES_TOLERANCE` (the default rule's
    relative L2 / cosine checks, whatever ``--rule``). ``actual`` is not modified."""
    from tilesim.reference.judge import Check

    if actual.size != golden.size:
        raise CliError(f"{name}: expected {golden.size} scores, got {actual.size}")
    a = actual.reshape(golden.shape)
    with np.errstate(invalid="ignore"):
        hidden = np.isneginf(golden.astype(np.float64))
        differ = hidden != np.isneginf(a.astype(np.float64))
    rep = judge(np.where(hidden, np.zeros((), a.dtype), a), np.where(hidden, 0, golden),
                SCORES_TOLERANCE, name=name, arithmetic=arithmetic, kind="float")  # fmt: skip
    n_bad = int(differ.sum())
    where = tuple(int(i) for i in np.argwhere(differ)[0]) if n_bad else None
    txt = f"{int(hidden.sum())} positions not visible (-inf in the golden); {n_bad} differ"
    rep.checks.insert(0, Check("visibility (-inf)", n_bad == 0, n_bad, 0, where, txt))
    rep.passed = rep.passed and n_bad == 0
    return rep


def ids_tie_only(rep) -> bool:
    """Do the judged ids differ from the golden's at most by accepted score ties (and order
    within rows)? The default rule's id report has no wrong row; the seeds' rule passed."""
    return not rep.ids.wrong if rep.ids is not None else rep.passed


def attention_golden(gs, ids: np.ndarray | None, ids_rep, stored: np.ndarray):
    """``(golden out, which)``: the decode step's attention golden to judge a dump against.

    The stored golden, unless the device's ids (``ids``, judged by ``ids_rep``) differ from
    the golden's only by accepted ties or order: then the golden recomputed with exactly those
    ids (:func:`tilesim.reference.dsa_step.step_attention` on the golden directory's inputs and
    params). ``which`` says which one, in words."""
    if ids is None or ids_rep is None:
        return stored, "the stored golden: no ids judged with it"
    if not ids_tie_only(ids_rep):
        return stored, "the stored golden: the ids differ beyond ties"
    g_ids = gs.outputs[gs.names.index(IDS)].array
    ids = ids.reshape(g_ids.shape)
    if np.array_equal(ids, g_ids):
        return stored, "the stored golden: the ids are the golden's"
    how = "score ties" if ids_rep.ids is not None and ids_rep.ids.tied else "order within rows"
    out = _recompute_attention(gs, ids.astype(np.int32))
    return out, f"the golden recomputed with the device's ids: they differ by {how}"


def _recompute_attention(gs, ids: np.ndarray) -> np.ndarray:
    from tilesim.cli.replay import decode, golden_inputs, golden_manifest
    from tilesim.reference.dsa_step import attention_arguments, step_attention

    found = golden_manifest(gs.path) if gs.path is not None else None
    if found is None:
        raise CliError(
            "the attention golden must be recomputed with the device's ids, which needs the "
            "golden directory (its inputs and params): compare against the directory"
        )
    mpath, m = found
    params = {k: decode(v, f"{mpath}: params.{k}") for k, v in m.get("params", {}).items()}
    args = attention_arguments({**golden_inputs(mpath, m), **params})
    try:
        return np.asarray(step_attention(ids, **args, progress=False))
    except (ValueError, TypeError) as e:
        raise CliError(f"recomputing the attention with the device's ids: {e}") from None


# ---------------------------------------------------------------------------------------------
# the prologs and the layer step: judged stage by stage (``tilesim.reference.judge_stages``)


def plan_op(gs) -> bool:
    """Is the golden one of the stage-judged ops (the prologs, the layer step)?"""
    from tilesim.reference.judge_stages import PLAN_OPS

    return (gs.manifest or {}).get("op") in PLAN_OPS


def judge_plan(gs, pairs, tol: dict, *, case: str, rule: str = "default"):
    """:func:`tilesim.reference.judge_stages.judge_stages` of the dumped outputs ``pairs``
    (``[(golden, actual)]``, any subset) against every golden output of the directory, with
    the call's inputs and params (read from the golden directory: the recomputations and the
    cache slots need them); ``tol``: the case's tolerance (the attention's rule)."""
    from tilesim.cli.dumps import load_goldens
    from tilesim.cli.replay import decode, golden_inputs, golden_manifest
    from tilesim.reference.judge_stages import judge_stages

    found = golden_manifest(gs.path) if gs.path is not None else None
    if found is None:
        raise CliError(
            f"{case}: the stages are judged with the golden directory (its inputs, params and "
            "every output): compare against the directory or its manifest.json"
        )
    mpath, m = found
    every = gs if len(gs.outputs) == len(tio_entries(m)) else load_goldens(str(mpath))
    golden = {g.name: g.array for g in every.outputs}
    params = {k: decode(v, f"{mpath}: params.{k}") for k, v in m.get("params", {}).items()}
    actual = {g.name: a.array for g, a in pairs}
    try:
        return judge_stages(m["op"], actual, golden, golden_inputs(mpath, m), params,
                            case_tolerance=tol, rule=rule, name=case)  # fmt: skip
    except (ValueError, TypeError) as e:
        raise CliError(f"{case}: {e}") from None


def tio_entries(m: dict) -> list:
    """The manifest's golden tensor entries."""
    from tilesim.cli import tensorio as tio

    return tio.entries(m, "golden")
