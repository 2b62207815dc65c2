"""The judge's plan of each op: which rule judges each of its outputs, against which golden.

:func:`judge_outputs` judges the dumped outputs of one call (``{output name: array}``, any of
the op's outputs) against the call's golden outputs and returns one :class:`OutputVerdict` per
dumped output. ``tilesim compare`` only reads the files and calls it; the tests call it on
arrays. The plans (``docs/cli.md``, "Judging the indexer and the decode step";
``docs/numerics.md``, "Judging an output"):

* every op with one output kind (MoE, MSA, the DeepSeek attention): :func:`judge` under the
  case's tolerance, the report's coordinates named by the op (:data:`OP_KINDS`); the MSA
  indexer's ids tie-aware with its block scores;
* the lightning indexer and the decode step (:data:`LIGHTNING_INDEXER_OPS`): ``topk_indices`` and
  ``scores`` by :mod:`tilesim.reference.judging.indexer`; the step's attention ``out`` against
  :func:`attention_golden`: the golden recomputed with the device's ids when those differ from
  the golden's only by score ties or by order, else the stored golden (the ids are judged
  first, so wrong ids fail their own check and a wrong attention still fails its own);
* the prologs and the layer step are judged stage by stage
  (:func:`tilesim.reference.judging.stages.judge_stages`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tilesim.reference.judging import Verdict, judge
from tilesim.reference.judging.indexer import (
    ids_tie_only,
    ids_tolerance,
    indexer_visible,
    judge_ids,
    judge_scores,
)
from tilesim.shared.registry.ops import calls_judged_by, golden_kinds, judge_kinds, optional_outputs

#: the reference op of a golden -> the judge's ``kind`` (names the report's coordinates)
OP_KINDS = golden_kinds()
#: the judge kinds whose output is ids
ID_KINDS = tuple(k for k, (what, _) in judge_kinds().items() if what == "ids")
#: the ops whose goldens hold ``topk_indices`` + ``scores`` (+ the step's attention ``out``):
#: DeepSeek's lightning indexer and the decode step that starts with it
LIGHTNING_INDEXER_OPS = calls_judged_by("indexer")
#: the id, score and attention outputs of those goldens
IDS, SCORES, OUT = "topk_indices", "scores", "out"
#: the outputs of an op a device may leave out (the ids' judge reads the golden's scores)
OPTIONAL_OUTPUTS = optional_outputs()
#: the warning of an indexer output judged without the call's lengths
NO_LENGTHS = (
    "no seq_lens given: a -inf golden score is taken for a position the row does not see, and "
    "every entry of an id row is read"
)


@dataclass
class OutputVerdict:
    """One judged output: its verdict, the golden it was judged against (``recomputed_with``:
    the device output that golden was recomputed with, else ``None``: the stored golden) and,
    where the plan chose between goldens, which one in words (``against``)."""

    output: str
    verdict: Verdict
    golden: np.ndarray
    against: str | None = None
    recomputed_with: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict.passed


def kind_of(op: str | None, tolerance: dict) -> str | None:
    """The judge's ``kind`` for ``op`` (``None``: inferred from the tolerance). A float op
    under mode ``"set"`` (or ids under another mode) keeps ``None``."""
    kind = OP_KINDS.get(op)
    if kind is None or (kind in ID_KINDS) != (tolerance["mode"] == "set"):
        return None
    return kind


def judge_outputs(op: str | None, actual: Mapping, golden: Mapping, *, tolerance: dict,
                  scores=None, inputs: Mapping | None = None, params: dict | None = None,
                  rule: str = "default", name: str = "output",
                  arithmetic: str = "float64") -> list[OutputVerdict]:  # fmt: skip
    """Judge the outputs ``actual`` (``{output name: array}``, a subset of ``golden``'s names)
    of one call of ``op`` against ``golden`` (``{output name: array}``, the golden outputs in
    the op's order) under the case's ``tolerance``, by the op's plan (module docstring).

    ``scores``: the golden's scores of its ids (the MSA indexer's block scores, the lightning
    indexer's ``scores``). ``inputs`` (a mapping read only for the names it needs) and
    ``params``: the call's arguments, read where the plan recomputes a golden (the decode
    step's attention). ``name``: the report's name (``name:output`` when ``golden`` holds
    several outputs). Returns one :class:`OutputVerdict` per dumped output, in ``golden``'s
    order. Raises ValueError/TypeError naming the argument.
    """
    unknown = sorted(set(actual) - set(golden))
    if unknown:
        raise ValueError(f"actual: outputs {unknown} are not golden outputs ({list(golden)})")
    labels = {n: name if len(golden) == 1 else f"{name}:{n}" for n in golden}
    common = dict(rule=rule, arithmetic=arithmetic)
    if op in LIGHTNING_INDEXER_OPS:
        done = _indexer_plan(actual, golden, labels, tolerance, scores, inputs, params, common)
    else:
        ids_scores = scores if len(golden) == 1 and tolerance["mode"] == "set" else None
        kind = kind_of(op, tolerance)
        done = {n: OutputVerdict(n, judge(actual[n], golden[n], tolerance, name=labels[n],
                                          scores=ids_scores, kind=kind,
                                          row_shape=_head_rows(kind, golden[n], params),
                                          **common), golden[n])
                for n in actual}  # fmt: skip
    return [done[n] for n in golden if n in done]


def _head_rows(kind, g, params) -> tuple | None:
    """``(T, nq)``: the rows of a DeepSeek attention output ``[T*nq, 512]`` named by token and
    head (``nq`` from the call's params), else ``None``."""
    nq = (params or {}).get("nq")
    if kind != "dsa" or np.ndim(g) != 2 or not isinstance(nq, int) or nq < 1:
        return None
    rows = int(np.shape(g)[0])
    return (rows // nq, nq) if rows % nq == 0 else None


def _rows_visible(golden, inputs, params):
    """The id rows' visible lengths from the call's ``seq_lens`` and ``q_lens``, else
    ``None`` (no inputs given)."""
    ids = golden.get(IDS, golden.get(SCORES))
    if inputs is None or ids is None or "seq_lens" not in inputs:
        return None
    q_lens = inputs["q_lens"] if "q_lens" in inputs else (params or {}).get("q_lens")
    return indexer_visible(inputs["seq_lens"], q_lens, int(np.shape(ids)[0]))


def _indexer_plan(actual, golden, labels, tolerance, scores, inputs, params, common) -> dict:
    """The lightning indexer and the decode step: the ids first (the attention's golden
    depends on their verdict), then the scores and the attention; visibility from the
    lengths."""
    done, ids_v = {}, None
    vis = _rows_visible(golden, inputs, params)
    for n in sorted(actual, key=lambda n: (n != IDS, n)):
        a, g = actual[n], golden[n]
        if n == IDS:
            ids_v = judge_ids(a, g, scores=scores, visible=vis, rule=common["rule"],
                              tolerance=ids_tolerance(tolerance), name=labels[n])  # fmt: skip
            done[n] = OutputVerdict(n, ids_v, g)
        elif n == SCORES:
            v = judge_scores(a, g, visible=vis, name=labels[n], arithmetic=common["arithmetic"])
            done[n] = OutputVerdict(n, v, g)
        else:
            gold, against = attention_golden(actual.get(IDS), ids_v, golden.get(IDS), g,
                                             inputs, params)  # fmt: skip
            v = judge(a, gold, tolerance, name=labels[n], kind="dsa",
                      row_shape=_head_rows("dsa", g, params), **common)  # fmt: skip
            done[n] = OutputVerdict(n, v, gold, against, IDS if gold is not g else None)
    if vis is None:
        for ov in done.values():
            if ov.output in (IDS, SCORES):
                ov.verdict.warnings.append(NO_LENGTHS)
    return done


def attention_golden(ids, ids_verdict, golden_ids, stored, inputs, params):
    """``(golden out, which)``: the decode step's attention golden to judge a dump against.

    The stored golden, unless the device's ``ids`` (judged by ``ids_verdict``) differ from
    ``golden_ids`` only by accepted ties or order: then the golden recomputed with exactly
    those ids (:func:`tilesim.reference.dsa_attention_step.step_attention` on the call's
    ``inputs`` and ``params``). ``which`` says which one, in words."""
    if ids is None or ids_verdict is None:
        return stored, "the stored golden: no ids judged with it"
    if not ids_tie_only(ids_verdict):
        return stored, "the stored golden: the ids differ beyond ties"
    ids = np.asarray(ids).reshape(np.shape(golden_ids))
    if np.array_equal(ids, golden_ids):
        return stored, "the stored golden: the ids are the golden's"
    tied = ids_verdict.ids is not None and ids_verdict.ids.tied
    how = "score ties" if tied else "order within rows"
    out = recompute_attention(ids.astype(np.int32), inputs, params)
    return out, f"the golden recomputed with the device's ids: they differ by {how}"


def recompute_attention(ids: np.ndarray, inputs: Mapping | None, params: dict | None):
    """The decode step's attention with ``ids``: its own call
    (:func:`tilesim.reference.dsa_attention_step.step_attention`) on the call's inputs and
    params."""
    import inspect

    from tilesim.reference.dsa_attention_step import attention_arguments, step_attention

    if inputs is None or params is None:
        raise ValueError(
            "inputs: the attention golden must be recomputed with the device's ids, which needs "
            "the call's inputs and params"
        )
    names = set(inspect.signature(step_attention).parameters)
    given = {k: inputs[k] for k in names if k in inputs}
    args = attention_arguments({**params, **given})
    try:
        return np.asarray(step_attention(ids, **args, progress=False))
    except (ValueError, TypeError) as e:
        raise type(e)(f"recomputing the attention with the device's ids: {e}") from None


__all__ = ["LIGHTNING_INDEXER_OPS", "OPTIONAL_OUTPUTS", "OP_KINDS", "OutputVerdict",
           "attention_golden", "judge_outputs", "kind_of", "recompute_attention"]  # fmt: skip
