"""tilesim.device.sim — run a PyPTO 0.2.0 kernel on a CPU: compile, interpret, read back, cost.

The one module with the CPU ("sim") machinery every kernel test uses. The recipe and the
reasons behind each piece are written up in ``docs/device.md`` and ``docs/sources.md`` ("PyPTO
0.2.0 on a CPU"); what it patches is PyPTO 0.2.0's own code (the ``pypto==0.2.0`` package of
``hicann/pypto``: ``pypto/frontend/parser/entry.py``, ``pypto/lib/calculator/src/``,
``pypto/lib/configs/``).

What it does, in order:

1. :func:`configure` prepares THIS process for one SoC before pypto is imported: unsets
   ``ASCEND_HOME_PATH`` (pypto would load CANN and fail), points ``TILEFWK_CONFIG_PATH`` at a
   cost-model config for the SoC (latency tables, core count, no swim-lane PNG scripts), sends
   PyPTO's per-call output folders to a private temp dir (removed at exit), and for the 950
   puts a *package overlay* of pypto first on ``sys.path`` whose platform ini is the
   Ascend950PR one (0.2.0 has no API to choose the target; the compiler then reports
   ``DAV_3510``). One process = one SoC.
2. It patches two methods of ``pypto.frontend.parser.entry.JitCallableWrapper``: stock 0.2.0
   feeds the host interpreter zeros instead of your tensors (and then copies that result over
   your tensors); the patch hands it the real CPU tensors, and makes the cost-model step
   optional.
3. :func:`load_calculator` builds PyPTO's interpreter back end (C++ on libtorch) once into a
   cache directory, with a source patch that gives FP8 E4M3 casts OCP ``float8_e4m3fn``
   semantics (stock 0.2.0 rounds to integers before an FP8 cast and saturates at 240).
4. :func:`run_kernel` calls a ``@pypto.frontend.jit`` kernel on CPU torch tensors: compile,
   interpret with the real inputs, write the results back INTO the tensors (every argument is
   an in/out buffer), and return the cost model's simulated AICore time in microseconds.
5. :func:`isolated` runs a function in a fresh spawned process configured for a SoC. A kernel
   that fails while being recorded or compiled leaves pypto unusable in that process, and the
   two SoCs cannot share a process — so tests call their checks through it.

Environment knobs: ``TILESIM_SIM_CACHE`` (calculator, overlay and configs; default
``~/.cache/tilesim/sim``), ``TILESIM_SIM_KEEP=1`` (keep PyPTO's output folders and print where),
``TILESIM_SIM_STOCK_CALC=1`` (build the unpatched calculator), ``TILESIM_SOC`` (SoC of a process
that runs a kernel without calling :func:`configure`; default ``910b``).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tilesim.device._lazy import require_pypto, require_torch
from tilesim.shared.soc import COST_MODEL_CYCLES_PER_US, DEFAULT_SOC, SIM_SOCS, get_soc

__all__ = [
    "PINNED_ENV",
    "SimError",
    "SimRun",
    "configure",
    "cost_only",
    "current_soc",
    "isolated",
    "load_calculator",
    "record_roots",
    "run_compile",
    "run_cost",
    "run_kernel",
    "sim_soc",
    "warm",
]

_STATE: dict = {"soc": None, "workdir": None, "patched": False}


class SimError(RuntimeError):
    """A kernel failed to compile/interpret on CPU, or a child process of :func:`isolated` failed
    (message = exception type, text and the child's traceback)."""


@dataclass(frozen=True)
class SimRun:
    """What one :func:`run_kernel` call measured.

    ``us``: cost-model AICore end-to-end time (max task end - min task start over AIC/AIV cores,
    cycles / 1800), ``None`` when the cost model was not run. ``cycles``: the whole machine
    model's total cycles incl. AICPU scheduling (``None`` if absent). ``seconds``: wall time.
    """

    soc: str
    us: float | None
    cycles: int | None
    seconds: float


# ---------------------------------------------------------------- paths and per-SoC set-up
def sim_soc(soc: str) -> str:
    """The compile target of a SoC name: ``"910b"`` or ``"950"`` (``"950dt"`` compiles as 950)."""
    spec = get_soc(soc)
    return "950" if spec.arch == "DAV_3510" else "910b"


def cache_dir() -> Path:
    d = os.environ.get("TILESIM_SIM_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tilesim", "sim"
    )
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


def _pypto_pkg_dir() -> Path:
    """Directory of the INSTALLED pypto package (not an overlay), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("pypto")
    if spec is None or spec.origin is None:
        require_pypto()  # raises the ImportError that says what to install
    return Path(os.path.realpath(spec.origin)).parent


def _pkg_key(pkg: Path) -> str:
    from importlib import metadata

    try:
        ver = metadata.version("pypto")
    except metadata.PackageNotFoundError:
        ver = "unknown"
    return f"pypto{ver}-" + hashlib.sha1(str(pkg).encode()).hexdigest()[:10]


def _publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written ``tmp`` dir to ``final`` (another process may have won the race)."""
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.exists():
            raise


def _publish_file(text: str, final: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=final.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, final)


# Values the 0.2.0 platform parser reads, for the Ascend950PR_9579 (upstream platform config).
_INI_950 = """[version]
SoC_version=Ascend950PR_9579
Short_SoC_version=Ascend950
AIC_version=AIC-C-310
CCEC_AIC_version=dav-c310-cube
CCEC_AIV_version=dav-c310-vec
CCEC_CUBE_version=dav-c310-cube
CCEC_VECTOR_version=dav-c310-vec
NpuArch=3510

[SoCInfo]
ai_core_cnt=28
cube_core_cnt=28
vector_core_cnt=56
ai_cpu_cnt=5

[AICoreSpec]
cube_freq=1650
l0_a_size=65536
l0_b_size=65536
l0_c_size=262144
l1_size=524288
ub_size=253952
bt_size=4096
fb0_size=4096
"""


def overlay_950() -> Path:
    """A directory to put first on ``sys.path`` so that ``import pypto`` targets DAV_3510.

    pypto 0.2.0 without CANN reads the SoC only from ``<pkg>/lib/configs/A2A3.ini`` (found next
    to its platform library). The overlay links every file of the installed package except
    ``lib/configs``, whose ``A2A3.ini`` carries the Ascend950PR values. Built once per install.
    """
    pkg = _pypto_pkg_dir()
    final = cache_dir() / f"overlay950-{_pkg_key(pkg)}"
    if (final / "pypto" / "lib" / "configs" / "A2A3.ini").exists():
        return final
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix="overlay950-tmp-"))
    root = tmp / "pypto"
    (root / "lib" / "configs").mkdir(parents=True)
    for entry in pkg.iterdir():
        if entry.name not in ("lib", "__pycache__"):
            os.symlink(entry, root / entry.name)
    for entry in (pkg / "lib").iterdir():
        if entry.name != "configs":
            os.symlink(entry, root / "lib" / entry.name)
    for entry in (pkg / "lib" / "configs").iterdir():
        shutil.copy2(entry, root / "lib" / "configs" / entry.name)
    (root / "lib" / "configs" / "A2A3.ini").write_text(_INI_950)
    _publish_dir(tmp, final)
    return final


