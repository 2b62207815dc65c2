"""MSA block-sparse decode against its matmul-only probe.

The probe (:func:`probes.msa_decode_probe.msa_decode_probe`) runs the decode's C1
(``Q @ K_c^T``) and C2 (``P_c @ V_c``) per (batch row, KV head, key chunk) with the decode's
cube tiles, and nothing else. Two kinds of checks:

* without the simulator: the decode kernel's body and the probe's body are both run against a
  recording stand-in for ``pypto`` (:class:`_Recorder`); they must issue the same matmuls in
  the same order -- operand shapes and dtypes, transposes, cube tiles, enclosing dynamic
  loops -- and their FLOPs must equal the op's own counter
  (``tilesim.reference.msa_sparse_decode_flop``). This is what keeps the probe's mirrored tiles
  and chunk bounds from drifting away from ``device/_msa_decode_kernel.py``;
* on the simulator (both SoCs; CI: the B 4 shape on the 950, :data:`RUNS`), in ONE process
  per run: the decode through the public wrapper (``gather="device"``, inputs as
  ``test_msa_decode_sim.py`` builds them) against the reference
  (>= 99 % bit-exact, <= 1 row-ULP), then the probe on the same queries and the same selected
  keys; its products must equal a float64 matmul of the same tiles within the FP32 dot-product
  bound; and the streaming floor of the op's bytes (``tests/probes/floor.py``). The rows go to
  the cost-model report with "floor µs", "kernel / floor", "probe µs" and "kernel / probe".
  Numbers are asserted, never times.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_msa_decode_sim import _case
from tilesim.shared.registry.ops import record

#: the kernel's pass figures: the device budgets of the op's record (tilesim.shared.msa_decode)
BUDGETS = record("msa_decode").budgets

#: name -> (B, nb, topk, seq_len per row, ids rule of test_msa_decode_sim._case)
SHAPES = {
    "nb17 B1 topk16 seq2100": (1, 17, 16, [2100], "perm"),
    "nb40 B1 topk16 seq[5000]": (1, 40, 16, [5000], "with_last"),
    "nb40 B4 topk16 seq[5000,4990,4980,4970]": (4, 40, 16, [5000, 4990, 4980, 4970], "with_last"),
}
HQ, HKV, D = 64, 4, 128
_B1 = ("nb17 B1 topk16 seq2100", "nb40 B1 topk16 seq[5000]")
#: (SoC, shapes) of the simulator runs. CI runs the B 4 shape on the 950: the decode's 4-row
#: batch body on that SoC's gather tiles and the probe with its FP32 bound. ``slow``, because
#: CI checks them elsewhere: the 950's B 1 shapes (``nb17 B1`` is test_msa_decode_sim.py's case
#: of the same name -- same inputs, seed, tiling and budgets; ``nb40 B1`` runs the same 1-row
#: body, same cost: the decode's cost follows B and topk, not nb) and the 910B's run (its B 1
#: decode as on the 950, its 4-row body in test_compile_once.py's ``(nb 40, B 4)`` call, the
#: probe kernel on the 950); they add the B 1 probe rows and the 910B's probe rows
RUNS = [
    pytest.param("950", ("nb40 B4 topk16 seq[5000,4990,4980,4970]",), marks=pytest.mark.soc_950,
                 id="950-b4"),
    pytest.param("950", _B1, marks=[pytest.mark.soc_950, pytest.mark.slow], id="950-b1"),
    pytest.param("910b", tuple(SHAPES), marks=[pytest.mark.soc_910b, pytest.mark.slow],
                 id="910b"),
]  # fmt: skip


# ----------------------------------------------------------------------------- recording stand-in
class _T:
    """A tensor of the recording stand-in: shape and dtype only."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = [int(s) for s in shape], dtype

    def _bin(self, other):
        if isinstance(other, _T) and len(other.shape) == len(self.shape):
            return _T([max(a, b) for a, b in zip(self.shape, other.shape, strict=True)], self.dtype)
        return _T(self.shape, self.dtype)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _bin

    def __getitem__(self, idx):  # a scalar read by the control flow (gather="paged")
        return 0

    def __setitem__(self, idx, value):  # ``m[:] = m_c``
        pass


