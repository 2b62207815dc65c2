"""Pictures of a reference run: the tile schedule its trace hook recorded, per-tile softmax
statistics for attention ops, per-expert chunks for MoE, and an error heat map.

Headless: the Agg backend is selected before pyplot is imported. Every function takes the
plain trace dicts the reference ops emit (one per tile, key ``"op"`` always present).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

#: loop indices outside the tile loop, outer first: a lane of the schedule is one value of these
#: (MoE: expert; MSA decode: batch, kv_head; MSA main branch: head; DeepSeek: b, s, kv_head, g)
_LANE_ORDER = (
    "expert",
    "batch",
    "b",
    "s",
    "token",
    "query_block",
    "qb",
    "head",
    "kv_head",
    "h",
    "group",
    "g",
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def lane_keys(records: list[dict]) -> list[str]:
    """The loop-index keys (see ``_LANE_ORDER``) present in the records, outer loop first."""
    if not records:
        return []
    return [k for k in _LANE_ORDER if k in records[0] and _is_int(records[0][k])]


def tile_extent(rec: dict, seq: int) -> tuple[float, float]:
    """(start, width) of a tile on its lane's key axis: ``kv_start``/``kv_len`` (MSA),
    ``cols`` + ``valid`` (DeepSeek), ``row0``/``chunk`` (MoE); else the tile's index."""
    if "kv_start" in rec and "kv_len" in rec:
        return float(rec["kv_start"]), float(rec["kv_len"])
    if "cols" in rec:
        c0, c1 = rec["cols"]
        return float(c0), float(rec.get("valid", c1 - c0))
    if "row0" in rec and "chunk" in rec:
        return float(rec["row0"]), float(rec["chunk"])
    for k in ("chunk", "tile", "block"):
        if k in rec and _is_int(rec[k]):
            return float(rec[k]), 1.0
    return float(seq), 1.0


def _stat(rec: dict, key: str):
    v = rec.get(key)
    if v is None:
        return None
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return None
    return float(a.min()), float(a.mean()), float(a.max())


def summarize(records: list[dict]) -> dict:
    """Counts for the text report: tiles, lanes, tile sizes."""
    lanes = lane_keys(records)
    lane_ids = {tuple(r.get(k) for k in lanes) for r in records}
    widths = [tile_extent(r, i)[1] for i, r in enumerate(records)]
    return {
        "op": records[0]["op"] if records else None,
        "tiles": len(records),
        "lanes": len(lane_ids),
        "lane_keys": lanes,
        "tile_sizes": sorted({int(w) for w in widths}),
    }


# ---------------------------------------------------------------------------------------------
# schedules


def _draw_moe(fig, records: list[dict]) -> None:
    ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    sizes = sorted({int(r["chunk"]) for r in records})
    norm = matplotlib.colors.Normalize(vmin=0, vmax=max(1, np.log2(max(sizes))))
    experts = sorted({int(r["expert"]) for r in records})
    for r in records:
        c = cmap(norm(np.log2(r["chunk"])))
        ax.broken_barh(
            [(r["row0"], r["chunk"])],
            (r["expert"] - 0.4, 0.8),
            facecolors=c,
            edgecolors="black",
            linewidth=0.5,
        )
        if r["chunk"] >= 1:
            ax.text(
                r["row0"] + r["chunk"] / 2,
                r["expert"],
                str(r["chunk"]),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    ax.set_xlabel("row of sorted_tokens")
    ax.set_ylabel("expert")
    ax.set_yticks(experts)
    ax.invert_yaxis()
    ax.set_title(f"{len(records)} tiles: chunks per expert (label = chunk rows)")
    sm = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, label="log2(chunk rows)")
    per = OrderedDict((e, 0) for e in experts)
    nt = OrderedDict((e, 0) for e in experts)
    for r in records:
        per[int(r["expert"])] += int(r["chunk"])
        nt[int(r["expert"])] += 1
    ax2.barh(list(per), list(per.values()), color="tab:blue")
    for e in per:
        ax2.text(per[e], e, f" {nt[e]} tiles", va="center", fontsize=7)
    ax2.set_yticks(experts)
    ax2.invert_yaxis()
    ax2.set_xlabel("tokens")
    ax2.set_title("tokens per expert")


