"""DeepSeek-V3.2 MLA prolog kernel (INT8 path) on PyPTO's CPU simulator, 910B and 950.

What is asserted:

1. every output -- ``query_nope``, ``query_rope``, ``q_norm``, ``q_norm_scale`` and the three
   cache tensors -- bit for bit the golden :func:`tilesim.reference.mla_prolog` with the same
   switches (the record's budget: ``bit_exact`` 1.0), on pypto-gym's active shape (b4 s2,
   ``T = 8``) with two of its tokens turned into padding (slot ``-1``);
2. the cache writes, from the inputs alone (independent of the golden): every cache row no
   live token names -- the builder poisons them with NaN / INT8 -128, and the two padding
   tokens' would-be rows hold live data the kernel must not touch -- keeps its bytes, and each
   live token's row differs from what was there (the kernel wrote it);
3. NumPy in -> NumPy out, the caller's arrays unchanged; the cost-model row of the call
   (``T = 8``, b4 s2 -- the CI cost figures of ``tests/device/cost_figures.json``) against the
   yardstick; ``slow``: the cost rows at ``T = 128`` (b64 s2, cost only) on both SoCs, and
   bit-exactness for a padded chunk (``T = 6``) and for ``rms_form="gym_kernel"``.

The bad-input tests run without pypto: the wrapper's messages are the golden's (the same
contract, :mod:`tilesim.shared.mla_prolog`), checked before any kernel is built.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from tilesim.shared.registry.ops import record

BUDGETS = record("mla_prolog").budgets
CASE = "mla_prolog_int8_b4_s2"
#: tokens of the case turned into padding (slot -1): their queries are computed, their rows
#: are not written
PAD_TOKENS = (2, 5)


#: the FP8 path's case (built here from the case builder's parameters): DeepSeek's arithmetic
#: -- FP8 E4M3 weights with ``amax / 448`` block scales, YaRN ``cos``/``sin`` ``[T, 32]``,
#: UE8M0 latent quant -- at b4 s2 (``T = 8``) in the ``kv_split`` cache form, every cache row
#: NaN-poisoned by the builder
FP8_BUILD = {"path": "fp8", "cache_layout": "kv_split", "seq_lens": (1024, 5000, 2048, 130)}
#: the golden's switch the FP8 kernel is judged with: its K-block promotion rounds the
#: scaled partial, then the sum (docs/ops/mla_prolog.md, "Kernel")
FP8_SWITCHES = {"fp8_promotion": "two_roundings"}


def _case(path: str = "int8", **build):
    from tilesim.reference import mla_prolog_make_case

    if path == "int8":
        case, extra = mla_prolog_make_case(CASE, **build), {}
    else:
        case, extra = mla_prolog_make_case(None, **{**FP8_BUILD, **build}), FP8_SWITCHES
    ins = dict(case["inputs"])
    live_rows = np.asarray(ins["slot_mapping"]).copy()
    slots = live_rows.copy()
    slots[list(PAD_TOKENS)] = -1
    ins["slot_mapping"] = slots
    return ins, {**case["params"], **extra}, live_rows


def _bytes(a) -> np.ndarray:
    if a is None:  # the FP8 path's q_norm_scale
        return np.zeros(0, np.uint8)
    a = np.ascontiguousarray(np.asarray(a))
    return a.view(np.uint8).reshape(a.shape[0], -1) if a.ndim else a.view(np.uint8)


def _rows(a, width: int) -> np.ndarray:
    """A cache's bytes as ``[rows, width * itemsize]``."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.reshape(-1, width).view(np.uint8)


def run_case(soc: str = "910b", path: str = "int8") -> dict:
    """In the simulator child: the kernel and the golden on the padded case of ``path``."""
    from tilesim.device import mla_prolog

    golden = importlib.import_module("tilesim.reference.mla_prolog").mla_prolog
    ins, prm, would_be = _case(path)
    before = {k: np.array(v, copy=True) for k, v in ins.items() if v is not None}
    out, us = mla_prolog(**ins, **prm, backend="sim", soc=soc)
    kept = all(np.array_equal(_bytes(before[k]), _bytes(ins[k])) for k in before)
    ref = golden(**ins, **prm)
    exact = {f: (getattr(ref, f) is None) == (getattr(out, f) is None)
             and np.array_equal(_bytes(getattr(ref, f)), _bytes(getattr(out, f)))
             for f in ref._fields}  # fmt: skip
    numpy_out = all(isinstance(getattr(out, f), np.ndarray) for f in out._fields
                    if getattr(ref, f) is not None)  # fmt: skip
    slots = ins["slot_mapping"]
    live = slots[slots >= 0]
    untouched, written = True, True
    for name, width in (("kv_cache", 512), ("kr_cache", 64), ("kv_scale_cache", 4)):
        old, new = _rows(ins[name], width), _rows(getattr(out, name), width)
        other = np.ones(old.shape[0], bool)
        other[live] = False
        untouched &= bool(np.array_equal(old[other], new[other]))
        written &= bool((old[live] != new[live]).any(axis=1).all())
    pad_rows_kept = all(
        np.array_equal(_rows(ins[n], w)[would_be[list(PAD_TOKENS)]],
                       _rows(getattr(out, n), w)[would_be[list(PAD_TOKENS)]])
        for n, w in (("kv_cache", 512), ("kr_cache", 64), ("kv_scale_cache", 4))
    )  # fmt: skip
    return {"exact": exact, "kept": kept, "numpy_out": numpy_out, "untouched": untouched,
            "written": written, "pad_rows_kept": pad_rows_kept, "us": us,
            "cost": _cost(ins, prm)}  # fmt: skip


