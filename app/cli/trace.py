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
from tilesim.cli.dumps import match_actuals
from tilesim.cli.outputs import Outputs, check_png_path, size_text
from tilesim.cli.progress import Progress, build_and_run, want_progress
from tilesim.cli.registry import get_case
from tilesim.cli.runner import jsonable
from tilesim.cli.tolerances import resolve_tolerance
from tilesim.cli.verdicts import judge_run, judge_run_stages, run_goldens
from tilesim.reference.judge_stages import PLAN_OPS


@dataclasses.dataclass
class TraceRun:
    """One traced reference run: a named case, or the call a golden directory records."""

    name: str
    op: str
    tolerance: dict
    goldens: dict
    seconds: float
    args: dict  # the op's keyword arguments (inputs and params)


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
    if args.actual:  # a missing ACTUAL fails before the run
        path, _ = tio._split_key(args.actual)
        if not path.exists():
            raise CliError(f"no such file or directory {str(path)!r}")
    records: list[dict] = []
    run = _trace_run(kind, target, args, records)
    _check_records(run.op, records)
    summary = summarize(records)
    verdict = _trace_actual(args, run)
    with outputs:
        if png is not None:
            _trace_png(outputs.temp(png), run, records, summary, verdict)
        if args.records:
            _write_records(outputs.temp(Path(args.records)), records)
    lanes = ", ".join(summary["lane_keys"]) or "no lane keys"
    print(
        f"{run.name}: {run.op} ran {summary['tiles']} tiles in {summary['lanes']} lanes "
        f"({lanes}); tile sizes {summary['tile_sizes']}"
    )
    for line in verdict.lines:
        print(f"  {line}")
    if args.records:
        print(f"  trace records: {args.records}")
    if png is not None:
        print(f"  wrote {png} ({size_text(png.stat().st_size)})")
    return 0 if verdict.passed else 1


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
        return TraceRun(target.name, built.op_name, built.tolerance, goldens, run_s,
                        built.op_args)  # fmt: skip
    from tilesim.cli import replay as rp

    plan = rp.plan_replay(target, op=None, params_text=None, like=None)
    op_args, _ = rp.replay_arguments(plan)
    t0 = time.perf_counter()
    goldens = rp.run_op(plan.op, op_args, trace=records.append)
    _, m = rp.golden_manifest(target)
    name = m.get("case") or Path(target).name
    return TraceRun(name, plan.op, plan.tolerance, goldens, time.perf_counter() - t0, op_args)


@dataclasses.dataclass
class ActualVerdict:
    """``--actual`` judged: one report line per output, the pair the error map draws (the
    first float output judged; ``None``: none) and its line."""

    lines: list
    passed: bool = True
    actual: object = None
    golden: object = None
    map_title: str = ""


def _trace_actual(args, run: TraceRun) -> ActualVerdict:
    """``--actual`` against the run's outputs: ACTUAL answers them as in ``tilesim compare``
    (a file, an ``.npz`` or ``.pt`` of several, a dump directory, a golden directory by its
    manifest), each judged by the op's plan."""
    if not args.actual:
        return ActualVerdict([])
    gs = run_goldens(run.op, run.goldens, run.args)
    pairs, notes = match_actuals(args.actual, gs, dtype=args.actual_dtype)
    for g, a in pairs:
        if a.array.size != g.array.size:
            raise CliError(
                f"mismatched file: {a.source} has shape {list(a.array.shape)}, the golden "
                f"{g.name} of {run.name} has {list(g.array.shape)}"
            )
    tol = resolve_tolerance(run.tolerance)
    notes = [f"note: {n}" for n in notes]
    if run.op in PLAN_OPS:
        rep = judge_run_stages(run.op, pairs, tol, run.args, run.goldens, name=run.name)
        last = rep.summary().splitlines()[-1]
        return ActualVerdict([f"{_sources(pairs)} vs golden: {last}", *notes], rep.passed)
    results = judge_run(run.op, gs, pairs, tol, run.args, name=run.name)
    out = ActualVerdict([_verdict_line(r, a, g, len(gs.outputs)) for r, _, a, g, _ in results])
    out.lines += notes
    out.passed = all(r[0].passed for r in results)
    drawn = [(j, a, g) for j, (r, _, a, g, _) in enumerate(results) if r.kind != "ids"]
    if drawn:
        j, a, g = drawn[0]
        out.actual, out.golden = a.array.reshape(g.array.shape), g.array
        out.map_title = out.lines[j]
    return out


def _verdict_line(rep, a, g, n_outputs: int) -> str:
    what = "golden" if n_outputs == 1 else f"golden {g.name}"
    head = f"{a.source} vs {what}: {'PASS' if rep.passed else 'FAIL'}"
    if rep.kind == "ids":
        return f"{head}, {len(rep.ids.wrong) if rep.ids else rep.n_fail} rows wrong"
    if rep.seeds is None:  # no published numbers: the golden-aware checks alone
        return f"{head}" + (f" ({', '.join(rep.failed)} failed)" if rep.failed else "")
    return (f"{head}, {rep.n_fail} failing (allowed {rep.threshold}), "
            f"max |err| {rep.max_abs_err:.3g}")  # fmt: skip


def _sources(pairs) -> str:
    return ", ".join(sorted({a.source for _, a in pairs}))


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


def _trace_png(path, run, records, summary, verdict: ActualVerdict) -> None:
    from tilesim.cli.plot import save_trace_png

    drawn = verdict.actual is not None
    tol = resolve_tolerance(run.tolerance) if drawn else {"atol": 0, "rtol": 0}
    title = (
        f"{run.name}: {run.op}, {summary['tiles']} tiles"
        f" (sizes {', '.join(map(str, summary['tile_sizes'][:8]))}), reference {run.seconds:.2f} s"
    )
    save_trace_png(
        path,
        title=title,
        records=records,
        actual=verdict.actual,
        golden=verdict.golden,
        atol=tol["atol"],
        rtol=tol["rtol"],
        err_title=verdict.map_title,
    )
