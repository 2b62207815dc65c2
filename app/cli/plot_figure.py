"""The frame every picture of the CLI shares: matplotlib on the headless Agg backend (a
one-line error naming the install when it is missing), titles wrapped to the figure, max
pooling of large maps to a drawable size, and PNG files saved as 256-colour palettes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def require_matplotlib(purpose: str = "drawing a PNG"):
    """matplotlib (Agg backend), or a one-line CliError naming the install."""
    from tilesim.cli import optional_dependency

    with optional_dependency(purpose):
        import matplotlib
    return matplotlib


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend selected first."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def wrapped(title: str, width: int = 110) -> str:
    """A figure title broken into lines of at most ``width`` characters (a verdict's title
    names every failed check and would run off the figure); a given line break is kept."""
    import textwrap

    lines = (textwrap.wrap(line, width) or [""] for line in title.split("\n"))
    return "\n".join(w for ws in lines for w in ws) if title else title


def max_pool(a: np.ndarray, limit: int = 256) -> np.ndarray:
    """The float map ``a`` ``[rows, columns]`` max-pooled to at most ``limit`` x ``limit``
    cells (NaN cells ignored; all-NaN pools stay NaN)."""
    r = max(1, -(-a.shape[0] // limit))
    c = max(1, -(-a.shape[1] // limit))
    pr, pc = (-a.shape[0]) % r, (-a.shape[1]) % c
    p = np.pad(a, ((0, pr), (0, pc)), constant_values=np.nan)
    p = p.reshape(p.shape[0] // r, r, p.shape[1] // c, c)
    with np.errstate(all="ignore"):
        return np.nanmax(p, axis=(1, 3)) if np.isfinite(p).any() else p[:, 0, :, 0]


def save_small_png(fig, path: Path) -> None:
    """Save as a 256-colour palette PNG (error maps of noisy data compress badly in RGBA)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    try:
        from PIL import Image
    except ImportError:  # pillow ships with matplotlib; keep the RGBA file if it is missing
        Path(path).write_bytes(buf.getvalue())
        return
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)


__all__ = ["max_pool", "pyplot", "require_matplotlib", "save_small_png", "wrapped"]