class _Recorder:
    """Stands in for the ``pypto`` module inside a kernel body: records every matmul with the
    cube tiles in force and the number of ``pypto.loop`` levels around it; other operations
    only propagate shapes (unknown names: the first tensor argument's shape and dtype)."""

    def __init__(self):
        self.matmuls: list[tuple] = []
        self.tiles = None
        self.depth = 0
        self.unroll = None  #: the factor of the loop_unroll body being run
        self.scope = -1  #: the ``sg_set_scope`` in force (-1: none)
        self.l1_reuse = None  #: the ``cube_l1_reuse_setting`` in force
        self.matmul_scopes: list[int] = []  #: the scope in force at each matmul
        self.exps: list[tuple] = []  #: (unroll factor, scope) of each ``exp``

    def __getattr__(self, name):
        if name.startswith("DT_") or name in ("DYNAMIC", "STATIC"):
            return name
        if name in ("frontend", "experimental"):
            return self
        return lambda *a, **k: next((x for x in a if isinstance(x, _T)), None)

    def jit(self, **kwargs):
        return lambda fn: fn

    def loop(self, start, stop, step=1, **kwargs):
        self.depth += 1
        try:
            yield from range(int(start), int(stop), int(step))
        finally:
            self.depth -= 1

    def loop_unroll(self, start, stop, step=1, *, unroll_list=(1,), **kwargs):
        """pypto 0.2.0's ``loop_unroll`` at run time (``pypto/_controller.py``): per factor
        ``u`` (largest first, 1 always there) a loop of step ``u*step`` from where the previous
        one stopped to ``stop - (stop - start) % (u*step)``, yielding ``(index, u)``."""
        first, start, stop = int(start), int(start), int(stop)
        for u in sorted(set(unroll_list) | {1}, reverse=True):
            end = stop - (stop - start) % (u * step)
            self.unroll = u
            yield from ((i, u) for i in self.loop(first, end, u * step))
            first = end
        self.unroll = None

    def set_pass_options(self, sg_set_scope=None, cube_l1_reuse_setting=None, **kwargs):
        if sg_set_scope is not None:
            self.scope = sg_set_scope
        if cube_l1_reuse_setting is not None:
            self.l1_reuse = dict(cube_l1_reuse_setting)

    def exp(self, t):
        self.exps.append((self.unroll, self.scope))
        return _T(t.shape, t.dtype)

    def set_cube_tile_shapes(self, *tiles):
        self.tiles = tuple(tuple(t) for t in tiles)

    def view(self, t, shape, offsets, **kwargs):
        return _T(shape, t.dtype)

    def tensor(self, shape, dtype, *args, **kwargs):
        return _T(shape, dtype)

    def cast(self, t, dtype, *args, **kwargs):
        return _T(t.shape, dtype)

    def where(self, cond, x, y):
        src = x if isinstance(x, _T) else y
        return _T(cond.shape, src.dtype)._bin(src)

    def amax(self, t, dim=-1, keepdim=True):
        return _T([*t.shape[:-1], 1], t.dtype)

    sum = amax

    def gather_in_ub(self, cache, positions, table, *args):
        return _T([positions.shape[1], cache.shape[1]], cache.dtype)

    def matmul(self, a, b, out_dtype, a_trans=False, b_trans=False, **kwargs):
        m, k = (a.shape[1], a.shape[0]) if a_trans else a.shape
        n, kb = b.shape if b_trans else b.shape[::-1]
        assert k == kb, f"matmul K mismatch: {a.shape} x {b.shape} (b_trans={b_trans})"
        rec = ((m, k, n), a.dtype, b.dtype, out_dtype, b_trans, self.tiles, self.depth, self.unroll,
               self.l1_reuse)  # fmt: skip
        self.matmuls.append(rec)
        self.matmul_scopes.append(self.scope)
        return _T([m, n], out_dtype)


