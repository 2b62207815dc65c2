"""``tilesim compare ACTUAL GOLDEN``: read the device's dump and the golden's outputs, match them
by name (:mod:`tilesim.cli.dumps`), judge each with :mod:`tilesim.reference.judging` under the
golden's tolerance (:mod:`tilesim.cli.tolerances`) by the op's plan
(:mod:`tilesim.cli.verdicts`), and print the verdicts (:mod:`tilesim.cli.reports`). Exit 0 when
every output passes, 1 when one fails."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dumps import GoldenSet, _dir_key, load_goldens, match_actuals
from tilesim.cli.loading import Loaded, load_tensor, resolve_spec
from tilesim.cli.manifest import entries
from tilesim.cli.outputs import Outputs, check_png_path, size_text
from tilesim.cli.reports import compare_png, draw_png, print_report, report_json, stage_png_paths
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
    if getattr(args, "manifest", None):
        gs = golden_of_manifest(args.golden, args.manifest, args.golden_dtype)
    else:
        gs = load_goldens(args.golden, dtype=args.golden_dtype)
    pairs, notes = match_actuals(args.actual, gs, dtype=args.actual_dtype)
    stated = (gs.outputs[0].manifest or {}).get("tolerance")
    tol = resolve_tolerance(stated, flags_of(args), rule=_rule(args))
    for a, g in ((a, g) for g, a in pairs):
        _check_pair(a, g, args.allow_dtype_mismatch)
    outputs = Outputs(force=args.force)
    case = (gs.manifest or {}).get("case", Path(gs.outputs[0].source).name)
    if _stage_judged(gs):
        if png_error is not None:
            raise png_error
        return _compare_stages(args, gs, pairs, notes, tol, case, png, outputs)
    if png is not None:
        outputs.add(png)
        outputs.check()
    if gs.manifest is None:
        notes = [*notes, BARE_GOLDEN]
    results = judge_dump(gs, pairs, tol, case=case, rule=_rule(args), arithmetic=args.arithmetic)
    passed = all(r[0].passed for r in results)
    if args.json:
        reps = [report_json(*r, tol) for r in results]
        doc = reps[0] if len(reps) == 1 else {"passed": passed, "outputs": reps}
        print(json.dumps({**doc, "notes": notes} if notes else doc))
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


#: the note of a golden read without a manifest (a bare tensor file)
BARE_GOLDEN = (
    "GOLDEN is a bare file without a manifest: no op is named, so the tolerance is the flags' "
    "and the L2 bounds the dtype's rule; `--manifest DIR[:NAME]` judges it as that golden's "
    "output, by its op's rule and calibrated bound"
)


def golden_of_manifest(spec: str, manifest: str, dtype: str | None = None) -> GoldenSet:
    """``--manifest MANIFEST[:NAME]``: the bare GOLDEN file ``spec`` as the output of that
    golden it holds (``NAME``, else the output named like the file, else the output with the
    same bytes), judged as the golden directory judges it. The file must hold exactly that
    output's bytes (else a CliError: another call's golden); raw ``|V2`` / ``|V1`` elements
    take the output's dtype. ``dtype``: ``--golden-dtype``."""
    path, _ = resolve_spec(_dir_key(spec))
    if path.is_dir() or path.suffix == ".json":
        raise CliError(f"--manifest: GOLDEN {spec} is a golden directory or manifest, read "
                       "with its own manifest; leave --manifest out")  # fmt: skip
    every = load_goldens(manifest)
    stem = Path(_dump_root(spec)).stem
    order = sorted(every.outputs, key=lambda g: g.name != stem)
    read, first_error = [], None
    for g in order:  # read as each output in turn: an opaque file takes its dtype
        try:
            read.append((g, load_tensor(spec, like=g, dtype=dtype)))
        except CliError as e:
            first_error = first_error or e
    if not read:
        raise first_error
    if read[0][1].manifest is not None:
        raise CliError(f"--manifest: GOLDEN {spec} is already read with its manifest; leave "
                       "--manifest out")  # fmt: skip
    same = [(g, b) for g, b in read if _same_bytes(b.array, g.array)]
    if not same:
        g, b = read[0]
        raise CliError(
            f"--manifest {manifest}: {spec} ({b.array.dtype}{list(b.array.shape)}) holds the "
            f"bytes of none of its outputs {every.names} (closest by name: {g.name!r}, "
            f"{g.array.dtype}{list(g.array.shape)}): it is not that call's golden"
        )
    g = same[0][0]
    where = g.source if len(every.outputs) == 1 else f"{every.path}:{g.name}"
    one = Loaded(g.array, f"{spec} (= {where})", g.manifest, g.entry)
    return GoldenSet([one], every.scores, every.manifest, every.path)


