"""Tiling configs of the kernels, with the seeds' defaults and their environment overrides.

The seeds are the public ``hicann/pypto-gym`` kernels and tests; their tile values are listed
in docs/sources.md.

Nothing is read from the environment at import time: call ``X.from_env()`` (optionally with
your own mapping instead of ``os.environ``) to apply the overrides. A bad value raises a
``ValueError`` naming the variable, the expected and the actual value. Values are parsed by
:mod:`tilesim.shared.env` (``env_int`` / ``env_float`` / ``env_choice``): ASCII digits
only, no sign, underscore or inner blank, at most 2**31 - 1; floats finite in FP32.
Constructor fields are checked the same way (``TypeError`` for a wrong type, ``ValueError``
for a wrong value); integer fields are stored as Python ints.

* :class:`MoeTiling` — grouped GEMM: ``PYPTO_UNROLL``, ``PYPTO_MM1_K``, ``PYPTO_MM1_N``,
  ``PYPTO_MM2_K``, ``PYPTO_MM2_N``, ``PYPTO_VEC_TILE``, ``PYPTO_CUBE_NBUFFER``,
  ``PYPTO_VEC_NBUFFER``, ``PYPTO_L1_REUSE``, ``PYPTO_SWIGLU_ALPHA``, ``PYPTO_SWIGLU_LIMIT``.
* :class:`MsaTiling` — MSA decode and main branch: ``MSA_NTILE``, ``MSA_NQ_TILE``,
  ``MSA_DTYPE``, ``MSA_MAX_N``, ``MSA_KV_SPLITS`` (decode split-KV).
* :class:`SaTileShapeConfig` — DeepSeek sparse attention: presets ``decode`` (online softmax,
  ``s_kv_tile`` 512) and ``prefill`` (per-tile normalised softmax, ``s_kv_tile`` 2048), and the
  device wrapper's ``large_batch`` tiling (online, 2048-key tiles, 512-deep K steps);
  ``TILESIM_SA_PRESET``, ``TILESIM_SA_G_TILE``, ``TILESIM_SA_S_KV_TILE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tilesim.shared.env import (
    env_choice,
    env_float,
    env_int,
    env_mapping,
    env_text,
    parse_int_text,
)
from tilesim.shared.validate import (
    INT32_MAX,
    check_choice,
    check_float,
    check_int,
    check_int_sequence,
    check_str,
)

#: cube and vector tiles of BF16 data must be multiples of 16 elements (32-byte blocks)
ALIGN = 16
#: :func:`loop_unroll_chunks` refuses to list more chunks than this (a bound, not a MemoryError)
MAX_UNROLL_CHUNKS = 1 << 20


def _check_positive_multiple(name: str, v, multiple_of: int = 1) -> int:
    """A Python/NumPy int in ``[1, 2**31 - 1]`` that is a multiple of ``multiple_of`` -> int."""
    v = check_int(v, name, lo=1, hi=INT32_MAX)
    if v % multiple_of:
        raise ValueError(f"{name}: expected a positive multiple of {multiple_of}, got {v}")
    return v


def parse_unroll_list(raw: str, var: str = "PYPTO_UNROLL") -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(4, 2, 1)``: de-duplicated, sorted descending, 1 always present.

    Each item is ASCII digits (blanks around it ignored); an empty item (``"1,,2"``) is an
    error, as is any value :func:`~tilesim.shared.env.parse_int_text` refuses."""
    check_str(raw, var)
    items = raw.split(",")
    if not raw.strip(" \t\r\n") or any(not t.strip(" \t\r\n") for t in items):
        raise ValueError(f"{var}: expected comma-separated positive integers, got {raw!r}")
    vals = []
    for k, t in enumerate(items):
        try:
            vals.append(parse_int_text(t, var))
        except ValueError:
            raise ValueError(
                f"{var}: expected comma-separated positive integers <= {INT32_MAX}, "
                f"got {raw!r} (item {k}: {t!r})"
            ) from None
    return normalize_unroll(vals)


def normalize_unroll(factors: Sequence[int]) -> tuple[int, ...]:
    """PyPTO ``loop_unroll``'s rule: de-duplicate, sort descending, always include 1."""
    vals = check_int_sequence(factors, "unroll factor", lo=1, hi=INT32_MAX)
    return tuple(sorted(set(vals) | {1}, reverse=True))