def _fake(t) -> _T:
    import torch

    names = {torch.bfloat16: "DT_BF16", torch.float32: "DT_FP32", torch.int32: "DT_INT32",
             torch.bool: "DT_BOOL"}  # fmt: skip
    return _T(t.shape, names[t.dtype])


def trace_decode(batch, nb, topk, tiling, gather="device", soc="910b", recorder=None):
    """The matmuls the decode kernel body issues for this call
    (``device/_msa_decode_kernel.py`` run on the recorder: its own launch preparation, kernel
    factory and body, no pypto)."""
    import torch
    from tilesim.device import _msa_decode_kernel as mk
    from tilesim.device import msa_decode as md

    rec = _Recorder() if recorder is None else recorder
    q = torch.zeros(batch, HQ, D, dtype=torch.bfloat16)
    kb = torch.zeros(batch, HKV, nb, 128, D, dtype=torch.bfloat16)
    ids = torch.stack([torch.arange(topk, dtype=torch.int32)] * batch)
    seq = torch.full((batch,), nb * 128, dtype=torch.int64)
    sh = md.CallShape(batch, HQ, HKV, nb, D, topk)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mk, "require_pypto", lambda: rec)
        mp.setattr(md, "build_kernel", mk.build_kernel.__wrapped__)  # the factory, uncached
        kernel, ins, outs = md.decode_launch(q, kb, kb, ids, seq, sh, tiling, gather, soc)
        kernel(*[_fake(t) for t in (*ins, *outs)])
    return rec.matmuls


def trace_probe(batch, topk, ntile):
    """The matmuls the probe kernel body issues (``tests/probes/msa_decode_probe.py``, recorder)."""
    from probes import msa_decode_probe as pr

    rec = _Recorder()
    sel, n_c = topk * 128, len(pr.chunk_bounds(topk, ntile))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pr, "require_pypto", lambda: rec)
        kernel = pr.build_probe.__wrapped__(HQ, HKV, topk, D, ntile)
    rows, g = batch * HKV * sel, HQ // HKV
    bf, f32 = "DT_BF16", "DT_FP32"
    kernel(_T([batch * HQ, D], bf), _T([rows, D], bf), _T([rows, D], bf),
           _T([batch * HQ, sel], bf), _T([batch * HQ, sel], f32),
           _T([batch * HKV * n_c * g, D], f32))  # fmt: skip
    return rec.matmuls


def _flop(matmuls) -> int:
    return sum(2 * m * k * n for (m, k, n), *_ in matmuls)


