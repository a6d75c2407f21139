"""The ground floor: values and rules every other wing stands on, with no I/O of their own. The
Redlock decisions (quorum, drift, validity, verdicts), the settings, key names, the one clock, the
parking lot where tasks wait their turn, holders and re-entries, and small process helpers. Imports
no other wing.

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._core import _algorithm as algorithm
from redlock_async._core import _clock as clock
from redlock_async._core import _holder as holder
from redlock_async._core import _lot as lot
from redlock_async._core import _reaper as reaper
from redlock_async._core._algorithm import (
    LOST,
    NO,
    PENDING,
    SKIPPED,
    UNDECIDED,
    WON,
    YES,
    ClockFault,
    Held,
    Marker,
    Verdict,
    Vote,
    drift,
    held_by_majority,
    judge_clock,
    patience,
    quorum,
    sit_out,
    smoothed_rtt,
    thresholds,
    verdict,
)
from redlock_async._core._cleanup import complete
from redlock_async._core._deprecated import keyword_timeout, renamed
from redlock_async._core._lot import ParkingLot, Waits
from redlock_async._core._names import (
    LAYOUT_MARK,
    Name,
    RwKeys,
    SemaphoreKeys,
    canonical_names,
    check_owner,
    companion,
    default_owner,
    fence_key,
    one_slot_voters,
    reader_key,
    released_word,
    resource_key,
    rw_keys,
    rw_writer_key,
    semaphore_keys,
    slot_of,
    slot_tag,
    widest_limit,
)
from redlock_async._core._options import ElectionOptions, LeaseOptions, LockOptions, check_options, overrides
from redlock_async._core._reentry import Hold, Reentries
from redlock_async._core._settings import MIN_TTL_TO_NODE_TIMEOUT, Settings, check_duration

__all__ = [
    "LAYOUT_MARK",
    "LOST",
    "MIN_TTL_TO_NODE_TIMEOUT",
    "NO",
    "PENDING",
    "SKIPPED",
    "UNDECIDED",
    "WON",
    "YES",
    "ClockFault",
    "ElectionOptions",
    "Held",
    "Hold",
    "LeaseOptions",
    "LockOptions",
    "Marker",
    "Name",
    "ParkingLot",
    "Reentries",
    "RwKeys",
    "SemaphoreKeys",
    "Settings",
    "Verdict",
    "Vote",
    "Waits",
    "algorithm",
    "canonical_names",
    "check_duration",
    "check_options",
    "check_owner",
    "clock",
    "companion",
    "complete",
    "default_owner",
    "drift",
    "fence_key",
    "held_by_majority",
    "holder",
    "judge_clock",
    "keyword_timeout",
    "lot",
    "one_slot_voters",
    "overrides",
    "patience",
    "quorum",
    "reader_key",
    "reaper",
    "released_word",
    "renamed",
    "resource_key",
    "rw_keys",
    "rw_writer_key",
    "semaphore_keys",
    "sit_out",
    "slot_of",
    "slot_tag",
    "smoothed_rtt",
    "thresholds",
    "verdict",
    "widest_limit",
]
