"""The PNG files of the command line: ``tilesim trace --png`` (the tile schedule, and the
error maps of ``--actual``), ``tilesim compare --png`` of a float output (ULP histogram and
error maps) and of an id output (the selection picture).

Each picture is drawn by one module: the schedule from the trace records
(:mod:`tilesim.cli.plot_trace`; an op traced by pipeline stage, :mod:`tilesim.cli.plot_stages`),
the error pictures (:mod:`tilesim.cli.plot_errors`), the id pictures
(:mod:`tilesim.cli.plot_ids`), on the shared frame of :mod:`tilesim.cli.plot_figure`
(headless: the Agg backend is selected before pyplot is imported).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tilesim.cli.plot_errors import (
    draw_error_map,
    draw_error_maps,
    draw_ulp_histogram,
    error_maps_height,
)
from tilesim.cli.plot_figure import pyplot, require_matplotlib, save_small_png, wrapped
from tilesim.cli.plot_ids import draw_id_grid
from tilesim.cli.plot_trace import draw_schedule, schedule_height


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
    output (``error_maps``, :class:`~tilesim.cli.plot_errors.ErrorMap`: the ops judged by
    stage)."""
    plt = pyplot()
    parts = [schedule_height(records)]
    if actual is not None:
        parts.append(3.5)
    if error_maps:
        parts.append(error_maps_height(len(error_maps)))
    fig = plt.figure(figsize=(11, sum(parts)), dpi=90, layout="constrained")
    subs = fig.subfigures(len(parts), 1, height_ratios=parts) if len(parts) > 1 else [fig]
    subs[0].suptitle(wrapped(title), fontsize=11)
    draw_schedule(subs[0], records)
    if actual is not None:
        draw_error_map(subs[1], actual, golden, atol=atol, rtol=rtol, title=err_title)
    if error_maps:
        draw_error_maps(subs[-1], error_maps, title=err_title)
    save_small_png(fig, path)
    plt.close(fig)


def save_compare_png(
    path: Path, *, actual, golden, ulps, atol: float, rtol: float, title: str
) -> None:
    """One PNG for ``tilesim compare --png``: the ULP histogram on top (when the output is a
    float), the error heat maps below."""
    plt = pyplot()
    fig = plt.figure(figsize=(11, 8 if ulps is not None else 4.5), dpi=90, layout="constrained")
    if ulps is not None:
        top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1.1])
        draw_ulp_histogram(top.subplots(), ulps, str(actual.dtype))
    else:
        bottom = fig
    draw_error_map(bottom, actual, golden, atol=atol, rtol=rtol)
    fig.suptitle(wrapped(title), fontsize=10)
    save_small_png(fig, path)
    plt.close(fig)


def save_ids_png(path: Path, *, grid: np.ndarray, marks: list, title: str,
                 row_label: str = "id row") -> None:  # fmt: skip
    """One PNG for ``tilesim compare --png`` of an id output: per row (y) and candidate
    position (x), which ids both select, which the device misses, adds or puts after the
    entries read, which are accepted ties (:func:`~tilesim.cli.plot_ids.id_grid`),
    max-pooled so that a wrong id is never hidden, and a marker on each tied or wrong id."""
    plt = pyplot()
    fig = plt.figure(figsize=(11, 5.5), dpi=90, layout="constrained")
    ax = fig.subplots()
    draw_id_grid(ax, grid, marks, row_label=row_label)
    fig.suptitle(wrapped(title), fontsize=10)
    save_small_png(fig, path)
    plt.close(fig)


__all__ = ["require_matplotlib", "save_compare_png", "save_ids_png", "save_trace_png"]
