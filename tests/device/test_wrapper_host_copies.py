"""What a device wrapper reads on the host in one whole call, per ``validate=`` (the one
policy: ``tilesim.device.backend.value_checks`` over the checks each op's record names).

Every read of a torch input's data on the host goes through NumPy (``Tensor.numpy``,
``__array__``, ``tolist``, ``item``); a ``TorchFunctionMode`` records each one with the input
whose storage it reads and the bytes (a tensor that is no input, such as a kernel output
copied back, as ``"<other>"``). On an NPU each such read is a device-to-host copy, so the
record is the call's host copies. The simulator is faked below the wrappers
(:func:`_fake_backend`: no simulator configured, no kernel built, the launch returns at
once), so the whole call runs -- checks, host plan, build, launch and everything after it --
without PyPTO.

* ``validate=True`` (default): only the small integer inputs the op's contract reads on the
  host anyway (block tables, lengths, indices, ``expert_cumsum``), each at most once, never a
  cache, weights, activations or a mask; the byte count is the one each op page states;
* ``validate="full"``: the bulk scans too (the indexers' and the main branch's float data);
* ``validate=False``: nothing at all in the wrapper, but the layer step's slot source (it
  derives the prologs' slots on the host, unchecked: :data:`UNCHECKED_READS`);
* ``validate`` is a bool or ``"full"``: anything else is a ``TypeError`` naming it;
* after the launch: ``msa_indexer`` copies its scores (or block maxima) to the host only when
  it ranks there -- ``rank="host"``, or ``rank=None`` beyond the device ranking's width, which
  warns (``HostRankWarning``) -- at every ``validate`` level.

The launch's own reads are the runtime's, not the wrapper's: on an NPU it copies the
kernel's ``ready_on_host`` inputs (block tables, lengths, ``expert_cumsum``) to the host at
every ``validate`` level. The faked launch does not model that copy; the last tests pin
those names to the inputs a default call may read and to docs/device.md's table.
"""

from __future__ import annotations

import collections
import functools
import importlib
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.overrides import TorchFunctionMode  # noqa: E402

#: the Tensor methods that hand a tensor's data to the host (NumPy or Python values)
_HOST_READS = {"numpy", "__array__", "tolist", "item"}


class _FakeKernel:
    """Stands for a compiled kernel (``backend.compiled`` is faked): the name it was built
    under; the faked ``backend.launch`` never calls it."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"{self.name}: the faked launch runs no kernel")


class _AnyAttribute:
    """Stands for ``tilesim.device._dsa_kernel`` (which imports pypto): every attribute is a
    callable returning a :class:`_FakeKernel`, so the DeepSeek wrapper's build step runs."""

    def __getattr__(self, name: str):
        return lambda *a, **k: _FakeKernel(name)


class _FakePypto(_AnyAttribute):
    """Stands for pypto where a wrapper's build step reads it before the faked compile: any
    attribute, and a host arch that is no 950's (``backend.npu_soc``: the 910B)."""

    platform = types.SimpleNamespace(npuarch=None)


#: the modules that call ``require_pypto`` on the way to a (faked) compile
_PYPTO_USERS = ("tilesim.device.backend", "tilesim.device._dsa_indexer_kernel",
                "tilesim.device._mla_prolog_kernel", "tilesim.device._mla_prolog_fp8_kernel",
                "tilesim.device._dsa_indexer_prolog_kernel",
                "tilesim.device._dsa_indexer_prolog_fp8_kernel")  # fmt: skip


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


@functools.cache
def _mla_case() -> dict:
    from tilesim.reference import mla_prolog_make_case

    return mla_prolog_make_case("mla_prolog_int8_b4_s2")


def _mla_prolog():
    c = _mla_case()
    return "mla_prolog", {**c["inputs"], **c["params"]}


