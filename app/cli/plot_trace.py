"""The tile schedule of a reference run, drawn from its trace records, and the counts of
the text report.

The functions read only the trace-record schema of :mod:`tilesim.shared.trace` (``op, lane,
step, key_range, keys_used, row_max, row_sum, flop, extra``): one swim lane per distinct
``lane`` dict, one bar per record over its ``key_range``, coloured by ``keys_used``; below, the
records' ``row_max``, ``row_sum`` and ``extra["head_max"]`` when they carry them, each panel
titled with what that op's records mean (:func:`panel_title`: the attention ops' softmax
statistics; the MSA indexer's per-head block score maxima and the DeepSeek indexer's per-row
block score maxima, which are no softmax). A row that sees no key in a tile (every score
masked, its max at a mask value or ``-inf``) is left out of the row max and row sum panels,
and the title says how many were. ``extra["slot"]`` (indexer: the block's slot, -1 =
dropped) and ``extra["branch"]`` (a merge branch) label the bars. A run of several ops (the
layer step) is drawn one panel per op in the order they ran; an op traced by pipeline stage
(the prologs) by stage (:mod:`tilesim.cli.plot_stages`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from tilesim.cli.plot_stages import draw_stages, is_staged
from tilesim.shared.msa_main import MASK_NEG
from tilesim.shared.registry.ops import record
from tilesim.shared.trace import lane_id

#: a row max at or below this is a row with every score of the tile masked (the attention
#: ops' mask values: -1e9, -3e38 clamped at -1e30; the DeepSeek indexer's -inf)
MASKED_BELOW = float(MASK_NEG) / 2


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


def tile_stat(rec: dict, key: str, *, drop_masked: bool = False):
    """``(min, mean, max)`` of the record's ``key`` statistic over its finite rows
    (``drop_masked``: without the rows that see no key in the tile), or ``None``."""
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
_MSA_INDEXER_OPS = record("msa_indexer").call_names
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
    if op in _MSA_INDEXER_OPS and key in ("row_max", "head_max"):
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
    return op not in _MSA_INDEXER_OPS and key in ("row_max", "row_sum")


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
    st = [tile_stat(r, key, drop_masked=drop) for r in records]
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
    keys = [k for k in _STAT_KEYS if any(tile_stat(r, k) is not None for r in records)]
    if op in _MSA_INDEXER_OPS and "row_max" in keys and "head_max" in keys:
        keys.remove("head_max")
    n_masked = _n_masked(records) if op not in _MSA_INDEXER_OPS else 0
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
# runs of several ops


def op_groups(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """``[(op, its records)]`` in the order the ops first emitted (a layer step: its stages)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["op"], []).append(r)
    return list(groups.items())


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


__all__ = ["MASKED_BELOW", "draw_schedule", "draw_tiles", "group_height", "lane_index", "lane_keys",
           "masked_rows", "op_groups", "panel_title", "schedule_height", "stat_panels", "summarize",
           "tile_extent", "tile_stat"]  # fmt: skip
