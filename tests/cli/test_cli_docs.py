"""docs/cli.md shows what the command line prints: its ``tilesim cases`` listing is the
listing of the installed registry, and the families it names are the registry's."""

from __future__ import annotations

import re
from pathlib import Path

from tilesim.shared.registry.case_schema import CASE_FAMILIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _console_block(after: str) -> list[str]:
    """The lines a console block of docs/cli.md prints after the command line ``after``."""
    lines = DOC.read_text().splitlines()
    start = lines.index(f"$ {after}") + 1
    end = next(j for j in range(start, len(lines)) if lines[j].startswith(("$ ", "```")))
    return lines[start:end]


def test_the_cases_listing_is_the_registrys(cli):
    code, out, err = cli("cases")
    assert code == 0, err
    assert _console_block("tilesim cases") == out.rstrip("\n").splitlines()


def test_the_cases_command_names_every_family():
    row = next(ln for ln in DOC.read_text().splitlines() if ln.startswith("| `tilesim cases"))
    named = re.findall(r"`(\w+)`", row.split("a family", 1)[1].split("or a kind")[0])
    assert tuple(named) == CASE_FAMILIES


def test_the_compare_synopsis_names_every_option(capsys):
    """Every option `tilesim compare --help` lists (``--golden-dtype``, ``--manifest``, ...)
    is in the command table's synopsis of docs/cli.md."""
    import pytest
    from tilesim.__main__ import main

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    options = set(re.findall(r"(--[a-z][a-z-]+)", capsys.readouterr().out)) - {"--help"}
    row = next(ln for ln in DOC.read_text().splitlines() if ln.startswith("| `tilesim compare"))
    synopsis = re.split(r"(?<!\\)\|", row)[1]  # the first cell (`\|` stays inside it)
    assert {"--golden-dtype", "--manifest", "--png"} <= options
    assert sorted(o for o in options if o not in synopsis) == []
