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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli import tensorio as tio

#: CANN dump converter naming: op_type.op_name.task_id.stream_id.timestamp.{input|output}.i.npy
CANN_NPY = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)"
    r"\.(?P<timestamp>\d+)\.(?P<io>input|output)\.(?P<index>\d+)\.npy$"
)


@dataclass
class GoldenSet:
    """The golden outputs (op order), the ``scores`` tensors and the manifest."""

    outputs: list[tio.Loaded]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    manifest: dict | None = None

    @property
    def names(self) -> list[str]:
        return [g.name or f"out{j}" for j, g in enumerate(self.outputs)]


def load_goldens(spec: str, *, dtype: str | None = None) -> GoldenSet:
    """Every golden output of ``spec`` (a golden directory / manifest, or one tensor file);
    ``manifest.json:NAME`` or ``DIR:NAME`` selects one output."""
    want = tio.dtype_from_name(dtype) if dtype is not None else None
    path, key = tio._resolve(_dir_key(spec))
    if path.name == tio.MANIFEST or path.suffix == ".json":
        m = tio.read_manifest(path)
        es = tio.entries(m, "golden")
        if key is not None:
            es = [e for e in es if e["name"] == key]
        if not es:
            what = f" named {key!r}" if key else ""
            raise CliError(f"{path}: no golden tensor{what} (it lists {_names(m)})")
        outs = [
            tio.Loaded(
                tio.load_from_manifest(path, e, dtype=want),
                str(path) if len(es) == 1 else f"{path}:{e['name']}",
                m,
                e,
            )
            for e in es
        ]
        return GoldenSet(outs, _scores(path, m), m)
    one = tio.load_tensor(spec, dtype=dtype)
    m = one.manifest
    scores = _scores(path.parent / tio.MANIFEST, m) if m is not None else {}
    return GoldenSet([one], scores, m)


def _dir_key(spec: str) -> str:
    """``DIR:NAME`` -> ``DIR/manifest.json:NAME`` (a golden directory with one output named)."""
    head, sep, name = str(spec).rpartition(":")
    if sep and head and not Path(spec).exists() and Path(head).is_dir():
        return f"{Path(head) / tio.MANIFEST}:{name}"
    return str(spec)


def _names(m: dict) -> list[str]:
    return [e["name"] for e in tio.entries(m, "golden")]


def _scores(mpath: Path, m: dict) -> dict[str, np.ndarray]:
    return {e["name"]: tio.load_from_manifest(mpath, e) for e in tio.entries(m, "scores")}


def match_actuals(
    spec: str, golden: GoldenSet, *, dtype: str | None = None
) -> tuple[list[tuple[tio.Loaded, tio.Loaded]], list[str]]:
    """``([(golden output, actual), ...], notes)``: the pairs to judge and what was left
    unmatched (e.g. extra device outputs)."""
    path, key = tio._split_key(_dir_key(spec))
    outs = golden.outputs
    if path.is_dir() and not (path / tio.MANIFEST).exists():
        return _from_directory(path, golden, dtype)
    m = CANN_NPY.match(path.name)
    if m and m["io"] == "output" and path.is_file():
        i = int(m["index"])
        if i >= len(outs):
            raise CliError(
                f"{path.name} is output {i} of a CANN dump; the golden has {len(outs)} "
                f"output(s) {golden.names}"
            )
        return [(outs[i], tio.load_tensor(str(path), like=outs[i], dtype=dtype))], []
    if len(outs) == 1:
        return [(outs[0], tio.load_tensor(spec, like=outs[0], dtype=dtype))], []
    return _by_name(spec, path, key, golden, dtype)


def _by_name(spec, path: Path, key, golden: GoldenSet, dtype):
    names = golden.names
    if path.suffix in (".pt", ".pth") and key is None:
        obj = tio.read_pt(path)
        want = tio.dtype_from_name(dtype) if dtype is not None else None
        if isinstance(obj, dict):
            got = {n: obj[n] for n in names if n in obj}
            arrays = [(n, got.get(n), f"{path}:{n}") for n in names]
        else:
            arrays = [
                (n, obj[j] if j < len(obj) else None, f"{path}:{j}") for j, n in enumerate(names)
            ]
        if any(a is None for _, a, _ in arrays):
            raise CliError(f"{path}: does not hold every golden output {names}")
        pairs = [
            (g, tio.Loaded(tio._reinterpret(a, want, src) if want else a, src))
            for g, (_, a, src) in zip(golden.outputs, arrays, strict=True)
        ]
        return pairs, []
    if path.suffix == ".npz" or path.name == tio.MANIFEST or path.is_dir():
        pairs = []
        for g, n in zip(golden.outputs, names, strict=True):
            sub = f"{path / tio.MANIFEST}:{n}" if path.is_dir() else f"{path}:{n}"
            pairs.append((g, tio.load_tensor(sub, like=g, dtype=dtype)))
        return pairs, []
    raise CliError(
        f"the golden has {len(names)} outputs {names}; ACTUAL {str(spec)!r} must hold them all "
        "(a CANN dump directory, a .pt list/dict, an .npz or a directory of <name>.npy) or "
        "name one golden output as GOLDEN:NAME"
    )


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
            (outs[i], tio.load_tensor(str(by_index[i]), like=outs[i], dtype=dtype))
            for i in range(len(outs))
            if i in by_index
        ]
        missing = [names[i] for i in range(len(outs)) if i not in by_index]
        extra = [by_index[i].name for i in sorted(by_index) if i >= len(outs)]
        if missing:
            raise CliError(f"{str(path)!r}: no dump of golden output(s) {missing}")
        notes = [f"ignored device output {n} (the golden has {len(outs)})" for n in extra]
        return pairs, notes
    pairs = []
    for g, n in zip(outs, names, strict=True):
        f = path / f"{n}.npy"
        if not f.is_file():
            if len(outs) == 1 and len(npys) == 1:
                f = npys[0]
            else:
                raise CliError(
                    f"{str(path)!r}: no {n}.npy and no CANN dump "
                    "(<op_type>.<op_name>.<task>.<stream>.<timestamp>.output.<i>.npy)"
                )
        pairs.append((g, tio.load_tensor(str(f), like=g, dtype=dtype)))
    return pairs, []
