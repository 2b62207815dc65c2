"""The sparse-attention golden's token pool changes no bits and keeps the trace order.

Query tokens (loops L0/L1) run on ``TILESIM_REF_THREADS`` worker threads when the private
switch ``tilesim.reference.dsa._POOL`` is on (the default); every token is computed by one
thread, and trace records are emitted in the kernel's (b, s, kv, g, tile) order. The plain path
(``_POOL = False``, or 1 worker) runs in the calling thread and is the reference here.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tilesim.reference as R
from tilesim.reference.util import blas_pool
from tilesim.reference.util.blas_pool import MAX_DEFAULT_WORKERS, ref_workers
from tilesim.shared.tiling import SaTileShapeConfig

SMALL = dict(nq=16, topk=256, block_size=16)
ONLINE_64 = SaTileShapeConfig.decode().replace(s_kv_tile=64)
PER_TILE_64 = SaTileShapeConfig.prefill().replace(s_kv_tile=64)


def bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


def same_value(x, y) -> bool:
    if isinstance(x, dict):
        return isinstance(y, dict) and list(x) == list(y) and all(same_value(x[k], y[k]) for k in x)
    if isinstance(x, np.ndarray):
        return (
            isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and np.array_equal(x.view(np.uint32), y.view(np.uint32))
        )
    return type(x) is type(y) and x == y


def same_records(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))


def lane_step(r: dict) -> tuple:
    ln = r["lane"]
    return (ln["b"], ln["s"], ln["kv_head"], ln["group"], r["step"])


@pytest.fixture(scope="module")
def ragged_case():
    """3 batches x 3 tokens: token (0, 0) has cur_seq 0, token (1, 1) has only -1 entries,
    token (2, 2) has an all -1 middle tile; up to 4 KV tiles of 64 with scattered -1s."""
    case = R.dsa_make_case(
        actual_seq=[2, 700, 1300], s1=3, topk_rule="causal", invalid_frac=0.2, seed=31, **SMALL
    )
    ti = case["inputs"]["topk_indices"].copy()
    ti[4] = -1
    ti[8, 64:128] = -1
    case["inputs"] = dict(case["inputs"], topk_indices=ti)
    return case


def run(case, cfg, workers, monkeypatch, trace=None):
    monkeypatch.setenv("TILESIM_REF_THREADS", str(workers))
    prm = {**case["params"], "tiling": cfg}
    return getattr(R, case["op"])(**case["inputs"], **prm, trace=trace)


@pytest.mark.parametrize(
    "cfg", [ONLINE_64, PER_TILE_64, PER_TILE_64.replace(g_tile=8)], ids=["online", "per_tile", "g8"]
)
def test_worker_count_and_trace_change_no_bits(ragged_case, cfg, monkeypatch):
    serial_recs: list[dict] = []
    serial = run(ragged_case, cfg, 1, monkeypatch, trace=serial_recs.append)
    assert np.array_equal(bits(serial), bits(run(ragged_case, cfg, 1, monkeypatch)))
    rows = serial.astype(np.float32).reshape(9, 16, 512)
    assert (rows[0] == 0).all() and (rows[4] == 0).all()  # empty token, all -1 token
    assert (rows[[1, 2, 3, 5, 6, 7, 8]] != 0).any(axis=(1, 2)).all()
    tok = [r for r in serial_recs if lane_step(r)[:4] == (2, 2, 0, 0)]
    assert tok[1]["extra"]["branch"] == "skip"
    for workers in (2, 3):
        assert np.array_equal(bits(serial), bits(run(ragged_case, cfg, workers, monkeypatch)))
        recs: list[dict] = []
        out = run(ragged_case, cfg, workers, monkeypatch, trace=recs.append)
        assert np.array_equal(bits(serial), bits(out))
        assert same_records(serial_recs, recs)
    order = [lane_step(r) for r in serial_recs]
    assert order == sorted(order) and len(set(order)) == len(order)


@pytest.mark.parametrize("cfg", [ONLINE_64, PER_TILE_64], ids=["online", "per_tile"])
def test_pool_switch_changes_no_bits_and_no_records(ragged_case, cfg, monkeypatch):
    """The speed path (``_POOL``) against the plain path, with several workers available."""
    from tilesim.reference import dsa

    outs, recs = {}, {}
    for pool in (False, True):
        monkeypatch.setattr(dsa, "_POOL", pool)
        recs[pool] = []
        outs[pool] = run(ragged_case, cfg, 3, monkeypatch, trace=recs[pool].append)
    assert np.array_equal(bits(outs[False]), bits(outs[True]))
    assert recs[False] and same_records(recs[False], recs[True])
    # negative control: the comparison sees a changed record
    changed = [dict(r) for r in recs[True]]
    changed[3] = {**changed[3], "keys_used": changed[3]["keys_used"] + 1}
    assert not same_records(recs[False], changed)


def test_plain_path_uses_no_pool(ragged_case, monkeypatch):
    """With ``_POOL = False`` no worker thread is started, whatever TILESIM_REF_THREADS says."""
    from tilesim.reference import dsa

    seen: list[int] = []
    real = blas_pool.pin_blas_thread

    def spy():
        seen.append(threading.get_ident())
        real()

    monkeypatch.setattr(blas_pool, "pin_blas_thread", spy)
    monkeypatch.setattr(dsa, "_POOL", False)
    run(ragged_case, ONLINE_64, 3, monkeypatch)
    assert seen == []


def test_kv_split_layout_with_workers(monkeypatch):
    case = R.dsa_make_case(
        actual_seq=[500, 90], s1=2, layout="kv_split", invalid_frac=0.1, seed=32, **SMALL
    )
    a = run(case, ONLINE_64, 1, monkeypatch)
    b = run(case, ONLINE_64, 2, monkeypatch)
    assert np.array_equal(bits(a), bits(b))


def test_tokens_really_run_on_worker_threads(ragged_case, monkeypatch):
    """Negative control for the tests above: 3 workers -> 3 pool threads (not the caller) each
    pin their BLAS; 1 worker -> no pool at all."""
    seen: list[int] = []
    real = blas_pool.pin_blas_thread

    def spy():
        seen.append(threading.get_ident())
        real()

    monkeypatch.setattr(blas_pool, "pin_blas_thread", spy)
    run(ragged_case, ONLINE_64, 3, monkeypatch)
    assert len(set(seen)) == 3 and threading.get_ident() not in seen
    seen.clear()
    run(ragged_case, ONLINE_64, 1, monkeypatch)
    assert seen == []


def test_trace_exception_propagates_and_pool_stops(ragged_case, monkeypatch):
    def boom(rec):
        raise RuntimeError("trace hook failed")

    with pytest.raises(RuntimeError, match="trace hook failed"):
        run(ragged_case, ONLINE_64, 2, monkeypatch, trace=boom)


def test_ref_workers_env(monkeypatch):
    monkeypatch.delenv("TILESIM_REF_THREADS", raising=False)
    assert 1 <= ref_workers() <= MAX_DEFAULT_WORKERS
    monkeypatch.setenv("TILESIM_REF_THREADS", "5")
    assert ref_workers() == 5
    for bad in ("0", "-2", "two", "+3", "1_0"):  # the environment policy of tilesim.shared.env
        monkeypatch.setenv("TILESIM_REF_THREADS", bad)
        with pytest.raises(ValueError, match="^TILESIM_REF_THREADS: expected a positive integer"):
            ref_workers()


def _named_cases():
    from tilesim.reference.cases.dsa import DSA_CASES

    return list(DSA_CASES.items())


@pytest.mark.parametrize("name_case", _named_cases(), ids=[n for n, _ in _named_cases()])
def test_fast_path_equals_the_loop_nest_on_every_named_case(name_case, monkeypatch):
    """``reference/_dsa_fast.py`` (``_POOL = True``, 2 workers) against the readable loop nest
    of ``reference/dsa.py`` (``_POOL = False``): same bits, same trace records, on every named
    case at the reduced sizes of ``tests/digests/golden_digests.py`` (B <= 2, s1 <= 2, lengths
    capped at 3000 + 917 j)."""
    from tilesim.reference import dsa

    name, c = name_case
    b = min(c.b, 2)
    acts = tuple(min(a, 3000 + 917 * j) for j, a in enumerate(c.actual_seq[:b]))
    case = R.dsa_make_case(name, b=b, actual_seq=acts, s1=min(c.s1, 2), seed=7)
    monkeypatch.setenv("TILESIM_REF_THREADS", "2")
    outs, recs = {}, {}
    for pool in (False, True):
        monkeypatch.setattr(dsa, "_POOL", pool)
        recs[pool] = []
        op = getattr(R, case["op"])
        outs[pool] = op(**case["inputs"], **case["params"], trace=recs[pool].append)
    assert np.array_equal(bits(outs[False]), bits(outs[True])), name
    assert recs[False] and same_records(recs[False], recs[True]), name
