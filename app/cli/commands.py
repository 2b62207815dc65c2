"""The ``tilesim`` sub-commands: ``cases``, ``golden``, ``compare``, ``trace``.

Exit codes: 0 success / comparison passed, 1 comparison failed, 2 usage or input error
(unknown case, unwritable directory, bad or mismatched file, existing output without
``--force``, a missing optional dependency).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

import tilesim
from tilesim.cli import CliError, require
from tilesim.cli import tensorio as tio
from tilesim.cli.dumps import GoldenSet, load_goldens, match_actuals
from tilesim.cli.judging import (
    DSA_OPS,
    IDS,
    SCORES,
    attention_golden,
    distribution,
    distribution_text,
    golden_scores,
    ids_tolerance,
    judge,
    judge_plan,
    judge_scores,
    kind_of,
    plan_op,
    ulp_distances,
)
from tilesim.cli.outputs import Outputs
from tilesim.cli.registry import (
    get_case,
    list_cases,
    soc_text,
    tolerance_rule,
    tolerance_text,
)
from tilesim.cli.replay import indexer_block_scores
from tilesim.cli.runner import (
    BuiltCase,
    build_case,
    has_own_progress,
    jsonable,
    manifest_params,
    resolved_settings,
    run_reference,
    tiling_text,
)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ---------------------------------------------------------------------------------------------
# cases


def cmd_cases(args: argparse.Namespace) -> int:
    infos = list_cases(args.family)
    if args.json:
        print(json.dumps([_case_json(i) for i in infos], indent=1))
        return 0
    rows = [
        (
            i.name,
            i.family + (f"/{i.kind}" if i.kind else ""),
            i.op,
            i.size,
            tolerance_text(i.tolerance),
            soc_text(i),
            i.status,
        )
        for i in infos
    ]
    head = ("CASE", "FAMILY", "OP", "SIZE", "ATOL/RTOL/RATIO", "SOC", "SEEDS' STATUS")
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*head).rstrip())
    for r in rows:
        print(line.format(*r).rstrip())
    if not args.verbose:
        print(f"\n{len(rows)} cases; `tilesim cases -v` shows the builder, rule and notes.")
        return 0
    for i in infos:
        print(f"\n{i.name}  ({i.model}, {i.op}, seed {i.seed}, size {i.size})")
        print(f"  {i.summary}")
        params = f" {json.dumps(jsonable(i.builder_params))}" if i.builder_params else ""
        print(f"  builder: {i.builder}{params}")
        print(f"  tolerance: {tolerance_rule(i.tolerance)}")
        for k, v in i.notes.items():
            print(f"  {k.removesuffix('_note')}: {v}")
    return 0


def _case_json(i) -> dict:
    return {
        "name": i.name,
        "family": i.family,
        "kind": i.kind,
        "model": i.model,
        "op": i.op,
        "seed": i.seed,
        "size": i.size,
        "builder": i.builder,
        "builder_params": jsonable(i.builder_params),
        "tolerance": i.tolerance,
        "soc": [s.upper() for s in i.soc],
        "status": i.status,
        "summary": i.summary,
        "notes": i.notes,
    }


# ---------------------------------------------------------------------------------------------
# progress


def _want_progress(args: argparse.Namespace) -> bool:
    if getattr(args, "progress", None) is not None:
        if args.progress:
            require("tqdm", "--progress")
        return args.progress
    return tio.stderr_is_tty() and not os.environ.get("CI")


class _Progress:
    """Stage messages on stderr and a tqdm tile counter, only when asked for (a TTY)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None

    def stage(self, msg: str) -> None:
        if self.enabled:
            print(f"tilesim: {msg}", file=sys.stderr, flush=True)

    def tile_hook(self, desc: str):
        if not self.enabled:
            return None
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        self.bar = tqdm(desc=desc, unit="tile", file=sys.stderr, leave=False, mininterval=0.5)
        bar = self.bar

        def hook(_rec: dict) -> None:
            bar.update(1)

        return hook

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _build_and_run(info, seed, progress: _Progress, trace=None):
    progress.stage(f"building inputs of {info.name}")
    try:
        built = build_case(info, seed, progress=progress.enabled)
    except (ValueError, TypeError) as e:  # e.g. a negative --seed
        raise CliError(f"case {info.name}: the builder rejected its arguments: {e}") from None
    progress.stage(f"running {built.op_name}")
    bar_hook = None if has_own_progress(built) else progress.tile_hook(built.op_name)
    if trace is not None and bar_hook is not None:

        def hook(rec):
            trace(rec)
            bar_hook(rec)

    else:
        hook = trace or bar_hook
    t0 = time.perf_counter()
    try:
        goldens = run_reference(built, trace=hook)
    finally:
        progress.close()
    return built, goldens, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# golden


