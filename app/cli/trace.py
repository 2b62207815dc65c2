"""``tilesim trace CASE|GOLDEN_DIR``: run a named case, or the call a golden directory records,
with the trace hook; report (and draw) the tile schedule, and with ``--actual`` judge a device
output against the run's golden and map its errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dumps import match_actuals
from tilesim.cli.loading import split_key
from tilesim.cli.outputs import Outputs, check_file_dir, check_png_path, size_text
from tilesim.cli.progress import Progress, build_and_run, want_progress
from tilesim.cli.registry import get_case
from tilesim.cli.runner import jsonable
from tilesim.cli.tolerances import resolve_tolerance
from tilesim.cli.verdicts import judge_run, judge_run_stages, run_goldens
from tilesim.reference.judging.stages import STAGED_OPS


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
    from tilesim.cli.plot_trace import summarize

    if args.actual_dtype is not None and not args.actual:
        raise CliError("--actual-dtype reinterprets the bytes of --actual FILE: give --actual, "
                       "or leave --actual-dtype out")  # fmt: skip
    kind, target = _trace_target(args)
    png = Path(args.png) if args.png else None
    outputs = Outputs(force=args.force)
    if png is not None:
        check_png_path(png)
        from tilesim.cli.plot import require_matplotlib

        require_matplotlib("trace --png")
        outputs.add(png)
    if args.records:
        check_file_dir(Path(args.records), "--records")
        outputs.add(Path(args.records))
    outputs.check()
    if args.actual:  # a missing ACTUAL fails before the run
        path, _ = split_key(args.actual)
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
    print(_run_line(run, records, summary))
    for line in verdict.lines:
        print(f"  {line}")
    if args.records:
        print(f"  trace records: {args.records}")
    if png is not None:
        print(f"  wrote {png} ({size_text(png.stat().st_size)})")
    return 0 if verdict.passed else 1


def _run_line(run: TraceRun, records: list[dict], summary: dict) -> str:
    """The report's first line: an op traced by pipeline stage (the prologs) names its stages
    and the tokens written; any other op counts its tiles, lanes and tile sizes."""
    from tilesim.cli.plot_stages import is_staged, stage_rows

    if is_staged(records):
        rows = stage_rows(records)
        text = f"{run.name}: {run.op} traced {len(rows)} stages in pipeline order "
        text += f"({', '.join(r['name'] for r in rows)})"
        writes = [r for r in rows if r["written"] is not None]
        for r in writes:
            text += f"; cache rows written for {int(r['written'].sum())} of {r['tokens']} tokens"
        return text
    lanes = ", ".join(summary["lane_keys"]) or "no lane keys"
    return (f"{run.name}: {run.op} ran {summary['tiles']} tiles in {summary['lanes']} lanes "
            f"({lanes}); tile sizes {summary['tile_sizes']}")  # fmt: skip


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

    request = rp.replay_request(target, op=None, params_text=None, like=None)
    op_args, _ = rp.replay_arguments(request)
    t0 = time.perf_counter()
    goldens = rp.run_op(request.op, op_args, trace=records.append)
    _, m = rp.golden_manifest(target)
    name = m.get("case") or Path(target).name
    return TraceRun(name, request.op, request.tolerance, goldens, time.perf_counter() - t0, op_args)


@dataclasses.dataclass
class ActualVerdict:
    """``--actual`` judged: one report line per output, the pair the error map draws (the
    first float output judged; ``None``: none) and its line."""

    lines: list
    passed: bool = True
    actual: object = None
    golden: object = None
    map_title: str = ""
    maps: list = dataclasses.field(default_factory=list)  # ErrorMap per output (by stage)


def _trace_actual(args, run: TraceRun) -> ActualVerdict:
    """``--actual`` against the run's outputs: ACTUAL answers them as in ``tilesim compare``
    (a file, an ``.npz`` or ``.pt`` of several, a dump directory, a golden directory by its
    manifest), each judged as the op's record says."""
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
    if run.op in STAGED_OPS:
        rep = judge_run_stages(run.op, pairs, tol, run.args, run.goldens, name=run.name)
        last = rep.summary().splitlines()[-1]
        return ActualVerdict([f"{_sources(pairs)} vs golden: {last}", *notes], rep.passed,
                             map_title=last, maps=_stage_maps(run, pairs, rep, tol))  # fmt: skip
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


