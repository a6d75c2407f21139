"""Run the benchmarks the README quotes; write docs/performance.md and the README's figures from them.

    python benchmarks/report.py            # ~6 min on 2 cores; rewrites docs/performance.{md,json} and README.md
    python benchmarks/report.py --quick    # a smoke run: prints, writes nothing
    python benchmarks/report.py --render   # only re-render both from docs/performance.json

Each benchmark runs as its own process with ``--json`` (bench_core on both loops, bench_watchdog,
bench_fencing, bench_handoff). Their raw figures, with the commit and the date, are kept in
docs/performance.json; docs/performance.md and the README's block between ``<!-- bench:start -->``
and ``<!-- bench:end -->`` are rendered from that file alone, so no figure is typed by hand
(tests/test_docs.py checks that both are what this script renders from the JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
PAGE = ROOT / "docs" / "performance.md"
DATA = ROOT / "docs" / "performance.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench:start -->", "<!-- bench:end -->"

RUNS = {  # name: (script, extra arguments of a full run, of a quick run, time bound in seconds)
    "core": ("bench_core.py", ["--loop", "both"], ["--quick", "--loop", "both"], 600),
    "watchdog": ("bench_watchdog.py", ["--no-memory"], ["--quick", "--no-memory"], 300),
    "fencing": ("bench_fencing.py", [], ["--quick"], 300),
    "handoff": ("bench_handoff.py", [], ["--quick"], 300),
}


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def measure(quick: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/report.py" + (" --quick" if quick else ""),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (script, full, smoke, bound) in RUNS.items():
            out = Path(tmp) / f"{name}.json"
            args = [sys.executable, str(HERE / script), *(smoke if quick else full), "--json", str(out)]
            print(f"== {' '.join(args[1:])}", flush=True)
            ran = subprocess.run(args, cwd=ROOT, timeout=bound, check=False)
            if not out.exists():
                raise SystemExit(f"{script} wrote no figures (exit {ran.returncode})")
            figures[name] = json.loads(out.read_text())
    return figures


def _x(value: float) -> str:
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def summary(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(command, figure, result) rows: the same for the page and the README."""
    rows: list[tuple[str, str, str]] = []
    for loop, core in figures["core"].items():
        med, ratio = core["medians"], core["ratios"]
        command = "`python benchmarks/bench_core.py --loop both`" if not rows else ""
        rows += [
            (
                command,
                f"uncontended acquire+release p50 ({loop})",
                f"{med['redlock_cycle_p50_us']:.0f} µs, **{_x(ratio['cycle_p50'])}** the floor "
                f"({med['floor_cycle_p50_us']:.0f} µs)",
            ),
            (
                "",
                f"throughput, 64 tasks on distinct resources ({loop})",
                f"{med['redlock_ops_per_s']:.0f} ops/s, **{_x(ratio['throughput'])}** the floor",
            ),
            (
                "",
                f"acquire p50 with 1 of 5 nodes SIGSTOPped ({loop})",
                f"**{_x(ratio['stopped_acquire_p50_vs_healthy'])}** healthy (the floor hangs)",
            ),
        ]
    passes = figures["watchdog"]["passes"]
    watchdog = [p for p in passes if p["mode"] == "watchdog"]
    naive = [p for p in passes if p["mode"] == "naive"]
    w, n = watchdog[0], naive[0]
    rows.append(
        (
            "`python benchmarks/bench_watchdog.py`",
            f"{w['locks']:,} locks held {w['hold_wall_s']:.0f} s",
            f"**{sum(p['lost'] for p in watchdog)} lost**; {w['extensions_per_s']:,.0f} extensions/s at "
            f"{w['cpu_us_per_extension']:.0f} µs CPU each ({_x(w['cpu_us_per_extension'] / n['cpu_us_per_extension'])} "
            f"per-lock timers, which lost {sum(p['lost'] for p in naive):,}); "
            f"{w['round_trips_per_s']:,.0f} round trips/s to the nodes "
            f"({_x(w['round_trips_per_s'] / n['round_trips_per_s'])} the timers')",
        )
    )
    fencing = figures["fencing"]
    rows.append(
        (
            "`python benchmarks/bench_fencing.py`",
            "fenced vs plain acquire+release p50",
            f"**{_x(fencing['fenced_to_plain_p50'])}** (one more round trip)",
        )
    )
    handoff = figures["handoff"]["rounds"]

    def over_rounds(pick: Any) -> float:
        return float(statistics.median(pick(r) for r in handoff))

    pushed = "pushed"
    cross = over_rounds(
        lambda r: r["modes"][pushed]["cross_task_handoffs_per_s"] / r["modes"]["polling"]["cross_task_handoffs_per_s"]
    )
    jain = over_rounds(lambda r: r["modes"][pushed]["jain"])
    p50 = over_rounds(lambda r: r["modes"][pushed]["handoff_p50_us"] / r["baseline"]["acquire_p50_us"])
    rows.append(
        (
            "`python benchmarks/bench_handoff.py`",
            "8 tasks on 2 Redlocks, one resource, 1 ms hold",
            f"hand-offs to another task **{_x(cross)}** polling; Jain's fairness index {jain:.2f} "
            f"(1.00: every task the same share); hand-off p50 {_x(p50)} an uncontended acquire",
        )
    )
    return rows


