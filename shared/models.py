"""Model constants of the three target models (frozen dataclasses).

Values: the MiniMax-M2 config of ``huggingface/transformers`` (M2.7 shares it), the M3
configuration and kernels of ``hicann/pypto-gym`` and DeepSeek-V3.2's
``deepseek-ai/DeepSeek-V3.2-Exp:inference/config_671B_v3.2.json``; each source and value is
listed in docs/sources.md (sections "Model configs", "MSA sparse decode", "MSA main branch",
"DeepSeek sparse attention").

Every dataclass checks its fields on construction with :mod:`tilesim.shared.validate`
(``TypeError`` for a wrong type, ``ValueError`` for a wrong value, the field named as
``Class.field``); integer fields are stored as Python ints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tilesim.shared.validate import (
    INT32_MAX,
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_int,
    check_str,
)

ACTIVATIONS = ("silu", "swigluoai")
GATE_UP_LAYOUTS = ("halves", "interleaved")


def _check_fields(obj, *, ints=(), zero_ok=(), floats=(), positive=()) -> None:
    """Check (and store as ``int``) the integer fields ``ints`` (>= 1, or >= 0 for the names in
    ``zero_ok``; at most 2**31 - 1) and the real, finite, FP32-representable ``floats``
    (> 0 for the names in ``positive``) of the frozen dataclass ``obj``."""
    cls = type(obj).__name__
    for name in ints:
        lo = 0 if name in zero_ok else 1
        v = check_int(getattr(obj, name), f"{cls}.{name}", lo=lo, hi=INT32_MAX)
        object.__setattr__(obj, name, v)
    for name in floats:
        check_float(getattr(obj, name), f"{cls}.{name}", positive=name in positive, fp32=True)


def _check_multiple(obj, name: str, of: str) -> None:
    """``ValueError`` unless field ``name`` of ``obj`` is a multiple of its field ``of``."""
    v, m = getattr(obj, name), getattr(obj, of)
    if v % m:
        cls = type(obj).__name__
        raise ValueError(f"{cls}.{name}: expected a multiple of {of} ({m}), got {v}")


@dataclass(frozen=True)
class MoeDims:
    """Shape and activation of one grouped-GEMM call (the kernel's ``MoeDims``).

    ``activation`` is ``"silu"`` (M2.7: SiLU(gate)*up) or ``"swigluoai"`` (M3: clamped GLU with
    ``alpha``, ``limit``, ``beta``). ``gate_up_layout`` says how the ``2I`` columns of mm1 split
    into gate and up: ``"halves"`` ([gate | up], MiniMax) or ``"interleaved"`` (even = gate,
    odd = up, GPT-OSS style).
    """

    num_experts: int
    hidden_size: int
    intermediate_size: int
    activation: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0
    beta: float = 1.0
    gate_up_layout: str = "halves"

    def __post_init__(self) -> None:
        _check_fields(
            self,
            ints=("num_experts", "hidden_size", "intermediate_size"),
            floats=("alpha", "limit", "beta"),
            positive=("limit",),
        )
        check_choice(self.activation, "MoeDims.activation", ACTIVATIONS)
        check_choice(self.gate_up_layout, "MoeDims.gate_up_layout", GATE_UP_LAYOUTS)


@dataclass(frozen=True)
class MsaConfig:
    """MiniMax-M3 sparse attention (MSA) constants."""

    num_index_heads: int = 4  # sparse_num_index_heads
    index_heads_padded: int = 16  # cube M must be 16-aligned
    index_dim: int = 128  # sparse_index_dim
    block_size: int = 128  # sparse_block_size
    topk_blocks: int = 16  # sparse_topk_blocks
    local_blocks: int = 1  # sparse_local_block
    num_q_heads: int = 64
    num_kv_heads: int = 4
    head_dim: int = 128
    decode_mask_neg: float = -3.0e38  # LARGE_NEG of the decode kernel
    prefill_mask_neg: float = -1.0e9  # MASK_NEG of the main-branch block mask

    def __post_init__(self) -> None:
        ints = tuple(f.name for f in fields(self) if f.type == "int")
        negs = ("decode_mask_neg", "prefill_mask_neg")
        _check_fields(self, ints=ints, zero_ok=("local_blocks",), floats=negs)
        for name in negs:
            v = getattr(self, name)
            if not v < 0:
                raise ValueError(f"MsaConfig.{name}: expected a number < 0, got {v!r}")
        _check_multiple(self, "num_q_heads", "num_kv_heads")
        p, n = self.index_heads_padded, self.num_index_heads
        if p < n or p % 16:
            raise ValueError(f"MsaConfig.index_heads_padded: expected a multiple of 16 (the cube's "
                             f"M alignment) >= num_index_heads ({n}), got {p}")  # fmt: skip

    @property
    def group(self) -> int:
        """Query heads per KV head (16)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def softmax_scale(self) -> float:
        """``1 / sqrt(head_dim)`` = 0.08838834764831843 (the seeds' SCALE; ``128 ** -0.5`` would
        give 0.08838834764831845, the same FP32 value 0.088388346)."""
        return 1.0 / math.sqrt(self.head_dim)


@dataclass(frozen=True)
class MiniMaxModel:
    """The MoE and attention constants of a MiniMax text backbone."""

    name: str
    hidden_size: int
    moe_intermediate_size: int
    num_experts: int
    top_k: int
    activation: str
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    swiglu_beta: float = 1.0
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False
    n_shared_experts: int = 0
    shared_intermediate_size: int = 0
    msa: MsaConfig | None = None

    def __post_init__(self) -> None:
        check_str(self.name, "MiniMaxModel.name")
        ints = tuple(f.name for f in fields(self) if f.type == "int")
        floats = tuple(f.name for f in fields(self) if f.type == "float")
        zero_ok = ("n_shared_experts", "shared_intermediate_size")
        _check_fields(self, ints=ints, zero_ok=zero_ok, floats=floats, positive=("swiglu_limit",))
        check_choice(self.activation, "MiniMaxModel.activation", ACTIVATIONS)
        check_bool(self.norm_topk_prob, "MiniMaxModel.norm_topk_prob")
        check_instance(self.msa, "MiniMaxModel.msa", MsaConfig, optional=True)
        if self.top_k > self.num_experts:
            raise ValueError(
                f"MiniMaxModel.top_k: expected at most num_experts ({self.num_experts}), "
                f"got {self.top_k}"
            )
        _check_multiple(self, "num_attention_heads", "num_kv_heads")
        if (self.n_shared_experts == 0) != (self.shared_intermediate_size == 0):
            raise ValueError(
                f"MiniMaxModel.shared_intermediate_size: expected 0 exactly when "
                f"n_shared_experts is 0 ({self.n_shared_experts}), got "
                f"{self.shared_intermediate_size}"
            )

    def moe_dims(self, num_experts: int | None = None) -> MoeDims:
        """The :class:`MoeDims` of this model (optionally with fewer experts, as in tests)."""
        return MoeDims(
            num_experts=self.num_experts if num_experts is None else num_experts,
            hidden_size=self.hidden_size,
            intermediate_size=self.moe_intermediate_size,
            activation=self.activation,
            alpha=self.swiglu_alpha,
            limit=self.swiglu_limit,
            beta=self.swiglu_beta,
        )


#: The two MiniMax backbones side by side: field -> (M2.7, M3). Sources: the MiniMax-M2 config of
#: huggingface/transformers and the seeds' MoE/MSA kernels and M3 configuration
#: (docs/sources.md#model-configs).
_MINIMAX_TABLE: dict[str, tuple] = {
    "name": ("MiniMax-M2.7", "MiniMax-M3"),
    "hidden_size": (3072, 6144),
    "moe_intermediate_size": (1536, 3072),
    "num_experts": (256, 128),
    "top_k": (8, 4),
    "activation": ("silu", "swigluoai"),
    "num_attention_heads": (48, 64),
    "num_kv_heads": (8, 4),
    "head_dim": (128, 128),
    "routed_scaling_factor": (1.0, 2.0),
    "norm_topk_prob": (False, True),
    "n_shared_experts": (0, 1),
    "shared_intermediate_size": (0, 3072),
    "msa": (None, MsaConfig()),
}

MINIMAX_M27, MINIMAX_M3 = (
    MiniMaxModel(**{field: values[i] for field, values in _MINIMAX_TABLE.items()}) for i in range(2)
)


@dataclass(frozen=True)
class DeepSeekV32Sparse:
    """DeepSeek-V3.2 absorbed sparse MLA (MQA over the latent) constants."""

    kv_lora_rank: int = 512  # "nope" latent width, also d_v
    qk_rope_dim: int = 64
    num_q_heads: int = 128
    num_kv_heads: int = 1
    topk: int = 2048
    block_size: int = 128
    quant_group: int = 128  # one FP32 scale per 128 latent values
    fp8_max: float = 448.0
    int8_max: float = 127.0

    def __post_init__(self) -> None:
        ints = tuple(f.name for f in fields(self) if f.type == "int")
        floats = ("fp8_max", "int8_max")
        _check_fields(self, ints=ints, floats=floats, positive=floats)
        _check_multiple(self, "kv_lora_rank", "quant_group")
        _check_multiple(self, "num_q_heads", "num_kv_heads")

    @property
    def head_dim(self) -> int:
        """576 = 512 + 64."""
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def num_scales(self) -> int:
        """4 FP32 scales per token row."""
        return self.kv_lora_rank // self.quant_group

    @property
    def test_softmax_scale(self) -> float:
        """576^-0.5 = 1/24, the synthetic scale of the PyPTO tests."""
        return self.head_dim**-0.5

    @property
    def model_softmax_scale(self) -> float:
        """192^-0.5 * mscale^2 with YaRN mscale = 0.1*ln(40)+1 (= 0.135234...)."""
        mscale = 0.1 * math.log(40.0) + 1.0
        return 192**-0.5 * mscale * mscale


DEEPSEEK_V32 = DeepSeekV32Sparse()
