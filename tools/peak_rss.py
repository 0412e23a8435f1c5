#!/usr/bin/env python3
"""Peak memory of a command and every process it starts: the largest sum of RSS over the
process tree, sampled every --interval seconds from /proc (Linux), next to the weight bytes
it is compared with.

    python tools/peak_rss.py [--weights model.bin] [--interval 0.05] -- CMD ARGS...

Prints the peak (GB), the ratio to the size of --weights when given, and the command's exit
code (also returned). Shared pages of a memory-mapped file count once per process that maps
them, as RSS does. Also printed: the peak of the tree's PSS (each shared page divided among
the processes mapping it: the physical memory the tree takes; shared libraries of a parent
and its child count once), from /proc/PID/smaps_rollup.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pids(root: int) -> list[int]:
    kids = _children()
    out, work = [], [root]
    while work:
        pid = work.pop()
        out.append(pid)
        work.extend(kids.get(pid, ()))
    return out


def tree_rss(root: int) -> int:
    return sum(_rss_bytes(pid) for pid in tree_pids(root))


@dataclass
class Peak:
    """Peaks over a command's run (bytes), its exit code and wall seconds."""

    rss: int
    pss: int
    returncode: int
    seconds: float


def measure(cmd: Sequence[str], interval: float = 0.05, **popen) -> Peak:  # noqa: ANN003
    """Run `cmd` (Popen keyword arguments passed on) and sample its process tree until it
    exits."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), **popen)
    rss = pss = 0
    while proc.poll() is None:
        pids = tree_pids(proc.pid)
        rss = max(rss, sum(map(_rss_bytes, pids)))
        pss = max(pss, sum(map(_pss_bytes, pids)))
        time.sleep(interval)
    return Peak(rss, pss, proc.returncode, time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", help="the .bin whose size the peak is compared with")
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        ap.error("give the command after --")
    peak = measure(cmd, args.interval)
    line = f"peak RSS (process tree) {peak.rss / 1e9:.2f} GB (PSS {peak.pss / 1e9:.2f} GB)"
    if args.weights:
        w = os.path.getsize(args.weights)
        line += (f"; weights {w / 1e9:.2f} GB; peak / weights = {peak.rss / w:.2f} "
                 f"(PSS {peak.pss / w:.2f})")
    print(f"{line}; exit {peak.returncode}; {peak.seconds:.0f} s", file=sys.stderr)
    return peak.returncode


if __name__ == "__main__":
    sys.exit(main())
