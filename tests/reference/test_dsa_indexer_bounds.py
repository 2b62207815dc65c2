"""Sizes and values of the indexer and the decode step that must not pass the checks and fail
late (``MemoryError``, an ``AttributeError``, a NaN after the work).

Each is a ``ValueError`` / ``TypeError`` naming the argument(s), the expected and the
actual value, raised before any work or allocation:

* ``topk`` above ``MAX_POSITIONS`` (2**24) and a score width ``max_blocks * block_size`` above
  it (golden, decode step, device wrapper: one rule in ``tilesim.shared.dsa_indexer``); the
  outputs' element counts under ``MAX_ELEMENTS``;
* INT8 ``FP16(q_scale * weights)`` overflowing to inf (golden always; the wrapper under
  ``validate="full"``);
* the decode step checks its attention half (``nq``, queries, latent cache, ``softmax_scale``,
  ``tiling``, every visible block inside the latent cache, ``layout``) before the indexer runs,
  naming its own arguments (never ``topk_indices``);
* the device wrapper given a ``meta`` tensor with a NumPy ``q``: a ``TypeError`` naming ``q``.

"No work" is proven by a work marker: the golden's scoring loop
(``reference.dsa_indexer.dsa_indexer_scores``) replaced by a function that fails the test.
"""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest
from tilesim.reference import dsa_attention_step_make_case, dsa_indexer_make_case
from tilesim.shared.dsa_indexer import MAX_POSITIONS
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import MAX_ELEMENTS

#: the modules (``tilesim.reference.dsa_indexer`` the attribute is the function)
ref_indexer = importlib.import_module("tilesim.reference.dsa_indexer")
ref_step = importlib.import_module("tilesim.reference.dsa_attention_step")
BS = 16


def _case(op="dsa_indexer", **kw):
    """An indexer case, or a decode-step case (the layer step's family builds those)."""
    args = dict(seed=1, seq_lens=(37, 20), block_size=BS, topk=32, s1=2)
    args.update(kw)
    build = dsa_attention_step_make_case if op == "dsa_decode_step" else dsa_indexer_make_case
    return build(None, op=op, **args)


def _args(case, **over):
    return {**case["inputs"], **case["params"], **over}


@pytest.fixture
def no_work(monkeypatch):
    """The golden's scoring loop must not be entered (both the indexer and the step use it)."""

    def fail(*a, **k):
        raise AssertionError("the indexer's work started")

    monkeypatch.setattr(ref_indexer, "dsa_indexer_scores", fail)


def _wide_table(case, cols: int):
    """The case's block table widened to ``cols`` columns of -1 (never read)."""
    bt = case["inputs"]["block_table"]
    wide = np.full((bt.shape[0], cols), -1, dtype=bt.dtype)
    wide[:, : bt.shape[1]] = bt
    return wide


# ----------------------------------------------------------------------------- topk / width
TOPK_MSG = r"^topk: expected an int in \[1, 16777216\] \(MAX_POSITIONS.*\), got {}$"


@pytest.mark.parametrize("topk", [2**31 - 1, 2**31 - 32, MAX_POSITIONS + 1])
def test_golden_refuses_a_huge_topk_by_name(no_work, topk):
    case = _case()
    with pytest.raises(ValueError, match=TOPK_MSG.format(topk)):
        ref_indexer.dsa_indexer(**_args(case, topk=topk))


def test_golden_refuses_a_huge_topk_before_any_allocation(monkeypatch):
    """``np.full`` / ``np.empty`` of the outputs is never reached."""
    seen = []
    real = np.full

    def full(shape, *a, **k):
        seen.append(shape)
        return real(shape, *a, **k)

    monkeypatch.setattr(np, "full", full)
    case = _case()
    seen.clear()
    with pytest.raises(ValueError, match="^topk: "):
        ref_indexer.dsa_indexer(**_args(case, topk=2**31 - 1))
    assert not any(isinstance(s, tuple) and 2**31 - 1 in s for s in seen), seen


def test_step_refuses_a_huge_topk_by_name(no_work):
    case = _case(op="dsa_decode_step")
    with pytest.raises(ValueError, match=TOPK_MSG.format(2**31 - 1)):
        ref_step.dsa_decode_step(**_args(case, topk=2**31 - 1))


