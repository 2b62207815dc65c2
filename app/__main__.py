"""``python -m tilesim`` / the ``tilesim`` console script.

Commands (see ``docs/cli.md``): ``cases``, ``golden``, ``compare``, ``trace``, ``demo``. The
work is done in :mod:`tilesim.cli`; this module only parses arguments and maps errors to exit
codes (0 ok / pass, 1 compare failed, 2 usage or input error).
"""

from __future__ import annotations

import argparse
import os
import sys

import tilesim
from tilesim.shared.registry.case_schema import CASE_FAMILIES

#: sub-command -> (its line in ``tilesim --help``, the description of ``tilesim CMD --help``)
_COMMAND_TEXT = {
    "cases": (
        "list the named cases (op, size, tolerances, SoC marks, the seeds' status)",
        "List the named cases: the seeds' test matrices and tilesim's own (the CASE_INFO "
        "table of each family's tilesim.reference.cases.<family> module).",
    ),
    "golden": (
        "build a case's inputs (or read captured ones), run the reference, write the golden",
        "Write DIR/CASE/{manifest.json, inputs + golden} for a named case, or "
        "DIR/NAME/{manifest.json, golden} for captured inputs (--inputs FILE --op OP "
        "[--params JSON] [--like CASE]: replay a failing device case; --inputs GOLDEN_DIR "
        "alone reproduces that golden).",
    ),
    "compare": (
        "judge ACTUAL against GOLDEN with the case's rule (exit 0 pass / 1 fail)",
        "Files: .npy, .npz[:KEY], .pt (a torch tensor or a dict of them), .bin (shape/dtype "
        "from a manifest), manifest.json "
        "or a golden directory. Tolerances default to the golden manifest's.",
    ),
    "trace": (
        "run a case with the trace hook and draw its tile schedule (PNG)",
        "Run a named case, or the call a golden directory records, with the trace hook; "
        "draw which tiles ran (one swim lane per trace-record lane, bars over each "
        "record's key_range), per-tile softmax max/sum where the records carry them; with "
        "--actual also an error heat map.",
    ),
}


def _command(sub, name: str, func) -> argparse.ArgumentParser:
    """One sub-command's parser, with its texts from :data:`_COMMAND_TEXT`, running ``func``."""
    summary, description = _COMMAND_TEXT[name]
    p = sub.add_parser(name, help=summary, description=description)
    p.set_defaults(func=func)
    return p


def _add_parsers(sub) -> None:
    from tilesim.cli import commands as c

    for add in (_add_cases, _add_golden, _add_compare, _add_trace):
        add(sub, c)
    p = sub.add_parser("demo", help="a small golden round trip of the DeepSeek FP8 cache layout")
    p.add_argument("--rows", type=_rows, default=256, help="latent rows, 1..65536")
    p.add_argument("--seed", type=_seed, default=0)
    p.set_defaults(func=c.cmd_demo)


