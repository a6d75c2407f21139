"""Run the benchmarks the docs quote; write docs/performance.md and the summary on docs/development.md.

    python benchmarks/report.py                 # ~8 min on 2 cores; rewrites docs/performance.{md,json},
                                                # docs/development.md's summary and docs/benchmarks.md's
                                                # reference section
    python benchmarks/report.py --quick         # a smoke run: prints, writes nothing
    python benchmarks/report.py --render        # only re-render the pages from docs/performance.json
    python benchmarks/report.py --only machine  # run one benchmark (repeatable), merge its figures into
                                                # docs/performance.json (the others kept), re-render

Each benchmark runs as its own process with ``--json`` (bench_core on both loops, bench_watchdog,
bench_fencing, bench_handoff, bench_machine on both loops). Their raw figures, with the commit and the
date, are kept in docs/performance.json; docs/performance.md, docs/development.md's block between
``<!-- bench:start -->`` and ``<!-- bench:end -->`` and the section of docs/benchmarks.md between
``<!-- report.py: machine start -->`` and ``<!-- report.py: machine end -->`` (redlock_async against
the raw-Protocol reference client, "the machine") are rendered from that file alone, so no figure is
typed by hand (tests/test_docs.py checks that all three are what this script renders from the JSON).

``--only NAME`` is for refreshing one benchmark's figures between full runs: the JSON's top-level
commit and date stay those of the last full run, and the merged benchmark's own commit, date and
command go under ``"measured"``; the pages say which figures were measured apart. A full run measures
everything at one commit and leaves no ``"measured"`` entry. With ``--quick``, ``--only`` prints and
writes nothing, as a quick run does.
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
KEPT = ("cluster_shards",)  # measured apart from RUNS, by its own command (bench_server_cpu.py --cluster-shards
# --json PATH, copied in): kept across runs of this script, shown with its own commit and date
DATA = ROOT / "docs" / "performance.json"
SUMMARY = ROOT / "docs" / "development.md"
COMPARISON = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:start -->", "<!-- bench:end -->"
MACHINE_BEGIN, MACHINE_END = "<!-- report.py: machine start -->", "<!-- report.py: machine end -->"
LOOPS = ("asyncio", "uvloop")

RUNS = {  # name: (script, extra arguments of a full run, of a quick run, time bound in seconds)
    "core": ("bench_core.py", ["--loop", "both"], ["--quick", "--loop", "both"], 600),
    "watchdog": ("bench_watchdog.py", ["--no-memory"], ["--quick", "--no-memory"], 300),
    "fencing": ("bench_fencing.py", [], ["--quick"], 300),
    "handoff": ("bench_handoff.py", [], ["--quick"], 300),
    # ~1 min: 5 rounds of 2 modes, each 2 child processes contending 3 s; quick: 2 rounds of 1.5 s
    "crossproc": ("bench_crossproc.py", [], ["--quick"], 300),
    # ~2 min on both loops (6 rounds of 1.7 s windows); quick: 2 short rounds, < 30 s
    "machine": ("bench_machine.py", ["--loop", "both"], ["--quick", "--loop", "both"], 420),
}


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=5
    ).stdout.strip()


def commit(*, dirty: bool = False) -> str:
    """HEAD's short hash; with *dirty*, "+dirty" added when redlock_async/ has uncommitted changes."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if dirty and _git("status", "--porcelain", "--", "redlock_async") else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _command(quick: bool, only: Sequence[str]) -> str:
    return "python benchmarks/report.py" + (" --quick" if quick else "") + "".join(f" --only {n}" for n in only)


