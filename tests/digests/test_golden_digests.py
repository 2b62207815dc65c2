"""The golden bytes of every named case and op mode are those committed in digests.json.

A refactor that moves a single bit of any golden fails here (see golden_digests.py).
"""

from __future__ import annotations

import json

import pytest

from digests.golden_digests import DIGEST_FILE, entries, golden_digest

EXPECTED = json.loads(DIGEST_FILE.read_text())
ENTRIES = dict(entries())


def test_every_entry_has_a_committed_digest():
    assert sorted(ENTRIES) == sorted(EXPECTED)


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_golden_digest_unchanged(key):
    got = golden_digest(*ENTRIES[key])
    assert got["plain"] == got["traced"], "a trace hook changed the output bits"
    assert got == EXPECTED[key]
