"""DeepSeek-V3.2 lightning-indexer prolog kernels on PyPTO's CPU simulator (INT8 and FP8).

What is asserted (``docs/ops/dsa_indexer_prolog.md``, "Kernel"):

1. every output bit for bit the golden :func:`tilesim.reference.dsa_indexer_prolog` called
   with the same arguments, ``k_tile`` included (the golden's switch for the kernel's K tiles
   of ``x @ w_k`` / ``x @ w_proj``; with ``k_tile=None`` at ``H <= 1024`` both sum one tile):
   the codes, the FP16 q scales, the FP16 weights, the caches;
2. the cache writes, independently of the golden: the caches come in poisoned -- every row
   holds sentinel codes and a NaN scale (never-read blocks other sentinels) -- and every row
   but the written slots keeps its bytes (other tokens' rows, the last blocks' padding, the
   blocks no table holds), each written row holds a finite scale, slot ``-1`` writes nothing;
3. NumPy in -> NumPy out, inputs untouched, one compile for several token counts.

The FP8 kernel (the 950) is held to the same three against the golden with
``fp8_promotion="two_roundings"`` (the promotion it computes), on 132-byte pages poisoned
byte by byte: every page byte but the written keys' 128 code bytes and 4 scale bytes --
located by hand from the DeepGEMM layout, not through ``shared/layouts/index_cache.py`` --
keeps its value; each written scale is a power of two (UE8M0).

The cost rows (the CI figure at T = 8 on the 910B, ``tests/device/cost_figures.json``; the
T = 128 rows in the slow set) carry the op's contract cost, from which the report derives the
HBM and cube bounds (``tests/device/conftest.py``, ``yardstick``).
"""

from __future__ import annotations

import numpy as np
import pytest

#: the kernel's K tile of the linears over H at DeepSeek's H = 7168 (its cost rows')
K_TILE = 1024
#: decode b4 s2 (T = 8) at DeepSeek's sizes, short contexts (the cost does not depend on them)
DECODE_B4 = {"path": "int8", "seq_lens": (300, 1000, 64, 129), "s1": 2, "block_size": 128}
#: CI-size shapes: a one-token batch, a batch crossing a block boundary, two padding tokens
SMALL = {"path": "int8", "seq_lens": (1, 17, 40), "s1": 1, "pad": 2, "block_size": 16,
         "hidden": 256, "rank": 256, "spare_blocks": 2}  # fmt: skip
#: the FP8 CI case: a one-token batch, a token at the first slot of a second block (32-token
#: blocks, the FP8 kernel's page rows), one padding token; H = R = 256 (two K blocks each)
SMALL_FP8 = {"path": "fp8", "seq_lens": (1, 33), "s1": 1, "pad": 1, "block_size": 32,
             "hidden": 256, "rank": 256, "spare_blocks": 1}  # fmt: skip
#: the FP8 kernel's switch: each K block's partial promoted with two FP32 roundings
FP8_KERNEL = {"fp8_promotion": "two_roundings"}
#: FP8 page poison: 0xFF (E4M3 NaN codes, NaN scale words) on the table's blocks, 0xFE on spares
PAGE_POISON, SPARE_POISON = 0xFF, 0xFE


def _bytes(x) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def poison(case) -> dict:
    """The case's inputs with every cache row poisoned: INT8 codes 0x7F and NaN scales on
    the blocks the table holds, codes -128 (0x80) and scale -inf on the spare blocks."""
    inp = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
           for k, v in case["inputs"].items()}  # fmt: skip
    used = np.unique(case["meta"]["block_table"])
    used = used[used >= 0]
    spare = np.setdiff1d(np.arange(inp["k_cache"].shape[0]), used)
    inp["k_cache"][:] = 0x7F
    inp["k_scale"][:] = np.float16(np.nan)
    inp["k_cache"][spare] = -128
    inp["k_scale"][spare] = -np.inf
    return inp