def golden_header(built: BuiltCase, goldens: dict, *, run_seconds: float, out_dir: Path) -> dict:
    i = built.info
    params = manifest_params(built)
    return {
        "tilesim_version": tilesim.__version__,
        "case": i.name,
        "family": i.family,
        **({"kind": i.kind} if i.kind else {}),
        "model": i.model,
        "op": built.op_name,
        "seed": built.seed,
        "seeds_status": i.status,
        "soc": [s.upper() for s in i.soc],
        "summary": i.summary,
        "builder": {"function": i.builder, "params": jsonable(i.builder_params)},
        "params": params,
        "builder_meta": jsonable(built.meta),
        "tiling": params.get("tiling"),
        "tolerance": {**built.tolerance, "rule": tolerance_rule(built.tolerance)},
        "golden": sorted(goldens),
        "reproduce": _reproduce_case(i, built.seed, out_dir),
    }


def _reproduce_case(info, seed, out_dir: Path) -> str:
    """The command that writes this golden again (into ``out_dir``'s parent, absolute)."""
    argv = ["tilesim", "golden", info.name, "-o", str(out_dir.parent.resolve())]
    if seed != info.seed:
        argv += ["--seed", str(seed)]
    return shlex.join(argv)


def byte_layout_notes(built: BuiltCase) -> dict:
    """Row byte layouts of the packed MLA caches (``tilesim.shared.mla_cache``; the layout is
    described in docs/sources.md, "DeepSeek sparse attention")."""
    from tilesim.shared.mla_cache import FIELD_BYTES, NOPE, NSCALES, PYPTO_ROW_BYTES, ROPE

    if "nope_cache" not in built.inputs:
        return {}
    q = built.inputs["nope_cache"].dtype.name
    what = {
        "nope": f"quantized nope ({NOPE} x {q})",
        "rope": f"rope ({ROPE} x bfloat16, little-endian)",
        "scales": f"scales ({NSCALES} x float32, little-endian; scale g covers nope "
        "g*128..g*128+127)",
    }
    layout = built.op_args.get("layout", "pypto")
    fields = sorted(FIELD_BYTES[layout].items(), key=lambda kv: kv[1])
    desc = [f"bytes {a}..{b - 1}: {what[name]}" for name, (a, b) in fields]
    return {"nope_cache": {"row_layout": layout, "row_bytes": PYPTO_ROW_BYTES, "row_fields": desc}}


