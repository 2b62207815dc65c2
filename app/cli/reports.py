"""What ``tilesim compare`` prints: one verdict per golden output as text (the judge's summary,
the error distribution) or JSON, and the ``--png`` picture of one output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tilesim.cli.distribution import distribution_text, ulp_distances
from tilesim.cli.outputs import Outputs
from tilesim.cli.runner import jsonable


def report_json(rep, dist, a, g, against, tol) -> dict:
    """The verdict as JSON; the seeds' report fields (``n_fail``, ``worst``, ...) also sit at
    the top level."""
    v = rep.as_dict()
    d = {k: jsonable(x) for k, x in v.pop("seeds", {}).items()}
    d.update(v)
    d.update(actual=a.source, golden=g.source, mode=rep.tolerance.get("mode", tol["mode"]))
    if dist is not None:
        d["distribution"] = dist
    if against is not None:
        d["judged_against"] = against
    return d


def print_report(rep, dist, a, g, against, tol, scores_missing: bool) -> None:
    """One output's verdict as text: the files, how ids were compared, the judge's summary
    and the error distribution."""
    print(f"actual: {a.source}\ngolden: {g.source}")
    if rep.kind == "ids":
        how = "sorted rows" if rep.rule == "seeds" else "tie-aware with the golden's scores"
        print(f"(ids compared as sets, {how if not scores_missing else 'exact sets'})")
        if scores_missing:
            print("(the golden stores no block scores: ties cannot be recognised)")
    if against is not None:
        print(f"(attention judged against {against})")
    print(rep.summary())
    if dist is not None:
        print(distribution_text(dist))


def compare_png(outputs: Outputs, png: Path, result, tol, candidates: int | None = None) -> None:
    """The picture of one judged output (``result``: the ``(verdict, distribution, actual,
    golden, against)`` of :mod:`tilesim.cli.compare`): floats, the ULP histogram and the error
    maps; ids, per row the ids both select, the missing, extra and tied ones
    (``candidates``: the number of candidate positions, the golden scores' width)."""
    rep, _, a, g, _ = result
    with outputs:
        draw_png(outputs.temp(png), rep, a.array, g.array, tol, candidates)


def stage_png_paths(png: Path, report) -> list[tuple[Path, str, object, object, object]]:
    """``[(path, stage, verdict, actual, golden)]``: one picture per judged output of a stage
    report (:class:`tilesim.reference.judging.stages.StageReport`), a cache one per field of its
    written slots, named ``<png stem>.<stage>.<output>[.<field>].png`` beside ``png``."""
    out = []
    for s in report.stages:
        for o in s.outputs:
            for (_, v), (field, a, g) in zip(o.verdicts, o.arrays, strict=True):
                name = ".".join(x for x in (png.stem, s.stage, o.name, field) if x)
                out.append((png.with_name(name + png.suffix), s.stage, v, a, g))
    return out


def draw_png(path: Path, rep, actual, golden, tol, candidates=None, stage: str = "") -> None:
    """:func:`compare_png`'s picture of the verdict ``rep`` of the arrays ``actual`` /
    ``golden``, written to ``path`` (``stage``: the stage it belongs to, in the title)."""
    from tilesim.cli.plot import save_compare_png

    if rep.kind == "ids":
        _ids_png(path, rep, actual, golden, candidates, stage)
        return
    title = (
        f"{stage + ': ' if stage else ''}{rep.name}: {'PASS' if rep.passed else 'FAIL'}, "
        f"{rep.n_fail} failing (allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}, "
        f"max ULP {rep.max_ulp}"
    )
    if rep.failed:
        title += f"; failed: {', '.join(rep.failed)}"
    if rep.n_nonfinite:
        where = ", ".join(str(i) for i, _ in rep.nonfinite[:3])
        title += f"; {rep.n_nonfinite} NaN/Inf at {where}"
    a, g = _same_as_zero(np.asarray(actual).reshape(np.shape(golden)), np.asarray(golden))
    save_compare_png(path, actual=a, golden=g, ulps=ulp_distances(a, g), atol=tol.get("atol"),
                     rtol=tol.get("rtol"), title=title)  # fmt: skip


def _same_as_zero(a: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a``, ``g`` with the infinities they share set to 0 (the index scores' ``-inf`` of a
    position not seen is no error), else unchanged."""
    if a.dtype.kind not in "fV" or g.dtype.kind not in "fV":
        return a, g
    with np.errstate(invalid="ignore"):
        a64, g64 = a.astype(np.float64), g.astype(np.float64)
        shared = np.isinf(a64) & (a64 == g64)
    if not shared.any():
        return a, g
    return np.where(shared, np.zeros((), a.dtype), a), np.where(shared, np.zeros((), g.dtype), g)


def _ids_png(path: Path, rep, a, g, candidates, stage: str = "") -> None:
    from tilesim.cli.plot import save_ids_png
    from tilesim.cli.plot_ids import id_grid

    n_rows = rep.ids.n_rows if rep.ids is not None else int(np.prod(g.shape[:-1]))
    wrong = len(rep.ids.wrong) if rep.ids is not None else rep.n_fail
    tied = len(rep.ids.tied) if rep.ids is not None else 0
    title = (f"{stage + ': ' if stage else ''}{rep.name}: {'PASS' if rep.passed else 'FAIL'}, "
             f"{wrong} of {n_rows} rows wrong, {tied} accepted by score ties")  # fmt: skip
    if rep.failed:
        title += f"; failed: {', '.join(rep.failed)}"
    lead = g.shape[:-1]
    label = "id row" if len(lead) <= 1 else f"id row ({' x '.join(map(str, lead))} flattened)"
    grid, marks = id_grid(rep, a, g, candidates)
    save_ids_png(path, grid=grid, marks=marks, title=title, row_label=label)
