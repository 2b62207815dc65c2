"""Cost-model sweep of the DeepSeek sparse-attention kernels' JIT / pass / runtime options.

A helper, not a test (it measures times; tests never do): for one SoC, cache dtype, tile
preset and shape it costs the kernel with

* ``defaults`` -- none of the seeds' options (PyPTO 0.2.0's defaults; the ``ready_on_host``
  contract stays),
* ``seeds`` -- all of the seeds' options of the preset (``_dsa_kernel.SEED_JIT``),
* ``+name`` -- each seeds' option alone on top of the defaults,
* ``-name`` -- the seeds' set without that one option,
* ``kept`` -- the set the kernels use on that SoC (``_dsa_kernel.jit_spec``),

one cost-model run each, in one spawned process per shape (``tilesim.device.sim.isolated``).
The kernel is compiled and costed WITHOUT the tensor-graph interpretation (the outputs are not
needed for a time), which is about half of a sim call's CPU.

    OMP_NUM_THREADS=1 python tests/device/dsa_sweep.py 910b int8 decode 1 1
    # -> a markdown row per variant as it is measured: soc, shape, variant, µs
    OMP_NUM_THREADS=1 python tests/device/dsa_sweep.py crossover 950 fp8 1 2 3 4 6 8
    # -> the decode tiles against the large-batch tiling per token count (crossover)
"""

from __future__ import annotations

import sys

#: option names per preset mode (the order of the table's columns)
NAMES = {
    "online": ("vec_nbuffer_setting", "cube_l1_reuse_setting", "cube_nbuffer_setting",
               "stitch_function_max_num", "device_sched_mode", "combine_axis"),
    "per_tile": ("vec_nbuffer_setting", "cube_l1_reuse_setting", "stitch_function_max_num",
                 "device_sched_mode", "combine_axis"),
}  # fmt: skip


def variants(seed: tuple, kept: tuple) -> dict:
    """``{label: spec}`` of the sweep (module docstring) for a mode's seeds' spec ``seed``."""
    out = {"defaults": (), "seeds": seed}
    for opt in seed:
        out[f"+{opt[1]}"] = (opt,)
    for opt in seed:
        out[f"-{opt[1]}"] = tuple(o for o in seed if o is not opt)
    out["kept"] = kept
    return out


def cost_only(kernel, args) -> float:
    """Compile ``kernel`` and run PyPTO's cost model on ``args`` without interpreting the
    tensor graph; returns the simulated µs (the figure ``sim.run_kernel`` reports)."""
    from tilesim.device import sim

    return sim.run_cost(kernel, args).us


def case_args(quant: str, preset: str, b: int, s1: int, keys: int = 2048) -> dict:
    """The sweep's inputs: ``b`` sequences of ``keys + s1 - 1`` tokens (every query token uses
    ``keys`` keys, top-k = ``keys``), causal random top-k, packed ``pypto`` cache."""
    import tilesim.reference as reference
    from tilesim.shared.tiling import SaTileShapeConfig

    case = reference.dsa_make_case(
        seed=5, b=b, s1=s1, actual_seq=[keys + s1 - 1] * b, topk=keys, quant=quant,
        layout="pypto", tiling=SaTileShapeConfig.preset(preset), topk_rule="causal",
    )  # fmt: skip
    return {**case["inputs"], **case["params"]}


def sweep(soc: str, quant: str, preset: str, b: int, s1: int, only=None) -> dict:
    """Child process: ``{label: µs}`` over :func:`variants` (or the labels in ``only``)."""
    from tilesim.device import _dsa_kernel as kernels
    from tilesim.device import dsa as dev

    mode = "online" if preset == "decode" else "per_tile"
    args = case_args(quant, preset, b, s1)
    res = {}
    for label, spec in variants(kernels.SEED_JIT[mode], kernels.jit_spec(soc, mode)).items():
        if only and label not in only:
            continue
        run = dev.prepared_launch("sparse_attention_antiquant", **args, jit=spec,
                                  backend="sim", soc=soc)  # fmt: skip
        res[label] = cost_only(run["kernel"], [*run["inputs"], *run["outputs"]])
        # each row as soon as it is measured (the child shares the parent's stdout)
        print(f"| {soc} {quant} {preset} b{b} s{s1} | {label} | {res[label]:.1f} |", flush=True)
    return res


#: token counts of the tiling crossover and the (b, s1) each runs as: s1 2 where the count is
#: even (the headline's decode shape), else s1 1
CROSSOVER_SHAPES = {1: (1, 1), 2: (1, 2), 3: (3, 1), 4: (2, 2), 6: (3, 2), 8: (4, 2)}


def crossover(soc: str, quant: str, tokens: tuple) -> dict:
    """Child process: ``{(tokens, label): µs}`` of the decode preset's call costed with the
    decode tiles (``decode``) and with :meth:`SaTileShapeConfig.large_batch` tiles (``large``),
    each with the build the wrapper picks for it (``kernel_build``), plus the large-batch
    tiles with the other build where the wrapper's is the seeds' (``large+lb``); 2048 keys
    per token (:func:`case_args`). The decode tiles run as given at every count: this child
    lifts ``LARGE_TILING_ITEMS[soc]`` out of reach (the rule reads it per call)."""
    from tilesim.device import _dsa_kernel as kernels
    from tilesim.device import dsa as dev
    from tilesim.shared import dsa as rules
    from tilesim.shared.tiling import SaTileShapeConfig

    rules.LARGE_TILING_ITEMS[soc] = 1 << 30  # this child: the decode preset runs as given
    res = {}
    big = SaTileShapeConfig.large_batch()
    for t in tokens:
        b, s1 = CROSSOVER_SHAPES[t]
        args = case_args(quant, "decode", b, s1)
        kinds = {"decode": (args["tiling"], None), "large": (big, None)}
        if kernels_build(t, big, soc) == "seeds":
            kinds["large+lb"] = (big, kernels.jit_spec(soc, "online", "large_batch"))
        for label, (tiling, jit) in kinds.items():
            run = dev.prepared_launch("sparse_attention_antiquant", **{**args, "tiling": tiling},
                                      jit=jit, backend="sim", soc=soc)  # fmt: skip
            res[(t, label)] = cost_only(run["kernel"], [*run["inputs"], *run["outputs"]])
            print(f"| {soc} {quant} | {t} (b{b} s{s1}) | {label} | {res[(t, label)]:.1f} |",
                  flush=True)  # fmt: skip
    return res


def kernels_build(tokens: int, tiling, soc: str) -> str:
    """The build the wrapper picks for ``tokens`` 128-head tokens in ``tiling``."""
    from tilesim.shared.dsa import kernel_build

    return kernel_build(tokens=tokens, nq=128, tiling=tiling, soc=soc)


def main(argv) -> None:
    from tilesim.device import sim

    if argv[0] == "crossover":  # crossover SOC QUANT [TOKENS ..]
        soc, quant, *tokens = argv[1:]
        tokens = tuple(int(t) for t in tokens) or tuple(CROSSOVER_SHAPES)
        sim.isolated(crossover, soc, quant, tokens, soc=soc, timeout=3600)
        return
    soc, quant, preset, b, s1, *only = argv
    sim.isolated(sweep, soc, quant, preset, int(b), int(s1), only or None, soc=soc,
                 timeout=3600)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