def _table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["| benchmark (command) | figure | result |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def render_readme_block(figures: dict[str, Any]) -> str:
    return (
        f"{BEGIN}\n"
        f"Made by `{figures['command']}` at commit {figures['commit']}, {figures['date']}, on the 2-core "
        "development box. Every figure is a ratio taken within one run (the box is noisy); absolute numbers "
        "will differ on yours. Details: [docs/performance.md](docs/performance.md).\n\n"
        f"{_table(summary(figures))}\n"
        f"| `python benchmarks/compare.py` | against aioredlock, pottery, redis-py `Lock` | see "
        "[docs/benchmarks.md](docs/benchmarks.md) |\n\n"
        "![latency against node count, and each scenario as a ratio to the raw floor](docs/img/compare.png)\n"
        f"{END}"
    )


def render_page(figures: dict[str, Any]) -> str:
    env = figures["core"]["asyncio"]["environment"]
    return (
        "# Performance\n\n"
        f"Made by `{figures['command']}` at commit {figures['commit']}, {figures['date']}; the raw figures are in "
        "[performance.json](performance.json), and this page and the README's table are rendered from it.\n\n"
        f"Machine: {env['cpu_count']} CPUs, {env['platform']}, Python {env['python']}, {env['server']} "
        f"({env['nodes']} nodes on 127.0.0.1), redis-py {env['redis_py']}.\n\n"
        "*The floor* is the least a Redlock client on redis-py can do: `asyncio.gather` of `SET NX PX` on "
        "every node, then of the release script, with no timeouts, retries or undo. A ratio below 1x "
        "the floor's latency, or above 1x its throughput, is better than the floor. *Jain's fairness index* "
        "is 1.00 when every task got the same share of grants and 1/n when one task got them all.\n\n"
        f"{_table(summary(figures))}\n"
    )


def write(figures: dict[str, Any]) -> None:
    PAGE.write_text(render_page(figures))
    text = README.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    README.write_text(text[:start] + render_readme_block(figures) + text[end:])
    print(f"wrote {PAGE.relative_to(ROOT)} and the README's figures")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: print the table, write nothing")
    parser.add_argument("--render", action="store_true", help="re-render from docs/performance.json only")
    args = parser.parse_args(argv)
    if args.render:
        write(json.loads(DATA.read_text()))
        return 0
    figures = measure(args.quick)
    print(_table(summary(figures)))
    if not args.quick:
        DATA.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
        write(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
