"""The simulator gives the same output bits whatever the caller's thread settings and the
machine's load (docs/device.md, "A deterministic interpreter").

One small case per kernel family (``LOADED_RUNS`` of ``tests/digests/kernel_digests.py``) is
interpreted in a fresh simulator process from a caller that asks for four threads (OpenMP, MKL
with dynamic threading on) while two processes spin on the CPU; its digest must equal the
committed one. These runs are the CI check of those entries' digests
(``tests/digests/test_kernel_digests.py`` runs them again in the ``slow`` set). One entry is
also run from a one-thread caller with nothing spinning and must give the committed digest
too, so its quiet and loaded runs agree. A third test checks what the child process actually
runs with: the pinned environment and one libtorch thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
from digests.kernel_digests import DIGEST_FILE, LOADED_RUNS, entries, run_entry

pytestmark = [pytest.mark.sim, pytest.mark.torch]

#: one small entry per kernel family, the SoCs alternating
FAMILY_ENTRIES = LOADED_RUNS
#: families whose kernel is only a sequence of other families' kernels: the layer step launches
#: the four stage wrappers (device/dsa_attention_step.py), each with its own FAMILY_ENTRIES
#: entry, so its bits under threads and load follow from theirs (its digests are still
#: checked, in CI by tests/device/test_dsa_attention_step_sim.py: SHARED_RUNS of
#: tests/digests/kernel_digests.py)
COMPOSED_FAMILIES = {"dsa_attention_step"}
#: the entry also run from a quiet caller (the cheapest in FAMILY_ENTRIES)
QUIET_ENTRY = "dsa_indexer_prolog/int8_pad_h256@910b"

_THREAD_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC")


@contextlib.contextmanager
def caller_conditions(*, threads: int, busy: int):
    """The caller's environment asks for ``threads`` threads (MKL's dynamic threading on) and
    ``busy`` processes spin on the CPU while the block runs."""
    saved = {k: os.environ.get(k) for k in _THREAD_KEYS}
    os.environ.update(
        OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), MKL_DYNAMIC="TRUE"
    )
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        yield
    finally:
        for p in spin:
            p.kill()
            p.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_every_family_entry_is_a_digest_entry():
    known = dict(entries())
    assert set(FAMILY_ENTRIES) <= set(known)
    families = {key.split("/")[0] for key in known}
    assert COMPOSED_FAMILIES <= families
    families -= COMPOSED_FAMILIES
    assert {key.split("/")[0] for key in FAMILY_ENTRIES} == families


@pytest.mark.parametrize("key", FAMILY_ENTRIES)
def test_same_bits_under_threads_and_load(key):
    """Four threads asked for and two spinning processes: the committed digest, which
    ``test_kernel_digests`` checks for the same entry in the session's own conditions."""
    with caller_conditions(threads=4, busy=2):
        loaded = run_entry(key)
    assert loaded == json.loads(DIGEST_FILE.read_text())[key], (
        f"{key}: the interpreter's bits moved with the threads / the load"
    )


def test_quiet_and_loaded_runs_agree():
    """The same entry from a one-thread caller with nothing spinning: the committed digest,
    which :func:`test_same_bits_under_threads_and_load` asserts for its loaded run."""
    key = QUIET_ENTRY
    assert key in FAMILY_ENTRIES
    with caller_conditions(threads=1, busy=0):
        quiet = run_entry(key)
    assert quiet == json.loads(DIGEST_FILE.read_text())[key], f"{key}: the quiet run moved"


def child_settings() -> dict:
    """Runs in a simulator child: what its libtorch was started with."""
    import torch
    from tilesim.device.sim import PINNED_ENV

    return {
        "env": {k: os.environ.get(k) for k in PINNED_ENV},
        "threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
    }


def test_the_child_runs_pinned():
    from tilesim.device import sim

    with caller_conditions(threads=3, busy=0):
        got = sim.isolated(child_settings, soc="910b")
        assert os.environ["OMP_NUM_THREADS"] == "3", "the caller's environment must be restored"
    assert got["env"] == sim.PINNED_ENV
    assert got["threads"] == 1
    assert got["capability"] == "AVX2"
