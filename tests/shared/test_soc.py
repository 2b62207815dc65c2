"""SoC descriptions: the ceilings the reports compare against (docs/sources.md#ascend-socs)."""

from __future__ import annotations

import pytest
from tilesim.shared.soc import SOCS, fp8_socs, get_soc, moe_vec_tile, require_fp8


def test_published_peaks_and_ub():
    # 910B2: 24 AIC x 16^3 MACs x 2 x 1.8 GHz = 353.9 TFLOP/s; UB 192 KiB; 950: UB 248 KiB
    assert get_soc("910B").bf16_tflops == pytest.approx(353.894, abs=1e-3)
    assert get_soc("910b").ub_bytes == 192 * 1024
    assert get_soc("950").ub_bytes == 248 * 1024
    assert get_soc("950").arch == "DAV_3510" and get_soc("910b").arch == "DAV_2201"
    assert [SOCS[s].hbm_tbps for s in ("910b", "950", "950dt")] == [1.6, 1.6, 4.0]
    assert get_soc("910b").fp8_tflops is None


def test_roofline_helpers():
    s = get_soc("910b")
    assert s.hbm_bound_us(1.6e6) == pytest.approx(1.0)  # 1.6 MB at 1.6 TB/s = 1 us
    assert s.cube_bound_us(s.bf16_tflops * 1e6) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no FP8"):
        s.cube_bound_us(1.0, "fp8")


def test_one_fp8_rule_reads_socspec():
    """FP8 runs where the 950's published FP8 E4M3 cube is (docs/sources.md, "FP8 dtypes per
    SoC"); the rule names the argument, the SoCs that have FP8 and the call's target."""
    assert fp8_socs() == ("950",)
    for soc in ("950", "950dt"):
        require_fp8(soc, "path", "'fp8'", "use int8")
    msg = r"^path: 'fp8' needs a SoC with FP8 E4M3 \(SocSpec.fp8: 950\); this call targets '910b'"
    with pytest.raises(ValueError, match=msg + ", which has none -- use int8$"):
        require_fp8("910b", "path", "'fp8'", "use int8")


def test_bad_names():
    with pytest.raises(ValueError, match="soc: expected one of"):
        get_soc("h100")
    with pytest.raises(TypeError):
        get_soc(910)
    with pytest.raises(ValueError, match="activation"):
        moe_vec_tile("950", "gelu")
