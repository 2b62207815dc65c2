"""A golden from the user's own inputs: replay a failing device case on the reference.

``tilesim golden --inputs FILE --op OP --params JSON`` reads the captured input tensors,
decodes the op's keyword arguments and runs ``tilesim.reference.OP`` on them. Inputs:

* a golden directory (or its ``manifest.json``) written by ``tilesim golden``: its ``input``
  tensors, or for a replayed golden the inputs it was made from (found by their recorded
  path, checked against their sha256). Its manifest also gives the op, every parameter
  (tiling and split count included) and the tolerance, so ``--inputs DIR`` alone reproduces
  that golden bit for bit;
* an ``.npz`` (ml_dtypes restored from a ``__tilesim_dtypes__`` member when present);
* a directory of ``<name>.npy`` files;
* raw ``.bin`` files + a manifest: a tilesim ``manifest.json`` (its ``input`` tensors, or every
  tensor when none has a role), or a plain ``{"name": {"file", "dtype", "shape"}, ...}``
  object; give the manifest file or its directory;
* a ``.pt`` file holding a dict of name -> tensor, loaded with
  ``torch.load(weights_only=True)`` (no pickled code runs).

``np.savez`` / ``np.save`` store ml_dtypes arrays (BF16, FP8) as opaque void elements
(``|V2``, ``|V1``): such an input takes the type of that size the op's metadata check
(``check_meta`` of :mod:`tilesim.shared`) accepts for it (:func:`settle_dtypes`).

``--params`` is JSON text or a JSON file. Dataclass arguments are written as in a manifest's
``params`` (``{"__type__": "MoeDims", ...}``, the public classes of :mod:`tilesim.shared`), so
the ``params`` of a golden's manifest can be passed back unchanged (a manifest file is accepted
and its ``params`` used). The parameters of a replay are, key by key: ``--params``, else the
``--inputs`` golden's manifest, else the ``--like`` case's (built to read them), else the op's
defaults; the tiling is then resolved by the rule the op itself calls and recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dtypes import DTYPE_NAMES, check_dtype_supported, dtype_from_name, little_endian
from tilesim.cli.loading import load_from_manifest
from tilesim.cli.manifest import (
    MANIFEST,
    check_entry,
    check_tolerance_fields,
    confined,
    entries,
    read_manifest,
)
from tilesim.cli.runner import PACKED_INPUTS, RESERVED, check_meta_of, jsonable, op_callable
from tilesim.cli.tensorio import read_npy, read_npz, read_pt, reading

#: the ml_dtypes types a file stored as opaque void elements of each size may hold
OPAQUE_CANDIDATES = {1: ("float8_e4m3fn", "float8_e5m2"), 2: ("bfloat16",)}
#: how to give dtypes a file cannot carry (the hint of every opaque-dtype error)
DTYPE_HINT = (
    "write the inputs with tilesim's npz writer (tilesim.cli.tensorio.write_npz), or list "
    'the files in a manifest.json beside them: {"NAME": {"file": ..., "dtype": ..., '
    '"shape": [...]}, ...}, and pass that to --inputs'
)


# ---------------------------------------------------------------------------------------------
# inputs


def read_inputs(spec: str) -> dict[str, np.ndarray]:
    """``{name: array}`` of a captured inputs file or directory (see the module docstring)."""
    path = Path(spec)
    if not path.exists():
        raise CliError(f"no such file or directory {str(path)!r}")
    found = golden_manifest(path)
    if found is not None:
        return golden_inputs(*found)
    if path.is_dir():
        if (path / MANIFEST).is_file():
            return _from_manifest(path / MANIFEST)
        npys = sorted(p for p in path.iterdir() if p.suffix == ".npy" and p.is_file())
        if not npys:
            raise CliError(f"{str(path)!r} holds no .npy files and no {MANIFEST}")
        return {p.stem: _plain(read_npy(p), str(p)) for p in npys}
    if path.suffix == ".npz":
        return {k: _plain(a, f"{path}:{k}") for k, a in read_npz(path).items()}
    if path.suffix in (".pt", ".pth"):
        obj = read_pt(path)
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
    """``a`` when its dtype is supported or opaque of a size :func:`settle_dtypes` can name."""
    if is_opaque(a) and a.dtype.itemsize in OPAQUE_CANDIDATES and not a.dtype.names:
        return a
    if is_opaque(a):
        raise CliError(
            f"{where}: opaque {a.dtype.itemsize}-byte elements ({a.dtype.str}): no supported "
            f"dtype has that size; {DTYPE_HINT}"
        )
    return check_dtype_supported(a, where)


def is_opaque(a: np.ndarray) -> bool:
    """Void elements of no known type (ml_dtypes types are void-kind too, but named)."""
    return a.dtype.kind == "V" and a.dtype.name not in DTYPE_NAMES


def golden_manifest(spec) -> tuple[Path, dict] | None:
    """``(manifest path, manifest)`` when ``spec`` is a golden directory written by
    ``tilesim golden`` (or its ``manifest.json``): a manifest naming an ``op`` and its
    ``params``. ``None`` for anything else."""
    path = Path(spec)
    mpath = path / MANIFEST if path.is_dir() else path
    if mpath.suffix != ".json" or not mpath.is_file():
        return None
    with reading(f"manifest {str(mpath)!r}"):
        m = json.loads(mpath.read_text(encoding="utf-8"))
    if not (isinstance(m, dict) and isinstance(m.get("op"), str) and "tensors" in m):
        return None
    if not isinstance(m.get("params", {}), dict):
        raise CliError(f"{str(mpath)!r}: 'params' must be an object")
    return mpath, read_manifest(mpath)


def golden_inputs(mpath: Path, m: dict) -> dict[str, np.ndarray]:
    """The inputs of a golden: its ``input`` tensors; for a replayed golden (which stores
    none) the inputs it was made from, at their recorded path, checked by sha256 and typed as
    the manifest records them (an opaque input of an ``np.savez`` file as the replay read it)."""
    es = entries(m, "input")
    if es:
        return {e["name"]: load_from_manifest(mpath, e) for e in es}
    src = (m.get("replay") or {}).get("inputs")
    records = m.get("inputs")
    if not isinstance(src, str) or not isinstance(records, list):
        raise CliError(f"{str(mpath)!r} holds no input tensors and names no replayed inputs")
    if Path(src).resolve() == mpath.parent.resolve():
        raise CliError(f"{str(mpath)!r}: its replayed inputs point back at itself")
    if not Path(src).exists():
        raise CliError(
            f"{str(mpath)!r} was replayed from {src!r}, which no longer exists: the inputs of "
            "a replayed golden are not copied into it"
        )
    got = read_inputs(src)
    for r in records:
        name = r.get("name") if isinstance(r, dict) else None
        if name not in got or digest(got[name]) != r.get("sha256"):
            raise CliError(
                f"{str(mpath)!r}: input {name!r} at {src!r} is missing or changed since the "
                "replay (its sha256 differs from the manifest's)"
            )
        got[name] = _recorded_type(got[name], r, f"{mpath}: inputs[{name!r}]")
    return got


def _recorded_type(a: np.ndarray, record: dict, where: str) -> np.ndarray:
    """A replayed input in the dtype its record names (the type the replay settled an opaque
    ``|V2`` / ``|V1`` input to: ``np.savez`` stores BF16 and FP8 arrays that way); the bytes,
    which the sha256 covers, are the same."""
    if not is_opaque(a):
        return a
    want = dtype_from_name(record.get("dtype"))
    if want.itemsize != a.dtype.itemsize:
        raise CliError(
            f"{where}: opaque {a.dtype.str} elements but the manifest records {want.name}"
        )
    return a.view(want)


def settle_dtypes(op: str, inputs: dict, params: dict) -> tuple[dict, list[str]]:
    """``(inputs, notes)`` with every opaque-void input (``|V2`` / ``|V1``, an ml_dtypes array
    saved by ``np.savez`` / ``np.save``) viewed as the type of that size which the op's
    metadata check accepts (:func:`tilesim.cli.runner.check_meta_of`); the caller's arrays are
    not modified. ``notes`` says which dtype each took."""
    opaque = [k for k, a in inputs.items() if is_opaque(a)]
    if not opaque:
        return inputs, []
    choices = [[dtype_from_name(n) for n in OPAQUE_CANDIDATES[inputs[k].dtype.itemsize]]
               for k in opaque]  # fmt: skip
    last = None
    for combo in itertools.product(*choices):
        trial = dict(inputs)
        trial.update({k: inputs[k].view(dt) for k, dt in zip(opaque, combo, strict=True)})
        try:
            check_meta_of(op, op_arguments(op, trial, params))
        except (TypeError, ValueError) as e:
            last = e
            continue
        except CliError:  # no metadata check to ask: the usual type of that size
            pass
        notes = [
            f"{k}: opaque {inputs[k].dtype.str} elements read as {dt.name} (what {op} takes)"
            for k, dt in zip(opaque, combo, strict=True)
        ]
        return trial, notes
    sizes = ", ".join(f"{k} {inputs[k].dtype.str}" for k in opaque)
    raise CliError(
        f"--inputs: opaque elements ({sizes}) that no type of their size makes acceptable to "
        f"{op} ({last}); {DTYPE_HINT}"
    )


def _from_manifest(mpath: Path) -> dict[str, np.ndarray]:
    with reading(f"manifest {str(mpath)!r}"):
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
    es = entries(checked, "input") or checked["tensors"]
    return {e["name"]: load_from_manifest(mpath, e) for e in es}


def _validated(mpath: Path, m: dict) -> dict:
    for j, e in enumerate(m["tensors"]):
        check_entry(e, f"{mpath}: tensors[{j}]")
        confined(mpath.parent, e["file"], f"{mpath}: tensors[{j}]")
    return m


def digest(a: np.ndarray) -> str:
    """sha256 of the tensor's C-order little-endian bytes (what a .bin file holds)."""
    return hashlib.sha256(little_endian(np.asarray(a)).tobytes()).hexdigest()


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
        with reading(f"--params file {text!r}"):
            text = p.read_text(encoding="utf-8")
        src = f"--params file {str(p)!r}"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CliError(f"{src}: not valid JSON ({e})") from None
    tol = None
    if isinstance(obj, dict) and "tensors" in obj and isinstance(obj.get("params"), dict):
        tol = check_tolerance_fields(obj.get("tolerance"), src) or None
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