def cancel_in_k_tiles(inp, k_tile: int) -> None:
    """Make token 0's sums over H depend on the K tiles (in place): ``x[0]`` holds ``2^13`` at
    column 0, ``-2^13`` at column ``k_tile`` and 1 at column 1, every other column 0; rows 0 and
    ``k_tile`` of ``w_k`` and ``w_proj`` hold ``2^12``. The exact sum is row 1 of the weight
    (values below 3); summed in K tiles of ``k_tile`` the first partial ``2^25 + w[1]`` rounds
    to a multiple of 4 in FP32 before the second cancels ``2^25``: the token's key and weights
    then differ between ``k_tile=None`` and ``k_tile``."""
    x = inp["x"]
    x[0] = 0
    x[0, 0], x[0, 1], x[0, k_tile] = 2.0**13, 1.0, -(2.0**13)
    for name in ("w_k", "w_proj"):
        inp[name][0] = 2.0**12
        inp[name][k_tile] = 2.0**12


def check_case(build: dict, k_tile, soc: str, cancel: bool = False) -> dict:
    """Child: the kernel and the golden on one poisoned case, compared bit for bit, and the
    cache rows checked against the inputs. ``cancel``: token 0's sums over H made to depend
    on the K tiles (:func:`cancel_in_k_tiles`); ``one_tile`` then says which of the golden's
    outputs move with ``k_tile=None``."""
    from tilesim.device import compile_stats
    from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog as kernel
    from tilesim.reference import dsa_indexer_prolog as golden
    from tilesim.reference import dsa_indexer_prolog_make_case
    from tilesim.shared.dsa_indexer_prolog import check_meta, check_values, cost

    case = dsa_indexer_prolog_make_case(None, seed=7, **build)
    inp = poison(case)
    if cancel:
        cancel_in_k_tiles(inp, k_tile)
    prm = {**case["params"], "k_tile": k_tile}
    before = {k: np.array(v, copy=True) for k, v in inp.items() if isinstance(v, np.ndarray)}
    res, us = kernel(**inp, **prm, backend="sim", soc=soc)
    want = golden(**inp, **prm)
    out = {"us": us, "stats": compile_stats(), "fields": res._fields}
    out["exact"] = {n: float((_bytes(getattr(res, n)) == _bytes(getattr(want, n))).mean())
                    for n in res._fields}  # fmt: skip
    out["numpy_out"] = all(isinstance(v, np.ndarray) for v in res)
    out["inputs_kept"] = all(np.array_equal(_bytes(before[k]), _bytes(inp[k])) for k in before)
    out.update(cache_rows(inp, res, prm["block_size"]))
    out["cost"] = cost(check_values(check_meta(_ns(inp, prm), **_switches(prm))))
    out["T"] = inp["x"].shape[0]
    if cancel:
        one = golden(**inp, **{**prm, "k_tile": None})
        out["one_tile"] = {n: not np.array_equal(_bytes(getattr(one, n)), _bytes(getattr(want, n)))
                           for n in want._fields}  # fmt: skip
    return out


def _ns(inp, prm):
    import types

    from tilesim.shared.dsa_indexer_prolog import INPUT_NAMES

    return types.SimpleNamespace(**{n: inp.get(n) for n in INPUT_NAMES})


def _switches(prm) -> dict:
    return {k: v for k, v in prm.items() if k != "ue8m0" or prm["path"] == "fp8"}


def cache_rows(inp, res, bs: int) -> dict:
    """The rows of the kernel's caches against its inputs: every row but the written slots
    byte for byte the input's; the written rows hold finite scales and not the sentinel."""
    slots = np.asarray(inp["slot_mapping"], np.int64)
    written = slots[slots >= 0]
    rows = inp["k_cache"].shape[0] * bs
    keep = np.setdiff1d(np.arange(rows), written)
    codes_in, codes_out = inp["k_cache"].reshape(rows, -1), res.k_cache.reshape(rows, -1)
    sc_in, sc_out = inp["k_scale"].reshape(rows), res.k_scale.reshape(rows)
    return {
        "others_kept": bool(np.array_equal(_bytes(codes_in[keep]), _bytes(codes_out[keep]))
                            and np.array_equal(_bytes(sc_in[keep]), _bytes(sc_out[keep]))),
        "written_finite": bool(np.isfinite(sc_out[written]).all()),
        "written_moved": bool((codes_out[written] != 0x7F).any(axis=1).all()),
        "skipped": int((slots < 0).sum()),
        "written": int(written.size),
    }  # fmt: skip


