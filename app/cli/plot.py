"""Pictures of a reference run: the tile schedule its trace hook recorded, per-tile softmax
statistics, and an error heat map.

Headless: the Agg backend is selected before pyplot is imported. The functions read only the
trace-record schema of :mod:`tilesim.shared.trace` (``op, lane, step, key_range, keys_used,
row_max, row_sum, flop, extra``): one swim lane per distinct ``lane`` dict, one bar per record
over its ``key_range``, coloured by ``keys_used``; below, the records' ``row_max``, ``row_sum``
and ``extra["head_max"]`` when they carry them, each panel titled with what that op's records
mean (:func:`panel_title`: the attention ops' softmax statistics; the MSA indexer's per-head
block score maxima and the DeepSeek indexer's per-row block score maxima, which are no
softmax). A row that sees no key in a tile (every score masked, its max at a mask value or
``-inf``) is left out of the row max and row sum panels, and the title says how many were.
``extra["slot"]`` (indexer: the block's slot, -1 = dropped) and ``extra["branch"]`` (a merge
branch) label the bars.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path

import numpy as np
from tilesim.shared.msa_main import MASK_NEG
from tilesim.shared.ops import record
from tilesim.shared.trace import lane_id

#: a row max at or below this is a row with every score of the tile masked (the attention
#: ops' mask values: -1e9, -3e38 clamped at -1e30; the DeepSeek indexer's -inf)
MASKED_BELOW = float(MASK_NEG) / 2


def _wrapped(title: str, width: int = 110) -> str:
    """A figure title broken into lines of at most ``width`` characters (a verdict's title
    names every failed check and would run off the figure); a given line break is kept."""
    import textwrap

    lines = (textwrap.wrap(line, width) or [""] for line in title.split("\n"))
    return "\n".join(w for ws in lines for w in ws) if title else title


def require_matplotlib(purpose: str = "drawing a PNG"):
    """matplotlib (Agg backend), or a one-line CliError naming the install."""
    from tilesim.cli import require

    matplotlib = require("matplotlib", purpose)
    return matplotlib


def _pyplot():
    matplotlib = require_matplotlib()
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def lane_keys(records: list[dict]) -> list[str]:
    """The ``lane`` keys of the records (outer loop first, in first-seen order)."""
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r["lane"]))
    return list(keys)


def lane_index(records: list[dict]) -> OrderedDict:
    """``{lane id: row}``: the swim lanes in first-seen (loop) order."""
    out: OrderedDict = OrderedDict()
    for r in records:
        out.setdefault(lane_id(r), len(out))
    return out


def tile_extent(rec: dict) -> tuple[int, int]:
    """(start, width) of a record's ``key_range`` on its lane's key axis."""
    start, stop = rec["key_range"]
    return int(start), int(stop) - int(start)


def _values(rec: dict, key: str) -> np.ndarray | None:
    v = rec["extra"].get(key) if key == "head_max" else rec[key]
    return None if v is None else np.asarray(v, dtype=np.float64).reshape(-1)


def masked_rows(rec: dict) -> np.ndarray | None:
    """bool per row of the record: True where the row sees no key in the tile (its row max
    is at or below :data:`MASKED_BELOW`); ``None`` when the record has no row max."""
    m = _values(rec, "row_max")
    return None if m is None else m <= MASKED_BELOW


def _stat(rec: dict, key: str, *, drop_masked: bool = False):
    a = _values(rec, key)
    if a is None:
        return None
    masked = masked_rows(rec) if drop_masked else None
    if masked is not None and masked.shape == a.shape:
        a = a[~masked]
    a = a[np.isfinite(a)]
    if a.size == 0:
        return None
    return float(a.min()), float(a.mean()), float(a.max())


def summarize(records: list[dict]) -> dict:
    """Counts for the text report: tiles, lanes, lane keys, tile sizes (``keys_used``)."""
    return {
        "op": records[0]["op"] if records else None,
        "tiles": len(records),
        "lanes": len(lane_index(records)),
        "lane_keys": lane_keys(records),
        "tile_sizes": sorted({int(r["keys_used"]) for r in records}),
        "flop": sum(int(r["flop"]) for r in records),
    }


# ---------------------------------------------------------------------------------------------
# schedules

#: per-tile statistics drawn under the schedule when the trace records carry them
_STAT_KEYS = ("row_max", "head_max", "row_sum")
#: ops whose ``row_max`` is the per-head max of a block's index scores (no softmax): the
#: MSA indexer's calls
_INDEXER_OPS = record("msa_indexer").call_names
#: the op whose ``row_max`` is each query row's max index score over a block (no softmax;
#: ``-inf`` where the row sees none of the block): the DeepSeek lightning indexer
_ROW_SCORE_OP = "dsa_indexer"
_TITLES = {
    "row_max": "per-tile softmax row max m of the scaled, masked scores",
    "row_sum": "per-tile softmax row sum l = sum of exp(S - m)",
    "head_max": "per-block score max per index head",
}


def panel_title(op: str | None, key: str, n_masked: int = 0) -> str:
    """What the panel of ``key`` shows for ``op``'s records (see the module docstring)."""
    if op in _INDEXER_OPS and key in ("row_max", "head_max"):
        return "per-block max of the FP32 index scores q.k per index head (min / mean / max)"
    if op == _ROW_SCORE_OP and key == "row_max":
        text = "per-block max of the FP32 index scores per query row (min / mean / max over rows)"
        if n_masked:
            text += f"; {n_masked} rows seeing none of the block (-inf) left out"
        return text
    text = f"{_TITLES[key]} (min / mean / max over rows)"
    if n_masked and key in ("row_max", "row_sum"):
        text += f"; {n_masked} rows seeing no key in their tile (masked row max) left out"
    return text


