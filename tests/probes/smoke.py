"""A tiny element-wise PyPTO kernel that exercises the CPU machinery of :mod:`tilesim.device.sim`.

``out = bf16(exp(x * scale) + y)`` over a ``[DYNAMIC, 128]`` FP32 input, tile 32 x 128: one
vector op chain, a cast to BF16 and a dynamic first dimension with a tail tile. Used by the
smoke test of the simulator (both SoCs) and by ``python -m tilesim.device.sim``-style checks.
"""

# no `from __future__ import annotations` in kernel modules: the frontend evaluates the
# pypto.Tensor(...) annotations of a kernel's signature to tell tensor from scalar parameters
import pypto

COLS = 128
TILE = 32


@pypto.frontend.jit
def scaled_exp_add(
    x: pypto.Tensor([pypto.DYNAMIC, COLS], pypto.DT_FP32),
    y: pypto.Tensor([pypto.DYNAMIC, COLS], pypto.DT_FP32),
    out: pypto.Tensor([pypto.DYNAMIC, COLS], pypto.DT_BF16),
    scale: float = 0.5,
):
    pypto.set_vec_tile_shapes(TILE, COLS)
    rows = x.shape[0]
    for i in pypto.loop((rows + TILE - 1) // TILE, name="ROWS", idx_name="i"):
        r0 = i * TILE
        valid = [pypto.min(r0 + TILE, rows) - r0, COLS]
        xt = pypto.view(x, [TILE, COLS], [r0, 0], valid_shape=valid)
        yt = pypto.view(y, [TILE, COLS], [r0, 0], valid_shape=valid)
        pypto.assemble(pypto.cast(pypto.exp(xt * scale) + yt, pypto.DT_BF16), [r0, 0], out)


def check_scaled_exp_add(rows: int, seed: int, scale: float = 0.5) -> dict:
    """Run the kernel in the simulator and compare with torch; returns plain numbers."""
    import torch
    from tilesim.device import sim

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, COLS, generator=g)
    y = torch.randn(rows, COLS, generator=g)
    x0, y0 = x.clone(), y.clone()
    out = torch.full((rows, COLS), -7.0, dtype=torch.bfloat16)
    run = sim.run_kernel(scaled_exp_add, [x, y, out], scale=scale)
    want = (torch.exp(x0 * scale) + y0).to(torch.bfloat16)
    diff = (out.float() - want.float()).abs()
    return {
        "soc": run.soc,
        "arch": pypto.platform.npuarch,
        "us": run.us,
        "seconds": run.seconds,
        "bit_exact": float((out.view(torch.int16) == want.view(torch.int16)).float().mean()),
        "max_abs": float(diff.max()),
        "inputs_kept": bool(torch.equal(x, x0) and torch.equal(y, y0)),
    }


@pypto.frontend.jit
def fp8_encode(
    x: pypto.Tensor([64, COLS], pypto.DT_FP32),
    out: pypto.Tensor([64, COLS], pypto.DT_FP8E4M3),
):
    pypto.set_vec_tile_shapes(TILE, COLS)
    for i in pypto.loop(64 // TILE, name="ROWS", idx_name="i"):
        xt = pypto.view(x, [TILE, COLS], [i * TILE, 0])
        pypto.assemble(pypto.cast(xt, pypto.DT_FP8E4M3), [i * TILE, 0], out)


def check_fp8_encode(seed: int) -> dict:
    """FP32 -> FP8 E4M3 cast in the simulator vs torch's OCP ``float8_e4m3fn`` (saturating at
    +-448 first): the calculator patch of tilesim.device.sim. Values span 2^-12 .. 600."""
    import torch
    from tilesim.device import sim

    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.empty(64, COLS).uniform_(-12.0, 9.3, generator=g))
    x = mag * torch.where(torch.rand(64, COLS, generator=g) < 0.5, -1.0, 1.0)
    x[0, :6] = torch.tensor([0.6, 0.25, 2.5, 300.0, 440.0, -460.0])
    out = torch.zeros(64, COLS, dtype=torch.float8_e4m3fn)
    run = sim.run_kernel(fp8_encode, [x, out])
    want = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    same = out.view(torch.uint8) == want.view(torch.uint8)
    return {
        "soc": run.soc,
        "bit_exact": float(same.float().mean()),
        "first": out[0, :6].float().tolist(),
        "n_above_240": int((x.abs() > 240).sum()),
    }
