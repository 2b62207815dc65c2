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
    names every failed check and would run off the figure)."""
    import textwrap

    return "\n".join(textwrap.wrap(title, width)) if title else title


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
    """Draw the schedule of one run into ``fig``: swim lanes on top, statistics below."""
    if not records:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "the reference emitted no tiles", ha="center", va="center")
        ax.set_axis_off()
        return
    panels = stat_panels(records)
    axes = fig.subplots(
        1 + len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": [3] + [2] * len(panels)}
    )
    mappable = _draw_lanes(axes[0, 0], records)
    fig.colorbar(mappable, ax=axes[0, 0], label="keys_used")
    for j, (key, title) in enumerate(panels):
        _draw_stat(axes[1 + j, 0], records, key, title)


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
) -> None:
    """One PNG: the schedule on top, the error maps below when ``actual`` is given."""
    plt = _pyplot()
    with_err = actual is not None
    fig = plt.figure(figsize=(11, 10.5 if with_err else 7.5), dpi=90, layout="constrained")
    if with_err:
        top, bottom = fig.subfigures(2, 1, height_ratios=[2.2, 1])
    else:
        top, bottom = fig, None
    top.suptitle(_wrapped(title), fontsize=11)
    draw_schedule(top, records)
    if with_err:
        draw_error_map(bottom, actual, golden, atol=atol, rtol=rtol, title=err_title)
    _save_small_png(fig, path)
    plt.close(fig)


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
    import matplotlib

    plt = _pyplot()
    fig = plt.figure(figsize=(11, 5.5), dpi=90, layout="constrained")
    ax = fig.subplots()
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
    _id_legend(ax, grid, marks)
    fig.suptitle(_wrapped(title), fontsize=10)
    _save_small_png(fig, path)
    plt.close(fig)
