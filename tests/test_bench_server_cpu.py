"""benchmarks/bench_server_cpu.py --cluster-shards keeps working: a short run of 1 and 2 shards, its table
checked (every size has a row; the pairs' commands split over the 2 primaries; figures, not speed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 10 s: the developer loop (-m 'not slow') leaves it out

ROOT = Path(__file__).resolve().parent.parent


def test_cluster_shards_quick_run_prints_a_row_per_size() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_server_cpu.py",
            "--cluster-shards",
            "1,2",
            "--seconds",
            "0.3",
            "--rounds",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {
        int(cells[0]): cells
        for line in done.stdout.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])[0].isdigit()
    }
    assert sorted(rows) == [1, 2], done.stdout
    assert float(rows[1][1]) > 0, rows  # pairs/s
    assert float(rows[2][1]) > 0, rows
    assert rows[1][3] == "1.00"
    # Every pair's commands go to the primary of its name's slot: with many fresh names, each of the 2
    # primaries gets about half (the 1-shard voter's count split in two).
    whole = float(rows[1][4])
    halves = [float(text) for text in rows[2][4].split("/")]
    assert whole > 0, rows
    assert len(halves) == 2, rows
    assert all(0.3 * whole <= half <= 0.7 * whole for half in halves), rows
