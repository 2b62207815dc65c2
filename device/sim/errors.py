"""The one error the CPU simulator raises (:mod:`tilesim.device.sim`)."""

from __future__ import annotations


class SimError(RuntimeError):
    """A kernel failed to compile/interpret on CPU, or a child process of :func:`isolated` failed
    (message = exception type, text and the child's traceback)."""
