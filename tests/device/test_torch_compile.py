"""torch.compile and the device wrappers, on a CPU, no simulator.

Each wrapper is marked ``allow_in_graph``-safe (``tilesim.device.backend.graph_safe``) and
answers FakeTensor / ``meta`` inputs with an empty output of the right shape, dtype and device
without reading any data. Checked here: (1) a function calling each wrapper compiles under
``torch.compile(backend="eager", fullgraph=True)`` -- a graph break would be an error -- and
its result has the shapes the wrappers document (written out below from the argument shapes,
not taken from a run); (2) the same under a ``FakeTensorMode``; (3) importing a wrapper after
dynamo registers it with dynamo by itself. The inputs are ``meta`` tensors, which hold no data,
so any read of their values would raise.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _decode_inputs(b=2, nb=19, topk=16):
    ids = _meta(b, topk, dtype=torch.int32)
    return _meta(b, 64, 128), _meta(b, 4, nb, 128, 128), _meta(b, 4, nb, 128, 128), ids


@pytest.fixture(scope="module")
def device_api():
    import tilesim.device as d

    names = d.allow_in_graph()
    assert {"moe_grouped_gemm", "msa_indexer", "msa_indexer_scores", "msa_sparse_decode"} <= set(
        names
    )
    return d


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="eager", fullgraph=True)


def test_decode_traces_without_graph_break(device_api):
    d = device_api

    def step(q, kb, vb, ids, seq):
        out = d.msa_sparse_decode(q, kb, vb, ids, seq)
        return out.float() * 2.0  # the graph goes on after the call

    q, kb, vb, ids = _decode_inputs()
    seq = _meta(2, dtype=torch.int64)
    out = _compiled(step)(q, kb, vb, ids, seq)
    assert out.shape == (2, 64, 128) and out.dtype == torch.float32
    assert out.device.type == "meta"


def test_indexer_traces_without_graph_break(device_api):
    d = device_api
    nb = 23

    def select(q, k):
        scores = d.msa_indexer_scores(q, k, nb)
        ids = d.msa_indexer(q, k, nb, seq_len=nb * 128 - 5)
        per_head = d.msa_indexer(q, k, nb, head_reduce="none", block_max="device")
        return scores + 1.0, ids, per_head

    scores, ids, per_head = _compiled(select)(_meta(4, 128), _meta(nb * 128, 128))
    assert scores.shape == (4, nb * 128) and scores.dtype == torch.float32
    assert ids.shape == (1, 16) and ids.dtype == torch.int32
    assert per_head.shape == (4, 16) and per_head.dtype == torch.int32
    short = _compiled(lambda q, k: d.msa_indexer(q, k, 5))(_meta(4, 128), _meta(5 * 128, 128))
    assert short.shape == (1, 5)


def test_moe_traces_without_graph_break(device_api):
    from tilesim.shared.models import MoeDims

    d = device_api
    dims = MoeDims(4, 256, 128, "silu")

    def experts(x, w13, w2, cs):
        return d.moe_grouped_gemm(x, (w13, w2), cs, dims) * 0.5

    args = (_meta(21, 256), _meta(4 * 256, 256), _meta(4 * 128, 256), _meta(5, dtype=torch.int32))
    out = _compiled(experts)(*args)
    assert out.shape == (21, 256) and out.dtype == torch.bfloat16


def test_fake_tensor_mode_gives_shapes_without_data():
    from tilesim.device.moe import moe_grouped_gemm
    from tilesim.device.msa_decode import msa_sparse_decode
    from tilesim.device.msa_indexer import msa_indexer
    from tilesim.shared.models import MoeDims
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    with FakeTensorMode():
        q = torch.empty(3, 64, 128, dtype=torch.bfloat16)
        kb = torch.empty(3, 4, 40, 128, 128, dtype=torch.bfloat16)
        ids = torch.empty(3, 16, dtype=torch.int64)
        out = msa_sparse_decode(q, kb, kb, ids, torch.empty(3, dtype=torch.int32))
        sel = msa_indexer(torch.empty(4, 128, dtype=torch.bfloat16),
                          torch.empty(40 * 128, 128, dtype=torch.bfloat16), 40)  # fmt: skip
        x = torch.empty(9, 256, dtype=torch.bfloat16)
        w13 = torch.empty(2 * 256, 256, dtype=torch.bfloat16)
        w2 = torch.empty(2 * 128, 256, dtype=torch.bfloat16)
        y = moe_grouped_gemm(x, (w13, w2), torch.empty(3, dtype=torch.int32),
                             MoeDims(2, 256, 128, "silu"))  # fmt: skip
    assert is_fake(out) and out.shape == (3, 64, 128) and out.dtype == torch.bfloat16
    assert is_fake(sel) and sel.shape == (1, 16) and sel.dtype == torch.int32
    assert is_fake(y) and y.shape == (9, 256)


def test_shape_only_inputs_still_get_the_metadata_checks():
    from tilesim.device.msa_decode import msa_sparse_decode

    q, kb, vb, ids = _decode_inputs()
    with pytest.raises(TypeError, match="q: expected dtype bfloat16"):
        msa_sparse_decode(q.float(), kb, vb, ids, 300)
    with pytest.raises(ValueError, match="v_blocks: expected the shape"):
        msa_sparse_decode(q, kb, vb[:, :, :3], ids, 300)
    with pytest.raises(ValueError, match=r"block_ids: expected shape \(2, topk>=1\)"):
        msa_sparse_decode(q, kb, vb, ids[:1], 300)


def test_validate_false_skips_the_value_checks():
    """``validate=False`` reads no values: duplicate ids pass the checks (the call then stops
    at the back end, whose error is a different one)."""
    from tilesim.device.msa_decode import msa_sparse_decode

    q = torch.zeros(1, 64, 128, dtype=torch.bfloat16)
    kb = torch.zeros(1, 4, 3, 128, 128, dtype=torch.bfloat16)
    dup = torch.tensor([[2, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_ids: expected unique ids"):
        msa_sparse_decode(q, kb, kb, dup, 300)
    with pytest.raises(ValueError, match="backend='sim'"):
        msa_sparse_decode(q, kb, kb, dup, 300, validate=False)
    with pytest.raises(TypeError, match="validate: expected a bool"):
        msa_sparse_decode(q, kb, kb, dup, 300, validate=1)


def test_wrappers_imported_after_dynamo_are_registered():
    import subprocess
    import sys

    code = (
        "import torch._dynamo\n"
        "from torch._dynamo import trace_rules\n"
        "from tilesim.device import moe_grouped_gemm, msa_indexer, msa_sparse_decode\n"
        "fns = (moe_grouped_gemm, msa_indexer, msa_sparse_decode)\n"
        "assert all(trace_rules.is_callable_allowed(f) for f in fns)\n"
        "from tilesim.shared.validate import is_array\n"
        "assert not trace_rules.is_callable_allowed(is_array)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_deepseek_traces_without_graph_break(device_api):
    """Both DeepSeek wrappers under torch.compile(fullgraph=True) on ``meta`` inputs: the
    output is ``[T*nq, 512]`` BF16 (T = 2 tokens x nq 128 heads, from the argument shapes)."""
    d = device_api
    assert {"sparse_attention_antiquant", "sparse_attention_antiquant_kv_split"} <= set(
        d.allow_in_graph()
    )
    fp8 = torch.float8_e4m3fn

    def attend(qn, qr, packed, kn, kr, sc, ti, bt, acts):
        a = d.sparse_attention_antiquant(qn, qr, packed, ti, bt, acts, softmax_scale=0.04)
        b = d.sparse_attention_antiquant_kv_split(qn, qr, kn, kr, sc, ti, bt, acts,
                                                  softmax_scale=0.04)  # fmt: skip
        return a.float() + b.float()

    args = (_meta(256, 512), _meta(256, 64), _meta(1024, 656, dtype=torch.int8),
            _meta(1024, 512, dtype=fp8), _meta(1024, 64), _meta(1024, 4, dtype=torch.float32),
            _meta(2, 2048, dtype=torch.int32), _meta(2, 8, dtype=torch.int32),
            _meta(2, dtype=torch.int32))  # fmt: skip
    out = _compiled(attend)(*args)
    assert out.shape == (256, 512) and out.dtype == torch.float32 and out.device.type == "meta"


def test_deepseek_indexer_traces_without_graph_break(device_api):
    """The DeepSeek indexer wrapper under torch.compile(fullgraph=True) on ``meta`` inputs (INT8
    path, decode s1 = 2 over 2 batches): ids INT32 ``[T, topk]`` and scores FP32 ``[T,
    max_blocks * block_size]``, from the argument shapes."""
    d = device_api
    assert "dsa_indexer" in d.allow_in_graph()

    def index(q, w, qs, kc, ks, bt, lens):
        ids, scores = d.dsa_indexer(q, w, kc, bt, lens, q_scale=qs, k_scale=ks)
        return ids, scores * 2.0

    f16 = torch.float16
    args = (_meta(4, 64, 128, dtype=torch.int8), _meta(4, 64, dtype=f16), _meta(4, 64, dtype=f16),
            _meta(20, 128, 128, dtype=torch.int8), _meta(20, 128, dtype=f16),
            _meta(2, 8, dtype=torch.int32), _meta(2, dtype=torch.int32))  # fmt: skip
    ids, scores = _compiled(index)(*args)
    assert ids.shape == (4, 2048) and ids.dtype == torch.int32 and ids.device.type == "meta"
    assert scores.shape == (4, 8 * 128) and scores.dtype == torch.float32