def assert_case(r, name: str) -> None:
    for field, frac in r["exact"].items():
        assert frac == 1.0, (name, field, frac)
    assert r["numpy_out"] and r["inputs_kept"], name
    assert r["others_kept"] and r["written_finite"] and r["written_moved"], (name, r)
    assert r["us"] > 0 and r["stats"] == {"dsa_indexer_prolog": 1}, (name, r["stats"])


def _row(sim_report, soc: str, case: str, r) -> None:
    sim_report.add(kernel="dsa_indexer_prolog", soc=soc, case=case,
                   bit_exact=min(r["exact"].values()), max_ulp=0 if min(r["exact"].values())
                   == 1.0 else None, max_abs=None, us=r["us"],
                   cost={"flop": r["cost"]["flop"], "bytes": r["cost"]["bytes"]})  # fmt: skip


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_910b
def test_decode_b4_s2_bit_exact_and_cache_rows(sim_report):
    """T = 8 (b4 s2) at DeepSeek's sizes on the 910B, ``k_tile=1024``: every output the
    golden's bits, only the 8 slots written in the poisoned caches; the CI cost figure."""
    from tilesim.device import sim

    r = sim.isolated(check_case, DECODE_B4, K_TILE, "910b", soc="910b", timeout=1800)
    _row(sim_report, "910b", "int8 decode b4 s2 H 7168 (T 8)", r)
    assert_case(r, "decode b4 s2")
    assert (r["T"], r["written"], r["skipped"]) == (8, 8, 0)


@pytest.mark.sim
@pytest.mark.torch
def test_padding_block_edges_and_k_tiles(sim_soc, sim_report):
    """A one-token batch, a batch across a block boundary and two padding tokens (slot -1:
    nothing written) at H = R = 256 in K tiles of 128, token 0's sums over H built to depend
    on the tiles (:func:`cancel_in_k_tiles`): the kernel gives the golden's bits with the same
    ``k_tile``, which differ from the one-tile golden's in the key and the weights -- so the
    K tiles are what the kernel sums, as the switch says. Both SoCs (the INT8 recipe runs on
    the 950 too)."""
    from tilesim.device import sim

    r = sim.isolated(check_case, SMALL, 128, sim_soc, True, soc=sim_soc, timeout=1800)
    _row(sim_report, sim_soc, "int8 b3 s1 + 2 padding tokens H 256 k_tile 128", r)
    assert_case(r, "padding")
    assert (r["T"], r["written"], r["skipped"]) == (5, 3, 2)
    assert r["one_tile"]["weights"] and r["one_tile"]["k_cache"], r["one_tile"]
    assert not r["one_tile"]["q"], r["one_tile"]  # the queries do not read x


# ----------------------------------------------------------------------------- FP8 (950)
def poison_pages(case) -> dict:
    """The FP8 case's inputs with every page byte poisoned: :data:`PAGE_POISON` on the blocks
    the table holds, :data:`SPARE_POISON` on the spare blocks."""
    inp = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
           for k, v in case["inputs"].items()}  # fmt: skip
    used = np.unique(case["meta"]["block_table"])
    used = used[used >= 0]
    inp["k_cache"][:] = SPARE_POISON
    inp["k_cache"][used] = PAGE_POISON
    return inp


def cancel_in_w_proj(inp, k_tile: int) -> None:
    """:func:`cancel_in_k_tiles` for the FP8 path, whose FP32 linear over H is ``x @ w_proj``
    alone (``w_k`` is E4M3: ``2^12`` is no code): token 0's weights then depend on the K
    tiles."""
    x = inp["x"]
    x[0] = 0
    x[0, 0], x[0, 1], x[0, k_tile] = 2.0**13, 1.0, -(2.0**13)
    inp["w_proj"][0] = 2.0**12
    inp["w_proj"][k_tile] = 2.0**12


