"""One round over every node: the ballot (fan-out, per-node deadlines, early verdicts), the requests
that acquire, extend and release, the lease with its phase table, and why an acquire failed.
Imports ``_core`` and ``_nodes``.

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._rounds import _requests as requests
from redlock_async._rounds._deadline import Deadline
from redlock_async._rounds._fanout import (
    UNANSWERED,
    Ballot,
    back_in,
    outcomes,
    sitting_out,
    timed_out,
    vote_of_fenced,
    vote_of_script,
)
from redlock_async._rounds._judge import RAN_OUT, after_extension
from redlock_async._rounds._lease import Heard, Keep, Lease, Phase, Tenure
from redlock_async._rounds._not_acquired import not_acquired, reason
from redlock_async._rounds._requests import Sent, owner_of, pack_extend

__all__ = [
    "RAN_OUT",
    "UNANSWERED",
    "Ballot",
    "Deadline",
    "Heard",
    "Keep",
    "Lease",
    "Phase",
    "Sent",
    "Tenure",
    "after_extension",
    "back_in",
    "not_acquired",
    "outcomes",
    "owner_of",
    "pack_extend",
    "reason",
    "requests",
    "sitting_out",
    "timed_out",
    "vote_of_fenced",
    "vote_of_script",
]