def cost_config(soc: str) -> Path:
    """A ``tile_fwk_config.json`` for ``TILEFWK_CONFIG_PATH`` (read once at pypto start-up).

    910b: A2A3 latency tables, 6 AICPU machines (24 AIC / 48 AIV). 950: A5 tables, 7 machines
    (28 AIC / 56 AIV), device platform ASCEND_950PR_9579. Both skip the swim-lane PNG/HTML
    scripts (``Model.drawPngThresholdCycle=0``); the timing json is still written.
    """
    target = sim_soc(soc)
    pkg = _pypto_pkg_dir()
    final = cache_dir() / f"costcfg-{target}-{_pkg_key(pkg)}.json"
    if final.exists():
        return final
    cfg = json.loads((pkg / "lib" / "configs" / "tile_fwk_config.json").read_text())
    arch, machines, platform = (
        ("A5", 7, "ASCEND_950PR_9579") if target == "950" else ("A2A3", 6, "ASCEND_910B2")
    )
    cfg["global"]["platform"]["device_platform"] = platform
    keep = [
        a
        for a in cfg["global"]["simulation"]["args"]
        if not a.startswith(
            ("Model.deviceArch=", "Model.aicpuMachineNumber=", "Model.drawPngThresholdCycle=")
        )
    ]
    keep += [
        f"Model.deviceArch={arch}",
        f"Model.aicpuMachineNumber={machines}",
        "Model.drawPngThresholdCycle=0",
    ]
    cfg["global"]["simulation"]["args"] = keep
    _publish_file(json.dumps(cfg, indent=2), final)
    return final