def replay_arguments(request) -> tuple[dict, dict]:
    """``(the op's keyword arguments, its non-tensor ones)`` of a :class:`ReplayRequest`, the
    tiling resolved by the op's own rule (:func:`tilesim.cli.runner.effective_params`)."""
    from tilesim.cli.runner import effective_params

    op_args = op_arguments(request.op, request.inputs, request.params)
    tensors = set(op_args) - set(request.params) - {"progress"}
    try:
        params = effective_params(request.op, op_args, tensors)
    except (ValueError, TypeError) as e:
        raise CliError(f"{request.op} rejected the inputs: {e}") from None
    op_args.update(params)
    return op_args, params


def run_op(op: str, args: dict, trace=None) -> dict:
    """``{name: golden array}`` of ``tilesim.reference.OP(**args, trace=trace)``; a rejected
    argument is a :class:`CliError` (exit 2)."""
    from tilesim.cli.runner import run_reference_call

    try:
        return run_reference_call(op, args, trace=trace)
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


# ---------------------------------------------------------------------------------------------
# the replay request


@dataclass
class ReplayRequest:
    """What one ``golden --inputs`` runs: the op, its inputs and parameters, the tolerance to
    record, and where each came from."""

    op: str
    source: str  # --inputs as given
    inputs: dict  # tensor name -> ndarray (opaque dtypes settled)
    params: dict  # argument -> decoded value (before the tiling is resolved)
    params_from: str
    tolerance: dict
    tolerance_from: str
    #: "like" (a --like case), "params" (a --params manifest), "inputs" (the --inputs
    #: golden's manifest) or "op" (the op's published or default one)
    tolerance_kind: str
    like: str | None = None
    notes: list = field(default_factory=list)


