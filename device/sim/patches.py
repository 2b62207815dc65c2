"""The two monkey-patches of PyPTO 0.2.0's JIT entry (:mod:`tilesim.device.sim`).

``pypto.frontend.parser.entry.JitCallableWrapper`` of ``hicann/pypto`` 0.2.0, in SIM mode,
feeds the host interpreter zeros instead of the caller's tensors (it copies "device" data to the
host, which on a CPU-only machine is nothing) and always runs the cost model. The patch hands
the interpreter the real CPU tensors and makes the cost-model step optional
(docs/device.md, "The CPU machinery").
"""

from __future__ import annotations

from tilesim.device._lazy import require_pypto
from tilesim.device.sim.calculator import load_calculator

#: What the patched ``_execute_kernel`` does on its next call: run the cost model after the
#: compile (and the interpretation inside it) or not. Set per call by
#: :mod:`tilesim.device.sim.run`.
NEXT_CALL = {"costmodel": True}
_STATE = {"patched": False}


def patch_jit_wrapper() -> None:
    """Replace ``JitCallableWrapper._setup_verify_data`` and ``._execute_kernel`` (once per
    process): the interpreter gets the caller's CPU tensors, and the cost model runs only when
    :data:`NEXT_CALL` asks for it."""
    if _STATE["patched"]:
        return
    pypto = require_pypto()
    from pypto import pypto_impl, runtime
    from pypto.frontend.parser import entry

    def setup_verify_data(pto_tensors):
        # the interpreter gets the caller's CPU tensors (SetVerifyData copies them); stock
        # 0.2.0 copies device->host instead, which leaves zeros on a CPU-only machine
        if not pypto.get_verify_options().get("enable_pass_verify"):
            return
        load_calculator()
        pypto_impl.SetVerifyData(
            runtime._pto_to_tensor_data(list(pto_tensors)),
            [],
            runtime._pto_verify_datas.get_data(),
        )

    def execute_kernel(self, torch_tensors, tensor_defs):
        # SIM branch only; the interpreter runs inside compile() when verify is enabled
        pto = self._convert_tensors_with_metadata(torch_tensors, tensor_defs)
        with pypto.options("jit_scope"):
            self._set_config_option()
            pypto_impl.DeviceInit()
            self.compile(pto)
            if NEXT_CALL["costmodel"]:
                self._run_with_cpu(pto, [])

    entry.JitCallableWrapper._setup_verify_data = staticmethod(setup_verify_data)
    entry.JitCallableWrapper._execute_kernel = execute_kernel
    _STATE["patched"] = True
