"""The judge on files: hand a golden's outputs, a dump's outputs and the golden's call (inputs,
params) to :func:`tilesim.reference.judging.plans.judge_outputs` or, for the prologs and the layer
step, :func:`tilesim.reference.judging.stages.judge_stages`; the judge's refusals become
one-line :class:`~tilesim.cli.CliError` messages. Nothing here decides a verdict."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.distribution import distribution
from tilesim.cli.dumps import GoldenSet, load_goldens
from tilesim.cli.loading import Loaded, load_from_manifest
from tilesim.cli.manifest import entries
from tilesim.cli.replay import decode, golden_inputs, golden_manifest


@contextmanager
def refused(prefix: str = ""):
    """The judge's ``ValueError`` / ``TypeError`` (a bad argument, a dump it cannot judge) as a
    :class:`CliError` (exit 2)."""
    try:
        yield
    except (ValueError, TypeError) as e:
        raise CliError(f"{prefix}{e}") from None


class GoldenInputs(Mapping):
    """The inputs of a golden directory, each read when first asked for: its ``input``
    tensors, or for a replayed golden the inputs it was made from
    (:func:`tilesim.cli.replay.golden_inputs`, read and checked all at once)."""

    def __init__(self, mpath: Path, manifest: dict) -> None:
        self.mpath, self.manifest = mpath, manifest
        self.entries = {e["name"]: e for e in entries(manifest, "input")}
        self.loaded: dict = {}
        self.replayed: dict | None = None

    def _names(self) -> list[str]:
        if self.entries:
            return list(self.entries)
        records = self.manifest.get("inputs")
        return [r["name"] for r in records if isinstance(r, dict)] if records else []

    def __getitem__(self, name: str) -> np.ndarray:
        if not self.entries:
            if self.replayed is None:
                self.replayed = golden_inputs(self.mpath, self.manifest)
            return self.replayed[name]
        if name not in self.loaded:
            self.loaded[name] = load_from_manifest(self.mpath, self.entries[name])
        return self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


def golden_call(gs: GoldenSet) -> tuple[Mapping | None, dict | None]:
    """``(inputs, params)`` of the call a golden directory records; ``(None, None)`` for a
    golden without one (a bare tensor file)."""
    found = golden_manifest(gs.path) if gs.path is not None else None
    if found is None:
        return None, None
    mpath, m = found
    params = {k: decode(v, f"{mpath}: params.{k}") for k, v in m.get("params", {}).items()}
    return GoldenInputs(mpath, m), params


def golden_scores(scores: dict):
    """The golden's scores of its ids: its ``block_scores`` (the MSA indexer), else its only
    ``scores`` tensor whatever its name, else ``None``."""
    if "block_scores" in scores:
        return scores["block_scores"]
    return next(iter(scores.values())) if len(scores) == 1 else None


def judge_dump(gs: GoldenSet, pairs, tol: dict, *, case: str, rule: str, arithmetic: str):
    """``[(verdict, distribution or None, actual, golden, against or None)]`` of the dumped
    outputs ``pairs`` (``[(golden, actual)]`` of :mod:`tilesim.cli.dumps`), in the golden's
    order, by the op's plan (:func:`tilesim.reference.judging.plans.judge_outputs`) with the
    call the golden directory records; a golden recomputed by the plan is named in
    ``golden.source``."""
    inputs, params = golden_call(gs)
    return _judged(gs, pairs, tol, inputs, params, name=case, rule=rule, arithmetic=arithmetic)


def _judged(gs: GoldenSet, pairs, tol, inputs, params, *, name, rule, arithmetic) -> list:
    from tilesim.reference.judging.plans import judge_outputs

    names = dict(zip((id(g) for g in gs.outputs), gs.names, strict=True))
    dumped = {names[id(g)]: (g, a) for g, a in pairs}
    with refused():
        verdicts = judge_outputs(
            (gs.manifest or {}).get("op"), {n: a.array for n, (_, a) in dumped.items()},
            {n: g.array for n, g in zip(gs.names, gs.outputs, strict=True)}, tolerance=tol,
            scores=golden_scores(gs.scores), inputs=inputs, params=params, rule=rule,
            name=name, arithmetic=arithmetic,
        )  # fmt: skip
    results = []
    for ov in verdicts:
        g, a = dumped[ov.output]
        if ov.recomputed_with is not None:
            src = f"{g.source} recomputed with the ids of {dumped[ov.recomputed_with][1].source}"
            g = Loaded(ov.golden, src, g.manifest, g.entry)
        flat = a.array.reshape(ov.golden.shape)
        dist = distribution(flat, ov.golden) if ov.verdict.kind != "ids" else None
        results.append((ov.verdict, dist, a, g, ov.against))
    return results


# ---------------------------------------------------------------------------------------------
# the outputs of a reference run (``tilesim trace --actual``)


def run_goldens(op: str, goldens: dict, args: dict) -> GoldenSet:
    """The outputs of one reference run of ``op`` (``goldens``, in the op's order; ``args``:
    its keyword arguments) as the golden side of :func:`tilesim.cli.dumps.match_actuals`,
    with the scores its ids are judged with."""
    from tilesim.cli.replay import indexer_block_scores
    from tilesim.reference.judging.plans import LIGHTNING_INDEXER_OPS

    outs = [Loaded(np.asarray(a), f"reference {n}", None, {"name": n})
            for n, a in goldens.items()]  # fmt: skip
    scores = indexer_block_scores(op, args)
    if op in LIGHTNING_INDEXER_OPS and "scores" in goldens:
        scores = {"scores": np.asarray(goldens["scores"])}
    return GoldenSet(outs, scores, {"op": op}, None)


def _call_parts(args: dict) -> tuple[dict, dict]:
    """(the arrays, the other arguments) of an op's keyword arguments."""
    arrays = {k: v for k, v in args.items() if isinstance(v, np.ndarray)}
    rest = {k: v for k, v in args.items() if k not in arrays and k not in ("trace", "progress")}
    return arrays, rest


