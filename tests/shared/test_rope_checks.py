"""shared/rope.py argument checks: the YaRN table refuses positions FP32 cannot hold exactly
(``max_seq_len`` above ``2**24``), and ``yarn_inv_freq`` refuses a ``rope_theta`` or a beta pair
that would give non-physical, infinite or NaN frequencies; each as a ``ValueError`` naming the
argument, with no NumPy warning on the way."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tilesim.shared.rope import yarn_inv_freq, yarn_rope_table


def test_max_seq_len_above_2_24_is_refused():
    """Positions ``2**24`` and ``2**24 + 1`` would round to one FP32 value (identical table
    rows): a ``max_seq_len`` above ``2**24`` is a ValueError naming it, while ``2**24`` itself
    is accepted and its last positions keep their own rows."""
    pos = np.array([2**24, 2**24 + 1], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^max_seq_len: expected an int in \[1, 16777216\]"):
        yarn_rope_table(pos, max_seq_len=2**26)
    # at the limit the last two positions are accepted and keep distinct rows
    cos, sin = yarn_rope_table(np.array([2**24 - 2, 2**24 - 1]), max_seq_len=2**24)
    assert not (np.array_equal(cos[0], cos[1]) and np.array_equal(sin[0], sin[1]))


def test_rope_theta_out_of_range_is_refused_without_warnings():
    """``rope_theta <= 1`` (frequencies above 1, or 0 / inf / NaN) and a theta whose powers
    overflow FP32 (frequencies ~0) are ValueErrors naming ``rope_theta``, with no warning;
    just inside the bound of a 64-dim table every frequency is finite and > 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for theta in (0.5, 1e-300, 1e300, 1.0):
            with pytest.raises(ValueError, match=r"^rope_theta: expected a value > 1"):
                yarn_inv_freq(rope_theta=theta)
        theta = float(np.finfo(np.float32).max) ** (64 / 62) * 0.999
        f = yarn_inv_freq(rope_theta=theta, max_seq_len=1024)
    assert np.isfinite(f).all() and (f > 0).all()


def test_swapped_betas_are_refused():
    """``beta_fast`` must exceed ``beta_slow`` (YaRN's fast and slow rotation counts):
    swapped or equal values are a ValueError naming ``beta_fast``."""
    for fast, slow in ((1.0, 32.0), (4.0, 4.0)):
        with pytest.raises(ValueError, match=r"^beta_fast: expected a value > beta_slow"):
            yarn_inv_freq(beta_fast=fast, beta_slow=slow)
