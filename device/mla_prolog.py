"""DeepSeek-V3.2 MLA prolog on Ascend -- one PyPTO kernel: queries, ``q_norm`` and the new
tokens' latent cache rows, all on the device.

Same arguments as the golden :func:`tilesim.reference.mla_prolog` (contract:
:mod:`tilesim.shared.mla_prolog`; the golden's ``[K, N]`` weights, ND, no preparation), plus
``backend`` / ``soc`` / ``validate``; NumPy arrays or torch tensors in, the same kind out
(:mod:`tilesim.device.backend`). The kernel (one per path, below; each docstring has its loop
nest) writes the queries, ``q_norm`` / ``q_norm_scale`` and the cache
rows ``slot_mapping`` names (``-1``: none) into copies of the caller's caches: like the golden,
no argument is written, and every row not named keeps its bytes.

What the kernels compute (``docs/ops/mla_prolog.md``, "Kernel"), each bit for bit the golden
with the same switches:

* the INT8 path (:mod:`tilesim.device._mla_prolog_kernel`, 910B and 950; ``path="int8"``:
  INT8 ``w_uq_qr`` with per-channel scales, BF16 ``w_dq`` / ``w_dkv_kr``,
  ``kv_quant="int8_gym"``, ``cache_layout="kv_split"``, ``rope_pairing="deinterleave"``),
  ``rms_form`` ``"gym_golden"`` (the default) or ``"gym_kernel"``, any ``rms_eps``;
* the FP8 path (:mod:`tilesim.device._mla_prolog_fp8_kernel`, on a SoC with FP8: the 950;
  ``path="fp8"``: the three linears FP8 E4M3 with 128 x 128 block scales, ``rms_form=
  "deepseek"``, ``rope_pairing="interleaved"``, ``kv_quant="fp8_ue8m0_deepseek"``) with
  ``cache_layout="kv_split"`` and ``fp8_promotion="two_roundings"`` (both must be passed: the
  path's defaults are the packed ``"pypto"`` row and ``"fma"``), any ``rms_eps``. The
  kernel reads DeepSeek's ``[K/128, ceil(N/128)]`` block scales as they are: nothing is
  prepared on the host, per call or once.

Anything else is a ``ValueError`` before launch (the golden covers it); FP8 weights on the
910B name the SoC's ``fp8`` flag.

Host copies per call: ``slot_mapping`` (``8 * T`` bytes; the kernel's cache writes are control
flow, PyPTO reads the slots on the host: ``READY_ON_HOST``). ``validate="full"`` also runs the
golden's value scans (finite activations, every weight once: ~85 MB); ``True`` (default) checks
the slots only; ``False`` checks nothing (the launch still copies the slots; a bad slot is then
undefined behaviour).

Compile key: the switches the kernel specialises on (``rms_form``, ``rms_eps``), the token
chunk (a power of two up to 128, :func:`tilesim.device._mla_prolog_kernel.chunk_rows`: one
build per doubling of ``T``; ``T`` is padded to it with discarded rows), the cache's row
count (PyPTO 0.2.0's views need static shapes; a deployment constant) and the JIT options;
``T`` and the slots are runtime values.
"""

from __future__ import annotations

import functools
import types

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.shared import mla_prolog as contract
from tilesim.shared.layouts.mla_cache import NOPE, NSCALES, ROPE
from tilesim.shared.soc import DEFAULT_SOC, require_fp8
from tilesim.shared.validate import check_choice

#: the switch values the kernel implements (every other value: ``ValueError`` before launch)
KERNEL_SWITCHES = {
    "linears": {"q_a": "bf16", "q_b": "int8_channel", "kv_a": "bf16"},
    "rope_pairing": ("deinterleave",),
    "rms_form": ("gym_golden", "gym_kernel"),
    "kv_quant": ("int8_gym",),
    "cache_layout": ("kv_split",),
}
_KERNEL_INPUTS = ("x", "w_dq", "w_uq_qr", "w_uq_qr_scale", "w_uk", "w_dkv_kr", "gamma_cq",
                  "gamma_ckv", "cos", "sin", "slot_mapping", "kv_cache", "kr_cache",
                  "kv_scale_cache")  # fmt: skip
