"""Error pictures: the heat map of ``|actual - golden|`` and of the error over the tolerance
(``tilesim compare --png``, ``tilesim trace --actual``), the ULP histogram, and for an op judged
by stage one map per judged output (:class:`ErrorMap`: ULPs or code steps per element, caches
per written slot, ids as their selection picture of :mod:`tilesim.cli.plot_ids`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tilesim.cli.plot_figure import max_pool, wrapped
from tilesim.cli.plot_ids import draw_id_grid, id_counts_text


def as_rows(a: np.ndarray) -> np.ndarray:
    """``a`` as ``[rows, last axis]`` (a scalar one cell, a vector one row)."""
    a = np.asarray(a)
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.ndim == 1:
        return a.reshape(1, -1)
    return a.reshape(-1, a.shape[-1])


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
    a = as_rows(actual).astype(np.float64)
    g = as_rows(golden).astype(np.float64)
    with np.errstate(all="ignore"):
        err = np.abs(a - g)
    err = np.where(np.isnan(err), np.inf, err)
    numbered = atol is not None and rtol is not None
    axes = fig.subplots(1, 2 if numbered else 1)
    axes = list(axes) if numbered else [axes]
    finite = err[np.isfinite(err)]
    top = float(finite.max()) if finite.size else 1.0
    e = max_pool(np.where(np.isfinite(err), err, top * 10))
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
        fig.suptitle(wrapped(title), fontsize=10)


def _draw_ratio_map(fig, ax, err, g, atol: float, rtol: float, extent) -> None:
    """The error over the tolerance ``atol + rtol*|golden|`` (> 1 = a failing element)."""
    import matplotlib

    with np.errstate(all="ignore"):
        ratio = err / (atol + rtol * np.abs(g))
    rp = max_pool(np.where(np.isfinite(ratio), ratio, 1e6))
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
            draw_id_grid(ax, *m.ids, legend=False)
            ax.set_title(wrapped(f"{m.title}\n{id_counts_text(*m.ids)}", 70), fontsize=8)
        else:
            _draw_distance(fig, ax, m)
    for ax in axes[len(maps) :]:
        ax.set_axis_off()
    if title:
        fig.suptitle(wrapped(title), fontsize=10)


def _draw_distance(fig, ax, m: ErrorMap) -> None:
    v = np.asarray(m.values, np.float64)
    nan = v < 0
    top = float(v[~nan].max()) if (~nan).any() else 0.0
    shown = max_pool(np.log10(1.0 + np.where(nan, max(top, 1.0) * 10, v)))
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
    ax.set_title(wrapped(f"{m.title}\n{what}", 70), fontsize=8)


__all__ = ["ErrorMap", "as_rows", "distance_map", "draw_error_map", "draw_error_maps",
           "draw_ulp_histogram", "error_maps_height"]  # fmt: skip
