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
from tilesim.cli.registry import get_case, list_cases
from tilesim.cli.runner import (
    BuiltCase,
    build_case,
    has_own_progress,
    jsonable,
    run_reference,
    tiling_used,
)


def _version() -> str:
    import tilesim

    return tilesim.__version__


def _fmt_shape(d: dict) -> str:
    return f"{d['dtype']}[{','.join(str(s) for s in d['shape'])}]"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ---------------------------------------------------------------------------------------------
# cases


def cmd_cases(args: argparse.Namespace) -> int:
    specs = list_cases(args.family)
    if args.json:
        print(json.dumps([_case_json(s) for s in specs], indent=1))
        return 0
    rows = [
        (
            s.name,
            s.family + (f"/{s.kind}" if s.kind else ""),
            _fmt_shape(s.output),
            "set equality"
            if s.tolerance.get("mode") == "set"
            else f"{s.atol:g}/{s.rtol:g}/{s.ratio:g}",
            s.soc_text(),
            s.status,
        )
        for s in specs
    ]
    head = ("CASE", "FAMILY", "OUTPUT", "ATOL/RTOL/RATIO", "SOC", "SEEDS' STATUS")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*head).rstrip())
    for r in rows:
        print(line.format(*r).rstrip())
    if args.verbose:
        for s in specs:
            print(f"\n{s.name}  ({s.model}, {s.op}, seed {s.seed}, size {s.size})")
            print(f"  {s.summary}")
            for k, v in s.inputs.items():
                print(f"  input  {k:<14} {_fmt_shape(v)}")
            print(f"  output {'out':<14} {_fmt_shape(s.output)}")
            print(f"  tolerance: {s.tolerance['rule']}")
            if s.soc_note:
                print(f"  soc: {s.soc_note}")
            if s.extra.get("status_note"):
                print(f"  status: {s.status} ({s.extra['status_note']})")
    else:
        print(f"\n{len(rows)} cases; `tilesim cases -v` shows inputs and rules.")
    return 0