def page_rows(inp, res, bs: int) -> dict:
    """The kernel's pages against its inputs, the bytes located by hand (DeepGEMM's layout: a
    page is ``bs`` token-major 128-byte code rows, then ``bs`` little-endian FP32 scales):
    every byte but the written keys' 128 code bytes and 4 scale bytes keeps its value; each
    written scale is a finite power of two and its codes are not the poison."""
    slots = np.asarray(inp["slot_mapping"], np.int64)
    written = slots[slots >= 0]
    pin, pout = _bytes(inp["k_cache"]).reshape(inp["k_cache"].shape), _bytes(res.k_cache)
    pout = pout.reshape(pin.shape)
    mask = np.ones(pin.shape, dtype=bool)
    scales, moved = [], []
    for s in written:
        blk, off = divmod(int(s), bs)
        w0 = 128 * bs + 4 * off  # the page's scale run starts after its bs code rows
        code, word = slice(128 * off, 128 * off + 128), slice(w0, w0 + 4)
        mask[blk, code] = mask[blk, word] = False
        scales.append(float(pout[blk, word].copy().view("<f4")[0]))
        moved.append(bool((pout[blk, code] != PAGE_POISON).any()))
    sc = np.array(scales, dtype=np.float32)
    mant = np.frexp(sc)[0]
    return {"others_kept": bool(np.array_equal(pin[mask], pout[mask])),
            "written_finite": bool(np.isfinite(sc).all() and (mant == 0.5).all()),
            "written_moved": all(moved), "skipped": int((slots < 0).sum()),
            "written": int(written.size)}  # fmt: skip


def check_case_fp8(build: dict, k_tile: int) -> dict:
    """Child: the FP8 kernel and the golden (``fp8_promotion="two_roundings"``, the same
    ``k_tile``) on one poisoned case, bit for bit, the pages checked by hand; token 0's
    weights made to depend on the K tiles (:func:`cancel_in_w_proj`), ``one_tile`` saying
    which golden outputs move with ``k_tile=None``."""
    from tilesim.device import compile_stats
    from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog as kernel
    from tilesim.reference import dsa_indexer_prolog as golden
    from tilesim.reference import dsa_indexer_prolog_make_case
    from tilesim.shared.dsa_indexer_prolog import check_meta, check_values, cost

    case = dsa_indexer_prolog_make_case(None, seed=7, **build)
    inp = poison_pages(case)
    cancel_in_w_proj(inp, k_tile)
    prm = {**case["params"], **FP8_KERNEL, "k_tile": k_tile}
    before = {k: np.array(v, copy=True) for k, v in inp.items() if isinstance(v, np.ndarray)}
    res, us = kernel(**inp, **prm, backend="sim", soc="950")
    want = golden(**inp, **prm)
    one = golden(**inp, **{**prm, "k_tile": None})
    out = {"us": us, "stats": compile_stats(), "T": inp["x"].shape[0]}
    out["exact"] = {n: float((_bytes(getattr(res, n)) == _bytes(getattr(want, n))).mean())
                    for n in res._fields}  # fmt: skip
    out["dtypes"] = {n: str(getattr(res, n).dtype) for n in res._fields}
    out["numpy_out"] = all(isinstance(v, np.ndarray) for v in res)
    out["inputs_kept"] = all(np.array_equal(_bytes(before[k]), _bytes(inp[k])) for k in before)
    out.update(page_rows(inp, res, prm["block_size"]))
    out["cost"] = cost(check_values(check_meta(_ns(inp, prm), **_switches(prm))))
    out["one_tile"] = {n: not np.array_equal(_bytes(getattr(one, n)), _bytes(getattr(want, n)))
                       for n in want._fields}  # fmt: skip
    out["refusals"] = fp8_refusals()
    return out


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.soc_950
def test_fp8_pages_bit_exact_on_the_950(sim_report):
    """The FP8 kernel on the 950: a one-token batch, a token in the first slot of a second
    page and a padding token (slot -1) at H = R = 256 (two K blocks per FP8 linear) in K
    tiles of 128 for ``x @ w_proj``: every output the golden's bits with
    ``fp8_promotion="two_roundings"`` -- E4M3 q codes, FP32 q scales and weights, the pages
    -- and only the two written keys' bytes changed in the poisoned pages; the K tiles are
    the ones the weights are summed in (the one-tile golden's weights differ). In the same
    950 process, what the kernel does not compute is refused before launch, naming the
    argument (:func:`fp8_refusals`: the default ``"fma"`` promotion, ``ue8m0=False``,
    ``block_size`` 16), where the golden accepts it."""
    from tilesim.device import sim

    r = sim.isolated(check_case_fp8, SMALL_FP8, 128, soc="950", timeout=1800)
    _row(sim_report, "950", "fp8 b2 s1 + 1 padding token H 256 k_tile 128", r)
    assert_case(r, "fp8")
    assert (r["T"], r["written"], r["skipped"]) == (3, 2, 1)
    assert r["dtypes"]["q"] == "float8_e4m3fn" and r["dtypes"]["k_cache"] == "uint8", r["dtypes"]
    assert r["one_tile"]["weights"] and not r["one_tile"]["k_cache"], r["one_tile"]
    for switch, msg in r["refusals"].items():
        assert msg.startswith(f"ValueError: {switch}: "), msg