def loop_unroll_chunks(count: int, unroll: Sequence[int]) -> list[tuple[int, int]]:
    """Split ``count`` iterations the way ``pypto.loop_unroll`` does.

    Each factor (largest first) runs as many whole chunks as fit in what is left, so 63 with
    ``1,2,4,8,16,32,64`` gives chunks 32,16,8,4,2,1 and 100 gives 64,32,4. Returns
    ``[(offset, size), ...]`` in execution order. ``count`` is an int in ``[0, 2**31 - 1]``;
    more than :data:`MAX_UNROLL_CHUNKS` chunks raise ``ValueError`` before any is listed.
    """
    count = check_int(count, "count", lo=0, hi=INT32_MAX)
    factors = normalize_unroll(unroll)
    n_chunks, left = 0, count
    for f in factors:
        n_chunks += left // f
        left %= f
    if n_chunks > MAX_UNROLL_CHUNKS:
        raise ValueError(
            f"count: expected at most {MAX_UNROLL_CHUNKS} chunks of {factors}, "
            f"got {n_chunks} for count {count}"
        )
    chunks = []
    off = 0
    for f in factors:
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
            v = _check_positive_multiple(f"MoeTiling.{name}", getattr(self, name), ALIGN)
            object.__setattr__(self, name, v)
        for name in ("cube_nbuffer", "vec_nbuffer", "l1_reuse"):
            v = _check_positive_multiple(f"MoeTiling.{name}", getattr(self, name))
            object.__setattr__(self, name, v)
        for name in ("swiglu_alpha", "swiglu_limit"):
            # validated only: the value is kept as given (the kernel rounds it to FP32)
            check_float(getattr(self, name), f"MoeTiling.{name}", positive=True, fp32=True)

    @classmethod
    def default(cls, activation: str = "silu") -> MoeTiling:
        """The seeds' defaults: silu vt 128 / nbuf 2,2 / l1 2; swigluoai vt 256 / 4,1 / 3."""
        check_choice(activation, "activation", ("silu", "swigluoai"))
        if activation == "silu":
            return cls()
        return cls(vec_tile=256, cube_nbuffer=4, vec_nbuffer=1, l1_reuse=3)

    @classmethod
    def from_env(cls, activation: str = "silu", env: Mapping[str, str] | None = None) -> MoeTiling:
        """Defaults for ``activation`` overridden by the ``PYPTO_*`` variables in ``env``."""
        env = env_mapping(env)
        d = cls.default(activation)
        raw_unroll = env_text(env, "PYPTO_UNROLL")
        unroll = d.unroll if raw_unroll is None else parse_unroll_list(raw_unroll)

        def aligned(var: str, default: int) -> int:
            return env_int(env, var, default, multiple_of=ALIGN)

        return cls(
            unroll=unroll,
            mm1_k=aligned("PYPTO_MM1_K", d.mm1_k),
            mm1_n=aligned("PYPTO_MM1_N", d.mm1_n),
            mm2_k=aligned("PYPTO_MM2_K", d.mm2_k),
            mm2_n=aligned("PYPTO_MM2_N", d.mm2_n),
            vec_tile=aligned("PYPTO_VEC_TILE", d.vec_tile),
            cube_nbuffer=env_int(env, "PYPTO_CUBE_NBUFFER", d.cube_nbuffer),
            vec_nbuffer=env_int(env, "PYPTO_VEC_NBUFFER", d.vec_nbuffer),
            l1_reuse=env_int(env, "PYPTO_L1_REUSE", d.l1_reuse),
            swiglu_alpha=env_float(env, "PYPTO_SWIGLU_ALPHA", d.swiglu_alpha),
            swiglu_limit=env_float(env, "PYPTO_SWIGLU_LIMIT", d.swiglu_limit),
        )

    def replace(self, **changes) -> MoeTiling:
        return replace(self, **changes)


MSA_DTYPES = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class MsaTiling:
    """MSA tiling: key chunk width, main-branch dtype and row budget, decode split-KV.

    Defaults of the seeds' MSA decode and main-branch kernels (hicann/pypto-gym; see
    docs/sources.md#msa-sparse-decode and docs/sources.md#msa-main-branch). ``kv_splits``
    (decode only): the NTILE chunks of a (batch row, KV head) in this many consecutive ranges,
    each its own online softmax, combined in range order (:mod:`tilesim.shared.msa_decode`);
    1 = the unsplit chunk loop (the seeds').
    """

    ntile: int = 512
    nq_tile: int = 128
    dtype: str = "fp32"
    max_n: int = 2048
    block_size: int = 128
    kv_splits: int = 1

    def __post_init__(self) -> None:
        k = _check_positive_multiple("MsaTiling.kv_splits", self.kv_splits)
        object.__setattr__(self, "kv_splits", k)
        for name in ("ntile", "nq_tile", "block_size"):
            v = _check_positive_multiple(f"MsaTiling.{name}", getattr(self, name), ALIGN)
            object.__setattr__(self, name, v)
        v = _check_positive_multiple("MsaTiling.max_n", self.max_n, self.block_size)
        object.__setattr__(self, "max_n", v)
        check_choice(self.dtype, "MsaTiling.dtype", MSA_DTYPES)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MsaTiling:
        """Defaults overridden by ``MSA_NTILE``, ``MSA_NQ_TILE``, ``MSA_DTYPE``, ``MSA_MAX_N``,
        ``MSA_KV_SPLITS``."""
        env = env_mapping(env)
        d = cls()
        return cls(
            ntile=env_int(env, "MSA_NTILE", d.ntile, multiple_of=ALIGN),
            nq_tile=env_int(env, "MSA_NQ_TILE", d.nq_tile, multiple_of=ALIGN),
            dtype=env_choice(env, "MSA_DTYPE", d.dtype, MSA_DTYPES),
            max_n=env_int(env, "MSA_MAX_N", d.max_n, multiple_of=d.block_size),
            kv_splits=env_int(env, "MSA_KV_SPLITS", d.kv_splits),
        )

    def replace(self, **changes) -> MsaTiling:
        return replace(self, **changes)


