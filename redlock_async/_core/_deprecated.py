"""Old spellings kept for one release: each use warns with what to write instead."""

from __future__ import annotations

import warnings

REMOVED_IN = "0.3.0"
"""The release that drops the spellings deprecated in 0.2.0."""


def renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that *old* is spelled *new* now (a ``DeprecationWarning`` pointing at the caller's line)."""
    warnings.warn(
        f"{old} is deprecated and will be removed in redlock_async {REMOVED_IN}: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def keyword_timeout(where: str, positional: tuple[float | None, ...], timeout: float | None) -> float | None:
    """The *timeout* of ``where(timeout=)``, taking a positional one for this release with a warning."""
    if not positional:
        return timeout
    if len(positional) > 1 or timeout is not None:
        raise TypeError(f"{where}() takes one argument, timeout=, by keyword: write {where}(timeout=seconds)")
    renamed(f"{where}(seconds) with the timeout positional", f"{where}(timeout=seconds)", stacklevel=4)
    return positional[0]  # checked as any timeout= is
