"""What a device wrapper reads on the host before its launch, per
``validate=`` (the one policy: ``tilesim.device.backend.value_checks`` over
``VALUE_CHECKS``).

Every read of a torch input's data on the host goes through NumPy (``Tensor.numpy``,
``__array__``, ``tolist``, ``item``); a ``TorchFunctionMode`` records each one with the input
whose storage it reads and the bytes. On an NPU each such read is a device-to-host copy, so
the record is the call's host copies. The launch is faked: ``backend.resolve`` (the first
step after the checks in every wrapper) raises, so neither PyPTO nor a simulator is needed.

* ``validate=True`` (default): only the small integer inputs the op's contract reads on the
  host anyway (block tables, lengths, indices, ``expert_cumsum``), each at most once, never a
  cache, weights, activations or a mask; the byte count is the one each op page states;
* ``validate="full"``: the bulk scans too (the indexers' and the main branch's float data);
* ``validate=False``: nothing at all;
* ``validate`` is a bool or ``"full"``: anything else is a ``TypeError`` naming it.
"""

from __future__ import annotations

import collections
import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.overrides import TorchFunctionMode  # noqa: E402

#: the Tensor methods that hand a tensor's data to the host (NumPy or Python values)
_HOST_READS = {"numpy", "__array__", "tolist", "item"}


class _Launched(Exception):
    """Raised by the faked ``backend.resolve``: the checks are over, the launch would start."""


class HostReads(TorchFunctionMode):
    """Records ``{input name: bytes read}`` for host reads of the watched tensors' storage."""

    def __init__(self, inputs: dict):
        super().__init__()
        self.owner = {
            t.untyped_storage().data_ptr(): name
            for name, t in inputs.items()
            if isinstance(t, torch.Tensor)
        }
        self.reads = collections.Counter()
        self.calls = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_READS and args and isinstance(args[0], torch.Tensor):
            t = args[0]
            who = self.owner.get(t.untyped_storage().data_ptr(), "<other>")
            self.reads[who] += t.numel() * t.element_size()
            self.calls[who] += 1
        return func(*args, **(kwargs or {}))


def _torch(v):
    from tilesim.shared.interop import to_torch

    if isinstance(v, np.ndarray):
        return to_torch(np.ascontiguousarray(v)).clone()  # its own storage per input
    if isinstance(v, tuple) and all(isinstance(x, np.ndarray) for x in v):
        return tuple(_torch(x) for x in v)
    return v


def _flat(kw: dict) -> dict:
    """The tensors of a call by argument name (``weights`` pairs as ``weights[i]``)."""
    out = {}
    for k, v in kw.items():
        if isinstance(v, tuple):
            out.update({f"{k}[{i}]": x for i, x in enumerate(v)})
        else:
            out[k] = v
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


# ----------------------------------------------------------------------------- the cases
def _moe():
    from tilesim.reference import moe_make_case

    c = moe_make_case(None, seed=1, num_experts=2, hidden_size=64, intermediate_size=32,
                      counts=(2, 3))  # fmt: skip
    return "moe_grouped_gemm", {**c["inputs"], **c["params"]}


def _msa(op, wrapper=None, **extra):
    from tilesim.reference import msa_make_case

    p = {
        "msa_indexer": dict(nb=20, seq_len=20 * 128 - 7),
        "msa_sparse_decode": dict(nb=2, seq_len=200, select="random"),
        "msa_main_branch": dict(n=5, topk=2, bk=128, hq=2, hkv=1, dh=128, max_n=128),
    }[op]
    c = msa_make_case(None, op=op, seed=1, **p)
    return wrapper or op, {**c["inputs"], **c["params"], **extra}


def _dsa(layout):
    from tilesim.reference import dsa_make_case
    from tilesim.shared.tiling import SaTileShapeConfig

    c = dsa_make_case(None, seed=1, actual_seq=[20, 9], s1=1, nq=2, topk=16, block_size=16,
                      quant="int8", layout=layout, tiling=SaTileShapeConfig(g_tile=2, s_kv_tile=16),
                      progress=False)  # fmt: skip
    name = "sparse_attention_antiquant" + ("_kv_split" if layout == "kv_split" else "")
    return name, {**c["inputs"], **c["params"]}


def _dsa_indexer(path):
    from tilesim.reference import dsa_indexer_make_case

    c = dsa_indexer_make_case(None, seed=1, path=path, seq_lens=(300, 200), s1=2,
                              block_size=32, topk=64)  # fmt: skip
    return "dsa_indexer", {**c["inputs"], **c["params"]}


def _drop(kw: dict, *names):
    return {k: v for k, v in kw.items() if k not in names}


#: case id -> (builder, the integer inputs a default call may read, the bulk inputs "full" reads)
CASES = {
    "moe": (_moe, {"expert_cumsum"}, set()),
    "msa_indexer_scores": (lambda: _msa("msa_indexer", "msa_indexer_scores"), set(),
                           {"idx_q", "idx_k"}),
    "msa_indexer": (lambda: _msa("msa_indexer"), set(), {"idx_q", "idx_k"}),
    "msa_sparse_decode": (lambda: _msa("msa_sparse_decode"), {"block_ids"}, set()),
    "msa_main_branch": (lambda: _msa("msa_main_branch"), set(), {"block_mask"}),
    "dsa_packed": (lambda: _dsa("pypto"), {"topk_indices", "block_table", "kv_act_seqs"}, set()),
    "dsa_kv_split": (lambda: _dsa("kv_split"), {"topk_indices", "block_table", "kv_act_seqs"},
                     set()),
    "dsa_indexer_int8": (lambda: _dsa_indexer("int8"), {"block_table", "seq_lens"},
                         {"weights", "q_scale", "k_scale"}),
    "dsa_indexer_fp8": (lambda: _dsa_indexer("fp8"), {"block_table", "seq_lens"},
                        {"weights", "q", "k_cache"}),
}  # fmt: skip


