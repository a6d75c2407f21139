"""The per-lock options, declared once: every maker of the async ``Redlock`` and of the blocking
``redlock_async.sync.Redlock`` (``lock``, ``lock_many``, ``semaphore``, ``rw_lock``, ``election``)
takes them as ``**options: Unpack[...]``, so users' type checkers see each keyword (PEP 692), and
:func:`check_options` refuses any other at run time with the list of those it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict


class LeaseOptions(TypedDict, total=False):
    """What every lease takes; a keyword left out, or None, is the Redlock's setting (``owner``: the
    default label)."""

    ttl: float | None
    acquire_timeout: float | None
    auto_extend: bool | None
    max_hold: float | None
    max_extensions: int | None
    owner: str | None


class LockOptions(LeaseOptions, total=False):
    """A lock's, a ``lock_many``'s and a read/write lock's: a lease's and ``fencing`` (a semaphore is
    never fenced)."""

    fencing: bool | None


class ElectionOptions(TypedDict, total=False):
    """A candidate's: its label, and its lease's ttl and longest term."""

    owner: str | None
    ttl: float | None
    max_hold: float | None


def check_options(maker: str, options: Mapping[str, object], declared: type[Mapping[str, object]]) -> None:
    """Raise TypeError for a keyword *maker* does not take, saying which it takes."""
    allowed: frozenset[str] = getattr(declared, "__optional_keys__", frozenset())
    for key in options:
        if key not in allowed:
            raise TypeError(
                f"{maker}() got an unexpected keyword argument {key!r} (it takes: {', '.join(sorted(allowed))})"
            )


def overrides(options: Mapping[str, object]) -> dict[str, object]:
    """The settings among *options* that were given (None: the Redlock's); the owner label is no setting."""
    return {key: value for key, value in options.items() if value is not None and key != "owner"}
