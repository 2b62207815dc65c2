"""Ascend SoC descriptions and per-SoC tile defaults, read by the kernels and the reports.

Numbers come from the platform ``.ini`` files (``hicann/pypto``'s
``framework/src/platform/parser/simulation_platform/platform_config/`` and CANN's
``Ascend910B2C.ini``) and Huawei's announced 950 figures; see docs/sources.md#ascend-socs:

=========  ========  =====  ====  =========  =========  ==========  ===========
name       arch      AIC    GHz   UB bytes   HBM TB/s   BF16 TFLOP  FP8 TFLOP
=========  ========  =====  ====  =========  =========  ==========  ===========
``910b``   DAV_2201  24     1.80  196608     1.6        353.9       --
``950``    DAV_3510  28     1.65  253952     1.6        378.5       757.0
``950dt``  DAV_3510  28     1.65  253952     4.0        378.5       757.0
=========  ========  =====  ====  =========  =========  ==========  ===========

``950`` is the Ascend 950PR as PyPTO's CPU path compiles for it (``Ascend950PR_9579``, 28 AI
cores in that ini; the 958x SKUs have 32). ``950dt`` differs only in HBM bandwidth (HiZQ 2.0)
and is here for roofline columns; it compiles exactly like ``950``. Cube peaks are
``cores x 16x16x16 MACs x 2 x clock`` (FP8 doubles K to 32).

Per-SoC tile defaults (:func:`moe_vec_tile`) follow the UB budgets: see
``docs/device.md#soc-descriptions-and-tile-defaults``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilesim.shared.env import env_int, env_mapping, env_text
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
)

#: the cost model of PyPTO 0.2.0 converts cycles to microseconds at this rate for every SoC
COST_MODEL_CYCLES_PER_US = 1800.0


@dataclass(frozen=True)
class SocSpec:
    """One Ascend target: what the compiler targets and the ceilings a report compares against."""

    name: str
    arch: str  # PyPTO's npuarch string
    soc_version: str  # the platform ini's SoC_version
    aic_cores: int
    aiv_cores: int
    cube_ghz: float
    ub_bytes: int  # per AIV core
    l1_bytes: int
    l0c_bytes: int
    hbm_tbps: float
    fp8: bool  # native FP8 E4M3 cube

    def __post_init__(self) -> None:
        for name in ("name", "arch", "soc_version"):
            check_str(getattr(self, name), f"SocSpec.{name}")
        for name in ("aic_cores", "aiv_cores", "ub_bytes", "l1_bytes", "l0c_bytes"):
            object.__setattr__(self, name, check_int(getattr(self, name), f"SocSpec.{name}", lo=1))
        for name in ("cube_ghz", "hbm_tbps"):
            check_float(getattr(self, name), f"SocSpec.{name}", positive=True)
        object.__setattr__(self, "fp8", check_bool(self.fp8, "SocSpec.fp8"))

    @property
    def bf16_tflops(self) -> float:
        """Dense BF16 cube peak in TFLOP/s (16x16x16 MACs per AIC per cycle)."""
        return self.aic_cores * 16 * 16 * 16 * 2 * self.cube_ghz / 1e3

    @property
    def fp8_tflops(self) -> float | None:
        """FP8 E4M3 cube peak in TFLOP/s (16x32x16), ``None`` where FP8 is not native."""
        return 2 * self.bf16_tflops if self.fp8 else None

    def hbm_bound_us(self, nbytes: float) -> float:
        """Time to move ``nbytes`` through HBM at the peak bandwidth, in microseconds."""
        nbytes = _check_amount(nbytes, "nbytes")
        return nbytes / (self.hbm_tbps * 1e12) * 1e6

    def cube_bound_us(self, flops: float, dtype: str = "bf16") -> float:
        """Time to do ``flops`` (2 per MAC) at the cube peak of ``dtype`` ('bf16' or 'fp8')."""
        flops = _check_amount(flops, "flops")
        check_choice(dtype, "dtype", ("bf16", "fp8"))
        if dtype == "fp8" and not self.fp8:
            raise ValueError(f"dtype: expected 'bf16' ({self.name} has no FP8 cube), got 'fp8'")
        peak = self.fp8_tflops if dtype == "fp8" else self.bf16_tflops
        return flops / (peak * 1e12) * 1e6


def _check_amount(v, name: str) -> float:
    """A finite count (bytes, FLOPs) >= 0 -> float; bool, str, NaN, inf, negatives refused."""
    f = check_float(v, name)
    if f < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {v!r}")
    return f


#: One row per SoC PyPTO's CPU path compiles for, in the field order of :class:`SocSpec`
#: (values and sources: docs/sources.md#ascend-socs).
_SOC_ROWS = (
    # (name, arch, soc_version, AIC, AIV, cube GHz, UB, L1, L0C bytes, HBM TB/s, native FP8)
    ("910b", "DAV_2201", "Ascend910B2", 24, 48, 1.8, 196608, 524288, 131072, 1.6, False),
    ("950", "DAV_3510", "Ascend950PR_9579", 28, 56, 1.65, 253952, 524288, 262144, 1.6, True),
)

SOCS: dict[str, SocSpec] = {row[0]: SocSpec(*row) for row in _SOC_ROWS}
# the 950DT compiles like the 950PR and differs only in HBM bandwidth (HiZQ 2.0)
SOCS["950dt"] = replace(SOCS["950"], name="950dt", hbm_tbps=4.0)

#: the SoCs PyPTO's CPU path can compile for (``950dt`` compiles as ``950``)
SIM_SOCS = ("910b", "950")
DEFAULT_SOC = "910b"


def get_soc(name: str | SocSpec = DEFAULT_SOC) -> SocSpec:
    """``"910b"`` / ``"950"`` / ``"950dt"`` (any case) -> :class:`SocSpec`."""
    if isinstance(name, SocSpec):
        return name
    if not isinstance(name, str):
        raise TypeError(f"soc: expected a str like '910b' or '950', got {type(name).__name__}")
    key = name.strip(" \t\r\n")
    key = key.lower() if key.isascii() else key
    if key not in SOCS:
        raise ValueError(f"soc: expected one of {sorted(SOCS)}, got {name!r}")
    return SOCS[key]


def fp8_socs() -> tuple[str, ...]:
    """The compile targets of :data:`SIM_SOCS` with a native FP8 E4M3 cube (``SocSpec.fp8``):
    where an FP8 path runs (the 950; the 910B has no FP8 type, docs/sources.md)."""
    return tuple(s for s in SIM_SOCS if SOCS[s].fp8)


def require_fp8(soc: str | SocSpec, name: str, what: str, fix: str) -> None:
    """The one FP8 rule of every kernel: ``ValueError`` naming the argument ``name`` unless the
    call's target ``soc`` has FP8 (``SocSpec.fp8``). ``what``: the FP8 input or path;
    ``fix``: what the caller can do instead."""
    spec = get_soc(soc)
    if not spec.fp8:
        raise ValueError(
            f"{name}: {what} needs a SoC with FP8 E4M3 (SocSpec.fp8: {', '.join(fp8_socs())}); "
            f"this call targets {spec.name!r}, which has none -- {fix}"
        )


# ------------------------------------------------------------------ per-SoC tile defaults
def _tile_family(soc: str | SocSpec) -> str:
    """The key of the per-SoC tile tables: ``"950"`` for every DAV_3510 SoC, else ``"910b"``."""
    return "950" if get_soc(soc).arch == "DAV_3510" else "910b"


#: MoE activation-stage vector tile width (columns of FP32) per (soc, activation); a tile is
#: ``[min(chunk, vt), vt]`` with chunks up to 64 rows. 910B: the seeds' values (UB 192 KB).
#: 950: silu stays at 128 (the cost model has it 9 % faster than 256 on the M2.7 seed case),
#: swigluoai 256. Compile limits and measurements:
#: docs/device.md#soc-descriptions-and-tile-defaults.
_MOE_VEC_TILE = {
    ("910b", "silu"): 128,
    ("910b", "swigluoai"): 256,
    ("950", "silu"): 128,
    ("950", "swigluoai"): 256,
}


def moe_vec_tile(soc: str | SocSpec, activation: str) -> int:
    """Default MoE vector tile width for ``soc`` and ``activation`` (``PYPTO_VEC_TILE`` wins)."""
    check_choice(activation, "activation", ("silu", "swigluoai"))
    return _MOE_VEC_TILE[(_tile_family(soc), activation)]


#: Per-SoC tile defaults of the MSA kernels: env variable -> (per-SoC default, required multiple).
#: * ``MSA_INDEXER_KTILE`` keys per indexer step. The FP32 score tile [16, KTILE] is 32 KB at 512
#:   (910B, 192 KB UB: in, out and double buffers fit with room to spare) and 64 KB at 1024 (950,
#:   248 KB UB); fewer, larger steps cut the per-task overhead (docs/ops/msa_indexer.md). A
#:   whole number of 128-key blocks.
#: * ``MSA_GATHER_ROWS`` rows of the MSA decode's V-select tile (``gather="paged"`` / ``"host"``,
#:   BF16, 256 B a row; set alone, also the V-gather tile): 910B 128 rows = 32 KB (double-buffered,
#:   well inside 192 KB next to the [16, NTILE] FP32 softmax tiles); 950 256 rows = 64 KB (248 KB
#:   UB).
#: * ``MSA_VEC_ROWS`` rows of the main branch's [rows, NTILE] FP32 vector tiles (NTILE 512: 2 KB a
#:   row). Score, mask and P tiles are live together, so three must fit the UB: 910B 32 rows =
#:   64 KB a tile (40 rows fails to compile), 950 40 rows = 80 KB (48 fails); on the 950 the
#:   40-row tile is the faster one in the cost model (docs/ops/msa_main.md).
MSA_DEVICE_TILES: dict[str, tuple[dict[str, int], int]] = {
    "MSA_INDEXER_KTILE": ({"910b": 512, "950": 1024}, 128),
    "MSA_GATHER_ROWS": ({"910b": 128, "950": 256}, 16),
    # the MSA decode's V gather (gather="device"); MSA_GATHER_ROWS alone sets it too
    "MSA_V_GATHER_ROWS": ({"910b": 256, "950": 512}, 16),
    "MSA_VEC_ROWS": ({"910b": 32, "950": 40}, 8),
}


def msa_device_tile(var: str, soc: str | SocSpec = DEFAULT_SOC, env=None) -> int:
    """The MSA kernel tile ``var`` (a key of :data:`MSA_DEVICE_TILES`) for ``soc``; the
    environment variable of the same name overrides it (a positive multiple of the table's
    multiple, else ``ValueError`` naming the variable)."""
    check_choice(var, "var", tuple(sorted(MSA_DEVICE_TILES)))
    per_soc, multiple = MSA_DEVICE_TILES[var]
    default = per_soc[_tile_family(soc)]
    return env_int(env_mapping(env), var, default, multiple_of=multiple)


def moe_tiling(activation: str = "silu", soc: str | SocSpec = DEFAULT_SOC, env=None):
    """:class:`~tilesim.shared.tiling.MoeTiling` for ``soc``: ``MoeTiling.from_env(activation)``
    with the SoC's vector tile width unless ``PYPTO_VEC_TILE`` is set in ``env``."""
    from tilesim.shared.tiling import MoeTiling

    env = env_mapping(env)
    get_soc(soc)  # checked before the environment is read
    t = MoeTiling.from_env(activation, env)
    if env_text(env, "PYPTO_VEC_TILE") is not None:
        return t
    return t.replace(vec_tile=moe_vec_tile(soc, activation))


__all__ = [
    "COST_MODEL_CYCLES_PER_US",
    "DEFAULT_SOC",
    "SIM_SOCS",
    "SOCS",
    "SocSpec",
    "fp8_socs",
    "get_soc",
    "moe_tiling",
    "moe_vec_tile",
    "require_fp8",
]
