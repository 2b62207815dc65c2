"""Packaging: the three layers import as tilesim.* and not as generic top-level modules."""

import importlib
import subprocess
import sys


def test_layers_import_under_tilesim():
    for name in ("tilesim", "tilesim.reference", "tilesim.shared", "tilesim.device"):
        mod = importlib.import_module(name)
        assert mod.__name__ == name


def test_device_import_needs_no_npu_stack():
    code = (
        "import sys; import tilesim.device; "
        "bad = [m for m in ('torch_npu', 'pypto') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_no_generic_top_level_modules_installed():
    code = (
        "import importlib.util as u; "
        "found = [m for m in ('reference', 'device', 'shared') if u.find_spec(m)]; "
        "assert not found, found"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_reference_lazy_names_are_listed():
    import tilesim.reference as r

    assert "moe_grouped_gemm" in dir(r)
    try:
        r.no_such_op  # noqa: B018
    except AttributeError as e:
        assert "no_such_op" in str(e)
    else:
        raise AssertionError("unknown attribute did not raise")
