"""Threads of the references: OpenBLAS threads and the worker pool for independent work items.

The references' matmuls are small (the DeepSeek golden: at most ``[128, 576] x [576, 2048]`` per
KV tile; MSA decode: ``[16, 128] x [128, 128]`` per batch row and KV head). On a busy 2-core
machine, multi-threaded OpenBLAS spends most of its time waking and parking threads: measured 12x
slower than one thread for the ``[128,576] x [576,512]`` tile while other jobs ran. These
references therefore parallelise over work items that share no reduction (DeepSeek: query
tokens; MSA decode: blocks of batch rows; MSA main branch: (KV head, query-row block)) and run
BLAS on ``TILESIM_BLAS_THREADS`` threads (default 1) in every thread that does their matmuls:

* :func:`blas_threads` sets the count for the calling (main) thread for one op call and restores
  it afterwards; :func:`pin_blas_thread` sets it for good in a worker thread of the pool.
  Both use ``openblas_set_num_threads_local`` (OpenBLAS >= 0.3.27), which only affects the
  calling thread. Without it they fall back to the process-wide setter: :func:`blas_threads`
  then covers the workers too, and other Python threads doing BLAS work at the same moment also
  run on that many threads meanwhile (:func:`pin_blas_thread` does nothing in that case).
* :func:`ref_workers` is the size of the pool: ``TILESIM_REF_THREADS`` (``1`` = serial, in the
  calling thread), default ``min(usable CPUs, 4)``.
* :func:`map_in_order` runs a function over the work items on that pool and yields the results
  in item order.

Numbers never depend on either: the goldens accumulate in float64 and round once to FP32,
OpenBLAS splits GEMMs across threads along M/N, not K, and every work item is computed by one
thread with the same operations whichever thread it is.

``TILESIM_BLAS_THREADS``: thread count to use (default 1); ``0`` leaves BLAS alone. Nothing
happens when NumPy is not linked against OpenBLAS or the library cannot be found.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from tilesim.shared.env import env_int


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


#: default cap of the pool (more threads mostly wait for the GIL between matmuls)
MAX_DEFAULT_WORKERS = 4


def _wanted() -> int:
    """``TILESIM_BLAS_THREADS`` (>= 0), read by the environment policy of
    :mod:`tilesim.shared.env`."""
    return env_int(os.environ, "TILESIM_BLAS_THREADS", 1, lo=0)


def ref_workers() -> int:
    """Pool size: ``TILESIM_REF_THREADS`` (>= 1; 1 = serial), default ``min(CPUs, 4)``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return env_int(os.environ, "TILESIM_REF_THREADS", max(1, min(cpus, MAX_DEFAULT_WORKERS)))


def pin_blas_thread() -> None:
    """Pool-worker initializer: this thread's OpenBLAS uses ``TILESIM_BLAS_THREADS`` threads.

    Only with the per-thread setter; the process-wide fallback is left to :func:`blas_threads`.
    """
    n = _wanted()
    fns = _openblas() if n else None
    if fns is not None and fns[0] is not None:
        fns[0](n)


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


def map_in_order(fn: Callable, items: Iterable) -> Iterator:
    """``fn(item)`` for every item, yielded in item order.

    With :func:`ref_workers` > 1 (and more than one item) the calls run on a thread pool whose
    workers pin their BLAS (:func:`pin_blas_thread`); otherwise in the calling thread. ``fn``
    must only write state no other item touches. Closing the generator early (an exception in
    the consumer) cancels the calls not yet started and waits for the running ones.
    """
    items = list(items)
    workers = min(ref_workers(), len(items))
    if workers <= 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(workers, initializer=pin_blas_thread)
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["MAX_DEFAULT_WORKERS", "blas_threads", "map_in_order", "pin_blas_thread", "ref_workers"]