def _drops_masked(op: str | None, key: str) -> bool:
    return op not in _INDEXER_OPS and key in ("row_max", "row_sum")


def _n_masked(records: list[dict]) -> int:
    return sum(int(m.sum()) for m in map(masked_rows, records) if m is not None)


def _bar_label(rec: dict, show_counts: bool) -> str | None:
    extra = rec["extra"]
    if "slot" in extra:
        return f"#{extra['slot']}" if extra["slot"] >= 0 else "drop"
    if "branch" in extra:
        return str(extra["branch"])
    return str(rec["keys_used"]) if show_counts else None


def _draw_bars(ax, records: list[dict], lanes: OrderedDict, norm, cmap) -> None:
    slots = any("slot" in r["extra"] for r in records)
    by_lane: dict[int, list] = {}
    colors: dict[int, list] = {}
    for r in records:
        y = lanes[lane_id(r)]
        by_lane.setdefault(y, []).append(tile_extent(r))
        if slots:  # indexer: selected (green) or dropped (grey) block
            colors.setdefault(y, []).append(
                "tab:green" if r["extra"].get("slot", -1) >= 0 else "lightgray"
            )
        else:
            colors.setdefault(y, []).append(cmap(norm(r["keys_used"])))
    thin = len(lanes) > 40
    for y, bars in by_lane.items():
        ax.broken_barh(
            bars,
            (y - 0.4, 0.8),
            facecolors=colors[y],
            edgecolors="none" if thin else "black",
            linewidth=0.4,
        )


def _draw_labels(ax, records: list[dict], lanes: OrderedDict) -> None:
    if len(records) > 64:
        return
    widest = max(tile_extent(r)[1] for r in records) or 1
    for r in records:
        x, w = tile_extent(r)
        text = _bar_label(r, show_counts=True)
        if text is None:
            continue
        vertical = "slot" in r["extra"]
        ax.text(
            x + w / 2,
            lanes[lane_id(r)],
            text,
            ha="center",
            va="center",
            fontsize=6 if not vertical else 7,
            rotation=90 if vertical else 0,
            color="white" if w > 0.3 * widest and not vertical else "black",
        )