def _early_check(out_dir: Path, fmt: str, force: bool) -> None:
    """Before the (possibly long) run: refuse an existing golden or the files we know of."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CliError(f"output {str(out_dir)!r} exists and is not a directory")
    known = [tio.MANIFEST] + (["inputs.npz", "golden.npz"] if fmt == "npz" else [])
    there = [f for f in known if (out_dir / f).exists()]
    if there and not force:
        what = f"a golden ({tio.MANIFEST})" if tio.MANIFEST in there else "files"
        raise CliError(
            f"{str(out_dir)!r} already holds {what}: {', '.join(there)}; pass --force to overwrite"
        )
    p = out_dir
    while not p.exists() and p.parent != p:
        p = p.parent
    if p.exists() and not p.is_dir():
        raise CliError(f"cannot create output directory {str(out_dir)!r}: Not a directory")
    if p.is_dir() and not os.access(p, os.W_OK | os.X_OK):
        raise CliError(f"output directory {str(p)!r} is not writable")


def _write_golden(out_dir: Path, *, fmt: str, groups: dict, header: dict, force: bool, notes=None):
    """Check every target, write all files to temporaries, rename them at the end; with
    ``--force`` also remove the files of the previous manifest the new golden does not write."""
    with Outputs(force=force) as outputs:
        tio.declare_golden_dir(outputs, out_dir, fmt=fmt, groups=groups)
        stale = tio.stale_files(out_dir, set(tio.golden_files(fmt, groups)) | {tio.MANIFEST})
        manifest = tio.write_golden_dir(
            outputs, out_dir, fmt=fmt, groups=groups, header=header, notes=notes
        )
    for p in stale:
        p.unlink(missing_ok=True)
    return manifest


def _print_files(out_dir: Path, manifest: dict) -> None:
    files: dict[str, list] = {}
    for t in manifest["tensors"]:
        files.setdefault(t["file"], []).append(t)
    for f, ts in files.items():
        size = (out_dir / f).stat().st_size
        desc = ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in ts)
        print(f"  {out_dir / f}  ({_fmt_bytes(size)}): {desc}")
    print(f"  {out_dir / tio.MANIFEST}")


def cmd_golden(args: argparse.Namespace) -> int:
    if args.inputs is not None:
        return _golden_replay(args)
    if args.case is None:
        raise CliError("name a CASE, or give --inputs FILE --op OP (replay captured inputs)")
    if args.op is not None or args.params is not None or args.like is not None:
        raise CliError("--op/--params/--like go with --inputs (a replay), not with a CASE")
    info = get_case(args.case)
    out_dir = Path(args.output) / info.name
    _early_check(out_dir, args.format, args.force)
    progress = _Progress(_want_progress(args))
    built, goldens, run_s = _build_and_run(info, args.seed, progress)
    progress.stage(f"writing {args.format} files to {out_dir}")
    header = golden_header(built, goldens, run_seconds=run_s, out_dir=out_dir)
    if args.format != "npz":
        header["reproduce"] += f" --format {args.format}"
    groups = {"input": built.inputs, **_golden_groups(built.op_name, built.op_args, goldens)}
    manifest = _write_golden(
        out_dir,
        fmt=args.format,
        groups=groups,
        header=header,
        force=args.force,
        notes=byte_layout_notes(built),
    )
    print(f"{info.name}: {info.summary}")
    print(
        f"  built inputs in {built.build_seconds:.2f} s, ran {built.op_name} in {run_s:.2f} s "
        f"(seed {built.seed})"
    )
    print(f"  tiling: {tiling_text(resolved_settings(built.op_name, built.op_args).get('tiling'))}")
    _print_files(out_dir, manifest)
    return 0


def _golden_groups(op: str, op_args: dict, goldens: dict) -> dict:
    """The golden tensor groups of a manifest: ``golden``, plus ``scores`` where the op's
    selection has block scores to judge ties by (the MSA indexer)."""
    groups = {"golden": goldens}
    scores = indexer_block_scores(op, op_args)
    if scores:
        groups["scores"] = scores
    return groups


def _golden_replay(args: argparse.Namespace) -> int:
    from tilesim.cli import replay as rp

    if args.case is not None or args.seed is not None:
        raise CliError("--inputs replays captured inputs: give no CASE and no --seed")
    src = Path(args.inputs)
    name = args.name or (src.name if src.is_dir() else src.stem) or "replay"
    if src.name == tio.MANIFEST and not args.name:
        name = src.parent.name or "replay"
    if Path(name).name != name or name in (".", ".."):
        raise CliError(f"--name {name!r}: expected a plain directory name")
    out_dir = Path(args.output) / name
    _early_check(out_dir, args.format, args.force)
    plan = rp.plan_replay(args.inputs, op=args.op, params_text=args.params, like=args.like)
    op_args, params = _replay_arguments(plan)
    t0 = time.perf_counter()
    goldens = rp.run_op(plan.op, op_args)
    run_s = time.perf_counter() - t0
    groups = _golden_groups(plan.op, op_args, goldens)
    manifest = _write_golden(
        out_dir,
        fmt=args.format,
        groups=groups,
        header=_replay_header(plan, params, goldens, name=name, out_dir=out_dir, fmt=args.format),
        force=args.force,
    )
    print(
        f"{name}: {plan.op} on {len(plan.inputs)} captured inputs from {args.inputs}, "
        f"ran in {run_s:.2f} s"
    )
    print(f"  params: {plan.params_from}")
    print(f"  tiling: {tiling_text(params.get('tiling'))}")
    print(f"  tolerance: {tolerance_text(plan.tolerance)} ({plan.tolerance_from})")
    for n in plan.notes:
        print(f"  note: {n}")
    _print_files(out_dir, manifest)
    return 0


def _replay_arguments(plan) -> tuple[dict, dict]:
    """(the op's keyword arguments, its non-tensor ones) with the tiling resolved."""
    from tilesim.cli import replay as rp
    from tilesim.cli.runner import effective_params

    op_args = rp.op_arguments(plan.op, plan.inputs, plan.params)
    tensors = set(op_args) - set(plan.params) - {"progress"}
    try:
        params = effective_params(plan.op, op_args, tensors)
    except (ValueError, TypeError) as e:
        raise CliError(f"{plan.op} rejected the inputs: {e}") from None
    op_args.update(params)
    return op_args, params


def _replay_header(plan, params: dict, goldens: dict, *, name: str, out_dir: Path, fmt: str):
    from tilesim.cli import replay as rp

    params_json = jsonable(params)
    source = str(Path(plan.source).resolve())
    replay = {
        "inputs": source,
        "params_from": plan.params_from,
        "tolerance_from": plan.tolerance_from,
        **({"like": plan.like} if plan.like else {}),
    }
    return {
        "tilesim_version": tilesim.__version__,
        "case": name,
        "op": plan.op,
        "replay": replay,
        "params": params_json,
        "tiling": params_json.get("tiling"),
        "inputs": rp.input_records(plan.inputs, source),
        "tolerance": {**plan.tolerance, "rule": tolerance_rule(plan.tolerance)},
        "golden": list(goldens),
        "reproduce": rp.reproduce_replay(plan, params_json, name=name, out_dir=out_dir, fmt=fmt),
    }


# ---------------------------------------------------------------------------------------------
# compare


def _tolerance(args, golden) -> dict:
    """The tolerance to judge with: the manifest's, with ``--atol/--rtol/--ratio`` overrides.
    Mode ``ulp`` (no published numbers) without ``--atol/--rtol`` is judged by the default
    rule's golden-aware checks alone; ``--rule seeds`` needs the numbers."""
    manifest = golden.manifest if golden is not None else None
    tol = tio.check_tolerance_fields((manifest or {}).get("tolerance"), "manifest")
    mode = tol.get("mode", "compare")
    given = {k: getattr(args, k) for k in ("atol", "rtol", "ratio") if getattr(args, k) is not None}
    if mode == "set":
        if "atol" in given or "rtol" in given:
            raise CliError(
                "the golden's ids are judged by set equality; --atol/--rtol do not apply"
            )
        return {"atol": 0.0, "rtol": 0.0, "ratio": given.get("ratio", 0.0), "mode": "set"}
    vals = {k: given.get(k, tol.get(k)) for k in ("atol", "rtol", "ratio")}
    vals["ratio"] = 0.0 if vals["ratio"] is None else vals["ratio"]
    seeds = (getattr(args, "rule", None) or "default") == "seeds"
    if mode == "ulp" and vals["atol"] is None and vals["rtol"] is None and not seeds:
        # no published numbers: the golden-aware checks of the default rule judge alone
        return {"atol": None, "rtol": None, "ratio": float(vals["ratio"]), "mode": "ulp"}
    for k in ("atol", "rtol"):
        if vals[k] is None:
            why = " (no published tolerance: mode ulp)" if mode == "ulp" else ""
            raise CliError(
                f"no {k}{why}: pass --{k}, or compare against a golden directory / "
                "manifest.json that states the case's tolerance"
            )
    return {**{k: float(v) for k, v in vals.items()}, "mode": "compare"}


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


def _judge_pair(args, gs: GoldenSet, g: tio.Loaded, a: tio.Loaded, tol: dict, name: str):
    """(verdict, distribution or None) of one golden output."""
    scores = golden_scores(gs.scores) if len(gs.outputs) == 1 else None
    rule = getattr(args, "rule", None) or "default"
    rep = judge(a.array, g.array, tol, name=name, arithmetic=args.arithmetic, rule=rule,
                scores=scores if tol["mode"] == "set" else None,
                kind=kind_of(gs.manifest, tol))  # fmt: skip
    flat = a.array.reshape(g.array.shape)
    dist = distribution(flat, g.array) if tol["mode"] != "set" else None
    return rep, dist


def _judge_pairs(args, gs: GoldenSet, pairs, tol: dict, case: str) -> list:
    """``(verdict, distribution or None, actual, golden, against or None)`` per pair, in the
    golden's order (``against``: which golden the step's attention was judged against)."""
    if (gs.manifest or {}).get("op") in DSA_OPS:
        return _judge_dsa(args, gs, pairs, tol, case)
    results = []
    for g, a in pairs:
        name = case if len(gs.outputs) == 1 else f"{case}:{g.name}"
        results.append((*_judge_pair(args, gs, g, a, tol, name), a, g, None))
    return results


def _judge_dsa(args, gs: GoldenSet, pairs, tol: dict, case: str) -> list:
    """The lightning indexer / decode step: ``topk_indices`` by the score-aware id rule with
    the golden's ``scores``, ``scores`` as floats (:func:`judge_scores`), the attention ``out``
    against :func:`attention_golden` (ids judged first)."""
    rule = getattr(args, "rule", None) or "default"
    by_name = {g.name: (g, a) for g, a in pairs}
    done, ids_rep, ids = {}, None, None
    for n in sorted(by_name, key=lambda n: (n != IDS, n)):
        g, a = by_name[n]
        name = case if len(gs.outputs) == 1 else f"{case}:{n}"
        if n == IDS:
            ids_rep = judge(a.array, g.array, ids_tolerance(tol), name=name, rule=rule,
                            scores=golden_scores(gs.scores), kind="dsa_indexer")  # fmt: skip
            ids, done[n] = a.array, (ids_rep, None, a, g, None)
        elif n == SCORES:
            rep = judge_scores(a.array, g.array, name=name, arithmetic=args.arithmetic)
            done[n] = (rep, distribution(a.array.reshape(g.array.shape), g.array), a, g, None)
        else:
            gold, against = attention_golden(gs, ids, ids_rep, g.array)
            if gold is not g.array:
                src = f"{g.source} recomputed with the ids of {by_name[IDS][1].source}"
                g = tio.Loaded(gold, src, g.manifest, g.entry)
            rep = judge(a.array, gold, tol, name=name, arithmetic=args.arithmetic, rule=rule,
                        kind="dsa")  # fmt: skip
            done[n] = (rep, distribution(a.array.reshape(gold.shape), gold), a, g, against)
    return [done[g.name] for g, _ in pairs]


def _report_json(rep, dist, a, g, against, tol) -> dict:
    """The verdict as JSON; the seeds' report fields (``n_fail``, ``worst``, ...) also sit at
    the top level, as before the golden-aware layer."""
    v = rep.as_dict()
    d = {k: jsonable(x) for k, x in v.pop("seeds", {}).items()}
    d.update(v)
    d.update(actual=a.source, golden=g.source, mode=rep.tolerance.get("mode", tol["mode"]))
    if dist is not None:
        d["distribution"] = dist
    if against is not None:
        d["judged_against"] = against
    return d


def _print_report(rep, dist, a, g, against, tol, scores_missing: bool) -> None:
    print(f"actual: {a.source}\ngolden: {g.source}")
    if rep.kind == "ids":
        how = "sorted rows" if rep.rule == "seeds" else "tie-aware with the golden's scores"
        print(f"(ids compared as sets, {how if not scores_missing else 'exact sets'})")
        if scores_missing:
            print("(the golden stores no block scores: ties cannot be recognised)")
    if against is not None:
        print(f"(attention judged against {against})")
    print(rep.summary())
    if dist is not None:
        print(distribution_text(dist))


def cmd_compare(args: argparse.Namespace) -> int:
    png = Path(args.png) if args.png else None
    png_error = None  # a bad --png is reported after the verdict, which does not need it
    if png is not None:
        try:
            _check_png_arg(png)
            from tilesim.cli.plot import require_matplotlib

            require_matplotlib("compare --png")
        except CliError as e:
            png, png_error = None, e
    gs = load_goldens(args.golden, dtype=args.golden_dtype)
    pairs, notes = match_actuals(args.actual, gs, dtype=args.actual_dtype)
    tol = _tolerance(args, gs.outputs[0])
    for a, g in ((a, g) for g, a in pairs):
        _check_pair(a, g, args.allow_dtype_mismatch)
    outputs = Outputs(force=args.force)
    if png is not None:
        outputs.add(png)
        outputs.check()
    case = (gs.manifest or {}).get("case", Path(gs.outputs[0].source).name)
    if plan_op(gs):
        return _compare_stages(args, gs, pairs, notes, tol, case, png or png_error)
    results = _judge_pairs(args, gs, pairs, tol, case)
    passed = all(r[0].passed for r in results)
    if args.json:
        reps = [_report_json(*r, tol) for r in results]
        print(json.dumps(reps[0] if len(reps) == 1 else {"passed": passed, "outputs": reps}))
    else:
        missing = golden_scores(gs.scores) is None
        for r in results:
            _print_report(*r, tol, missing)
        for n in notes:
            print(f"note: {n}")
    if png is not None:
        _compare_png(outputs, png, results[0], tol)
        print(f"  wrote {png} ({_fmt_bytes(png.stat().st_size)})")
    if png_error is not None:
        sys.stdout.flush()
        raise png_error
    return 0 if passed else 1


def _compare_stages(args, gs: GoldenSet, pairs, notes, tol, case: str, png) -> int:
    """The prologs and the layer step: the stage verdict of
    :func:`tilesim.reference.judge_stages.judge_stages` (which stage first fails and why)."""
    if png is not None:
        raise CliError(
            f"--png: {gs.manifest['op']} is judged stage by stage; draw one output with "
            "`tilesim compare DUMP/NAME.npy GOLDEN:NAME` of a plain golden, or leave --png out"
        )
    rule = getattr(args, "rule", None) or "default"
    rep = judge_plan(gs, pairs, tol, case=case, rule=rule)
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


def _compare_png(outputs: Outputs, png: Path, result, tol) -> None:
    from tilesim.cli.plot import save_compare_png

    rep, _, a, g, _ = result
    title = (
        f"{rep.name}: {'PASS' if rep.passed else 'FAIL'}, {rep.n_fail} failing "
        f"(allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}, max ULP {rep.max_ulp}"
    )
    if rep.failed:
        title += f"; failed: {', '.join(rep.failed)}"
    if rep.n_nonfinite:
        where = ", ".join(str(i) for i, _ in rep.nonfinite[:3])
        title += f"; {rep.n_nonfinite} NaN/Inf at {where}"
    with outputs:
        save_compare_png(
            outputs.temp(png),
            actual=a.array.reshape(g.array.shape),
            golden=g.array,
            ulps=ulp_distances(a.array.reshape(g.array.shape), g.array),
            atol=tol["atol"],
            rtol=tol["rtol"],
            title=title,
        )


# ---------------------------------------------------------------------------------------------
# trace


def _check_png_arg(png: Path) -> None:
    if png.suffix.lower() != ".png":
        raise CliError(f"--png {str(png)!r}: expected a file name ending in .png")
    parent = png.parent if str(png.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"directory {str(parent)!r} of --png does not exist")


def _trace_actual(args, run, goldens: dict):
    """(actual, golden, title of the error panel, passed) for ``--actual``; (None, None, "",
    True) without."""
    if not args.actual:
        return None, None, "", True
    (gname, garr), *_ = sorted(goldens.items())
    g_loaded = tio.Loaded(garr, f"reference {gname}", None, {"name": gname})
    act = tio.load_tensor(args.actual, like=g_loaded, dtype=args.actual_dtype)
    if act.array.shape != garr.shape:
        raise CliError(
            f"mismatched file: {act.source} has shape {list(act.array.shape)}, the golden "
            f"of {run.name} has {list(garr.shape)}"
        )
    tol = _judging_tolerance(run.tolerance)
    rep = judge(act.array, garr, tol, name=run.name)
    title = (
        f"{act.source} vs golden: {'PASS' if rep.passed else 'FAIL'}, {rep.n_fail} failing "
        f"(allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}"
    )
    return act.array, garr, title, rep.passed


def _judging_tolerance(tol: dict) -> dict:
    if tol["mode"] == "set":
        return {"atol": 0.0, "rtol": 0.0, "ratio": tol["ratio"], "mode": "set"}
    if tol["mode"] == "ulp":
        raise CliError("the case has no published tolerance (mode ulp): use `tilesim compare`")
    return tol


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


@dataclasses.dataclass
class _TraceRun:
    """One traced reference run: a named case, or the call a golden directory records."""

    name: str
    op: str
    tolerance: dict
    goldens: dict
    seconds: float


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


def _trace_run(kind: str, target, args, records: list) -> _TraceRun:
    if kind == "case":
        progress = _Progress(_want_progress(args))
        built, goldens, run_s = _build_and_run(target, args.seed, progress, trace=records.append)
        return _TraceRun(target.name, built.op_name, built.tolerance, goldens, run_s)
    from tilesim.cli import replay as rp

    plan = rp.plan_replay(target, op=None, params_text=None, like=None)
    op_args, _ = _replay_arguments(plan)
    t0 = time.perf_counter()
    goldens = rp.run_op(plan.op, op_args, trace=records.append)
    _, m = rp.golden_manifest(target)
    name = m.get("case") or Path(target).name
    return _TraceRun(name, plan.op, plan.tolerance, goldens, time.perf_counter() - t0)


def cmd_trace(args: argparse.Namespace) -> int:
    from tilesim.cli.plot import summarize

    kind, target = _trace_target(args)
    png = Path(args.png) if args.png else None
    outputs = Outputs(force=args.force)
    if png is not None:
        _check_png_arg(png)
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
    actual, golden, err_title, passed = _trace_actual(args, run, run.goldens)
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
        print(f"  wrote {png} ({_fmt_bytes(png.stat().st_size)})")
    return 0 if passed else 1


def _trace_png(path, run, records, summary, actual, golden, err_title) -> None:
    from tilesim.cli.plot import save_trace_png

    tol = _judging_tolerance(run.tolerance) if actual is not None else {"atol": 0, "rtol": 0}
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


def cmd_demo(args: argparse.Namespace) -> int:
    """Quantize a random DeepSeek latent, pack it in the PyPTO cache layout, unpack, dequantize
    and judge the round trip with the comparison utility against a float64 oracle."""
    import numpy as np
    from tilesim.reference import compare, to_bf16
    from tilesim.shared import (
        dequantize_latent,
        pack_pypto_rows,
        quantize_latent_fp8,
        unpack_pypto_rows,
    )

    rng = np.random.default_rng(args.seed)
    kn = to_bf16(rng.uniform(-1, 1, size=(args.rows, 512)).astype(np.float32))
    kr = to_bf16(rng.uniform(-1, 1, size=(args.rows, 64)).astype(np.float32))
    q, s = quantize_latent_fp8(kn)
    cache = pack_pypto_rows(q, kr, s)
    rows = unpack_pypto_rows(cache)
    deq = dequantize_latent(rows.nope, rows.scales)
    # oracle: float64 dequantization of the same bytes, rounded once to BF16
    oracle = rows.nope.astype(np.float64).reshape(-1, 4, 128) * s[:, :, None].astype(np.float64)
    rep = compare(deq, to_bf16(oracle.reshape(-1, 512).astype(np.float32)), atol=0, rtol=0, ratio=0)
    print(
        f"packed cache {cache.shape} {cache.dtype}; rope round trip exact: "
        f"{np.array_equal(rows.rope.view(np.uint16), kr.view(np.uint16))}"
    )
    print(rep.summary())
    err = np.abs(deq.astype(np.float64) - kn.astype(np.float64)).max()
    print(f"FP8 quantization error vs the BF16 latent: max |err| {err:.4g}")
    return 0 if rep.passed else 1
