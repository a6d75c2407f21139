"""benchmarks/bench_machine.py keeps working: a quick run on asyncio, its JSON checked (figures, not speed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds each: the developer loop (-m 'not slow') leaves them out

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("machine", "redlock_async")
FIGURES = (
    "throughput_64_pairs_per_s",
    "throughput_512_pairs_per_s",
    "cpu_us_per_pair_64",
    "cpu_us_per_pair_512",
    "cycle_p50_us",
    "cycle_p99_us",
)


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_bench_machine_quick_run_reports_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "machine.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_machine.py", "--quick", "--loop", "asyncio", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["environment"]["loop"] == "asyncio"
    assert data["ok"] is True
    for side in SIDES:
        for name in FIGURES:
            assert _positive(data["medians"][side][name]), (side, name, data["medians"][side])
    for name in FIGURES:
        assert _positive(data["ratios"][name]), (name, data["ratios"])
    assert set(data["met"]) == {"throughput_64_pairs_per_s", "throughput_512_pairs_per_s", "cpu_us_per_pair_64"}
    assert len(data["rounds"]) == data["config"]["rounds"] >= 2
    # Every task had a resource of its own: none of the machine's acquires may fail, in any op, and
    # no node may refuse one of redlock_async's (a lease left behind). redlock_async may give up on
    # nodes past its node timeout when 512 tasks make its loop lag: counted apart, not asserted here.
    assert data["failures"]["machine"] == {"acquire": 0, "lost": 0}
    ours = data["failures"]["redlock_async"]
    assert ours["refused"] == 0, ours
    assert ours["acquire"] == ours["timed_out"], ours
    for round_ in data["rounds"]:
        for side in SIDES:
            loads = round_["sides"][side]["loads"]
            assert [load["tasks"] for load in loads] == [64, 512]
            assert all(load["ops"] > 0 for load in loads)
        machine = round_["sides"]["machine"]
        assert machine["latency"]["failures"] == 0
        assert all(load["failures"] == 0 for load in machine["loads"])
    # The reference really excludes: contenders on one resource got grants, never two at once.
    for side in SIDES:
        exclusion = data["exclusion"][side]
        assert exclusion["grants"] > 0, exclusion
        assert exclusion["overlaps"] == 0, exclusion
    assert data["keys_left"] == [0] * 5
