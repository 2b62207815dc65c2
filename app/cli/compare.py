"""``tilesim compare ACTUAL GOLDEN``: read the device's dump and the golden's outputs, match them
by name (:mod:`tilesim.cli.dumps`), judge each with :mod:`tilesim.reference.judge` under the
golden's tolerance (:mod:`tilesim.cli.tolerances`) by the op's plan
(:mod:`tilesim.cli.verdicts`), and print the verdicts (:mod:`tilesim.cli.reports`). Exit 0 when
every output passes, 1 when one fails."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tilesim.cli import CliError
from tilesim.cli import tensorio as tio
from tilesim.cli.dumps import GoldenSet, load_goldens, match_actuals
from tilesim.cli.outputs import Outputs, check_png_path, size_text
from tilesim.cli.reports import compare_png, print_report, report_json
from tilesim.cli.tolerances import flags_of, resolve_tolerance
from tilesim.cli.verdicts import golden_scores, judge_dump, judge_stage_dump


def cmd_compare(args: argparse.Namespace) -> int:
    png = Path(args.png) if args.png else None
    png_error = None  # a bad --png is reported after the verdict, which does not need it
    if png is not None:
        try:
            check_png_path(png)
            from tilesim.cli.plot import require_matplotlib

            require_matplotlib("compare --png")
        except CliError as e:
            png, png_error = None, e
    gs = load_goldens(args.golden, dtype=args.golden_dtype)
    pairs, notes = match_actuals(args.actual, gs, dtype=args.actual_dtype)
    stated = (gs.outputs[0].manifest or {}).get("tolerance")
    tol = resolve_tolerance(stated, flags_of(args), rule=_rule(args))
    for a, g in ((a, g) for g, a in pairs):
        _check_pair(a, g, args.allow_dtype_mismatch)
    outputs = Outputs(force=args.force)
    if png is not None:
        outputs.add(png)
        outputs.check()
    case = (gs.manifest or {}).get("case", Path(gs.outputs[0].source).name)
    if _stage_judged(gs):
        return _compare_stages(args, gs, pairs, notes, tol, case, png or png_error)
    results = judge_dump(gs, pairs, tol, case=case, rule=_rule(args), arithmetic=args.arithmetic)
    passed = all(r[0].passed for r in results)
    if args.json:
        reps = [report_json(*r, tol) for r in results]
        print(json.dumps(reps[0] if len(reps) == 1 else {"passed": passed, "outputs": reps}))
    else:
        missing = golden_scores(gs.scores) is None
        for r in results:
            print_report(*r, tol, missing)
        for n in notes:
            print(f"note: {n}")
    if png is not None:
        scores = golden_scores(gs.scores)
        compare_png(outputs, png, results[0], tol, None if scores is None else scores.shape[-1])
        print(f"  wrote {png} ({size_text(png.stat().st_size)})")
    if png_error is not None:
        sys.stdout.flush()
        raise png_error
    return 0 if passed else 1


def _stage_judged(gs: GoldenSet) -> bool:
    """Is the golden one of the stage-judged ops (the prologs, the layer step)?"""
    from tilesim.reference.judge_stages import PLAN_OPS

    return (gs.manifest or {}).get("op") in PLAN_OPS


def _rule(args) -> str:
    return getattr(args, "rule", None) or "default"


def _check_pair(actual: tio.Loaded, golden: tio.Loaded, allow_dtype_mismatch: bool) -> None:
    """Shapes with the same element count are judged after a reshape the report states; ids
    of any integer width (int32 / int64) are compared as values."""
    a, g = actual.array, golden.array
    if a.size != g.size:
        raise CliError(
            f"mismatched files: actual {actual.source} has shape {list(a.shape)} ({a.size} "
            f"elements); expected the golden's shape {list(g.shape)} ({golden.source}), or any "
            f"shape with {g.size} elements"
        )
    both_ids = a.dtype.kind in "iu" and g.dtype.kind in "iu"
    if a.dtype != g.dtype and not allow_dtype_mismatch and not both_ids:
        raise CliError(
            f"mismatched files: actual {actual.source} is {a.dtype}, golden {golden.source} is "
            f"{g.dtype} (--allow-dtype-mismatch compares the values anyway; --actual-dtype "
            "reinterprets raw bytes)"
        )


def _compare_stages(args, gs: GoldenSet, pairs, notes, tol, case: str, png) -> int:
    """The prologs and the layer step: the stage verdict of
    :func:`tilesim.reference.judge_stages.judge_stages` (which stage first fails and why)."""
    if png is not None:
        raise CliError(
            f"--png: {gs.manifest['op']} is judged stage by stage; draw one output with "
            "`tilesim compare DUMP/NAME.npy GOLDEN:NAME` of a plain golden, or leave --png out"
        )
    rep = judge_stage_dump(gs, pairs, tol, case=case, rule=_rule(args))
    notes = [n for n in notes if not n.startswith("no dump of optional output")]
    if args.json:
        print(json.dumps({**rep.as_dict(), "actual": [a.source for _, a in pairs],
                          "golden": str(gs.path), "notes": notes}))  # fmt: skip
    else:
        print(f"actual: {', '.join(sorted({_dump_root(a.source) for _, a in pairs}))}")
        print(f"golden: {gs.path}")
        print(rep.summary(verbose=bool(getattr(args, "verbose", False))))
        for n in notes:
            print(f"note: {n}")
    return 0 if rep.passed else 1


def _dump_root(source: str) -> str:
    """A dumped tensor's file (``file.npz:KEY`` -> ``file.npz``)."""
    head, sep, _ = source.rpartition(":")
    return head if sep and Path(head).exists() else source