def _call_kwargs(name: str, kw: dict) -> dict:
    dev = importlib.import_module("tilesim.device")
    import inspect

    params = inspect.signature(getattr(dev, name)).parameters
    return {k: _torch(v) for k, v in kw.items() if k in params}


def _run(monkeypatch, case: str, validate, entry=None):
    """``{input: bytes}`` read on the host by one call, up to its (faked) launch; ``entry``:
    the callable to call in place of the wrapper (with its arguments but ``backend``)."""
    from tilesim.device import backend

    def resolve(*a, **k):
        raise _Launched

    monkeypatch.setattr(backend, "resolve", resolve)
    name, kw = CASES[case][0]()
    dev = importlib.import_module("tilesim.device")
    kw = _call_kwargs(name, kw)
    if name == "msa_indexer_scores":
        kw = _drop(kw, "seq_len")
    extra = {} if validate is None else {"validate": validate}
    if entry is None:
        entry, extra = getattr(dev, name), {**extra, "backend": "sim"}
    with HostReads(_flat(kw)) as rec, pytest.raises(_Launched):
        entry(**kw, **extra)
    return dict(rec.reads), dict(rec.calls), _flat(kw)


def _bytes(t) -> int:
    return t.numel() * t.element_size()


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_default_call_reads_only_the_small_integer_inputs(monkeypatch, case):
    ints, bulk = CASES[case][1], CASES[case][2]
    reads, calls, inputs = _run(monkeypatch, case, None)  # the default: validate=True
    assert set(reads) <= ints, f"{case}: the default read {sorted(reads)} (allowed {ints})"
    for name, n in reads.items():
        assert inputs[name].dtype in (torch.int32, torch.int64), name
        assert n == _bytes(inputs[name]) and calls[name] == 1, (name, n, calls[name])
    assert not set(reads) & bulk
    assert _run(monkeypatch, case, True)[0] == reads  # True is the default


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_full_validation_scans_the_bulk_inputs(monkeypatch, case):
    ints, bulk = CASES[case][1], CASES[case][2]
    reads, _, inputs = _run(monkeypatch, case, "full")
    assert bulk <= set(reads), f"{case}: 'full' read {sorted(reads)}, expected {bulk} among them"
    assert set(reads) <= ints | bulk
    for name in bulk:
        assert reads[name] > 0


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_false_reads_nothing(monkeypatch, case):
    assert _run(monkeypatch, case, False)[0] == {}


def test_dsa_indexer_default_copies_the_stated_bytes(monkeypatch):
    """docs/ops/dsa_indexer.md: a default call copies ``seq_lens`` and ``block_table`` --
    ``itemsize * B * (1 + max_blocks)`` bytes -- and at b64 over 64K (INT32, 512 blocks of 128)
    that is 131,328 bytes, against the ~550 MB key cache ``"full"`` scans."""
    reads, _, inputs = _run(monkeypatch, "dsa_indexer_int8", True)
    bt, lens = inputs["block_table"], inputs["seq_lens"]
    assert sum(reads.values()) == _bytes(bt) + _bytes(lens)
    assert bt.element_size() * bt.shape[0] * (1 + bt.shape[1]) == _bytes(bt) + _bytes(lens)
    full, _, _ = _run(monkeypatch, "dsa_indexer_int8", "full")
    assert full["k_scale"] > 0 and sum(full.values()) > sum(reads.values())
    assert 4 * 64 * (1 + 512) == 131_328


@pytest.mark.torch
@pytest.mark.parametrize("validate", [True, "full", False])
def test_the_indexers_prepared_launch_checks_like_its_wrapper(monkeypatch, validate):
    """``tilesim.device.dsa_indexer.prepared_launch`` (what the sim tests and the cost-model
    reports launch) takes the wrapper's arguments and runs the wrapper's checks: up to the
    launch it reads the same inputs on the host."""
    from tilesim.device.dsa_indexer import prepared_launch

    want = _run(monkeypatch, "dsa_indexer_int8", validate)[0]
    assert _run(monkeypatch, "dsa_indexer_int8", validate, entry=prepared_launch)[0] == want


def test_the_policy_table_covers_every_wrapper():
    from tilesim.device import backend

    assert set(backend.VALUE_CHECKS) == {"moe", "msa_indexer", "msa_decode", "msa_main", "dsa",
                                         "dsa_indexer"}  # fmt: skip
    for op, (module, ints, scans) in backend.VALUE_CHECKS.items():
        contract = importlib.import_module(f"tilesim.shared.{module}")
        for fn in (ints, scans):
            assert fn is None or callable(getattr(contract, fn)), (op, fn)
    assert backend.validate_level(True) == "ints" and backend.validate_level(False) == "meta"
    assert backend.validate_level(np.bool_(True)) == "ints"
    assert backend.validate_level("full") == "full"


@pytest.mark.torch
@pytest.mark.parametrize("bad", [1, 0, "False", "FULL", "ints", 1.0])
@pytest.mark.parametrize("case", ["dsa_indexer_int8", "msa_main_branch", "moe"])
def test_validate_refuses_anything_but_a_bool_or_full(monkeypatch, case, bad):
    with pytest.raises(TypeError, match=r"^validate: expected a bool or 'full' .*, got "):
        _run(monkeypatch, case, bad)
