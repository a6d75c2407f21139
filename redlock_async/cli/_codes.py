"""The exit statuses of ``redlock``: one constant each, and their words for --help and docs/cli.md."""

from __future__ import annotations

EXIT_HELD = 1
"""``redlock status``: the lock is held (one holder's key is on a majority), or a permit of semaphore NAME."""
EXIT_USAGE = 2
"""A usage error (argparse's own status); also ``redlock run --limit N`` on a semaphore held under another limit."""
EXIT_NOT_CONFIRMED = 1
"""``redlock break``: the answer to its question was not yes; nothing was deleted."""
EXIT_UNKNOWN = 3
"""``redlock status``: too few nodes answered to tell held from free."""
EXIT_UNAVAILABLE = 69
"""``redlock run``: too few nodes could vote to grant the lock (unreachable, or in restart quarantine), held
elsewhere or not: :class:`NodesUnavailable`; the command did not run (EX_UNAVAILABLE). ``redlock break``:
too few nodes answered to clear the lease from a majority."""
EXIT_NOT_ACQUIRED = 75
"""``redlock run``: the lock could not be had within --wait; the command did not run (EX_TEMPFAIL)."""
EXIT_LOST = 76
"""``redlock run``: the lock was lost while the command ran; it was stopped (SIGTERM, then SIGKILL)."""
EXIT_STATUSES = (
    (
        "0",
        "run: the command succeeded (otherwise run exits with the command's own status); status: free; "
        "demo: no two critical sections overlapped; break: a majority of the nodes no longer hold what was "
        "shown (deleted, or nothing was held); nodes: stopped by Ctrl-C or SIGTERM, no server left",
    ),
    (
        "1",
        "status: held (the lock, by a lock_many holder too, or a permit of semaphore NAME); demo: critical "
        "sections overlapped; run: the nodes refused the lock scripts (an ACL "
        "user needs +@scripting) or another redlock error, said in one line; the command did not run; break: "
        "the answer to its question was not yes, nothing was deleted",
    ),
    (
        "2",
        "usage error: the message says what to change; also run --limit N while the semaphore's permits are "
        "held under another limit (every holder must use the same N), said in one line; the command did not run; "
        "break without a terminal to ask on and without --yes",
    ),
    (
        "3",
        "status: unknown, too few nodes answered to tell held from free (a node in restart quarantine counts as "
        "one that did not answer: it may have lost keys)",
    ),
    (
        "69",
        "run: too few nodes could vote to grant the lock (unreachable, or in restart quarantine: the message "
        "says which, and for how long), the command did not run; demo, nodes: no server, or one could not start "
        "(EX_UNAVAILABLE in sysexits.h, 'service unavailable'); break: too few nodes answered to clear the "
        "lease from a majority (those that answered were cleared; run it again once the others answer)",
    ),
    (
        "75",
        "run: the lock is held elsewhere and was not had within --wait, the command did not run "
        "(EX_TEMPFAIL in sysexits.h, 'try again later')",
    ),
    ("76", "run: the lock was lost while the command ran; it got SIGTERM, then SIGKILL after --grace"),
    ("126", "run: the command is not executable (the shell's convention)"),
    ("127", "run: the command was not found (the shell's convention)"),
    (
        "130",
        "interrupted (Ctrl-C) while waiting for the lock (nothing is left on the nodes), or at break's question "
        "(nothing was deleted)",
    ),
)
"""Every exit status of ``redlock``: shown by ``redlock --help`` and, the same, in docs/cli.md."""