def _case_json(s) -> dict:
    return {
        "name": s.name,
        "family": s.family,
        "kind": s.kind,
        "model": s.model,
        "op": s.op,
        "seed": s.seed,
        "size": s.size,
        "inputs": s.inputs,
        "output": s.output,
        "tolerance": s.tolerance,
        "soc": list(s.soc),
        "status": s.status,
        "summary": s.summary,
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


def _build_and_run(spec, seed, progress: _Progress, trace=None):
    progress.stage(f"building inputs of {spec.name}")
    try:
        built = build_case(spec, seed, progress=progress.enabled)
    except (ValueError, TypeError) as e:  # e.g. a negative --seed
        raise CliError(f"case {spec.name}: the builder rejected its arguments: {e}") from None
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
    s = built.spec
    return {
        "tilesim_version": _version(),
        "case": s.name,
        "family": s.family,
        **({"kind": s.kind} if s.kind else {}),
        "model": s.model,
        "op": built.op_name,
        "seed": built.seed,
        "seeds_status": s.status,
        "soc": list(s.soc),
        "summary": s.summary,
        "builder": s.builder,
        "params": jsonable(built.params),
        **({"builder_meta": jsonable(built.extra["meta"])} if "meta" in built.extra else {}),
        "tiling": tiling_used(built),
        "tolerance": s.tolerance,
        "golden": sorted(goldens),
        "reproduce": f"tilesim golden {s.name}"
        + (f" --seed {built.seed}" if built.seed != s.seed else ""),
    }


def byte_layout_notes(built: BuiltCase) -> dict:
    """Row byte layouts of the packed MLA caches (``op-facts`` §5.2, ``tilesim.shared``)."""
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
    spec = get_case(args.case)
    out_dir = Path(args.output) / spec.name
    tio.check_writable_dir(out_dir, force=args.force)
    progress = _Progress(_want_progress(args))
    built, goldens, run_s = _build_and_run(spec, args.seed, progress)
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
    print(f"{spec.name}: {spec.summary}")
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


def _tolerances(args, golden: tio.Loaded) -> tuple[float, float, float, str]:
    tol = (golden.manifest or {}).get("tolerance", {})
    vals = {}
    for k in ("atol", "rtol", "ratio"):
        v = getattr(args, k)
        if v is None:
            v = tol.get(k)
        if v is None and k == "ratio":
            v = 0.0
        if v is None:
            raise CliError(
                f"no {k}: pass --{k}, or compare against a golden directory / manifest.json "
                "that states the case's tolerance"
            )
        vals[k] = float(v)
    return vals["atol"], vals["rtol"], vals["ratio"], tol.get("mode", "elementwise")


def cmd_compare(args: argparse.Namespace) -> int:
    from tilesim.reference import compare

    golden = tio.load_tensor(args.golden, dtype=args.golden_dtype)
    actual = tio.load_tensor(args.actual, like=golden, dtype=args.actual_dtype)
    atol, rtol, ratio, mode = _tolerances(args, golden)
    a, g = actual.array, golden.array
    if a.shape != g.shape:
        raise CliError(
            f"mismatched files: actual {actual.source} has shape {list(a.shape)}, golden "
            f"{golden.source} has {list(g.shape)}"
        )
    if a.dtype != g.dtype and not args.allow_dtype_mismatch:
        raise CliError(
            f"mismatched files: actual {actual.source} is {a.dtype}, golden {golden.source} is "
            f"{g.dtype} (--allow-dtype-mismatch compares the values anyway; --actual-dtype "
            "reinterprets raw bytes)"
        )
    if mode == "set":  # block-id selections: order is not part of the contract
        a, g = np.sort(a, axis=-1), np.sort(g, axis=-1)
    name = (golden.manifest or {}).get("case", Path(golden.source).name)
    try:
        rep = compare(
            a,
            g,
            atol=atol,
            rtol=rtol,
            ratio=ratio,
            name=name,
            check_dtype=not args.allow_dtype_mismatch,
            arithmetic=args.arithmetic,
        )
    except (ValueError, TypeError) as e:  # bad tolerance values
        raise CliError(str(e)) from None
    if args.json:
        d = {k: jsonable(v) for k, v in vars(rep).items()}
        d.update(actual=actual.source, golden=golden.source, mode=mode)
        print(json.dumps(d))
        return 0 if rep.passed else 1
    print(f"actual: {actual.source}\ngolden: {golden.source}")
    if mode == "set":
        print("(ids compared as sets: both sorted along the last axis first)")
    print(rep.summary())
    return 0 if rep.passed else 1


# ---------------------------------------------------------------------------------------------
# trace


def cmd_trace(args: argparse.Namespace) -> int:
    from tilesim.cli.plot import save_trace_png, summarize

    spec = get_case(args.case)
    png = Path(args.png)
    if png.suffix.lower() != ".png":
        raise CliError(f"--png {str(png)!r}: expected a file name ending in .png")
    if png.exists() and not args.force:
        raise CliError(f"{str(png)!r} exists; pass --force to overwrite")
    parent = png.parent if str(png.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"directory {str(parent)!r} of --png does not exist")
    if not os.access(parent, os.W_OK):
        raise CliError(f"directory {str(parent)!r} of --png is not writable")
    records: list[dict] = []
    progress = _Progress(_want_progress(args))
    built, goldens, run_s = _build_and_run(spec, args.seed, progress, trace=records.append)
    info = summarize(records)
    actual = golden = None
    err_title = ""
    if args.actual:
        from tilesim.reference import compare

        (gname, garr), *_ = sorted(goldens.items())
        g_loaded = tio.Loaded(garr, f"reference {gname}", None, {"name": gname})
        act = tio.load_tensor(args.actual, like=g_loaded, dtype=args.actual_dtype)
        if act.array.shape != garr.shape:
            raise CliError(
                f"mismatched file: {act.source} has shape {list(act.array.shape)}, the golden "
                f"of {spec.name} has {list(garr.shape)}"
            )
        actual, golden = act.array, garr
        rep = compare(
            actual,
            golden,
            atol=spec.atol,
            rtol=spec.rtol,
            ratio=spec.ratio,
            name=spec.name,
            check_dtype=False,
        )
        err_title = (
            f"{act.source} vs golden: {'PASS' if rep.passed else 'FAIL'}, {rep.n_fail} failing "
            f"(allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}"
        )
    title = (
        f"{spec.name}: {built.op_name}, {info['tiles']} tiles"
        f" (sizes {', '.join(map(str, info['tile_sizes'][:8]))}), reference {run_s:.2f} s"
    )
    save_trace_png(
        png,
        title=title,
        records=records,
        actual=actual,
        golden=golden,
        atol=spec.atol,
        rtol=spec.rtol,
        err_title=err_title,
    )
    print(
        f"{spec.name}: {built.op_name} ran {info['tiles']} tiles in {info['lanes']} lanes "
        f"({', '.join(info['lane_keys']) or 'no lane keys'}); tile sizes {info['tile_sizes']}"
    )
    if err_title:
        print(f"  {err_title}")
    if args.records:
        rp = Path(args.records)
        with rp.open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(jsonable(r)) + "\n")
        print(f"  trace records: {rp}")
    print(f"  wrote {png} ({_fmt_bytes(png.stat().st_size)})")
    return 0
