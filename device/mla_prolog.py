"""DeepSeek-V3.2 MLA prolog on Ascend -- one PyPTO kernel: queries, ``q_norm`` and the new
tokens' latent cache rows, all on the device.

Same arguments as the golden :func:`tilesim.reference.mla_prolog` (contract:
:mod:`tilesim.shared.mla_prolog`; the golden's ``[K, N]`` weights, ND, no preparation), plus
``backend`` / ``soc`` / ``validate``; NumPy arrays or torch tensors in, the same kind out
(:mod:`tilesim.device.backend`). The kernel (:mod:`tilesim.device._mla_prolog_kernel`, whose
docstring has the loop nest) writes the queries, ``q_norm`` / ``q_norm_scale`` and the cache
rows ``slot_mapping`` names (``-1``: none) into copies of the caller's caches: like the golden,
no argument is written, and every row not named keeps its bytes.

What the kernel computes: the INT8 path (``path="int8"``: INT8 ``w_uq_qr`` with per-channel
scales, BF16 ``w_dq`` / ``w_dkv_kr``, ``kv_quant="int8_gym"``, ``cache_layout="kv_split"``,
``rope_pairing="deinterleave"``), with ``rms_form`` ``"gym_golden"`` (the default) or
``"gym_kernel"`` and any ``rms_eps``: bit for bit the golden with the same switches
(``docs/ops/mla_prolog.md``, "Kernel"). Anything else is a ``ValueError`` before launch (the
golden covers it).

Host copies per call: ``slot_mapping`` (``8 * T`` bytes; the kernel's cache writes are control
flow, PyPTO reads the slots on the host: ``READY_ON_HOST``). ``validate="full"`` also runs the
golden's value scans (finite activations, every weight once: ~85 MB); ``True`` (default) checks
the slots only; ``False`` reads nothing (a bad slot is then undefined behaviour).

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


def _check_kernel_limits(a: contract.Args, soc: str) -> None:
    """What the kernel cannot do on top of the contract's checks (``ValueError``): an FP8
    weight on a SoC without FP8 (the SoC's ``fp8`` flag, :func:`tilesim.shared.soc.require_fp8`),
    then every switch value the kernel does not implement."""
    for name, want in KERNEL_SWITCHES["linears"].items():
        w = {"q_a": "w_dq", "q_b": "w_uq_qr", "kv_a": "w_dkv_kr"}[name]
        if a.linears[name] == "fp8_block":
            require_fp8(soc, w, "an FP8 E4M3 weight (path 'fp8')",
                        "use the INT8 path (path='int8') on the 910B, or soc='950'")  # fmt: skip
        if a.linears[name] != want:
            raise ValueError(
                f"{w}: the device kernel implements the INT8 path ({want} {name} linear), got a "
                f"{a.linears[name]} weight; the FP8 path is golden-only "
                "(tilesim.reference.mla_prolog)"
            )
    for name in ("rope_pairing", "rms_form", "kv_quant", "cache_layout"):
        got = getattr(a, name)
        if got not in KERNEL_SWITCHES[name]:
            raise ValueError(
                f"{name}: the device kernel implements {KERNEL_SWITCHES[name]}, got {got!r}; "
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


def _kernel_inputs(a: contract.Args, chunk: int):
    """The kernel's input tensors and fresh output tensors (the caches: copies). ``T`` is
    padded to a multiple of ``chunk`` with zero rows whose slot is -1 (their outputs are
    dropped, nothing of theirs is written)."""
    from tilesim.device._mla_prolog_kernel import SUM_COLS

    torch = require_torch()
    ins = a.ins
    t_ = dict(zip(_KERNEL_INPUTS, _backend.to_tensors(*(getattr(ins, n) for n in _KERNEL_INPUTS)),
                  strict=True))  # fmt: skip
    rows, dev = -(-a.tokens // chunk) * chunk, t_["x"].device
    slots = t_["slot_mapping"] if a.slot_mapping is None else torch.as_tensor(a.slot_mapping)
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
    outputs = [
        torch.empty((rows, contract.HEADS, NOPE), dtype=torch.bfloat16, device=dev),
        torch.empty((rows, contract.HEADS, ROPE), dtype=torch.bfloat16, device=dev),
        torch.empty((rows, contract.Q_LORA), dtype=torch.int8, device=dev),
        torch.empty((rows, 1), dtype=torch.float32, device=dev),
    ]
    for name, width in (("kv_cache", NOPE), ("kr_cache", ROPE), ("kv_scale_cache", NSCALES)):
        outputs.append(t_[name].detach().clone().reshape(-1, width).contiguous())
    return inputs, outputs


def prepared_launch(a: contract.Args, target) -> dict:
    """What a call launches for checked ``a``: ``{"kernel", "inputs", "outputs", "params"}``
    (the kernel with its static parameters bound; ``outputs``: query_nope, query_rope, q_norm,
    q_norm_scale and the three cache copies as ``[rows, d]``)."""
    from tilesim.device import _mla_prolog_kernel as kernels

    del target  # the kernel is the same on both SoCs (the INT8 path)
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
    nope, rope, qn, qs, kv, kr, ks = outputs
    nope, rope, qn, qs = (o[: a.tokens] for o in (nope, rope, qn, qs))  # the padding dropped
    kv, kr, ks = (
        c.reshape(tuple(getattr(ins, n).shape))
        for c, n in ((kv, "kv_cache"), (kr, "kr_cache"), (ks, "kv_scale_cache"))
    )
    outs = [nope, rope, qn, qs, kv, kr, ks]
    if target.numpy_io:
        from tilesim.shared.interop import to_numpy

        outs = [to_numpy(o).copy() for o in outs]
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
    same messages; the kernel implements the INT8 path (module docstring). Device-only
    keywords: ``backend`` (``"npu"``, ``"sim"`` or ``"auto"``), ``soc`` (the simulator's
    target, ``"910b"`` or ``"950"``) and ``validate`` (``True``: the slots are checked on the
    host; ``"full"``: every value check of the golden; ``False``: metadata only).

    Returns INT8 ``q_norm [T, 1536]``, FP32 ``q_norm_scale [T, 1]``, BF16 ``query_nope [T, 128,
    512]`` and ``query_rope [T, 128, 64]`` (de-interleaved), and updated copies of the three
    caches in the caller's shapes; NumPy arrays for NumPy input; with ``backend="sim"`` the
    pair ``(outputs, cost_us)``. Inputs are never modified.
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


__all__ = ["KERNEL_SWITCHES", "mla_prolog", "prepared_launch"]
