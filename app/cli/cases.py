"""``tilesim cases``: the named cases as a table, with ``-v`` their builder, rule and notes,
with ``--json`` as one JSON list."""

from __future__ import annotations

import argparse
import json

from tilesim.cli import CliError
from tilesim.cli.registry import list_cases, soc_text, tolerance_rule, tolerance_text
from tilesim.cli.runner import jsonable

#: the table's columns
HEAD = ("CASE", "FAMILY", "OP", "SIZE", "ATOL/RTOL/RATIO", "SOC", "SEEDS' STATUS")


def cmd_cases(args: argparse.Namespace) -> int:
    infos = list_cases(family_of(args))
    if args.json:
        print(json.dumps([case_json(i) for i in infos], indent=1))
        return 0
    rows = [
        (
            i.name,
            i.family + (f"/{i.kind}" if i.kind else ""),
            i.op,
            i.size,
            tolerance_text(i.tolerance),
            soc_text(i),
            i.status,
        )
        for i in infos
    ]
    widths = [max(len(r[k]) for r in [HEAD, *rows]) for k in range(len(HEAD))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*HEAD).rstrip())
    for r in rows:
        print(line.format(*r).rstrip())
    if not args.verbose:
        print(f"\n{len(rows)} cases; `tilesim cases -v` shows the builder, rule and notes.")
        return 0
    for i in infos:
        print(f"\n{i.name}  ({i.model}, {i.op}, seed {i.seed}, size {i.size})")
        print(f"  {i.summary}")
        params = f" {json.dumps(jsonable(i.builder_params))}" if i.builder_params else ""
        print(f"  builder: {i.builder}{params}")
        print(f"  tolerance: {tolerance_rule(i.tolerance)}")
        for k, v in i.notes.items():
            print(f"  {k.removesuffix('_note')}: {v}")
    return 0


def family_of(args: argparse.Namespace) -> str | None:
    """The family asked for: ``tilesim cases FAMILY`` or ``--family FAMILY`` (one, or both
    the same)."""
    pos, flag = getattr(args, "family_arg", None), getattr(args, "family", None)
    if pos is not None and flag is not None and pos != flag:
        raise CliError(f"two families given: {pos!r} and --family {flag!r}; give one")
    return flag if flag is not None else pos


def case_json(i) -> dict:
    """One case of ``tilesim cases --json``."""
    return {
        "name": i.name,
        "family": i.family,
        "kind": i.kind,
        "model": i.model,
        "op": i.op,
        "seed": i.seed,
        "size": i.size,
        "builder": i.builder,
        "builder_params": jsonable(i.builder_params),
        "tolerance": i.tolerance,
        "soc": [s.upper() for s in i.soc],
        "status": i.status,
        "summary": i.summary,
        "notes": i.notes,
    }