def test_topk_at_the_bound_passes_the_meta_checks():
    from tilesim.shared.dsa_indexer import check_meta

    case = _case()
    a = check_meta(**{k: v for k, v in _args(case, topk=MAX_POSITIONS).items()
                      if k not in ("n_blocks",)})  # fmt: skip
    assert a.topk == MAX_POSITIONS


def test_golden_refuses_a_wide_table_of_unread_columns(no_work):
    """2**18 + 2 never-read columns at block_size 4096: 2**30 + 8192 score columns."""
    case = _case(block_size=4096, seq_lens=(37, 20))
    cols = 2**18 + 2
    width = cols * 4096
    msg = (rf"^block_table, block_size: expected max_blocks \* block_size <= {MAX_POSITIONS} "
           rf"score columns \(MAX_POSITIONS.*\), got {cols} \* 4096 = {width}$")  # fmt: skip
    with pytest.raises(ValueError, match=msg):
        ref_indexer.dsa_indexer(**_args(case, block_table=_wide_table(case, cols)))


def test_scores_element_count_is_bounded_with_the_rows(no_work):
    """Width at MAX_POSITIONS passes alone; 512 rows of it exceed MAX_ELEMENTS (prefill)."""
    from tilesim.shared.dsa_indexer import check_meta

    case = _case(block_size=BS, seq_lens=(37, 20))
    inp = case["inputs"]
    cols = MAX_POSITIONS // BS
    a = check_meta(inp["q"], inp["weights"], inp["k_cache"], _wide_table(case, cols),
                   inp["seq_lens"], q_scale=inp["q_scale"], k_scale=inp["k_scale"],
                   q_lens=np.array([2, 2]), block_size=BS)  # fmt: skip
    assert a.max_blocks * a.block_size == MAX_POSITIONS
    rows = 2 * MAX_ELEMENTS // MAX_POSITIONS  # 512 rows of 2**24 columns = 2**33 elements
    q = np.broadcast_to(inp["q"][:1], (rows, 64, 128))
    w = np.broadcast_to(inp["weights"][:1], (rows, 64))
    count = rows * MAX_POSITIONS
    msg = (
        rf"^q, block_table, block_size: expected at most {MAX_ELEMENTS} elements in the "
        rf"\[T, S\] scores, got shape \({rows}, {MAX_POSITIONS}\) \({count} elements\)$"
    )
    with pytest.raises(ValueError, match=msg):
        check_meta(q, w, inp["k_cache"], _wide_table(case, cols), inp["seq_lens"],
                   q_scale=w, k_scale=inp["k_scale"], q_lens=np.array([rows - 1, 1]),
                   block_size=BS)  # fmt: skip


# ----------------------------------------------------------------------------- INT8 factor
def _overflowing(case):
    """q_scale[1, 7] * weights[1, 7] = 300 * 300 = 90000 > 65504 (FP16 max)."""
    qs, w = case["inputs"]["q_scale"].copy(), case["inputs"]["weights"].copy()
    qs[1, 7], w[1, 7] = 300.0, 300.0
    return {"q_scale": qs, "weights": w}


FACTOR_MSG = (r"^weights, q_scale: expected FP16\(q_scale \* weights\) finite \(\|product\| <= "
              r"65504: int8_order='gym' rounds it to FP16\), got q_scale\[1, 7\] = 300\.0 \* "
              r"weights\[1, 7\] = 300\.0 \(overflows to inf\)$")  # fmt: skip


def test_golden_refuses_an_overflowing_int8_factor(no_work):
    case = _case()
    before = {k: v.copy() for k, v in case["inputs"].items()}
    with pytest.raises(ValueError, match=FACTOR_MSG):
        ref_indexer.dsa_indexer(**_args(case, **_overflowing(case)))
    for k, v in before.items():
        np.testing.assert_array_equal(case["inputs"][k], v)


def test_step_refuses_an_overflowing_int8_factor(no_work):
    case = _case(op="dsa_decode_step")
    with pytest.raises(ValueError, match=FACTOR_MSG):
        ref_step.dsa_decode_step(**_args(case, **_overflowing(case)))