def _dsa_indexer_prolog(path):
    from tilesim.reference import dsa_indexer_prolog_make_case

    c = dsa_indexer_prolog_make_case(None, seed=3, path=path, seq_lens=(1, 17, 40), s1=1,
                                     pad=2, block_size=16 if path == "int8" else 32,
                                     hidden=256, rank=256, spare_blocks=2)  # fmt: skip
    extra = {"fp8_promotion": "two_roundings"} if path == "fp8" else {}
    return "dsa_indexer_prolog", {**c["inputs"], **c["params"], **extra}


def _step(slots: bool = False):
    """The layer step's short INT8 case; ``slots``: with the caller's ``slot_mapping`` (the
    prologs' slots), not derived from ``block_table`` / ``seq_lens``."""
    from tilesim.reference import dsa_attention_step_make_case
    from tilesim.shared.layouts.slots import slots_from_block_table

    c = dsa_attention_step_make_case("dsa_attention_step_short_int8")
    prm = {k: v for k, v in c["params"].items() if k != "progress"}
    kw = {**c["inputs"], **prm, "index_k_tile": 1024}
    if slots:
        b = len(kw["seq_lens"])  # decode: T // B new tokens a batch
        q_lens = np.full(b, kw["x"].shape[0] // b, np.int64)
        kw["slot_mapping"] = slots_from_block_table(
            kw["block_table"], kw["seq_lens"], q_lens=q_lens, block_size=prm["block_size"]
        )
    return "dsa_attention_step", kw


def _drop(kw: dict, *names):
    return {k: v for k, v in kw.items() if k not in names}


#: the float inputs the prologs' "full" scans (finite activations, tables, weights, scales)
MLA_SCANS = {"x", "gamma_cq", "gamma_ckv", "cos", "sin", "w_dq", "w_uq_qr", "w_uq_qr_scale",
             "w_dkv_kr", "w_uk"}  # fmt: skip
IPROLOG_SCANS = {"x", "q_norm", "w_qb", "w_qb_scale", "w_k", "w_proj", "ln_gamma", "ln_beta",
                 "cos", "sin"}  # fmt: skip
#: the layer step: its integer inputs, and both prologs' scans plus the index cache's read tokens
STEP_INTS = {"seq_lens", "block_table", "q_lens", "slot_mapping"}
#: (the step's ``q_norm`` is the MLA prolog's output, not an input)
STEP_SCANS = MLA_SCANS | IPROLOG_SCANS - {"q_norm"} | {"hadamard_q", "hadamard_k", "k_cache",
                                                      "k_scale"}  # fmt: skip

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
    "mla_prolog": (_mla_prolog, {"slot_mapping"}, MLA_SCANS),
    "dsa_indexer_prolog_int8": (lambda: _dsa_indexer_prolog("int8"), {"slot_mapping"},
                                IPROLOG_SCANS | {"q_norm_scale", "hadamard_q", "hadamard_k"}),
    "dsa_indexer_prolog_fp8": (lambda: _dsa_indexer_prolog("fp8"), {"slot_mapping"},
                               IPROLOG_SCANS | {"w_k_scale"}),
    "dsa_attention_step": (_step, STEP_INTS, STEP_SCANS),
    "dsa_attention_step_slots": (lambda: _step(slots=True), STEP_INTS, STEP_SCANS),
}  # fmt: skip
#: what ``validate=False`` still reads in the wrapper (every other case: nothing): the layer
#: step derives the prologs' slots on the host (their kernels read them there) from
#: ``block_table`` / ``seq_lens``, or takes the caller's ``slot_mapping``; neither is checked
UNCHECKED_READS = {"dsa_attention_step": {"block_table", "seq_lens"},
                   "dsa_attention_step_slots": {"slot_mapping"}}  # fmt: skip


def _call_kwargs(name: str, kw: dict) -> dict:
    dev = importlib.import_module("tilesim.device")
    import inspect

    params = inspect.signature(getattr(dev, name)).parameters
    return {k: _torch(v) for k, v in kw.items() if k in params}