# ----------------------------------------------------------------------------- cost rows
def cost_at(soc: str, b: int, s1: int = 2, path: str = "int8") -> dict:
    """Child: the kernel costed (compile + cost model, no interpreter) at decode ``b`` x
    ``s1`` and DeepSeek's sizes, zero data (the cost model reads no value), with the op's
    contract cost and the floor of its bytes."""
    from probes.floor import floor_us
    from tilesim.device import sim
    from tilesim.device.dsa_indexer_prolog import prepared_launch
    from tilesim.reference import dsa_indexer_prolog_make_case
    from tilesim.shared.dsa_indexer_prolog import check_meta, check_values, cost

    lens = tuple(128 + 64 * i for i in range(b))
    case = dsa_indexer_prolog_make_case(None, seed=1, path=path, seq_lens=lens, s1=s1,
                                        block_size=128)  # fmt: skip
    prm = {**case["params"], "k_tile": K_TILE, **(FP8_KERNEL if path == "fp8" else {})}
    ns = _ns(case["inputs"], prm)
    for k, v in prm.items():
        setattr(ns, k, v)
    for k in ("ue8m0", "amax_floor", "eps", "fp8_promotion"):
        if not hasattr(ns, k):
            setattr(ns, k, {"ue8m0": True, "amax_floor": None, "eps": 1e-6,
                            "fp8_promotion": "fma"}[k])  # fmt: skip
    run = prepared_launch(ns, soc=soc)
    us = sim.run_cost(run["kernel"], [*run["inputs"], *run["outputs"]]).us
    c = cost(check_values(check_meta(_ns(case["inputs"], prm), **_switches(prm))))
    return {"us": us, "cost": c, "floor_us": floor_us(c["bytes"], soc=soc)}