def test_largest_finite_factor_passes():
    """256 * 255.875 = 65504: the largest finite FP16, accepted (and scored)."""
    case = _case()
    qs, w = case["inputs"]["q_scale"].copy(), case["inputs"]["weights"].copy()
    qs[1, 7], w[1, 7] = 256.0, 255.875
    ids, scores = ref_indexer.dsa_indexer(**_args(case, q_scale=qs, weights=w))
    assert ids.shape == (4, 32)


# ----------------------------------------------------------------------------- the decode step
def _bf16_rows(case, name, rows):
    a = case["inputs"][name]
    return np.concatenate([a, a[: rows - a.shape[0]]]) if rows > a.shape[0] else a[:rows]


PREFILL = SaTileShapeConfig.preset("prefill")  # per_tile softmax: no split-KV
STEP_BAD = [
    ("softmax_scale", dict(softmax_scale=float("nan")), ValueError, r"^softmax_scale: expected"),
    ("softmax_scale type", dict(softmax_scale="0.1"), TypeError, r"^softmax_scale: expected"),
    ("tiling", dict(tiling="decode"), TypeError, r"^tiling: expected"),
    ("tiling kv_splits", dict(tiling=dataclasses.replace(PREFILL, kv_splits=2)),
     ValueError, r"^tiling.kv_splits: expected"),
    ("nq zero", dict(nq=0), ValueError, r"^nq: expected"),
    ("nq mismatch", dict(nq=64), ValueError,
     r"^query_nope: expected T\*nq = 4\*64 = 256 rows \(T = the 4 query rows of q, nq heads "
     r"each\), got 512$"),
    ("layout", dict(layout="paged"), ValueError,
     r"^layout: expected one of \('pypto', 'flashmla', 'kv_split'\), got 'paged'$"),
]  # fmt: skip


@pytest.mark.parametrize("what, over, exc, match", STEP_BAD, ids=[b[0] for b in STEP_BAD])
def test_step_checks_the_attention_half_before_any_work(no_work, what, over, exc, match):
    case = _case(op="dsa_decode_step")
    assert case["params"]["nq"] == 128
    with pytest.raises(exc, match=match) as err:
        ref_step.dsa_decode_step(**_args(case, **over))
    assert "topk_indices" not in str(err.value)


def test_step_names_query_shapes_not_topk_indices(no_work):
    """Query rows that are a multiple of B*nq but not T*nq: the attention's own check would
    blame ``topk_indices``; the step names ``query_nope``."""
    case = _case(op="dsa_decode_step")
    rows = 2 * 128  # B*nq: s1 = 1 for the attention, T = 4 for the indexer
    over = {n: _bf16_rows(case, n, rows) for n in ("query_nope", "query_rope")}
    with pytest.raises(ValueError, match=r"^query_nope: expected T\*nq = 4\*128 = 512 rows"):
        ref_step.dsa_decode_step(**_args(case, **over))


def test_step_checks_query_rope_and_kn_scales_before_any_work(no_work):
    case = _case(op="dsa_decode_step", layout="kv_split")
    with pytest.raises(TypeError, match=r"^kn_scales: expected dtype float32"):
        ref_step.dsa_decode_step(**_args(case, kn_scales=case["inputs"]["kn_scales"]
                                         .astype(np.float16)))  # fmt: skip
    bad_rope = case["inputs"]["query_rope"][:, :32]
    with pytest.raises(ValueError, match=r"^query_rope: expected shape"):
        ref_step.dsa_decode_step(**_args(case, query_rope=bad_rope))


