"""The PyPTO kernel builder of the MSA main branch (prefill): :func:`build_kernel` and its jit
options. Importing needs no pypto (the builder loads it when a kernel is built). The wrapper,
its host glue and the loop-nest description: :mod:`tilesim.device.msa_main`."""

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.device._msa_tiles import SEED_RUNTIME
from tilesim.device._pypto_common import jit_options, merge_chunk, operation_options

#: the seeds' jit options of the main-branch kernel (hicann/pypto-gym,
#: src/pypto_gym/ops/pypto_tensor/minimax/msa_main_branch_impl.py) that PyPTO 0.2.0 accepts, as a
#: hashable spec (:func:`tilesim.device._pypto_common.jit_options`). Not accepted by 0.2.0 and left
#: out: pass ``ooo_sched_mode`` / ``sg_set_tunevf_mode``, codegen ``vf_options``,
#: ``pypto.experimental.auto_mix_partition``; host ``compile_timeout`` changes no kernel. The
#: cost-model sweep and the verdict: docs/ops/msa_main.md#kernel
SEED_JIT = (
    *SEED_RUNTIME,
    ("pass", "vec_nbuffer_setting", ((-1, 1),)),
    ("pass", "cube_l1_reuse_setting", ((-1, 2),)),
    ("pass", "cube_nbuffer_setting", ((-1, 2),)),
)
#: the options the kernel runs with per SoC (the sweep's verdict, docs/ops/msa_main.md#kernel
#: branch"): the seeds' five on both; ``combine_axis`` only on the 950 (slower on the 910B)
JIT = {"910b": SEED_JIT, "950": (*SEED_JIT, ("operation", "combine_axis", True))}


#: query rows per row block of the kernel (the cube's M tile); the wrapper pads ``n`` up to a
#: multiple of it
ROW_TILE = 128


@_backend.compile_once("msa_main_branch")
def build_kernel(hq, hkv, dh, kv_len, dtype, ntile, rows, jit=SEED_JIT):
    """The ``@pypto.frontend.jit`` kernel for one model configuration and tiling, built once
    (:func:`tilesim.device.backend.compiled`). The prefill length is a runtime value: ``q``,
    ``mask`` and ``out`` have a dynamic first axis of ``ceil(n/128)*128`` rows, walked by a
    ``pypto.loop`` over :data:`ROW_TILE`-row blocks with a symbolic trip count."""
    pypto = require_pypto()
    dt = {"fp32": pypto.DT_FP32, "fp16": pypto.DT_FP16, "bf16": pypto.DT_BF16}[dtype]
    group = hq // hkv
    bounds = [(c0, min(ntile, kv_len - c0)) for c0 in range(0, kv_len, ntile)]
    scale = dh**-0.5
    combine = bool(operation_options(jit).get("combine_axis", False))
    bq = ROW_TILE

    @pypto.frontend.jit(**jit_options(jit))
    def msa_main_branch_kernel(
        q: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], dt),  # [n_pad, HQ*dh]
        k: pypto.Tensor([pypto.STATIC, pypto.STATIC], dt),  # [kv_len, HKV*dh]
        v: pypto.Tensor([pypto.STATIC, pypto.STATIC], dt),  # [kv_len, HKV*dh]
        mask: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),  # [n_pad, kv_len]
        out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),  # [n_pad, HQ*dh]
    ):
        pypto.experimental.set_operation_options(combine_axis=combine)
        blocks = q.shape[0] // bq
        for hg in pypto.loop(hq, name="LOOP_HG", idx_name="hg"):
            h_kv = hg // group
            for rb in pypto.loop(0, blocks, 1, name="LOOP_QB", idx_name="rb"):
                r0 = rb * bq
                pypto.set_vec_tile_shapes(rows, dh)
                qh = pypto.view(q, [bq, dh], [r0, hg * dh])
                m = pypto.tensor([bq, 1], pypto.DT_FP32, "m")
                l = pypto.tensor([bq, 1], pypto.DT_FP32, "l")
                o = pypto.tensor([bq, dh], pypto.DT_FP32, "o")
                for c in range(len(bounds)):  # NTILE chunks: online softmax (static)
                    c0 = bounds[c][0]
                    w = bounds[c][1]
                    kc = pypto.view(k, [w, dh], [c0, h_kv * dh])
                    vc = pypto.view(v, [w, dh], [c0, h_kv * dh])
                    pypto.set_cube_tile_shapes([128, 128], [128, 128], [128, 128])
                    s = pypto.matmul(qh, kc, pypto.DT_FP32, b_trans=True)
                    pypto.set_vec_tile_shapes(rows, w)
                    s = s * scale
                    s = s + pypto.view(mask, [bq, w], [r0, c0])
                    m_c = pypto.amax(s, dim=-1, keepdim=True)
                    p = pypto.exp(s - m_c)
                    l_c = pypto.sum(p, dim=-1, keepdim=True)
                    if dtype != "fp32":
                        p = pypto.cast(p, dt)
                    pypto.set_cube_tile_shapes([128, 128], [128, 128], [128, 128])
                    pv = pypto.matmul(p, vc, pypto.DT_FP32)
                    pypto.set_vec_tile_shapes(rows, dh)
                    merge_chunk(pypto, m, l, o, m_c, l_c, pv, first=c == 0)
                pypto.assemble(o / l, [r0, hg * dh], out)  # empty rows: zeroed by the wrapper

    return msa_main_branch_kernel
