"""The picture of an op traced by pipeline stage (the prologs' records of
:func:`tilesim.shared.trace.emit_stage`): one row per stage in pipeline order against the token
axis, each cell coloured by the token's max ``|stage result|`` (red: NaN / inf), the cache
write's row showing which tokens were written into which slot, and each stage's matmul FLOPs.
"""

from __future__ import annotations

import numpy as np
from tilesim.cli.plot_figure import wrapped


def is_staged(records: list[dict]) -> bool:
    """True when every record is one of a pipeline stage (lane ``{"stage": j}`` and
    ``extra["stage"]``: :func:`tilesim.shared.trace.emit_stage`, the prologs' cache writes)."""
    return bool(records) and all(
        list(r["lane"]) == ["stage"] and "stage" in r["extra"] for r in records
    )


def stage_rows(records: list[dict]) -> list[dict]:
    """One dict per stage, in pipeline order (the lane's ``stage``): ``name``, ``what``,
    ``flop`` (the stage's records summed), ``dtype``, ``shape``, ``tokens``, ``amax`` (FP64
    ``[T]`` max ``|result|`` per token, or None) and, for a stage recorded per token (the
    cache write), ``slots`` (int64 ``[T]``, -1 where nothing was written) and ``written``
    (bool ``[T]``, the records' ``keys_used``)."""
    by: dict[int, list] = {}
    for r in records:
        by.setdefault(int(r["lane"]["stage"]), []).append(r)
    rows = []
    for j in sorted(by):
        rs, e = by[j], by[j][0]["extra"]
        amax = e.get("token_amax")
        amax = None if amax is None else np.asarray(amax, np.float64).reshape(-1)
        tokens = max(int(r["key_range"][1]) for r in rs)
        row = {"stage": j, "name": e["stage"], "what": e.get("what", ""),
               "flop": sum(int(r["flop"]) for r in rs), "dtype": e.get("dtype"),
               "shape": e.get("shape"), "tokens": tokens, "slots": None, "written": None,
               "amax": amax}  # fmt: skip
        if "slot" in e:
            row["slots"] = np.full(tokens, -1, np.int64)
            row["written"] = np.zeros(tokens, bool)
            for r in rs:
                t = int(r["key_range"][0])
                row["slots"][t], row["written"][t] = int(r["extra"]["slot"]), r["keys_used"] > 0
        rows.append(row)
    return rows


def flop_text(n: int) -> str:
    """``"264 MFLOP"``-style text of a FLOP count (``"no matmul"`` for 0)."""
    if n <= 0:
        return "no matmul"
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}FLOP"
    return f"{n} FLOP"


def _stage_label(row: dict) -> str:
    if row["written"] is not None:
        return f"{row['name']}: {int(row['written'].sum())} of {row['tokens']} tokens written"
    shape = "x".join(map(str, row["shape"] or []))
    return f"{row['name']}: {row['what']} [{row['dtype']} {shape}]"


def stage_title(op: str, rows: list[dict]) -> str:
    """What :func:`draw_stages` draws for ``op``'s stage records."""
    n = len(rows)
    bad = sum(int((~np.isfinite(r["amax"])).sum()) for r in rows if r["amax"] is not None)
    text = (f"{op} by stage, {n} stages in pipeline order (rows) x token (columns): colour = "
            "log10 max |stage result| per token (white = 0)")  # fmt: skip
    if any(r["written"] is not None for r in rows):
        text += "; cache write: green = written (label = slot), grey = skipped (slot -1)"
    if bad:
        text += f"; red = NaN / inf ({bad} token rows)"
    return text


def _stage_grid(rows: list[dict], tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(log10 max |result| ``[stages, T]`` (NaN: no value, zero or not finite), non-finite
    mask)."""
    grid = np.full((len(rows), tokens), np.nan)
    bad = np.zeros(grid.shape, bool)
    for i, r in enumerate(rows):
        a = r["amax"]
        if a is None:
            continue
        bad[i, : a.size] = ~np.isfinite(a)
        with np.errstate(all="ignore"):
            grid[i, : a.size] = np.where(np.isfinite(a) & (a > 0), np.log10(a), np.nan)
    return grid, bad


def _draw_writes(ax, i: int, row: dict) -> None:
    """The cache write's row: one cell per token, green = written, grey = skipped."""
    written, slots = row["written"], row["slots"]
    cells = [(t, 1) for t in range(row["tokens"])]
    colours = ["tab:green" if w else "lightgray" for w in written]
    ax.broken_barh(cells, (i + 0.1, 0.8), facecolors=colours, edgecolors="black", linewidth=0.4)
    if row["tokens"] > 48:
        return
    for t, (w, slot) in enumerate(zip(written, slots, strict=True)):
        ax.text(t + 0.5, i + 0.5, f"#{slot}" if w else "-1", ha="center", va="center",
                fontsize=6, rotation=90 if row["tokens"] > 12 else 0)  # fmt: skip


def draw_stages(fig, records: list[dict]) -> None:
    """One op traced by pipeline stage (:func:`stage_rows`): left, one row per stage against
    the token axis, each token's cell coloured by the log10 of its max ``|stage result|``
    (the cache write: which tokens were written, into which slot); right, each stage's
    matmul FLOPs as the records give them."""
    import matplotlib

    rows = stage_rows(records)
    tokens = max(r["tokens"] for r in rows)
    ax, axf = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [4, 1.3]})
    grid, bad = _stage_grid(rows, tokens)
    extent = (0, tokens, len(rows), 0)
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest",
                   cmap="viridis", extent=extent)  # fmt: skip
    if bad.any():
        red = matplotlib.colors.ListedColormap(["tab:red"])
        ax.imshow(np.where(bad, 1.0, np.nan), aspect="auto", interpolation="nearest",
                  cmap=red, extent=extent)  # fmt: skip
    for i, r in enumerate(rows):
        if r["written"] is not None:
            _draw_writes(ax, i, r)
    ax.set_xlim(0, tokens)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks(np.arange(len(rows)) + 0.5, [_stage_label(r) for r in rows], fontsize=7)
    if tokens <= 32:
        ax.set_xticks(np.arange(tokens) + 0.5, [str(t) for t in range(tokens)], fontsize=7)
    ax.set_xlabel("token (row of x)")
    ax.set_title(wrapped(stage_title(records[0]["op"], rows), 90), fontsize=9)
    fig.colorbar(im, ax=ax, label="log10 max |result| per token", pad=0.01)
    _draw_stage_flop(axf, rows)


def _draw_stage_flop(ax, rows: list[dict]) -> None:
    flop = np.array([r["flop"] for r in rows], np.float64)
    ys = np.arange(len(rows)) + 0.5
    ax.barh(ys, np.where(flop > 0, flop, np.nan), height=0.7, color="tab:blue")
    if (flop > 0).any():
        ax.set_xscale("log")
        ax.set_xlim(flop[flop > 0].min() / 10, flop.max() * 30)
    for y, f in zip(ys, flop, strict=True):
        x = f if f > 0 else (flop[flop > 0].min() / 8 if (flop > 0).any() else 0.0)
        ax.text(x, y, " " + flop_text(int(f)), va="center", fontsize=7)
    ax.set_title(f"matmul FLOPs per stage\n(total {flop_text(int(flop.sum()))})", fontsize=9)
    ax.set_xlabel("FLOPs (2 per multiply-add)")
    ax.tick_params(axis="y", left=False)


__all__ = ["draw_stages", "flop_text", "is_staged", "stage_rows", "stage_title"]
