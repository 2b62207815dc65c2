"""Fixtures of the CLI tests: run ``tilesim`` in-process or as a subprocess, read PNG headers."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tilesim.__main__ import main


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``tilesim ARGV`` in-process; returns (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_subprocess(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m tilesim ARGV`` in a fresh interpreter (no TTY: no progress bar)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run(
        [sys.executable, "-m", "tilesim", *map(str, argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk; asserts the PNG signature."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND", "PNG not terminated by IEND"
    return w, h


class _Cli:
    def __init__(self, capsys) -> None:
        self.capsys = capsys

    def __call__(self, *argv) -> tuple[int, str, str]:
        return run(list(argv), self.capsys)

    sub = staticmethod(run_subprocess)
    png_size = staticmethod(png_size)


@pytest.fixture
def cli(capsys) -> _Cli:
    """``cli("golden", ...)`` -> (exit code, stdout, stderr); ``cli.sub``, ``cli.png_size``."""
    return _Cli(capsys)