def _cost(ins: dict, prm: dict) -> dict:
    """The op's ``{flop, bytes}`` for the call (:func:`tilesim.shared.mla_prolog.cost`)."""
    import inspect
    import types

    from tilesim.shared import mla_prolog as contract

    names = inspect.signature(contract.prolog_inputs).parameters
    ns = types.SimpleNamespace(**{n: ins.get(n) for n in names})
    sw = {"rope_pairing": None, "rms_form": None, "rms_eps": None, "kv_quant": None, **prm}
    return contract.cost(contract.check_values(contract.check_meta(ns, **sw)))


#: the bit-exact case's SoCs, both in CI (about 50 s each in a loaded session): the 950 runs
#: the INT8 path as pypto-gym runs it there, the same kernel through the 950's compiler; each
#: SoC's cost rows need a CI figure (tests/device/test_cost_figures.py)
EXACT_SOCS = [
    pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
    pytest.param("950", marks=pytest.mark.soc_950, id="950"),
]


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("soc", EXACT_SOCS)
def test_int8_prolog_bit_exact_and_writes_only_its_rows(soc, sim_report):
    from tilesim.device import sim

    r = sim.isolated(run_case, soc, soc=soc, timeout=1800)
    frac = sum(r["exact"].values()) / len(r["exact"])
    sim_report.add(kernel="mla_prolog", soc=soc, case="int8 b4 s2 (T 8, 2 padding slots)",
                   bit_exact=frac, max_ulp=0 if frac == 1.0 else None, max_abs=None,
                   us=r["us"], cost=r["cost"])  # fmt: skip
    assert frac >= BUDGETS["bit_exact"], r["exact"]
    assert r["untouched"] and r["pad_rows_kept"] and r["written"], r
    assert r["kept"] and r["numpy_out"], r
    assert r["us"] > 0


#: the FP8 case's cost-model row
FP8_ROW = "fp8 kv_split b4 s2 (T 8, 2 padding slots)"


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_950
def test_fp8_prolog_on_the_950_bit_exact_and_writes_only_its_rows(sim_report):
    """The FP8 path (DeepSeek's arithmetic, ``kv_split`` cache) on the 950: every output bit
    for bit the golden's with ``fp8_promotion="two_roundings"``, and the cache writes as the
    INT8 test checks them (NaN-poisoned rows kept, the padding tokens' rows untouched)."""
    from tilesim.device import sim

    r = sim.isolated(run_case, "950", "fp8", soc="950", timeout=1800)
    frac = sum(r["exact"].values()) / len(r["exact"])
    sim_report.add(kernel="mla_prolog", soc="950", case=FP8_ROW, bit_exact=frac,
                   max_ulp=0 if frac == 1.0 else None, max_abs=None, us=r["us"],
                   cost=r["cost"])  # fmt: skip
    assert frac >= BUDGETS["bit_exact"], r["exact"]
    assert r["untouched"] and r["pad_rows_kept"] and r["written"], r
    assert r["kept"] and r["numpy_out"], r
    assert r["us"] > 0


SOCS = [pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
        pytest.param("950", marks=pytest.mark.soc_950, id="950")]  # fmt: skip


def cost_case(name: str, soc: str) -> dict:
    """In the simulator child: the cost-model µs of the named case (no interpretation)."""
    from tilesim.device import mla_prolog, sim
    from tilesim.reference.cases.mla_prolog import mla_prolog_make_case

    case = mla_prolog_make_case(name)
    with sim.cost_only():
        _out, us = mla_prolog(**case["inputs"], **case["params"], backend="sim", soc=soc)
    return {"us": us, "cost": _cost(dict(case["inputs"]), dict(case["params"]))}


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("soc", SOCS)
def test_cost_at_t128(soc, sim_report):
    """pypto-gym's large decode shape (b64 s2, ``T = 128``: one chunk of 128 tokens), cost only."""
    from tilesim.device import sim

    r = sim.isolated(cost_case, "mla_prolog_int8_b64_s2", soc, soc=soc, timeout=7200)
    sim_report.add(kernel="mla_prolog", soc=soc, case="int8 b64 s2 (T 128, cost only)",
                   bit_exact=None, max_ulp=None, max_abs=None, us=r["us"],
                   cost=r["cost"])  # fmt: skip
    assert r["us"] > 0


