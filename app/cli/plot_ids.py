"""The picture of an id output judged as sets (``tilesim compare --png``, the ids' panel of an op
judged by stage): per id row and candidate position, which ids both select, which the device
misses, adds or puts after the entries read, and which are accepted ties, from the judge's id
report (:class:`tilesim.reference.judging.ties.IdReport`); pooled so that a wrong id is never
hidden, with a marker on each tied or wrong id.
"""

from __future__ import annotations

import numpy as np

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


def id_counts_text(grid: np.ndarray, marks: list) -> str:
    """``"selected by both 2596, missing 1, ..."``: the id picture's categories with a count
    (the legend's numbers, in one line)."""
    counts = np.bincount([c for _, _, c in marks], minlength=len(ID_CATEGORIES))
    counts[1] = int((grid == 1).sum())
    return ", ".join(f"{name.split(' (')[0]} {int(counts[j])}"
                     for j, (name, _) in enumerate(ID_CATEGORIES) if j and counts[j])  # fmt: skip


def draw_id_grid(ax, grid: np.ndarray, marks: list, *, row_label: str = "id row",
                 legend: bool = True) -> None:  # fmt: skip
    """The id picture of :func:`id_grid`'s ``(grid, marks)`` into ``ax`` (``legend``: the
    colour legend under it)."""
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


__all__ = ["ID_CATEGORIES", "MAX_MARKERS", "draw_id_grid", "id_counts_text", "id_grid"]
