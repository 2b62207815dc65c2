"""The interpreted kernel outputs of a handful of sim cases (each op, both SoCs) are those
committed in kernel_digests.json (see kernel_digests.py): a refactor that moves a single bit of
a kernel's output fails here."""

from __future__ import annotations

import json

import pytest

from digests.kernel_digests import DIGEST_FILE, entries, run_entry

pytestmark = [pytest.mark.sim, pytest.mark.torch]

EXPECTED = json.loads(DIGEST_FILE.read_text())
ENTRIES = dict(entries())


def test_every_entry_has_a_committed_digest():
    assert sorted(ENTRIES) == sorted(EXPECTED)


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_kernel_digest_unchanged(key):
    assert run_entry(key) == EXPECTED[key]