def _draw_lanes(ax, records: list[dict]):
    """The swim-lane panel; returns the colour scale's ScalarMappable."""
    import matplotlib

    lanes = lane_index(records)
    used = [r["keys_used"] for r in records]
    norm = matplotlib.colors.Normalize(vmin=0, vmax=max(used) or 1)
    cmap = matplotlib.colormaps["viridis"]
    _draw_bars(ax, records, lanes, norm, cmap)
    _draw_labels(ax, records, lanes)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    keys = lane_keys(records)
    ax.set_ylabel(f"lane ({', '.join(keys)})" if keys else "lane")
    if len(lanes) <= 24:
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels(
            [" ".join(f"{k}{v}" for k, v in lid) or "-" for lid in lanes], fontsize=7
        )
    ax.set_xlabel("key_range on the lane's key axis (keys, top-k columns or token rows)")
    colour = (
        "green = selected block (label = slot), grey = dropped"
        if any("slot" in r["extra"] for r in records)
        else "colour = keys_used"
    )
    ax.set_title(f"{len(records)} tiles in {len(lanes)} lanes; {colour}")
    return matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)


def _draw_stat(ax, records: list[dict], key: str, title: str) -> None:
    drop = _drops_masked(records[0]["op"], key)
    st = [_stat(r, key, drop_masked=drop) for r in records]
    ok = [i for i, s in enumerate(st) if s is not None]
    lo, mid, hi = (np.array([st[i][j] for i in ok]) for j in range(3))
    ax.vlines(ok, lo, hi, color="tab:gray", linewidth=0.8)
    ax.plot(ok, mid, ".", color="tab:red", markersize=3)
    if key == "row_sum" and lo.min() > 0:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("tile (execution order)")


def stat_panels(records: list[dict]) -> list[tuple[str, str]]:
    """``[(record key, panel title)]`` of the statistics the records carry (at most two
    panels: the attention ops' row max and row sum, or the indexer's per-head block max once:
    its ``row_max`` and ``extra["head_max"]`` hold the same values)."""
    if not records:
        return []
    op = records[0]["op"]
    keys = [k for k in _STAT_KEYS if any(_stat(r, k) is not None for r in records)]
    if op in _INDEXER_OPS and "row_max" in keys and "head_max" in keys:
        keys.remove("head_max")
    n_masked = _n_masked(records) if op not in _INDEXER_OPS else 0
    return [(k, panel_title(op, k, n_masked)) for k in keys][:2]


def draw_schedule(fig, records: list[dict]) -> None:
    """Draw the records of one run into ``fig``: a run of several ops (a layer step) one
    panel per op in the order they ran (:func:`op_groups`); an op traced by pipeline stage
    (the prologs, :func:`is_staged`) by stage (:func:`draw_stages`); any other op as swim
    lanes on top, statistics below."""
    if not records:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "the reference emitted no tiles", ha="center", va="center")
        ax.set_axis_off()
        return
    groups = op_groups(records)
    if len(groups) > 1:
        _draw_op_groups(fig, groups)
    elif is_staged(records):
        draw_stages(fig, records)
    else:
        draw_tiles(fig, records)


def draw_tiles(fig, records: list[dict]) -> None:
    """One op's tiles: swim lanes on top, the records' statistics below."""
    panels = stat_panels(records)
    axes = fig.subplots(
        1 + len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": [3] + [2] * len(panels)}
    )
    mappable = _draw_lanes(axes[0, 0], records)
    fig.colorbar(mappable, ax=axes[0, 0], label="keys_used")
    for j, (key, title) in enumerate(panels):
        _draw_stat(axes[1 + j, 0], records, key, title)


# ---------------------------------------------------------------------------------------------
# runs of several ops, ops traced by pipeline stage (the prologs)