@pytest.mark.torch
@pytest.mark.parametrize(
    "batch,nb,topk,ntile,splits",
    [(2, 5, 5, 512, 1), (1, 17, 16, 512, 2), (4, 40, 16, 512, 1), (3, 9, 7, 256, 3),
     (7, 4, 3, 512, 2), (1, 4, 3, 512, 1)],
)  # fmt: skip
def test_probe_issues_the_decode_matmuls(batch, nb, topk, ntile, splits):
    """Same matmuls, same order, same tiles, loops and L1 reuse as the decode's in-kernel
    variants (any kv_splits; B 7 runs every unroll factor); ``"host"``: the same P.V matmuls,
    one C1 per chunk, the automatic L1 reuse; FLOPs = the op's own counter."""
    from tilesim.reference import msa_sparse_decode_flop
    from tilesim.shared.tiling import MsaTiling

    want = msa_sparse_decode_flop(batch, HQ, topk * 128, D)
    probe = trace_probe(batch, topk, ntile)
    chunks = -(-topk * 128 // ntile)
    c1 = [r for r in probe if r[4]]  # b_trans: Q @ K^T
    c2 = [r for r in probe if not r[4]]
    assert len(c2) == batch * HKV * chunks
    assert len(c1) == batch * HKV * topk  # one per page: these ntile are multiples of 128
    assert _flop(probe) == want
    tiling = MsaTiling(ntile=ntile, kv_splits=splits)
    for gather in ("device", "paged"):
        dec = trace_decode(batch, nb, topk, tiling, gather)
        assert _flop(dec) == want, f"decode ({gather}) FLOPs vs msa_sparse_decode_flop"
        for i, (a, b) in enumerate(itertools.zip_longest(dec, probe)):
            assert a == b, f"matmul {i}: decode ({gather}) {a} vs probe {b}"
    host = trace_decode(batch, nb, topk, tiling, "host")
    assert _flop(host) == want
    assert [r[:8] for r in host if not r[4]] == [r[:8] for r in c2]
    assert {repr(r[8]) for r in host} == {"None"}  # PyPTO's automatic L1 reuse
    assert [r[0] for r in host if r[4]] == [(HQ // HKV, D, r[0][1]) for r in c2]
    # the tail chunk is there with its own width and tiles (topk*128 not a multiple of ntile)
    widths = {rec[0][1] for rec in c2}
    assert widths == {min(ntile, topk * 128 - c0) for c0 in range(0, topk * 128, ntile)}


@pytest.mark.torch
@pytest.mark.parametrize("ntile", [512, 192, 64])
def test_c1_is_one_matmul_per_page_piece(ntile):
    """C1 reads K where it lies: per chunk one ``Q @ K^T`` matmul per piece of a page, in key
    order, N = the piece's keys (ntile 192 and 64 cut chunks inside a page); no matmul runs
    in a subgraph scope, and each runs under its body's L1 reuse; on both SoCs. The pieces
    are checked against the chunk and page edges merged with NumPy."""
    from tilesim.device import msa_decode as md
    from tilesim.shared.tiling import MsaTiling

    batch, topk = 7, 5
    sel = topk * 128
    edges = np.union1d(np.arange(0, sel + 1, 128), np.r_[np.arange(0, sel, ntile), sel])
    want = [int(n) for n in np.diff(edges)]  # the pieces of one pair, chunk by chunk
    for soc in ("910b", "950"):
        rec = _Recorder()
        trace_decode(batch, 6, topk, MsaTiling(ntile=ntile), soc=soc, recorder=rec)
        c1 = [r for r in rec.matmuls if r[4]]
        assert [r[0][2] for r in c1] == want * batch * HKV
        for (m, k, n), *_, tiles, _, _, _ in c1:  # N tiles: L1 = the piece, L0 <= 128 divides it
            assert (m, k) == (HQ // HKV, D) and tiles[2][1] == n
            assert tiles[2][0] <= 128 and n % tiles[2][0] == 0
        assert set(rec.matmul_scopes) == {-1}
        l1 = dict(md.L1_REUSE_BY_ROWS)
        assert {r[7] for r in rec.matmuls} == {4, 2, 1}
        assert all(r[8] == {-1: l1[r[7]]} for r in rec.matmuls)


def test_decode_refuses_a_body_without_l1_reuse():
    from tilesim.device import msa_decode as md

    with pytest.raises(ValueError, match=r"l1_reuse.*missing \[1, 2\]"):
        md.build_kernel.__wrapped__(64, 4, 16, 128, 512, "device", l1_reuse=((4, 8),))


def test_probe_jit_options_are_the_decodes():
    from probes import msa_decode_probe as pr
    from tilesim.device import msa_decode as md

    assert pr.JIT == md.JIT
    assert pr.BY == md.BY
    assert pr.BATCH_UNROLL == md.BATCH_UNROLL
    assert pr.L1_REUSE_BY_ROWS == md.L1_REUSE_BY_ROWS


# ----------------------------------------------------------------------------- simulator
def _grid(gen, *shape, lo=-128):
    import torch

    return (torch.randint(lo, 128, shape, generator=gen) / 128).to(torch.bfloat16)


def _in_bounds(got, want, mag, n: int) -> float:
    """max of ``|got - want| / ((n + 1) 2^-24 mag)``; an exact zero bound needs an exact
    result, a NaN counts as infinitely far."""
    import torch

    err = (got.double() - want).abs()
    bound = (n + 1) * 2.0**-24 * mag
    ratio = torch.where(bound > 0, err / bound, torch.where(err == 0, 0.0, torch.inf))
    return float(torch.nan_to_num(ratio, nan=torch.inf).max())


def _probe_errors(q, kc, vc, p, s, o, bounds) -> dict:
    """The probe's products against float64 matmuls of the same tiles, in units of the FP32
    dot-product bound ``(n + 1) * 2^-24 * sum |a_i b_i|`` (n terms, any summation order, the
    final rounding included), and the fraction of products that are non-zero."""
    import torch

    b = q.shape[0]
    qd = q.double().reshape(b, HKV, HQ // HKV, D)
    kd, vd, pd = kc.double(), vc.double(), p.double().reshape(b, HKV, HQ // HKV, -1)
    s64 = torch.einsum("bhgd,bhkd->bhgk", qd, kd).reshape(b, HQ, -1)
    s_mag = torch.einsum("bhgd,bhkd->bhgk", qd.abs(), kd.abs()).reshape(b, HQ, -1)
    o_ratio = 0.0
    for c, (c0, w) in enumerate(bounds):
        pc, vcc = pd[..., c0 : c0 + w], vd[:, :, c0 : c0 + w]
        o_ratio = max(o_ratio, _in_bounds(o[:, :, c], pc @ vcc, pc.abs() @ vcc.abs(), w))
    return {
        "s_ratio": _in_bounds(s, s64, s_mag, D),
        "o_ratio": o_ratio,
        "s_nonzero": float((s != 0).double().mean()),
        "o_nonzero": float((o != 0).double().mean()),
    }


def _judged(out, gold, name: str) -> dict:
    """:func:`tilesim.reference.judge` of the decode against its reference twin with the row-ULP
    budget of ``test_msa_decode_sim.py`` (a row = one query head's 128 outputs), plain values."""
    from tilesim.reference import judge
    from tilesim.shared.interop import to_numpy

    tol = {"mode": "ulp", "row_ulp": BUDGETS["row_ulp"]}
    v = judge(to_numpy(out), to_numpy(gold), tol, kind="msa_decode", name=name)
    return {"row_ulp": v.value("row ULP budget"), "judged": v.passed, "verdict": v.summary()}


def _decode_bytes(b: int, topk: int) -> int:
    """HBM bytes the decode must move: Q read and the output written (BF16), the selected K
    and V read (BF16), the two bool keep-masks and the INT32 page table read."""
    sel = topk * 128
    return 2 * 2 * b * HQ * D + 2 * 2 * b * HKV * sel * D + 2 * b * sel + 4 * b * HKV * topk


def run_against_probe(soc: str, seed: int = 7, names: tuple = tuple(SHAPES)) -> dict:
    """Child process: per shape of ``names``, the decode (public wrapper, gather="device", the
    default split rule) vs the reference given the same tiling, then the probe on the same
    queries and selected keys (one probe per (B, topk): the shapes with the same B share it)."""
    import ml_dtypes
    import numpy as np
    import torch
    from probes.floor import floor_us
    from probes.msa_decode_probe import chunk_bounds, msa_decode_probe
    from tilesim.device import msa_sparse_decode
    from tilesim.reference import msa_sparse_decode as reference
    from tilesim.reference import msa_sparse_decode_flop
    from tilesim.reference.util.numerics import ulp_distance
    from tilesim.shared.msa_decode import cost, sized_args, split_tiling
    from tilesim.shared.tiling import MsaTiling

    res, probes = {}, {}
    for name in names:
        q, kb, vb, ids, seq = _case(*SHAPES[name], seed)
        seq = torch.tensor(seq)
        b, topk = ids.shape
        tiling = split_tiling(MsaTiling.from_env(), batch=b, hkv=HKV, topk=topk, soc=soc)
        out, us = msa_sparse_decode(q, kb, vb, ids, seq, tiling=tiling, gather="device",
                                    backend="sim", soc=soc)  # fmt: skip
        gold = reference(q, kb, vb, ids, seq, tiling=tiling)
        sel = topk * 128
        # the selected blocks of each (batch row, KV head) in slot order
        pick = (torch.arange(b)[:, None, None], torch.arange(HKV)[None, :, None],
                ids.long()[:, None, :])  # fmt: skip
        kc, vc = kb[pick].reshape(b, HKV, sel, D), vb[pick].reshape(b, HKV, sel, D)
        if (b, topk) not in probes:  # its cost depends on the shape only (not nb, not data)
            p = _grid(torch.Generator().manual_seed(seed + b), b, HQ, sel, lo=0)
            (s, o), probe_us = msa_decode_probe(q, kc, vc, p, tiling=tiling, backend="sim",
                                                soc=soc)  # fmt: skip
            errs = _probe_errors(q, kc, vc, p, s, o, chunk_bounds(topk, tiling.ntile))
            probes[b, topk] = {"probe_us": probe_us, "probe_of": name, **errs}
        a, e = out.view(torch.int16).numpy(), gold.view(torch.int16).numpy()
        ulp = ulp_distance(a.view(ml_dtypes.bfloat16), e.view(ml_dtypes.bfloat16))
        res[name] = {
            "kv_splits": tiling.kv_splits,
            "us": us,
            "bit_exact": float(np.mean(a == e)),
            "max_ulp": int(ulp.max()),
            **_judged(out, gold, name),
            "max_abs": float((out.float() - gold.float()).abs().max()),
            "flop": msa_sparse_decode_flop(b, HQ, sel, D),
            "bytes": _decode_bytes(b, topk),
            "floor_us": floor_us(cost(sized_args(b, HQ, D, hkv=HKV, topk=topk))["bytes"], soc=soc),
            **probes[b, topk],
        }
    return res


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("sim_soc,names", RUNS)
def test_decode_against_probe(sim_soc, names, sim_report):
    from tilesim.device import sim
    from tilesim.shared.tiling import MsaTiling

    r = sim.isolated(run_against_probe, sim_soc, 7, names, soc=sim_soc, timeout=1800)
    assert sorted(r) == sorted(names)
    for name, m in r.items():
        b, nb, topk = SHAPES[name][:3]
        # the probe is the decode's matmuls: same FLOPs as the op's counter (traced, no pypto)
        assert _flop(trace_probe(b, topk, MsaTiling.from_env().ntile)) == m["flop"]
        sim_report.add(
            kernel="msa_sparse_decode",
            soc=sim_soc,
            case=f"{name} gather=device kv_splits {m['kv_splits']} (default rule), vs probe",
            bit_exact=m["bit_exact"],
            max_ulp=m["max_ulp"],
            max_abs=m["max_abs"],
            us=m["us"],
            cost={"flop": m["flop"], "bytes": m["bytes"]},  # the report derives the bounds
            extra={
                "row-wise ULP": m["row_ulp"],
                "floor µs": m["floor_us"],
                "probe µs": m["probe_us"],
            },  # fmt: skip
        )
    for name, m in r.items():
        assert m["bit_exact"] >= BUDGETS["bit_exact"], (name, m)
        assert m["judged"], (name, m["verdict"])
        assert m["s_ratio"] <= 1.0 and m["o_ratio"] <= 1.0, (name, m)  # a real FP32 matmul
        assert m["s_nonzero"] > 0.99 and m["o_nonzero"] > 0.99, (name, m)  # every tile written
        assert m["us"] > 0 and m["probe_us"] > 0 and m["floor_us"] > 0, (name, m)