def fp8_cost_case(b: int) -> dict:
    """In the simulator child: the cost-model µs of the FP8 case at ``b`` sequences of 2 new
    tokens (``T = 2b``, every token live; no interpretation) on the 950."""
    from tilesim.device import mla_prolog, sim

    ins, prm, live_rows = _case("fp8", b=b, seq_lens=(1024,) * b)
    ins["slot_mapping"] = live_rows  # every token live
    with sim.cost_only():
        _out, us = mla_prolog(**ins, **prm, backend="sim", soc="950")
    return {"us": us, "cost": _cost(ins, prm)}


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.soc_950
def test_fp8_cost_at_t128(sim_report):
    """The FP8 path at b64 s2 (``T = 128``: one chunk of 128 tokens) on the 950, cost only."""
    from tilesim.device import sim

    r = sim.isolated(fp8_cost_case, 64, soc="950", timeout=7200)
    sim_report.add(kernel="mla_prolog", soc="950", case="fp8 kv_split b64 s2 (T 128, cost only)",
                   bit_exact=None, max_ulp=None, max_abs=None, us=r["us"],
                   cost=r["cost"])  # fmt: skip
    assert r["us"] > 0


def run_variants() -> dict:
    """In the simulator child: ``{variant: every output bit-equal to the golden's}`` for a
    token count the chunk pads (``mla_prolog_int8_pad``: ``T = 6`` in a chunk of 8, two
    padding tokens) and pypto-gym's kernel norm (``rms_form="gym_kernel"``, ``rms_eps=1e-5``)."""
    from tilesim.device import mla_prolog
    from tilesim.reference.cases.mla_prolog import mla_prolog_make_case

    golden = importlib.import_module("tilesim.reference.mla_prolog").mla_prolog
    out = {}
    for label, name, extra in (("T 6 padded to 8", "mla_prolog_int8_pad", {}),
                               ("gym_kernel 1e-5", CASE,
                                {"rms_form": "gym_kernel", "rms_eps": 1e-5})):  # fmt: skip
        case = mla_prolog_make_case(name)
        prm = {**case["params"], **extra}
        got, _us = mla_prolog(**case["inputs"], **prm, backend="sim", soc="910b")
        ref = golden(**case["inputs"], **prm)
        out[label] = all(np.array_equal(_bytes(getattr(ref, f)), _bytes(getattr(got, f)))
                         for f in ref._fields)  # fmt: skip
    return out


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.soc_910b
def test_padded_chunk_and_the_kernel_norm_are_bit_exact():
    from tilesim.device import sim

    r = sim.isolated(run_variants, soc="910b", timeout=1800)
    assert all(r.values()), r


# ----------------------------------------------------------------------------- bad input
def _both(ins, prm, **device_kw):
    """The golden's and the wrapper's exception for the same call (type, message)."""
    import tilesim.device as dev

    golden = importlib.import_module("tilesim.reference.mla_prolog").mla_prolog
    got = []
    for fn, kw in ((golden, {}), (dev.mla_prolog, {"backend": "sim", **device_kw})):
        with pytest.raises((ValueError, TypeError)) as e:
            fn(**ins, **prm, **kw)
        got.append((type(e.value), str(e.value)))
    return got


@pytest.fixture(scope="module")
def small_case():
    ins, prm, _ = _case()
    return ins, prm


BAD = {
    "x rank": lambda i: i.update(x=i["x"][0]),
    "slot out of range": lambda i: i["slot_mapping"].__setitem__(0, 10**6),
    "slot twice": lambda i: i["slot_mapping"].__setitem__(1, i["slot_mapping"][0]),
    "short slot_mapping": lambda i: i.update(slot_mapping=i["slot_mapping"][:-1]),
    "gamma dtype": lambda i: i.update(gamma_cq=i["gamma_cq"].astype(np.float64)),
    "kr_cache missing": lambda i: i.update(kr_cache=None),
}


@pytest.mark.torch
@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_input_gets_the_goldens_message(small_case, bad):
    ins, prm = small_case
    ins = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in ins.items()}
    BAD[bad](ins)
    before = {k: np.array(v, copy=True) for k, v in ins.items() if isinstance(v, np.ndarray)}
    (tg, mg), (td, md) = _both(ins, prm)
    assert td is tg and md == mg
    for k, v in before.items():
        assert np.array_equal(_bytes(v), _bytes(ins[k])), k