def _add_cases(sub, c) -> None:
    p = _command(sub, "cases", c.cmd_cases)
    p.add_argument(
        "family_arg",
        metavar="FAMILY",
        nargs="?",
        help="the same as --family FAMILY (`tilesim cases dsa_attention_step`)",
    )
    p.add_argument(
        "--family",
        help=f"a family: {', '.join(CASE_FAMILIES)} (or a kind: indexer, decode, "
        "main_branch, decode_step)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="builder, rule and notes per case")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_golden(sub, c) -> None:
    p = _command(sub, "golden", c.cmd_golden)
    p.add_argument("case", metavar="CASE", nargs="?", help="a named case (`tilesim cases`)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="parent directory")
    r = p.add_argument_group("replay captured inputs (instead of CASE)")
    r.add_argument(
        "--inputs",
        metavar="FILE",
        help=".npz, a directory of .npy, a manifest (or its directory) of .bin files, or .pt",
    )
    r.add_argument(
        "--op",
        help="the reference op to run (e.g. msa_indexer; default: the op of an --inputs "
        "golden directory)",
    )
    r.add_argument("--params", metavar="JSON", help="the op's other arguments: JSON text or file")
    r.add_argument(
        "--like",
        metavar="CASE",
        help="take this named case's tolerance, and its parameters where --params does not "
        "name them",
    )
    r.add_argument("--name", help="output sub-directory (default: the inputs' file name)")
    p.add_argument(
        "--format",
        choices=("npz", "bin"),
        default="npz",
        help="npz (default) or raw little-endian .bin files, one per tensor",
    )
    p.add_argument("--seed", type=_seed, help="override the case's seed (an integer >= 0)")
    p.add_argument("--force", action="store_true", help="overwrite an existing golden")
    _progress_flags(p)


def _add_compare(sub, c) -> None:
    p = _command(sub, "compare", c.cmd_compare)
    p.add_argument("actual", metavar="ACTUAL")
    p.add_argument("golden", metavar="GOLDEN")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: the manifest's)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: the manifest's)")
    p.add_argument("--ratio", type=float, help="allowed fraction of failing elements")
    p.add_argument(
        "--arithmetic",
        choices=("float64", "native"),
        default="float64",
        help="evaluate the rule exactly (default) or in the tensors' dtype like torch",
    )
    p.add_argument(
        "--rule",
        choices=("default", "seeds"),
        default="default",
        help="default: the seeds' element rule and the golden-aware checks (cosine, relative "
        "L2 per tensor and per row); seeds: the seeds' rule alone (pypto-gym's verdict)",
    )
    p.add_argument(
        "--actual-dtype",
        help="reinterpret ACTUAL's bytes as this dtype (e.g. bfloat16), or per output: "
        "NAME=DTYPE[,NAME=DTYPE]",
    )
    p.add_argument("--golden-dtype", help="reinterpret GOLDEN's bytes as this dtype")
    p.add_argument(
        "--manifest",
        metavar="MANIFEST[:NAME]",
        help="a bare GOLDEN file is output NAME of this golden (manifest.json or its "
        "directory): judged as that op's output, with its tolerance and calibrated bound",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--allow-dtype-mismatch",
        action="store_true",
        help="compare values even when the dtypes differ",
    )
    p.add_argument(
        "--png",
        metavar="FILE",
        help="write a ULP histogram and an error heat map (ids: selected / missing / extra "
        "ids per row)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing PNG")


def _add_trace(sub, c) -> None:
    p = _command(sub, "trace", c.cmd_trace)
    p.add_argument(
        "case",
        metavar="CASE|DIR",
        help="a named case, or a golden directory written by `tilesim golden` (a replayed one too)",
    )
    p.add_argument(
        "--png", metavar="FILE", help="draw the schedule (needs matplotlib; else a text report)"
    )
    p.add_argument("--actual", metavar="FILE", help="device output to map against the golden")
    p.add_argument(
        "--actual-dtype",
        help="reinterpret ACTUAL's bytes as this dtype, or per output: NAME=DTYPE[,NAME=DTYPE]",
    )
    p.add_argument("--seed", type=_seed, help="override the case's seed (an integer >= 0)")
    p.add_argument("--records", metavar="FILE", help="also write the trace records as JSON lines")
    p.add_argument("--force", action="store_true", help="overwrite an existing PNG / records")
    _progress_flags(p)


def _seed(text: str) -> int:
    # ASCII digits only: int() would also take "1_000", " 7" and non-ASCII digits
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in 0..2**63-1, got {text!r}")
    return int(text)


def _rows(text: str) -> int:
    v = int(text) if text.isascii() and text.isdigit() and len(text) < 8 else 0
    if not 1 <= v <= 65536:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..65536, got {text!r}")
    return v


def _progress_flags(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="progress bar even when stderr is not a terminal",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tilesim`` / ``python -m tilesim``; returns the exit code."""
    from tilesim.cli import CliError

    parser = argparse.ArgumentParser(
        prog="tilesim",
        description="Named cases, golden files, comparisons and tile traces of tilesim's "
        "NumPy references (MiniMax MoE/MSA, DeepSeek-V3.2 sparse MLA and lightning indexer).",
    )
    parser.add_argument("--version", action="version", version=f"tilesim {tilesim.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_parsers(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"tilesim {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # e.g. `tilesim cases | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("tilesim: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"tilesim {args.command}: error: not enough memory", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. a full disk while writing
        print(f"tilesim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: still one line and exit 2, never 1 (= "compare failed")
        if os.environ.get("TILESIM_DEBUG"):
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        print(
            f"tilesim {args.command}: internal error: {type(e).__name__}: {msg} "
            "(please report it; TILESIM_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
