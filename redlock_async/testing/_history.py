"""A record of critical sections, and a checker for the guarantees a lock (or a semaphore) gives.

Wrap each critical section in ``history.section(client, lock)``; afterwards
``history.check()`` raises ``AssertionError`` naming any two holders whose
sections overlapped in time, and any fencing token that went backwards. For a
semaphore, ``history.check(limit=3)`` raises when more than 3 acquisitions were
inside at once, and ``history.most_inside()`` says how many were at the
busiest moment. For a read/write lock, record readers with ``shared=True``:
readers may overlap each other, never a writer (nor a writer another writer),
and a reader's fencing token is the last writer's (never below it, always below
the next one's). Times come from ``time.monotonic()``, which is system-wide on
Linux, so sections recorded by several processes on one machine can be merged
and checked.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


class Holder(Protocol):
    """What a section needs of the holder: a Lock, a ``lock_many`` Lock or a Semaphore fits, or any
    object with these two attributes (e.g. an election's term as the fencing token)."""

    @property
    def token(self) -> str | None: ...

    @property
    def fencing_token(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Section:
    """One critical section: who held the lock, with which tokens, from when to when (monotonic seconds)."""

    client: str
    token: str
    fencing_token: int | None
    start: float
    end: float
    shared: bool = False
    """A reader's section (a read/write lock's ``read()``): it may overlap other shared sections."""


class History:
    """Critical sections recorded during a test, and their check."""

    def __init__(self) -> None:
        self.sections: list[Section] = []

    @contextlib.contextmanager
    def section(self, client: str, lock: Holder, *, shared: bool = False) -> Iterator[None]:
        """Record the block as a critical section of *client* holding *lock* (enter it once acquired).

        *lock* may be a Lock, a ``lock_many`` Lock or a Semaphore (its permit's token), or any
        :class:`Holder` (its ``token`` tells acquisitions apart; its ``fencing_token`` is checked).
        *shared*: a reader of a read/write lock (``rw.read()``), which may overlap other readers.
        """
        token, fencing_token = lock.token or "?", lock.fencing_token
        start = time.monotonic()
        try:
            yield
        finally:
            self.sections.append(Section(client, token, fencing_token, start, time.monotonic(), shared))

    def overlaps(self) -> list[tuple[Section, Section]]:
        """Pairs of sections of different acquisitions that were open at the same time (two shared
        sections excepted: readers)."""
        found: list[tuple[Section, Section]] = []
        latest: Section | None = None  # the section that ends last among those seen
        exclusive: Section | None = None  # the same among the sections not shared
        # At one start, an empty section (entered and left at one clock reading) first: it touches the
        # others that start then, as one that ends when another starts does.
        for section in sorted(self.sections, key=lambda s: (s.start, s.end)):
            # Any section open at this start: the latest-ending one is. A shared section clashes only
            # with an exclusive one open then: the latest-ending exclusive one is, if any is.
            other = exclusive if section.shared else latest
            if other is not None and section.start < other.end and section.token != other.token:
                found.append((other, section))
            if latest is None or section.end > latest.end:
                latest = section
            if not section.shared and (exclusive is None or section.end > exclusive.end):
                exclusive = section
        return found

    def fencing_regressions(self) -> list[tuple[Section, Section]]:
        """Consecutive sections (in time) whose fencing token did not grow (a shared section's may
        equal the one before: readers see the last writer's token)."""
        fenced = sorted((s for s in self.sections if s.fencing_token is not None), key=lambda s: s.start)
        return [
            (before, after)
            for before, after in itertools.pairwise(fenced)
            if after.fencing_token is not None
            and before.fencing_token is not None
            and (
                after.fencing_token < before.fencing_token
                if after.shared
                else after.fencing_token <= before.fencing_token
            )
        ]

    def crowds(self) -> Iterator[tuple[float, tuple[Section, ...]]]:
        """Each moment an acquisition entered: (when, one section of every acquisition open then).

        A sweep over the sections' starts and ends, in time order. Sections of
        one acquisition (the same token) count once, as the span from their
        first start to their last end when they overlap or touch. A section
        that ends when another starts is not open with it (touching is fine,
        as for :meth:`overlaps`). An empty section (entered and left at one
        clock reading) is open at that instant, with the sections open across
        it, but touches those that end or start then.
        """
        spans: list[tuple[float, float, Section]] = []
        by_token: dict[str, list[Section]] = {}
        for section in self.sections:
            by_token.setdefault(section.token, []).append(section)
        for sections in by_token.values():
            sections.sort(key=lambda s: s.start)
            first, end = sections[0], sections[0].end
            for section in sections[1:]:
                if section.start > end:
                    spans.append((first.start, end, first))
                    first, end = section, section.end
                else:
                    end = max(end, section.end)
            spans.append((first.start, end, first))
        # At one instant, ends come first (0), then each empty span's start and its end (1, in turn), then
        # starts (2): touching sections are not open together.
        events = sorted(
            itertools.chain(
                ((start, 1 if start == end else 2, n, True) for n, (start, end, _) in enumerate(spans)),
                ((end, 1 if start == end else 0, n, False) for n, (start, end, _) in enumerate(spans)),
            ),
            key=lambda event: (event[0], event[1], event[2], not event[3]),
        )
        open_now: dict[int, Section] = {}
        for when, _, n, starts in events:
            if starts:
                open_now[n] = spans[n][2]
                yield when, tuple(open_now.values())
            else:
                del open_now[n]

    def most_inside(self) -> int:
        """The largest number of acquisitions open at once (0 for an empty history)."""
        return max((len(inside) for _, inside in self.crowds()), default=0)

    def check(self, limit: int = 1) -> None:
        """Raise AssertionError describing every safety violation, if any.

        With *limit* 1 (a lock, the default): every overlap of two
        acquisitions (but of two shared sections: readers), and every fencing
        token that went backwards. With
        *limit* > 1 (a semaphore of that limit): every moment more than
        *limit* acquisitions were inside at once (sections of one token count
        once); fencing tokens are not checked then, since holders at once
        need not enter in token order.
        """
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int (how many may be inside at once), got {type(limit).__name__}")
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if limit == 1:
            problems = [
                f"overlap: {a.client} held it {a.start:.6f}-{a.end:.6f} while {b.client} entered at {b.start:.6f}"
                for a, b in self.overlaps()
            ] + [
                f"fencing token went backwards: {a.client} had {a.fencing_token}, then {b.client} got {b.fencing_token}"
                for a, b in self.fencing_regressions()
            ]
        else:
            problems = [
                f"{len(inside)} inside at once (limit {limit}) at {when:.6f}: "
                + ", ".join(f"{s.client} from {s.start:.6f}" for s in inside)
                for when, inside in self.crowds()
                if len(inside) > limit
            ]
        if problems:
            raise AssertionError(
                f"{len(problems)} safety violations in {len(self.sections)} sections:\n" + "\n".join(problems[:20])
            )
