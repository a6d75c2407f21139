"""What every benchmark script shares."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def library_commit() -> str:
    """The commit measured, with "+dirty" when redlock_async/ has uncommitted changes; "?" without git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "redlock_async"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return head + ("+dirty" if dirty else "")


async def loop_lag(stop_at: int) -> float:
    """Worst lateness, in ms, of a 5 ms sleep until *stop_at* (perf_counter_ns): how starved the loop was."""
    worst = 0
    while time.perf_counter_ns() < stop_at:
        before = time.perf_counter_ns()
        await asyncio.sleep(0.005)
        worst = max(worst, time.perf_counter_ns() - before - 5_000_000)
    return worst / 1e6


LOOPS = ("asyncio", "uvloop")


def add_loop_option(parser: argparse.ArgumentParser, *, both: bool = False) -> None:
    """``--loop``: the event loop to measure on (uvloop: as uvicorn and gunicorn's aiohttp workers run)."""
    choices = (*LOOPS, "both") if both else LOOPS
    parser.add_argument(
        "--loop",
        choices=choices,
        default="asyncio",
        help="event loop: asyncio (default), uvloop" + (", or both, one after the other" if both else ""),
    )


def run_on(loop: str, coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro), on uvloop when *loop* says so."""
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)
