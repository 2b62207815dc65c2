"""nox sessions of tilesim.

* ``reference`` — CPU tests of tilesim.shared + tilesim.reference (+ torch cross-checks).
* ``lint``      — ruff check + ruff format --check.
* ``sim``       — PyPTO kernels on the CPU (interpreter vs tilesim.reference + cost model, 910B
  and 950); the tests write build/perf/cost_model.md (+ .json), the session then copies them
  into docs/perf/. See docs/device.md.
* ``device``    — the kernels on an Ascend NPU, with the host's own torch/torch_npu/pypto/CANN.
* ``bench``     — reference timings (tests/bench, a development tool outside the package);
  writes build/perf/reference.md (+ .png), then copies them into docs/perf/.

Both test sessions run their tests on pytest-xdist workers (``TILESIM_TEST_WORKERS``, default 2:
the CI box's cores); extra arguments (``nox -s sim -- tests/device/test_moe_sim.py``) replace
the default ones, workers included.

Generated reports are written to build/perf/ (git-ignored) by the tests and tools, and only a
session copies them into the tracked docs/perf/: running pytest never rewrites a tracked file.

torch: the CPU build ``torch==2.13.0`` is installed first and explicitly, so nothing later can
pull a multi-GB CUDA build. Where pip has no local copy of it (no ``PIP_FIND_LINKS``), the
PyTorch CPU wheel index is added; set ``TILESIM_TORCH_INDEX`` to use another index.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["reference", "lint"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = None  # the interpreter nox runs under (>= 3.10)
TORCH = "torch==2.13.0"
_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_cpu_torch(session: nox.Session) -> None:
    """Install the CPU build of torch before anything that might ask for torch."""
    index = os.environ.get("TILESIM_TORCH_INDEX")
    if index:
        session.install(TORCH, "--index-url", index)
    elif os.environ.get("PIP_FIND_LINKS") or os.environ.get("CI"):
        session.install(TORCH)
    else:
        session.install(TORCH, "--extra-index-url", _CPU_INDEX)


def pytest_args(session: nox.Session, *default: str, parallel: bool = True) -> list[str]:
    """``session.posargs`` when given (they replace everything), else ``default``, run on
    :func:`workers` pytest-xdist workers when ``parallel``."""
    if session.posargs:
        return list(session.posargs)
    return ["-n", workers(), "--dist", "worksteal", *default] if parallel else list(default)


def workers() -> str:
    """pytest-xdist workers of the reference and sim sessions: ``TILESIM_TEST_WORKERS``, else 2
    (the CI box's cores). The sim tests spawn one simulator process each, so two workers keep
    both cores busy; the cost-model report merges the workers' rows (tests/device/conftest.py).
    """
    n = os.environ.get("TILESIM_TEST_WORKERS", "2")
    if not n.isdigit():
        raise ValueError(f"TILESIM_TEST_WORKERS: expected a whole number, got {n!r}")
    return n


BUILD_PERF = Path("build") / "perf"
DOCS_PERF = Path("docs") / "perf"


def publish_reports(session: nox.Session, *names: str) -> None:
    """Copy generated reports from build/perf/ into the tracked docs/perf/ (missing: skipped)."""
    DOCS_PERF.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = BUILD_PERF / name
        if src.exists():
            shutil.copy2(src, DOCS_PERF / name)
            session.log(f"copied {src} -> {DOCS_PERF / name}")
        else:
            session.log(f"{src} was not generated; {DOCS_PERF / name} left as it was")


def _marker(selection: str) -> str:
    """The session's pytest marker expression: under CI (``CI`` set: the 2-core box, whose
    whole run should stay within 25 minutes) the tests marked ``slow`` are left out -- the
    b64-class goldens and their replays (GBs, a minute of CPU each), the full-size kernel
    compiles and headline cost rows (minutes each). A plain ``nox -s reference sim`` runs
    them; docs/index.md lists what CI leaves out."""
    return f"{selection} and not slow" if os.environ.get("CI") else selection


@nox.session(python=PYTHON)
def reference(session: nox.Session) -> None:
    """CPU-only tests of tilesim.shared and tilesim.reference."""
    install_cpu_torch(session)
    session.install(".[torch,test,cli,checkpoint]")
    session.run("pytest", *pytest_args(session, "-m", _marker("not sim and not npu"), "tests"))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check + format check."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def sim(session: nox.Session) -> None:
    """PyPTO 0.2.0 kernels on CPU for 910B and 950: interpreter output vs tilesim.reference,
    cost-model time; the tests write build/perf/cost_model.md, copied into docs/perf/ after."""
    install_cpu_torch(session)
    session.install(".[device,test]")
    # build PyPTO's interpreter back end (~30 s, cached in ~/.cache/tilesim/sim) and the 950
    # overlay once, before pytest starts its per-test processes
    session.run("python", "-m", "tilesim.device.sim")
    marker = _marker("sim")
    # no reruns: the interpreter is pinned (tilesim.device.sim.PINNED_ENV, the K-tile matmul of
    # the patched calculator), so a failing sim test is a defect (docs/device.md)
    session.run("pytest", *pytest_args(session, "-m", marker, "tests/device", "tests/digests"))
    publish_reports(session, "cost_model.md", "cost_model.json")


_NPU_PROBE = """
import os, sys
if not os.environ.get("ASCEND_HOME_PATH"):
    sys.exit("ASCEND_HOME_PATH is not set (no CANN)")
try:
    import torch, torch_npu  # noqa: F401
except ImportError as e:
    sys.exit(f"torch_npu is not importable: {e}")
if not (torch.npu.is_available() and torch.npu.device_count() > 0):
    sys.exit("torch_npu sees no NPU")
"""


@nox.session(python=PYTHON, venv_backend="none")
def device(session: nox.Session) -> None:
    """The kernels on an Ascend NPU. Uses the host's torch / torch_npu / pypto / CANN as they are
    (no venv, nothing reinstalled); only tilesim itself is installed (--no-deps) if missing."""
    py = os.environ.get("TILESIM_PYTHON", "python3")
    try:
        session.run(py, "-c", _NPU_PROBE, silent=True)
    except nox.command.CommandFailed:
        session.error(
            "no Ascend NPU on this machine (needs CANN, torch_npu and a device); "
            "run `nox -s sim` to check the kernels on the CPU simulator instead"
        )
    try:
        session.run(py, "-c", "import tilesim.device", silent=True)
    except nox.command.CommandFailed:
        session.run(py, "-m", "pip", "install", "--no-deps", "-e", ".")
    args = pytest_args(session, "-m", "npu", "tests/device", parallel=False)  # one NPU: serial
    session.run(py, "-m", "pytest", *args)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Reference wall time vs a seeds-style torch golden and the sgemm roofline, plus peak memory
    of the DeepSeek b64 s2 64K golden; writes build/perf/reference.md + .png and copies them into
    docs/perf/. Not part of CI (minutes of CPU; numbers are only as quiet as the machine). The
    bench is the ``bench`` package of tests/ (not installed); extra args go to
    ``python -m bench`` (e.g. ``nox -s bench -- --quick``)."""
    install_cpu_torch(session)
    session.install(".[torch,cli]")
    out = str(BUILD_PERF.resolve())
    tests = str(Path("tests").resolve())
    session.run("python", "-m", "bench", "--out", out, *session.posargs, env={"PYTHONPATH": tests})
    publish_reports(session, "reference.md", "reference.png")
