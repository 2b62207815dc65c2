"""The input policy of the host helpers (tilesim.shared and reference.numerics), one grid per
class of bad input x public function.

Every bad input raises ``TypeError`` / ``ValueError`` before any work, with the message
``"<argument>: expected <what>, got <actual>"``; torch tensors (BF16, FP8, ``requires_grad``)
give the same bits as NumPy arrays; nothing a caller passes is written. ``compare``'s own grid
lives in tests/reference/test_compare.py.

Oracles: the NumPy call on the same data (torch inputs must match it bit for bit) and byte
copies taken before the call (no mutation). No expected output is taken from the code under
test on the same input kind.
"""

from __future__ import annotations

import math
import re
from functools import partial

import numpy as np
import pytest
from tilesim.reference.util.numerics import bf16_round_trip, ulp_distance
from tilesim.shared import validate
from tilesim.shared.casts import BF16, FP8_E4M3, to_bf16, to_fp8_e4m3, widen_to_fp32
from tilesim.shared.env import parse_int_text
from tilesim.shared.layouts.mla_cache import (
    convert_cache_layout,
    pack_flashmla_rows,
    pack_kv_split,
    pack_pypto_rows,
    pack_rows,
    unpack_flashmla_rows,
    unpack_kv_split,
    unpack_pypto_rows,
    unpack_rows,
)
from tilesim.shared.models import (
    DeepSeekV32Sparse,
    MiniMaxModel,
    MoeDims,
    MsaConfig,
)
from tilesim.shared.quant import (
    dequantize_latent,
    quantize_latent_fp8,
    quantize_latent_fp8_ue8m0,
    quantize_latent_int8,
)
from tilesim.shared.soc import SOCS, SocSpec, get_soc, moe_tiling, moe_vec_tile, msa_device_tile
from tilesim.shared.tiling import (
    MoeTiling,
    MsaTiling,
    SaTileShapeConfig,
    loop_unroll_chunks,
    normalize_unroll,
    parse_unroll_list,
)
from tilesim.shared.weights import convert_minimax_weights, unconvert_minimax_weights

INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------------
# valid inputs of every array-taking function
# ---------------------------------------------------------------------------------------------
def _valid():
    rng = np.random.default_rng(15)
    x32 = rng.uniform(-3, 3, size=(4, 512)).astype(np.float32)
    xb = to_bf16(x32)
    q8, s8 = quantize_latent_fp8(xb)
    rope = to_bf16(rng.uniform(-1, 1, size=(4, 64)).astype(np.float32))
    cache = pack_pypto_rows(q8, rope, s8)
    gu = to_bf16(rng.standard_normal((3, 8, 5)).astype(np.float32))
    dn = to_bf16(rng.standard_normal((3, 5, 4)).astype(np.float32))
    w13, w2 = convert_minimax_weights(gu, dn)
    return dict(x32=x32, xb=xb, q8=q8, s8=s8, rope=rope, cache=cache, gu=gu, dn=dn, w13=w13, w2=w2)


V = _valid()

# label -> (function of the named arrays, {argument: (valid value, name used in messages)},
#           whether the result has a fixed rank per argument)
FUNCS = {
    "to_bf16": (lambda x: to_bf16(x), {"x": (V["x32"], "to_bf16(x)")}),
    "to_fp8_e4m3": (lambda x: to_fp8_e4m3(x), {"x": (V["x32"], "to_fp8_e4m3(x)")}),
    "widen_to_fp32": (lambda x: widen_to_fp32(x), {"x": (V["xb"], "widen_to_fp32(x)")}),
    "bf16_round_trip": (lambda x: bf16_round_trip(x), {"x": (V["x32"], "bf16_round_trip(x)")}),
    "ulp_distance": (
        lambda a, b: ulp_distance(a, b),
        {"a": (V["xb"], "ulp_distance(a)"), "b": (V["xb"][::-1].copy(), "ulp_distance(b)")},
    ),
    "quantize_latent_fp8": (
        lambda x: quantize_latent_fp8(x),
        {"x": (V["xb"], "quantize_latent_fp8(x)")},
    ),
    "quantize_latent_fp8_ue8m0": (
        lambda x: quantize_latent_fp8_ue8m0(x),
        {"x": (V["x32"], "quantize_latent_fp8_ue8m0(x)")},
    ),
    "quantize_latent_int8": (
        lambda x: quantize_latent_int8(x),
        {"x": (V["xb"], "quantize_latent_int8(x)")},
    ),
    "dequantize_latent": (
        lambda q, scales: dequantize_latent(q, scales),
        {"q": (V["q8"], "dequantize_latent(q)"), "scales": (V["s8"], "dequantize_latent(scales)")},
    ),
    **{
        fn.__name__: (
            fn,
            {"nope": (V["q8"], "nope"), "rope": (V["rope"], "rope"), "scales": (V["s8"], "scales")},
        )
        for fn in (pack_pypto_rows, pack_flashmla_rows, pack_kv_split)
    },
    "pack_rows": (
        lambda nope, rope, scales: pack_rows(nope, rope, scales, "flashmla"),
        {"nope": (V["q8"], "nope"), "rope": (V["rope"], "rope"), "scales": (V["s8"], "scales")},
    ),
    "unpack_kv_split": (
        lambda kn_quant, kr, kn_scales: unpack_kv_split(kn_quant, kr, kn_scales),
        {
            "kn_quant": (V["q8"], "nope"),
            "kr": (V["rope"], "rope"),
            "kn_scales": (V["s8"], "scales"),
        },
    ),
    **{
        fn.__name__: (fn, {"cache": (V["cache"], "cache")})
        for fn in (unpack_pypto_rows, unpack_flashmla_rows)
    },
    "unpack_rows": (lambda cache: unpack_rows(cache, "pypto"), {"cache": (V["cache"], "cache")}),
    "convert_cache_layout": (
        lambda cache: convert_cache_layout(cache, src="pypto", dst="flashmla"),
        {"cache": (V["cache"], "cache")},
    ),
    "convert_minimax_weights": (
        lambda gate_up_proj, down_proj: convert_minimax_weights(gate_up_proj, down_proj),
        {"gate_up_proj": (V["gu"], "gate_up_proj"), "down_proj": (V["dn"], "down_proj")},
    ),
    "unconvert_minimax_weights": (
        lambda w13_flat, w2_flat: unconvert_minimax_weights(w13_flat, w2_flat, 3),
        {"w13_flat": (V["w13"], "w13_flat"), "w2_flat": (V["w2"], "w2_flat")},
    ),
}
#: functions whose arguments have a fixed rank (the casts take any shape)
FIXED_RANK = set(FUNCS) - {"to_bf16", "to_fp8_e4m3", "widen_to_fp32", "bf16_round_trip"}

