"""Build a named case with its family's builder and run the reference op on it.

Every builder (``moe_make_case``, ``msa_make_case``, ``dsa_make_case``) is called as
``builder(name, progress=..., **builder_params)`` (plus ``seed=`` when overridden) and returns
the case dict of :mod:`tilesim.shared.registry.case_schema`: ``{"name", "op", "inputs", "params",
"tolerance", "meta"}``. This module turns it into

* a flat ``{name: ndarray}`` of input tensors (what a golden directory stores; a pair such as
  MoE's ``weights = (w13_flat, w2_flat)`` is stored as its two named members),
* the op's keyword arguments: exactly ``{**case["inputs"], **case["params"]}``,
* every other argument the golden depends on (:func:`effective_params`: the op's defaults
  filled in, the tiling resolved by the shared rule the op itself calls, split count
  included), recorded in the manifest so that a replay runs exactly the same call,

and calls the op with an optional trace hook. Nothing here changes numbers: the golden is
exactly ``getattr(tilesim.reference, case["op"])(**case["inputs"], **case["params"])``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import time
import types
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tilesim.reference as reference
from tilesim.cli import CliError
from tilesim.cli.registry import family_builder
from tilesim.shared.layouts.mla_cache import KV_SPLIT, KV_SPLIT_NAMES
from tilesim.shared.registry import ops
from tilesim.shared.registry.case_schema import CASE_KEYS, CaseInfo

#: inputs passed to an op as one tuple argument, stored as separately named tensors
PACKED_INPUTS = {"weights": ("w13_flat", "w2_flat")}
#: op arguments the command line never takes from --params nor records
RESERVED = ("trace", "progress", "out", "_fast")


@dataclass
class BuiltCase:
    """One built case, ready to be written or handed to the op."""

    info: CaseInfo
    case: dict  # the builder's case dict (the schema of tilesim.shared.registry.case_schema)
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


def op_callable(name: str) -> Callable:
    """The public reference op ``name``: a call of the registry of ops
    (:func:`tilesim.shared.registry.ops.calls`), the function :mod:`tilesim.reference`
    imports under that name."""
    if name not in {c.name for c in ops.calls()}:
        close = difflib.get_close_matches(str(name), [c.name for c in ops.calls()], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CliError(f"unknown reference op {name!r}{hint}")
    return getattr(reference, name)


def _check_case(info: CaseInfo, case) -> dict:
    if not isinstance(case, dict) or set(case) != set(CASE_KEYS):
        got = sorted(case) if isinstance(case, dict) else type(case).__name__
        raise CliError(
            f"case {info.name!r}: builder {info.builder} returned {got}, expected the case "
            f"schema keys {list(CASE_KEYS)} (tilesim.shared.registry.case_schema)"
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
    fn = family_builder(info.family)
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
    """Every non-tensor argument the golden depends on, JSON-able, for the manifest: the
    case's params, the op's defaults of the rest, the tiling resolved (:func:`effective_params`)."""
    names = {k for k, v in built.case["inputs"].items() if _is_tensorish(v)}
    return jsonable(effective_params(built.op_name, built.op_args, names))


def _is_tensorish(v) -> bool:
    return isinstance(v, np.ndarray) or (
        isinstance(v, (tuple, list)) and v and all(isinstance(m, np.ndarray) for m in v)
    )


def op_family(op: str) -> str:
    """The name of the op whose public call ``op`` is (its contract module
    ``tilesim.shared.<name>``: ``moe``, ``msa_indexer``, ..., ``dsa_attention_step``)."""
    op_callable(op)  # an unknown call: the CLI's message
    return ops.record_of_call(op).name


def full_arguments(op: str, args: dict) -> dict:
    """``args`` plus the op's defaults of every keyword it was not given (no reserved one)."""
    sig = inspect.signature(op_callable(op))
    out = {
        k: p.default
        for k, p in sig.parameters.items()
        if p.default is not inspect.Parameter.empty and k not in RESERVED
    }
    out.update({k: v for k, v in args.items() if k not in RESERVED})
    return out