#: per-tile statistics drawn under the schedule when the trace records carry them
_STAT_PANELS = (
    ("row_max", "per-tile softmax row max m (min / mean / max over rows)"),
    ("head_max", "per-block score max per index head (min / mean / max over heads)"),
    ("row_sum", "per-tile softmax row sum l of exp(S - m) (min / mean / max)"),
)


def _draw_attention(fig, records: list[dict]) -> None:
    import matplotlib

    lanes = lane_keys(records)
    lane_index: OrderedDict = OrderedDict()
    for r in records:
        lane_index.setdefault(tuple(int(r[k]) for k in lanes), len(lane_index))
    panels = [(k, t) for k, t in _STAT_PANELS if any(k in r for r in records)]
    panels = [p for i, p in enumerate(panels) if p[0] != "head_max" or i == 0][:2]
    has_stats = bool(panels)
    nrows = 1 + len(panels)
    axes = fig.subplots(
        nrows, 1, squeeze=False, gridspec_kw={"height_ratios": [3] + [2] * (nrows - 1)}
    )
    ax = axes[0, 0]
    widths = [tile_extent(r, i)[1] for i, r in enumerate(records)]
    norm = matplotlib.colors.Normalize(vmin=0, vmax=max(widths) if widths else 1)
    cmap = matplotlib.colormaps["viridis"]
    by_lane: dict[int, list] = {}
    colors: dict[int, list] = {}
    for i, r in enumerate(records):
        y = lane_index[tuple(int(r[k]) for k in lanes)]
        x, w = tile_extent(r, i)
        by_lane.setdefault(y, []).append((x, w))
        if "slot" in r:  # indexer: selected (green) or dropped (grey) block
            colors.setdefault(y, []).append("tab:green" if r["slot"] >= 0 else "lightgray")
        else:
            colors.setdefault(y, []).append(cmap(norm(w)))
    thin = len(lane_index) > 40
    if "slot" in records[0]:
        for i, r in enumerate(records):
            x, w = tile_extent(r, i)
            label = f"#{r['slot']}" if r["slot"] >= 0 else "drop"
            ax.text(
                x + w / 2,
                lane_index[tuple(int(r[k]) for k in lanes)],
                label,
                ha="center",
                va="center",
                fontsize=7,
                rotation=90,
            )
    for y, bars in by_lane.items():
        ax.broken_barh(
            bars,
            (y - 0.4, 0.8),
            facecolors=colors[y],
            edgecolors="none" if thin else "black",
            linewidth=0.4,
        )
    ax.set_ylim(len(lane_index) - 0.5, -0.5)
    label = ", ".join(lanes) if lanes else "lane"
    ax.set_ylabel(f"({label})")
    if len(lane_index) <= 24:
        ax.set_yticks(range(len(lane_index)))
        ax.set_yticklabels([",".join(map(str, k)) for k in lane_index], fontsize=7)
    ax.set_xlabel("key (top-k column) position within the lane")
    if len(records) <= 64 and "branch" in records[0]:  # DeepSeek: the online-merge branch taken
        for i, r in enumerate(records):
            y = lane_index[tuple(int(r[k]) for k in lanes)]
            x, w = tile_extent(r, i)
            ax.text(
                x + w / 2,
                y,
                r["branch"],
                ha="center",
                va="center",
                fontsize=6,
                color="white" if w > 0.3 * max(widths) else "black",
            )
    colour = (
        "green = selected block (label = slot), grey = dropped"
        if "slot" in records[0]
        else "colour = keys in the tile"
    )
    ax.set_title(f"{len(records)} tiles in {len(lane_index)} lanes; {colour}")
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="keys per tile")
    if not has_stats:
        return
    seq = np.arange(len(records))
    for j, (key, title) in enumerate(panels):
        ax = axes[1 + j, 0]
        st = [_stat(r, key) for r in records]
        ok = [i for i, s in enumerate(st) if s is not None]
        if not ok:
            ax.set_visible(False)
            continue
        lo = np.array([st[i][0] for i in ok])
        mid = np.array([st[i][1] for i in ok])
        hi = np.array([st[i][2] for i in ok])
        ax.vlines(seq[ok], lo, hi, color="tab:gray", linewidth=0.8)
        ax.plot(seq[ok], mid, ".", color="tab:red", markersize=3)
        if key == "row_sum" and lo.min() > 0:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("tile (execution order)")