CASES = [(f, arg) for f, (_, args) in FUNCS.items() for arg in args]


def _call(label, **replace):
    fn, args = FUNCS[label]
    kw = {a: v for a, (v, _) in args.items()}
    kw.update(replace)
    return fn(**kw)


def _msg_name(label, arg) -> str:
    return re.escape(FUNCS[label][1][arg][1])


def _bits(r):
    """A byte-exact, comparable image of a result (arrays, tuples, named tuples)."""
    if isinstance(r, np.ndarray):
        return (r.dtype.str, r.dtype.name, r.shape, np.ascontiguousarray(r).tobytes())
    if isinstance(r, tuple):
        return tuple(_bits(x) for x in r)
    raise AssertionError(f"unexpected result type {type(r)}")


def _snapshot(a) -> bytes:
    return np.ascontiguousarray(a).tobytes()


# ---------------------------------------------------------------------------------------------
# class 1: not an array (None, lists, strings, Python numbers, mappings)
# ---------------------------------------------------------------------------------------------
NOT_ARRAYS = [None, [1.0, 2.0], [[1, 2]], (1.0,), "x", 1.5, 3, {"a": 1}]


@pytest.mark.parametrize("bad", NOT_ARRAYS, ids=lambda b: type(b).__name__)
@pytest.mark.parametrize(("label", "arg"), CASES)
def test_not_an_array_is_refused_naming_the_argument(label, arg, bad):
    want = rf"^{_msg_name(label, arg)}: expected a numpy array or a torch tensor, got "
    with pytest.raises(TypeError, match=want + type(bad).__name__):
        _call(label, **{arg: bad})


# ---------------------------------------------------------------------------------------------
# class 2: complex, string, object and structured dtypes
# ---------------------------------------------------------------------------------------------
def _odd_dtypes(shape):
    return {
        "complex64": np.zeros(shape, np.complex64),
        "complex128": np.ones(shape, np.complex128) * 1j,
        "str": np.full(shape, "a"),
        "object": np.full(shape, 1.0, dtype=object),
        "structured": np.zeros(shape, dtype=[("v", np.float32)]),
        "datetime": np.zeros(shape, dtype="datetime64[s]"),
    }


@pytest.mark.parametrize("kind", list(_odd_dtypes((1,))))
@pytest.mark.parametrize(("label", "arg"), CASES)
def test_non_real_dtypes_are_refused_naming_the_argument(label, arg, kind):
    shape = FUNCS[label][1][arg][0].shape
    bad = _odd_dtypes(shape)[kind]
    dt = re.escape(str(bad.dtype))
    with pytest.raises(TypeError, match=rf"^{_msg_name(label, arg)}: expected .*got .*{dt}"):
        _call(label, **{arg: bad})


@pytest.mark.torch
@pytest.mark.parametrize(("label", "arg"), CASES)
def test_complex_tensors_are_refused_naming_the_argument(label, arg):
    import torch

    shape = FUNCS[label][1][arg][0].shape
    bad = torch.zeros(shape, dtype=torch.complex64)
    with pytest.raises(TypeError, match=rf"^{_msg_name(label, arg)}: expected .*complex64"):
        _call(label, **{arg: bad})


