"""Build a named case with its family's builder and run the reference op on it.

Every builder (``moe_make_case``, ``msa_make_case``, ``dsa_make_case``) is called as
``builder(name, progress=..., **builder_params)`` (plus ``seed=`` when overridden) and returns
the case dict of :mod:`tilesim.shared.case_schema`: ``{"name", "op", "inputs", "params",
"tolerance", "meta"}``. This module turns it into

* a flat ``{name: ndarray}`` of input tensors (what a golden directory stores; a pair such as
  MoE's ``weights = (w13_flat, w2_flat)`` is stored as its two named members),
* the op's keyword arguments: exactly ``{**case["inputs"], **case["params"]}``,
* the tiling the op runs with (recorded in the manifest),

and calls the op with an optional trace hook. Nothing here changes numbers: the golden is
exactly ``getattr(tilesim.reference, case["op"])(**case["inputs"], **case["params"])``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tilesim.cli import CliError
from tilesim.shared.case_schema import CASE_KEYS, CaseInfo

#: inputs passed to an op as one tuple argument, stored as separately named tensors
PACKED_INPUTS = {"weights": ("w13_flat", "w2_flat")}


@dataclass
class BuiltCase:
    """One built case, ready to be written or handed to the op."""

    info: CaseInfo
    case: dict  # the builder's case dict (the schema of tilesim.shared.case_schema)
    seed: int | None
    inputs: dict  # tensor name -> ndarray (flat: packed pairs split)
    op_args: dict  # argument name -> value, exactly what the op receives
    build_seconds: float = 0.0

    @property
    def op_name(self) -> str:
        return self.case["op"]

    @property
    def tolerance(self) -> dict:
        return self.case["tolerance"]

    @property
    def meta(self) -> dict:
        return self.case["meta"]


def _import_builder(info: CaseInfo) -> Callable:
    module, _, function = info.builder.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise CliError(
            f"case {info.name!r}: its builder module {module} is not available ({e})"
        ) from None
    fn = getattr(mod, function, None)
    if fn is None:
        raise CliError(f"case {info.name!r}: {module} has no builder {function!r}")
    return fn


def op_callable(name: str) -> Callable:
    """The public reference op ``name`` (an attribute of :mod:`tilesim.reference`)."""
    import tilesim.reference as ref

    try:
        fn = getattr(ref, name)
    except (AttributeError, ImportError) as e:
        raise CliError(f"reference op {name!r} is not available ({e})") from None
    if not callable(fn) or inspect.ismodule(fn):
        raise CliError(f"reference op {name!r} resolved to {fn!r}, not a function")
    return fn


def _check_case(info: CaseInfo, case) -> dict:
    if not isinstance(case, dict) or set(case) != set(CASE_KEYS):
        got = sorted(case) if isinstance(case, dict) else type(case).__name__
        raise CliError(
            f"case {info.name!r}: builder {info.builder} returned {got}, expected the case "
            f"schema keys {list(CASE_KEYS)} (tilesim.shared.case_schema)"
        )
    return case


def _flatten_inputs(case_inputs: dict) -> dict:
    """The tensors of ``case["inputs"]`` by file name (tuples split into named members)."""
    out: dict = {}
    for k, v in case_inputs.items():
        if isinstance(v, (tuple, list)) and all(isinstance(m, np.ndarray) for m in v):
            names = PACKED_INPUTS.get(k) or [f"{k}_{j}" for j in range(len(v))]
            out.update(zip(names, v, strict=True))
        elif isinstance(v, np.ndarray):
            out[k] = v
    return out


def build_case(
    info: CaseInfo, seed: int | None = None, *, progress: bool | None = False
) -> BuiltCase:
    """Run the case's builder (``seed`` overrides the case's own seed).

    ``progress``: ``False`` (default) silences the progress bars of builders and ops that
    have their own (the DeepSeek ones), ``True`` shows them, ``None`` leaves their default.
    """
    fn = _import_builder(info)
    kwargs = dict(info.builder_params)
    name = kwargs.pop("case", info.name)
    if seed is not None:
        kwargs["seed"] = seed
    t0 = time.perf_counter()
    case = _check_case(info, fn(name, progress=progress, **kwargs))
    dt = time.perf_counter() - t0
    op_args = {**case["inputs"], **case["params"]}
    if "progress" in inspect.signature(op_callable(case["op"])).parameters:
        op_args["progress"] = progress
    meta_seed = case["meta"].get("seed") if isinstance(case["meta"], dict) else None
    return BuiltCase(
        info=info,
        case=case,
        seed=seed if seed is not None else (meta_seed if meta_seed is not None else info.seed),
        inputs=_flatten_inputs(case["inputs"]),
        op_args=op_args,
        build_seconds=dt,
    )


def manifest_params(built: BuiltCase) -> dict:
    """The op's non-tensor arguments (JSON-able), for the manifest."""
    inputs = built.case["inputs"]
    return {
        k: jsonable(v)
        for k, v in built.op_args.items()
        if k != "progress" and not (k in inputs and _is_tensorish(v))
    }


def _is_tensorish(v) -> bool:
    return isinstance(v, np.ndarray) or (
        isinstance(v, (tuple, list)) and v and all(isinstance(m, np.ndarray) for m in v)
    )


def tiling_used(built: BuiltCase) -> dict | None:
    """The tiling the op runs with: its explicit ``tiling`` argument, else the op's
    documented default evaluated now (environment overrides included)."""
    args = built.op_args
    if args.get("tiling") is not None:
        return jsonable(args["tiling"])
    from tilesim.shared import MoeTiling, MsaTiling, SaTileShapeConfig

    fam = built.info.family
    if fam == "moe" and "dims" in args:
        return jsonable(MoeTiling.from_env(args["dims"].activation))
    if fam == "msa" and built.op_name in ("msa_sparse_decode", "msa_main_branch"):
        d = jsonable(MsaTiling.from_env())
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
    return run_reference_call(built.op_name, built.op_args, trace=trace)


def run_reference_call(op: str, args: dict, trace: Callable[[dict], None] | None = None) -> dict:
    """``{name: ndarray}`` of ``tilesim.reference.OP(**args, trace=trace)``: ``out`` for one
    result, ``out0, out1, ...`` for a tuple, the keys of a dict (the op's output order)."""
    res = op_callable(op)(**args, trace=trace)
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
