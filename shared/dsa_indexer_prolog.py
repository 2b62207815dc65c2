"""The contract of the DeepSeek-V3.2 lightning-indexer prolog (op ``dsa_indexer_prolog``),
written once for the golden (:mod:`tilesim.reference.dsa_indexer_prolog`) and a device wrapper.

The prolog turns the hidden state of the new tokens into what the indexer
(:mod:`tilesim.shared.dsa_indexer`) reads: the quantized index queries and their scales, the
per-head weights, and the new tokens' quantized index keys written into the paged index-key
cache (``docs/ops/dsa_indexer_prolog.md``). NumPy on host data; rounds nothing:

* :func:`prolog_inputs` / :func:`prolog_keywords`: the op's arguments, declared once (the
  golden and the wrapper write them out; ``tests/test_op_records.py`` holds them equal);
* :class:`Args`, :func:`check_meta` (dtypes, shapes and the switches of each path; no value
  read), :func:`check_values` = :func:`check_int_values` (the slots) then
  :func:`check_data_values` (finite inputs, the FP8 weights' codes);
* :func:`host_plan`: the cache slot (physical block, offset) each token is written to;
* :func:`cost`: the op's one FLOP / byte counter.

Two paths (``path``):

* ``"int8"`` (910B / A3): pypto-gym ``lightning_indexer_prolog_quant``
  (``hicann/pypto-gym:tests/ops/deepseek_v32_exp/test_lightning_indexer_prolog_quant.py``):
  ``q_norm`` is the MLA prolog's per-token INT8 output with its FP32 scale ``[T, 1]``,
  ``w_qb`` INT8 ``[R, 8192]`` with per-channel FP32 scales ``[8192, 1]``, BF16 ``w_k [H, 128]``
  and ``w_proj [H, 64]``, BF16 ``cos``/``sin`` ``[T, 64]``, the two BF16 Hadamard matrices
  ``[128, 128]`` as inputs, the INT8 cache (codes int8 ``[num_blocks, block_size, 128]`` +
  FP16 scales ``[num_blocks, block_size]``).
* ``"fp8"`` (950 / GPU): DeepSeek-V3.2's reference after its indexer-RoPE fix
  (``deepseek-ai/DeepSeek-V3.2-Exp:inference/model.py``, ``Indexer``): ``q_norm`` is the BF16
  RMS-normed ``q_a`` (DeepSeek's ``qr``); ``w_qb`` E4M3 ``[R, 8192]`` and ``w_k`` E4M3 ``[H,
  128]`` with FP32 scales per 128 x 128 block (``[R/128, 64]``, ``[H/128, 1]``); ``w_proj``
  FP32 ``[H, 64]``; FP32 ``cos``/``sin`` (``[T, 32]`` one angle per pair, or ``[T, 64]``); no
  Hadamard matrices (the fast transform); the 132-byte FP8 pages of
  :mod:`tilesim.shared.layouts.index_cache`.

Weights are stored ``[in, out]`` (``y = x @ W``) on both paths; DeepSeek's checkpoint stores the
transpose (``[out, in]``, scales ``[out/128, in/128]``). ``H`` (hidden, 7168) and ``R``
(``q_lora_rank``, 1536) are read from the shapes (multiples of 128 on the FP8 path).

Slots: ``slot_mapping[t]`` is the physical cache row ``block * block_size + offset`` token
``t``'s key goes to; ``-1`` skips the token (vLLM's padding convention); any other value
outside ``[0, num_blocks * block_size)``, a slot given to two tokens or a mapping that is not
``[T]`` is refused: the one slot rule of :mod:`tilesim.shared.layouts.slots`.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.dsa_indexer import INDEX_HEADS
from tilesim.shared.layouts.index_cache import (
    FP8_SCALE_BYTES,
    INDEX_DIM,
    check_fp8_cache,
    check_int8_cache,
)
from tilesim.shared.layouts.slots import NO_SLOT, check_slot_mapping, check_slot_mapping_meta
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.quant import (
    FP8_PROMOTIONS,
    INDEX_FP8_AMAX_FLOOR_MIN,
    INDEX_INT8_AMAX_MAX,
    INDEX_INT8_AMAX_MIN,
)
from tilesim.shared.registry.op_record import Call, OpRecord, Output
from tilesim.shared.validate import (
    INT32_MAX,
    check_array,
    check_bool,
    check_choice,
    check_finite,
    check_float,
    check_int,
    check_trace,
    check_weight_values,
    dtype_of,
    host_array,
    shape_of,
)

PATHS = ("int8", "fp8")
#: the RoPE pairings of the index q/k rope half: ``"halves"`` (pairs ``(j, j + 32)``: pypto-gym
#: and DeepSeek after the fix), ``"interleaved"`` (pairs ``(2j, 2j + 1)``: DeepSeek before it)
PROLOG_ROPE_PAIRINGS = ("halves", "interleaved")
ROPE_DIM = 64  #: the rope part of an index head: its first 64 values
QB_COLS = INDEX_HEADS * INDEX_DIM  #: 8192 columns of ``w_qb``
FP8_BLOCK = 128  #: FP8 weights: one FP32 scale per 128 x 128 block; activations per 128
#: the amax floor of the q/k quantizers when ``amax_floor=None``: INT8 1e-8 (pypto-gym has
#: none: its all-zero vector gives NaN codes), FP8 1e-4 (DeepSeek ``act_quant``)
AMAX_FLOORS = {"int8": 1e-8, "fp8": 1e-4}


# ----------------------------------------------------------------------------- signature
def prolog_inputs(x, q_norm, w_qb, w_k, w_proj, ln_gamma, ln_beta, cos, sin, k_cache,
                  slot_mapping, q_norm_scale=None, w_qb_scale=None, w_k_scale=None,
                  hadamard_q=None, hadamard_k=None, k_scale=None):  # fmt: skip
    """The arrays of ``dsa_indexer_prolog`` (golden and kernel), in order: ``x [T, H]`` BF16;
    ``q_norm [T, R]``; ``w_qb [R, 8192]``; ``w_k [H, 128]``; ``w_proj [H, 64]``; ``ln_gamma``,
    ``ln_beta [128]``; ``cos``, ``sin``; the index-key cache ``k_cache``; int ``slot_mapping
    [T]``; then the path's optional arrays: ``q_norm_scale [T, 1]`` and ``w_qb_scale [8192,
    1]`` (INT8), ``w_qb_scale [R/128, 64]`` and ``w_k_scale [H/128, 1]`` (FP8),
    ``hadamard_q``/``hadamard_k [128, 128]`` (INT8), ``k_scale [num_blocks, block_size]``
    (INT8). Dtypes per path: the module docstring."""


def prolog_keywords(*, path: str = "int8", rope_pairing: str = "halves", eps: float = 1e-6,
                    ue8m0: bool = True, amax_floor: float | None = None,
                    block_size: int = DEEPSEEK_V32.block_size, fp8_promotion: str = "fma",
                    k_tile: int | None = None):  # fmt: skip
    """The switches after the arrays: ``path``; ``rope_pairing`` (``"halves"``, or DeepSeek's
    pre-fix ``"interleaved"``); the LayerNorm ``eps`` (1e-6: DeepSeek and pypto-gym's test);
    ``ue8m0`` (FP8: power-of-two scales, DeepSeek-V3.2's ``scale_fmt``; ``False``: ``amax /
    448``); ``amax_floor`` of the q/k quantizers (``None``: :data:`AMAX_FLOORS`); the cache's
    ``block_size``; ``fp8_promotion`` (FP8 path: the K-block promotion of the ``w_qb`` and
    ``w_k`` linears, :data:`tilesim.shared.quant.FP8_PROMOTIONS`; ``"fma"``: DeepSeek's
    ``fp8_gemm`` as nvcc builds it, one rounding; ``"two_roundings"``; unused on INT8);
    ``k_tile``: the cube K tile of the FP32 linears whose K is the hidden size ``H`` (INT8:
    ``x @ w_k`` and ``x @ w_proj``; FP8: ``x @ w_proj``): ``None`` (the default) sums all of
    ``H`` in one tile, the exact sum rounded once; an int sums each tile of ``k_tile`` rows
    exactly, rounds it once and adds the tile partials in FP32 in ascending K order (the
    device kernel runs 512: ``docs/ops/dsa_indexer_prolog.md``, "Kernel")."""


#: the array arguments, in order
INPUT_NAMES = tuple(inspect.signature(prolog_inputs).parameters)


class Args(NamedTuple):
    """The checked arguments of one call (:func:`check_meta`; after :func:`check_values`
    ``slot_mapping`` is a host int64 copy and ``values`` is True)."""

    ins: object  #: the namespace of :func:`prolog_inputs`' arrays
    path: str
    rope_pairing: str
    eps: float
    ue8m0: bool
    amax_floor: float
    block_size: int
    rows: int  #: T
    hidden: int  #: H
    rank: int  #: R
    num_blocks: int
    slot_mapping: object
    values: bool = False
    fp8_promotion: str = "fma"  #: the FP8 linears' K-block promotion (FP8_PROMOTIONS)
    k_tile: int | None = None  #: the K tile of the FP32 linears over H (None: one tile)


class PrologResult(NamedTuple):
    """What ``dsa_indexer_prolog`` returns, golden and kernel alike (a tuple)."""

    q: object  #: int8 / float8_e4m3fn ``[T, 64, 128]``
    q_scale: object  #: float16 / float32 ``[T, 64]`` (FP8: already folded into ``weights``)
    weights: object  #: float16 ``[T, 64]`` (INT8) / float32 ``[T, 64]`` (FP8, q scale folded)
    k_cache: object  #: the updated copy of ``k_cache``
    #: INT8: the updated copy of ``k_scale``; FP8: a copy of the FP32 scales inside the new
    #: pages (``[num_blocks, block_size]``, to read; the indexer takes ``k_scale=None`` there)
    k_scale: object


class Plan(NamedTuple):
    """The cache rows of a checked call (:func:`host_plan`), int64 ``[T]`` each."""

    written: np.ndarray  #: bool ``[T]``: the token's key is written (slot != -1)
    block: np.ndarray  #: physical block of each written token (-1 where skipped)
    offset: np.ndarray  #: slot inside the block (-1 where skipped)


# ----------------------------------------------------------------------------- meta checks
def _vec(v, name: str, shape: tuple, dtypes, layout: str) -> None:
    check_array(v, name, dtype=dtypes, shape=shape, layout=layout)


def _check_sizes(ins, path: str) -> tuple[int, int, int]:
    """``(T, H, R)`` from ``x`` and ``q_norm``."""
    check_array(ins.x, "x", dtype=BF16, ndim=2, layout="[T, H]")
    t, h = shape_of(ins.x, "x")
    if t == 0 or h == 0:
        raise ValueError(f"x: expected at least one token and one hidden value, got {(t, h)}")
    qdt = np.int8 if path == "int8" else BF16
    check_array(ins.q_norm, "q_norm", dtype=qdt, ndim=2, layout="[T, R]")
    r = shape_of(ins.q_norm, "q_norm")[1]
    _vec(ins.q_norm, "q_norm", (t, None), qdt, "[T, R]")
    if r == 0:
        raise ValueError("q_norm: expected R >= 1 columns (q_lora_rank), got 0")
    if path == "fp8":
        for name, n in (("x", h), ("q_norm", r)):
            if n % FP8_BLOCK:
                raise ValueError(f"{name}: expected a last axis that is a multiple of 128 on "
                                 f"path='fp8' (one activation scale per 128), got {n}")  # fmt: skip
    return t, h, r


def _check_weights(ins, path: str, t: int, h: int, r: int) -> None:
    int8 = path == "int8"
    wdt = np.int8 if int8 else FP8_E4M3
    _vec(ins.w_qb, "w_qb", (r, QB_COLS), wdt, "[R, 64*128]")
    kdt = BF16 if int8 else FP8_E4M3
    _vec(ins.w_k, "w_k", (h, INDEX_DIM), kdt, "[H, 128]")
    _vec(ins.w_proj, "w_proj", (h, INDEX_HEADS), BF16 if int8 else np.float32, "[H, 64]")
    for name in ("ln_gamma", "ln_beta"):
        _vec(getattr(ins, name), name, (INDEX_DIM,), (BF16, np.float32), "[128]")
    if int8:
        _vec(ins.q_norm_scale, "q_norm_scale", (t, 1), np.float32, "[T, 1]")
        _vec(ins.w_qb_scale, "w_qb_scale", (QB_COLS, 1), np.float32, "[64*128, 1]")
        for name in ("hadamard_q", "hadamard_k"):
            _vec(getattr(ins, name), name, (INDEX_DIM, INDEX_DIM), BF16, "[128, 128]")
        return
    _vec(ins.w_qb_scale, "w_qb_scale", (r // FP8_BLOCK, QB_COLS // FP8_BLOCK), np.float32,
         "[R/128, 64]")  # fmt: skip
    _vec(ins.w_k_scale, "w_k_scale", (h // FP8_BLOCK, 1), np.float32, "[H/128, 1]")


def _check_absent(ins, path: str) -> None:
    """The arrays the other path takes must be None (and the path's own ones present)."""
    int8_only = ("q_norm_scale", "hadamard_q", "hadamard_k", "k_scale")
    if path == "int8":
        need, absent = ("q_norm_scale", "w_qb_scale", "k_scale"), ("w_k_scale",)
        need += ("hadamard_q", "hadamard_k")
    else:
        need, absent = ("w_qb_scale", "w_k_scale"), int8_only
    why = {"int8": "the INT8 path (pypto-gym)", "fp8": "the FP8 path (DeepSeek)"}[path]
    for name in need:
        if getattr(ins, name) is None:
            raise TypeError(f"{name}: expected an array for path={path!r} ({why}), got None")
    for name in absent:
        v = getattr(ins, name)
        if v is not None:
            raise ValueError(f"{name}: expected None for path={path!r} ({why} does not take "
                             f"it), got {type(v).__name__}")  # fmt: skip


def _check_rope_tables(ins, t: int, rope_pairing: str) -> None:
    widths = (ROPE_DIM // 2,) if rope_pairing == "interleaved" else (ROPE_DIM // 2, ROPE_DIM)
    want = " or ".join(f"[{t}, {w}]" for w in widths)
    for name in ("cos", "sin"):
        v = getattr(ins, name)
        check_array(v, name, dtype=(BF16, np.float32), ndim=2, layout=want)
        shp = shape_of(v, name)
        if shp[0] != t or shp[1] not in widths:
            raise ValueError(
                f"{name}: expected shape {want} (32: one angle per pair; 64: the halves "
                f"table) for rope_pairing={rope_pairing!r}, got {shp}"
            )


def _check_cache(ins, path: str, block_size: int) -> int:
    if path == "int8":
        return check_int8_cache(ins.k_cache, ins.k_scale, block_size=block_size)[0]
    return check_fp8_cache(ins.k_cache, block_size=block_size)[0]


def _check_floor_range(amax_floor: float, path: str) -> None:
    """The quantizer's own limits on its floor, checked before any work (in FP32, as the
    quantizer reads it): INT8 ``[INDEX_INT8_AMAX_MIN, INDEX_INT8_AMAX_MAX]`` of the
    ``"reciprocal"`` rule the prolog uses, FP8 at least ``INDEX_FP8_AMAX_FLOOR_MIN``."""
    f = np.float32(amax_floor)
    if path == "int8":
        lo, hi = INDEX_INT8_AMAX_MIN["reciprocal"], INDEX_INT8_AMAX_MAX["reciprocal"]
    else:
        lo, hi = INDEX_FP8_AMAX_FLOOR_MIN, float("inf")
    if not np.float32(lo) <= f <= np.float32(hi):
        raise ValueError(f"amax_floor: expected a value in [{lo!r}, {hi!r}] (the {path} "
                         f"quantizer's scale is finite, > 0), got {amax_floor!r}")  # fmt: skip


def check_meta(ins, *, path="int8", rope_pairing="halves", eps=1e-6, ue8m0=True,
               amax_floor=None, block_size=DEEPSEEK_V32.block_size, trace=None,
               fp8_promotion="fma", k_tile=None) -> Args:  # fmt: skip
    """Metadata checks of ``dsa_indexer_prolog`` on the namespace of :func:`prolog_inputs`
    (no value read; works on ``meta`` tensors): the switches, every array's dtype and shape
    for ``path``, the arrays the path does not take are ``None``, ``slot_mapping`` an integer
    ``[T]``. ``ValueError`` / ``TypeError`` naming the argument, expected and actual."""
    check_choice(path, "path", PATHS)
    check_choice(rope_pairing, "rope_pairing", PROLOG_ROPE_PAIRINGS)
    eps = check_float(eps, "eps", positive=True, fp32=True)
    check_bool(ue8m0, "ue8m0")
    check_choice(fp8_promotion, "fp8_promotion", FP8_PROMOTIONS)
    if amax_floor is None:
        amax_floor = AMAX_FLOORS[path]
    amax_floor = check_float(amax_floor, "amax_floor", positive=True, fp32=True)
    _check_floor_range(amax_floor, path)
    block_size = check_int(block_size, "block_size", lo=1, hi=INT32_MAX)
    if k_tile is not None:
        k_tile = check_int(k_tile, "k_tile", lo=1, hi=INT32_MAX)
    check_trace(trace)
    _check_absent(ins, path)
    t, h, r = _check_sizes(ins, path)
    _check_weights(ins, path, t, h, r)
    _check_rope_tables(ins, t, rope_pairing)
    num_blocks = _check_cache(ins, path, block_size)
    check_slot_mapping_meta(ins.slot_mapping, t)
    return Args(ins, path, rope_pairing, eps, bool(ue8m0), amax_floor, block_size, t, h, r,
                num_blocks, ins.slot_mapping, False, fp8_promotion, k_tile)  # fmt: skip


# ----------------------------------------------------------------------------- value checks
def _check_slots(a: Args) -> np.ndarray:
    cap = a.num_blocks * a.block_size
    return check_slot_mapping(a.slot_mapping, tokens=a.rows, rows=cap,
                              rows_of=f"num_blocks * block_size: num_blocks {a.num_blocks}, "
                              f"block_size {a.block_size}")  # fmt: skip


def check_int_values(args: Args) -> Args:
    """The slot checks (the small integer input a device wrapper reads on the host anyway:
    its kernel's cache write reads the slots there; the record's ``int_checks``): entries
    ``-1`` or a row in ``[0, num_blocks * block_size)``, no row twice, ``ValueError`` naming
    ``slot_mapping`` and the first bad index. Returns ``args`` with a host int64
    ``slot_mapping`` (``values`` unchanged: the float inputs are not checked)."""
    return args._replace(slot_mapping=_check_slots(args))


def check_data_values(args: Args) -> Args:
    """The scans of the float inputs on host copies (the record's ``scan_checks``,
    ``ValueError`` naming the array and the first bad index): every float input finite (the
    FP8 weights: no NaN code), FP8 weight scales ``> 0``. The caches are not read (any
    content, NaN included, passes: only the written rows change). Returns ``args``."""
    ins = args.ins
    names = ["x", "q_norm", "w_proj", "ln_gamma", "ln_beta", "cos", "sin"]
    names += ["q_norm_scale", "hadamard_q", "hadamard_k"] if args.path == "int8" else []
    for name in names:
        check_finite(host_array(getattr(ins, name), name), name)
    fp8 = args.path == "fp8"
    check_weight_values(ins.w_qb, "w_qb", ins.w_qb_scale, "w_qb_scale", block=fp8)
    check_weight_values(ins.w_k, "w_k", ins.w_k_scale, "w_k_scale", block=fp8)
    return args


def check_values(args: Args) -> Args:
    """Every value check, before any work (the golden's): :func:`check_int_values` then
    :func:`check_data_values`. Returns ``args`` with a host int64 ``slot_mapping`` and
    ``values=True``."""
    return check_data_values(check_int_values(args))._replace(values=True)


# ----------------------------------------------------------------------------- plan and cost
def _require_values(args: Args, what: str) -> None:
    if not (isinstance(args, Args) and args.values):
        raise TypeError(f"args: {what} needs the Args of check_values, got {type(args).__name__}")


def host_plan(args: Args) -> Plan:
    """The cache rows of a checked call (:func:`check_values` first): per token whether it
    is written, its physical block and its offset in the block (``-1`` for a skipped one)."""
    _require_values(args, "host_plan")
    s = args.slot_mapping
    written = s != NO_SLOT
    block = np.where(written, s // args.block_size, NO_SLOT).astype(np.int64)
    offset = np.where(written, s % args.block_size, NO_SLOT).astype(np.int64)
    return Plan(written, block, offset)


def cost(args: Args) -> dict:
    """``{"flop", "bytes", "written"}`` of one checked call. ``flop``: the matmuls as the
    kernels run them, 2 per multiply-add: ``q_norm @ w_qb`` (``R * 8192``), ``x @ w_k``
    (``H * 128``), ``x @ w_proj`` (``H * 64``), the Hadamard rotations of the 64 q heads and
    the key (INT8: ``65 * 128 * 128`` as matmuls; FP8: the transform's ``65 * 128 * 7`` adds,
    counted 1 each), per token. ``bytes`` (HBM): every input read once (weights, ``x``,
    ``q_norm`` and its scales, the RoPE tables, the Hadamard matrices) + the outputs (q codes,
    q scales, weights) + the written cache rows (``128 +`` scale bytes each); ``written`` =
    the tokens whose key is written."""
    _require_values(args, "cost")
    ins, t, h, r = args.ins, args.rows, args.hidden, args.rank
    per_tok = 2 * (r * QB_COLS + h * INDEX_DIM + h * INDEX_HEADS)
    if args.path == "int8":
        per_tok += 2 * (INDEX_HEADS + 1) * INDEX_DIM * INDEX_DIM
    else:
        per_tok += (INDEX_HEADS + 1) * INDEX_DIM * 7
    read = 0
    for n in INPUT_NAMES:
        v = getattr(ins, n)
        if v is not None and n not in ("k_cache", "k_scale", "slot_mapping"):
            read += int(np.prod(shape_of(v, n))) * dtype_of(v, n).itemsize
    written = int((args.slot_mapping != NO_SLOT).sum())
    sbytes = 2 if args.path == "int8" else FP8_SCALE_BYTES
    out = t * INDEX_HEADS * (INDEX_DIM + 2 * sbytes)  # q codes, q scales, weights
    return {"flop": t * per_tok, "bytes": read + out + written * (INDEX_DIM + sbytes),
            "written": written}  # fmt: skip


# ----------------------------------------------------------------------------- record
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="dsa_indexer_prolog",
    calls=(
        Call("dsa_indexer_prolog", "dsa_indexer_prolog",
             (Output("q", "codes", ("token", "head")), Output("q_scale", "float", ("token",)),
              Output("weights", "float", ("token",)), Output("k_cache", "cache"),
              Output("k_scale", "float")),
             signature=(prolog_inputs, prolog_keywords), judged_by="stages", device=True),
    ),
    cost=cost,
    int_checks=check_int_values,
    scan_checks=check_data_values,
)  # fmt: skip


__all__ = [
    "RECORD",
    "AMAX_FLOORS", "FP8_BLOCK", "INPUT_NAMES", "PATHS", "PROLOG_ROPE_PAIRINGS", "QB_COLS",
    "PrologResult", "check_data_values", "check_int_values",
    "ROPE_DIM", "Args", "Plan", "check_meta", "check_values", "cost", "host_plan", "prolog_inputs",
    "prolog_keywords",
]  # fmt: skip