def draw_schedule(fig, records: list[dict]) -> None:
    """Draw the schedule of one run into ``fig`` (MoE chunks or attention tiles)."""
    if not records:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "the reference emitted no tiles", ha="center", va="center")
        ax.set_axis_off()
    elif "expert" in records[0] and "chunk" in records[0]:
        _draw_moe(fig, records)
    else:
        _draw_attention(fig, records)


# ---------------------------------------------------------------------------------------------
# error map


def _as_2d(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.ndim == 1:
        return a.reshape(1, -1)
    return a.reshape(-1, a.shape[-1])


def _max_pool(a: np.ndarray, limit: int = 256) -> np.ndarray:
    r = max(1, -(-a.shape[0] // limit))
    c = max(1, -(-a.shape[1] // limit))
    pr, pc = (-a.shape[0]) % r, (-a.shape[1]) % c
    p = np.pad(a, ((0, pr), (0, pc)), constant_values=np.nan)
    p = p.reshape(p.shape[0] // r, r, p.shape[1] // c, c)
    with np.errstate(all="ignore"):
        return np.nanmax(p, axis=(1, 3)) if np.isfinite(p).any() else p[:, 0, :, 0]


def draw_error_map(
    fig, actual: np.ndarray, golden: np.ndarray, *, atol: float, rtol: float, title: str = ""
) -> None:
    """|actual - golden| as a heat map (log scale, max-pooled to at most 256x256 cells) and
    the same divided by the tolerance ``atol + rtol*|golden|`` (> 1 = failing element)."""
    import matplotlib

    a = _as_2d(actual).astype(np.float64)
    g = _as_2d(golden).astype(np.float64)
    with np.errstate(all="ignore"):
        err = np.abs(a - g)
        ratio = err / (atol + rtol * np.abs(g))
    err = np.where(np.isnan(err), np.inf, err)
    axes = fig.subplots(1, 2)
    finite = err[np.isfinite(err)]
    top = float(finite.max()) if finite.size else 1.0
    e = _max_pool(np.where(np.isfinite(err), err, top * 10))
    floor = max(top, atol, 1e-30) * 1e-6  # show six decades below the largest error
    extent = (0, a.shape[1], a.shape[0], 0)  # label the axes in element, not cell, units
    im = axes[0].imshow(
        np.log10(np.maximum(e, floor)),
        aspect="auto",
        interpolation="nearest",
        cmap="magma",
        extent=extent,
    )
    fig.colorbar(im, ax=axes[0], label="log10 |actual - golden|")
    axes[0].set_title("abs error (max-pooled)", fontsize=9)
    rp = _max_pool(np.where(np.isfinite(ratio), ratio, 1e6))
    vmax = max(2.0, float(np.nanmax(rp)) if rp.size else 2.0)
    im2 = axes[1].imshow(
        rp,
        aspect="auto",
        interpolation="nearest",
        extent=extent,
        cmap="RdYlGn_r",
        norm=matplotlib.colors.TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=vmax),
    )
    fig.colorbar(im2, ax=axes[1], label="|err| / (atol + rtol*|golden|)")
    nfail = int((~(ratio <= 1)).sum())
    axes[1].set_title(f"error / tolerance: {nfail} of {ratio.size} elements > 1", fontsize=9)
    for ax in axes:
        ax.set_xlabel("last axis")
        ax.set_ylabel("rows (leading axes flattened)")
    if title:
        fig.suptitle(title, fontsize=10)


def save_trace_png(
    path: Path,
    *,
    title: str,
    records: list[dict],
    actual=None,
    golden=None,
    atol: float = 0.0,
    rtol: float = 0.0,
    err_title: str = "",
) -> None:
    """One PNG: the schedule on top, the error maps below when ``actual`` is given."""
    plt = _pyplot()
    with_err = actual is not None
    fig = plt.figure(figsize=(11, 10.5 if with_err else 7.5), dpi=90, layout="constrained")
    if with_err:
        top, bottom = fig.subfigures(2, 1, height_ratios=[2.2, 1])
    else:
        top, bottom = fig, None
    top.suptitle(title, fontsize=11)
    draw_schedule(top, records)
    if with_err:
        draw_error_map(bottom, actual, golden, atol=atol, rtol=rtol, title=err_title)
    _save_small_png(fig, path)
    plt.close(fig)


def _save_small_png(fig, path: Path) -> None:
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