def op_groups(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """``[(op, its records)]`` in the order the ops first emitted (a layer step: its stages)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["op"], []).append(r)
    return list(groups.items())


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
    ax.set_title(_wrapped(stage_title(records[0]["op"], rows), 90), fontsize=9)
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


def group_height(records: list[dict]) -> float:
    """Inches one op's picture needs (:func:`draw_schedule`)."""
    if is_staged(records):
        return 1.6 + 0.28 * len({r["lane"]["stage"] for r in records})
    return 2.8 + 1.9 * len(stat_panels(records))


def schedule_height(records: list[dict]) -> float:
    """Inches :func:`draw_schedule` needs for ``records`` (a run of several ops: the sum of
    its ops' pictures)."""
    groups = op_groups(records)
    if len(groups) <= 1:
        return 7.5 if not is_staged(records) else max(4.0, group_height(records) + 0.8)
    return sum(group_height(rs) + 0.5 for _, rs in groups)


def _draw_op_groups(fig, groups: list) -> None:
    """A run of several ops (the layer step): one panel per op, in the order they ran, each
    titled with its place, its op and what its records are."""
    heights = [group_height(rs) for _, rs in groups]
    subs = fig.subfigures(len(groups), 1, height_ratios=heights)
    for j, ((op, rs), sub) in enumerate(zip(groups, subs, strict=True)):
        kind = "by pipeline stage" if is_staged(rs) else f"{len(rs)} tiles"
        sub.suptitle(f"stage {j + 1} of {len(groups)}: {op} ({kind})", fontsize=10,
                     fontweight="bold")  # fmt: skip
        if is_staged(rs):
            draw_stages(sub, rs)
        else:
            draw_tiles(sub, rs)


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
    fig,
    actual: np.ndarray,
    golden: np.ndarray,
    *,
    atol: float | None,
    rtol: float | None,
    title: str = "",
) -> None:
    """|actual - golden| as a heat map (log scale, max-pooled to at most 256x256 cells) and
    the same divided by the tolerance ``atol + rtol*|golden|`` (> 1 = failing element); with
    no published tolerance (``atol``/``rtol`` ``None``, mode ``ulp``) the first map alone."""
    a = _as_2d(actual).astype(np.float64)
    g = _as_2d(golden).astype(np.float64)
    with np.errstate(all="ignore"):
        err = np.abs(a - g)
    err = np.where(np.isnan(err), np.inf, err)
    numbered = atol is not None and rtol is not None
    axes = fig.subplots(1, 2 if numbered else 1)
    axes = list(axes) if numbered else [axes]
    finite = err[np.isfinite(err)]
    top = float(finite.max()) if finite.size else 1.0
    e = _max_pool(np.where(np.isfinite(err), err, top * 10))
    floor = max(top, atol or 0.0, 1e-30) * 1e-6  # show six decades below the largest error
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
    if numbered:
        _draw_ratio_map(fig, axes[1], err, g, atol, rtol, extent)
    for ax in axes:
        ax.set_xlabel("last axis")
        ax.set_ylabel("rows (leading axes flattened)")
    if title:
        fig.suptitle(_wrapped(title), fontsize=10)


