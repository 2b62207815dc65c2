"""Tiling configs of the kernels, with the seeds' defaults and their environment overrides.

The seeds are the public ``hicann/pypto-gym`` kernels and tests; their tile values are listed
in docs/sources.md.

Nothing is read from the environment at import time: call ``X.from_env()`` (optionally with
your own mapping instead of ``os.environ``) to apply the overrides. A bad value raises a
``ValueError`` naming the variable, the expected and the actual value.

* :class:`MoeTiling` — grouped GEMM: ``PYPTO_UNROLL``, ``PYPTO_MM1_K``, ``PYPTO_MM1_N``,
  ``PYPTO_MM2_K``, ``PYPTO_MM2_N``, ``PYPTO_VEC_TILE``, ``PYPTO_CUBE_NBUFFER``,
  ``PYPTO_VEC_NBUFFER``, ``PYPTO_L1_REUSE``, ``PYPTO_SWIGLU_ALPHA``, ``PYPTO_SWIGLU_LIMIT``.
* :class:`MsaTiling` — MSA decode and main branch: ``MSA_NTILE``, ``MSA_NQ_TILE``,
  ``MSA_DTYPE``, ``MSA_MAX_N``.
* :class:`SaTileShapeConfig` — DeepSeek sparse attention: presets ``decode`` (online softmax,
  ``s_kv_tile`` 512) and ``prefill`` (per-tile normalised softmax, ``s_kv_tile`` 2048);
  ``TILESIM_SA_PRESET``, ``TILESIM_SA_G_TILE``, ``TILESIM_SA_S_KV_TILE``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

#: cube and vector tiles of BF16 data must be multiples of 16 elements (32-byte blocks)
ALIGN = 16


def _env_int(env: Mapping[str, str], var: str, default: int, *, multiple_of: int = 1) -> int:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = int(raw.strip(), 10)
    except ValueError:
        raise ValueError(f"{var}: expected a positive integer, got {raw!r}") from None
    _check_positive_multiple(var, v, multiple_of)
    return v


def _env_float(env: Mapping[str, str], var: str, default: float, *, positive: bool) -> float:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{var}: expected a finite number, got {raw!r}") from None
    if not math.isfinite(v) or (positive and v <= 0):
        kind = "a finite positive number" if positive else "a finite number"
        raise ValueError(f"{var}: expected {kind}, got {raw!r}")
    return v


def _check_positive_multiple(name: str, v, multiple_of: int = 1) -> None:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    if v % multiple_of:
        raise ValueError(f"{name}: expected a multiple of {multiple_of}, got {v}")


def parse_unroll_list(raw: str, var: str = "PYPTO_UNROLL") -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(4, 2, 1)``: de-duplicated, sorted descending, 1 always present."""
    items = [t.strip() for t in raw.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{var}: expected comma-separated positive integers, got {raw!r}")
    vals = []
    for t in items:
        try:
            v = int(t, 10)
        except ValueError:
            raise ValueError(
                f"{var}: expected comma-separated positive integers, got {raw!r}"
            ) from None
        if v <= 0:
            raise ValueError(f"{var}: every factor must be positive, got {v} in {raw!r}")
        vals.append(v)
    return normalize_unroll(vals)


def normalize_unroll(factors: Sequence[int]) -> tuple[int, ...]:
    """PyPTO ``loop_unroll``'s rule: de-duplicate, sort descending, always include 1."""
    for f in factors:
        _check_positive_multiple("unroll factor", f)
    return tuple(sorted(set(factors) | {1}, reverse=True))


def loop_unroll_chunks(count: int, unroll: Sequence[int]) -> list[tuple[int, int]]:
    """Split ``count`` iterations the way ``pypto.loop_unroll`` does.

    Each factor (largest first) runs as many whole chunks as fit in what is left, so 63 with
    ``1,2,4,8,16,32,64`` gives chunks 32,16,8,4,2,1 and 100 gives 64,32,4. Returns
    ``[(offset, size), ...]`` in execution order.
    """
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
        raise ValueError(f"count: expected a non-negative int, got {count!r}")
    count = int(count)
    chunks = []
    off = 0
    for f in normalize_unroll(unroll):
        n, _ = divmod(count - off, f)
        for _ in range(n):
            chunks.append((off, f))
            off += f
    return chunks


@dataclass(frozen=True)
class MoeTiling:
    """Grouped-GEMM tiling of the seeds' ``minimax_grouped_gemm_impl.py`` (hicann/pypto-gym;
    docs/sources.md#moe-grouped-gemm); per-activation defaults via :meth:`default`."""

    unroll: tuple[int, ...] = (64, 32, 16, 8, 4, 2, 1)
    mm1_k: int = 128
    mm1_n: int = 256
    mm2_k: int = 128
    mm2_n: int = 256
    vec_tile: int = 128
    cube_nbuffer: int = 2
    vec_nbuffer: int = 2
    l1_reuse: int = 2
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "unroll", normalize_unroll(self.unroll))
        for name in ("mm1_k", "mm1_n", "mm2_k", "mm2_n", "vec_tile"):
            _check_positive_multiple(f"MoeTiling.{name}", getattr(self, name), ALIGN)
        for name in ("cube_nbuffer", "vec_nbuffer", "l1_reuse"):
            _check_positive_multiple(f"MoeTiling.{name}", getattr(self, name))
        for name in ("swiglu_alpha", "swiglu_limit"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"MoeTiling.{name}: expected a finite positive number, got {v!r}")

    @classmethod
    def default(cls, activation: str = "silu") -> MoeTiling:
        """The seeds' defaults: silu vt 128 / nbuf 2,2 / l1 2; swigluoai vt 256 / 4,1 / 3."""
        if activation == "silu":
            return cls()
        if activation == "swigluoai":
            return cls(vec_tile=256, cube_nbuffer=4, vec_nbuffer=1, l1_reuse=3)
        raise ValueError(f"activation: expected 'silu' or 'swigluoai', got {activation!r}")

    @classmethod
    def from_env(cls, activation: str = "silu", env: Mapping[str, str] | None = None) -> MoeTiling:
        """Defaults for ``activation`` overridden by the ``PYPTO_*`` variables in ``env``."""
        env = os.environ if env is None else env
        d = cls.default(activation)
        raw_unroll = env.get("PYPTO_UNROLL")
        unroll = d.unroll if not raw_unroll else parse_unroll_list(raw_unroll)
        return cls(
            unroll=unroll,
            mm1_k=_env_int(env, "PYPTO_MM1_K", d.mm1_k, multiple_of=ALIGN),
            mm1_n=_env_int(env, "PYPTO_MM1_N", d.mm1_n, multiple_of=ALIGN),
            mm2_k=_env_int(env, "PYPTO_MM2_K", d.mm2_k, multiple_of=ALIGN),
            mm2_n=_env_int(env, "PYPTO_MM2_N", d.mm2_n, multiple_of=ALIGN),
            vec_tile=_env_int(env, "PYPTO_VEC_TILE", d.vec_tile, multiple_of=ALIGN),
            cube_nbuffer=_env_int(env, "PYPTO_CUBE_NBUFFER", d.cube_nbuffer),
            vec_nbuffer=_env_int(env, "PYPTO_VEC_NBUFFER", d.vec_nbuffer),
            l1_reuse=_env_int(env, "PYPTO_L1_REUSE", d.l1_reuse),
            swiglu_alpha=_env_float(env, "PYPTO_SWIGLU_ALPHA", d.swiglu_alpha, positive=True),
            swiglu_limit=_env_float(env, "PYPTO_SWIGLU_LIMIT", d.swiglu_limit, positive=True),
        )

    def replace(self, **changes) -> MoeTiling:
        return replace(self, **changes)