def _cost_row(sim_report, soc: str, b: int, r, path: str = "int8") -> None:
    sim_report.add(kernel="dsa_indexer_prolog", soc=soc,
                   case=f"{path} decode b{b} s2 H 7168 (T {2 * b}, cost only)", bit_exact=None,
                   max_ulp=None, max_abs=None, us=r["us"],
                   cost={"flop": r["cost"]["flop"], "bytes": r["cost"]["bytes"]},
                   extra={"floor µs": r["floor_us"]})  # fmt: skip


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("b", [4, 64])
def test_decode_cost(b, sim_soc, sim_report):
    """The cost rows at T = 8 (b4 s2) and T = 128 (b64 s2) on both SoCs against the
    yardstick (HBM bound of the contract's bytes, cube peak of its FLOPs, the floor)."""
    from tilesim.device import sim

    r = sim.isolated(cost_at, sim_soc, b, soc=sim_soc, timeout=3600)
    _cost_row(sim_report, sim_soc, b, r)
    assert r["us"] > 0 and r["floor_us"] > 0 and r["cost"]["bytes"] > 15_000_000


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.soc_950
@pytest.mark.parametrize("b", [4, 64])
def test_fp8_decode_cost(b, sim_report):
    """The FP8 kernel's cost rows on the 950 at T = 8 (b4 s2) and T = 128 (b64 s2), DeepSeek's
    sizes, ``k_tile=1024``, against the same yardstick."""
    from tilesim.device import sim

    r = sim.isolated(cost_at, "950", b, 2, "fp8", soc="950", timeout=7200)
    _cost_row(sim_report, "950", b, r, "fp8")
    assert r["us"] > 0 and r["floor_us"] > 0 and r["cost"]["bytes"] > 15_000_000


# ----------------------------------------------------------------------------- no simulator
def _small_case(**over):
    from tilesim.reference import dsa_indexer_prolog_make_case

    case = dsa_indexer_prolog_make_case(None, seed=3, **{**SMALL, **over})
    return case["inputs"], dict(case["params"])


def _messages(inp, prm, **device) -> tuple[str, str]:
    """The golden's and the wrapper's error on the same arguments (``type: message``)."""
    from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog as kernel
    from tilesim.reference import dsa_indexer_prolog as golden

    got = []
    for fn, kw in ((golden, {}), (kernel, {"backend": "sim", **device})):
        with pytest.raises((ValueError, TypeError)) as e:
            fn(**inp, **prm, **kw)
        got.append(f"{type(e.value).__name__}: {e.value}")
    return got[0], got[1]


def _kernel_error(inp, prm, **device) -> str:
    """The wrapper's error (``type: message``) on arguments the golden accepts."""
    from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog as kernel

    with pytest.raises((ValueError, TypeError)) as e:
        kernel(**inp, **prm, backend="sim", **device)
    return f"{type(e.value).__name__}: {e.value}"


def _kernel_error_on(soc: str, inp, prm) -> str:
    """Child (a ``soc`` process): :func:`_kernel_error` for that SoC."""
    return _kernel_error(inp, prm, soc=soc)


def _isolated_kernel_error(inp, prm, soc: str = "910b") -> str:
    """:func:`_kernel_error` in a fresh process configured for ``soc`` (the refusals come after
    the target is resolved, which configures the simulator for the call's SoC)."""
    from tilesim.device import sim

    return sim.isolated(_kernel_error_on, soc, inp, prm, soc=soc, timeout=600)


def _bad(name):
    """Bad arguments of the contract (each the golden refuses before any work)."""
    inp, prm = _small_case()
    if name == "x dtype":
        inp["x"] = inp["x"].astype(np.float32)
    elif name == "slot past the cache":
        inp["slot_mapping"][0] = inp["k_cache"].shape[0] * prm["block_size"]
    elif name == "slot twice":
        inp["slot_mapping"][1] = inp["slot_mapping"][0]
    elif name == "w_qb_scale shape":
        inp["w_qb_scale"] = inp["w_qb_scale"][:10]
    elif name == "eps":
        prm["eps"] = -1.0
    elif name == "k_tile":
        prm["k_tile"] = 0
    return inp, prm


@pytest.mark.torch
@pytest.mark.parametrize("name", ["x dtype", "slot past the cache", "slot twice",
                                  "w_qb_scale shape", "eps", "k_tile"])  # fmt: skip
def test_bad_input_gets_the_goldens_message(name):
    """The wrapper runs the contract's checks: the same exception and message as the golden,
    before any launch; the inputs are left as they were."""
    inp, prm = _bad(name)
    before = {k: np.array(v, copy=True) for k, v in inp.items() if isinstance(v, np.ndarray)}
    want, got = _messages(inp, prm)
    assert got == want
    assert all(np.array_equal(_bytes(before[k]), _bytes(inp[k])) for k in before)