def judge_run(op: str, gs: GoldenSet, pairs, tol: dict, args: dict, *, name: str) -> list:
    """:func:`judge_dump` of ``pairs`` against the outputs of a reference run
    (:func:`run_goldens`) with its call's arguments ``args``."""
    inputs, params = _call_parts(args)
    return _judged(gs, pairs, tol, {**inputs, **params}, params, name=name, rule="default",
                   arithmetic="float64")  # fmt: skip


def judge_run_stages(op: str, pairs, tol: dict, args: dict, goldens: dict, *, name: str):
    """The stage verdict of ``pairs`` against the outputs ``goldens`` of a reference run of a
    stage-judged op with its call's arguments ``args``."""
    from tilesim.reference.judging.stages import judge_stages

    inputs, params = _call_parts(args)
    actual = {g.name: a.array for g, a in pairs}
    with refused(f"{name}: "):
        return judge_stages(op, actual, dict(goldens), inputs, params, case_tolerance=tol,
                            name=name)  # fmt: skip


def judge_stage_dump(gs: GoldenSet, pairs, tol: dict, *, case: str, rule: str = "default"):
    """:func:`tilesim.reference.judging.stages.judge_stages` of the dumped outputs ``pairs``
    (any subset) against every golden output of the directory, with the call's inputs and
    params (read from the golden directory: the recomputations and the cache slots need
    them); ``tol``: the case's tolerance (the attention's rule)."""
    from tilesim.reference.judging.stages import judge_stages

    found = golden_manifest(gs.path) if gs.path is not None else None
    if found is None:
        raise CliError(
            f"{case}: the stages are judged with the golden directory (its inputs, params and "
            "every output): compare against the directory or its manifest.json"
        )
    mpath, m = found
    every = gs if len(gs.outputs) == len(entries(m, "golden")) else load_goldens(str(mpath))
    golden = {g.name: g.array for g in every.outputs}
    params = {k: decode(v, f"{mpath}: params.{k}") for k, v in m.get("params", {}).items()}
    actual = {g.name: a.array for g, a in pairs}
    with refused(f"{case}: "):
        return judge_stages(m["op"], actual, golden, golden_inputs(mpath, m), params,
                            case_tolerance=tol, rule=rule, name=case)  # fmt: skip