def check_meta_of(op: str, args: dict):
    """The op's metadata check (``check_meta`` of ``tilesim.shared.<family>``) on ``args`` (the
    op's keyword arguments, defaults filled): its ``Args``, or its ``TypeError`` / ``ValueError``
    naming the argument. Reads no value."""
    fam = op_family(op)
    mod = ops.contract(fam)
    a = full_arguments(op, args)
    if fam == "moe":
        return mod.check_meta(
            a["sorted_tokens"], a["weights"], a["expert_cumsum"], a["dims"], a["tiling"],
            None, a["round_activation"], None,
        )  # fmt: skip
    if fam == "dsa":
        split = "nope_cache" not in a
        names = KV_SPLIT_NAMES if split else ("nope_cache",)
        caches = tuple(a[k] for k in names)
        keys = ("nq", "n_kv", "softmax_scale", "topk", "block_size", "tiling")
        return mod.check_meta(
            a["query_nope"], a["query_rope"], caches, a["topk_indices"], a["block_table"],
            a["kv_act_seqs"], layout=KV_SPLIT if split else a["layout"],
            **{k: a[k] for k in keys},
        )  # fmt: skip
    # the other contracts name their parameters as the op does: bind them by name; a contract
    # whose first parameter is ``ins`` (the prologs, the layer step) takes the arrays as one
    # namespace and its switches by name
    check = mod.check_meta
    if op == "dsa_decode_step":  # the layer step entered at the indexer: its own entry's check
        check = mod.check_decode_meta
    params = inspect.signature(check).parameters
    kw = {k: a[k] for k in params if k in a and k != "ins"}
    if "ins" in params:
        return check(types.SimpleNamespace(**a), **kw)
    return check(**kw)


def resolved_settings(op: str, args: dict) -> dict:
    """The settings the op resolves itself when given ``None``, by the shared rule it calls:
    ``tiling`` (MoE ``resolve_tiling``, MSA decode ``resolve_tiling`` with its split-KV rule
    for the shape and ``soc``, the main branch's ``check_meta`` with ``dtype`` / ``max_n``,
    DeepSeek ``resolve_tiling``); ``{}`` for an op without a tiling. Passing them back
    explicitly gives the same bits."""
    fam = op_family(op)
    a = full_arguments(op, args)
    if "tiling" not in a:
        return {}
    if fam in ("dsa", "dsa_attention_step"):  # a step's tiling is the attention's
        return {"tiling": ops.contract("dsa").resolve_tiling(a["tiling"])}
    mod = ops.contract(fam)
    meta = check_meta_of(op, a)
    if fam == "moe":
        return {"tiling": mod.resolve_tiling(meta.tiling, meta.dims)}
    if fam == "msa_decode":
        t = mod.resolve_tiling(
            a["tiling"], batch=meta.batch, hkv=meta.hkv, topk=meta.topk, soc=a["soc"]
        )
        return {"tiling": t}
    if fam == "msa_main":
        return {"tiling": meta.tiling, "dtype": meta.dtype, "max_n": meta.max_n}
    return {}  # an op whose tiling rule this module does not know: recorded as given


def effective_params(op: str, args: dict, tensors) -> dict:
    """Every argument of ``op`` except the tensors named in ``tensors`` and the reserved ones:
    the given values, the op's defaults for the rest, and the resolved settings of
    :func:`resolved_settings` (the tiling that runs, split count included)."""
    a = full_arguments(op, args)
    a.update(resolved_settings(op, a))
    return {k: v for k, v in a.items() if k not in set(tensors)}


def tiling_text(tiling) -> str:
    """One line naming a tiling: ``MsaTiling(ntile=512, ..., kv_splits=2)``; ``-`` for none."""
    if tiling is None:
        return "-"
    if dataclasses.is_dataclass(tiling):
        fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(tiling).items())
        return f"{type(tiling).__name__}({fields})"
    return repr(tiling)


def has_own_progress(built: BuiltCase) -> bool:
    """The op draws its own progress bar (so the CLI does not add a second one)."""
    return "progress" in built.op_args


def run_reference(built: BuiltCase, trace: Callable[[dict], None] | None = None) -> dict:
    """``{name: golden ndarray}`` of one reference run (the op's result is named ``out``)."""
    return run_reference_call(built.op_name, built.op_args, trace=trace)


def run_reference_call(op: str, args: dict, trace: Callable[[dict], None] | None = None) -> dict:
    """``{name: ndarray}`` of ``tilesim.reference.OP(**args, trace=trace)``: ``out`` for one
    result, the field names of a named tuple (``topk_indices, scores``; every stage output of
    the prologs and the layer step, caches included), ``out0, out1, ...`` for a plain tuple,
    the keys of a dict (the op's output order). A ``None`` member (an output the op's path does
    not have, e.g. the FP8 path's ``q_norm_scale``) is left out."""
    res = op_callable(op)(**args, trace=trace)
    if isinstance(res, dict):
        return {k: np.asarray(v) for k, v in res.items() if v is not None}
    if isinstance(res, tuple) and hasattr(res, "_fields"):
        pairs = zip(res._fields, res, strict=True)
        return {k: np.asarray(v) for k, v in pairs if v is not None}
    if isinstance(res, tuple):
        return {f"out{j}": np.asarray(v) for j, v in enumerate(res) if v is not None}
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