def _manifest_tolerance(m: dict, where: str) -> dict | None:
    tol = check_tolerance_fields(m.get("tolerance"), where)
    if not tol:
        return None
    out = {k: tol.get(k) for k in ("atol", "rtol", "ratio", "mode")}
    out["mode"] = out["mode"] or "compare"
    return out


def case_params(like: str) -> dict:
    """The non-tensor arguments the named case ``like`` runs its op with (built to read them)."""
    from tilesim.cli.registry import get_case
    from tilesim.cli.runner import build_case

    built = build_case(get_case(like), progress=False)
    return {
        k: v
        for k, v in built.op_args.items()
        if k not in RESERVED and k not in built.case["inputs"]
    }


def replay_request(spec: str, *, op: str | None, params_text: str | None, like: str | None):
    """The :class:`ReplayRequest` of ``golden --inputs SPEC [--op OP] [--params P] [--like C]``."""
    found = golden_manifest(spec)
    m = found[1] if found else None
    if m is not None and op is not None and op != m["op"]:
        raise CliError(f"--op {op}: the golden at {spec!r} was made by {m['op']}")
    op = op or (m["op"] if m is not None else None)
    ops = registry_ops()
    if op is None:
        raise CliError(
            f"--inputs needs --op (one of {', '.join(ops)}) unless it is a golden directory"
        )
    if op not in ops:
        raise CliError(f"--op {op!r}: expected one of {', '.join(ops)}")
    given, given_tol = read_params(params_text)
    if m is not None:
        base, base_from = read_params(json.dumps(m.get("params", {})))[0], f"manifest of {spec}"
    elif like is not None:
        op_tolerance(op, like)  # the case must run this op
        base, base_from = case_params(like), f"case {like}"
    else:
        base, base_from = {}, "the op's defaults"
    if given:
        base_from = f"--params over {base_from}" if base else "--params"
    tol, tol_from, kind = _plan_tolerance(op, like, given_tol, params_text, m, spec)
    inputs = golden_inputs(*found) if found else read_inputs(spec)
    params = {**base, **given}
    inputs, notes = settle_dtypes(op, inputs, params)
    return ReplayRequest(op, spec, inputs, params, base_from, tol, tol_from, kind, like, notes)


