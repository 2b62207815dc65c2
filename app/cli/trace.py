"""``tilesim trace CASE|GOLDEN_DIR``: run a named case, or the call a golden directory records,
with the trace hook; report (and draw) the tile schedule, and with ``--actual`` judge a device
output against the run's golden and map its errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from tilesim.cli import CliError
from tilesim.cli import tensorio as tio
from tilesim.cli.outputs import Outputs, check_png_path, size_text
from tilesim.cli.progress import Progress, build_and_run, want_progress
from tilesim.cli.registry import get_case
from tilesim.cli.runner import jsonable
from tilesim.cli.tolerances import resolve_tolerance
from tilesim.cli.verdicts import judge_one


@dataclasses.dataclass
class TraceRun:
    """One traced reference run: a named case, or the call a golden directory records."""

    name: str
    op: str
    tolerance: dict
    goldens: dict
    seconds: float


def cmd_trace(args: argparse.Namespace) -> int:
    from tilesim.cli.plot import summarize

    kind, target = _trace_target(args)
    png = Path(args.png) if args.png else None
    outputs = Outputs(force=args.force)
    if png is not None:
        check_png_path(png)
        from tilesim.cli.plot import require_matplotlib

        require_matplotlib("trace --png")
        outputs.add(png)
    if args.records:
        outputs.add(Path(args.records))
    outputs.check()
    if args.actual:  # a missing or unreadable ACTUAL fails before the run
        tio._resolve(args.actual)
    records: list[dict] = []
    run = _trace_run(kind, target, args, records)
    _check_records(run.op, records)
    summary = summarize(records)
    actual, golden, err_title, passed = _trace_actual(args, run)
    with outputs:
        if png is not None:
            _trace_png(outputs.temp(png), run, records, summary, actual, golden, err_title)
        if args.records:
            _write_records(outputs.temp(Path(args.records)), records)
    lanes = ", ".join(summary["lane_keys"]) or "no lane keys"
    print(
        f"{run.name}: {run.op} ran {summary['tiles']} tiles in {summary['lanes']} lanes "
        f"({lanes}); tile sizes {summary['tile_sizes']}"
    )
    if err_title:
        print(f"  {err_title}")
    if args.records:
        print(f"  trace records: {args.records}")
    if png is not None:
        print(f"  wrote {png} ({size_text(png.stat().st_size)})")
    return 0 if passed else 1


def _trace_target(args) -> tuple[str, object]:
    """``("case", CaseInfo)`` for a case name, ``("golden", path)`` for a golden directory
    (or its manifest.json) written by ``tilesim golden``, named cases and replays alike."""
    from tilesim.cli import replay as rp

    if rp.golden_manifest(args.case) is not None:
        if args.seed is not None:
            raise CliError("--seed goes with a CASE; a golden directory records its inputs")
        return "golden", args.case
    if Path(args.case).exists():
        raise CliError(
            f"{args.case!r} is not a golden directory (no manifest.json naming an op); expected "
            "a named case (`tilesim cases`) or a directory written by `tilesim golden`"
        )
    return "case", get_case(args.case)


def _trace_run(kind: str, target, args, records: list) -> TraceRun:
    if kind == "case":
        progress = Progress(want_progress(args))
        built, goldens, run_s = build_and_run(target, args.seed, progress, trace=records.append)
        return TraceRun(target.name, built.op_name, built.tolerance, goldens, run_s)
    from tilesim.cli import replay as rp

    plan = rp.plan_replay(target, op=None, params_text=None, like=None)
    op_args, _ = rp.replay_arguments(plan)
    t0 = time.perf_counter()
    goldens = rp.run_op(plan.op, op_args, trace=records.append)
    _, m = rp.golden_manifest(target)
    name = m.get("case") or Path(target).name
    return TraceRun(name, plan.op, plan.tolerance, goldens, time.perf_counter() - t0)


def _trace_actual(args, run: TraceRun):
    """(actual, golden, title of the error panel, passed) for ``--actual``; (None, None, "",
    True) without."""
    if not args.actual:
        return None, None, "", True
    (gname, garr), *_ = sorted(run.goldens.items())
    g_loaded = tio.Loaded(garr, f"reference {gname}", None, {"name": gname})
    act = tio.load_tensor(args.actual, like=g_loaded, dtype=args.actual_dtype)
    if act.array.shape != garr.shape:
        raise CliError(
            f"mismatched file: {act.source} has shape {list(act.array.shape)}, the golden "
            f"of {run.name} has {list(garr.shape)}"
        )
    rep = judge_one(act.array, garr, resolve_tolerance(run.tolerance), name=run.name)
    title = (
        f"{act.source} vs golden: {'PASS' if rep.passed else 'FAIL'}, {rep.n_fail} failing "
        f"(allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}"
    )
    return act.array, garr, title, rep.passed


def _check_records(op: str, records: list[dict]) -> None:
    from tilesim.shared.trace import check_record

    for j, r in enumerate(records):
        try:
            check_record(r)
        except (TypeError, ValueError) as e:
            raise CliError(f"{op} emitted trace record {j} outside the schema: {e}") from None


def _write_records(path: Path, records: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(jsonable(r)) + "\n")


def _trace_png(path, run, records, summary, actual, golden, err_title) -> None:
    from tilesim.cli.plot import save_trace_png

    tol = resolve_tolerance(run.tolerance) if actual is not None else {"atol": 0, "rtol": 0}
    title = (
        f"{run.name}: {run.op}, {summary['tiles']} tiles"
        f" (sizes {', '.join(map(str, summary['tile_sizes'][:8]))}), reference {run.seconds:.2f} s"
    )
    save_trace_png(
        path,
        title=title,
        records=records,
        actual=actual,
        golden=golden,
        atol=tol["atol"],
        rtol=tol["rtol"],
        err_title=err_title,
    )