def _draw_ratio_map(fig, ax, err, g, atol: float, rtol: float, extent) -> None:
    """The error over the tolerance ``atol + rtol*|golden|`` (> 1 = a failing element)."""
    import matplotlib

    with np.errstate(all="ignore"):
        ratio = err / (atol + rtol * np.abs(g))
    rp = _max_pool(np.where(np.isfinite(ratio), ratio, 1e6))
    vmax = max(2.0, float(np.nanmax(rp)) if rp.size else 2.0)
    im2 = ax.imshow(
        rp,
        aspect="auto",
        interpolation="nearest",
        extent=extent,
        cmap="RdYlGn_r",
        norm=matplotlib.colors.TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=vmax),
    )
    fig.colorbar(im2, ax=ax, label="|err| / (atol + rtol*|golden|)")
    nfail = int((~(ratio <= 1)).sum())
    ax.set_title(f"error / tolerance: {nfail} of {ratio.size} elements > 1", fontsize=9)


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
    error_maps: list | None = None,
) -> None:
    """One PNG: the schedule on top (:func:`draw_schedule`), below it the error maps of
    ``actual`` against ``golden`` when given (:func:`draw_error_map`), or one map per judged
    output (``error_maps``, :class:`ErrorMap`: the ops judged by stage)."""
    plt = _pyplot()
    parts = [schedule_height(records)]
    if actual is not None:
        parts.append(3.5)
    if error_maps:
        parts.append(error_maps_height(len(error_maps)))
    fig = plt.figure(figsize=(11, sum(parts)), dpi=90, layout="constrained")
    subs = fig.subfigures(len(parts), 1, height_ratios=parts) if len(parts) > 1 else [fig]
    subs[0].suptitle(_wrapped(title), fontsize=11)
    draw_schedule(subs[0], records)
    if actual is not None:
        draw_error_map(subs[1], actual, golden, atol=atol, rtol=rtol, title=err_title)
    if error_maps:
        draw_error_maps(subs[-1], error_maps, title=err_title)
    _save_small_png(fig, path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# error maps of an op judged by stage (one per output)


@dataclasses.dataclass
class ErrorMap:
    """One judged output of ``tilesim trace --actual`` for an op judged by stage. A number
    map: ``values`` ``[rows, columns]`` the distance per element in ``unit`` (-1: a NaN
    pair, :func:`distance_map`), ``row_label`` / ``row_names`` what the rows are (tokens, a
    cache's written slots), ``columns`` ``[(first column, field)]`` of a cache's fields; or
    an id map: ``ids`` the ``(grid, marks)`` of :func:`id_grid`."""

    title: str
    values: np.ndarray | None = None
    unit: str = ""
    row_label: str = "token"
    row_names: list | None = None
    columns: list = dataclasses.field(default_factory=list)
    ids: tuple | None = None


def distance_map(actual, golden) -> tuple[np.ndarray, str]:
    """``(distance [rows, columns], unit)`` per element of ``actual`` against ``golden``
    (rows: the golden's leading axis, the rest flattened): integer codes in code steps
    ``|a - g|``; floats in ULPs of the output's dtype
    (:func:`tilesim.cli.distribution.ulp_distances`; -1 where either is NaN); a dump of the
    same bytes under another dtype of the same width (E4M3 as uint8) is read as the golden's
    dtype."""
    from tilesim.cli.distribution import ulp_distances

    g = np.asarray(golden)
    a = np.asarray(actual).reshape(g.shape)
    if a.dtype != g.dtype and a.dtype.itemsize == g.dtype.itemsize and g.dtype.kind in "fV":
        a = a.view(g.dtype)
    rows = g.shape[0] if g.ndim else 1
    if g.dtype.kind in "iub":
        d = np.abs(a.astype(np.int64) - g.astype(np.int64))
        return d.reshape(rows, -1), f"code steps ({g.dtype})"
    d = ulp_distances(a, g)
    if d is None:  # no ULP for the dtype: the absolute error
        with np.errstate(all="ignore"):
            d = np.abs(a.astype(np.float64) - g.astype(np.float64))
        return np.where(np.isnan(d), -1.0, d).reshape(rows, -1), "|actual - golden|"
    return d.reshape(rows, -1), f"ULP in {a.dtype}"


def error_maps_height(n: int) -> float:
    """Inches :func:`draw_error_maps` needs for ``n`` maps."""
    return 0.6 + 2.7 * -(-n // _map_columns(n))


def _map_columns(n: int) -> int:
    return 1 if n == 1 else 2


def draw_error_maps(fig, maps: list, *, title: str = "") -> None:
    """One panel per :class:`ErrorMap`, in the op's output order."""
    cols = _map_columns(len(maps))
    axes = fig.subplots(-(-len(maps) // cols), cols, squeeze=False).reshape(-1)
    for ax, m in zip(axes, maps, strict=False):
        if m.ids is not None:
            _draw_id_grid(ax, *m.ids, legend=False)
            ax.set_title(_wrapped(f"{m.title}\n{id_counts_text(*m.ids)}", 70), fontsize=8)
        else:
            _draw_distance(fig, ax, m)
    for ax in axes[len(maps) :]:
        ax.set_axis_off()
    if title:
        fig.suptitle(_wrapped(title), fontsize=10)


def _draw_distance(fig, ax, m: ErrorMap) -> None:
    v = np.asarray(m.values, np.float64)
    nan = v < 0
    top = float(v[~nan].max()) if (~nan).any() else 0.0
    shown = _max_pool(np.log10(1.0 + np.where(nan, max(top, 1.0) * 10, v)))
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="magma", vmin=0.0,
                   vmax=max(float(shown.max()), np.log10(2.0)),
                   extent=(0, v.shape[1], v.shape[0], 0))  # fmt: skip
    unit = m.unit if len(m.unit) <= 28 else "distance (units: title)"
    fig.colorbar(im, ax=ax, label=f"log10(1 + {unit})")
    for c0, name in m.columns:
        ax.axvline(c0, color="white", linewidth=0.8)
        ax.text(c0, 0, f" {name}", color="white", fontsize=7, va="top")
    if m.row_names is not None and len(m.row_names) <= 24:
        ax.set_yticks(np.arange(len(m.row_names)) + 0.5, [str(r) for r in m.row_names],
                      fontsize=6)  # fmt: skip
    ax.set_ylabel(m.row_label)
    ax.set_xlabel("element of the row (trailing axes flattened)")
    n_diff = int((v != 0).sum())
    what = f"{n_diff} of {v.size} elements differ, max {top:.4g} {m.unit}"
    if nan.any():
        what += f", {int(nan.sum())} NaN pairs (drawn brightest)"
    ax.set_title(_wrapped(f"{m.title}\n{what}", 70), fontsize=8)


def draw_ulp_histogram(ax, ulps: np.ndarray, dtype: str) -> None:
    """Counts of elements per ULP distance (log-spaced bins above 8 ULP, log count axis)."""
    u = ulps[ulps >= 0]
    top = int(u.max()) if u.size else 0
    edges = np.arange(-0.5, min(top, 8) + 1.5)
    if top > 8:
        edges = np.unique(np.concatenate([edges, np.geomspace(9, top + 1, 24).round() - 0.5]))
    counts, edges = np.histogram(u, bins=edges)
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="tab:blue", log=True)
    if top > 8:
        ax.set_xscale("symlog", linthresh=8)
    ax.set_xlabel(f"ULP distance in {dtype} (0 = bit-exact)")
    ax.set_ylabel("elements")
    nan = int((ulps < 0).sum())
    extra = f", {nan} NaN pairs left out" if nan else ""
    ax.set_title(f"ULP histogram: {u.size} elements, max {top}{extra}", fontsize=9)


def save_compare_png(
    path: Path, *, actual, golden, ulps, atol: float, rtol: float, title: str
) -> None:
    """One PNG for ``tilesim compare --png``: the ULP histogram on top (when the output is a
    float), the error heat maps below."""
    plt = _pyplot()
    fig = plt.figure(figsize=(11, 8 if ulps is not None else 4.5), dpi=90, layout="constrained")
    if ulps is not None:
        top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1.1])
        draw_ulp_histogram(top.subplots(), ulps, str(actual.dtype))
    else:
        bottom = fig
    draw_error_map(bottom, actual, golden, atol=atol, rtol=rtol)
    fig.suptitle(_wrapped(title), fontsize=10)
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