_INPUTS = ("x", "w_dq", "w_uq_qr", "w_uq_qr_scale", "w_uk", "w_dkv_kr", "gamma_cq", "gamma_ckv",
           "cos", "sin", "slot_mapping", "kv_cache", "kr_cache", "kv_scale_cache", "w_dq_scale",
           "w_dkv_kr_scale")  # fmt: skip
_FP8_INPUTS = ("x", "w_dq", "w_dq_scale", "w_uq_qr", "w_uq_qr_scale", "w_uk", "w_dkv_kr",
               "w_dkv_kr_scale", "gamma_cq", "gamma_ckv", "cos", "sin", "slot_mapping",
               "kv_cache", "kr_cache", "kv_scale_cache")  # fmt: skip


#: the FP8 path's switch values on an FP8 SoC (the 950; the kernel:
#: :mod:`tilesim.device._mla_prolog_fp8_kernel`): DeepSeek's defaults except the cache form
#: (the ``kv_split`` triple, not the packed row) and the block promotion (two roundings)
FP8_KERNEL_SWITCHES = {
    "linears": {"q_a": "fp8_block", "q_b": "fp8_block", "kv_a": "fp8_block"},
    "rope_pairing": ("interleaved",),
    "rms_form": ("deepseek",),
    "kv_quant": ("fp8_ue8m0_deepseek",),
    "cache_layout": ("kv_split",),
    "fp8_promotion": ("two_roundings",),
}
_WEIGHT_OF = {"q_a": "w_dq", "q_b": "w_uq_qr", "kv_a": "w_dkv_kr"}
#: the FP8 kernel's weight parameters in order: each E4M3 ``[K, N]`` weight and its FP32
#: ``[K/128, ceil(N/128)]`` block scales (BF16 ``w_uk`` unscaled), the caller's tensors as they
#: are (no host preparation, per call or once)
_FP8_WEIGHTS = ("w_dq", "w_dq_scale", "w_uq_qr", "w_uq_qr_scale", "w_uk", "w_dkv_kr",
                "w_dkv_kr_scale")  # fmt: skip


def kernel_switches(a: contract.Args) -> dict:
    """The switch table of the kernel a call runs: :data:`FP8_KERNEL_SWITCHES` when ``w_dq``
    is FP8, else :data:`KERNEL_SWITCHES` (the INT8 path)."""
    return FP8_KERNEL_SWITCHES if a.linears["q_a"] == "fp8_block" else KERNEL_SWITCHES


def _check_kernel_limits(a: contract.Args, soc: str) -> None:
    """What the kernels cannot do on top of the contract's checks (``ValueError``): an FP8
    weight on a SoC without FP8 (the SoC's ``fp8`` flag, :func:`tilesim.shared.soc.require_fp8`),
    then every weight kind and switch value the path's kernel does not implement
    (:func:`kernel_switches`)."""
    for name, w in _WEIGHT_OF.items():
        if a.linears[name] == "fp8_block":
            require_fp8(soc, w, "an FP8 E4M3 weight (path 'fp8')",
                        "use the INT8 path (path='int8') on the 910B, or soc='950'")  # fmt: skip
    table = kernel_switches(a)
    label = "FP8" if table is FP8_KERNEL_SWITCHES else "INT8"
    for name, want in table["linears"].items():
        if a.linears[name] != want:
            raise ValueError(
                f"{_WEIGHT_OF[name]}: the device kernel's {label} path takes a {want} {name} "
                f"linear, got a {a.linears[name]} weight; mixed linears are golden-only "
                "(tilesim.reference.mla_prolog)"
            )
    for name in ("rope_pairing", "rms_form", "kv_quant", "cache_layout", "fp8_promotion"):
        got, ok = getattr(a, name), table.get(name)
        if ok is not None and got not in ok:
            raise ValueError(
                f"{name}: the device kernel implements {ok} on the {label} path, got {got!r}; "
                "the golden covers the rest (tilesim.reference.mla_prolog)"
            )