def _fake_backend(monkeypatch) -> list:
    """Fake the simulator below the wrappers so that a call runs whole -- checks, host plan,
    kernel build, launch, and everything after the launch up to the return -- without pypto:
    ``resolve`` configures no simulator, ``compiled`` builds a :class:`_FakeKernel`, and
    ``launch`` records the kernel and returns 0 µs leaving the outputs as allocated. Returns
    the list the launches are recorded in."""
    import sys

    import tilesim.device as dev
    from tilesim.device import backend

    real_resolve, launches = backend.resolve, []

    def resolve(backend_name, soc, like, *, configure=True):
        return real_resolve(backend_name, soc, like, configure=False)

    def launch(kernel, args, outputs, target):
        launches.append(getattr(kernel, "func", kernel).name)
        return 0.0

    monkeypatch.setattr(backend, "resolve", resolve)
    monkeypatch.setattr(backend, "compiled", lambda name, key, build: _FakeKernel(name))
    monkeypatch.setattr(backend, "launch", launch)
    # builders ask for pypto (its dtypes, the host's arch) before they reach the (faked)
    # compile: the reference session has no pypto, and the faked compile never runs the source
    fake = _FakePypto()
    for name in _PYPTO_USERS:
        monkeypatch.setattr(importlib.import_module(name), "require_pypto", lambda: fake)
    monkeypatch.setitem(sys.modules, "tilesim.device._dsa_kernel", _AnyAttribute())
    monkeypatch.setattr(dev, "_dsa_kernel", sys.modules["tilesim.device._dsa_kernel"],
                        raising=False)  # fmt: skip
    return launches


def _run(monkeypatch, case: str, validate, entry=None, **options):
    """``({input: bytes}, {input: calls}, inputs, launches)`` of one whole call (the launch
    faked, :func:`_fake_backend`): the host reads of the wrapper's checks, host plan and
    everything after the launch; a read of a tensor that is no input (an output copied to
    the host) counts as ``"<other>"``. ``entry``: the callable to call in place of the wrapper
    (with its arguments but ``backend``); ``options``: more keyword arguments of the call."""
    launches = _fake_backend(monkeypatch)
    name, kw = CASES[case][0]()
    dev = importlib.import_module("tilesim.device")
    kw = _call_kwargs(name, kw)
    if name == "msa_indexer_scores":
        kw = _drop(kw, "seq_len")
    extra = {**options} if validate is None else {**options, "validate": validate}
    if entry is None:
        entry, extra = getattr(dev, name), {**extra, "backend": "sim", "soc": "950"}
    with HostReads(_flat(kw)) as rec:
        entry(**kw, **extra)
    return dict(rec.reads), dict(rec.calls), _flat(kw), launches


def _bytes(t) -> int:
    return t.numel() * t.element_size()


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_default_call_reads_only_the_small_integer_inputs(monkeypatch, case):
    ints, bulk = CASES[case][1], CASES[case][2]
    reads, calls, inputs, launches = _run(monkeypatch, case, None)  # the default: validate=True
    assert launches, f"{case}: the call ended before its launch"
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
    reads, _, inputs, _ = _run(monkeypatch, case, "full")
    assert bulk <= set(reads), f"{case}: 'full' read {sorted(reads)}, expected {bulk} among them"
    assert set(reads) <= ints | bulk
    for name in bulk:
        assert reads[name] > 0


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_false_reads_nothing(monkeypatch, case):
    """Nothing, but the layer step's slot source (:data:`UNCHECKED_READS`), each once."""
    reads, calls, inputs, _ = _run(monkeypatch, case, False)
    assert set(reads) == UNCHECKED_READS.get(case, set()), (case, sorted(reads))
    for name, n in reads.items():
        assert n == _bytes(inputs[name]) and calls[name] == 1, (name, n, calls[name])