def current_soc() -> str | None:
    """SoC this process was configured for (``None`` before :func:`configure`)."""
    return _STATE["soc"]


def configure(soc: str | None = None, *, workdir: str | None = None) -> str:
    """Prepare this process to compile for ``soc`` (default ``$TILESIM_SOC`` or ``910b``).

    Must run before pypto is imported; calling it again with the same SoC is a no-op, with
    another SoC a :class:`SimError` (use :func:`isolated`). ``workdir``: where PyPTO's output
    goes (default a fresh temp dir, removed at exit). Returns the compile target name.
    """
    if soc is None and _STATE["soc"] is not None:
        return _STATE["soc"]
    target = sim_soc(soc or os.environ.get("TILESIM_SOC") or DEFAULT_SOC)
    if _STATE["soc"] is not None:
        if _STATE["soc"] != target:
            raise SimError(
                f"soc: this process is set up for {_STATE['soc']!r}, got {target!r}; "
                "one process compiles for one SoC -- run it through tilesim.device.sim.isolated"
            )
        return target
    if "pypto" in sys.modules:
        raise SimError(
            "pypto was imported before tilesim.device.sim.configure(); call configure(soc) "
            "first (or run the kernel through tilesim.device.sim.isolated)"
        )
    require_torch()
    os.environ.pop("ASCEND_HOME_PATH", None)  # SIM mode; with it set pypto loads CANN and fails
    os.environ["TILEFWK_CONFIG_PATH"] = str(cost_config(target))
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"tilesim-sim-{target}-"))
    os.environ["TILE_FWK_OUTPUT_DIR"] = str(workdir / "output")
    os.environ.setdefault("PYPTO_HOME", str(workdir / "pypto_home"))
    if not os.environ.get("TILESIM_SIM_KEEP"):
        atexit.register(shutil.rmtree, str(workdir), True)
    if target == "950":
        sys.path.insert(0, str(overlay_950()))
    pypto = require_pypto()
    arch = pypto.platform.npuarch
    want = get_soc(target).arch
    if arch != want:
        raise SimError(f"soc {target!r}: pypto compiles for {arch!r}, expected {want!r}")
    _STATE["soc"] = target
    _STATE["workdir"] = workdir
    _patch()
    return target


# ---------------------------------------------------------------- calculator (interpreter back end)
def _torch_build_flags(torch) -> str:
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
#    update: the cube model of ``tilesim.reference.arith.matmul_fp32`` (docs/device.md,
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
    ("out.add_(torch::matmul(viewL, viewR));", "out.add_(TilesimTileMatmul(viewL, viewR));"),
    (
        "tout.second.add_(torch::matmul(tself.second, tother.second) + bias_tensor.second);",
        "tout.second.add_(TilesimTileMatmul(tself.second, tother.second) + bias_tensor.second);",
    ),
    (
        "tout.second.add_(torch::matmul(tself.second, tother.second));",
        "tout.second.add_(TilesimTileMatmul(tself.second, tother.second));",
    ),
]


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    key = f"calc-{_pkg_key(_pypto_pkg_dir())}-torch{torch.__version__}-abi{abi}-" + (
        "stock" if stock else "fp8ocp-tilemm"
    )
    build = cache_dir() / key
    lib = build / "install" / "lib" / "libtile_fwk_calculator.so"
    if mgr.calculator_loaded:
        return lib
    with _file_lock(cache_dir() / (key + ".lock")):
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


# ---------------------------------------------------------------- monkeypatches
_MODE = {"costmodel": True, "cost_only": False, "roots": None}


def _patch() -> None:
    if _STATE["patched"]:
        return
    pypto = require_pypto()
    from pypto import pypto_impl, runtime
    from pypto.frontend.parser import entry

    def setup_verify_data(pto_tensors):
        # the interpreter gets the caller's CPU tensors (SetVerifyData copies them); stock
        # 0.2.0 copies device->host instead, which leaves zeros on a CPU-only machine
        if not pypto.get_verify_options().get("enable_pass_verify"):
            return
        load_calculator()
        pypto_impl.SetVerifyData(
            runtime._pto_to_tensor_data(list(pto_tensors)),
            [],
            runtime._pto_verify_datas.get_data(),
        )

    def execute_kernel(self, torch_tensors, tensor_defs):
        # SIM branch only; the interpreter runs inside compile() when verify is enabled
        pto = self._convert_tensors_with_metadata(torch_tensors, tensor_defs)
        with pypto.options("jit_scope"):
            self._set_config_option()
            pypto_impl.DeviceInit()
            self.compile(pto)
            if _MODE["costmodel"]:
                self._run_with_cpu(pto, [])

    entry.JitCallableWrapper._setup_verify_data = staticmethod(setup_verify_data)
    entry.JitCallableWrapper._execute_kernel = execute_kernel
    _STATE["patched"] = True


