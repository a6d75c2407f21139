"""``redlock run``: run a command while holding a lock, a semaphore's permit, several locks or leadership."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Literal

from redlock_async._core import clock as _clock
from redlock_async._core import reaper as _reaper
from redlock_async._core import resource_key
from redlock_async.cli._codes import EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_UNAVAILABLE, EXIT_USAGE
from redlock_async.client import Redlock
from redlock_async.errors import LockNotAcquired, NodesUnavailable
from redlock_async.lock import Lock

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
NOTE_EVERY = 5.0
"""``redlock run``, stderr not a terminal: seconds between the "still waiting" lines."""


def resource_name(name: str) -> tuple[str | bytes, str]:
    """The lock's name from the command line, and how to show it.

    Bytes that are not UTF-8 reach us as surrogate escapes: lock the very bytes given.
    """
    try:
        name.encode()
    except UnicodeEncodeError:
        raw = os.fsencode(name)
        return raw, raw.decode(errors="backslashreplace")
    return name, name


async def run_command(
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
    sharing: Literal["shared", "exclusive"] | None = None,
) -> int:
    """Hold the lock (every name; or a permit of a semaphore; or, with *sharing*, read/write lock *names[0]*
    as a reader or its writer) while *cmd* runs; its exit status,
    or EXIT_NOT_ACQUIRED / EXIT_UNAVAILABLE / EXIT_LOST / EXIT_USAGE."""
    loop = asyncio.get_running_loop()
    lost = asyncio.Event()
    # Each name once, in the order given: (as typed, as locked, as shown). The lock takes them in its own order.
    given: dict[bytes, tuple[str, str | bytes, str]] = {}
    for typed in names:
        resource, shown = resource_name(typed)
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
        elif sharing is not None:
            rw = redlock.rw_lock(held[0][1], fencing=fencing, on_lost=on_lost, owner=owner)
            lock = rw.read() if sharing == "shared" else rw.write()
            what = f"read/write lock '{name}' ({sharing})"
            short = what
            busy = f"{name} is held elsewhere " + ("by a writer" if sharing == "shared" else "by readers or a writer")
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
            async with contextlib.nullcontext() if quiet or wait <= 0 else waiting_note(lock, what, wait):
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
            # What is sent to redlock goes to the command, from before it starts: one sent while it
            # starts (it may run before create_subprocess_exec returns) waits for it, not killing redlock.
            signals = _Forwarder()
            for signum in FORWARDED:
                loop.add_signal_handler(signum, signals.forward, signum)
            try:
                try:
                    # A process group of its own: what the command starts (a script's `sleep`) is
                    # signalled, and ended, with it.
                    # The child names its group to the reaper itself, before it runs: a SIGKILL of
                    # redlock while it starts (before watch_group below) leaves none of it behind.
                    reaper = _reaper.pipe()
                    process = await asyncio.create_subprocess_exec(
                        *cmd,
                        env=env,
                        process_group=0,
                        pass_fds=(reaper,),
                        preexec_fn=functools.partial(_prepare_child, os.getpid(), reaper),
                    )
                except OSError as exc:
                    print(f"redlock: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
                    # The shell's convention: 127 not found, 126 found but not executable.
                    return 127 if isinstance(exc, FileNotFoundError) else 126
                # Whatever ends this process (SIGKILL included), no process of the command may outlive
                # it, and so its lease, beside the next holder: the reaper (a process watching a pipe
                # from this one) kills the whole group; the parent-death signal, the command at once.
                _reaper.watch_group(process.pid)
                terminal = _Terminal(process.pid)
                signals.started(process)
                exited = asyncio.ensure_future(process.wait())
                gone = asyncio.ensure_future(lost.wait())
                await asyncio.wait([exited, gone], return_when=asyncio.FIRST_COMPLETED)
                if not exited.done():
                    print(f"redlock: lost {short} while {cmd[0]} ran: stopping it", file=sys.stderr)
                    await _end_group(process.pid, grace, exited)
                    return EXIT_LOST
                gone.cancel()
                await asyncio.gather(gone, return_exceptions=True)
                # The command is done; what it left running in its group goes before the lock does.
                await _end_group(process.pid, grace, exited)
                code = exited.result()
                return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
            finally:
                for signum in FORWARDED:
                    loop.remove_signal_handler(signum)
                child = signals.process
                if child is not None:
                    terminal.take_back()
                    if not _group_alive(child.pid):
                        _reaper.forget_group(child.pid)
        finally:
            await lock.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def waiting_note(lock: Lock, what: str, wait: float) -> AsyncIterator[None]:
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


def _prepare_child(parent: int, reaper: int) -> None:
    """In the child, before exec: its group watched by the reaper, and it killed when redlock dies."""
    _reaper.watch_own_group(reaper)
    _die_with_parent(parent)


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL it when redlock dies (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took hold
            os._exit(1)


PR_SET_PDEATHSIG = 1


class _Forwarder:
    """The signals sent to redlock, for the command: kept until it has started, then sent on."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.pending: list[int] = []

    def forward(self, signum: int) -> None:
        if self.process is None:
            self.pending.append(signum)
        else:
            _forward(self.process, signum)

    def started(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        for signum in self.pending:
            _forward(process, signum)
        self.pending.clear()


def _forward(process: asyncio.subprocess.Process, signum: int) -> None:
    """Send *signum* to the command's process group (as a terminal sends Ctrl-C to a foreground job)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group *pgid* still runs (a zombie, dead but not yet reaped, does not count
    where /proc tells: an init that never reaps would keep it for ever)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return True  # no /proc: a member, zombie or not, counts
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if fields[2] == str(pgid).encode() and fields[0] != b"Z":  # state, ppid, pgrp, ...
            return True
    return False


async def _end_group(pgid: int, grace: float, exited: asyncio.Future[int]) -> None:
    """End every process of group *pgid*: SIGTERM, then SIGKILL after *grace* seconds for what is left.

    The group's leader (the command) is reaped by *exited*; the others, reparented, by init. A group
    is gone once no process of it exists: ``killpg(pgid, 0)`` raises ProcessLookupError.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
        os.killpg(pgid, signal.SIGCONT)  # a stopped process gets its SIGTERM only once it runs
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while loop.time() < deadline and (not exited.done() or _group_alive(pgid)):  # noqa: ASYNC110 (no event tells a group ended)
        await asyncio.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    await exited
    for _ in range(250):  # what SIGKILL ended is gone in a moment (reaped by init: zombies count till then)
        if not _group_alive(pgid):
            return
        await asyncio.sleep(0.02)


class _Terminal:
    """The terminal, when redlock runs in its foreground: given to the command's group (it reads the
    keyboard and gets Ctrl-C, as a shell's job does) and taken back when it ends."""

    def __init__(self, pgid: int) -> None:
        self.fd: int | None = None
        try:
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                self.fd = 0
                _set_foreground(0, pgid)
                os.killpg(pgid, signal.SIGCONT)  # stopped by a read before it had the terminal: go on
        except OSError:
            self.fd = None

    def take_back(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                _set_foreground(self.fd, os.getpgrp())
            self.fd = None


def _set_foreground(fd: int, pgid: int) -> None:
    """tcsetpgrp, from a group that may be in the background (SIGTTOU blocked meanwhile)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(fd, pgid)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
