"""The interpreted kernel outputs of a handful of sim cases (each op, both SoCs) are those
committed in kernel_digests.json (see kernel_digests.py): a refactor that moves a single bit of
a kernel's output fails here."""

from __future__ import annotations

import json

import pytest

from digests.kernel_digests import DIGEST_FILE, LOADED_RUNS, SHARED_RUNS, entries, run_entry

pytestmark = [pytest.mark.sim, pytest.mark.torch]

EXPECTED = json.loads(DIGEST_FILE.read_text())
ENTRIES = dict(entries())


def test_every_entry_has_a_committed_digest():
    assert sorted(ENTRIES) == sorted(EXPECTED)


def test_the_shared_runs_assert_their_digest():
    """Each ``SHARED_RUNS`` entry is an entry, and its test file reads the committed digest of
    its family (so leaving the entry out of CI here leaves it checked there)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    assert set(SHARED_RUNS) <= set(ENTRIES)
    for key, test_file in SHARED_RUNS.items():
        text = (repo / test_file).read_text()
        named = key.split("@")[0] in text or (key in LOADED_RUNS and "LOADED_RUNS" in text)
        assert "DIGEST_FILE" in text and named, key


@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.slow) if k in SHARED_RUNS else k for k in sorted(ENTRIES)],
)
def test_kernel_digest_unchanged(key):
    """Every entry; those in ``SHARED_RUNS`` are ``slow`` here, their CI check being the named
    test's own run of the same call (``test_the_shared_runs_assert_their_digest``)."""
    assert run_entry(key) == EXPECTED[key]
