"""CPU profile of the uncontended acquire+release loop (pyinstrument), on 5 embedded nodes.

    .venv/bin/pip install pyinstrument && .venv/bin/python benchmarks/profile_core.py [--ops 3000] [--tasks 64]

Prints the time per operation (inflated by the profiler) and the call tree:
where the library's own Python time goes per acquire and release. With ``--tasks N``, N
tasks each loop on a resource of their own (the throughput scenario of bench_core and
bench_machine: writes gathered per loop turn, replies parsed in batches); the default is
one task, sequential.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import add_loop_option, run_on
from pyinstrument import Profiler

from redlock_async import Lock, Redlock
from redlock_async.testing import LocalNodes


async def profile(urls: list[str], ops: int, tasks: int) -> None:
    async with Redlock(urls) as redlock:
        locks = [redlock.lock(f"profiled:{i}", auto_extend=False) for i in range(tasks)]

        async def loop(lock: Lock, n: int) -> None:
            for _ in range(n):
                await lock.acquire()
                await lock.release()

        per_task = max(ops // tasks, 1)
        await asyncio.gather(*(loop(lock, max(per_task // 10, 1)) for lock in locks))  # warm-up
        profiler = Profiler(interval=0.0002, async_mode="disabled")
        profiler.start()
        began = time.perf_counter()
        await asyncio.gather(*(loop(lock, per_task) for lock in locks))
        elapsed = time.perf_counter() - began
        profiler.stop()
    done = per_task * tasks
    print(f"{elapsed / done * 1e6:.0f} us per acquire+release under the profiler ({done} ops, {tasks} tasks)")
    print(profiler.output_text(unicode=False, color=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--tasks", type=int, default=1, help="concurrent tasks, each on its own resource")
    add_loop_option(parser)
    args = parser.parse_args()
    with LocalNodes(5) as nodes:
        run_on(args.loop, profile(nodes.urls, args.ops, args.tasks))


if __name__ == "__main__":
    main()