@pytest.mark.sim  # the kernel module is built: needs pypto
@pytest.mark.torch
def test_a_nan_is_scanned_with_validate_full_only():
    """``validate="full"`` runs the golden's float scans (its message); the default reads
    the slots alone, so the same NaN reaches the launch (here: stopped by a kernel limit)."""
    inp, prm = _small_case()
    inp["x"][1, 3] = np.nan
    want, got = _messages(inp, prm, validate="full")
    assert got == want and "x" in got
    inp["cos"], inp["sin"] = inp["cos"][:, :32], inp["sin"][:, :32]
    got = _isolated_kernel_error(inp, {**prm, "rope_pairing": "interleaved"})
    assert "rope_pairing: the kernel implements 'halves' only" in got


@pytest.mark.sim  # the kernel module is built: needs pypto
@pytest.mark.torch
def test_fp8_needs_a_soc_with_fp8():
    """FP8 on the 910B: the SoC rule's error (``SocSpec.fp8``), naming ``path``, with the
    kernel's own switches too (the SoC is checked first)."""
    inp, prm = _small_case(**SMALL_FP8)
    got = _isolated_kernel_error(inp, {**prm, **FP8_KERNEL}, soc="910b")
    assert got.startswith("ValueError: path: 'fp8' needs a SoC with FP8 E4M3"), got
    assert "'910b'" in got


FP8_SWITCHES = {"fp8_promotion": {}, "ue8m0": {"ue8m0": False}, "block_size": {"block_size": 16}}


def fp8_refusals() -> dict:
    """Child (a 950 process): the wrapper's error per FP8 switch the kernel does not compute,
    the golden run on the same arguments (it accepts each)."""
    from tilesim.reference import dsa_indexer_prolog as golden

    out = {}
    for switch, over in FP8_SWITCHES.items():
        inp, prm = _small_case(**{**SMALL_FP8, **over})
        prm = {**prm, **({} if switch == "fp8_promotion" else FP8_KERNEL)}
        golden(**inp, **prm)
        out[switch] = _kernel_error(inp, prm, soc="950")
    return out


@pytest.mark.sim  # the kernel module is built: needs pypto
@pytest.mark.torch
def test_one_k_tile_of_7168_is_refused():
    """At DeepSeek's H = 7168 the kernel cannot sum ``x @ w_k`` in one K tile (the golden's
    default): a ``ValueError`` naming ``k_tile`` and what to pass."""
    from tilesim.reference import dsa_indexer_prolog_make_case

    case = dsa_indexer_prolog_make_case(None, seed=1, path="int8", seq_lens=(5,), s1=1,
                                        block_size=16)  # fmt: skip
    got = _isolated_kernel_error(case["inputs"], case["params"])
    assert "k_tile: expected a K tile <= 1024 dividing H = 7168" in got, got
    assert "got None (one tile of H)" in got


@pytest.mark.torch
def test_shape_only_inputs_answer_without_a_kernel():
    """``meta`` tensors (what torch.compile traces with): the contract's metadata checks,
    then empty outputs of the documented shapes and dtypes; no data read, no simulator."""
    torch = pytest.importorskip("torch")
    from tilesim.device.dsa_indexer_prolog import dsa_indexer_prolog as kernel
    from tilesim.shared.interop import to_torch

    inp, prm = _small_case()
    meta = {k: to_torch(v).to("meta") if isinstance(v, np.ndarray) else v
            for k, v in inp.items()}  # fmt: skip
    res = kernel(**meta, **prm, backend="sim")
    t = inp["x"].shape[0]
    assert res.q.shape == (t, 64, 128) and res.q.dtype == torch.int8
    assert res.q.device.type == "meta"
    assert res.q_scale.shape == (t, 64) and res.weights.dtype == torch.float16
    assert res.k_cache.shape == inp["k_cache"].shape and res.k_scale.dtype == torch.float16
    meta["x"] = to_torch(inp["x"][:, :128]).to("meta")
    with pytest.raises(ValueError, match="w_k: expected"):
        kernel(**meta, **prm, backend="sim")
