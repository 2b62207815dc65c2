"""PyPTO's interpreter back end (the C++ "calculator" on libtorch), patched and built once.

:func:`load_calculator` copies ``pypto/lib/calculator/`` of the installed ``pypto==0.2.0``
(``hicann/pypto``: ``pypto/lib/calculator/src/calc_torch.cpp``, ``fp8_convert.cpp``), applies
the source edits below, builds it once per pypto/torch install into the cache
(:mod:`tilesim.device.sim.cache`) and loads it. The edits give FP8 E4M3 casts OCP
``float8_e4m3fn`` semantics and sum each matmul K tile exactly (docs/device.md, "A
deterministic interpreter"); ``TILESIM_SIM_STOCK_CALC=1`` builds the stock calculator.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device.sim.cache import cache_dir, file_lock, pkg_key, pypto_pkg_dir
from tilesim.device.sim.errors import SimError


def _torch_build_flags(torch) -> str:
    """The CMake flags that build the calculator against the installed torch."""
    root = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return (
        f"-DPY3_MOD_TORCH_VERSION={torch.__version__} -DPY3_MOD_TORCH_ROOT_PATH={root} "
        f"-DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={abi}"
    )


# 1. calc_torch.cpp: Cast() rounds to an integer unless IsFloat(dtype); FP8 is not listed there.
_CAST_OLD = "if (IsFloat(out.dtype)) {"
_CAST_NEW = "if (IsFloat(out.dtype) || out.dtype == DT_FP8E4M3 || out.dtype == DT_FP8E5M2) {"
# 2. fp8_convert.cpp: E4M3 saturates at 240; route E4M3 through torch's OCP float8_e4m3fn.
_FP8_HELPERS = """
static torch::Tensor TilesimE4M3Decode(const torch::Tensor &bits) {
    return bits.view(torch::kFloat8_e4m3fn).to(torch::kFloat32);
}
static torch::Tensor TilesimE4M3Encode(const torch::Tensor &x) {
    auto y = x.to(torch::kFloat32).clamp(-448.0, 448.0);
    return y.to(torch::kFloat8_e4m3fn).view(torch::kUInt8).contiguous();
}
"""
_DEC_ANCHOR = "torch::Tensor Fp8ToFloat32(const torch::Tensor &self, DataType actualType) {"
_DEC_OLD = "case DT_FP8E4M3: return Fp8E4M3ToFloat32(self);"
_ENC_OLD = "case DT_FP8E4M3: return Float32ToFp8E4M3(self);"


def _patch_source(path: Path, edits: list[tuple[str, str]]) -> None:
    """Apply ``(old, new)`` edits to ``path``; each ``old`` must occur exactly once."""
    text = path.read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise SimError(f"{path.name}: expected one {old!r}; pypto's calculator changed")
        text = text.replace(old, new)
    path.write_text(text)


def _patched_sources(pkg_lib: Path, dst: Path) -> Path:
    """Copy ``lib/calculator`` to ``dst`` and apply the two FP8 fixes and the K-tile matmul;
    returns the source dir."""
    shutil.copytree(pkg_lib / "calculator", dst / "calculator")
    os.symlink(pkg_lib / "libc_sec.so", dst / "libc_sec.so")
    src = dst / "calculator" / "src"
    _patch_source(
        src / "calc_torch.cpp",
        [(_CAST_OLD, _CAST_NEW), (_MM_ANCHOR, _MM_HELPER + _MM_ANCHOR), *_MM_CALLS],
    )
    _patch_source(
        src / "fp8_convert.cpp",
        [
            (_DEC_ANCHOR, _FP8_HELPERS + _DEC_ANCHOR),
            # the replaced converters stay defined; the build uses -Werror=unused-function
            (
                "static torch::Tensor Fp8E4M3ToFloat32(",
                "[[maybe_unused]] static torch::Tensor Fp8E4M3ToFloat32(",
            ),
            (
                "static torch::Tensor Float32ToFp8E4M3(",
                "[[maybe_unused]] static torch::Tensor Float32ToFp8E4M3(",
            ),
            (_DEC_OLD, "case DT_FP8E4M3: return TilesimE4M3Decode(self);"),
            (_ENC_OLD, "case DT_FP8E4M3: return TilesimE4M3Encode(self);"),
        ],
    )
    return dst / "calculator"


# 3. calc_torch.cpp: the cube's K tiles. Stock 0.2.0 runs every matmul (and every K step of
#    MatmulMultiDataLoad) as libtorch's FP32 matmul, so the sum inside a K tile is MKL's, in an
#    order that depends on the CPU's code path: a partial that lands within a few FP32 ULPs of
#    a BF16 rounding midpoint rounds either way on different machines. The patch sums each K
#    step in float64 -- exact for products of BF16, FP16, FP8 and INT8 operands, so no order
#    can change it -- and rounds the step's partial once to FP32 before the FP32 accumulator
#    update: the cube model of ``tilesim.reference.util.arith.matmul_fp32`` (docs/device.md,
#    "A deterministic interpreter").
_MM_HELPER = """
static torch::Tensor TilesimTileMatmul(const torch::Tensor &a, const torch::Tensor &b) {
    if (a.scalar_type() != torch::kFloat || b.scalar_type() != torch::kFloat) {
        return torch::matmul(a, b);
    }
    return torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble)).to(torch::kFloat);
}
"""
_MM_ANCHOR = "static void MatmulMultiDataLoad("
_MM_CALLS = [
    (
        "out.add_(torch::matmul(viewL, viewR));",
        "out.add_(TilesimTileMatmul(viewL, viewR));",
    ),
    (
        "tout.second.add_(torch::matmul(tself.second, tother.second) + bias_tensor.second);",
        "tout.second.add_(TilesimTileMatmul(tself.second, tother.second) + bias_tensor.second);",
    ),
    (
        "tout.second.add_(torch::matmul(tself.second, tother.second));",
        "tout.second.add_(TilesimTileMatmul(tself.second, tother.second));",
    ),
]


def load_calculator() -> Path:
    """Build (once per pypto/torch install, cached on disk, ~30 s) and load the calculator.

    Stock 0.2.0 rebuilds it in a temporary directory in every process. Needs a system
    (ELF) ``cmake >= 3.16``, ``make`` and ``g++ >= 9.4``. Returns the library path.
    """
    torch = require_torch()
    pypto = require_pypto()
    from pypto.frontend.parser import entry

    mgr = entry.BuildOnlineManager()
    stock = os.environ.get("TILESIM_SIM_STOCK_CALC", "") not in ("", "0")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = f"calc-{pkg_key(pypto_pkg_dir())}-torch{torch.__version__}-abi{abi}-" + (
        "stock" if stock else "fp8ocp-tilemm"
    )
    build = cache_dir() / key
    lib = build / "install" / "lib" / "libtile_fwk_calculator.so"
    if mgr.calculator_loaded:
        return lib
    with file_lock(cache_dir() / (key + ".lock")):
        if not lib.exists():
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir(parents=True)
            pkg_lib = Path(str(mgr.pkg_lib_dir))
            src = pkg_lib / "calculator" if stock else _patched_sources(pkg_lib, build / "src")
            # built directly (not via mgr._TorchContext, which replaces os.environ by a dict)
            cmake = mgr._CMakeContext()
            ctx = mgr._CMakeContext.CompileContext(src_dir=src, tmp_dir=build)
            ctx.cfg_cmd_ext = _torch_build_flags(torch)
            ctx.build_job_num = os.cpu_count() or 2
            try:
                cmake.compile(ctx=ctx)
            except Exception as e:
                out = getattr(e, "stderr", "") or ""
                raise SimError(f"building pypto's calculator failed: {e}\n{out[-4000:]}") from e
    import ctypes

    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    mgr.calculator_loaded = True
    del pypto
    return lib
