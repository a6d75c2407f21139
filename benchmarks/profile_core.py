"""CPU profile of the uncontended acquire+release loop (pyinstrument), on 5 embedded nodes.

    .venv/bin/pip install pyinstrument && .venv/bin/python benchmarks/profile_core.py [--ops 3000]

Prints the time per operation (inflated by the profiler) and the call tree:
where the library's own Python time goes per acquire and release.
"""

from __future__ import annotations

import argparse
import time

from _common import add_loop_option, run_on
from pyinstrument import Profiler

from redlock_async import Redlock
from redlock_async.testing import LocalNodes


async def profile(urls: list[str], ops: int) -> None:
    async with Redlock(urls) as redlock:
        lock = redlock.lock("profiled", auto_extend=False)
        for _ in range(ops // 10):  # warm-up: connections, scripts, caches
            await lock.acquire()
            await lock.release()
        profiler = Profiler(interval=0.0002, async_mode="disabled")
        profiler.start()
        began = time.perf_counter()
        for _ in range(ops):
            await lock.acquire()
            await lock.release()
        elapsed = time.perf_counter() - began
        profiler.stop()
    print(f"{elapsed / ops * 1e6:.0f} us per acquire+release under the profiler ({ops} ops)")
    print(profiler.output_text(unicode=False, color=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ops", type=int, default=3000)
    add_loop_option(parser)
    args = parser.parse_args()
    with LocalNodes(5) as nodes:
        run_on(args.loop, profile(nodes.urls, args.ops))


if __name__ == "__main__":
    main()