def _same_bytes(a, b) -> bool:
    """Do two arrays hold the same elements, bit for bit (any dtype of one width: a bare
    ``|V2`` file of BF16 bits)?"""
    return (a.size == b.size and a.dtype.itemsize == b.dtype.itemsize
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())  # fmt: skip


def _stage_judged(gs: GoldenSet) -> bool:
    """Is the golden one of the stage-judged ops (the prologs, the layer step)?"""
    from tilesim.reference.judging.stages import STAGED_OPS

    return (gs.manifest or {}).get("op") in STAGED_OPS


def _rule(args) -> str:
    return getattr(args, "rule", None) or "default"


def _check_pair(actual: Loaded, golden: Loaded, allow_dtype_mismatch: bool) -> None:
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


def _compare_stages(args, gs: GoldenSet, pairs, notes, tol, case: str, png, outputs) -> int:
    """The prologs and the layer step: the stage verdict of
    :func:`tilesim.reference.judging.stages.judge_stages` (which stage first fails and why);
    ``png``: one picture per judged output (:func:`tilesim.cli.reports.stage_png_paths`)."""
    rep = judge_stage_dump(gs, pairs, tol, case=case, rule=_rule(args))
    pictures = stage_png_paths(png, rep) if png is not None else []
    for path, *_ in pictures:
        outputs.add(path)
    outputs.check()
    notes = [n for n in notes if not n.startswith("no dump of optional output")]
    if args.json:
        print(json.dumps({**rep.as_dict(), "actual": [a.source for _, a in pairs],
                          "golden": str(gs.path), "notes": notes}))  # fmt: skip
    else:
        print(f"actual: {', '.join(sorted({_dump_root(a.source) for _, a in pairs}))}")
        print(f"golden: {gs.outputs[0].source if len(gs.outputs) == 1 else gs.path}")
        print(rep.summary(verbose=bool(getattr(args, "verbose", False))))
        for n in notes:
            print(f"note: {n}")
    if pictures:
        _stage_pngs(outputs, pictures, gs)
    return 0 if rep.passed else 1


def _stage_pngs(outputs, pictures, gs: GoldenSet) -> None:
    """Draw every picture of :func:`_compare_stages` (all written, or none)."""
    scores = next((g.array for g in gs.outputs if g.name == "scores"), None)
    if scores is None and gs.path is not None and gs.manifest is not None:
        names = [e["name"] for e in entries(gs.manifest, "golden")]
        scores = load_goldens(f"{gs.path}:scores").outputs[0].array if "scores" in names else None
    width = None if scores is None else scores.shape[-1]
    with outputs:
        for path, stage, v, a, g in pictures:
            draw_png(outputs.temp(path), v, a, g, v.tolerance, width, stage)
    for path, *_ in pictures:
        print(f"  wrote {path} ({size_text(path.stat().st_size)})")


def _dump_root(source: str) -> str:
    """A dumped tensor's file (``file.npz:KEY`` -> ``file.npz``)."""
    head, sep, _ = source.rpartition(":")
    return head if sep and Path(head).exists() else source
