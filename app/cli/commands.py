"""The ``tilesim`` sub-commands: ``cases``, ``golden``, ``compare``, ``trace``.

Exit codes: 0 success / comparison passed, 1 comparison failed, 2 usage or input error
(unknown case, unwritable directory, mismatched file, existing output without ``--force``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli import tensorio as tio
from tilesim.cli.registry import (
    get_case,
    list_cases,
    soc_text,
    tolerance_rule,
    tolerance_text,
)
from tilesim.cli.runner import (
    BuiltCase,
    build_case,
    has_own_progress,
    jsonable,
    manifest_params,
    run_reference,
    tiling_used,
)


def _version() -> str:
    import tilesim

    return tilesim.__version__


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


def golden_header(built: BuiltCase, goldens: dict, *, run_seconds: float) -> dict:
    i = built.info
    return {
        "tilesim_version": _version(),
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
        "params": manifest_params(built),
        "builder_meta": jsonable(built.meta),
        "tiling": tiling_used(built),
        "tolerance": {**built.tolerance, "rule": tolerance_rule(built.tolerance)},
        "golden": sorted(goldens),
        "reproduce": f"tilesim golden {i.name}"
        + (f" --seed {built.seed}" if built.seed != i.seed else ""),
    }


def byte_layout_notes(built: BuiltCase) -> dict:
    """Row byte layouts of the packed MLA caches (``tilesim.shared.mla_cache``; the layout is
    described in docs/sources.md, "DeepSeek sparse attention")."""
    from tilesim.shared.mla_cache import NOPE, NSCALES, ROPE

    if "nope_cache" not in built.inputs:
        return {}
    q = built.inputs["nope_cache"].dtype.name
    nope = f"quantized nope ({NOPE} x {q})"
    rope = f"rope ({ROPE} x bfloat16, little-endian)"
    scales = f"scales ({NSCALES} x float32, little-endian; scale g covers nope g*128..g*128+127)"
    r0, s0 = NOPE + 2 * ROPE, NOPE + 4 * NSCALES
    end = NOPE + 2 * ROPE + 4 * NSCALES
    layout = built.op_args.get("layout", "pypto")
    if layout == "flashmla":
        fields = [(0, NOPE, nope), (NOPE, s0, scales), (s0, end, rope)]
    else:
        fields = [(0, NOPE, nope), (NOPE, r0, rope), (r0, end, scales)]
    desc = [f"bytes {a}..{b - 1}: {what}" for a, b, what in fields]
    return {"nope_cache": {"row_layout": layout, "row_bytes": end, "row_fields": desc}}


def cmd_golden(args: argparse.Namespace) -> int:
    info = get_case(args.case)
    out_dir = Path(args.output) / info.name
    tio.check_writable_dir(out_dir, force=args.force)
    progress = _Progress(_want_progress(args))
    built, goldens, run_s = _build_and_run(info, args.seed, progress)
    progress.stage(f"writing {args.format} files to {out_dir}")
    header = golden_header(built, goldens, run_seconds=run_s)
    manifest = tio.write_golden_dir(
        out_dir,
        fmt=args.format,
        inputs=built.inputs,
        goldens=goldens,
        header=header,
        notes=byte_layout_notes(built),
    )
    print(f"{info.name}: {info.summary}")
    print(
        f"  built inputs in {built.build_seconds:.2f} s, ran {built.op_name} in {run_s:.2f} s "
        f"(seed {built.seed})"
    )
    files = {}
    for t in manifest["tensors"]:
        files.setdefault(t["file"], []).append(t)
    for f, ts in files.items():
        size = (out_dir / f).stat().st_size
        desc = ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in ts)
        print(f"  {out_dir / f}  ({_fmt_bytes(size)}): {desc}")
    print(f"  {out_dir / tio.MANIFEST}")
    return 0


# ---------------------------------------------------------------------------------------------
# compare


def _tolerance(args, golden: tio.Loaded) -> dict:
    """The tolerance to judge with: the manifest's, with ``--atol/--rtol/--ratio`` overrides."""
    tol = dict((golden.manifest or {}).get("tolerance") or {})
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
    for k in ("atol", "rtol"):
        if vals[k] is None:
            why = " (no published tolerance: mode ulp)" if mode == "ulp" else ""
            raise CliError(
                f"no {k}{why}: pass --{k}, or compare against a golden directory / "
                "manifest.json that states the case's tolerance"
            )
    return {**{k: float(v) for k, v in vals.items()}, "mode": "compare"}


def judge(actual, golden, tol: dict, *, name: str, check_dtype=True, arithmetic="float64"):
    """The report of ``actual`` vs ``golden`` under ``tol``: the compare rule, or for mode
    ``"set"`` equality of every row's id set (both sorted along the last axis, then exact)."""
    from tilesim.reference import compare

    if tol["mode"] == "set":  # block-id selections: order is not part of the contract
        actual, golden = np.sort(actual, axis=-1), np.sort(golden, axis=-1)
    try:
        return compare(
            actual,
            golden,
            atol=tol["atol"],
            rtol=tol["rtol"],
            ratio=tol["ratio"],
            name=name,
            check_dtype=check_dtype,
            arithmetic=arithmetic,
        )
    except (ValueError, TypeError) as e:  # bad tolerance values
        raise CliError(str(e)) from None


