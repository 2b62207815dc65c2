"""Progress on stderr while a case is built and its reference runs: stage messages and a tqdm
tile counter, shown only when asked for (a terminal, or ``--progress``)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from tilesim.cli import CliError, optional_dependency
from tilesim.cli.runner import build_case, has_own_progress, run_reference


def want_progress(args: argparse.Namespace) -> bool:
    """``--progress`` / ``--no-progress`` when given, else: stderr is a terminal outside CI."""
    if getattr(args, "progress", None) is not None:
        if args.progress:
            with optional_dependency("--progress"):
                import tqdm  # noqa: F401 -- present, or the one-line error now
        return args.progress
    return stderr_is_tty() and not os.environ.get("CI")


def stderr_is_tty() -> bool:
    """Is stderr a terminal (``False`` when it is closed or replaced by an object without a
    file)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Stage messages on stderr and a tqdm tile counter, only when ``enabled``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None

    def stage(self, msg: str) -> None:
        if self.enabled:
            print(f"tilesim: {msg}", file=sys.stderr, flush=True)

    def tile_hook(self, desc: str):
        """A trace hook that advances a tile counter (``None`` when disabled or no tqdm)."""
        if not self.enabled:
            return None
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        self.bar = tqdm(desc=desc, unit="tile", file=sys.stderr, leave=False, mininterval=0.5)
        bar = self.bar

        def hook(_rec: dict) -> None:
            bar.update(1)

        return hook

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def build_and_run(info, seed, progress: Progress, trace=None):
    """``(BuiltCase, {name: golden}, run seconds)`` of a named case, with ``trace`` (and the
    progress counter) as the op's trace hook."""
    progress.stage(f"building inputs of {info.name}")
    try:
        built = build_case(info, seed, progress=progress.enabled)
    except (ValueError, TypeError) as e:  # e.g. a negative --seed
        raise CliError(f"case {info.name}: the builder rejected its arguments: {e}") from None
    progress.stage(f"running {built.op_name}")
    bar_hook = None if has_own_progress(built) else progress.tile_hook(built.op_name)
    if trace is not None and bar_hook is not None:

        def hook(rec):
            trace(rec)
            bar_hook(rec)

    else:
        hook = trace or bar_hook
    t0 = time.perf_counter()
    try:
        goldens = run_reference(built, trace=hook)
    finally:
        progress.close()
    return built, goldens, time.perf_counter() - t0
