"""nox sessions of tilesim.

* ``reference`` — CPU tests of tilesim.shared + tilesim.reference (+ torch cross-checks).
* ``lint``      — ruff check + ruff format --check.
* ``sim``, ``device``, ``bench`` — added by the device and CLI work (see docs/index.md).

torch: the CPU build ``torch==2.13.0`` is installed first and explicitly, so nothing later can
pull a multi-GB CUDA build. Where pip has no local copy of it (no ``PIP_FIND_LINKS``), the
PyTorch CPU wheel index is added; set ``TILESIM_TORCH_INDEX`` to use another index.
"""

from __future__ import annotations

import os

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


def pytest_args(session: nox.Session, *default: str) -> list[str]:
    return list(session.posargs) if session.posargs else list(default)


@nox.session(python=PYTHON)
def reference(session: nox.Session) -> None:
    """CPU-only tests of tilesim.shared and tilesim.reference."""
    install_cpu_torch(session)
    session.install(".[torch,test,cli]")
    session.run("pytest", *pytest_args(session, "-m", "not sim and not npu", "tests"))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check + format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
