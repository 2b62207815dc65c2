"""A golden's outputs and the device dumps that answer them.

The golden side (:func:`load_goldens`) is every ``golden`` tensor of a manifest, in the op's
output order, plus its ``scores`` tensors (the MSA indexer's block scores). The actual side
(:func:`match_actuals`) pairs each dumped output with the golden output it answers:

* one file (``.npy``, ``.npz[:KEY]``, ``.bin``, ``.pt[:KEY]``) answers a one-output golden;
* an ``.npz`` or a ``.pt`` dict with several tensors answers by name, a ``.pt`` list or tuple
  by position;
* a file named like CANN's dump converter output,
  ``<op_type>.<op_name>.<task_id>.<stream_id>.<timestamp>.output.<i>.npy``, answers output
  ``i``; a directory holding one such dump (one ``op_type.op_name.task.stream.timestamp``
  prefix) answers every output by index (its ``.input.<i>.npy`` files are ignored);
* a directory of ``<name>.npy`` files answers by name; another golden directory by name.

Some goldens hold outputs a device need not dump (the judge's
:data:`tilesim.reference.judging.plans.OPTIONAL_OUTPUTS`: the lightning indexer's and the decode
step's ``scores``). A missing optional output is left unjudged (a note
says so); a missing required output is an error naming it. With one required output, a single
``.npy`` / ``.bin`` file answers it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dtypes import dtype_from_name, reinterpret
from tilesim.cli.loading import Loaded, load_from_manifest, load_tensor, resolve_spec, split_key
from tilesim.cli.manifest import MANIFEST, entries, read_manifest
from tilesim.cli.tensorio import DTYPES_KEY, read_pt, reading
from tilesim.reference.judging.plans import LIGHTNING_INDEXER_OPS, OPTIONAL_OUTPUTS
from tilesim.reference.judging.stages import STAGED_OPS

#: CANN dump converter naming: op_type.op_name.task_id.stream_id.timestamp.{input|output}.i.npy
CANN_NPY = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)"
    r"\.(?P<timestamp>\d+)\.(?P<io>input|output)\.(?P<index>\d+)\.npy$"
)
#: ops whose golden output ``scores`` is also the id judge's scores (ties)
_GOLDEN_SCORES = LIGHTNING_INDEXER_OPS


@dataclass
class GoldenSet:
    """The golden outputs (op order), the ``scores`` tensors (the id judge's), the manifest
    and its path."""

    outputs: list[Loaded]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    manifest: dict | None = None
    path: Path | None = None

    @property
    def names(self) -> list[str]:
        return [g.name or f"out{j}" for j, g in enumerate(self.outputs)]

    @property
    def optional(self) -> tuple[str, ...]:
        """The names of the outputs a dump may leave out (the judge's ``OPTIONAL_OUTPUTS``;
        every output of a stage-judged op, :data:`STAGED_OPS`: a dump holds any subset)."""
        op = (self.manifest or {}).get("op")
        if op in STAGED_OPS:
            return tuple(self.names)
        return OPTIONAL_OUTPUTS.get(op, ())

    @property
    def required(self) -> list[str]:
        return [n for n in self.names if n not in self.optional]


def load_goldens(spec: str, *, dtype: str | None = None) -> GoldenSet:
    """Every golden output of ``spec`` (a golden directory / manifest, or one tensor file);
    ``manifest.json:NAME`` or ``DIR:NAME`` selects one output."""
    want = dtype_from_name(dtype) if dtype is not None else None
    path, key = resolve_spec(_dir_key(spec))
    if path.name == MANIFEST or path.suffix == ".json":
        m = read_manifest(path)
        es = entries(m, "golden")
        if key is not None:
            es = [e for e in es if e["name"] == key]
        if not es:
            what = f" named {key!r}" if key else ""
            raise CliError(f"{path}: no golden tensor{what} (it lists {_names(m)})")
        outs = [
            Loaded(
                load_from_manifest(path, e, dtype=want),
                str(path) if len(es) == 1 else f"{path}:{e['name']}",
                m,
                e,
            )
            for e in es
        ]
        return GoldenSet(outs, _scores(path, m), m, path)
    one = load_tensor(spec, dtype=dtype)
    m = one.manifest
    mpath = path.parent / MANIFEST if m is not None else None
    return GoldenSet([one], _scores(mpath, m) if m is not None else {}, m, mpath)


def _dir_key(spec: str) -> str:
    """``DIR:NAME`` -> ``DIR/manifest.json:NAME`` (a golden directory with one output named)."""
    head, sep, name = str(spec).rpartition(":")
    if sep and head and not Path(spec).exists() and Path(head).is_dir():
        return f"{Path(head) / MANIFEST}:{name}"
    return str(spec)


def _names(m: dict) -> list[str]:
    return [e["name"] for e in entries(m, "golden")]


def _scores(mpath: Path, m: dict) -> dict[str, np.ndarray]:
    """The ``scores`` tensors; for the ops of :data:`_GOLDEN_SCORES` their golden output
    ``scores`` (also when another output alone is selected)."""
    es = entries(m, "scores")
    if m.get("op") in _GOLDEN_SCORES:
        es += [e for e in entries(m, "golden") if e["name"] == "scores"]
    return {e["name"]: load_from_manifest(mpath, e) for e in es}


def dtype_for(spec: str | None, golden: GoldenSet):
    """The ``--actual-dtype`` of each golden output, as a function of the output: ``spec`` is
    one dtype name for every output (``bfloat16``), or ``NAME=DTYPE`` pairs separated by
    commas (``out=bfloat16,scores=float32``: the outputs not named keep their own dtype)."""
    if spec is None:
        return lambda _g: None
    pairs = [p.strip() for p in str(spec).split(",")]
    if len(pairs) == 1 and "=" not in pairs[0]:
        dtype_from_name(pairs[0])
        return lambda _g: pairs[0]
    named = {}
    for p in pairs:
        name, sep, dt = p.partition("=")
        if not sep or not name or name in named:
            raise CliError(
                f"--actual-dtype {spec!r}: expected one dtype, or NAME=DTYPE pairs separated by "
                "commas (one per golden output)"
            )
        if name not in golden.names:
            raise CliError(f"--actual-dtype: {name!r} is not a golden output ({golden.names})")
        dtype_from_name(dt)
        named[name] = dt
    by_id = {id(g): n for g, n in zip(golden.outputs, golden.names, strict=True)}
    return lambda g: named.get(by_id.get(id(g)))


def _missing(names: list[str], golden: GoldenSet, where: str) -> list[str]:
    """Notes for the outputs in ``names`` a dump lacks; a required one is a CliError."""
    required = [n for n in names if n not in golden.optional]
    if required:
        raise CliError(f"{where}: no dump of golden output(s) {required} (required)")
    return [f"no dump of optional output {n!r}: not judged" for n in names]


def match_actuals(
    spec: str, golden: GoldenSet, *, dtype: str | None = None
) -> tuple[list[tuple[Loaded, Loaded]], list[str]]:
    """``([(golden output, actual), ...], notes)``: the pairs to judge and what was left
    unmatched (e.g. extra device outputs)."""
    path, key = split_key(_dir_key(spec))
    outs = golden.outputs
    dtype = dtype_for(dtype, golden)
    if path.is_dir() and not (path / MANIFEST).exists():
        return _from_directory(path, golden, dtype)
    m = CANN_NPY.match(path.name)
    if m and m["io"] == "output" and path.is_file():
        i = int(m["index"])
        if i >= len(outs):
            raise CliError(
                f"{path.name} is output {i} of a CANN dump; the golden has {len(outs)} "
                f"output(s) {golden.names}"
            )
        return [(outs[i], load_tensor(str(path), like=outs[i], dtype=dtype(outs[i])))], []
    if len(outs) == 1:
        return [(outs[0], load_tensor(spec, like=outs[0], dtype=dtype(outs[0])))], []
    named = key is None and path.suffix in (".npy", ".bin") and path.stem in golden.names
    if named and (golden.manifest or {}).get("op") in STAGED_OPS:
        g = outs[golden.names.index(path.stem)]
        return [(g, load_tensor(spec, like=g, dtype=dtype(g)))], []
    if len(golden.required) == 1 and key is None and path.suffix in (".npy", ".bin"):
        g = outs[golden.names.index(golden.required[0])]
        notes = _missing([n for n in golden.names if n != g.name], golden, str(spec))
        return [(g, load_tensor(spec, like=g, dtype=dtype(g)))], notes
    return _by_name(spec, path, key, golden, dtype)


def _by_name(spec, path: Path, key, golden: GoldenSet, dtype):
    names = golden.names
    if path.suffix in (".pt", ".pth") and key is None:
        return _from_pt(path, golden, dtype)
    if path.suffix == ".npz" or path.name == MANIFEST or path.is_dir():
        held = _held_names(path)
        pairs = []
        for g, n in zip(golden.outputs, names, strict=True):
            if n in held:
                sub = f"{path / MANIFEST}:{n}" if path.is_dir() else f"{path}:{n}"
                pairs.append((g, load_tensor(sub, like=g, dtype=dtype(g))))
        return pairs, _missing([n for n in names if n not in held], golden, str(path))
    raise CliError(
        f"the golden has {len(names)} outputs {names}; ACTUAL {str(spec)!r} must hold them all "
        "(a CANN dump directory, a .pt list/dict, an .npz or a directory of <name>.npy) or "
        "name one golden output as GOLDEN:NAME"
    )


def _held_names(path: Path) -> set[str]:
    """The tensor names an ``.npz`` holds, or the golden names of a manifest / its directory."""
    if path.suffix == ".npz":
        with reading(f"{str(path)!r} as .npz"), np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("not an .npz file")
            return set(z.files) - {DTYPES_KEY}
    m = read_manifest(path / MANIFEST if path.is_dir() else path)
    return set(_names(m))


def _from_pt(path: Path, golden: GoldenSet, dtype):
    """A ``.pt`` dict answers by name; a list / tuple by position: every output, or the
    required ones only, in the golden's order."""
    obj = read_pt(path)
    names = golden.names
    if isinstance(obj, dict):
        arrays = [(n, obj.get(n), f"{path}:{n}") for n in names]
    else:
        order = golden.required if len(obj) == len(golden.required) < len(names) else names
        arrays = [(n, obj[j] if j < len(obj) else None, f"{path}:{j}") for j, n in enumerate(order)]
        arrays += [(n, None, "") for n in names if n not in order]
    notes = _missing([n for n, a, _ in arrays if a is None], golden, str(path))
    by_name = dict(zip(names, golden.outputs, strict=True))
    pairs = []
    for n, a, src in (x for x in arrays if x[1] is not None):
        want = dtype(by_name[n])
        a = reinterpret(a, dtype_from_name(want), src) if want else a
        pairs.append((by_name[n], Loaded(a, src)))
    return sorted(pairs, key=lambda p: names.index(p[0].name or "")), notes


def _from_directory(path: Path, golden: GoldenSet, dtype):
    npys = sorted(p for p in path.iterdir() if p.suffix == ".npy" and p.is_file())
    cann = [(p, CANN_NPY.match(p.name)) for p in npys]
    cann = [(p, m) for p, m in cann if m and m["io"] == "output"]
    outs, names = golden.outputs, golden.names
    if cann:
        groups = {p.name.split(".output.")[0] for p, _ in cann}
        if len(groups) > 1:
            few = ", ".join(sorted(groups)[:3])
            raise CliError(
                f"{str(path)!r} holds the dumps of {len(groups)} op runs ({few}, ...); "
                "point ACTUAL at one output file or a directory of one run"
            )
        by_index = {int(m["index"]): p for p, m in cann}
        pairs = [
            (outs[i], load_tensor(str(by_index[i]), like=outs[i], dtype=dtype(outs[i])))
            for i in range(len(outs))
            if i in by_index
        ]
        missing = [names[i] for i in range(len(outs)) if i not in by_index]
        extra = [by_index[i].name for i in sorted(by_index) if i >= len(outs)]
        notes = _missing(missing, golden, repr(str(path)))
        notes += [f"ignored device output {n} (the golden has {len(outs)})" for n in extra]
        return pairs, notes
    pairs, absent = [], []
    for g, n in zip(outs, names, strict=True):
        f = path / f"{n}.npy"
        if not f.is_file():
            if len(outs) == 1 and len(npys) == 1:
                f = npys[0]
            elif n in golden.optional:
                absent.append(n)
                continue
            else:
                raise CliError(
                    f"{str(path)!r}: no {n}.npy (golden output {n!r}, required) and no CANN "
                    "dump (<op_type>.<op_name>.<task>.<stream>.<timestamp>.output.<i>.npy)"
                )
        pairs.append((g, load_tensor(str(f), like=g, dtype=dtype(g))))
    return pairs, _missing(absent, golden, repr(str(path)))
