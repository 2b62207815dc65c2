"""The layer step's case builder: deterministic, the real Hadamard and YaRN table in the case,
caches holding exactly the earlier tokens (the rest NaN), the boundary and prefill rows the
named cases promise, parameter errors; the b4 s2 64K golden's peak memory (``slow``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
from tilesim.reference.dsa_attention_step import dsa_attention_step
from tilesim.shared.hadamard import scaled_hadamard_bf16
from tilesim.shared.layouts.index_cache import fp8_page_views
from tilesim.shared.rope import halves_table, yarn_rope_table


def _digest(case) -> dict:
    return {k: np.ascontiguousarray(v).view(np.uint8).tobytes()
            for k, v in case["inputs"].items() if isinstance(v, np.ndarray)}  # fmt: skip


def test_same_seed_same_case_other_seed_other_weights():
    a = dsa_attention_step_make_case("dsa_attention_step_short_int8")
    b = dsa_attention_step_make_case("dsa_attention_step_short_int8")
    c = dsa_attention_step_make_case("dsa_attention_step_short_int8", seed=1)
    assert _digest(a) == _digest(b)
    assert a["inputs"]["w_dq"].tobytes() != c["inputs"]["w_dq"].tobytes()


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_case_holds_the_real_hadamard_and_the_yarn_table(path):
    case = dsa_attention_step_make_case(path=path, seq_lens=(5000, 130), s1=1)
    inp, pos = case["inputs"], case["meta"]["positions"]
    assert np.array_equal(pos, [4999, 129])
    cos, sin = yarn_rope_table(pos, max_seq_len=163840)
    if path == "int8":
        cos, sin = halves_table(cos, sin)
        h = scaled_hadamard_bf16()
        assert inp["hadamard_q"].tobytes() == h.tobytes() == inp["hadamard_k"].tobytes()
    else:
        assert inp.get("hadamard_q") is None
    assert inp["cos"].tobytes() == cos.tobytes() and inp["sin"].tobytes() == sin.tobytes()


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_caches_hold_the_earlier_tokens_and_nan_elsewhere(path):
    case = dsa_attention_step_make_case(path=path, seq_lens=(130, 3), s1=2, spare_blocks=1)
    inp, bs = case["inputs"], 128
    n_rows = case["meta"]["n_blocks"] * bs
    hist = np.zeros(n_rows, bool)
    for b, n in enumerate((128, 1)):  # earlier tokens: all but the last two of each sequence
        pos = np.arange(n)
        hist[inp["block_table"][b, pos // bs].astype(np.int64) * bs + pos % bs] = True
    if path == "int8":
        scales = inp["kv_scale_cache"].reshape(-1, 4)
        kscale = inp["k_scale"].reshape(-1)
    else:
        scales = inp["kv_cache"][:, 640:].copy().view(np.float32)
        kscale = fp8_page_views(inp["k_cache"], block_size=bs).scales.reshape(-1)
    assert np.isfinite(scales[hist]).all() and np.isnan(scales[~hist]).all()
    assert np.isfinite(kscale[hist]).all() and np.isnan(kscale[~hist]).all()
    assert not hist[case["meta"]["slots"]].any()  # the new tokens' slots are poisoned too


@pytest.mark.parametrize(
    ("name", "ids_per_row"),
    [
        ("dsa_attention_step_boundary_fp8", [2047, 2048, 2048]),
        ("dsa_attention_step_prefill_int8",
         [2045, 2046, 2047] + [2048] * 5 + list(range(693, 701))),
    ],
)  # fmt: skip
def test_named_boundary_and_prefill_rows(name, ids_per_row):
    case = dsa_attention_step_make_case(name)
    res = dsa_attention_step(**case["inputs"], **case["params"], progress=False)
    assert ((res.topk_indices >= 0).sum(axis=1) == ids_per_row).all()
    out = res.attn_out.astype(np.float32)
    assert np.isfinite(out).all() and (np.abs(out).reshape(len(ids_per_row), -1).max(1) > 0).all()


@pytest.mark.parametrize(
    ("params", "exc", "start"),
    [
        ({"wq": 1}, TypeError, "dsa_attention_step_make_case: unknown"),
        ({"path": "bf16"}, ValueError, "path:"),
        ({"s1": 5}, ValueError, "s1:"),
        ({"q_lens": (2, 3)}, ValueError, "q_lens:"),
        ({"seq_lens": (1, 40)}, ValueError, "seq_lens[0]:"),
        ({"seq_lens": ()}, ValueError, "seq_lens:"),
        ({"cache_layout": "paged"}, ValueError, "cache_layout:"),
    ],
)
def test_builder_parameter_errors(params, exc, start):
    with pytest.raises(exc) as info:
        dsa_attention_step_make_case(**params)
    assert str(info.value).startswith(start), str(info.value)


_MEASURE = textwrap.dedent(
    """
    import resource, sys
    from tilesim.reference.dsa_attention_step import dsa_attention_step
    from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case
    c = dsa_attention_step_make_case(sys.argv[1], progress=False)
    r = dsa_attention_step(**c["inputs"], **c["params"], progress=False)
    assert (r.topk_indices >= 0).all()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_b4_s2_64k_golden_fits_in_4_gib(path):
    """Building and running the b4 s2 64K case in a fresh process peaks below 4 GiB."""
    name = f"dsa_attention_step_b4_s2_64k_{path}"
    res = subprocess.run([sys.executable, "-c", _MEASURE, name], capture_output=True, text=True,
                         check=True)  # fmt: skip
    peak_kib = int(res.stdout.split()[-1])
    assert peak_kib < 4 * 2**20, f"peak RSS {peak_kib / 2**20:.2f} GiB"
