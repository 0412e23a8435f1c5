#!/usr/bin/env python3
"""Peak memory of a command and every process it starts: the largest sum of RSS over the
process tree, sampled every --interval seconds from /proc (Linux), next to the weight bytes
it is compared with.

    python tools/peak_rss.py [--weights model.bin] [--interval 0.05] -- CMD ARGS...

Prints the peak (GB), the ratio to the size of --weights when given, and the command's exit
code (also returned). Shared pages of a memory-mapped file count once per process that maps
them, as RSS does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


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


def tree_rss(root: int) -> int:
    kids = _children()
    total, work = 0, [root]
    while work:
        pid = work.pop()
        total += _rss_bytes(pid)
        work.extend(kids.get(pid, ()))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", help="the .bin whose size the peak is compared with")
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        ap.error("give the command after --")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(args.interval)
    wall = time.perf_counter() - t0
    line = f"peak RSS (process tree) {peak / 1e9:.2f} GB"
    if args.weights:
        w = os.path.getsize(args.weights)
        line += f"; weights {w / 1e9:.2f} GB; peak / weights = {peak / w:.2f}"
    print(f"{line}; exit {proc.returncode}; {wall:.0f} s", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