# ---------------------------------------------------------------- running a kernel
def _check_args(args) -> None:
    torch = require_torch()
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"args[{i}]: expected a torch.Tensor, got {type(a).__name__}")
        if a.device.type != "cpu":
            raise ValueError(f"args[{i}]: expected a CPU tensor for the simulator, got {a.device}")
        if not a.is_contiguous():
            raise ValueError(f"args[{i}]: expected a contiguous tensor")


def _swim_us(sim_dir: Path) -> float | None:
    """AICore end-to-end time from ``_simulate.swim.json`` (what draw_swim_lane.py prints)."""
    f = sim_dir / "_simulate.swim.json"
    if not f.exists():
        return None
    start = end = None
    for core in json.loads(f.read_text()):
        if core.get("coreType") not in ("AIC", "AIV"):
            continue
        for t in core.get("tasks", []):
            s, e = t.get("execStart", 0), t.get("execEnd", 0)
            if e < s:
                continue
            start = s if start is None else min(start, s)
            end = e if end is None else max(end, e)
    return 0.0 if start is None else (end - start) / COST_MODEL_CYCLES_PER_US


def _total_cycles(sim_dir: Path) -> int | None:
    f = sim_dir / "_simulate.stat.report.txt"
    if not f.exists():
        return None
    for line in f.read_text().splitlines():
        if line.startswith("Total Cycles"):
            return int(line.split(":")[-1])
    return None


def _drop_output(top: Path) -> None:
    if os.environ.get("TILESIM_SIM_KEEP"):
        print(f"[tilesim.sim] kept {top}", file=sys.stderr)
    else:
        shutil.rmtree(top, ignore_errors=True)


def run_kernel(kernel, args, *, costmodel: bool = True, pass_filter=(), **params) -> SimRun:
    """Compile ``kernel`` on CPU, interpret it on ``args`` IN PLACE, optionally run the cost model.

    kernel      a ``@pypto.frontend.jit`` function defined in a ``.py`` file (the frontend
                re-reads its source); ``params`` are its non-tensor parameters.
    args        CPU torch tensors in signature order. Every one is an in/out buffer: after the
                call each holds the interpreter's final value; regions the kernel never
                writes keep what the caller put there.
    costmodel   also run the cost model (needed for the in-place read-back too: the results
                come back through its final copy). ``False`` = compile + interpret only, and
                the arguments are NOT updated -- use it to check that a kernel compiles.
    pass_filter ``()``: interpret the tensor graph only; ``["all"]``: also re-interpret after
                every compiler pass and compare (slow, superlinear in loop trips).

    Inside a :func:`cost_only` block (and with ``costmodel``) it is :func:`run_cost` instead:
    no interpretation, the arguments keep what the caller put there.

    Returns a :class:`SimRun`. Configures the process for the default SoC if needed.
    """
    if _MODE["cost_only"] and costmodel:
        return run_cost(kernel, args, **params)
    pypto_impl = _prepare(
        args,
        costmodel,
        enable_pass_verify=True,
        pass_verify_save_tensor=False,
        pass_verify_pass_filter=list(pass_filter),
    )
    require_pypto().set_verify_golden_data(goldens=[None] * len(args))
    seconds = _call(kernel, args, params)
    return _collect(pypto_impl, costmodel, seconds)


def run_cost(kernel, args, **params) -> SimRun:
    """Compile ``kernel`` and run the cost model on ``args`` WITHOUT the host interpreter.

    Same call and result as :func:`run_kernel`, but the tensor graph is never interpreted
    (``enable_pass_verify=False``), so the outputs are NOT computed: every argument keeps what
    the caller put there. The cost model only needs the compiled program and the inputs: PyPTO
    0.2.0's ``CostModelRunOnceDataFromHost`` runs the device control flow (loop trip counts,
    scalars read from input tensors) on the caller's tensors and charges each leaf task its
    modelled time -- it never reads a value the interpreter would have produced. So the µs
    equal :func:`run_kernel`'s for the same kernel and arguments (tested on a small case),
    at the cost of compile + cost model only: what makes shapes too big to interpret
    costable. A kernel whose control flow read a tensor the kernel itself writes would see
    the caller's values there, not computed ones.
    """
    pypto_impl = _prepare(args, True, enable_pass_verify=False)
    seconds = _call(kernel, args, params)
    return _collect(pypto_impl, True, seconds)


