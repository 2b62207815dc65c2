"""Shared pytest fixtures and markers for tilesim's test suite."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, fixed-seed generator per test (determinism)."""
    return np.random.default_rng(20261129)


def pytest_collection_modifyitems(config, items):
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    skip_torch = pytest.mark.skip(reason="torch is not installed (pip install tilesim[torch])")
    for item in items:
        if "torch" in item.keywords and not have_torch:
            item.add_marker(skip_torch)
