"""``tilesim golden``: write a named case's golden directory (inputs, golden, manifest), or the
golden of captured inputs (``--inputs``, :mod:`tilesim.cli.replay`)."""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path

import tilesim
from tilesim.cli import CliError
from tilesim.cli.golden_dir import declare_golden_dir, golden_files, stale_files, write_golden_dir
from tilesim.cli.manifest import MANIFEST, RULE_KEY, entries
from tilesim.cli.outputs import Outputs, size_text
from tilesim.cli.progress import Progress, build_and_run, want_progress
from tilesim.cli.registry import get_case, tolerance_rule, tolerance_text
from tilesim.cli.replay import indexer_block_scores
from tilesim.cli.runner import (
    BuiltCase,
    jsonable,
    manifest_params,
    resolved_settings,
    tiling_text,
)


def cmd_golden(args: argparse.Namespace) -> int:
    if args.inputs is not None:
        return _golden_replay(args)
    if args.case is None:
        raise CliError("name a CASE, or give --inputs FILE --op OP (replay captured inputs)")
    if any(v is not None for v in (args.op, args.params, args.like, args.name)):
        raise CliError(
            "--op/--params/--like/--name go with --inputs (a replay), not with a CASE (a "
            "case's golden is written to -o DIR/CASE)"
        )
    info = get_case(args.case)
    out_dir = Path(args.output) / info.name
    _early_check(out_dir, args.format, args.force)
    progress = Progress(want_progress(args))
    built, goldens, run_s = build_and_run(info, args.seed, progress)
    progress.stage(f"writing {args.format} files to {out_dir}")
    header = golden_header(built, goldens, out_dir=out_dir)
    if args.format != "npz":
        header["reproduce"] += f" --format {args.format}"
    groups = {"input": built.inputs, **golden_groups(built.op_name, built.op_args, goldens)}
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


def golden_header(built: BuiltCase, goldens: dict, *, out_dir: Path) -> dict:
    """The manifest fields of a named case's golden (everything but the tensors); ``golden``
    names the outputs in the op's output order (the order of ``goldens``, as returned)."""
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
        "tolerance": {**built.tolerance, RULE_KEY: tolerance_rule(built.tolerance)},
        "golden": list(goldens),
        "reproduce": _reproduce_case(i, built.seed, out_dir),
    }


def _reproduce_case(info, seed, out_dir: Path) -> str:
    """The command that writes this golden again (into ``out_dir``'s parent, absolute)."""
    argv = ["tilesim", "golden", info.name, "-o", str(out_dir.parent.resolve())]
    if seed != info.seed:
        argv += ["--seed", str(seed)]
    return shlex.join(argv)


