"""All-or-nothing output files: every target is checked before anything is written.

A command first declares every file it will write (:meth:`Outputs.add`); :meth:`Outputs.check`
refuses an existing target without ``--force`` (and a target that is a directory or whose
directory cannot be written). Each file is then written to a hidden temporary name in its own
directory (:meth:`Outputs.temp`) and all of them are renamed onto their targets at the end
(:meth:`Outputs.commit`, ``os.replace``: atomic per file on POSIX). When anything fails before
the commit, :meth:`Outputs.abort` removes the temporaries and any directory this command
created, so a failed command leaves no partial output behind. Use it as a context manager::

    with Outputs(force=args.force) as out:
        out.add(png); out.add(records)
        out.check()
        ... write out.temp(png), out.temp(records) ...
    # leaving the block without an exception commits; an exception aborts
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tilesim.cli import CliError


class Outputs:
    """The files one command writes (see the module docstring)."""

    def __init__(self, *, force: bool) -> None:
        self.force = force
        self.targets: list[Path] = []
        self.temps: dict[Path, Path] = {}
        self.created_dirs: list[Path] = []
        self.committed = False

    def add(self, path: Path | str, *, what: str = "") -> Path:
        """Declare a target file (returns it as a Path)."""
        p = Path(path)
        if p in self.targets:
            raise CliError(f"{str(p)!r} is named twice among the output files")
        self.targets.append(p)
        return p

    def existing(self) -> list[Path]:
        return [p for p in self.targets if p.exists() or p.is_symlink()]

    def check(self) -> None:
        """Refuse existing targets (without ``force``), directories and unwritable places."""
        for p in self.targets:
            if p.is_dir():
                raise CliError(f"output {str(p)!r} is a directory")
        there = self.existing()
        if there and not self.force:
            names = ", ".join(repr(str(p)) for p in there[:4])
            more = f" and {len(there) - 4} more" if len(there) > 4 else ""
            verb = "exists" if len(there) == 1 else "exist"
            raise CliError(f"{names}{more} already {verb}; pass --force to overwrite")
        for parent in dict.fromkeys(p.parent for p in self.targets):
            if parent.exists() and not parent.is_dir():
                raise CliError(f"{str(parent)!r} exists and is not a directory")
            if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
                raise CliError(f"directory {str(parent)!r} is not writable")

    def make_dir(self, path: Path) -> None:
        """Create ``path`` (and parents); remembered so that :meth:`abort` removes it."""
        missing = []
        p = Path(path)
        while not p.exists():
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CliError(f"cannot create output directory {str(path)!r}: {e.strerror}") from None
        self.created_dirs.extend(missing)  # deepest first

    def temp(self, target: Path) -> Path:
        """A fresh hidden file beside ``target`` to write instead of it (same suffix)."""
        target = Path(target)
        if target not in self.targets:
            raise RuntimeError(f"{target} was not declared with add()")
        if target in self.temps:
            return self.temps[target]
        if not target.parent.is_dir():
            self.make_dir(target.parent)
        try:
            fd, name = tempfile.mkstemp(
                dir=target.parent, prefix=f".{target.name}.", suffix=f".tmp{target.suffix}"
            )
        except OSError as e:
            raise CliError(f"cannot write in {str(target.parent)!r}: {e.strerror}") from None
        os.close(fd)
        self.temps[target] = Path(name)
        return Path(name)

    def commit(self) -> None:
        """Rename every temporary onto its target (targets never written are skipped), with
        the permissions a plain ``open()`` would give under the process umask (``mkstemp``
        makes its files private, ``0600``)."""
        mode = 0o666 & ~_umask()
        for target, tmp in self.temps.items():
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        self.committed = True

    def abort(self) -> None:
        """Remove the temporaries and the directories this command created (when empty)."""
        for tmp in self.temps.values():
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        for d in self.created_dirs:
            try:
                d.rmdir()
            except OSError:
                break

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.commit()
            except OSError as e:
                self.abort()
                raise CliError(f"cannot write the output files: {e}") from None
        else:
            self.abort()


def _umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def size_text(n: int) -> str:
    """A file size in words: ``"512 B"``, ``"4.6 KiB"``, ``"82.2 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def check_png_path(png: Path) -> None:
    """A ``--png`` target: a name ending in ``.png`` in an existing directory."""
    if png.suffix.lower() != ".png":
        raise CliError(f"--png {str(png)!r}: expected a file name ending in .png")
    check_file_dir(png, "--png")


def check_file_dir(path: Path, option: str) -> None:
    """The directory of a one-file output option (``--png``, ``--records``) must exist: only
    a golden's ``-o DIR`` is created when missing."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"directory {str(parent)!r} of {option} does not exist")