# ---------------------------------------------------------------------------------------------
# class 3: wrong rank (functions with a fixed layout)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["extra_axis", "flat", "scalar"])
@pytest.mark.parametrize(
    ("label", "arg"), [c for c in CASES if c[0] in FIXED_RANK and c != ("ulp_distance", "a")]
)
def test_wrong_rank_is_refused_naming_the_argument(label, arg, how):
    good = FUNCS[label][1][arg][0]
    bad = {"extra_axis": good[None], "flat": good.reshape(-1), "scalar": good.reshape(-1)[0:1][0]}
    bad = bad[how]
    if how == "scalar":
        bad = np.asarray(bad)  # a 0-d array (NumPy scalars are taken as 0-d arrays)
    with pytest.raises(ValueError, match=rf"^{_msg_name(label, arg)}: expected "):
        _call(label, **{arg: bad})


# ---------------------------------------------------------------------------------------------
# class 4: torch tensors (BF16 / FP8 / requires_grad / non-contiguous) give the NumPy bits
# ---------------------------------------------------------------------------------------------
def _as_torch(a, *, grad: bool, strided: bool = False):
    import torch
    from tilesim.shared.interop import to_torch

    t = to_torch(a.copy())
    if strided and t.ndim >= 1:
        # same values, non-contiguous memory: a transposed copy transposed back
        t = t.t().contiguous().t() if t.ndim == 2 else t
    if grad and t.dtype in (torch.bfloat16, torch.float32, torch.float16, torch.float64):
        t = torch.nn.Parameter(t, requires_grad=True)
    return t