# ---------------------------------------------------------------------------------------------
# id selections

#: the categories of an id picture, in drawing priority (a pooled cell shows the highest)
ID_CATEGORIES = (
    ("not selected", "#f2f2f2"),
    ("selected by both", "#9e9e9e"),
    ("accepted tie (device id / golden id it replaces)", "#4f8fd6"),
    ("unread (device id after the entries read)", "#c77dff"),
    ("extra (device id the golden lacks)", "#ff9f1c"),
    ("invisible, duplicate or out of range", "#7b2cbf"),
    ("missing (golden id the device lacks)", "#d62728"),
)
#: markers drawn over the picture at most (the wrong and tied ids, so that none is hidden)
MAX_MARKERS = 4000


def _id_marks(row) -> list[tuple[list, int]]:
    """``[(ids, category)]`` of one row of the judge's id report."""
    return [
        ([t[0] for t in row.ties] + [t[1] for t in row.ties], 2),
        (row.unread, 3),
        (row.extra, 4),
        (row.invisible + row.duplicates + row.out_of_range, 5),
        (row.missing, 6),
    ]


def id_grid(verdict, actual: np.ndarray, golden: np.ndarray, candidates: int | None = None):
    """``(grid, marks)``: ``grid`` uint8 ``[rows, candidates]``, per id row and candidate
    position the index of its category in :data:`ID_CATEGORIES`, from the judge's id report
    (``verdict.ids``) and the golden ids; ``marks`` ``[(row, id, category)]`` of every tied
    or wrong id. ``candidates``: the number of positions (the scores' width; default the
    largest id seen + 1)."""
    a = np.asarray(actual, np.int64).reshape(-1, np.shape(golden)[-1])
    g = np.asarray(golden, np.int64).reshape(a.shape)
    top = int(max(a.max(initial=-1), g.max(initial=-1))) + 1
    n = max(int(candidates or 0), top, 1)
    grid = np.zeros((a.shape[0], n), np.uint8)
    rows, cols = np.nonzero(g >= 0)
    grid[rows, g[rows, cols]] = 1
    marks = []
    for row in (verdict.ids.wrong + verdict.ids.tied) if verdict.ids is not None else []:
        for ids, cat in _id_marks(row):
            ids = [i for i in ids if 0 <= i < n]
            grid[row.index, ids] = np.maximum(grid[row.index, ids], cat)
            marks += [(row.index, i, cat) for i in ids]
    return grid, marks


