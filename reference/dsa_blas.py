"""Run NumPy's OpenBLAS with a fixed thread count inside the sparse-attention golden.

The golden's matmuls are small (at most ``[128, 576] x [576, 2048]`` per KV tile). On a busy
2-core machine, multi-threaded OpenBLAS spends most of its time waking and parking threads:
measured 12x slower than one thread for the ``[128,576] x [576,512]`` tile while other jobs ran.
:func:`blas_threads` therefore sets the thread count for the duration of one op call and
restores it afterwards. The setting is process-wide (OpenBLAS has no per-thread count), so other
Python threads doing BLAS work at the same moment also run on that many threads meanwhile.

Numbers never depend on it: the golden accumulates in float64 and rounds once to FP32, and
OpenBLAS splits GEMMs across threads along M/N, not K.

``TILESIM_BLAS_THREADS``: thread count to use (default 1); ``0`` leaves BLAS alone. Nothing
happens when NumPy is not linked against OpenBLAS or the library cannot be found.
"""

from __future__ import annotations

import ctypes
import functools
import os
from contextlib import contextmanager


@functools.lru_cache(maxsize=1)
def _openblas():
    """``(set_returning_old, set, get)`` ctypes functions of NumPy's OpenBLAS, or ``None``."""
    import numpy  # noqa: F401  (make sure the library is loaded)

    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower() and ".so" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        local = getattr(lib, "openblas_set_num_threads_local", None)
        setter = getter = None
        for pre in ("scipy_openblas_", "openblas_"):
            for suf in ("64_", ""):
                setter = setter or getattr(lib, f"{pre}set_num_threads{suf}", None)
                getter = getter or getattr(lib, f"{pre}get_num_threads{suf}", None)
        if local is not None:
            local.restype = ctypes.c_int
            local.argtypes = [ctypes.c_int]
        if getter is not None:
            getter.restype = ctypes.c_int
        if setter is not None:
            setter.argtypes = [ctypes.c_int]
        if local is not None or (setter is not None and getter is not None):
            return local, setter, getter
    return None


def _wanted() -> int:
    raw = os.environ.get("TILESIM_BLAS_THREADS", "").strip()
    if not raw:
        return 1
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"TILESIM_BLAS_THREADS: expected an integer >= 0, got {raw!r}") from None
    if n < 0:
        raise ValueError(f"TILESIM_BLAS_THREADS: expected an integer >= 0, got {raw!r}")
    return n


@contextmanager
def blas_threads():
    """Context manager: OpenBLAS uses ``TILESIM_BLAS_THREADS`` (default 1) threads inside."""
    n = _wanted()
    fns = _openblas() if n else None
    if fns is None:
        yield
        return
    local, setter, getter = fns
    if local is not None:
        old = local(n)
        try:
            yield
        finally:
            local(old)
        return
    old = getter()
    setter(n)
    try:
        yield
    finally:
        setter(old)


__all__ = ["blas_threads"]