@contextlib.contextmanager
def cost_only():
    """Within the block, :func:`run_kernel` (and so every wrapper's ``backend="sim"`` call)
    runs :func:`run_cost`: the cost model's µs without interpreting -- the wrapper's output is
    NOT computed (it holds whatever its buffer held). For costing shapes too big to interpret
    through the wrappers' own argument building. Not re-entrant across threads."""
    before = _MODE["cost_only"]
    _MODE["cost_only"] = True
    try:
        yield
    finally:
        _MODE["cost_only"] = before


@contextlib.contextmanager
def record_roots():
    """Within the block, every kernel call that runs the cost model (:func:`run_kernel`,
    :func:`run_cost`, so every wrapper's ``backend="sim"`` call) appends to the yielded list
    ``{root function: leaf tasks}`` of the root functions its device control flow RAN on the
    call's inputs (:func:`_root_tasks`): which loop bodies and unroll chunks a runtime length
    took, not which were compiled. Not re-entrant across threads."""
    before, _MODE["roots"] = _MODE["roots"], []
    try:
        yield _MODE["roots"]
    finally:
        _MODE["roots"] = before


def _root_tasks(top: Path) -> dict[str, int]:
    """Leaf tasks per root function that the cost model's run of the device control flow
    dispatched: one row of ``dyn_topo.txt`` per task, whose fourth column is its root
    function's hash; the name is that function's ``rawname`` in ``program.json`` (PyPTO names
    a loop body's root after its loop, e.g. ``TENSOR_<loop>_LoopUnroll<u>_Unroll1_PATH0_
    hiddenfunc0_root`` for the chunks of unroll factor ``u`` of a ``loop_unroll``)."""
    functions = json.loads((top / "program.json").read_text())["functions"]
    names = {str(f["hash"]): f["rawname"] for f in functions
             if str(f.get("rawname", "")).endswith("_root")}  # fmt: skip
    out: dict[str, int] = {}
    with open(top / "dyn_topo.txt") as rows:
        next(rows)  # header: seqNo,taskId,rootIndex,rootHash,...
        for row in rows:
            name = names.get(row.split(",")[3], "?")
            out[name] = out.get(name, 0) + 1
    return out


def _collect(pypto_impl, costmodel: bool, seconds: float) -> SimRun:
    """The :class:`SimRun` of the call just made (read from PyPTO's output folder, then
    dropped)."""
    top = Path(pypto_impl.LogTopFolder())
    sim_dir = top / "CostModelSimulationOutput"
    us = _swim_us(sim_dir) if costmodel else None
    cycles = _total_cycles(sim_dir) if costmodel else None
    if costmodel and us is None:
        raise SimError(f"cost model wrote no {sim_dir}/_simulate.swim.json")
    if costmodel and _MODE["roots"] is not None:
        _MODE["roots"].append(_root_tasks(top))
    _drop_output(top)
    return SimRun(soc=_STATE["soc"], us=us, cycles=cycles, seconds=seconds)


def run_compile(kernel, args, **params) -> float:
    """Compile only (tensor graph -> passes -> host control-flow code); returns seconds."""
    pypto_impl = _prepare(args, False, enable_pass_verify=False)
    seconds = _call(kernel, args, params)
    _drop_output(Path(pypto_impl.LogTopFolder()))
    return seconds


def _prepare(args, costmodel: bool, **verify):
    """Configure the process, check ``args``, set PyPTO's verify options; returns pypto_impl."""
    configure()
    _check_args(args)
    pypto = require_pypto()
    from pypto import pypto_impl

    pypto.set_verify_options(**verify)
    _MODE["costmodel"] = costmodel
    return pypto_impl


#: The environment a simulator child starts with (over the caller's): the interpreter's libtorch
#: runs on one thread with fixed code paths, so its output bits do not depend on the caller's
#: thread settings, the machine's load or (for ATen's vector kernels and MKL) the CPU
#: generation. Measured and explained in docs/device.md, "A deterministic interpreter".
PINNED_ENV = {
    "OMP_NUM_THREADS": "1",  # libtorch's intra-op pool: one thread, one reduction order
    "MKL_NUM_THREADS": "1",
    "MKL_DYNAMIC": "FALSE",  # MKL may not pick its own thread count per call
    "OMP_DYNAMIC": "FALSE",
    "MKL_CBWR": "COMPATIBLE",  # MKL's CPU-independent code path (conditional reproducibility)
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vector width: the same on every AVX2+ x86 CPU
}


