"""The sub-commands of ``tilesim``, one module each: ``cases`` (:mod:`tilesim.cli.cases`),
``golden`` (:mod:`tilesim.cli.golden`), ``compare`` (:mod:`tilesim.cli.compare`), ``trace``
(:mod:`tilesim.cli.trace`) and ``demo`` (:mod:`tilesim.cli.demo`); ``tilesim.__main__`` parses
the arguments and calls them.

Exit codes: 0 success / comparison passed, 1 comparison failed, 2 usage or input error
(unknown case, unwritable directory, bad or mismatched file, existing output without
``--force``, a missing optional dependency).
"""

from __future__ import annotations

from tilesim.cli.cases import cmd_cases
from tilesim.cli.compare import cmd_compare
from tilesim.cli.demo import cmd_demo
from tilesim.cli.golden import cmd_golden
from tilesim.cli.trace import cmd_trace

__all__ = ["cmd_cases", "cmd_compare", "cmd_demo", "cmd_golden", "cmd_trace"]
