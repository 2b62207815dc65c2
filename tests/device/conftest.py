"""Fixtures of the device tests: SoC parametrisation, NPU/pypto skips and the cost-model report.

Markers (registered in pyproject.toml):

* ``sim`` — runs a kernel through PyPTO's CPU interpreter + cost model (``nox -s sim``);
  skipped with a reason when torch or pypto is missing.
* ``npu`` — needs an Ascend NPU with torch_npu and CANN (``nox -s device``); skipped with a
  reason everywhere else.
* ``soc_910b`` / ``soc_950`` — the SoC a test targets; the :func:`sim_soc` fixture adds them.

Fixtures:

* ``sim_soc`` — parametrised over ``"910b"`` and ``"950"`` (with the matching soc mark). Run a
  check through ``tilesim.device.sim.isolated(check_fn, ..., soc=sim_soc)``.
* ``sim_report`` — session-wide collector of the cost-model table; see :class:`SimReport`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tilesim.device._lazy import have_module, npu_available

REPO = Path(__file__).resolve().parents[2]
#: where the tests write the table (git-ignored); ``nox -s sim`` copies it into docs/perf/
REPORT_MD = REPO / "build" / "perf" / "cost_model.md"
#: the published table (tracked): the rows a partial run keeps, read only
PUBLISHED_MD = REPO / "docs" / "perf" / "cost_model.md"
#: extra columns that come first, in this order, when any row has them: the physical bounds,
#: then the streaming floor and the matmul-only probe, each with the kernel's multiple of it
BOUND_COLUMNS = (
    "row-wise ULP",
    "HBM-bound µs",
    "HBM-bound µs 950DT",
    "cube-peak µs",
    "floor µs",
    "kernel / floor",
    "probe µs",
    "kernel / probe",
)


def pytest_collection_modifyitems(config, items):
    need_sim = [i for i in items if "sim" in i.keywords]
    if need_sim and not (have_module("torch") and have_module("pypto")):
        skip = pytest.mark.skip(reason="needs torch + pypto: pip install 'tilesim[device]'")
        for item in need_sim:
            item.add_marker(skip)
    need_npu = [i for i in items if "npu" in i.keywords]
    if need_npu and not npu_available():
        skip = pytest.mark.skip(
            reason="no Ascend NPU (needs torch_npu, CANN's ASCEND_HOME_PATH and a device); "
            "run `nox -s sim` for the CPU simulator instead"
        )
        for item in need_npu:
            item.add_marker(skip)


@pytest.fixture(
    params=[
        pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
        pytest.param("950", marks=pytest.mark.soc_950, id="950"),
    ]
)
def sim_soc(request) -> str:
    """The SoC name to hand to ``sim.isolated(..., soc=sim_soc)``; one test per SoC."""
    return request.param


@pytest.fixture(
    params=[
        pytest.param("910b", marks=pytest.mark.soc_910b, id="910b"),
        pytest.param("950", marks=[pytest.mark.soc_950, pytest.mark.slow], id="950"),
    ]
)
def compile_soc(request) -> str:
    """:func:`sim_soc` for the compile-count and cost-path checks, whose subject (which
    arguments key a compile, that the cost-only path charges what the interpreted one does) is
    the wrapper's and the backend's, written once for both SoCs: the 950's run is ``slow``
    (left out under CI, which runs the 910B's)."""
    return request.param


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor; BF16 goes through its bits
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            import ml_dtypes

            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if x.dtype == torch.float8_e4m3fn:
            import ml_dtypes

            return x.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        return x.numpy()
    return np.asarray(x)


class SimReport:
    """Rows of the cost-model table ``build/perf/cost_model.md``, written once at the end of
    the session (``nox -s sim`` then copies it into the tracked ``docs/perf/``).

    Call from any sim test::

        sim_report.add(kernel="moe_grouped_gemm", soc="910b", case="silu E4 [3,0,5,8]",
                       bit_exact=0.998, max_ulp=1, max_abs=3.1e-3, us=12.4,
                       extra={"HBM-bound µs": 0.8, "cube-peak µs": 0.1})

    ``bit_exact`` is the fraction (0..1) of output elements whose bits equal the golden's,
    ``max_ulp`` the largest distance in units in the last place of the output dtype,
    ``max_abs`` the largest absolute error, ``us`` the cost-model time in µs. ``extra`` adds
    optional columns (any key; the union of keys becomes the extra columns: those of
    ``BOUND_COLUMNS`` first in that order -- incl. ``"floor µs"``, ``"kernel / floor"``,
    ``"probe µs"`` and ``"kernel / probe"`` --,
    then the others in first-seen order). :meth:`metrics` computes the first three from an
    output and its golden::

        sim_report.add(kernel=..., soc=..., case=..., us=run_us, **sim_report.metrics(out, gold))

    At session end the table is rewritten: a row of this session replaces the earlier row with
    the same (kernel, soc, case); all other earlier rows are kept, so running one test file, one
    SoC or ``-m "not slow"`` does not drop the others. The earlier rows come from the json
    sidecar next to ``path`` (``build/perf/cost_model.json``) or, when there is none yet, from
    the published one (``base``, default ``docs/perf/cost_model.json``), which is only read. To
    drop rows of cases that no longer exist, delete both jsons and rerun ``nox -s sim``.
    Nothing is written when no row was added. ``TILESIM_PERF_REPORT`` points the report
    elsewhere.
    """

    def __init__(self, path: Path = REPORT_MD, base: Path | None = PUBLISHED_MD) -> None:
        self.path = Path(path)
        self.base = None if base is None else Path(base)
        self.rows: list[dict] = []

    @staticmethod
    def metrics(actual, golden) -> dict:
        """``{"bit_exact", "max_ulp", "max_abs"}`` of ``actual`` vs ``golden`` (same dtype/shape;
        numpy/ml_dtypes arrays or torch tensors). NaN anywhere counts as not exact, ULP -1."""
        from tilesim.reference.numerics import ulp_distance

        a, g = _to_numpy(actual), _to_numpy(golden)
        if a.shape != g.shape:
            raise ValueError(f"actual/golden shapes differ: {a.shape} vs {g.shape}")
        if a.dtype != g.dtype:
            raise TypeError(f"actual/golden dtypes differ: {a.dtype} vs {g.dtype}")
        if a.size == 0:
            return {"bit_exact": 1.0, "max_ulp": 0, "max_abs": 0.0}
        bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        exact = float(np.mean(a.view(bits) == g.view(bits)))
        if np.issubdtype(a.dtype, np.integer):
            diff = np.abs(a.astype(np.int64) - g.astype(np.int64))
            return {"bit_exact": exact, "max_ulp": int(diff.max()), "max_abs": float(diff.max())}
        ulp = ulp_distance(a, g)
        max_ulp = -1 if (ulp < 0).any() else int(ulp.max())
        d = np.abs(a.astype(np.float64) - g.astype(np.float64))
        max_abs = float(np.nanmax(d)) if not np.isnan(d).all() else math.nan
        return {"bit_exact": exact, "max_ulp": max_ulp, "max_abs": max_abs}

    def add(
        self,
        *,
        kernel: str,
        soc: str,
        case: str,
        bit_exact: float | None,
        max_ulp: int | None,
        max_abs: float | None,
        us: float | None,
        extra: dict | None = None,
    ) -> None:
        """``bit_exact`` / ``max_ulp`` / ``max_abs`` ``None``: a cost-only row (no output)."""
        if bit_exact is not None and not 0.0 <= float(bit_exact) <= 1.0:
            raise ValueError(f"bit_exact: expected a fraction in [0, 1], got {bit_exact!r}")
        self.rows.append(
            {
                "kernel": str(kernel),
                "soc": str(soc),
                "case": str(case),
                "bit_exact": None if bit_exact is None else float(bit_exact),
                "max_ulp": None if max_ulp is None else int(max_ulp),
                "max_abs": None if max_abs is None else float(max_abs),
                "us": None if us is None else float(us),
                "extra": {str(k): v for k, v in (extra or {}).items()},
            }
        )

    # -------------------------------------------------------------- writing
    def _merged(self) -> list[dict]:
        sidecar = self.path.with_suffix(".json")
        if not sidecar.exists() and self.base is not None:
            sidecar = self.base.with_suffix(".json")
        old = []
        if sidecar.exists():
            try:
                old = json.loads(sidecar.read_text())["rows"]
            except (ValueError, KeyError):
                old = []
        fresh = {_row_key(r): r for r in self.rows}  # one row per key: the last one added
        keep = [r for r in old if _row_key(r) not in fresh]
        rows = keep + list(fresh.values())
        order = {"910b": 0, "950": 1}
        return sorted(
            rows, key=lambda r: (r["kernel"], order.get(r["soc"], 9), r["soc"], r["case"])
        )

    @staticmethod
    def _fmt_exact(v) -> str:
        if v is None:
            return "—"
        return f"{v:.6f}".rstrip("0").rstrip(".") if v < 1 else "1"

    @staticmethod
    def _fmt(v) -> str:
        if v is None:
            return "—"
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            if v == 0:
                return "0"
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
        return str(v).replace("|", "\\|")

    def write(self) -> Path | None:
        if not self.rows:
            return None
        rows = self._merged()
        extras = [k for k in BOUND_COLUMNS if any(k in r["extra"] for r in rows)]
        for r in rows:
            for k in r["extra"]:
                if k not in extras:
                    extras.append(k)
        head = [
            "kernel",
            "SoC",
            "case",
            "bit-exact fraction",
            "max ULP",
            "max abs error",
            "cost-model µs",
            *extras,
        ]
        lines = [
            "# Cost-model table (generated)",
            "",
            "Generated by `nox -s sim` (tests/device, fixture `sim_report`, written to",
            "`build/perf/` and copied here by the session); do not edit by hand.",
            "Output of PyPTO 0.2.0's host interpreter vs `tilesim.reference`; cost-model µs =",
            "simulated AICore end-to-end time (cycles / 1800) of PyPTO's cost model, approximate.",
            "See [../device.md](../device.md) for what each kernel promises. `max ULP` is in the",
            "output dtype; `n/a` where it is not meaningful (FP32 outputs judged by",
            "`err / max|golden|` instead) or where a position is NaN.",
            "`floor µs` = the same session's floor kernel (tests/probes/floor.py): the model's",
            "cost of streaming the bytes the op must move (the `bytes` of its contract's `cost`)",
            "in the largest tiles over every vector core, one task per core;",
            "`kernel / floor` = cost-model µs / floor µs. The model caps no bandwidth, so",
            "above a few MB the floor falls below the HBM bound.",
            "`probe µs` = the same session's matmul-only probe of the kernel (its C1/C2 matmuls",
            "on the same tiles, nothing else); `kernel / probe` = cost-model µs / probe µs, how",
            "close the kernel is to what the model charges for its matmuls alone.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join("---" for _ in head) + "|",
        ]
        for r in rows:
            cells = [
                r["kernel"],
                r["soc"],
                r["case"],
                self._fmt_exact(r["bit_exact"]),
                "—" if r["max_ulp"] is None else str(r["max_ulp"]) if r["max_ulp"] >= 0 else "n/a",
                self._fmt(r["max_abs"]),
                self._fmt(r["us"]),
                *(self._fmt(r["extra"].get(k)) for k in extras),
            ]
            lines.append("| " + " | ".join(self._fmt(c) if c is None else c for c in cells) + " |")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.path.with_suffix(".json").write_text(
            json.dumps({"rows": rows}, indent=1, sort_keys=True, default=str) + "\n"
        )
        return self.path

    # ---------------------------------------------------------- pytest-xdist workers
    def write_part(self, parts: Path, worker: str) -> Path | None:
        """A worker's rows as ``parts/<worker>.json`` (the controller merges the parts once,
        :func:`merge_parts`); nothing when no row was added."""
        if not self.rows:
            return None
        parts.mkdir(parents=True, exist_ok=True)
        part = parts / f"{worker}.json"
        part.write_text(json.dumps({"rows": self.rows}, sort_keys=True, default=str) + "\n")
        return part


def _row_key(r: dict) -> tuple:
    return (r.get("kernel"), r.get("soc"), r.get("case"))


def parts_dir(report: Path) -> Path:
    """Where the workers of one run leave their rows: ``build/perf/cost_model.parts/``."""
    return Path(report).with_suffix(".parts")


def merge_parts(report: SimReport, parts: Path) -> Path | None:
    """Write ``report``'s table from the rows of every worker part in ``parts`` (plus the
    earlier rows, as :meth:`SimReport.write` keeps them), then remove the parts. A
    (kernel, SoC, case) key that two workers both report is a test bug (the same row produced
    twice in one run): ``ValueError`` naming it."""
    seen: dict[tuple, str] = {}
    files = sorted(parts.glob("*.json")) if parts.is_dir() else []
    for part in files:
        for row in json.loads(part.read_text())["rows"]:
            key = _row_key(row)
            if key in seen and seen[key] != part.stem:
                raise ValueError(
                    f"cost-model row {key}: reported by workers {seen[key]} and {part.stem}"
                )
            seen[key] = part.stem
            report.rows.append(row)
    out = report.write()
    shutil.rmtree(parts, ignore_errors=True)
    return out


SimReport.parts_dir = staticmethod(parts_dir)
SimReport.merge_parts = staticmethod(merge_parts)


def _report_path() -> Path:
    return Path(os.environ.get("TILESIM_PERF_REPORT") or REPORT_MD)


def _worker(config) -> str | None:
    """The pytest-xdist worker id of this process (``None``: the controller or a plain run)."""
    winput = getattr(config, "workerinput", None)
    return None if winput is None else str(winput["workerid"])


def _distributed(config) -> bool:
    """This run has pytest-xdist workers (``-n N`` with ``N >= 1``)."""
    return bool(getattr(config.option, "numprocesses", None)) and config.pluginmanager.hasplugin(
        "dsession"
    )


def pytest_configure(config):
    if _worker(config) is None and _distributed(config):  # a part left by an aborted run
        shutil.rmtree(parts_dir(_report_path()), ignore_errors=True)


def pytest_sessionfinish(session):
    config = session.config
    if _worker(config) is None and _distributed(config):
        merge_parts(SimReport(_report_path()), parts_dir(_report_path()))


@pytest.fixture(scope="session")
def sim_report(request):
    """Session-wide :class:`SimReport`. A plain run writes the table when the session ends;
    under pytest-xdist each worker leaves its rows as a part and the controller merges them
    (:func:`merge_parts`), so no row is lost or written twice."""
    rep = SimReport(_report_path())
    yield rep
    worker = _worker(request.config)
    if worker is None:
        rep.write()
    else:
        rep.write_part(parts_dir(_report_path()), worker)