MSA_DTYPES = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class MsaTiling:
    """MSA tiling: key chunk width, main-branch dtype and row budget.

    Defaults of the seeds' MSA decode and main-branch kernels (hicann/pypto-gym; see
    docs/sources.md#msa-sparse-decode and docs/sources.md#msa-main-branch).
    """

    ntile: int = 512
    nq_tile: int = 128
    dtype: str = "fp32"
    max_n: int = 2048
    block_size: int = 128

    def __post_init__(self) -> None:
        _check_positive_multiple("MsaTiling.ntile", self.ntile, ALIGN)
        _check_positive_multiple("MsaTiling.nq_tile", self.nq_tile, ALIGN)
        _check_positive_multiple("MsaTiling.block_size", self.block_size, ALIGN)
        _check_positive_multiple("MsaTiling.max_n", self.max_n, self.block_size)
        if self.dtype not in MSA_DTYPES:
            raise ValueError(f"MsaTiling.dtype: expected one of {MSA_DTYPES}, got {self.dtype!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MsaTiling:
        """Defaults overridden by ``MSA_NTILE``, ``MSA_NQ_TILE``, ``MSA_DTYPE``, ``MSA_MAX_N``."""
        env = os.environ if env is None else env
        d = cls()
        dtype = (env.get("MSA_DTYPE") or d.dtype).strip().lower()
        if dtype not in MSA_DTYPES:
            raise ValueError(
                f"MSA_DTYPE: expected one of {MSA_DTYPES}, got {env.get('MSA_DTYPE')!r}"
            )
        return cls(
            ntile=_env_int(env, "MSA_NTILE", d.ntile, multiple_of=ALIGN),
            nq_tile=_env_int(env, "MSA_NQ_TILE", d.nq_tile, multiple_of=ALIGN),
            dtype=dtype,
            max_n=_env_int(env, "MSA_MAX_N", d.max_n, multiple_of=d.block_size),
        )

    def replace(self, **changes) -> MsaTiling:
        return replace(self, **changes)


SA_SOFTMAX_MODES = ("online", "per_tile")


@dataclass(frozen=True)
class SaTileShapeConfig:
    """DeepSeek sparse-attention tile config ``(g_tile, s_kv_tile, c1, v1, c2, v2)`` + softmax mode.

    ``c1_tile``/``c2_tile`` are cube lists ``(mL0, mL1, kL0, kL1, nL0, nL1)``; ``v1_tile``/
    ``v2_tile`` vector tiles ``(rows, cols)``. ``softmax="online"``: P kept unnormalised, merged
    across KV tiles (first/middle/last); ``"per_tile"``: P normalised inside each tile, C2
    output rounded to BF16 (the seeds' ``_d``/``_p`` kernels).
    """

    g_tile: int = 128
    s_kv_tile: int = 512
    c1_tile: tuple[int, ...] = (128, 128, 256, 256, 128, 128)
    v1_tile: tuple[int, ...] = (64, 128)
    c2_tile: tuple[int, ...] = (128, 128, 128, 128, 256, 256)
    v2_tile: tuple[int, ...] = (128, 128)
    softmax: str = "online"

    def __post_init__(self) -> None:
        _check_positive_multiple("SaTileShapeConfig.g_tile", self.g_tile)
        _check_positive_multiple("SaTileShapeConfig.s_kv_tile", self.s_kv_tile, ALIGN)
        for name, n in (("c1_tile", 6), ("v1_tile", 2), ("c2_tile", 6), ("v2_tile", 2)):
            v = tuple(getattr(self, name))
            if len(v) != n:
                raise ValueError(f"SaTileShapeConfig.{name}: expected {n} integers, got {v!r}")
            for x in v:
                _check_positive_multiple(f"SaTileShapeConfig.{name}", x)
            object.__setattr__(self, name, v)
        if self.softmax not in SA_SOFTMAX_MODES:
            raise ValueError(
                f"SaTileShapeConfig.softmax: expected one of {SA_SOFTMAX_MODES}, "
                f"got {self.softmax!r}"
            )

    @classmethod
    def decode(cls) -> SaTileShapeConfig:
        """Online softmax over 512-key tiles (the current FP8 ``_high`` kernel and its test)."""
        return cls()

    @classmethod
    def prefill(cls) -> SaTileShapeConfig:
        """Per-tile normalised softmax over 2048-key tiles (the ``_d``/``_p`` kernels' test)."""
        return cls(
            g_tile=128,
            s_kv_tile=2048,
            c1_tile=(128,) * 6,
            v1_tile=(8, 2048),
            c2_tile=(128,) * 6,
            v2_tile=(64, 128),
            softmax="per_tile",
        )

    @classmethod
    def preset(cls, name: str) -> SaTileShapeConfig:
        if name == "decode":
            return cls.decode()
        if name == "prefill":
            return cls.prefill()
        raise ValueError(f"preset: expected 'decode' or 'prefill', got {name!r}")

    @classmethod
    def from_env(
        cls, preset: str = "decode", env: Mapping[str, str] | None = None
    ) -> SaTileShapeConfig:
        """``preset`` (or ``TILESIM_SA_PRESET``) with ``TILESIM_SA_G_TILE`` /
        ``TILESIM_SA_S_KV_TILE`` overrides."""
        env = os.environ if env is None else env
        name = (env.get("TILESIM_SA_PRESET") or preset).strip()
        if name not in ("decode", "prefill"):
            raise ValueError(f"TILESIM_SA_PRESET: expected 'decode' or 'prefill', got {name!r}")
        d = cls.preset(name)
        return replace(
            d,
            g_tile=_env_int(env, "TILESIM_SA_G_TILE", d.g_tile),
            s_kv_tile=_env_int(env, "TILESIM_SA_S_KV_TILE", d.s_kv_tile, multiple_of=ALIGN),
        )

    def as_tuple(self) -> tuple:
        """The kernel's ``tile_config`` tuple ``(g_tile, s_kv_tile, c1, v1, c2, v2)``."""
        return (
            self.g_tile,
            self.s_kv_tile,
            list(self.c1_tile),
            list(self.v1_tile),
            list(self.c2_tile),
            list(self.v2_tile),
        )

    def replace(self, **changes) -> SaTileShapeConfig:
        return replace(self, **changes)


__all__ = [
    "MoeTiling",
    "MsaTiling",
    "SaTileShapeConfig",
    "loop_unroll_chunks",
    "normalize_unroll",
    "parse_unroll_list",
]
