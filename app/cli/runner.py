"""Build a named case's inputs with its family's builder and run the reference op on them.

The builders (``moe_make_case``, ``msa_make_case``, ``dsa_make_case``) return
``{"inputs": {...}, "params": {...}}`` (``"op"`` too for the attention families). This module
turns that into

* a flat ``{name: ndarray}`` of input tensors (what a golden directory stores; a pair such as
  MoE's ``weights = (w13_flat, w2_flat)`` is stored as its two named members),
* the op's keyword arguments (builder parameters the op does not take, e.g. the data scales,
  are kept for the manifest only),
* the tiling the op runs with (recorded in the manifest),

and calls the op with an optional trace hook. Nothing here changes numbers: the golden is
exactly ``op(**inputs, **params)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.registry import CaseSpec

#: inputs passed to an op as one tuple argument, stored as separately named tensors
PACKED_INPUTS = {"weights": ("w13_flat", "w2_flat")}


@dataclass
class BuiltCase:
    """The inputs of one case, ready to be written or handed to the op."""

    spec: CaseSpec
    seed: int | None
    op_name: str
    inputs: dict  # tensor name -> ndarray (flat: packed pairs split)
    op_args: dict  # argument name -> value, exactly what the op receives (arrays included)
    params: dict  # every builder parameter (JSON-able form written to the manifest)
    build_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def _import_builder(spec: CaseSpec) -> Callable:
    b = spec.builder
    try:
        mod = importlib.import_module(b["module"])
    except ImportError as e:
        raise CliError(
            f"case {spec.name!r}: its builder module {b['module']} is not available ({e})"
        ) from None
    fn = getattr(mod, b["function"], None)
    if fn is None:
        raise CliError(f"case {spec.name!r}: {b['module']} has no builder {b['function']!r}")
    return fn


def op_callable(name: str) -> Callable:
    """The public reference op ``name``, resolved through ``tilesim.reference``'s lazy map.

    Going through the module named in ``_LAZY`` keeps this independent of the package
    attribute, which a same-named submodule (``msa_indexer``, ``msa_main_branch``) could
    rebind to the module itself (``tilesim.reference`` now guards against that too).
    """
    import tilesim.reference as ref

    try:
        mod_name = getattr(ref, "_LAZY", {}).get(name)
        if mod_name is not None:
            fn = getattr(importlib.import_module(f"tilesim.reference.{mod_name}"), name)
        else:
            fn = getattr(ref, name)
    except (AttributeError, ImportError) as e:
        raise CliError(f"reference op {name!r} is not available ({e})") from None
    if not callable(fn) or inspect.ismodule(fn):
        raise CliError(f"reference op {name!r} resolved to {fn!r}, not a function")
    return fn


#: run-control arguments: handed to builders/ops that take them, never written to a manifest
RUN_CONTROL = ("progress", "trace")


def _call_builder(fn: Callable, name: str, kwargs: dict, progress: bool | None) -> dict:
    """``fn(name, **kwargs)``, plus ``progress=`` for builders that take it (DeepSeek)."""
    if progress is None:
        return fn(name, **kwargs)
    try:
        return fn(name, **kwargs, progress=progress)
    except (TypeError, ValueError) as e:
        if "progress" not in str(e):
            raise
        return fn(name, **kwargs)


def build_case(
    spec: CaseSpec, seed: int | None = None, *, progress: bool | None = False
) -> BuiltCase:
    """Run the case's builder (``seed`` overrides the case's own seed).

    ``progress``: ``False`` (default) silences the progress bars of builders and ops that
    have their own (the DeepSeek ones), ``True`` shows them, ``None`` leaves their default.
    """
    fn = _import_builder(spec)
    kwargs = dict(spec.builder.get("params", {}))
    if seed is not None:
        kwargs["seed"] = seed
    t0 = time.perf_counter()
    raw = _call_builder(fn, spec.builder.get("case", spec.name), kwargs, progress)
    dt = time.perf_counter() - t0
    op_name = raw.get("op", spec.op)
    op = op_callable(op_name)
    accepted = set(inspect.signature(op).parameters)

    inputs: dict = {}
    op_args: dict = {}
    for k, v in raw["inputs"].items():
        op_args[k] = v
        if k in PACKED_INPUTS and isinstance(v, (tuple, list)):
            for name, member in zip(PACKED_INPUTS[k], v, strict=True):
                inputs[name] = np.asarray(member)
        elif isinstance(v, (tuple, list)) and all(isinstance(m, np.ndarray) for m in v):
            for j, member in enumerate(v):
                inputs[f"{k}_{j}"] = member
        elif isinstance(v, np.ndarray):
            inputs[k] = v
        else:  # a scalar handed over as an input (e.g. seq_len)
            op_args[k] = v
    params = dict(raw.get("params", {}))
    for k, v in params.items():
        if k in accepted:
            op_args[k] = v
    for k in list(op_args):
        if k not in accepted:
            raise CliError(
                f"case {spec.name!r}: builder input {k!r} is not an argument of {op_name}"
            )
    if progress is not None and "progress" in accepted:
        op_args["progress"] = progress
    scalars = {
        k: v
        for k, v in op_args.items()
        if (k not in raw["inputs"] or not _is_tensorish(v)) and k not in RUN_CONTROL
    }
    params = {k: v for k, v in params.items() if k not in RUN_CONTROL}
    return BuiltCase(
        spec=spec,
        seed=seed if seed is not None else _builder_seed(raw, spec),
        op_name=op_name,
        inputs=inputs,
        op_args=op_args,
        params={**params, **{k: v for k, v in scalars.items() if k not in params}},
        build_seconds=dt,
        extra={"meta": raw["meta"]} if isinstance(raw.get("meta"), dict) else {},
    )


def _builder_seed(raw: dict, spec: CaseSpec):
    for src in (raw, raw.get("meta") or {}, raw.get("params") or {}):
        if isinstance(src, dict) and src.get("seed") is not None:
            return src["seed"]
    return spec.seed


def _is_tensorish(v) -> bool:
    return isinstance(v, np.ndarray) or (
        isinstance(v, (tuple, list)) and v and all(isinstance(m, np.ndarray) for m in v)
    )


def tiling_used(built: BuiltCase) -> dict | None:
    """The tiling the op runs with: its explicit argument, else the op's documented default
    evaluated now (environment overrides included)."""
    args = built.op_args
    for key in ("tiling", "tile_config"):
        if args.get(key) is not None:
            return jsonable(args[key])
    from tilesim.shared import MoeTiling, MsaTiling, SaTileShapeConfig

    fam = built.spec.family
    if fam == "moe" and "dims" in args:
        return jsonable(MoeTiling.from_env(args["dims"].activation))
    if fam == "msa" and built.op_name in ("msa_sparse_decode", "msa_main_branch"):
        t = MsaTiling.from_env()
        d = jsonable(t)
        if built.op_name == "msa_main_branch":
            for k in ("dtype", "max_n"):
                if args.get(k) is not None:
                    d[k] = jsonable(args[k])
        return d
    if fam == "dsa":
        return jsonable(SaTileShapeConfig.from_env())
    return None


def has_own_progress(built: BuiltCase) -> bool:
    """The op draws its own progress bar (so the CLI does not add a second one)."""
    return "progress" in built.op_args


def run_reference(built: BuiltCase, trace: Callable[[dict], None] | None = None) -> dict:
    """``{name: golden ndarray}`` of one reference run (the op's result is named ``out``)."""
    op = op_callable(built.op_name)
    res = op(**built.op_args, trace=trace)
    if isinstance(res, dict):
        return {k: np.asarray(v) for k, v in res.items()}
    if isinstance(res, tuple):
        return {f"out{j}": np.asarray(v) for j, v in enumerate(res)}
    return {"out": np.asarray(res)}


def jsonable(v):
    """Dataclasses, tuples, NumPy scalars/arrays -> JSON-safe values (small arrays only)."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {
            "__type__": type(v).__name__,
            **{k: jsonable(x) for k, x in dataclasses.asdict(v).items()},
        }
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        if v.size > 4096:
            return {"__array__": True, "shape": list(v.shape), "dtype": v.dtype.name}
        return jsonable(v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)
