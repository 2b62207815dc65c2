"""``python -m tilesim`` / the ``tilesim`` console script."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    """Quantize a random DeepSeek latent, pack it in the PyPTO cache layout, unpack, dequantize
    and judge the round trip with the comparison utility against a float64 oracle."""
    import numpy as np

    from tilesim.reference import compare, to_bf16
    from tilesim.shared import (
        dequantize_latent,
        pack_pypto_rows,
        quantize_latent_fp8,
        unpack_pypto_rows,
    )

    rng = np.random.default_rng(args.seed)
    kn = to_bf16(rng.uniform(-1, 1, size=(args.rows, 512)).astype(np.float32))
    kr = to_bf16(rng.uniform(-1, 1, size=(args.rows, 64)).astype(np.float32))
    q, s = quantize_latent_fp8(kn)
    cache = pack_pypto_rows(q, kr, s)
    rows = unpack_pypto_rows(cache)
    deq = dequantize_latent(rows.nope, rows.scales)
    # oracle: float64 dequantization of the same bytes, rounded once to BF16
    oracle = rows.nope.astype(np.float64).reshape(-1, 4, 128) * s[:, :, None].astype(np.float64)
    rep = compare(deq, to_bf16(oracle.reshape(-1, 512).astype(np.float32)), atol=0, rtol=0, ratio=0)
    print(
        f"packed cache {cache.shape} {cache.dtype}; rope round trip exact: "
        f"{np.array_equal(rows.rope.view(np.uint16), kr.view(np.uint16))}"
    )
    print(rep.summary())
    err = np.abs(deq.astype(np.float64) - kn.astype(np.float64)).max()
    print(f"FP8 quantization error vs the BF16 latent: max |err| {err:.4g}")
    return 0 if rep.passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilesim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="a small golden round trip of the DeepSeek FP8 cache layout")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
