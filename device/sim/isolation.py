"""Running a function in a fresh process configured for a SoC (:func:`isolated`).

A kernel that fails while being recorded or compiled leaves pypto unusable in its process, and
the two SoCs cannot share a process, so tests call their checks through :func:`isolated`. The
child runs with :data:`PINNED_ENV` over the caller's environment (docs/device.md, "A
deterministic interpreter").

Each child is forked from a fork server (``multiprocessing``'s ``forkserver``) that has already
imported :data:`PRELOAD` -- torch, NumPy and tilesim's own modules, never pypto, which the child
imports after choosing its SoC -- so a call does not pay those imports again. The server is
started once per calling process, with :data:`PINNED_ENV` (what torch reads when imported);
each child then takes the caller's environment of the moment, with :data:`PINNED_ENV` over it,
before it configures its SoC. Where ``forkserver`` is not available, children are spawned.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import sys
import tempfile
import time

from tilesim.device.sim.errors import SimError
from tilesim.device.sim.process import configure
from tilesim.device.sim.soc_target import sim_soc
from tilesim.shared.soc import DEFAULT_SOC, SIM_SOCS

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

#: what the fork server imports once for all its children: everything a child needs before it
#: chooses its SoC, and nothing that imports pypto (a module missing here is skipped)
PRELOAD = ("numpy", "ml_dtypes", "torch", "tilesim.shared", "tilesim.device", "tilesim.device.sim")


@contextlib.contextmanager
def _child_environment():
    """``os.environ`` with :data:`PINNED_ENV` while a child process is started (the fork
    server, and a spawned child, copy the parent's environment when they start); restored
    after."""
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


def _child_env() -> dict:
    """The environment a child runs with: the caller's, with :data:`PINNED_ENV` over it."""
    return {**os.environ, **PINNED_ENV}


def _context():
    """The ``multiprocessing`` context children start from: the fork server with
    :data:`PRELOAD` (takes effect when the server starts), else spawn."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _child_main(queue, soc: str, workdir: str, payload: bytes, env: dict) -> None:
    """The child: take ``env`` (:func:`_child_env`) as its environment, configure ``soc``, run
    the pickled call, put ``("ok", result)`` or ``("err", text)`` on ``queue``."""
    import traceback

    os.environ.clear()
    os.environ.update(env)
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
    """Run ``fn(*args, **kwargs)`` in a fresh process configured for ``soc``.

    ``fn`` must be importable (module level) and its arguments and result picklable (torch
    tensors are fine). Returns the result or raises :class:`SimError` carrying the child's
    exception and traceback; a child that dies (e.g. pypto aborts) or exceeds ``timeout``
    seconds raises too. Costs about 0.5 s per call (the fork, pypto's import, the SoC's
    set-up; measured on the 2-core CI box), 3 s more for the call that starts the fork server.
    """
    import queue as queue_mod

    target = sim_soc(soc)
    if target not in SIM_SOCS:
        raise ValueError(f"soc: expected one of {SIM_SOCS}, got {soc!r}")
    payload = pickle.dumps((fn, args, kwargs))
    # created here so that it is removed even when the child dies without running atexit
    workdir = tempfile.mkdtemp(prefix=f"tilesim-sim-{target}-")
    ctx = _context()
    q = ctx.Queue()
    env = _child_env()
    p = ctx.Process(target=_child_main, args=(q, target, workdir, payload, env), daemon=True)
    with _child_environment():  # the fork server, if this call starts it, starts pinned
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