def _plan_tolerance(op, like, given_tol, params_text, m, spec) -> tuple[dict, str, str]:
    if like is not None:
        return (*op_tolerance(op, like), "like")
    if given_tol is not None:
        return given_tol, f"from {params_text}", "params"
    own = _manifest_tolerance(m, spec) if m is not None else None
    if own is not None:
        src = m.get("case")
        return own, f"from the manifest of {spec}" + (f" (case {src})" if src else ""), "inputs"
    return (*op_tolerance(op, None), "op")


def reproduce_replay(
    request: ReplayRequest, params_json: dict, *, name: str, out_dir: Path, fmt: str
):
    """The command that writes this replayed golden again (absolute paths, every parameter
    inline, the tolerance's source named)."""
    import shlex

    if request.tolerance_kind == "params":  # a manifest-shaped --params carries the tolerance
        tol = {k: request.tolerance[k] for k in ("atol", "rtol", "ratio", "mode")}
        text = json.dumps({"params": params_json, "tolerance": tol, "tensors": []})
    else:
        text = json.dumps(params_json)
    argv = ["tilesim", "golden", "--inputs", str(Path(request.source).resolve())]
    argv += ["--op", request.op, "--params", text, "--name", name]
    argv += ["-o", str(out_dir.parent.resolve())]
    if request.tolerance_kind == "like":
        argv += ["--like", request.like]
    if fmt != "npz":
        argv += ["--format", fmt]
    return shlex.join(argv)


def registry_ops() -> list[str]:
    from tilesim.cli.registry import load_registry

    return sorted({i.op for i in load_registry().values()})


__all__ = [
    "ReplayRequest",
    "case_params",
    "decode",
    "digest",
    "indexer_block_scores",
    "input_records",
    "jsonable",
    "op_arguments",
    "golden_inputs",
    "golden_manifest",
    "op_tolerance",
    "replay_request",
    "read_inputs",
    "read_params",
    "registry_ops",
    "replay_arguments",
    "reproduce_replay",
    "run_op",
    "settle_dtypes",
]
