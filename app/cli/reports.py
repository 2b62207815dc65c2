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
    from tilesim.cli.plot import save_compare_png

    rep, _, a, g, _ = result
    if rep.kind == "ids":
        _ids_png(outputs, png, rep, a, g, candidates)
        return
    title = (
        f"{rep.name}: {'PASS' if rep.passed else 'FAIL'}, {rep.n_fail} failing "
        f"(allowed {rep.threshold}), max |err| {rep.max_abs_err:.3g}, max ULP {rep.max_ulp}"
    )
    if rep.failed:
        title += f"; failed: {', '.join(rep.failed)}"
    if rep.n_nonfinite:
        where = ", ".join(str(i) for i, _ in rep.nonfinite[:3])
        title += f"; {rep.n_nonfinite} NaN/Inf at {where}"
    with outputs:
        save_compare_png(
            outputs.temp(png),
            actual=a.array.reshape(g.array.shape),
            golden=g.array,
            ulps=ulp_distances(a.array.reshape(g.array.shape), g.array),
            atol=tol["atol"],
            rtol=tol["rtol"],
            title=title,
        )


def _ids_png(outputs: Outputs, png: Path, rep, a, g, candidates) -> None:
    from tilesim.cli.plot import id_grid, save_ids_png

    n_rows = rep.ids.n_rows if rep.ids is not None else int(np.prod(g.array.shape[:-1]))
    wrong = len(rep.ids.wrong) if rep.ids is not None else rep.n_fail
    tied = len(rep.ids.tied) if rep.ids is not None else 0
    title = (f"{rep.name}: {'PASS' if rep.passed else 'FAIL'}, {wrong} of {n_rows} rows wrong, "
             f"{tied} accepted by score ties")  # fmt: skip
    if rep.failed:
        title += f"; failed: {', '.join(rep.failed)}"
    lead = g.array.shape[:-1]
    label = "id row" if len(lead) <= 1 else f"id row ({' x '.join(map(str, lead))} flattened)"
    with outputs:
        grid, marks = id_grid(rep, a.array, g.array, candidates)
        save_ids_png(outputs.temp(png), grid=grid, marks=marks, title=title, row_label=label)