def test_dsa_indexer_default_copies_the_stated_bytes(monkeypatch):
    """docs/ops/dsa_indexer.md: a default call copies ``seq_lens`` and ``block_table`` --
    ``itemsize * B * (1 + max_blocks)`` bytes -- and at b64 over 64K (INT32, 512 blocks of 128)
    that is 131,328 bytes, against the ~550 MB key cache ``"full"`` scans."""
    reads, _, inputs, _ = _run(monkeypatch, "dsa_indexer_int8", True)
    bt, lens = inputs["block_table"], inputs["seq_lens"]
    assert sum(reads.values()) == _bytes(bt) + _bytes(lens)
    assert bt.element_size() * bt.shape[0] * (1 + bt.shape[1]) == _bytes(bt) + _bytes(lens)
    full, *_ = _run(monkeypatch, "dsa_indexer_int8", "full")
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


def test_each_kernels_record_names_its_value_checks():
    """The wrapper runs the checks its op's record names: the contract's own functions."""
    from tilesim.device import backend
    from tilesim.shared.registry import ops

    for rec in ops.records():
        if not rec.kernel:
            continue
        contract = importlib.import_module(f"tilesim.shared.{rec.name}")
        checks = [fn for fn in (rec.int_checks, rec.scan_checks) if fn is not None]
        assert checks, rec.name
        for fn in checks:
            assert getattr(contract, fn.__name__) is fn, (rec.name, fn)
    assert backend.validate_level(True) == "ints" and backend.validate_level(False) == "meta"
    assert backend.validate_level(np.bool_(True)) == "ints"
    assert backend.validate_level("full") == "full"


def test_the_record_runs_the_checks_each_level_asks_for():
    from tilesim.device import backend
    from tilesim.shared.registry.op_record import Call, OpRecord, Output

    ran = []
    rec = OpRecord("toy", (Call("toy", "toy", (Output("out", "float"),)),), cost=len,
                   int_checks=lambda a: ran.append("ints") or a + 1,
                   scan_checks=lambda a: ran.append("scan") or a * 10)  # fmt: skip
    assert backend.value_checks(rec, 1, False) == 1 and ran == []
    assert backend.value_checks(rec, 1, True) == 2 and ran == ["ints"]
    assert backend.value_checks(rec, 1, "full") == 20 and ran == ["ints", "ints", "scan"]
    assert backend.value_checks(rec, 1, "full", shape_only=True) == 1 and len(ran) == 3
    with pytest.raises(TypeError, match=r"^validate: expected a bool or 'full'"):
        backend.value_checks(rec, 1, "ints")


@pytest.mark.torch
@pytest.mark.parametrize("bad", [1, 0, "False", "FULL", "ints", 1.0])
@pytest.mark.parametrize("case", ["dsa_indexer_int8", "msa_main_branch", "moe"])
def test_validate_refuses_anything_but_a_bool_or_full(monkeypatch, case, bad):
    with pytest.raises(TypeError, match=r"^validate: expected a bool or 'full' .*, got "):
        _run(monkeypatch, case, bad)


