"""The simulator's on-disk cache: where it builds things and how it publishes them.

Everything :mod:`tilesim.device.sim` builds (the calculator, the 950 package overlay, the
cost-model configs) lives under :func:`cache_dir` (``TILESIM_SIM_CACHE``, default
``~/.cache/tilesim/sim``), keyed by the installed pypto (:func:`pkg_key`), and is published
atomically so that concurrent processes (pytest-xdist workers, spawned children) never see a
half-written entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from tilesim.device._lazy import require_pypto


def cache_dir() -> Path:
    """The cache directory (``$TILESIM_SIM_CACHE`` or ``~/.cache/tilesim/sim``), created."""
    d = os.environ.get("TILESIM_SIM_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tilesim", "sim"
    )
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


def pypto_pkg_dir() -> Path:
    """Directory of the INSTALLED pypto package (not an overlay), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("pypto")
    if spec is None or spec.origin is None:
        require_pypto()  # raises the ImportError that says what to install
    return Path(os.path.realpath(spec.origin)).parent


def pkg_key(pkg: Path) -> str:
    """Cache key of a pypto install: its version and a hash of its directory."""
    from importlib import metadata

    try:
        ver = metadata.version("pypto")
    except metadata.PackageNotFoundError:
        ver = "unknown"
    return f"pypto{ver}-" + hashlib.sha1(str(pkg).encode()).hexdigest()[:10]


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written ``tmp`` dir to ``final`` (another process may have won the race)."""
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.exists():
            raise


def publish_file(text: str, final: Path) -> None:
    """Write ``text`` to ``final`` atomically (a temp file in the same folder, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=final.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, final)


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive ``flock`` on ``path`` for the block (one build at a time across processes)."""
    import fcntl

    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