def _check_pair(actual: tio.Loaded, golden: tio.Loaded, allow_dtype_mismatch: bool) -> None:
    a, g = actual.array, golden.array
    if a.shape != g.shape:
        raise CliError(
            f"mismatched files: actual {actual.source} has shape {list(a.shape)}, golden "
            f"{golden.source} has {list(g.shape)}"
        )
    if a.dtype != g.dtype and not allow_dtype_mismatch:
        raise CliError(
            f"mismatched files: actual {actual.source} is {a.dtype}, golden {golden.source} is "
            f"{g.dtype} (--allow-dtype-mismatch compares the values anyway; --actual-dtype "
            "reinterprets raw bytes)"
        )


def cmd_compare(args: argparse.Namespace) -> int:
    golden = tio.load_tensor(args.golden, dtype=args.golden_dtype)
    actual = tio.load_tensor(args.actual, like=golden, dtype=args.actual_dtype)
    tol = _tolerance(args, golden)
    _check_pair(actual, golden, args.allow_dtype_mismatch)
    name = (golden.manifest or {}).get("case", Path(golden.source).name)
    rep = judge(
        actual.array,
        golden.array,
        tol,
        name=name,
        check_dtype=not args.allow_dtype_mismatch,
        arithmetic=args.arithmetic,
    )
    if args.json:
        d = {k: jsonable(v) for k, v in vars(rep).items()}
        d.update(actual=actual.source, golden=golden.source, mode=tol["mode"])
        print(json.dumps(d))
        return 0 if rep.passed else 1
    print(f"actual: {actual.source}\ngolden: {golden.source}")
    if tol["mode"] == "set":
        print("(ids compared as sets: both sorted along the last axis first)")
    print(rep.summary())
    return 0 if rep.passed else 1


# ---------------------------------------------------------------------------------------------
# trace


def _check_png_path(png: Path, force: bool) -> None:
    if png.suffix.lower() != ".png":
        raise CliError(f"--png {str(png)!r}: expected a file name ending in .png")
    if png.exists() and not force:
        raise CliError(f"{str(png)!r} exists; pass --force to overwrite")
    parent = png.parent if str(png.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"directory {str(parent)!r} of --png does not exist")
    if not os.access(parent, os.W_OK):
        raise CliError(f"directory {str(parent)!r} of --png is not writable")


def _trace_actual(args, built: BuiltCase, goldens: dict):
    """(actual, golden, title of the error panel) for ``--actual``; (None, None, "") without."""
    if not args.actual:
        return None, None, ""
    (gname, garr), *_ = sorted(goldens.items())
    g_loaded = tio.Loaded(garr, f"reference {gname}", None, {"name": gname})
    act = tio.load_tensor(args.actual, like=g_loaded, dtype=args.actual_dtype)
    if act.array.shape != garr.shape:
        raise CliError(
            f"mismatched file: {act.source} has shape {list(act.array.shape)}, the golden "
            f"of {built.info.name} has {list(garr.shape)}"
        )
    tol = _judging_tolerance(built.tolerance)
    rep = judge(act.array, garr, tol, name=built.info.name, check_dtype=False)
    title = (
        f"{act.source} vs golden: {'PASS' if rep.passed else 'FAIL'}, {rep.n_fail} failing "
        f"(allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}"
    )
    return act.array, garr, title


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


def cmd_trace(args: argparse.Namespace) -> int:
    from tilesim.cli.plot import save_trace_png, summarize

    info = get_case(args.case)
    png = Path(args.png)
    _check_png_path(png, args.force)
    records: list[dict] = []
    progress = _Progress(_want_progress(args))
    built, goldens, run_s = _build_and_run(info, args.seed, progress, trace=records.append)
    _check_records(built.op_name, records)
    summary = summarize(records)
    actual, golden, err_title = _trace_actual(args, built, goldens)
    tol = _judging_tolerance(built.tolerance) if actual is not None else {"atol": 0, "rtol": 0}
    title = (
        f"{info.name}: {built.op_name}, {summary['tiles']} tiles"
        f" (sizes {', '.join(map(str, summary['tile_sizes'][:8]))}), reference {run_s:.2f} s"
    )
    save_trace_png(
        png,
        title=title,
        records=records,
        actual=actual,
        golden=golden,
        atol=tol["atol"],
        rtol=tol["rtol"],
        err_title=err_title,
    )
    lanes = ", ".join(summary["lane_keys"]) or "no lane keys"
    print(
        f"{info.name}: {built.op_name} ran {summary['tiles']} tiles in {summary['lanes']} lanes "
        f"({lanes}); tile sizes {summary['tile_sizes']}"
    )
    if err_title:
        print(f"  {err_title}")
    if args.records:
        _write_records(Path(args.records), records)
        print(f"  trace records: {args.records}")
    print(f"  wrote {png} ({_fmt_bytes(png.stat().st_size)})")
    return 0
