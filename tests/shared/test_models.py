"""Model constants against the published configs and the seeds' kernels (hicann/pypto-gym,
huggingface/transformers, deepseek-ai/DeepSeek-V3.2-Exp; docs/sources.md#model-configs)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from tilesim.shared import DEEPSEEK_V32, MINIMAX_M3, MINIMAX_M27, MoeDims, MsaConfig


def test_minimax_m27():
    m = MINIMAX_M27
    assert (m.hidden_size, m.moe_intermediate_size, m.num_experts, m.top_k) == (3072, 1536, 256, 8)
    assert m.activation == "silu" and m.msa is None and m.n_shared_experts == 0
    assert (m.num_attention_heads, m.num_kv_heads, m.head_dim) == (48, 8, 128)


def test_minimax_m3():
    m = MINIMAX_M3
    assert (m.hidden_size, m.moe_intermediate_size, m.num_experts, m.top_k) == (6144, 3072, 128, 4)
    assert m.activation == "swigluoai"
    assert (m.swiglu_alpha, m.swiglu_limit, m.swiglu_beta) == (1.702, 7.0, 1.0)
    assert (m.num_attention_heads, m.num_kv_heads, m.head_dim) == (64, 4, 128)
    assert m.routed_scaling_factor == 2.0 and m.norm_topk_prob
    assert (m.n_shared_experts, m.shared_intermediate_size) == (1, 3072)


def test_minimax_m3_msa():
    s = MINIMAX_M3.msa
    assert s == MsaConfig()
    assert (s.num_index_heads, s.index_heads_padded, s.index_dim) == (4, 16, 128)
    assert (s.block_size, s.topk_blocks, s.local_blocks) == (128, 16, 1)
    assert (s.num_q_heads, s.num_kv_heads, s.head_dim, s.group) == (64, 4, 128, 16)
    assert s.softmax_scale == 0.08838834764831843  # the seeds' MSA decode SCALE, 1/sqrt(128)
    assert np.float32(s.softmax_scale) == np.float32(0.088388346)
    assert (s.decode_mask_neg, s.prefill_mask_neg) == (-3.0e38, -1.0e9)


def test_deepseek_v32_sparse_mla():
    d = DEEPSEEK_V32
    assert (d.kv_lora_rank, d.qk_rope_dim, d.num_q_heads, d.num_kv_heads) == (512, 64, 128, 1)
    assert (d.topk, d.block_size, d.quant_group, d.num_scales, d.head_dim) == (
        2048,
        128,
        128,
        4,
        576,
    )
    assert (d.fp8_max, d.int8_max) == (448.0, 127.0)
    assert d.test_softmax_scale == 0.041666666666666664  # 576^-0.5 = 1/24
    # DeepSeek-V3.2-Exp inference/model.py: 192^-0.5 * mscale^2,
    # mscale = 0.1 * ln(40) + 1 = 1.36889 -> 0.135234
    assert round(0.1 * math.log(40) + 1, 5) == 1.36889
    assert round(d.model_softmax_scale, 6) == 0.135234


def test_moe_dims_from_models():
    d = MINIMAX_M3.moe_dims(num_experts=4)
    assert d == MoeDims(4, 6144, 3072, "swigluoai", 1.702, 7.0, 1.0, "halves")
    assert MINIMAX_M27.moe_dims().num_experts == 256
    assert MINIMAX_M27.moe_dims().activation == "silu"


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_experts": 0}, r"MoeDims.num_experts: expected an int in \[1, 2147483647\], got 0"),
        ({"activation": "gelu"}, "MoeDims.activation: expected one of"),
        ({"gate_up_layout": "mixed"}, "MoeDims.gate_up_layout"),
        ({"alpha": float("nan")}, "MoeDims.alpha: expected a finite number, got nan"),
        ({"limit": 0.0}, "MoeDims.limit: expected a number > 0, got 0.0"),
    ],
)
def test_moe_dims_validation(kwargs, pattern):
    base = {"num_experts": 2, "hidden_size": 16, "intermediate_size": 8}
    with pytest.raises(ValueError, match=pattern):
        MoeDims(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"hidden_size": 3072.0}, "MoeDims.hidden_size: expected an int, got float 3072.0"),
        ({"intermediate_size": True}, "MoeDims.intermediate_size: expected an int, got bool"),
    ],
)
def test_moe_dims_wrong_types(kwargs, pattern):
    base = {"num_experts": 2, "hidden_size": 16, "intermediate_size": 8}
    with pytest.raises(TypeError, match=pattern):
        MoeDims(**{**base, **kwargs})


def test_constants_are_frozen():
    for obj in (MINIMAX_M27, MINIMAX_M3, DEEPSEEK_V32, MINIMAX_M3.msa, MoeDims(1, 16, 16)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.__setattr__("name" if hasattr(obj, "name") else "block_size", 1)


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: dataclasses.replace(MINIMAX_M27, num_kv_heads=7), "num_attention_heads"),
        (
            lambda: dataclasses.replace(MINIMAX_M3, shared_intermediate_size=0),
            "shared_intermediate_size",
        ),  # fmt: skip
        (
            lambda: dataclasses.replace(MINIMAX_M27, shared_intermediate_size=64),
            "shared_intermediate_size",
        ),  # fmt: skip
        (lambda: dataclasses.replace(DEEPSEEK_V32, num_kv_heads=3), "num_q_heads"),
        (lambda: MsaConfig(index_heads_padded=2), "index_heads_padded"),
        (lambda: MsaConfig(index_heads_padded=17), "index_heads_padded"),
    ],
)
def test_inconsistent_head_and_expert_counts_are_refused(build, words):
    """Query heads that the KV heads do not divide, a shared expert without a width (or a
    width without one), and index heads padded below their count or off the cube's 16-row
    alignment are ``ValueError`` naming the field, never a model that a kernel misreads."""
    with pytest.raises(ValueError, match=words):
        build()