@pytest.mark.torch
def test_nan_in_x_is_refused_with_validate_full(small_case):
    ins, prm = small_case
    x = np.array(ins["x"], copy=True)
    x[3, 7] = np.nan
    (tg, mg), (td, md) = _both({**ins, "x": x}, prm, validate="full")
    assert td is tg and md == mg and "x" in md


@pytest.mark.torch
def test_fp8_weights_on_the_910b_name_the_socs_fp8_flag():
    import tilesim.device as dev
    from tilesim.reference.cases.mla_prolog import mla_prolog_make_case

    case = mla_prolog_make_case("mla_prolog_fp8_b4_s2")
    with pytest.raises(ValueError, match=r"w_dq: .*needs a SoC with FP8.*'910b'"):
        dev.mla_prolog(**case["inputs"], **case["params"], backend="sim", soc="910b")


@pytest.mark.torch
@pytest.mark.parametrize("switch", [{"rms_form": "deepseek"}, {"rope_pairing": "halves"},
                                    {"kv_quant": "int8_seeds"}])  # fmt: skip
def test_switches_the_kernel_lacks_are_refused_before_launch(small_case, switch):
    ins, prm = small_case
    import tilesim.device as dev

    name = next(iter(switch))
    with pytest.raises(ValueError, match=rf"^{name}: the device kernel implements"):
        dev.mla_prolog(**ins, **prm, **switch, backend="sim", soc="910b")


@pytest.fixture(scope="module")
def fp8_case():
    ins, prm, _ = _case("fp8")
    return ins, prm


#: the per-column scale tables ``[K/128, N]`` of the three FP8 weights: the shape a per-call
#: widening of DeepSeek's ``[K/128, ceil(N/128)]`` block scales would hand the kernel
WIDENED_SCALE_SHAPES = {(7168 // 128, 1536), (1536 // 128, 128 * 192), (7168 // 128, 576)}


@pytest.mark.torch
def test_fp8_weights_reach_the_kernel_as_the_caller_holds_them(fp8_case):
    """No per-call format work on the FP8 path (weights as users hold them): every FP8
    weight and its ``[K/128, ceil(N/128)]`` block scales reach the kernel as the caller's own
    memory (no copy, no widening), and no kernel input is a ``[K/128, N]`` per-column scale
    table. The kernel's inputs are built as a call builds them, without pypto."""
    import types

    wrapper = importlib.import_module("tilesim.device.mla_prolog")
    ins, prm = fp8_case
    names = ("path", "rope_pairing", "rms_form", "rms_eps", "kv_quant", "cache_layout")
    switches = {**{k: prm.get(k) for k in names}, "fp8_promotion": prm["fp8_promotion"]}
    ns = types.SimpleNamespace(**{n: ins.get(n) for n in wrapper._INPUTS})
    a = wrapper._checked(ns, switches, True, "950")
    inputs, _outputs = wrapper._kernel_inputs_fp8(a, 8)
    shapes = {tuple(t.shape) for t in inputs}
    assert not shapes & WIDENED_SCALE_SHAPES, shapes
    pointers = {t.data_ptr() for t in inputs}
    for name in ("w_dq", "w_dq_scale", "w_uq_qr", "w_uq_qr_scale", "w_dkv_kr", "w_dkv_kr_scale"):
        assert np.asarray(ins[name]).ctypes.data in pointers, name


@pytest.mark.torch
@pytest.mark.parametrize("switch", [{"cache_layout": "pypto"}, {"fp8_promotion": "fma"},
                                    {"rms_form": "gym_golden"}])  # fmt: skip
def test_fp8_switches_the_kernel_lacks_are_refused_before_launch(fp8_case, switch):
    """The FP8 kernel writes the ``kv_split`` triple and promotes in two roundings: the path's
    defaults (the packed row, ``"fma"``) and other switch values are refused on the 950,
    naming the switch, before anything is built."""
    import tilesim.device as dev

    ins, prm = fp8_case
    ins = dict(ins)
    if "cache_layout" in switch:  # a packed cache for the packed layout (the contract's shape)
        rows = int(np.prod(ins["kv_cache"].shape[:-1]))
        ins.update(kv_cache=np.zeros((rows, 656), np.uint8).view(ins["kv_cache"].dtype),
                   kr_cache=None, kv_scale_cache=None)  # fmt: skip
    name = next(iter(switch))
    with pytest.raises(ValueError, match=rf"^{name}: the device kernel implements .* FP8 path"):
        dev.mla_prolog(**ins, **{**prm, **switch}, backend="sim", soc="950")
