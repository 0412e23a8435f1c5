#!/usr/bin/env python3
"""CLI start time: `paramsurgery --version` and `paramsurgery lint` of a 10-layer file against
`python -c "import numpy, networkx"` (the floor: every command needs both), repeated runs
like hyperfine, measured in the same run.

    python tools/startup.py [--runs 20] [--warmup 3]

Reported per command: min / median wall seconds and the ratio of medians to the floor.
Goal (issue 15): both within 1.5x of the floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_graphs import residual_chain  # noqa: E402


def timed_runs(cmd: list[str], runs: int, warmup: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for _ in range(warmup):  # also writes the .pyc files a user's install has
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        out.append(time.perf_counter() - t0)
        if r.returncode not in (0, 1):  # lint exits 1 on error findings
            raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="paramsurgery-startup-") as tmp:
        small = Path(tmp) / "ten.param"
        small.write_text(residual_chain(10))
        cmds = {
            "import numpy, networkx": [py, "-c", "import numpy, networkx"],
            "paramsurgery --version": [py, "-m", "paramsurgery", "--version"],
            "paramsurgery lint (10 layers)": [py, "-m", "paramsurgery", "lint", "--no-run",
                                              str(small)],
        }
        # interleave the commands so a burst of load on a shared machine hits all of them
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for k, c in cmds.items():
                times[k].extend(timed_runs(c, 1, args.warmup if not times[k] else 0))
    floor = statistics.median(times["import numpy, networkx"])
    print(f"{'command':<32} {'min':>8} {'median':>8} {'ratio':>7}")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:<32} {min(ts):8.3f} {med:8.3f} {med / floor:6.2f}x")
    print(f"{args.runs} runs each, interleaved; machine: {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