def measure(quick: bool, only: Sequence[str] = ()) -> dict[str, Any]:
    """Run the benchmarks of RUNS (or only those named), each as its own process; their figures by name."""
    # A run of only some benchmarks refreshes them between full runs, maybe on uncommitted code: say so.
    figures: dict[str, Any] = {"commit": commit(dirty=bool(only)), "date": _now(), "command": _command(quick, only)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (script, full, smoke, bound) in RUNS.items():
            if only and name not in only:
                continue
            out = Path(tmp) / f"{name}.json"
            args = [sys.executable, str(HERE / script), *(smoke if quick else full), "--json", str(out)]
            print(f"== {' '.join(args[1:])}", flush=True)
            ran = subprocess.run(args, cwd=ROOT, timeout=bound, check=False)
            if not out.exists():
                raise SystemExit(f"{script} wrote no figures (exit {ran.returncode})")
            if ran.returncode != 0:
                print(f"!! {script} exited {ran.returncode}: its checks failed (see above); figures kept", flush=True)
            figures[name] = json.loads(out.read_text())
    return figures


def merge(stored: dict[str, Any], measured: dict[str, Any], only: Sequence[str]) -> dict[str, Any]:
    """*stored* with the benchmarks in *only* replaced by *measured*'s, each with its own commit, date, command."""
    merged = dict(stored)
    apart = dict(merged.get("measured", {}))
    for name in only:
        merged[name] = measured[name]
        apart[name] = {key: measured[key] for key in ("commit", "date", "command")}
    merged["measured"] = apart
    return merged


def provenance(figures: dict[str, Any], name: str) -> dict[str, str]:
    """The commit, date and command *name*'s figures were measured with: its own when merged apart."""
    apart: dict[str, str] | None = figures.get("measured", {}).get(name)
    return apart or {key: figures[key] for key in ("commit", "date", "command")}


def _x(value: float) -> str:
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def summary(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(command, figure, result) rows: the same for the page and the summary."""
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
    rows += machine_rows(figures)
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
    if all("queued" in r["modes"] for r in handoff):  # measured since the grant queue came
        queued = over_rounds(lambda r: r["modes"]["queued"]["handoff_p50_us"] / r["baseline"]["acquire_p50_us"])
        rows.append(
            (
                "",
                "the same with the grant queue (`queue=True`)",
                f"hand-off p50 **{_x(queued)}** an uncontended acquire",
            )
        )
    if "crossproc" in figures:
        ratios = figures["crossproc"]["ratios"]
        queued = ratios.get("default", ratios.get("queued"))  # "queued" before the grant queue was the default
        rows.append(
            (
                "`python benchmarks/bench_crossproc.py`",
                "hand-off between 2 OS processes (2 tasks each, 1 ms hold)",
                f"hand-off p50 **{_x(queued)}** an uncontended acquire with the grant queue (the default), "
                f"{_x(ratios['words'])} with `queue=False` (waiters woken by a pub/sub message at each release, "
                "then racing for the key)",
            )
        )
    return rows


# -- against the machine (bench_machine.py): redlock_async beside a raw-Protocol reference client --------

MACHINE_COMMAND = "`python benchmarks/bench_machine.py --loop both`"


def _apart(figures: dict[str, Any], name: str) -> str:
    """'' when *name* was measured with the rest, else where and when it was measured."""
    if name not in figures.get("measured", {}):
        return ""
    where = provenance(figures, name)
    return f"measured apart, at commit {where['commit']}, {where['date']}"


def _target(run: dict[str, Any], name: str) -> str:
    met = "met" if run["met"][name] else "**not met**"
    if name.startswith("throughput"):
        return f">= {run['targets']['throughput_ratio_min']}x: {met}"
    return f"<= {run['targets']['cpu_per_pair_ratio_max']}x: {met}"


def machine_rows(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The summary's rows (both pages): per loop, the throughput and CPU-per-pair ratios to the machine."""
    rows: list[tuple[str, str, str]] = []
    apart = _apart(figures, "machine")
    for loop in LOOPS:
        run = figures["machine"][loop]
        med, ratio = run["medians"], run["ratios"]
        ours, theirs = med["redlock_async"], med["machine"]
        figure = f"against a bare reference client ({loop})"
        if apart and not rows:
            figure += f"; {apart}"
        rows.append(
            (
                MACHINE_COMMAND if not rows else "",
                figure,
                f"throughput **{_x(ratio['throughput_64_pairs_per_s'])}** the reference's at 64 tasks, "
                f"**{_x(ratio['throughput_512_pairs_per_s'])}** at 512; "
                f"client CPU per acquire+release **{_x(ratio['cpu_us_per_pair_64'])}** "
                f"({ours['cpu_us_per_pair_64']:.0f} vs {theirs['cpu_us_per_pair_64']:.0f} µs)",
            )
        )
    return rows


MACHINE_FIGURES = (  # name in bench_machine's JSON, label, format of the absolute figures
    ("throughput_64_pairs_per_s", "throughput, 64 tasks (pairs/s)", "{:,.0f}"),
    ("throughput_512_pairs_per_s", "throughput, 512 tasks (pairs/s)", "{:,.0f}"),
    ("cpu_us_per_pair_64", "client CPU per acquire+release, 64 tasks (µs)", "{:.1f}"),
    ("cycle_p50_us", "uncontended acquire+release p50 (µs)", "{:,.0f}"),
    ("cycle_p99_us", "uncontended acquire+release p99 (µs)", "{:,.0f}"),
)


def _machine_table(figures: dict[str, Any], *, targets: bool) -> str:
    head = "| loop | figure | reference | redlock_async | redlock_async / reference |"
    lines = [head + (" target |" if targets else ""), "|---|---|---:|---:|---:|" + ("---|" if targets else "")]
    for loop in LOOPS:
        run = figures["machine"][loop]
        med, ratio = run["medians"], run["ratios"]
        for name, label, fmt in MACHINE_FIGURES:
            cells = [
                loop,
                label,
                fmt.format(med["machine"][name]),
                fmt.format(med["redlock_async"][name]),
                f"**{_x(ratio[name])}**",
            ]
            if targets:
                cells.append(_target(run, name) if name in run["met"] else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _machine_checks(figures: dict[str, Any]) -> str:
    parts = []
    for loop in LOOPS:
        run = figures["machine"][loop]
        ours = run["failures"]["redlock_async"]
        theirs = run["failures"]["machine"]
        overlaps = sum(e["overlaps"] for e in run["exclusion"].values())
        parts.append(
            f"{loop}: {'passed' if run['ok'] else '**FAILED**'} (failed acquires: reference {theirs['acquire']}, "
            f"redlock_async {ours['acquire']}, of which {ours['refused']} refused by a node and "
            f"{ours['timed_out']} on its node timeout; {overlaps} overlaps in the exclusion check)"
        )
    return "; ".join(parts)


def _machine_rounds(figures: dict[str, Any]) -> int:
    return int(figures["machine"][LOOPS[0]]["config"]["rounds"])


def render_machine_section(figures: dict[str, Any]) -> str:
    """docs/performance.md's section on the machine: every figure, per loop, with issue 20's targets."""
    where = provenance(figures, "machine")
    targets = figures["machine"][LOOPS[0]]["targets"]
    measured = (
        f" Measured apart from the rest of this page, by `{where['command']}` at commit {where['commit']}, "
        f"{where['date']}."
        if "machine" in figures.get("measured", {})
        else ""
    )
    return (
        "## Against a bare reference client\n\n"
        f"{MACHINE_COMMAND} measures redlock_async against *the reference* (called `machine` in the "
        "benchmark's JSON): a Redlock client written for the "
        "benchmark on a raw `asyncio.Protocol` per node (hiredis parsing the replies, a FIFO of plain futures, "
        "the writes of one loop turn batched into one), doing the same acquire (quorum 3 of 5, undo on "
        "failure) and release, with no per-node deadline, ballot, watchdog or retries: what is left is the wire, "
        "the parser and the event loop. The two alternate in one process over "
        f"{_machine_rounds(figures)} rounds on each loop, each task on a resource of its own; every figure is "
        "the median over the rounds, and each ratio (redlock_async / machine) is taken within a round, then "
        "the median. Client CPU per pair is `time.process_time()` over a throughput window divided by the "
        "acquire+release pairs done in it. The *target* column is the goal the project set itself: "
        f"throughput >= {targets['throughput_ratio_min']}x the reference's, CPU per pair <= "
        f"{targets['cpu_per_pair_ratio_max']}x. Where it is not met, the gap is what redlock_async does per "
        "acquire that the reference does not (a deadline and a ballot per node, cancellation safety, "
        "statistics), in Python; on uvloop the wire costs less than on asyncio's own loop, so the same "
        "Python-side work is a larger share of each pair and the ratios are further from 1x."
        f"{measured}\n\n"
        f"{_machine_table(figures, targets=True)}\n\n"
        f"Checks of the run: {_machine_checks(figures)}.\n"
    )


def render_comparison_section(figures: dict[str, Any]) -> str:
    """docs/benchmarks.md's section between MACHINE_BEGIN and MACHINE_END: the reference beside redlock_async."""
    where = provenance(figures, "machine")
    env = figures["machine"][LOOPS[0]]["environment"]
    return (
        f"{MACHINE_BEGIN}\n\n"
        "## redlock_async against a raw-Protocol reference client\n\n"
        "The reference is not a library: `benchmarks/bench_machine.py` writes the least a correct Redlock client "
        "on asyncio has to do, one raw `asyncio.Protocol` per node with hiredis, the same quorum acquire (undo "
        "on failure) and release, and nothing else (no per-node deadline, no retries, no watchdog). It shows "
        "how close redlock_async comes to what the event loop and the wire allow. Both run in one process, "
        f"alternating, over {_machine_rounds(figures)} rounds per loop; medians over the rounds, each ratio taken "
        f"within a round. Measured by `{where['command']}` (which runs "
        f"{MACHINE_COMMAND}) at commit {where['commit']}, {where['date']}, Python {env['python']}, "
        f"{env['server']}, {env['nodes']} nodes on 127.0.0.1, {env['cpu_count']} shared cores.\n\n"
        f"{_machine_table(figures, targets=False)}\n\n"
        "A ratio above 1x is better for throughput, below 1x for CPU and latency. What redlock_async does "
        "beyond the reference (a deadline per node, so that a stopped node costs nothing: scenario 4 above; "
        "cancellation safety; the watchdog; the pushed hand-off) is what these ratios pay for. The same figures, "
        "with the targets the library works toward, are in "
        "[performance.md](performance.md#against-a-bare-reference-client).\n\n"
        f"{MACHINE_END}"
    )


def _table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["| benchmark (command) | figure | result |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def render_summary_block(figures: dict[str, Any]) -> str:
    return (
        f"{BEGIN}\n"
        f"Made by `{figures['command']}` at commit {figures['commit']}, {figures['date']}, on the 2-core "
        "development box. Every figure is a ratio taken within one run (the box is noisy); absolute numbers "
        "will differ on yours. Details: [performance](performance.md).\n\n"
        f"{_table(summary(figures))}\n"
        f"| `python benchmarks/compare.py` | against aioredlock, pottery, redis-py `Lock` | see "
        "[benchmarks](benchmarks.md) |\n\n"
        "*The floor*: the least a Redlock client on redis-py can do (`asyncio.gather` of `SET NX PX` on every "
        "node, then of the release script; no timeouts, retries or undo). *A bare reference client*: a Redlock "
        "client written for the benchmark on a raw asyncio protocol per node, with nothing but the quorum "
        "acquire and release: the most this box allows, so a ratio below 1x there is the price of per-node "
        "deadlines, cancellation safety and the watchdog "
        "([details](performance.md#against-a-bare-reference-client)). A *hand-off* is the time from a "
        "release to the next waiter holding the lock.\n\n"
        "![latency against node count, and each scenario as a ratio to the raw floor](img/compare.png)\n"
        f"{END}"
    )


def render_page(figures: dict[str, Any]) -> str:
    env = figures["core"]["asyncio"]["environment"]
    return (
        "# Performance\n\n"
        f"Made by `{figures['command']}` at commit {figures['commit']}, {figures['date']}; the raw figures are in "
        "[performance.json](performance.json), and this page and the summary on "
        "[development](development.md#benchmarks) are rendered from it.\n\n"
        f"Machine: {env['cpu_count']} CPUs, {env['platform']}, Python {env['python']}, {env['server']} "
        f"({env['nodes']} nodes on 127.0.0.1), redis-py {env['redis_py']}.\n\n"
        "*The floor* is the least a Redlock client on redis-py can do: `asyncio.gather` of `SET NX PX` on "
        "every node, then of the release script, with no timeouts, retries or undo. A ratio below 1x "
        "the floor's latency, or above 1x its throughput, is better than the floor. *Jain's fairness index* "
        "is 1.00 when every task got the same share of grants and 1/n when one task got them all.\n\n"
        f"{_table(summary(figures))}\n\n"
        f"{render_machine_section(figures)}"
        f"{render_cluster_section(figures)}"
    )


def render_cluster_section(figures: dict[str, Any]) -> str:
    """Cluster voters: capacity as shards grow (issue 39), from the stored ``cluster_shards`` run."""
    run = figures.get("cluster_shards")
    if run is None:
        return ""
    load = run["load_average"]
    timed = (
        "\n## Cluster voters: capacity as shards grow\n\n"
        f"`{run['command']}` at commit {run['commit']}, {run['date']}, on {run['cpu_count']} CPUs shared with "
        f"other work (1-minute load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after). "
    )
    counted = run.get("instructions")
    if counted is not None:
        timed += _counted_section(counted)
    rows = run["rows"]
    sizes = sorted(rows, key=int)
    plain = statistics.median(statistics.mean(rows[s]["us_per_pair"][int(s) :]) for s in sizes)
    one = sum(rows[sizes[0]]["us_per_pair"][: int(sizes[0])]) if sizes[0] == "1" else None
    ratios = [rows[s]["p50_us_mixed"] / rows[s]["p50_us_standalone"] for s in sizes]
    return (
        f"{timed}\n### Timed: pairs/s, CPU, p50\n\n{run['heading']}.\n\n{run['table']}\n\n"
        "CPU per pair is `INFO cpu` (`used_cpu_sys` + `used_cpu_user`) over the timed window, less each "
        "server's idle rate measured just before, divided by the pairs; *share* is each primary's part of the "
        "cluster voter's sum. One client process drives every voter here, and it is the limit: pairs/s stays "
        "at what that client can do, whatever S, so the rows cannot show pairs/s growing with shards, and as S "
        "grows each primary gets fewer commands per wake-up (the column beside), so each wake-up's fixed cost "
        "is spread over fewer pairs: the timed CPU per pair of the sum rises with S while the instructions "
        "above do not, and do not move with the batch either (their last row), so the rise is what callgrind "
        "does not count: the kernel's side of each wake-up's `epoll_wait`, `read` and `write`, and the stalls of "
        "2 CPUs shared by more processes. A primary near a full core batches more per wake-up, not less. "
        f"The standalone voters' median here, {plain:.1f} µs of CPU per pair, is a conservative capacity of one "
        f"standalone voter core: about {round(1e6 / plain, -3):,.0f} pairs/s"
        + (
            f"; a Cluster voter's primary of 1 shard, {one:.1f} µs, about {round(1e6 / one, -3):,.0f} pairs/s per "
            "core, and a Cluster voter of S shards S times that (the instructions above)"
            if one
            else ""
        )
        + ". The uncontended p50 (one task, sequential, each pair on a fresh name) of the cluster voter with "
        "2 standalone ones is "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + " that of 3 standalone voters (S = "
        + ", ".join(sizes)
        + "); the cluster voter alone is "
        + ", ".join(f"{rows[s]['p50_us_cluster_alone'] / rows[s]['p50_us_standalone_alone']:.2f}x" for s in sizes)
        + " one standalone voter alone"
        + (
            f", and the {len(voters['sizes'])} Cluster voters together (of "
            f"{', '.join(map(str, voters['sizes']))} shards) {voters['p50_us_clusters']:.0f} µs against "
            f"{voters['p50_us_standalone']:.0f} µs for as many standalone voters: "
            f"{voters['p50_us_clusters'] / voters['p50_us_standalone']:.2f}x"
            if (voters := run.get("cluster_voters_p50"))
            else ""
        )
        + ". The Redlocks compared take turns pair by pair, so a change in the box's load meets them alike; "
        "under load the client's own CPU per pair (more for a cluster voter: its routing) weighs in these "
        "latencies.\n"
    )


def _counted_section(counted: dict[str, Any]) -> str:
    """The --instructions part: node instructions per pair under callgrind (no load moves them)."""
    rows = counted["rows"]
    sizes = [name for name in rows if name.isdigit()]
    sums = {name: sum(rows[name]["instructions_per_pair"]) for name in rows}
    low, high = min(sums[s] for s in sizes), max(sums[s] for s in sizes)
    text = (
        f"{counted['heading']}.\n\n{counted['table']}\n\n"
        "The names' slots spread the pairs evenly: each of S primaries runs 1/S of the commands and 1/S of "
        "the instructions. The cluster voter's instructions per pair, summed over its primaries, are "
        + " / ".join(f"{sums[s]:,.0f}" for s in sizes)
        + f" for S = {', '.join(sizes)}: {high / low - 1:.1%} apart at most ("
        + ", ".join(f"{sums[s] / sums[sizes[0]]:.3f}" for s in sizes)
        + f" of the {sizes[0]}-shard voter's), so the work per pair per voter stays as shards are added, and a "
        "Cluster voter of S shards spreads it over S primary cores: its capacity grows with S. Every primary is "
        "under callgrind (about 50 times slower), so the client keeps each one full: every read brings a batch "
        "of tens of commands."
    )
    small = [name for name in rows if not name.isdigit() and name != "standalone"]
    if small:
        name, size = small[0], small[0].split(",")[0]
        batch = statistics.mean(rows[name]["commands_per_read"])
        full = statistics.mean(rows[size]["commands_per_read"])
        text += (
            f" The last row runs the {size}-shard voter again with {rows[name]['tasks']} tasks in all: "
            f"{batch:.0f} commands per read against {full:.0f}, and {sums[name]:,.0f} instructions per pair "
            f"against {sums[size]:,.0f}."
        )
    if "standalone" in sums and "1" in sums:
        text += (
            f" A cluster voter's primary runs {sums['1'] / sums['standalone']:.2f}x a standalone server's "
            "instructions per pair (cluster mode's own cost: both run the native `DELIFEQ` release where the "
            "server has it and the user may run it, each shard primary asked on its own connection)."
        )
    return text + "\n"


def _replace(path: Path, begin: str, end: str, block: str) -> None:
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path.relative_to(ROOT)} has lost its markers {begin} and {end}: put them back")
    start, stop = text.index(begin), text.index(end) + len(end)
    path.write_text(text[:start] + block + text[stop:])


def write(figures: dict[str, Any]) -> None:
    PAGE.write_text(render_page(figures))
    _replace(SUMMARY, BEGIN, END, render_summary_block(figures))
    _replace(COMPARISON, MACHINE_BEGIN, MACHINE_END, render_comparison_section(figures))
    print(
        f"wrote {PAGE.relative_to(ROOT)}, {SUMMARY.relative_to(ROOT)}'s summary and "
        f"{COMPARISON.relative_to(ROOT)}'s reference section"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: print the table, write nothing")
    parser.add_argument("--render", action="store_true", help="re-render from docs/performance.json only")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(RUNS),
        default=[],
        metavar="NAME",
        help=f"run only this benchmark ({', '.join(RUNS)}; repeatable) and merge its figures into "
        f"{DATA.relative_to(ROOT)}, keeping the others",
    )
    args = parser.parse_args(argv)
    if args.render:
        if args.quick or args.only:
            parser.error("--render measures nothing: no --quick or --only with it")
        write(json.loads(DATA.read_text()))
        return 0
    only = list(dict.fromkeys(args.only))
    figures = measure(args.quick, only)
    if only:
        figures = merge(json.loads(DATA.read_text()), figures, only)
    elif DATA.exists():
        stored = json.loads(DATA.read_text())
        figures |= {key: stored[key] for key in KEPT if key in stored}
    print(_table(summary(figures)))
    print()
    print(_machine_table(figures, targets=True) if "machine" in (only or RUNS) else "")
    if not args.quick:
        DATA.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
        write(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
