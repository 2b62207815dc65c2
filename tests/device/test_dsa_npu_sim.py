"""The seeds' test matrix of the DeepSeek sparse attention kernels on an Ascend NPU.

``nox -s device`` on a host with CANN, torch_npu and a 910B or 950: every named case of
``tilesim.reference.DSA_CASES`` (b4 s2 "total" and "per", b64 "per" and "uniform", b1 s256
prefill, and the INT8 and kv_split counterparts) whose SoC list holds this device, run with the
case's tile preset and judged by :func:`tilesim.reference.judge` under the case's tolerance (the
seeds' rule: atol 1e-4, rtol 5e-3, at most 0.5 % failing elements; and the judge's
relative-L2 / cosine bounds). FP8 cases run only on a 950. Skipped everywhere
else (the ``npu`` marker); on CPU the same kernels are checked by ``test_dsa_sim.py``.
"""

from __future__ import annotations

import pytest

try:
    from tilesim.reference.cases.dsa import DSA_CASES
except ImportError:  # pragma: no cover - the reference is part of the package
    DSA_CASES = {}

#: cases whose golden alone takes minutes and several GB (b64 x 64K tokens, b1 x 256 tokens)
_LARGE = ("b64", "b1_s256")


def _params():
    for name, case in sorted(DSA_CASES.items()):
        marks = [pytest.mark.npu]
        marks += [pytest.mark.soc_950] if "950" in case.soc else []
        marks += [pytest.mark.soc_910b] if "910b" in case.soc else []
        if any(k in name for k in _LARGE):
            marks.append(pytest.mark.slow)
        yield pytest.param(name, id=name, marks=marks)


def _device_soc() -> str:
    from tilesim.device._lazy import require_pypto

    return "950" if require_pypto().platform.npuarch == "DAV_3510" else "910b"


def _to_npu(x):
    import torch_npu  # noqa: F401 -- registers the npu device
    from tilesim.shared.interop import to_torch

    if isinstance(x, (int, float)) or x is None:
        return x
    return to_torch(x).npu()


@pytest.mark.parametrize("name", list(_params()))
def test_seeds_matrix_on_npu(name):
    import tilesim.reference as reference
    from tilesim.device import dsa as dev
    from tilesim.shared.interop import to_numpy

    spec = DSA_CASES[name]
    soc = _device_soc()
    if soc not in spec.soc:
        pytest.skip(f"{name} targets {spec.soc}, this device is {soc}")
    if spec.quant.startswith("fp8") and soc != "950":
        pytest.skip("FP8 E4M3 caches need an Ascend 950")
    case = reference.dsa_make_case(name)
    inputs = {k: _to_npu(v) for k, v in case["inputs"].items()}
    out = getattr(dev, case["op"])(**inputs, **case["params"])
    assert out.device.type == "npu"
    golden = getattr(reference, case["op"])(**case["inputs"], **case["params"])
    verdict = reference.judge(to_numpy(out.cpu()), golden, case["tolerance"], kind="dsa")
    assert verdict.passed, verdict.summary()