SA_SOFTMAX_MODES = ("online", "per_tile")
SA_PRESETS = ("decode", "prefill")


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
    #: split-KV (flash-decoding): a token's KV tiles in this many ranges, merged at the end
    kv_splits: int = 1

    def __post_init__(self) -> None:
        k = _check_positive_multiple("SaTileShapeConfig.kv_splits", self.kv_splits)
        object.__setattr__(self, "kv_splits", k)
        g = _check_positive_multiple("SaTileShapeConfig.g_tile", self.g_tile)
        s = _check_positive_multiple("SaTileShapeConfig.s_kv_tile", self.s_kv_tile, ALIGN)
        object.__setattr__(self, "g_tile", g)
        object.__setattr__(self, "s_kv_tile", s)
        for name, n in (("c1_tile", 6), ("v1_tile", 2), ("c2_tile", 6), ("v2_tile", 2)):
            full = f"SaTileShapeConfig.{name}"
            v = check_int_sequence(getattr(self, name), full, lo=1, hi=INT32_MAX)
            if len(v) != n:
                raise ValueError(f"{full}: expected {n} integers, got {v!r}")
            object.__setattr__(self, name, v)
        check_choice(self.softmax, "SaTileShapeConfig.softmax", SA_SOFTMAX_MODES)

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
    def large_batch(cls) -> SaTileShapeConfig:
        """The large-batch decode tiling: online softmax over 2048-key tiles (one tile per token
        at DeepSeek-V3.2's top-k) with 512-deep L1 K tiles in C1 and C2 (``kL1``; ``kL0`` as in
        ``decode``). The device wrapper runs it in place of ``decode`` for a call of many
        tokens (:func:`tilesim.shared.dsa.kernel_tiling`); its bits are not ``decode``'s (fewer
        K steps, another merge order): its golden is the reference with this tiling and
        ``accumulation="k_steps"`` (docs/ops/dsa.md#kernel, "The large-batch tiling"). The V1
        vector tile spans a whole 2048-key row (8 rows): the row max and row sum are one row
        reduction per tile, with no element-wise pair reductions across column tiles (same
        bits: the max is exact, the sum is the interpreter's row sum either way)."""
        return cls(
            s_kv_tile=2048,
            c1_tile=(128, 128, 256, 512, 128, 128),
            v1_tile=(8, 2048),
            c2_tile=(128, 128, 128, 512, 256, 256),
        )

    @classmethod
    def preset(cls, name: str) -> SaTileShapeConfig:
        """``"decode"`` or ``"prefill"`` -> that preset."""
        if not (isinstance(name, str) and name in SA_PRESETS):
            raise ValueError(f"preset: expected 'decode' or 'prefill', got {name!r}")
        return cls.decode() if name == "decode" else cls.prefill()

    @classmethod
    def from_env(
        cls, preset: str = "decode", env: Mapping[str, str] | None = None
    ) -> SaTileShapeConfig:
        """``preset`` (or ``TILESIM_SA_PRESET``) with ``TILESIM_SA_G_TILE`` /
        ``TILESIM_SA_S_KV_TILE`` overrides."""
        cls.preset(preset)  # checked before the environment is read
        env = env_mapping(env)
        d = cls.preset(env_choice(env, "TILESIM_SA_PRESET", preset, SA_PRESETS))
        return replace(
            d,
            g_tile=env_int(env, "TILESIM_SA_G_TILE", d.g_tile),
            s_kv_tile=env_int(env, "TILESIM_SA_S_KV_TILE", d.s_kv_tile, multiple_of=ALIGN),
        )

    def as_tuple(self) -> tuple:
        """The kernel's tile tuple ``(g_tile, s_kv_tile, c1, v1, c2, v2)``."""
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