def _pool_max(grid: np.ndarray, rows: int = 256, cols: int = 1024) -> np.ndarray:
    """``grid`` max-pooled to at most ``rows`` x ``cols`` cells (a cell shows its worst)."""
    r = max(1, -(-grid.shape[0] // rows))
    c = max(1, -(-grid.shape[1] // cols))
    pr, pc = (-grid.shape[0]) % r, (-grid.shape[1]) % c
    p = np.pad(grid, ((0, pr), (0, pc)))
    return p.reshape(p.shape[0] // r, r, p.shape[1] // c, c).max(axis=(1, 3))


def _id_legend(ax, grid: np.ndarray, marks: list) -> None:
    from matplotlib.patches import Patch

    counts = np.bincount([c for _, _, c in marks], minlength=len(ID_CATEGORIES))
    counts[1] = int((grid == 1).sum())
    handles = [Patch(color=c, label=f"{name}: {int(counts[j])}")
               for j, (name, c) in enumerate(ID_CATEGORIES) if j]  # fmt: skip
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2,
              fontsize=8, frameon=False)  # fmt: skip


def save_ids_png(path: Path, *, grid: np.ndarray, marks: list, title: str,
                 row_label: str = "id row") -> None:  # fmt: skip
    """One PNG for ``tilesim compare --png`` of an id output: per row (y) and candidate
    position (x), which ids both select, which the device misses, adds or puts after the
    entries read, which are accepted ties (:func:`id_grid`), max-pooled so that a wrong id is
    never hidden, and a marker on each tied or wrong id."""
    plt = _pyplot()
    fig = plt.figure(figsize=(11, 5.5), dpi=90, layout="constrained")
    ax = fig.subplots()
    _draw_id_grid(ax, grid, marks, row_label=row_label)
    fig.suptitle(_wrapped(title), fontsize=10)
    _save_small_png(fig, path)
    plt.close(fig)


def id_counts_text(grid: np.ndarray, marks: list) -> str:
    """``"selected by both 2596, missing 1, ..."``: the id picture's categories with a count
    (the legend's numbers, in one line)."""
    counts = np.bincount([c for _, _, c in marks], minlength=len(ID_CATEGORIES))
    counts[1] = int((grid == 1).sum())
    return ", ".join(f"{name.split(' (')[0]} {int(counts[j])}"
                     for j, (name, _) in enumerate(ID_CATEGORIES) if j and counts[j])  # fmt: skip


def _draw_id_grid(ax, grid: np.ndarray, marks: list, *, row_label: str = "id row",
                  legend: bool = True) -> None:  # fmt: skip
    """The id picture of :func:`save_ids_png` into ``ax`` (``legend``: the colour legend
    under it)."""
    import matplotlib

    colours = [c for _, c in ID_CATEGORIES]
    ax.imshow(_pool_max(grid), aspect="auto", interpolation="nearest",
              cmap=matplotlib.colors.ListedColormap(colours), vmin=-0.5,
              vmax=len(colours) - 0.5, extent=(0, grid.shape[1], grid.shape[0], 0))  # fmt: skip
    if marks:
        r, i, c = (np.array(x) for x in zip(*marks[:MAX_MARKERS], strict=True))
        ax.scatter(i + 0.5, r + 0.5, c=[colours[k] for k in c], s=14, marker="|")
    ax.set_xlim(0, grid.shape[1])
    ax.set_ylim(grid.shape[0], 0)
    if grid.shape[0] <= 32:
        ax.set_yticks(np.arange(grid.shape[0]) + 0.5, [str(j) for j in range(grid.shape[0])])
    ax.set_xlabel("candidate position (id)")
    ax.set_ylabel(row_label)
    if legend:
        _id_legend(ax, grid, marks)
