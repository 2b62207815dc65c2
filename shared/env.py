"""Environment variables read as settings: one parsing policy for every ``TILESIM_*``,
``PYPTO_*`` and ``MSA_*`` knob.

Policy (``docs/index.md``, "Argument checks"):

* ``env`` arguments are a mapping of ``str`` to ``str`` or ``None`` (``os.environ``,
  :func:`env_mapping`); a value that is not a ``str`` is a ``TypeError`` naming the variable.
* Surrounding ASCII blanks are ignored and an all-blank value means "unset"
  (:func:`env_text`): the default applies.
* **Integers** (:func:`env_int`, :func:`parse_int_text`) are ASCII digits only -- no sign,
  underscore, ``0x`` prefix, fraction, non-ASCII digit or inner blank -- in ``[lo, 2**31 - 1]``
  (checked on the Python int) and, where asked, a multiple of a tile size.
* **Floats** (:func:`env_float`) are ASCII decimal literals (no ``nan``/``inf``/underscore)
  that stay finite; positive and representable in FP32 unless told otherwise.
* **Choices** (:func:`env_choice`) are ASCII, case-insensitive.

Every message names the variable, the expected value and the actual one:
``"<VAR>: expected <what>, got <actual>"``. The argument checks of the ops themselves are
:mod:`tilesim.shared.validate`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping

from tilesim.shared.validate import INT32_MAX, fp32_holds

_ASCII_BLANKS = " \t\r\n"
_ASCII_UINT = re.compile(r"[0-9]+\Z")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def env_mapping(env) -> Mapping:
    """``os.environ`` for ``None``, else ``env`` itself once it is checked to be a mapping."""
    if env is None:
        return os.environ
    if not isinstance(env, Mapping):
        raise TypeError(f"env: expected a mapping of str to str, or None, got {type(env).__name__}")
    return env


def env_text(env: Mapping, var: str) -> str | None:
    """The value of ``var`` in ``env`` without surrounding ASCII blanks; ``None`` when unset or
    all blank. ``TypeError`` naming ``var`` when the value is not a ``str``."""
    raw = env.get(var)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise TypeError(f"{var}: expected a str, got {type(raw).__name__} {raw!r}")
    return raw.strip(_ASCII_BLANKS) or None


def parse_int_text(
    raw: str, name: str, *, lo: int = 1, hi: int = INT32_MAX, multiple_of: int = 1
) -> int:
    """An integer written in ASCII digits (surrounding ASCII blanks ignored) in ``[lo, hi]`` and
    a multiple of ``multiple_of``. Signs, underscores, non-ASCII digits, inner blanks, ``0x``
    prefixes and fractions are refused; the range is checked on the Python int."""
    s = raw.strip(_ASCII_BLANKS) if isinstance(raw, str) else None
    what = "a positive integer" if lo == 1 else f"an integer >= {lo}"
    if s is None or not _ASCII_UINT.match(s):
        raise ValueError(f"{name}: expected {what} (ASCII digits), got {raw!r}")
    v = int(s, 10)
    if v < lo or v > hi:
        raise ValueError(f"{name}: expected {what} <= {hi}, got {raw!r}")
    if v % multiple_of:
        raise ValueError(f"{name}: expected a positive multiple of {multiple_of}, got {v}")
    return v


def env_int(env: Mapping, var: str, default: int, *, lo: int = 1, multiple_of: int = 1) -> int:
    """``var`` of ``env`` read by :func:`parse_int_text`; ``default`` when unset or blank."""
    raw = env_text(env, var)
    return default if raw is None else parse_int_text(raw, var, lo=lo, multiple_of=multiple_of)


def env_float(
    env: Mapping, var: str, default: float, *, positive: bool = True, fp32: bool = True
) -> float:
    """``var`` of ``env`` as a finite decimal literal in ASCII (``fp32``: finite and non-zero in
    FP32 as well); ``default`` when unset or blank."""
    raw = env_text(env, var)
    if raw is None:
        return default
    kind = "a finite positive number" if positive else "a finite number"
    if not _ASCII_FLOAT.match(raw):
        raise ValueError(f"{var}: expected {kind} (ASCII decimal), got {raw!r}")
    v = float(raw)
    if not math.isfinite(v) or (positive and not v > 0) or (fp32 and not fp32_holds(v)):
        fp = " FP32 can hold" if fp32 else ""
        raise ValueError(f"{var}: expected {kind}{fp}, got {raw!r}")
    return v


def env_choice(env: Mapping, var: str, default: str, choices: Iterable[str]) -> str:
    """``var`` of ``env`` (ASCII, case-insensitive) as one of ``choices``; ``default`` when
    unset or blank."""
    choices = tuple(choices)
    raw = env_text(env, var)
    if raw is None:
        return default
    key = raw.lower() if raw.isascii() else raw
    if key not in choices:
        raise ValueError(f"{var}: expected one of {choices}, got {env.get(var)!r}")
    return key


__all__ = [
    "env_choice",
    "env_float",
    "env_int",
    "env_mapping",
    "env_text",
    "parse_int_text",
]
