"""The ``tilesim`` command line: named cases, golden files, comparisons and tile traces.

Sub-modules, one job each:

* :mod:`~tilesim.cli.registry` — the named cases (the families' ``CASE_INFO`` tables).
* :mod:`~tilesim.cli.runner` — build a case's inputs with its family's builder and run the
  reference op (optionally with its trace hook).
* :mod:`~tilesim.cli.tensorio` — golden files: ``.npz`` / raw little-endian ``.bin`` +
  ``manifest.json``, and reading any of ``.npy``, ``.npz[:key]``, ``.bin`` back.
* :mod:`~tilesim.cli.commands` — the sub-commands ``cases``, ``golden``, ``compare``,
  ``trace``.
* :mod:`~tilesim.cli.plot` — the tile-schedule and error-map pictures (matplotlib, Agg),
  read from the trace-record schema of :mod:`tilesim.shared.trace`.
"""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed as ``tilesim: error: <message>``, exit code 2."""

    exit_code = 2


__all__ = ["CliError"]
