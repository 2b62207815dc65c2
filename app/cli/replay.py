"""A golden from the user's own inputs: replay a failing device case on the reference.

``tilesim golden --inputs FILE --op OP --params JSON`` reads the captured input tensors,
decodes the op's keyword arguments and runs ``tilesim.reference.OP`` on them. Inputs:

* an ``.npz`` (ml_dtypes restored from a ``__tilesim_dtypes__`` member when present);
* a directory of ``<name>.npy`` files;
* raw ``.bin`` files + a manifest: a tilesim ``manifest.json`` (its ``input`` tensors, or every
  tensor when none has a role), or a plain ``{"name": {"file", "dtype", "shape"}, ...}``
  object; give the manifest file or its directory;
* a ``.pt`` file holding a dict of name -> tensor, loaded with
  ``torch.load(weights_only=True)`` (no pickled code runs).

``--params`` is JSON text or a JSON file. Dataclass arguments are written as in a manifest's
``params`` (``{"__type__": "MoeDims", ...}``, the public classes of :mod:`tilesim.shared`), so
the ``params`` of a golden's manifest can be passed back unchanged (a manifest file is accepted
and its ``params`` used).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli import tensorio as tio
from tilesim.cli.runner import PACKED_INPUTS, jsonable, op_callable

#: op arguments the command line never takes from --params
RESERVED = ("trace", "progress", "out", "_fast")


# ---------------------------------------------------------------------------------------------
# inputs


def read_inputs(spec: str) -> dict[str, np.ndarray]:
    """``{name: array}`` of a captured inputs file or directory (see the module docstring)."""
    path = Path(spec)
    if not path.exists():
        raise CliError(f"no such file or directory {str(path)!r}")
    if path.is_dir():
        if (path / tio.MANIFEST).is_file():
            return _from_manifest(path / tio.MANIFEST)
        npys = sorted(p for p in path.iterdir() if p.suffix == ".npy" and p.is_file())
        if not npys:
            raise CliError(f"{str(path)!r} holds no .npy files and no {tio.MANIFEST}")
        return {p.stem: _plain(tio.read_npy(p), str(p)) for p in npys}
    if path.suffix == ".npz":
        return {k: _plain(a, f"{path}:{k}") for k, a in tio.read_npz(path).items()}
    if path.suffix in (".pt", ".pth"):
        obj = tio.read_pt(path)
        if not isinstance(obj, dict):
            raise CliError(f"{path}: expected a dict of name -> tensor (the op's argument names)")
        return obj
    if path.suffix == ".json":
        return _from_manifest(path)
    if path.suffix in (".bin", ".npy"):
        raise CliError(
            f"{str(path)!r}: give the whole set of inputs (an .npz, a .pt, a directory of .npy "
            "files, or a manifest describing the .bin files)"
        )
    raise CliError(f"unsupported inputs {str(path)!r}: expected .npz, .pt, .json or a directory")


def _plain(a: np.ndarray, where: str) -> np.ndarray:
    return tio.check_dtype_supported(a, where)


def _from_manifest(mpath: Path) -> dict[str, np.ndarray]:
    with tio.reading(f"manifest {str(mpath)!r}"):
        m = json.loads(mpath.read_text(encoding="utf-8"))
    if (
        isinstance(m, dict)
        and "tensors" not in m
        and m
        and all(isinstance(v, dict) for v in m.values())
    ):
        m = {"tensors": [{"name": k, "role": "input", **v} for k, v in m.items()]}
    if not isinstance(m, dict) or not isinstance(m.get("tensors"), list):
        raise CliError(f"{str(mpath)!r}: expected a manifest with a 'tensors' list")
    for e in m["tensors"]:
        if isinstance(e, dict):
            e.setdefault("role", "input")
    checked = _validated(mpath, m)  # the entry checks of a golden's manifest
    es = tio.entries(checked, "input") or checked["tensors"]
    return {e["name"]: tio.load_from_manifest(mpath, e) for e in es}


def _validated(mpath: Path, m: dict) -> dict:
    for j, e in enumerate(m["tensors"]):
        tio.check_entry(e, f"{mpath}: tensors[{j}]")
        tio.confined(mpath.parent, e["file"], f"{mpath}: tensors[{j}]")
    return m


def digest(a: np.ndarray) -> str:
    """sha256 of the tensor's C-order little-endian bytes (what a .bin file holds)."""
    return hashlib.sha256(tio._little(np.asarray(a)).tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# params


def read_params(text: str) -> tuple[dict, dict | None]:
    """``(params, tolerance)`` of ``--params``: JSON text, a JSON file, or a golden's manifest
    (its ``params``, and its ``tolerance`` as the second item; else ``None``)."""
    if text is None:
        return {}, None
    src = "--params"
    p = Path(text)
    if not text.lstrip().startswith("{"):
        if not p.is_file():
            raise CliError(f"--params {text!r}: neither a JSON object nor an existing file")
        with tio.reading(f"--params file {text!r}"):
            text = p.read_text(encoding="utf-8")
        src = f"--params file {str(p)!r}"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CliError(f"{src}: not valid JSON ({e})") from None
    tol = None
    if isinstance(obj, dict) and "tensors" in obj and isinstance(obj.get("params"), dict):
        tol = tio.check_tolerance_fields(obj.get("tolerance"), src) or None
        if tol is not None:
            tol = {k: tol.get(k) for k in ("atol", "rtol", "ratio", "mode")}
            tol["mode"] = tol["mode"] or "compare"
        obj = obj["params"]  # a golden's manifest: reuse its params
    if not isinstance(obj, dict):
        raise CliError(f"{src}: expected a JSON object of argument -> value")
    return {str(k): decode(v, f"{src}: {k}") for k, v in obj.items()}, tol


def _shared_dataclasses() -> dict:
    import tilesim.shared as sh

    out = {}
    for n in getattr(sh, "__all__", dir(sh)):
        obj = getattr(sh, n, None)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            out[n] = obj
    return out


def decode(v, where: str):
    """JSON value -> op argument: ``{"__type__": T, ...}`` -> the dataclass ``T`` of
    :mod:`tilesim.shared` (lists in its fields become tuples)."""
    if isinstance(v, dict):
        if v.get("__array__"):
            raise CliError(f"{where}: an array placeholder; arrays go in --inputs")
        if "__type__" in v:
            classes = _shared_dataclasses()
            name = v["__type__"]
            if name not in classes:
                raise CliError(f"{where}: unknown type {name!r}; expected one of {sorted(classes)}")
            fields = {k: decode(x, f"{where}.{k}") for k, x in v.items() if k != "__type__"}
            fields = {k: tuple(x) if isinstance(x, list) else x for k, x in fields.items()}
            try:
                return classes[name](**fields)
            except (TypeError, ValueError) as e:
                raise CliError(f"{where}: {name}: {e}") from None
        return {k: decode(x, f"{where}.{k}") for k, x in v.items()}
    if isinstance(v, list):
        return [decode(x, where) for x in v]
    return v


# ---------------------------------------------------------------------------------------------
# the op call


def op_arguments(op: str, inputs: dict, params: dict) -> dict:
    """The op's keyword arguments: the inputs (packed pairs re-packed) + params, checked
    against the op's signature."""
    fn = op_callable(op)
    sig = inspect.signature(fn)
    names = set(sig.parameters) - set(RESERVED)
    args = dict(inputs)
    for packed, members in PACKED_INPUTS.items():
        if packed in names and all(m in args for m in members):
            args[packed] = tuple(args.pop(m) for m in members)
    for k in params:
        if k in RESERVED or k not in names:
            raise CliError(f"--params: {op} takes no argument {k!r} (it takes {sorted(names)})")
        if k in args:
            raise CliError(f"argument {k!r} is given both in --inputs and in --params")
    args.update(params)
    unknown = sorted(set(args) - names)
    if unknown:
        raise CliError(f"--inputs: {op} takes no argument(s) {unknown} (it takes {sorted(names)})")
    try:
        sig.bind(**args)
    except TypeError as e:
        raise CliError(f"{op}: {e} (inputs {sorted(inputs)}, params {sorted(params)})") from None
    if "progress" in sig.parameters:
        args["progress"] = False
    return args


def run_op(op: str, args: dict) -> dict:
    """``{name: golden array}`` of ``tilesim.reference.OP(**args)``; a rejected argument is a
    :class:`CliError` (exit 2)."""
    from tilesim.cli.runner import run_reference_call

    try:
        return run_reference_call(op, args)
    except (ValueError, TypeError) as e:
        raise CliError(f"{op} rejected the inputs: {e}") from None


def indexer_block_scores(op: str, args: dict) -> dict:
    """For ``msa_indexer``: ``{"block_scores": FP32 [rows, nb]}`` — the kernel scores
    (``tilesim.reference.msa_indexer_scores``), max over each block's counted keys, then over
    the index heads (``head_reduce="max"``: one row) or per head (``"none"``: 4 rows). The
    tie-aware compare reads it. Other ops: ``{}``."""
    if op != "msa_indexer":
        return {}
    from tilesim.reference import msa_indexer_scores
    from tilesim.shared.msa_indexer import block_head_max, check_indexer_seq_len

    nb = args["nb"]
    s = np.asarray(msa_indexer_scores(args["idx_q"], args["idx_k"], nb))
    hm = block_head_max(s, nb, check_indexer_seq_len(args.get("seq_len"), nb))
    if args.get("head_reduce", "max") == "max":
        hm = hm.max(axis=0, keepdims=True)
    return {"block_scores": np.ascontiguousarray(hm, dtype=np.float32)}


def op_tolerance(op: str, like: str | None) -> tuple[dict, str]:
    """The tolerance a replayed golden records and where it came from: the named case
    ``like``, else the one tolerance all the op's named cases share, else mode ``ulp``."""
    from tilesim.cli.registry import get_case, load_registry

    if like is not None:
        info = get_case(like)
        if info.op != op:
            raise CliError(f"--like {like}: that case runs {info.op}, not {op}")
        return dict(info.tolerance), f"from case {like}"
    tols = {json.dumps(i.tolerance, sort_keys=True) for i in load_registry().values() if i.op == op}
    if len(tols) == 1:
        return json.loads(tols.pop()), f"shared by every named case of {op}"
    return (
        {"atol": None, "rtol": None, "ratio": 0.0, "mode": "ulp"},
        f"no published tolerance: {op}'s named cases differ, pass --like CASE",
    )


def input_records(inputs: dict, source: str) -> list[dict]:
    return [
        {
            "name": k,
            "dtype": a.dtype.name,
            "shape": [int(s) for s in a.shape],
            "sha256": digest(a),
            "source": source,
        }
        for k, a in inputs.items()
    ]


def registry_ops() -> list[str]:
    from tilesim.cli.registry import load_registry

    return sorted({i.op for i in load_registry().values()})


__all__ = [
    "decode",
    "digest",
    "indexer_block_scores",
    "input_records",
    "jsonable",
    "op_arguments",
    "op_tolerance",
    "read_inputs",
    "read_params",
    "registry_ops",
    "run_op",
]