def _stage_maps(run: TraceRun, pairs, rep, tol: dict) -> list:
    """One :class:`~tilesim.cli.plot_errors.ErrorMap` per judged output of an op judged by stage, in
    the op's output order: the distance to the run's golden per token x feature, a cache's
    per written slot x field, the ids' selection picture."""
    from tilesim.reference.judging.stages import output_spec
    from tilesim.shared.dsa_attention_step import IPROLOG_NAMES

    step_name = IPROLOG_NAMES if run.op == "dsa_indexer_prolog" else {}
    judged = {o.name: (s, o) for s in rep.stages for o in s.outputs}
    geometry = _cache_geometry(run.op, run.args)
    maps = []
    for g, a in pairs:
        name = step_name.get(g.name, g.name)
        if name not in judged:
            continue
        stage, res = judged[name]
        title = f"stage {stage.stage}, {name}: {'PASS' if res.passed else 'FAIL'}"
        if not stage.against.startswith("the stored golden"):
            title += f" (judged against {stage.against}; drawn against the stored golden)"
        spec = output_spec(name, geometry[3], tol)
        maps.append(_one_map(name, spec.kind, a.array, g.array, res, geometry, title))
    return maps


def _cache_geometry(op: str, args: dict) -> tuple:
    """(written slots, latent cache layout, block size, path) of a traced call."""
    from tilesim.shared.layouts.mla_cache import PATH_CACHE_LAYOUT

    if op == "dsa_attention_step":
        from tilesim.reference.dsa_attention_step import step_args

        a = step_args(**{**args, "trace": None, "progress": False})
        return np.asarray(a.slots, np.int64), a.layout, a.ins.block_size, a.path
    path = args.get("path", "int8")
    slots = np.asarray(args["slot_mapping"], np.int64).reshape(-1)
    layout = args.get("cache_layout") or PATH_CACHE_LAYOUT[path]
    return slots, layout, int(args.get("block_size") or 128), path


def _one_map(name, kind, actual, golden, res, geometry, title):
    from tilesim.cli.plot_errors import ErrorMap, distance_map
    from tilesim.cli.plot_ids import id_grid

    g = np.asarray(golden)
    a = np.asarray(actual).reshape(g.shape)
    if kind == "ids":
        verdict = res.verdicts[0][1]
        return ErrorMap(title, ids=id_grid(verdict, a, g), row_label="id row")
    if kind != "cache":
        values, unit = distance_map(a, g)
        return ErrorMap(title, values, unit, row_names=list(range(values.shape[0])))
    return _cache_map(name, a, g, res, geometry, title)


def _cache_map(name, a, g, res, geometry, title):
    """A cache's map: its written slots (rows) x its fields' columns, each field in its own
    unit; the title adds the judge's count of unwritten rows that differ."""
    from tilesim.cli.plot_errors import ErrorMap, distance_map
    from tilesim.reference.judging.stages import cache_fields

    slots, layout, block_size, _ = geometry
    if a.dtype != g.dtype and a.dtype.itemsize == g.dtype.itemsize:
        a = a.view(g.dtype)
    _, gf = cache_fields(name, g, layout, block_size)
    _, af = cache_fields(name, a, layout, block_size)
    written = np.unique(slots[slots >= 0])
    parts, columns, units, c0 = [], [], [], 0
    for field in gf:
        d, unit = distance_map(af[field][written], gf[field][written])
        parts.append(d.reshape(written.size, -1).astype(np.float64))
        columns.append((c0, field))
        units.append(f"{field}: {unit}")
        c0 += parts[-1].shape[1]
    values = np.concatenate(parts, axis=1) if parts else np.zeros((0, 0))
    unwritten = "; ".join(c.text for c in res.checks)
    return ErrorMap(f"{title}\n{unwritten}" if unwritten else title, values,
                    "; ".join(units) if len(units) > 1 else units[0].split(": ", 1)[1],
                    row_label="written slot", row_names=written.tolist(),
                    columns=columns if len(columns) > 1 else [])  # fmt: skip


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
        error_maps=verdict.maps,
    )