@contextlib.contextmanager
def _pinned_threads():
    """libtorch on one thread for the duration of a kernel call (restored after), so that a
    process that did not start through :func:`isolated` interprets with the same reduction
    order as one that did."""
    torch = require_torch()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _call(kernel, args, params: dict) -> float:
    """``kernel(*args, **params)`` with PyPTO's errors as :class:`SimError`, libtorch pinned to
    one thread; returns seconds."""
    t0 = time.perf_counter()
    try:
        with _pinned_threads():
            kernel(*args, **params)
    except Exception as e:
        raise SimError(f"{getattr(kernel, '__name__', kernel)}: {type(e).__name__}: {e}") from e
    return time.perf_counter() - t0


@contextlib.contextmanager
def _child_environment():
    """``os.environ`` with :data:`PINNED_ENV` while a child process is started (a spawned
    child copies the parent's environment at start); restored after."""
    saved = {k: os.environ.get(k) for k in PINNED_ENV}
    os.environ.update(PINNED_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------- process isolation
def _child_main(queue, soc: str, workdir: str, payload: bytes) -> None:
    import traceback

    try:
        if "pypto" in sys.modules:
            raise SimError(
                "pypto was imported before the child could choose its SoC: the parent's "
                "__main__ module imports pypto (or a kernel module) at top level -- move that "
                "import into a function or under `if __name__ == '__main__':`"
            )
        configure(soc, workdir=workdir)
        fn, args, kwargs = pickle.loads(payload)
        result = ("ok", pickle.dumps(fn(*args, **kwargs)))
    except BaseException as e:  # noqa: BLE001 -- pypto errors may not unpickle: send text
        tb = traceback.format_exc()
        result = ("err", f"{type(e).__name__}: {e}\n--- child traceback ---\n{tb}")
    queue.put(result)
    queue.close()
    queue.join_thread()


def isolated(fn, *args, soc: str = DEFAULT_SOC, timeout: float = 900.0, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a fresh spawned process configured for ``soc``.

    ``fn`` must be importable (module level) and its arguments and result picklable (torch
    tensors are fine). Returns the result or raises :class:`SimError` carrying the child's
    exception and traceback; a child that dies (e.g. pypto aborts) or exceeds ``timeout``
    seconds raises too. Costs ~2 s per call (process start + imports).
    """
    import multiprocessing as mp
    import queue as queue_mod

    target = sim_soc(soc)
    if target not in SIM_SOCS:
        raise ValueError(f"soc: expected one of {SIM_SOCS}, got {soc!r}")
    payload = pickle.dumps((fn, args, kwargs))
    # created here so that it is removed even when the child dies without running atexit
    workdir = tempfile.mkdtemp(prefix=f"tilesim-sim-{target}-")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_main, args=(q, target, workdir, payload), daemon=True)
    with _child_environment():
        p.start()
    deadline = time.monotonic() + timeout
    msg = None
    try:
        while msg is None:
            try:
                msg = q.get(timeout=1.0)
            except queue_mod.Empty:
                if not p.is_alive():
                    try:
                        msg = q.get(timeout=2.0)
                    except queue_mod.Empty:
                        raise SimError(
                            f"{getattr(fn, '__name__', fn)} [{target}]: child process died "
                            f"without a result (exit code {p.exitcode})"
                        ) from None
                elif time.monotonic() > deadline:
                    raise SimError(
                        f"{getattr(fn, '__name__', fn)} [{target}]: no result after {timeout} s"
                    ) from None
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
        if not os.environ.get("TILESIM_SIM_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)
    status, value = msg
    if status == "err":
        raise SimError(f"[{target}] {value}")
    return pickle.loads(value)


def warm() -> str:
    """Build the calculator, the 950 overlay and both cost configs (CI runs this once)."""
    t0 = time.perf_counter()
    overlay = overlay_950()
    for s in SIM_SOCS:
        cost_config(s)
    configure(os.environ.get("TILESIM_SOC") or DEFAULT_SOC)
    lib = load_calculator()
    return f"calculator {lib}\noverlay {overlay}\nready in {time.perf_counter() - t0:.1f} s"


if __name__ == "__main__":  # python -m tilesim.device.sim  -> warm the caches
    print(warm())
