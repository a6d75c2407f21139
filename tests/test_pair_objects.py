"""What an uncontended ``async with lock`` pair leaves for the garbage collector (issue 36, on uvloop).

A cell (a local that a nested function or a comprehension names) is an object the garbage collector
tracks, made each time its function runs; in a coroutine it lives across the pair's awaits. With 64
tasks, such objects decide how often the collector runs (a generation-0 run once the tracked objects
allocated, less those freed, pass 700), and each generation-2 run walks every object of the process:
``benchmarks/bench_pair_counts.py --gc`` counted 10 runs per 1,000 pairs on uvloop where dfc4c98 had
about 1, mostly from closures made on every acquire and release. So no function of the library that
runs in an uncontended pair makes one.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any

from redlock_async import Redlock


async def test_no_function_of_an_uncontended_pair_makes_cells(redlock: Redlock) -> None:
    lock = redlock.lock("pair-objects", ttl=10.0)
    async with lock:  # warm: the first acquire connects, loads scripts, and so on
        pass
    ran: set[CodeType] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            ran.add(frame.f_code)

    sys.setprofile(profile)
    try:
        for _ in range(3):
            async with lock:
                pass
    finally:
        sys.setprofile(None)
    library = [code for code in ran if "redlock_async" in code.co_filename]
    assert len(library) > 10  # (the profile saw the pair's functions)
    with_cells = sorted(f"{code.co_qualname} {code.co_cellvars}" for code in library if code.co_cellvars)
    assert with_cells == []
