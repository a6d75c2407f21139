"""One simulated run: N nodes, several clients (each a ``Redlock`` of the unmodified library) running a
workload, faults from the schedule, every critical section recorded, the oracles asked at the end.

Everything that could differ between two runs of one seed is drawn from the seed: the loop's choices and
the messages' delays (``_loop``, ``_net``), the faults (``_faults``), and, for the run's length, what the
library itself draws from the system (tokens from ``secrets``, ``random.SystemRandom``'s retry delays, the
wall clock): :func:`deterministic` swaps those for the run's own random source and virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from redlock_async._core import clock as _clock
from redlock_async.testing.sim._config import Config
from redlock_async.testing.sim._faults import Nemesis
from redlock_async.testing.sim._liveness import check_liveness
from redlock_async.testing.sim._loop import Deadlock, SimClient, SimLoop
from redlock_async.testing.sim._net import Network
from redlock_async.testing.sim._node import WALL_START, SimNode
from redlock_async.testing.sim._workloads import Board

log = logging.getLogger(__name__)


@dataclass
class Result:
    seed: int
    violations: list[tuple[str, str]]
    """(kind, what happened), one per violation found."""
    coverage: dict[str, int]
    trace: list[str] = field(repr=False)
    digest: str = ""


def run(seed: int, config: Config, *, verbose: bool = False) -> Result:
    """Run one schedule; what it found, what it reached, and its trace (*verbose*: every command too)."""
    rng = random.Random(seed)
    loop = SimLoop(random.Random(rng.getrandbits(64)))
    loop.verbose = verbose
    network = Network(loop, jitter=config.jitter, lag=config.lag)
    nodes = []
    for i in range(config.nodes):
        node = SimNode(f"n{i}", loop.time, random.Random(rng.getrandbits(64)))
        network.add(f"n{i}.sim", 7000 + i, node)
        nodes.append(node)
    urls = [f"redis://n{i}.sim:{7000 + i}" for i in range(config.nodes)]
    board = Board(loop, config, urls)
    nemesis = Nemesis(loop, network, board, config, random.Random(rng.getrandbits(64)))
    board.timeline = nemesis.timeline
    with deterministic(random.Random(rng.getrandbits(64)), loop), _quiet():
        try:
            loop.run_until_complete(_main(loop, board, nemesis, config))
        except Deadlock as exc:
            board.violation("hang", str(exc))
        finally:
            _finish(loop, board)
    check_liveness(board)
    board.check()
    coverage = dict(board.coverage)
    coverage.update(nemesis.coverage)
    coverage["messages"] = network.messages
    coverage["client_seconds"] = round(config.duration * board.client_count)  # virtual time of locking covered
    coverage["steps"] = loop.steps
    trace = loop.trace
    core = [line for line in trace if not line.partition(" ")[2].startswith("  ")]
    digest = hashlib.sha256("\n".join(core).encode()).hexdigest()[:16]
    return Result(seed, board.violations, coverage, trace, digest)


async def _main(loop: SimLoop, board: Board, nemesis: Nemesis, config: Config) -> None:
    clients = [loop.client(f"c{i}") for i in range(board.client_count)]
    board.clients = clients
    mains = [loop.start(client, board.client_main(client), name=f"client {client.name}") for client in clients]
    faults = asyncio.ensure_future(nemesis.run(config.duration - config.ttl))
    await asyncio.sleep(config.duration)
    board.stopping = True
    nemesis.heal_all()
    await faults
    live = [task for task, client in zip(mains, clients, strict=True) if not client.dead]
    if live:
        _, pending = await asyncio.wait(live, timeout=config.ttl * 30 + 30)
        for task in pending:
            board.violation("stuck", f"{task.get_name()} did not end within {config.ttl * 30 + 30:g} s of the stop")
    await board.after_close(loop.network)


def _finish(loop: SimLoop, board: Board) -> None:
    """Cancel what is left (a killed client's tasks: revived to be cancelled), then close the loop."""
    leftovers: list[asyncio.Task[Any]] = []
    for client in board.clients:
        client.revive()
    for connection in loop.network.killed:
        connection.end_of_run()
    for task in asyncio.all_tasks(loop):
        task.cancel()
        leftovers.append(task)
    if leftovers:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.wait(leftovers, timeout=120))
    with contextlib.suppress(BaseException):
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


@contextlib.contextmanager
def deterministic(rng: random.Random, loop: SimLoop) -> Iterator[None]:
    """For the run: the library's tokens, retry delays, wall clock and monotonic clock from the run's own
    random source and virtual time (restored after)."""
    saved = (
        secrets.token_bytes,
        random.SystemRandom.random,
        random.SystemRandom.getrandbits,
        time.time,
        time.time_ns,
        random.getstate(),
    )

    def token_bytes(nbytes: int | None = None) -> bytes:
        return rng.randbytes(32 if nbytes is None else nbytes)

    def wall() -> float:
        return WALL_START + loop.now

    secrets.token_bytes = token_bytes
    random.SystemRandom.random = lambda self: rng.random()  # type: ignore[method-assign]
    random.SystemRandom.getrandbits = lambda self, k: rng.getrandbits(k)  # type: ignore[method-assign]
    time.time = wall
    time.time_ns = lambda: int(wall() * 1e9)
    random.seed(rng.getrandbits(64))
    asyncio.set_event_loop(loop)
    try:
        with _clock.use(loop.time):
            yield
    finally:
        asyncio.set_event_loop(None)
        (
            secrets.token_bytes,
            random.SystemRandom.random,  # type: ignore[method-assign]
            random.SystemRandom.getrandbits,  # type: ignore[method-assign]
            time.time,
            time.time_ns,
            state,
        ) = saved
        random.setstate(state)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The library's and asyncio's logs held back during a run (thousands of runs: one line each is too
    many); a violation's trace says what happened."""
    loggers = [logging.getLogger(name) for name in ("redlock_async", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


__all__ = ["Config", "Result", "SimClient", "run"]
