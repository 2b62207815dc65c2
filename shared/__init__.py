"""tilesim.shared — the single source of model constants, tiling configs and byte layouts.

Both :mod:`tilesim.reference` (NumPy goldens) and :mod:`tilesim.device` (PyPTO kernels) read
their constants, tile shapes and layouts from here. Needs only numpy and ml_dtypes.
"""

from tilesim.shared.casts import (
    FP8_E4M3_MAX,
    INT8_QMAX,
    to_bf16,
    to_fp8_e4m3,
    widen_to_fp32,
)
from tilesim.shared.dsv32_checkpoint import (
    Dsv32Dims,
    convert_dsv32_weights,
    dsv32_weights_fp8,
    dsv32_weights_int8,
)
from tilesim.shared.layouts.index_cache import pack_fp8_pages, unpack_fp8_pages
from tilesim.shared.layouts.mla_cache import (
    FLASHMLA_ROW_BYTES,
    PYPTO_ROW_BYTES,
    PYPTO_UB_PITCH,
    MlaCacheRows,
    convert_cache_layout,
    pack_flashmla_rows,
    pack_kv_split,
    pack_pypto_rows,
    unpack_flashmla_rows,
    unpack_kv_split,
    unpack_pypto_rows,
)
from tilesim.shared.models import (
    DEEPSEEK_V32,
    MINIMAX_M3,
    MINIMAX_M27,
    DeepSeekV32Sparse,
    MiniMaxModel,
    MoeDims,
    MsaConfig,
)
from tilesim.shared.quant import (
    dequantize_latent,
    quantize_index_fp8,
    quantize_index_int8,
    quantize_latent_fp8,
    quantize_latent_fp8_ue8m0,
    quantize_latent_int8,
)
from tilesim.shared.tiling import (
    MoeTiling,
    MsaTiling,
    SaTileShapeConfig,
    loop_unroll_chunks,
)
from tilesim.shared.weights import convert_minimax_weights, unconvert_minimax_weights

__all__ = [
    "DEEPSEEK_V32",
    "FLASHMLA_ROW_BYTES",
    "FP8_E4M3_MAX",
    "INT8_QMAX",
    "MINIMAX_M27",
    "MINIMAX_M3",
    "PYPTO_ROW_BYTES",
    "PYPTO_UB_PITCH",
    "DeepSeekV32Sparse",
    "Dsv32Dims",
    "MiniMaxModel",
    "MlaCacheRows",
    "MoeDims",
    "MoeTiling",
    "MsaConfig",
    "MsaTiling",
    "SaTileShapeConfig",
    "convert_cache_layout",
    "convert_dsv32_weights",
    "convert_minimax_weights",
    "dequantize_latent",
    "dsv32_weights_fp8",
    "dsv32_weights_int8",
    "loop_unroll_chunks",
    "pack_flashmla_rows",
    "pack_fp8_pages",
    "pack_kv_split",
    "pack_pypto_rows",
    "quantize_index_fp8",
    "quantize_index_int8",
    "quantize_latent_fp8",
    "quantize_latent_fp8_ue8m0",
    "quantize_latent_int8",
    "to_bf16",
    "to_fp8_e4m3",
    "unconvert_minimax_weights",
    "unpack_flashmla_rows",
    "unpack_fp8_pages",
    "unpack_kv_split",
    "unpack_pypto_rows",
    "widen_to_fp32",
]
