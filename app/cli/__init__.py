"""The ``tilesim`` command line: named cases, golden files, comparisons and tile traces.

Sub-modules, one job each:

* :mod:`~tilesim.cli.commands` — the sub-commands, one module each: :mod:`~tilesim.cli.cases`,
  :mod:`~tilesim.cli.golden`, :mod:`~tilesim.cli.compare`, :mod:`~tilesim.cli.trace`,
  :mod:`~tilesim.cli.demo`.
* :mod:`~tilesim.cli.registry` — the named cases (the families' ``CASE_INFO`` tables).
* :mod:`~tilesim.cli.runner` — build a case's inputs with its family's builder and run the
  reference op (optionally with its trace hook); :mod:`~tilesim.cli.progress` — progress on
  stderr while it runs.
* :mod:`~tilesim.cli.replay` — a golden from the user's own captured inputs.
* golden files: :mod:`~tilesim.cli.tensorio` — tensors in ``.npz`` / ``.npy`` / raw
  little-endian ``.bin`` / ``.pt`` files, written and read; :mod:`~tilesim.cli.dtypes` — the
  element types a file may hold (bfloat16 and float8 as raw bits); :mod:`~tilesim.cli.manifest`
  — ``manifest.json``, read back checked; :mod:`~tilesim.cli.golden_dir` — a golden directory
  written all or nothing; :mod:`~tilesim.cli.loading` — a manifest entry's or a command-line
  spec's tensor read back (``.npy``, ``.npz[:key]``, ``.bin``, ``.pt[:key]``, a directory).
* :mod:`~tilesim.cli.dumps` — device dumps (CANN's npy naming, multi-output files) matched to
  a golden's outputs.
* :mod:`~tilesim.cli.tolerances` — the one tolerance resolver (a golden's stated tolerance
  with the ``--atol/--rtol/--ratio`` overrides).
* :mod:`~tilesim.cli.verdicts` — the judge on files: a golden's and a dump's outputs and the
  golden's call handed to :mod:`tilesim.reference.judging.plans` (the stage ops to
  :mod:`tilesim.reference.judging.stages`); :mod:`~tilesim.cli.distribution` — the error
  distribution a report adds; :mod:`~tilesim.cli.reports` prints the verdicts.
* :mod:`~tilesim.cli.outputs` — all-or-nothing output files (``--force``, no partial files).
* :mod:`~tilesim.cli.plot` — the tile-schedule and error pictures (matplotlib, Agg), read
  from the trace-record schema of :mod:`tilesim.shared.trace`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class CliError(Exception):
    """A user-facing error: printed as ``tilesim CMD: error: <message>``, exit code 2."""

    exit_code = 2


@contextmanager
def optional_dependency(purpose: str, *, extra: str = "cli") -> Iterator[None]:
    """Around the plain, function-local import of an optional dependency (so ``tilesim
    --help`` never imports it): its ``ImportError`` becomes a one-line :class:`CliError`
    naming the install (``pip install 'tilesim[cli]'`` for matplotlib/tqdm, ``[torch]`` for
    torch)::

        with optional_dependency(f"reading {path.name}", extra="torch"):
            import torch
    """
    try:
        yield
    except ImportError as e:
        missing = (e.name or str(e)).split(".")[0]
        raise CliError(
            f"{purpose} needs {missing}, which is not installed: pip install 'tilesim[{extra}]'"
        ) from None


__all__ = ["CliError", "optional_dependency"]
