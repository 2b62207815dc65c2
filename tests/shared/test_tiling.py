"""Tiling configs: the seeds' defaults (hicann/pypto-gym kernels, restated in docs/sources.md),
explicit environment overrides, validation naming the variable, and the loop_unroll chunking
rule."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from tilesim.shared import MoeTiling, MsaTiling, SaTileShapeConfig, loop_unroll_chunks
from tilesim.shared.tiling import normalize_unroll, parse_unroll_list

TILING_VARS = [
    "PYPTO_UNROLL",
    "PYPTO_MM1_K",
    "PYPTO_MM1_N",
    "PYPTO_MM2_K",
    "PYPTO_MM2_N",
    "PYPTO_VEC_TILE",
    "PYPTO_CUBE_NBUFFER",
    "PYPTO_VEC_NBUFFER",
    "PYPTO_L1_REUSE",
    "PYPTO_SWIGLU_ALPHA",
    "PYPTO_SWIGLU_LIMIT",
    "MSA_NTILE",
    "MSA_NQ_TILE",
    "MSA_DTYPE",
    "MSA_MAX_N",
    "TILESIM_SA_PRESET",
    "TILESIM_SA_G_TILE",
    "TILESIM_SA_S_KV_TILE",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in TILING_VARS:
        monkeypatch.delenv(var, raising=False)


# ---------------------------------------------------------------------------------------------
# defaults (the seeds' numbers, as listed in docs/sources.md)
# ---------------------------------------------------------------------------------------------


def test_moe_defaults_silu():
    t = MoeTiling.default("silu")
    assert t == MoeTiling()
    assert t.unroll == (64, 32, 16, 8, 4, 2, 1)  # "1,2,4,8,16,32,64", sorted descending
    assert (t.mm1_k, t.mm1_n, t.mm2_k, t.mm2_n) == (128, 256, 128, 256)
    assert (t.vec_tile, t.cube_nbuffer, t.vec_nbuffer, t.l1_reuse) == (128, 2, 2, 2)
    assert (t.swiglu_alpha, t.swiglu_limit) == (1.702, 7.0)


def test_moe_defaults_swigluoai():
    t = MoeTiling.default("swigluoai")
    assert (t.vec_tile, t.cube_nbuffer, t.vec_nbuffer, t.l1_reuse) == (256, 4, 1, 3)
    assert (t.mm1_k, t.mm1_n, t.mm2_k, t.mm2_n) == (128, 256, 128, 256)
    assert t.unroll == (64, 32, 16, 8, 4, 2, 1)
    with pytest.raises(ValueError, match="activation.*'gelu'"):
        MoeTiling.default("gelu")


def test_msa_defaults():
    t = MsaTiling()
    assert (t.ntile, t.nq_tile, t.dtype, t.max_n, t.block_size) == (512, 128, "fp32", 2048, 128)
    assert t.max_n // t.ntile == 4  # nchunks of the main branch


def test_sa_presets():
    d = SaTileShapeConfig.decode()
    assert d.as_tuple() == (
        128,
        512,
        [128, 128, 256, 256, 128, 128],
        [64, 128],
        [128, 128, 128, 128, 256, 256],
        [128, 128],
    )
    assert d.softmax == "online" and SaTileShapeConfig.preset("decode") == d
    p = SaTileShapeConfig.prefill()
    assert p.as_tuple() == (128, 2048, [128] * 6, [8, 2048], [128] * 6, [64, 128])
    assert p.softmax == "per_tile" and SaTileShapeConfig.preset("prefill") == p
    with pytest.raises(ValueError, match="preset.*'tiny'"):
        SaTileShapeConfig.preset("tiny")


def test_empty_env_gives_defaults():
    assert MoeTiling.from_env(env={}) == MoeTiling()
    assert MoeTiling.from_env("swigluoai", env={}) == MoeTiling.default("swigluoai")
    assert MsaTiling.from_env(env={}) == MsaTiling()
    assert SaTileShapeConfig.from_env(env={}) == SaTileShapeConfig.decode()
    assert SaTileShapeConfig.from_env("prefill", env={}) == SaTileShapeConfig.prefill()
    # empty strings count as unset
    assert MoeTiling.from_env(env={"PYPTO_MM1_K": "", "PYPTO_UNROLL": ""}) == MoeTiling()


# ---------------------------------------------------------------------------------------------
# overrides
# ---------------------------------------------------------------------------------------------

MOE_OVERRIDES = [
    ("PYPTO_UNROLL", "1,2,4", "unroll", (4, 2, 1)),
    ("PYPTO_UNROLL", " 8, 3 ,8", "unroll", (8, 3, 1)),
    ("PYPTO_MM1_K", "256", "mm1_k", 256),
    ("PYPTO_MM1_N", "128", "mm1_n", 128),
    ("PYPTO_MM2_K", "64", "mm2_k", 64),
    ("PYPTO_MM2_N", "512", "mm2_n", 512),
    ("PYPTO_VEC_TILE", "64", "vec_tile", 64),
    ("PYPTO_CUBE_NBUFFER", "3", "cube_nbuffer", 3),
    ("PYPTO_VEC_NBUFFER", "4", "vec_nbuffer", 4),
    ("PYPTO_L1_REUSE", "1", "l1_reuse", 1),
    ("PYPTO_SWIGLU_ALPHA", "1.5", "swiglu_alpha", 1.5),
    ("PYPTO_SWIGLU_LIMIT", "10", "swiglu_limit", 10.0),
]


@pytest.mark.parametrize(("var", "raw", "attr", "value"), MOE_OVERRIDES)
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_moe_each_variable_overrides(var, raw, attr, value, activation):
    t = MoeTiling.from_env(activation, env={var: raw})
    assert getattr(t, attr) == value
    base = MoeTiling.default(activation)
    # nothing else changed
    assert dataclasses.replace(t, **{attr: getattr(base, attr)}) == base


@pytest.mark.parametrize(
    ("var", "raw", "attr", "value"),
    [
        ("MSA_NTILE", "256", "ntile", 256),
        ("MSA_NQ_TILE", "64", "nq_tile", 64),
        ("MSA_DTYPE", "bf16", "dtype", "bf16"),
        ("MSA_DTYPE", "FP16", "dtype", "fp16"),
        ("MSA_MAX_N", "4096", "max_n", 4096),
    ],
)
def test_msa_each_variable_overrides(var, raw, attr, value):
    t = MsaTiling.from_env(env={var: raw})
    assert getattr(t, attr) == value
    assert dataclasses.replace(t, **{attr: getattr(MsaTiling(), attr)}) == MsaTiling()


def test_sa_overrides():
    t = SaTileShapeConfig.from_env(env={"TILESIM_SA_PRESET": "prefill"})
    assert t == SaTileShapeConfig.prefill()
    t = SaTileShapeConfig.from_env(env={"TILESIM_SA_G_TILE": "64", "TILESIM_SA_S_KV_TILE": "1024"})
    assert (t.g_tile, t.s_kv_tile) == (64, 1024)
    assert dataclasses.replace(t, g_tile=128, s_kv_tile=512) == SaTileShapeConfig.decode()


def test_from_env_reads_os_environ_only_when_called(monkeypatch):
    monkeypatch.setenv("PYPTO_MM1_N", "512")
    monkeypatch.setenv("MSA_NTILE", "1024")
    monkeypatch.setenv("TILESIM_SA_PRESET", "prefill")
    assert MoeTiling().mm1_n == 256 and MoeTiling.default().mm1_n == 256
    assert MoeTiling.from_env().mm1_n == 512
    assert MsaTiling().ntile == 512 and MsaTiling.from_env().ntile == 1024
    assert SaTileShapeConfig.from_env().softmax == "per_tile"
    # an explicit mapping replaces os.environ entirely
    assert MoeTiling.from_env(env={}).mm1_n == 256


def test_nothing_is_read_at_import_time():
    env = dict(os.environ)
    env.update({var: "not-a-number" for var in TILING_VARS})
    code = (
        "import tilesim, tilesim.shared, tilesim.reference\n"
        "from tilesim.shared import MoeTiling, MsaTiling, SaTileShapeConfig\n"
        "assert MoeTiling().mm1_k == 128 and MsaTiling().ntile == 512\n"
        "assert SaTileShapeConfig.decode().s_kv_tile == 512\n"
        "for f in (MoeTiling.from_env, MsaTiling.from_env, SaTileShapeConfig.from_env):\n"
        "    try:\n"
        "        f()\n"
        "    except ValueError as e:\n"
        "        print(str(e).split(':')[0])\n"
        "    else:\n"
        "        raise SystemExit('from_env accepted garbage')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["PYPTO_UNROLL", "MSA_NTILE", "TILESIM_SA_PRESET"]


# ---------------------------------------------------------------------------------------------
# bad values raise ValueError naming the variable
# ---------------------------------------------------------------------------------------------

ALIGNED_INT_VARS = [
    (MoeTiling.from_env, "PYPTO_MM1_K"),
    (MoeTiling.from_env, "PYPTO_MM1_N"),
    (MoeTiling.from_env, "PYPTO_MM2_K"),
    (MoeTiling.from_env, "PYPTO_MM2_N"),
    (MoeTiling.from_env, "PYPTO_VEC_TILE"),
    (MsaTiling.from_env, "MSA_NTILE"),
    (MsaTiling.from_env, "MSA_NQ_TILE"),
    (SaTileShapeConfig.from_env, "TILESIM_SA_S_KV_TILE"),
]
PLAIN_INT_VARS = [
    (MoeTiling.from_env, "PYPTO_CUBE_NBUFFER"),
    (MoeTiling.from_env, "PYPTO_VEC_NBUFFER"),
    (MoeTiling.from_env, "PYPTO_L1_REUSE"),
    (SaTileShapeConfig.from_env, "TILESIM_SA_G_TILE"),
]


@pytest.mark.parametrize("raw", ["abc", "1.5", "0", "-16", "0x10", "16 16"])
@pytest.mark.parametrize(("ctor", "var"), ALIGNED_INT_VARS + PLAIN_INT_VARS)
def test_bad_integers(ctor, var, raw):
    with pytest.raises(
        ValueError, match=rf"^{var}: expected a positive integer.*, got '{re.escape(raw)}'$"
    ):
        ctor(env={var: raw})


@pytest.mark.parametrize("raw", ["24", "100", "8"])
@pytest.mark.parametrize(("ctor", "var"), ALIGNED_INT_VARS)
def test_not_a_multiple_of_16(ctor, var, raw):
    with pytest.raises(
        ValueError, match=rf"^{var}: expected a positive multiple of 16, got {raw}$"
    ):
        ctor(env={var: raw})


@pytest.mark.parametrize("raw", ["1000", "64", "2050"])
def test_msa_max_n_must_be_a_multiple_of_the_block(raw):
    with pytest.raises(
        ValueError, match=rf"^MSA_MAX_N: expected a positive multiple of 128, got {raw}$"
    ):
        MsaTiling.from_env(env={"MSA_MAX_N": raw})


@pytest.mark.parametrize("raw", ["1,0,4", "a,b", ",", "2,-4", "1.5"])
def test_bad_unroll_lists(raw):
    with pytest.raises(ValueError, match=r"^PYPTO_UNROLL: "):
        MoeTiling.from_env(env={"PYPTO_UNROLL": raw})


@pytest.mark.parametrize("raw", ["abc", "nan", "inf", "0", "-1.702"])
@pytest.mark.parametrize("var", ["PYPTO_SWIGLU_ALPHA", "PYPTO_SWIGLU_LIMIT"])
def test_bad_swiglu_floats(var, raw):
    with pytest.raises(ValueError, match=rf"^{var}: expected a finite"):
        MoeTiling.from_env("swigluoai", env={var: raw})


def test_bad_choices():
    with pytest.raises(ValueError, match=r"^MSA_DTYPE: expected one of .*'fp8'"):
        MsaTiling.from_env(env={"MSA_DTYPE": "fp8"})
    with pytest.raises(ValueError, match=r"^TILESIM_SA_PRESET: .*'huge'"):
        SaTileShapeConfig.from_env(env={"TILESIM_SA_PRESET": "huge"})


def test_constructors_validate_and_are_frozen():
    with pytest.raises(
        ValueError, match=r"MoeTiling.mm1_k: expected a positive multiple of 16, got 24"
    ):
        MoeTiling(mm1_k=24)
    with pytest.raises(
        ValueError, match=r"MoeTiling.cube_nbuffer: expected an int in \[1, 2147483647\], got 0"
    ):
        MoeTiling(cube_nbuffer=0)
    with pytest.raises(ValueError, match="MsaTiling.dtype"):
        MsaTiling(dtype="int8")
    with pytest.raises(ValueError, match=r"SaTileShapeConfig.c1_tile: expected 6 integers"):
        SaTileShapeConfig(c1_tile=(128, 128))
    with pytest.raises(ValueError, match="SaTileShapeConfig.softmax"):
        SaTileShapeConfig(softmax="exact")
    with pytest.raises(dataclasses.FrozenInstanceError):
        MoeTiling().mm1_k = 64  # type: ignore[misc]
    t = MoeTiling().replace(mm2_n=512)
    assert t.mm2_n == 512 and t.mm1_n == 256
    with pytest.raises(ValueError, match="MoeTiling.mm2_n"):
        MoeTiling().replace(mm2_n=500)


# ---------------------------------------------------------------------------------------------
# loop_unroll chunking (PyPTO loop_unroll; docs/sources.md#moe-grouped-gemm)
# ---------------------------------------------------------------------------------------------

DEFAULT_UNROLL = (1, 2, 4, 8, 16, 32, 64)


@pytest.mark.parametrize(
    ("count", "unroll", "sizes"),
    [
        (63, DEFAULT_UNROLL, [32, 16, 8, 4, 2, 1]),
        (100, DEFAULT_UNROLL, [64, 32, 4]),
        (3, (1, 2, 4), [2, 1]),
        (0, DEFAULT_UNROLL, []),
        (128, DEFAULT_UNROLL, [64, 64]),
        (7, (4,), [4, 1, 1, 1]),  # 1 is always added
        (10, (3, 3), [3, 3, 3, 1]),
    ],
)
def test_loop_unroll_examples(count, unroll, sizes):
    chunks = loop_unroll_chunks(count, unroll)
    assert [s for _, s in chunks] == sizes
    assert [o for o, _ in chunks] == [sum(sizes[:k]) for k in range(len(sizes))]


def test_loop_unroll_chunks_tile_the_range_exactly():
    rng = np.random.default_rng(0)
    for _ in range(300):
        count = int(rng.integers(0, 600))
        unroll = tuple(int(v) for v in rng.integers(1, 70, size=int(rng.integers(1, 5))))
        chunks = loop_unroll_chunks(count, unroll)
        covered = np.zeros(count, dtype=int)
        for off, size in chunks:
            covered[off : off + size] += 1
        assert np.all(covered == 1)  # every iteration exactly once
        sizes = [s for _, s in chunks]
        assert sizes == sorted(sizes, reverse=True)  # largest factor first
        allowed = set(unroll) | {1}
        assert set(sizes) <= allowed
        # greedy: after a factor's sub-loop the remainder is smaller than that factor
        for f in sorted(allowed, reverse=True):
            done = sum(s for s in sizes if s >= f)
            assert count - done < f


def test_loop_unroll_bad_arguments():
    with pytest.raises(ValueError, match="count"):
        loop_unroll_chunks(-1, DEFAULT_UNROLL)
    with pytest.raises(TypeError, match="count: expected an int, got float"):
        loop_unroll_chunks(2.0, DEFAULT_UNROLL)
    with pytest.raises(ValueError, match="unroll factor"):
        loop_unroll_chunks(5, (0, 2))
    assert loop_unroll_chunks(np.int64(3), (1, 2)) == [(0, 2), (2, 1)]


def test_normalize_and_parse_unroll():
    assert normalize_unroll([1, 2, 4]) == (4, 2, 1)
    assert normalize_unroll([8, 8, 3]) == (8, 3, 1)
    assert parse_unroll_list("64,32,1") == (64, 32, 1)
    with pytest.raises(
        ValueError,
        match=r"^MY_VAR: expected comma-separated positive integers .*got '4,0' \(item 1: '0'\)$",
    ):
        parse_unroll_list("4,0", var="MY_VAR")