def byte_layout_notes(built: BuiltCase) -> dict:
    """Row byte layouts of the packed MLA caches (``tilesim.shared.layouts.mla_cache``; the layout
    is described in docs/sources.md, "DeepSeek sparse attention")."""
    from tilesim.shared.layouts.mla_cache import FIELD_BYTES, NOPE, NSCALES, PYPTO_ROW_BYTES, ROPE

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
    known = [MANIFEST] + (["inputs.npz", "golden.npz"] if fmt == "npz" else [])
    there = [f for f in known if (out_dir / f).exists()]
    if there and not force:
        what = f"a golden ({MANIFEST})" if MANIFEST in there else "files"
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
        declare_golden_dir(outputs, out_dir, fmt=fmt, groups=groups)
        stale = stale_files(out_dir, set(golden_files(fmt, groups)) | {MANIFEST})
        manifest = write_golden_dir(
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
        print(f"  {out_dir / f}  ({size_text(size)}): {desc}")
    print(f"  {out_dir / MANIFEST}")


def golden_groups(op: str, op_args: dict, goldens: dict) -> dict:
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
    if args.name == "":
        raise CliError("--name '': expected a plain directory name (leave --name out for the "
                       "inputs' name)")  # fmt: skip
    name = args.name or (src.name if src.is_dir() else src.stem) or "replay"
    if src.name == MANIFEST and not args.name:
        name = src.parent.name or "replay"
    if Path(name).name != name or name in (".", ".."):
        raise CliError(f"--name {name!r}: expected a plain directory name")
    out_dir = Path(args.output) / name
    _check_inputs_kept(out_dir, args)
    _early_check(out_dir, args.format, args.force)
    request = rp.replay_request(args.inputs, op=args.op, params_text=args.params, like=args.like)
    op_args, params = rp.replay_arguments(request)
    t0 = time.perf_counter()
    goldens = rp.run_op(request.op, op_args)
    run_s = time.perf_counter() - t0
    manifest = _write_golden(
        out_dir,
        fmt=args.format,
        groups=golden_groups(request.op, op_args, goldens),
        header=_replay_header(
            request, params, goldens, name=name, out_dir=out_dir, fmt=args.format
        ),
        force=args.force,
    )
    print(
        f"{name}: {request.op} on {len(request.inputs)} captured inputs from {args.inputs}, "
        f"ran in {run_s:.2f} s"
    )
    print(f"  params: {request.params_from}")
    print(f"  tiling: {tiling_text(params.get('tiling'))}")
    print(f"  tolerance: {tolerance_text(request.tolerance)} ({request.tolerance_from})")
    for n in request.notes:
        print(f"  note: {n}")
    _print_files(out_dir, manifest)
    return 0


def _check_inputs_kept(out_dir: Path, args: argparse.Namespace) -> None:
    """Refuse an output directory the replay reads from: the directory of ``--inputs`` (the
    directory itself, or the one holding the file), of a replayed golden's own source, in
    turn, or of a ``--params`` file. Writing there would overwrite, or with ``--force``
    delete, the files read."""
    out = _resolved(out_dir)
    read = [("--inputs", d) for d in _input_dirs(Path(args.inputs))]
    params = Path(args.params) if args.params and not args.params.lstrip().startswith("{") else None
    if params is not None and params.is_file():
        read.append(("--params", _resolved(params).parent))
    for option, d in read:
        if d == out:
            raise CliError(
                f"-o/--name: output directory {str(out_dir)!r} is where {option} "
                f"{getattr(args, option[2:])!r} is read from (writing the golden there would "
                "overwrite or delete those files); choose another -o or --name"
            )


def _input_dirs(path: Path, depth: int = 0) -> list[Path]:
    """The resolved directories whose files a replay of ``path`` reads: ``path`` (a
    directory) or its parent, and for a replayed golden (which stores no inputs) those of the
    inputs it was made from. A manifest that cannot be read adds nothing (the replay itself
    reports it)."""
    from tilesim.cli import replay as rp

    if not path.exists():
        return []
    dirs = [_resolved(path) if path.is_dir() else _resolved(path).parent]
    try:
        found = rp.golden_manifest(path)
    except CliError:
        return dirs
    if found is None or entries(found[1], "input") or depth >= 16:
        return dirs
    src = (found[1].get("replay") or {}).get("inputs")
    if isinstance(src, str) and src and _resolved(Path(src)) != _resolved(found[0].parent):
        dirs += _input_dirs(Path(src), depth + 1)
    return dirs


def _resolved(p: Path) -> Path:
    """``p`` resolved (symlinks followed), or made absolute where a symlink loop stops that."""
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return p.absolute()


def _replay_header(request, params: dict, goldens: dict, *, name: str, out_dir: Path, fmt: str):
    from tilesim.cli import replay as rp

    params_json = jsonable(params)
    source = str(Path(request.source).resolve())
    replay = {
        "inputs": source,
        "params_from": request.params_from,
        "tolerance_from": request.tolerance_from,
        **({"like": request.like} if request.like else {}),
    }
    return {
        "tilesim_version": tilesim.__version__,
        "case": name,
        "op": request.op,
        "replay": replay,
        "params": params_json,
        "tiling": params_json.get("tiling"),
        "inputs": rp.input_records(request.inputs, source),
        "tolerance": {**request.tolerance, RULE_KEY: tolerance_rule(request.tolerance)},
        "golden": list(goldens),
        "reproduce": rp.reproduce_replay(request, params_json, name=name, out_dir=out_dir, fmt=fmt),
    }