def _checked(ins, switches: dict, validate, soc: str) -> contract.Args:
    """The contract's ``check_meta`` (as the golden runs it), then the value checks its record
    names as ``validate`` asks (:func:`tilesim.device.backend.value_checks`: ``True`` the
    slots, ``check_int_values``; ``"full"`` every check of the golden too), then the
    kernel's limits."""
    _backend.validate_level(validate)
    a = contract.check_meta(ins, **switches)
    a = _backend.value_checks(contract.RECORD, a, validate)  # the record's slot / full checks
    _check_kernel_limits(a, soc)
    return a


def _rope_table(v, torch):
    """``cos``/``sin`` as FP32 ``[T, 64]`` (a ``[T, 32]`` table repeated, as the golden reads
    it; BF16 widened exactly)."""
    v = v.to(torch.float32)
    return (torch.cat([v, v], dim=1) if v.shape[1] == ROPE // 2 else v).contiguous()


def _padded(v, rows: int, fill, torch):
    """``v`` with rows appended up to ``rows`` (filled with ``fill``; ``v`` itself when none)."""
    if v.shape[0] == rows:
        return v.contiguous()
    pad = torch.full((rows - v.shape[0], *v.shape[1:]), fill, dtype=v.dtype, device=v.device)
    return torch.cat([v, pad]).contiguous()


def _call_tensors(a: contract.Args, names: tuple, chunk: int, torch):
    """``({name: tensor} of the call's inputs ``names``, the padded row count (``T`` rounded
    up to ``chunk``), the slots as a tensor)``."""
    t_ = dict(zip(names, _backend.to_tensors(*(getattr(a.ins, n) for n in names)), strict=True))
    slots = t_["slot_mapping"] if a.slot_mapping is None else torch.as_tensor(a.slot_mapping)
    return t_, -(-a.tokens // chunk) * chunk, slots


def _kernel_inputs(a: contract.Args, chunk: int):
    """The kernel's input tensors and fresh output tensors (the caches: copies). ``T`` is
    padded to a multiple of ``chunk`` with zero rows whose slot is -1 (their outputs are
    dropped, nothing of theirs is written)."""
    from tilesim.device._mla_prolog_kernel import SUM_COLS

    torch = require_torch()
    t_, rows, slots = _call_tensors(a, _KERNEL_INPUTS, chunk, torch)
    dev = t_["x"].device
    inputs = [
        _padded(t_["x"], rows, 0.0, torch), t_["w_dq"].contiguous(), t_["w_uq_qr"].contiguous(),
        t_["w_uq_qr_scale"].to(torch.float32).reshape(1, -1).contiguous(),
        t_["w_uk"].contiguous(), t_["w_dkv_kr"].contiguous(),
        t_["gamma_cq"].to(torch.float32).reshape(1, -1).contiguous(),
        t_["gamma_ckv"].to(torch.float32).reshape(1, -1).contiguous(),
        _padded(_rope_table(t_["cos"], torch), rows, 0.0, torch),
        _padded(_rope_table(t_["sin"], torch), rows, 0.0, torch),
        _padded(slots.to(device=dev, dtype=torch.int32), rows, -1, torch),
        torch.ones((contract.Q_LORA, SUM_COLS), dtype=torch.float32, device=dev),
    ]  # fmt: skip
    q_norm = ((contract.Q_LORA, torch.int8), (1, torch.float32))
    return inputs, _kernel_outputs(t_, rows, q_norm, torch)


def _kernel_outputs(t_: dict, rows: int, q_norm: tuple, torch) -> list:
    """Both kernels' fresh outputs: ``query_nope``, ``query_rope``, then one ``[rows, width]``
    tensor per ``(width, dtype)`` of ``q_norm`` (the INT8 path's codes and scale, the FP8
    path's BF16 ``q_norm``), then copies of the three caches (``[rows, width]`` views)."""
    dev = t_["x"].device
    outputs = [
        torch.empty((rows, contract.HEADS, NOPE), dtype=torch.bfloat16, device=dev),
        torch.empty((rows, contract.HEADS, ROPE), dtype=torch.bfloat16, device=dev),
        *(torch.empty((rows, width), dtype=dt, device=dev) for width, dt in q_norm),
    ]
    for name, width in (("kv_cache", NOPE), ("kr_cache", ROPE), ("kv_scale_cache", NSCALES)):
        outputs.append(t_[name].detach().clone().reshape(-1, width).contiguous())
    return outputs


def _kernel_inputs_fp8(a: contract.Args, chunk: int):
    """The FP8 kernel's inputs and fresh outputs (:func:`_kernel_inputs`' rules: ``T`` padded
    to ``chunk`` with slot -1 rows, the caches copies); ``cos``/``sin`` FP32 ``[T, 32]``; the
    weights and their FP32 ``[K/128, ceil(N/128)]`` block scales the caller's tensors, as
    they are (contiguous: no copy for contiguous input)."""
    from tilesim.device._mla_prolog_kernel import SUM_COLS

    torch = require_torch()
    t_, rows, slots = _call_tensors(a, _FP8_INPUTS, chunk, torch)
    dev = t_["x"].device
    inputs = [
        _padded(t_["x"], rows, 0.0, torch), *(t_[n].contiguous() for n in _FP8_WEIGHTS),
        t_["gamma_cq"].to(torch.float32).reshape(1, -1).contiguous(),
        t_["gamma_ckv"].to(torch.float32).reshape(1, -1).contiguous(),
        _padded(t_["cos"].to(torch.float32), rows, 0.0, torch),
        _padded(t_["sin"].to(torch.float32), rows, 0.0, torch),
        _padded(slots.to(device=dev, dtype=torch.int32), rows, -1, torch),
        torch.ones((contract.Q_LORA, SUM_COLS), dtype=torch.float32, device=dev),
    ]  # fmt: skip
    return inputs, _kernel_outputs(t_, rows, ((contract.Q_LORA, torch.bfloat16),), torch)


def _prepared_fp8(a: contract.Args) -> dict:
    from tilesim.device import _mla_prolog_fp8_kernel as fp8
    from tilesim.device._mla_prolog_kernel import chunk_rows

    params = fp8.MlaFp8Params(rms_eps=a.rms_eps, chunk=chunk_rows(a.tokens))
    inputs, outputs = _kernel_inputs_fp8(a, params.chunk)
    kernel = fp8.build(params, (a.cache_rows,))
    return {"kernel": functools.partial(kernel, params=params), "inputs": inputs,
            "outputs": outputs, "params": params}  # fmt: skip


def prepared_launch(a: contract.Args, target) -> dict:
    """What a call launches for checked ``a``: ``{"kernel", "inputs", "outputs", "params"}``
    (the kernel with its static parameters bound; ``outputs``: query_nope, query_rope, q_norm,
    q_norm_scale (INT8 path only) and the three cache copies as ``[rows, d]``)."""
    from tilesim.device import _mla_prolog_kernel as kernels

    del target  # each path's kernel is the same on every SoC that runs it
    if kernel_switches(a) is FP8_KERNEL_SWITCHES:
        return _prepared_fp8(a)
    params = kernels.MlaParams(rms_form=a.rms_form, rms_eps=a.rms_eps,
                               chunk=kernels.chunk_rows(a.tokens))  # fmt: skip
    inputs, outputs = _kernel_inputs(a, params.chunk)
    kernel = kernels.build(params, (a.cache_rows,))
    return {"kernel": functools.partial(kernel, params=params), "inputs": inputs,
            "outputs": outputs, "params": params}  # fmt: skip


def _finish(a: contract.Args, outputs, us, target):
    """``MlaPrologOutputs`` in the caller's cache shapes (NumPy for NumPy input), paired with
    ``cost_us`` on the simulator."""
    ins = a.ins
    if len(outputs) == 6:  # the FP8 path: BF16 q_norm, no q_norm_scale
        outputs = [*outputs[:3], None, *outputs[3:]]
    nope, rope, qn, qs, kv, kr, ks = outputs
    nope, rope, qn = (o[: a.tokens] for o in (nope, rope, qn))  # the padding dropped
    qs = None if qs is None else qs[: a.tokens]
    kv, kr, ks = (
        c.reshape(tuple(getattr(ins, n).shape))
        for c, n in ((kv, "kv_cache"), (kr, "kr_cache"), (ks, "kv_scale_cache"))
    )
    outs = [nope, rope, qn, qs, kv, kr, ks]
    if target.numpy_io:
        from tilesim.shared.interop import to_numpy

        outs = [None if o is None else to_numpy(o).copy() for o in outs]
    res = contract.MlaPrologOutputs(*outs)
    return (res, 0.0 if us is None else us) if target.sim else res


def _target(a: contract.Args, backend: str, soc: str):
    return _backend.resolve(backend, soc, a.ins.x)


@_backend.graph_safe
def mla_prolog(
    x,
    w_dq,
    w_uq_qr,
    w_uq_qr_scale,
    w_uk,
    w_dkv_kr,
    gamma_cq,
    gamma_ckv,
    cos,
    sin,
    slot_mapping,
    kv_cache,
    kr_cache=None,
    kv_scale_cache=None,
    w_dq_scale=None,
    w_dkv_kr_scale=None,
    *,
    path: str = "int8",
    rope_pairing: str | None = None,
    rms_form: str | None = None,
    rms_eps: float | None = None,
    kv_quant: str | None = None,
    cache_layout: str | None = None,
    fp8_promotion: str = "fma",
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate=True,
):
    """The MLA prolog on the device: ``MlaPrologOutputs(query_nope, query_rope, q_norm,
    q_norm_scale, kv_cache, kr_cache, kv_scale_cache)``.

    Arguments as :func:`tilesim.reference.mla_prolog` (the arrays of
    :func:`tilesim.shared.mla_prolog.prolog_inputs`, the switches of
    :func:`~tilesim.shared.mla_prolog.prolog_keywords`), checked by the same contract with the
    same messages; the kernels implement the INT8 path and, on the 950, the FP8 path with the
    ``kv_split`` cache and ``fp8_promotion="two_roundings"`` (module docstring). Device-only
    keywords: ``backend`` (``"npu"``, ``"sim"`` or ``"auto"``), ``soc`` (the simulator's
    target, ``"910b"`` or ``"950"``) and ``validate`` (``True``: the slots are checked on the
    host; ``"full"``: every value check of the golden; ``False``: metadata only).

    Returns ``q_norm [T, 1536]`` (INT8 with FP32 ``q_norm_scale [T, 1]``; FP8 path: BF16 and
    ``None``), BF16 ``query_nope [T, 128, 512]`` and ``query_rope [T, 128, 64]`` (in the
    path's pairing), and updated copies of the three caches in the caller's shapes; NumPy
    arrays for NumPy input; with ``backend="sim"`` the pair ``(outputs, cost_us)``. Inputs are
    never modified.
    """
    ins = types.SimpleNamespace(**{n: v for n, v in locals().items() if n in _INPUTS})
    switches = {"path": path, "rope_pairing": rope_pairing, "rms_form": rms_form,
                "rms_eps": rms_eps, "kv_quant": kv_quant, "cache_layout": cache_layout,
                "fp8_promotion": fp8_promotion}  # fmt: skip
    a = _checked(ins, switches, validate, soc)
    check_choice(backend, "backend", _backend.BACKENDS)
    target = _target(a, backend, soc)
    run = prepared_launch(a, target)
    us = _backend.launch(run["kernel"], run["inputs"], run["outputs"], target)
    return _finish(a, run["outputs"], us, target)


__all__ = ["FP8_KERNEL_SWITCHES", "KERNEL_SWITCHES", "kernel_switches",
           "mla_prolog", "prepared_launch"]  # fmt: skip
