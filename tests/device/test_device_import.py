"""`import tilesim.device` must work with neither torch, torch_npu nor pypto installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent(
    """
    import sys
    BLOCKED = ("torch", "torch_npu", "pypto")
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by test)")
            return None
    sys.meta_path.insert(0, Blocker())
    """
)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_without_torch_and_pypto():
    r = _run(
        """
        import tilesim.device, tilesim.device.sim, tilesim.device._lazy
        import tilesim.shared.soc
        assert "torch" not in sys.modules and "pypto" not in sys.modules
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_kernel_call_without_pypto_names_the_install():
    r = _run(
        """
        from tilesim.device import _lazy
        try:
            _lazy.require_pypto()
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("no ImportError")
        """
    )
    assert r.returncode == 0, r.stderr
    assert "pip install 'tilesim[device]'" in r.stdout