@pytest.mark.torch
@pytest.mark.parametrize("grad", [False, True], ids=["plain", "requires_grad"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("label", list(FUNCS))
def test_torch_inputs_give_the_numpy_bits_and_are_not_written(label, grad, strided):
    _, args = FUNCS[label]
    want = _bits(_call(label))  # oracle: the same data as NumPy arrays
    tens = {a: _as_torch(v, grad=grad, strided=strided) for a, (v, _) in args.items()}
    from tilesim.shared.interop import to_numpy

    before = {a: _snapshot(to_numpy(t)) for a, t in tens.items()}
    got = _call(label, **tens)
    assert _bits(got) == want
    for a, t in tens.items():
        assert _snapshot(to_numpy(t)) == before[a], f"{label} wrote into {a}"
        if grad and t.requires_grad:
            assert t.grad is None


@pytest.mark.torch
@pytest.mark.parametrize(("label", "arg"), CASES)
def test_meta_tensors_are_refused_naming_the_argument(label, arg):
    import torch
    from tilesim.shared.interop import numpy_dtype_to_torch

    good = FUNCS[label][1][arg][0]
    bad = torch.empty(good.shape, dtype=numpy_dtype_to_torch(good.dtype), device="meta")
    with pytest.raises(ValueError, match=rf"^{_msg_name(label, arg)}: expected a tensor holding"):
        _call(label, **{arg: bad})


@pytest.mark.torch
@pytest.mark.parametrize("label", ["to_bf16", "quantize_latent_int8", "bf16_round_trip"])
def test_sparse_tensors_are_refused_naming_the_argument(label):
    import torch

    bad = torch.from_numpy(V["x32"].copy()).to_sparse()
    with pytest.raises(TypeError, match=rf"^{_msg_name(label, 'x')}: expected a dense"):
        _call(label, x=bad)


# ---------------------------------------------------------------------------------------------
# class 5: inputs are never written (NumPy; byte copies; read-only inputs work)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", list(FUNCS))
def test_numpy_inputs_are_not_written_and_may_be_read_only(label):
    _, args = FUNCS[label]
    want = _bits(_call(label))
    frozen = {}
    for a, (v, _) in args.items():
        c = v.copy()
        c.flags.writeable = False  # any write would raise
        frozen[a] = c
    before = {a: _snapshot(c) for a, c in frozen.items()}
    assert _bits(_call(label, **frozen)) == want
    assert {a: _snapshot(c) for a, c in frozen.items()} == before


# ---------------------------------------------------------------------------------------------
# class 6: flags are bools only
# ---------------------------------------------------------------------------------------------
NOT_BOOLS = ["yes", "False", "", 1, 0, 1.0, None, np.array(True), [True]]
FLAGS = {
    "to_fp8_e4m3.saturate": (lambda v: to_fp8_e4m3(V["x32"], saturate=v), "saturate"),
    "MiniMaxModel.norm_topk_prob": (
        lambda v: _minimax(norm_topk_prob=v),
        "MiniMaxModel.norm_topk_prob",
    ),
    "SocSpec.fp8": (lambda v: _soc(fp8=v), "SocSpec.fp8"),
}


def _minimax(**change):
    from dataclasses import asdict

    from tilesim.shared.models import MINIMAX_M27

    kw = {k: v for k, v in asdict(MINIMAX_M27).items() if k != "msa"}
    return MiniMaxModel(**{**kw, **change})


def _soc(**change):
    from dataclasses import asdict

    return SocSpec(**{**asdict(SOCS["910b"]), **change})


@pytest.mark.parametrize("bad", NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("flag", list(FLAGS))
def test_flags_refuse_truthy_non_bools(flag, bad):
    call, name = FLAGS[flag]
    with pytest.raises(TypeError, match=rf"^{re.escape(name)}: expected a bool, got "):
        call(bad)


@pytest.mark.parametrize("flag", list(FLAGS))
def test_flags_accept_bools(flag):
    call, _ = FLAGS[flag]
    for v in (True, False, np.bool_(True)):
        call(v)


# ---------------------------------------------------------------------------------------------
# class 7: string choices (type-strict, case-sensitive where the API is)
# ---------------------------------------------------------------------------------------------
CHOICES = {
    "to_bf16.nan": (lambda v: to_bf16(V["x32"], nan=v), "nan"),
    "pack_rows.layout": (lambda v: pack_rows(V["q8"], V["rope"], V["s8"], v), "layout"),
    "unpack_rows.layout": (lambda v: unpack_rows(V["cache"], v), "layout"),
    "convert_cache_layout.src": (
        lambda v: convert_cache_layout(V["cache"], src=v, dst="pypto"),
        "src",
    ),
    "convert_cache_layout.dst": (
        lambda v: convert_cache_layout(V["cache"], src="pypto", dst=v),
        "dst",
    ),
    "MoeTiling.default": (lambda v: MoeTiling.default(v), "activation"),
    "MoeTiling.from_env": (lambda v: MoeTiling.from_env(v, env={}), "activation"),
    "moe_vec_tile": (lambda v: moe_vec_tile("910b", v), "activation"),
    "moe_tiling": (lambda v: moe_tiling(v, "910b", env={}), "activation"),
    "SaTileShapeConfig.preset": (lambda v: SaTileShapeConfig.preset(v), "preset"),
    "SaTileShapeConfig.from_env": (lambda v: SaTileShapeConfig.from_env(v, env={}), "preset"),
    "SaTileShapeConfig.softmax": (
        lambda v: SaTileShapeConfig(softmax=v),
        "SaTileShapeConfig.softmax",
    ),
    "MsaTiling.dtype": (lambda v: MsaTiling(dtype=v), "MsaTiling.dtype"),
    "MoeDims.activation": (lambda v: MoeDims(2, 16, 8, activation=v), "MoeDims.activation"),
    "MoeDims.gate_up_layout": (
        lambda v: MoeDims(2, 16, 8, gate_up_layout=v),
        "MoeDims.gate_up_layout",
    ),
    "MiniMaxModel.activation": (lambda v: _minimax(activation=v), "MiniMaxModel.activation"),
    "msa_device_tile.var": (lambda v: msa_device_tile(v, "910b", env={}), "var"),
    "SocSpec.cube_bound_us.dtype": (lambda v: SOCS["950"].cube_bound_us(1.0, v), "dtype"),
}
NOT_CHOICES = ["", "nope", "KEEP", None, 1, b"pypto", ("pypto",)]


@pytest.mark.parametrize("bad", NOT_CHOICES, ids=repr)
@pytest.mark.parametrize("choice", list(CHOICES))
def test_choices_refuse_other_values_naming_the_argument(choice, bad):
    call, name = CHOICES[choice]
    want = rf"^{re.escape(name)}: expected (one of .*|'decode' or 'prefill'), got "
    with pytest.raises(ValueError, match=want):
        call(bad)


# ---------------------------------------------------------------------------------------------
# class 8: integers (type, range checked as Python ints, unsigned / overflowing values)
# ---------------------------------------------------------------------------------------------
# label -> (call, name in the message, lo, hi)
def _moe_dims(field, value, **other):
    base = dict(num_experts=2, hidden_size=16, intermediate_size=8)
    return MoeDims(**{**base, **other, field: value})


INTS = {
    **{
        f"MoeDims.{f}": (partial(_moe_dims, f), f"MoeDims.{f}", 1, INT32_MAX)
        for f in ("num_experts", "hidden_size", "intermediate_size")
    },
    "MoeTiling.mm1_k": (lambda v: MoeTiling(mm1_k=v), "MoeTiling.mm1_k", 1, INT32_MAX),
    "MoeTiling.l1_reuse": (lambda v: MoeTiling(l1_reuse=v), "MoeTiling.l1_reuse", 1, INT32_MAX),
    "MsaTiling.ntile": (lambda v: MsaTiling(ntile=v), "MsaTiling.ntile", 1, INT32_MAX),
    "MsaTiling.max_n": (lambda v: MsaTiling(max_n=v), "MsaTiling.max_n", 1, INT32_MAX),
    "SaTileShapeConfig.g_tile": (
        lambda v: SaTileShapeConfig(g_tile=v),
        "SaTileShapeConfig.g_tile",
        1,
        INT32_MAX,
    ),  # noqa: E501
    "SaTileShapeConfig.c1_tile[2]": (
        lambda v: SaTileShapeConfig(c1_tile=(128, 128, v, 256, 128, 128)),
        "SaTileShapeConfig.c1_tile[2]",
        1,
        INT32_MAX,
    ),
    "loop_unroll_chunks.count": (lambda v: loop_unroll_chunks(v, (64, 1)), "count", 0, INT32_MAX),
    "normalize_unroll[1]": (lambda v: normalize_unroll((4, v)), "unroll factor[1]", 1, INT32_MAX),
    "MoeTiling.unroll[0]": (lambda v: MoeTiling(unroll=(v,)), "unroll factor[0]", 1, INT32_MAX),
    "unconvert_minimax_weights.num_experts": (
        lambda v: unconvert_minimax_weights(V["w13"], V["w2"], v),
        "num_experts",
        1,
        None,
    ),
    "SocSpec.aic_cores": (lambda v: _soc(aic_cores=v), "SocSpec.aic_cores", 1, None),
    "MiniMaxModel.top_k": (lambda v: _minimax(top_k=v), "MiniMaxModel.top_k", 1, INT32_MAX),
    "MsaConfig.block_size": (
        lambda v: MsaConfig(block_size=v),
        "MsaConfig.block_size",
        1,
        INT32_MAX,
    ),  # noqa: E501
    "DeepSeekV32Sparse.topk": (
        lambda v: DeepSeekV32Sparse(topk=v),
        "DeepSeekV32Sparse.topk",
        1,
        INT32_MAX,
    ),  # noqa: E501
}
BAD_INT_TYPES = [1.0, 16.0, True, False, "16", None, np.float32(16), 16 + 0j, [16]]


@pytest.mark.parametrize("bad", BAD_INT_TYPES, ids=repr)
@pytest.mark.parametrize("target", list(INTS))
def test_integers_refuse_other_types(target, bad):
    call, name, _, _ = INTS[target]
    with pytest.raises(TypeError, match=rf"^{re.escape(name)}: expected an int, got "):
        call(bad)


def _out_of_range(lo, hi):
    vals = [lo - 1, lo - 2**40, -(2**63) - 1]
    if hi is not None:
        vals += [hi + 1, 2**64, np.uint64(2**64 - 1), np.int64(2**63 - 1), 10**30]
    return vals


@pytest.mark.parametrize("target", list(INTS))
def test_integers_are_range_checked_as_python_ints(target):
    call, name, lo, hi = INTS[target]
    for bad in _out_of_range(lo, hi):
        with pytest.raises(ValueError, match=rf"^{re.escape(name)}: expected an int in \["):
            call(bad)


def test_integer_fields_are_stored_as_python_ints():
    t = MoeTiling(mm1_k=np.int64(256), unroll=np.array([4, 2], np.int32))
    assert type(t.mm1_k) is int and t.mm1_k == 256 and t.unroll == (4, 2, 1)
    assert all(type(u) is int for u in t.unroll)
    d = MoeDims(np.int32(2), np.uint16(16), np.int64(8))
    assert (d.num_experts, d.hidden_size, d.intermediate_size) == (2, 16, 8)
    assert all(type(v) is int for v in (d.num_experts, d.hidden_size, d.intermediate_size))
    assert MoeDims(np.int32(2), 16, 8) == MoeDims(2, 16, 8)


def test_loop_unroll_chunks_bounds_the_work_instead_of_running_out_of_memory():
    with pytest.raises(ValueError, match=r"^count: expected at most 1048576 chunks"):
        loop_unroll_chunks(INT32_MAX, (1,))
    # the largest accepted list: 2**20 chunks of 1
    assert len(loop_unroll_chunks(2**20, (1,))) == 2**20


def test_structural_integer_relations_name_the_field():
    with pytest.raises(ValueError, match=r"^MsaConfig.num_q_heads: expected a multiple of"):
        MsaConfig(num_q_heads=63)
    with pytest.raises(ValueError, match=r"^DeepSeekV32Sparse.kv_lora_rank: expected a multiple"):
        DeepSeekV32Sparse(kv_lora_rank=500)
    with pytest.raises(ValueError, match=r"^MiniMaxModel.top_k: expected at most num_experts"):
        _minimax(top_k=1000)
    with pytest.raises(TypeError, match=r"^SaTileShapeConfig.v1_tile: expected a tuple or list"):
        SaTileShapeConfig(v1_tile=64)
    with pytest.raises(TypeError, match=r"^unroll factor: expected a tuple or list of ints"):
        MoeTiling(unroll="1,2")


# ---------------------------------------------------------------------------------------------
# class 9: real scalars (NaN, inf, overflow, FP32 range, wrong types)
# ---------------------------------------------------------------------------------------------
FP32_OVER = 3.5e38  # finite in float64, inf in FP32
FP32_UNDER = 1e-46  # non-zero in float64, 0 in FP32
# label -> (call, name, values refused with ValueError)
FLOATS = {
    "MoeTiling.swiglu_alpha": (
        lambda v: MoeTiling(swiglu_alpha=v),
        "MoeTiling.swiglu_alpha",
        [math.nan, math.inf, -math.inf, FP32_OVER, FP32_UNDER, 0.0, -1.0, 10**400],
    ),
    "MoeTiling.swiglu_limit": (
        lambda v: MoeTiling(swiglu_limit=v),
        "MoeTiling.swiglu_limit",
        [math.nan, math.inf, FP32_OVER, 0.0],
    ),
    **{
        f"MoeDims.{f}": (
            partial(_moe_dims, f),
            f"MoeDims.{f}",
            [math.nan, math.inf, -math.inf, FP32_OVER, -FP32_OVER, FP32_UNDER, 10**400],
        )
        for f in ("alpha", "limit", "beta")
    },
    "MsaConfig.decode_mask_neg": (
        lambda v: MsaConfig(decode_mask_neg=v),
        "MsaConfig.decode_mask_neg",
        [math.nan, -math.inf, -FP32_OVER, 1.0, 0.0],
    ),
    "DeepSeekV32Sparse.fp8_max": (
        lambda v: DeepSeekV32Sparse(fp8_max=v),
        "DeepSeekV32Sparse.fp8_max",
        [math.nan, math.inf, 0.0, -448.0],
    ),
    "SocSpec.hbm_bound_us": (
        lambda v: SOCS["910b"].hbm_bound_us(v),
        "nbytes",
        [math.nan, math.inf, -1.0, 10**400],
    ),
    "SocSpec.cube_bound_us": (
        lambda v: SOCS["910b"].cube_bound_us(v),
        "flops",
        [math.nan, -math.inf, -2.0],
    ),
    "SocSpec.cube_ghz": (lambda v: _soc(cube_ghz=v), "SocSpec.cube_ghz", [math.nan, 0.0, -1.8]),
}
BAD_FLOAT_TYPES = ["1.5", None, True, np.bool_(False), 1j, [1.5], np.array([1.5])]


@pytest.mark.parametrize("target", list(FLOATS))
def test_real_scalars_refuse_nan_inf_and_overflow(target):
    call, name, bad_values = FLOATS[target]
    for bad in bad_values:
        with pytest.raises(ValueError, match=rf"^{re.escape(name)}: expected "):
            call(bad)


@pytest.mark.parametrize("bad", BAD_FLOAT_TYPES, ids=repr)
@pytest.mark.parametrize("target", list(FLOATS))
def test_real_scalars_refuse_other_types(target, bad):
    call, name, _ = FLOATS[target]
    with pytest.raises(TypeError, match=rf"^{re.escape(name)}: expected a real number, got "):
        call(bad)


def test_fp32_range_boundaries_of_check_float():
    fmax = float(np.finfo(np.float32).max)
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    # accepted: the largest finite FP32, values that round to it, the smallest subnormal and
    # values that round up to it
    for ok in (fmax, -fmax, 2.0**128 - 2.0**104, tiny, tiny * 0.5000001, 0.0):
        assert validate.check_float(ok, "s", fp32=True) == ok
    # refused: the FP32 overflow midpoint (rounds to inf, RNE) and half the smallest subnormal
    # (rounds to 0)
    for bad in (2.0**128 - 2.0**103, tiny * 0.5, -(2.0**128)):
        with pytest.raises(ValueError, match="^s: expected a value FP32 can hold"):
            validate.check_float(bad, "s", fp32=True)
    # independent check of the two boundaries with NumPy's own rounding
    with np.errstate(over="ignore"):
        edge = np.array([2.0**128 - 2.0**103, 2.0**128 - 2.0**104]).astype(np.float32)
    assert np.isinf(edge[0]) and np.isfinite(edge[1])
    assert np.float32(tiny * 0.5) == 0 and np.float32(tiny * 0.5000001) == np.float32(tiny)


# ---------------------------------------------------------------------------------------------
# class 10: environment integers / floats / choices, and the env mapping itself
# ---------------------------------------------------------------------------------------------
def _tile_of(var):
    return lambda env: msa_device_tile(var, "910b", env)


# variable -> (reader of env -> the parsed value, a valid value that is a multiple of the
# variable's required multiple)
ENV_INTS = {
    "PYPTO_MM1_K": (lambda env: MoeTiling.from_env(env=env).mm1_k, 256),
    "PYPTO_VEC_TILE": (lambda env: moe_tiling("silu", "950", env).vec_tile, 256),
    "PYPTO_CUBE_NBUFFER": (lambda env: MoeTiling.from_env(env=env).cube_nbuffer, 3),
    "MSA_NTILE": (lambda env: MsaTiling.from_env(env).ntile, 256),
    "MSA_NQ_TILE": (lambda env: MsaTiling.from_env(env).nq_tile, 64),
    "MSA_MAX_N": (lambda env: MsaTiling.from_env(env).max_n, 1024),
    "TILESIM_SA_G_TILE": (lambda env: SaTileShapeConfig.from_env(env=env).g_tile, 64),
    "TILESIM_SA_S_KV_TILE": (lambda env: SaTileShapeConfig.from_env(env=env).s_kv_tile, 1024),
    "MSA_INDEXER_KTILE": (lambda env: _tile_of("MSA_INDEXER_KTILE")(env), 256),
    "MSA_GATHER_ROWS": (lambda env: _tile_of("MSA_GATHER_ROWS")(env), 64),
    "MSA_VEC_ROWS": (lambda env: _tile_of("MSA_VEC_ROWS")(env), 16),
}
BAD_INT_TEXT = [
    "1_024", "١٢٨", "１２８", "+128", "-128", "12 8", "\u00a0128", "128\u2003", "0x80", "1e3",
    "128.0", "2147483648", "9" * 30, "128\x00", "0", "٠", "abc", "12,8",
]  # fmt: skip


@pytest.mark.parametrize("raw", BAD_INT_TEXT, ids=ascii)
@pytest.mark.parametrize("var", list(ENV_INTS))
def test_env_integers_refuse_signs_underscores_non_ascii_and_blanks(var, raw):
    read, _ = ENV_INTS[var]
    with pytest.raises(ValueError, match=rf"^{var}: expected a positive"):
        read({var: raw})


@pytest.mark.parametrize("var", list(ENV_INTS))
def test_env_integers_accept_ascii_digits_with_surrounding_ascii_blanks(var):
    read, good = ENV_INTS[var]
    for raw in (str(good), f" {good} ", f"\t{good}\n", f"0{good}"):
        assert read({var: raw}) == good
    default = read({})
    assert read({var: "   "}) == default  # all blank = unset


@pytest.mark.parametrize("bad", [128, 128.0, b"128", None.__class__], ids=repr)
@pytest.mark.parametrize("var", list(ENV_INTS))
def test_env_values_must_be_strings(var, bad):
    read, _ = ENV_INTS[var]
    with pytest.raises(TypeError, match=rf"^{var}: expected a str, got "):
        read({var: bad})


@pytest.mark.parametrize(
    "bad",
    ["MSA_NTILE=256", [("MSA_NTILE", "256")], 3, object()],
    ids=["str", "pairs", "int", "object"],  # stable ids: pytest-xdist workers must agree
)
@pytest.mark.parametrize(
    "read",
    [
        lambda env: MoeTiling.from_env(env=env),
        lambda env: MsaTiling.from_env(env),
        lambda env: SaTileShapeConfig.from_env(env=env),
        lambda env: msa_device_tile("MSA_VEC_ROWS", "910b", env),
        lambda env: moe_tiling("silu", "910b", env),
    ],
    ids=["MoeTiling", "MsaTiling", "SaTileShapeConfig", "msa_device_tile", "moe_tiling"],
)
def test_env_must_be_a_mapping(read, bad):
    with pytest.raises(TypeError, match=r"^env: expected a mapping of str to str, or None, got "):
        read(bad)


BAD_FLOAT_TEXT = [
    "1_0", "١.٥", "１.５", "nan", "NaN", "inf", "-inf", "infinity", "1e400", "3.5e38", "1e-50",
    "0x1p3", "1.7f", "1,7", "1.7.1", "--1", "0", "-1.702", "1 .7", "\u00a01.7",
]  # fmt: skip


@pytest.mark.parametrize("raw", BAD_FLOAT_TEXT, ids=ascii)
@pytest.mark.parametrize("var", ["PYPTO_SWIGLU_ALPHA", "PYPTO_SWIGLU_LIMIT"])
def test_env_floats_refuse_non_decimal_non_finite_and_fp32_overflow(var, raw):
    with pytest.raises(ValueError, match=rf"^{var}: expected a finite positive number"):
        MoeTiling.from_env("swigluoai", env={var: raw})


def test_env_floats_accept_ascii_decimals():
    for raw, want in ((" 1.5 ", 1.5), ("2e0", 2.0), (".5", 0.5), ("7.", 7.0), ("+3", 3.0)):
        assert MoeTiling.from_env(env={"PYPTO_SWIGLU_LIMIT": raw}).swiglu_limit == want


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("MSA_DTYPE", "fp32\u00a0"),
        ("MSA_DTYPE", "ｆｐ32"),
        ("MSA_DTYPE", "fp 32"),
        ("MSA_DTYPE", "fp8"),
        ("TILESIM_SA_PRESET", "decode\u2003"),
        ("TILESIM_SA_PRESET", "huge"),
    ],
    ids=ascii,
)
def test_env_choices_refuse_odd_text(var, raw):
    read = MsaTiling.from_env if var == "MSA_DTYPE" else SaTileShapeConfig.from_env
    with pytest.raises(ValueError, match=rf"^{var}: expected one of "):
        read(env={var: raw})


def test_env_choices_accept_ascii_case_and_blanks():
    assert MsaTiling.from_env({"MSA_DTYPE": " BF16\n"}).dtype == "bf16"
    assert SaTileShapeConfig.from_env(env={"TILESIM_SA_PRESET": "Prefill"}).softmax == "per_tile"


@pytest.mark.parametrize(
    "raw", ["1,,2", "1,2,", ",", "1_2", "١,٢", "+1,2", "1, 2 ,\u00a04", "2147483648", "2;4"],
    ids=ascii,
)  # fmt: skip
def test_env_unroll_lists_refuse_odd_items(raw):
    with pytest.raises(ValueError, match=r"^PYPTO_UNROLL: expected comma-separated positive"):
        MoeTiling.from_env(env={"PYPTO_UNROLL": raw})


def test_env_unroll_lists_accept_blanks_around_items():
    assert MoeTiling.from_env(env={"PYPTO_UNROLL": " 1, 2 ,4\t"}).unroll == (4, 2, 1)
    with pytest.raises(TypeError, match="^PYPTO_UNROLL: expected a str"):
        parse_unroll_list(124)


def test_get_soc_names():
    assert get_soc(" 950DT ") is SOCS["950dt"]
    for bad in ("950\u00a0", "９５０", "", "910"):
        with pytest.raises(ValueError, match="^soc: expected one of"):
            get_soc(bad)
    for bad in (None, 950, b"950"):
        with pytest.raises(TypeError, match="^soc: expected a str"):
            get_soc(bad)


# ---------------------------------------------------------------------------------------------
# class 11: empty inputs are valid where the layout allows them, and named where it does not
# ---------------------------------------------------------------------------------------------
def test_empty_inputs():
    e32 = np.zeros((0, 512), np.float32)
    for f in (to_bf16, to_fp8_e4m3, bf16_round_trip):
        assert f(np.zeros(0, np.float32)).shape == (0,)
    for quantize in (quantize_latent_fp8, quantize_latent_fp8_ue8m0, quantize_latent_int8):
        q, s = quantize(e32)
        assert q.shape == (0, 512) and s.shape == (0, 4)
        with pytest.raises(ValueError, match=rf"^{quantize.__name__}\(x\): expected shape"):
            quantize(np.zeros((3, 0), np.float32))
    q, s = quantize_latent_fp8(e32)
    assert dequantize_latent(q, s).shape == (0, 512)
    cache = pack_pypto_rows(q, np.zeros((0, 64), BF16), s)
    assert cache.shape == (0, 656) and unpack_pypto_rows(cache).nope.shape == (0, 512)
    w13, w2 = convert_minimax_weights(np.zeros((0, 8, 5), BF16), np.zeros((0, 5, 4), BF16))
    assert w13.shape == (0, 8) and w2.shape == (0, 5)
    assert ulp_distance(np.zeros(0, BF16), np.zeros(0, BF16)).shape == (0,)


# ---------------------------------------------------------------------------------------------
# the policy helpers themselves
# ---------------------------------------------------------------------------------------------
def test_host_data_scalars_switch():
    assert validate.host_data(np.float32(1.5), "x", scalars=True).shape == ()
    with pytest.raises(
        TypeError, match="^x: expected a numpy array or a torch tensor, got float32"
    ):
        validate.host_data(np.float32(1.5), "x")
    a = np.ones(3, np.float32)
    assert validate.host_data(a, "x") is a  # no copy for NumPy input


def test_check_real_and_check_str():
    assert validate.check_real(np.zeros(1, BF16), "a") == BF16
    assert validate.check_real(np.zeros(1, FP8_E4M3), "a") == FP8_E4M3
    assert validate.check_real(np.zeros(1, bool), "a") == np.bool_
    with pytest.raises(
        TypeError, match=r"^a: expected a real \(float or integer\) dtype, got bool"
    ):
        validate.check_real(np.zeros(1, bool), "a", bool_ok=False)
    with pytest.raises(TypeError, match="^n: expected a str, got int 3"):
        validate.check_str(3, "n")
    with pytest.raises(ValueError, match="^n: expected a non-empty str"):
        validate.check_str("", "n")


def test_parse_int_text_directly():
    assert parse_int_text(" 42\n", "N") == 42
    assert parse_int_text("0", "N", lo=0) == 0
    assert parse_int_text(str(INT32_MAX), "N") == INT32_MAX
    with pytest.raises(ValueError, match=r"^N: expected an integer >= 0 \(ASCII digits\)"):
        parse_int_text("-0", "N", lo=0)
    with pytest.raises(ValueError, match="^N: expected a positive multiple of 8, got 12"):
        parse_int_text("12", "N", multiple_of=8)
