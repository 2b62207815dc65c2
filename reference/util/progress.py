"""The goldens' and case builders' optional progress bar (``progress=`` of the long-running
DeepSeek goldens and cache builders): one tqdm bar, or none.

``progress``: ``True`` shows the bar at once, ``None`` after :data:`PROGRESS_DELAY_S` seconds
(a call that ends sooner shows nothing), ``False`` never. tqdm is optional: without it there is
no bar and nothing else changes.
"""

from __future__ import annotations

#: show a progress bar (``progress=None``) once a call has run this many seconds
PROGRESS_DELAY_S = 3.0


def progress_bar(total: int, progress, desc: str, unit: str = "token"):
    """A tqdm bar of ``total`` ``unit`` named ``desc`` (module docstring), or ``None`` when
    ``progress`` is False, ``total`` is 0 or tqdm is missing."""
    if progress is False or total == 0:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional
        return None
    delay = 0.0 if progress else PROGRESS_DELAY_S
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)


__all__ = ["PROGRESS_DELAY_S", "progress_bar"]