def test_step_names_a_visible_block_outside_the_latent_cache(no_work):
    """A latent cache shorter than the index cache: the visible block mapped past its end fails
    before the indexer runs (the attention would have failed after it)."""
    case = _case(op="dsa_decode_step")
    bt, lens = case["inputs"]["block_table"], case["inputs"]["seq_lens"]
    visible = [(b, j) for b in range(bt.shape[0]) for j in range(-(-int(lens[b]) // BS))]
    top = max(int(bt[b, j]) for b, j in visible)
    b, j = next((b, j) for b, j in visible if int(bt[b, j]) == top)  # the first one named
    short = case["inputs"]["nope_cache"][: top * BS]  # ends where block `top` starts
    last = min(BS, int(lens[b]) - j * BS) - 1
    msg = (
        rf"^block_table\[{b}, {j}\]: expected a block whose visible tokens lie inside the "
        rf"latent cache \(nope_cache: {top * BS} rows; seq_lens\[{b}\] = {int(lens[b])}\), got "
        rf"{top} \(rows {top * BS}\.\.{top * BS + last}\)$"
    )
    with pytest.raises(ValueError, match=msg):
        ref_step.dsa_decode_step(**_args(case, nope_cache=short))


@pytest.mark.parametrize("layout, give, names", [
    ("kv_split", dict(nope_cache=np.zeros((1, 656), np.uint8)), "nope_cache"),
    ("pypto", dict(kn_quant=np.zeros((1, 512), np.int8)), "kn_quant"),
])  # fmt: skip
def test_step_cache_arguments_name_the_layout(no_work, layout, give, names):
    """A cache the layout does not read, given: a ValueError naming it and the layout."""
    case = _case(op="dsa_decode_step", layout=layout)
    with pytest.raises(ValueError, match=rf"^{names}: expected None \(layout='{layout}' reads"):
        ref_step.dsa_decode_step(**_args(case, **give))


def test_step_on_valid_input_is_the_two_goldens():
    """Checks moved, nothing else: the step's outputs are the indexer's and the attention's."""
    case = _case(op="dsa_decode_step")
    got = ref_step.dsa_decode_step(**_args(case))
    kw = _args(case)
    ind = {k: kw[k] for k in ("q", "weights", "k_cache", "block_table", "seq_lens", "q_scale",
                              "k_scale", "path", "int8_order", "topk", "block_size")}  # fmt: skip
    ids, scores = ref_indexer.dsa_indexer(**ind)
    np.testing.assert_array_equal(got["topk_indices"], ids)
    assert got["scores"].tobytes() == scores.tobytes()
    out = ref_step.step_attention(ids, **ref_step.attention_arguments(kw))
    assert got["out"].tobytes() == out.tobytes()


# ----------------------------------------------------------------------------- device wrapper
def test_device_wrapper_refuses_a_huge_topk_before_launch():
    pytest.importorskip("torch")
    from tilesim.device import dsa_indexer as dev

    case = _case()
    with pytest.raises(ValueError, match=TOPK_MSG.format(2**31 - 32)):
        dev(**_args(case, topk=2**31 - 32), backend="sim")


def test_device_wrapper_full_validation_refuses_the_overflowing_factor(monkeypatch):
    pytest.importorskip("torch")
    from tilesim.device import backend
    from tilesim.device import dsa_indexer as dev

    class Launched(Exception):
        pass

    def resolve(*a, **k):
        raise Launched

    monkeypatch.setattr(backend, "resolve", resolve)
    case = _case()
    bad = _args(case, **_overflowing(case))
    with pytest.raises(ValueError, match=FACTOR_MSG):
        dev(**bad, backend="sim", validate="full")
    with pytest.raises(Launched):  # the default reads no float data: it reaches the launch
        dev(**bad, backend="sim")


@pytest.mark.parametrize("meta_arg", ["weights", "k_cache", "block_table", "seq_lens",
                                      "q_scale", "k_scale"])  # fmt: skip
def test_device_wrapper_meta_with_numpy_q_is_a_named_type_error(meta_arg):
    torch = pytest.importorskip("torch")
    from tilesim.device import dsa_indexer as dev
    from tilesim.shared.interop import to_torch

    case = _case()
    kw = _args(case)
    kw[meta_arg] = to_torch(kw[meta_arg]).to("meta")
    msg = re.escape(
        f"q: expected a torch tensor (a meta / FakeTensor {meta_arg} makes this a "
        "shape-only call, whose outputs are empty tensors like q), got ndarray"
    )
    with pytest.raises(TypeError, match=f"^{msg}$"):
        dev(**kw, backend="sim")
    # all torch, one meta: the shape-only answer (empty outputs on q's device)
    tkw = {k: to_torch(v) if isinstance(v, np.ndarray) else v for k, v in _args(case).items()}
    tkw[meta_arg] = tkw[meta_arg].to("meta")
    ids, scores = dev(**tkw, backend="sim")
    assert ids.shape == (4, 32) and ids.dtype == torch.int32
    assert scores.shape == (4, case["inputs"]["block_table"].shape[1] * BS)