# ----------------------------------------------------------------------------- after the launch
def _indexer_reads(monkeypatch, nb: int, validate=True, **options):
    """``({input: bytes}, warnings)`` of one ``msa_indexer`` call on zero inputs of ``nb``
    blocks (the launch faked: no value matters)."""
    import warnings

    from tilesim.device import msa_indexer

    _fake_backend(monkeypatch)
    q = torch.zeros(4, 128, dtype=torch.bfloat16)
    k = torch.zeros(nb * 128, 128, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught, HostReads({"idx_q": q, "idx_k": k}) as rec:
        warnings.simplefilter("always")
        msa_indexer(q, k, nb, backend="sim", soc="950", validate=validate, **options)
    return dict(rec.reads), [w for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.torch
@pytest.mark.parametrize("validate", [True, "full", False])
@pytest.mark.parametrize("block_max,per_block", [("host", 4 * 128 * 4), ("device", 4 * 4)])
def test_host_ranking_copies_its_scores_after_the_launch(monkeypatch, validate, block_max,
                                                         per_block):  # fmt: skip
    """``rank="host"``: the FP32 ``[4, nb*128]`` scores (2 KB a block) or ``[4, nb]`` block
    maxima (16 B a block) come to the host after the launch, at every level; asked for, so
    no warning. ``rank=None`` at 20 blocks ranks on the device: no copy."""
    nb = 20
    reads, warned = _indexer_reads(monkeypatch, nb, validate, rank="host", block_max=block_max)
    assert reads.pop("<other>") == per_block * nb and not warned
    assert set(reads) <= ({"idx_q", "idx_k"} if validate == "full" else set())
    reads, warned = _indexer_reads(monkeypatch, nb, validate)
    assert "<other>" not in reads and not warned


@pytest.mark.torch
def test_beyond_the_device_ranking_the_wrapper_warns_and_copies(monkeypatch):
    """``rank=None`` ranks on the device up to 1024 blocks (``RANK_WIDTHS``); at 1025 it
    copies the scores to the host and says so with a ``HostRankWarning`` (a ``UserWarning``)
    naming the bytes; ``block_max="device"`` copies the block maxima instead."""
    from tilesim.device.msa_indexer import RANK_WIDTHS, HostRankWarning

    assert RANK_WIDTHS[-1] == 1024
    reads, warned = _indexer_reads(monkeypatch, 1024, False)
    assert reads == {} and not warned
    reads, warned = _indexer_reads(monkeypatch, 1025, False)
    assert reads == {"<other>": 4 * 1025 * 128 * 4}
    assert [w.category for w in warned] == [HostRankWarning]
    assert issubclass(HostRankWarning, UserWarning)
    assert f"({4 * 1025 * 128 * 4} bytes)" in str(warned[0].message)
    reads, warned = _indexer_reads(monkeypatch, 1025, False, block_max="device")
    assert reads == {"<other>": 4 * 1025 * 4} and f"({4 * 1025 * 4} bytes)" in str(
        warned[0].message
    )


# ----------------------------------------------------------------------------- the launch's reads
def _ready_on_host(module: str) -> tuple:
    """``READY_ON_HOST`` of ``device/<module>.py``, read from its source (the DeepSeek kernel
    module imports pypto)."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "device" / f"{module}.py"
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "READY_ON_HOST":
            return ast.literal_eval(node.value)
    return ()


#: case -> the kernel module whose ``ready_on_host`` inputs its launch copies to the host
_LAUNCH_READS = {"moe": "_moe_kernel", "dsa_packed": "_dsa_kernel", "dsa_kv_split": "_dsa_kernel",
                 "dsa_indexer_int8": "_dsa_indexer_kernel",
                 "dsa_indexer_fp8": "_dsa_indexer_kernel",
                 "dsa_indexer_prolog_int8": "_dsa_indexer_prolog_kernel"}  # fmt: skip


@pytest.mark.parametrize("case", sorted(_LAUNCH_READS))
def test_the_launchs_host_inputs_are_small_integer_inputs(case):
    """What the runtime copies at launch is among what a default call may read: the same
    small integer inputs, so ``validate=False`` saves their checks, not their copy."""
    names = set(_ready_on_host(_LAUNCH_READS[case]))
    assert names and names <= CASES[case][1], (case, names)


def _doc_rows() -> dict:
    """docs/device.md's host-copy table: ``{wrapper cell: [validate=True, full, every level]}``."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "device.md").read_text()
    table = text[text.index("| wrapper | `validate=True` (default)") :].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {r[0].lstrip("| "): [c.rstrip(" |") for c in r[1:]] for r in rows}


@pytest.mark.parametrize("case,wrapper", [
    ("moe", "`moe_grouped_gemm`"), ("dsa_packed", "`sparse_attention_antiquant`"),
    ("dsa_indexer_int8", "`dsa_indexer`"), ("dsa_indexer_prolog_int8", "`dsa_indexer_prolog`"),
])  # fmt: skip
def test_the_page_says_the_launch_reads_them_at_every_level(case, wrapper):
    row = next(v for k, v in _doc_rows().items() if k.startswith(wrapper))
    for name in _ready_on_host(_LAUNCH_READS[case]):
        assert f"`{name}`" in row[2], (wrapper, name, row[2])
