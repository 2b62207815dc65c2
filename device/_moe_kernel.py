"""The PyPTO grouped-GEMM kernel builder (:func:`build_kernel`) and its jit options.

One body for both activations; everything that is not a tensor shape (activation, its
constants, tile sizes, unroll list, option spec) is closed over by :func:`build_kernel`, and
E, H, I are read from the argument shapes inside the kernel. Importing needs no pypto (the
builder loads it when a kernel is built; the helpers take the ``pypto`` module as their first
argument). The wrapper and its host glue: :mod:`tilesim.device.moe`.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor annotations
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.device._pypto_common import combine_axis, jit_options

#: the seeds' jit options of the grouped-GEMM kernel (hicann/pypto-gym,
#: ``minimax_grouped_gemm_impl.py``; docs/sources.md#moe-grouped-gemm) that are the same for
#: every tiling, as a hashable spec (:func:`tilesim.device._pypto_common.jit_options`); their
#: buffer settings are tiling fields (:func:`jit_spec`)
SEED_JIT = (
    ("runtime", "device_sched_mode", 1),
    ("runtime", "stitch_function_max_num", 64),
    ("operation", "combine_axis", True),
)

#: the contract every build needs (the expert loop reads the counts on the host), not a tuning
READY_ON_HOST = ("expert_cumsum",)


def jit_spec(tiling) -> tuple:
    """The option spec of a :class:`~tilesim.shared.tiling.MoeTiling`: :data:`SEED_JIT` and
    the tiling's L1 reuse, cube and vector n-buffer settings (``MoeTiling.default``: the
    seeds' values per activation)."""
    return (
        *SEED_JIT,
        ("pass", "cube_l1_reuse_setting", ((-1, tiling.l1_reuse),)),
        ("pass", "cube_nbuffer_setting", ((-1, tiling.cube_nbuffer),)),
        ("pass", "vec_nbuffer_setting", ((-1, tiling.vec_nbuffer),)),
    )


def _gate_up(pypto, gu, inter: int):
    """Split mm1's FP32 ``[tb, 2I]`` output into the gate and up halves (views, no copy)."""
    rows = gu.shape[0]
    return pypto.view(gu, [rows, inter], [0, 0]), pypto.view(gu, [rows, inter], [0, inter])


def _silu_glu(pypto, gu, inter: int, alpha: float, limit: float, beta: float):
    """``a = gate / (1 + exp(-gate)) * up`` in FP32, one operation per step (as the golden)."""
    gate, up = _gate_up(pypto, gu, inter)
    denom = pypto.add(pypto.exp(pypto.mul(gate, -1.0)), 1.0)
    return pypto.mul(pypto.div(gate, denom), up)


def _swiglu_oai(pypto, gu, inter: int, alpha: float, limit: float, beta: float):
    """``g = min(gate, limit)``, ``u = clip(up, -limit, limit)``,
    ``a = (u + beta) * g * 1/(1 + exp(-alpha*g))`` in FP32 (sigmoid spelled out: the builtin
    fails on tiles whose valid shape is smaller than the tile)."""
    gate, up = _gate_up(pypto, gu, inter)
    g = pypto.minimum(gate, limit)
    u = pypto.clip(up, -limit, limit)
    z = pypto.mul(g, alpha)
    sig = pypto.reciprocal(pypto.add(pypto.exp(pypto.mul(z, -1.0)), 1.0))
    return pypto.mul(pypto.add(u, beta), pypto.mul(g, sig))


_ACTIVATIONS = {"silu": _silu_glu, "swigluoai": _swiglu_oai}


@_backend.compile_once("moe_grouped_gemm")
def build_kernel(activation, unroll, mm1_k, mm1_n, mm2_k, mm2_n, vec_tile, alpha, limit, beta,
                 jit):  # fmt: skip
    """The ``@pypto.frontend.jit`` grouped-GEMM kernel for one model configuration and tiling,
    built once (:func:`tilesim.device.backend.compiled`; ``jit``: the option spec,
    :func:`jit_spec`). ``N_total`` is a dynamic axis and the per-expert counts are runtime
    values (``expert_cumsum``, ready on host); E / H / I come from the argument shapes.

    Kernel arguments (torch tensors, all in/out buffers): ``sorted_tokens [N, H]`` BF16,
    ``w13_flat [E*H, 2I]`` BF16, ``w2_flat [E*I, H]`` BF16, ``expert_cumsum [E+1]`` INT32
    (read by the host control flow), ``result [N, H]`` BF16 (rows written per chunk).
    """
    pypto = require_pypto()
    nd = pypto.TileOpFormat.TILEOP_ND
    act = _ACTIVATIONS[activation]
    unroll_list = list(unroll)
    vt = vec_tile
    combine = combine_axis(jit)

    @pypto.frontend.jit(**jit_options(jit, ready_on_host=READY_ON_HOST))
    def moe_grouped_gemm_kernel(
        sorted_tokens: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_BF16, format=nd),
        w13_flat: pypto.Tensor([], pypto.DT_BF16, format=nd),
        w2_flat: pypto.Tensor([], pypto.DT_BF16, format=nd),
        expert_cumsum: pypto.Tensor([], pypto.DT_INT32, format=nd),
        result: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_BF16, format=nd),
    ):
        n_experts = expert_cumsum.shape[0] - 1
        hidden = sorted_tokens.shape[1]
        inter = w2_flat.shape[0] // n_experts
        pypto.experimental.set_operation_options(combine_axis=combine)
        # expert loop: trip count E, each expert's token count read from the cumsum on host
        for e in pypto.loop(0, n_experts, 1, name="EXPERT", idx_name="e"):
            first = expert_cumsum[e]
            count = expert_cumsum[e + 1] - first
            # token chunks: every unroll factor tb is its own sub-loop body (static tb)
            for tok, tb in pypto.loop_unroll(
                0, count, 1, name="TOKENS", idx_name="tok", unroll_list=unroll_list
            ):
                x = pypto.view(sorted_tokens, [tb, hidden], [first + tok, 0])
                w13_e = pypto.view(w13_flat, [hidden, 2 * inter], [e * hidden, 0])
                w2_e = pypto.view(w2_flat, [inter, hidden], [e * inter, 0])
                # mm1: [tb, H] @ [H, 2I] -> FP32, K tiles of mm1_k, split-K across cores
                pypto.set_cube_tile_shapes([tb, tb], [mm1_k, 2 * mm1_k], [mm1_n, mm1_n], True)
                gu = pypto.matmul(x, w13_e, pypto.DT_FP32)
                # activation in FP32, rounded once to BF16 (the input of mm2)
                pypto.set_vec_tile_shapes(min(tb, vt), vt)
                a = pypto.cast(act(pypto, gu, inter, alpha, limit, beta), pypto.DT_BF16)
                # mm2: [tb, I] @ [I, H] -> FP32, K tiles of mm2_k
                pypto.set_cube_tile_shapes([tb, tb], [mm2_k, 2 * mm2_k], [mm2_n, mm2_n], False)
                d = pypto.matmul(a, w2_e, pypto.DT_FP32)
                pypto.set_vec_tile_shapes(min(tb, vt), vt)
                pypto.assemble(pypto.cast(d, pypto.DT_BF16), [first + tok, 0], result)

    return moe_grouped_gemm_kernel


__all__ = ["READY_ON_HOST", "SEED_JIT", "build_kernel", "jit_spec"]
