#!/usr/bin/env python3
"""Benchmark: paramsurgery load / validate / save of synthetic graphs against ncnn's own
`Net.load_param` on the same files, in one run.

    python tools/bench.py [--sizes 10000,50000,100000] [--repeat 3] [--json out.json]

Graphs are residual chains (Split → Convolution → BinaryOp add per block), the shape of the
conv/attention stacks pnnx writes. Reported: best-of-N seconds per step, ncnn's time, the
ratio ncnn / ours (load+validate+save), and our scaling t(largest)/t(smallest).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paramsurgery  # noqa: E402


def residual_chain(n_layers: int) -> str:
    rows = ["%-24s %-24s 0 1 in0" % ("Input", "in0")]
    prev, i = "in0", 0
    while len(rows) < n_layers:
        s0, s1, c, o = f"{prev}_s0", f"{prev}_s1", f"c{i}", f"a{i}"
        rows.append("%-24s %-24s 1 2 %s %s %s" % ("Split", f"splitncnn_{i}", prev, s0, s1))
        rows.append("%-24s %-24s 1 1 %s %s 0=16 1=3 11=3 2=1 12=1 3=1 13=1 4=1 14=1 5=1 6=2304"
                    % ("Convolution", f"conv_{i}", s0, c))
        rows.append("%-24s %-24s 2 1 %s %s %s 0=0" % ("BinaryOp", f"add_{i}", s1, c, o))
        prev, i = o, i + 1
    rows = rows[:n_layers]
    blobs = set()
    for r in rows:
        t = r.split()
        blobs.update(t[4:4 + int(t[2]) + int(t[3])])
    return f"7767517\n{len(rows)} {len(blobs)}\n" + "\n".join(rows) + "\n"


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def bench(sizes: list[int], repeat: int) -> list[dict]:
    import ncnn

    rows = []
    with tempfile.TemporaryDirectory(prefix="paramsurgery-bench-") as tmp:
        for n in sizes:
            path = Path(tmp) / f"chain{n}.param"
            path.write_text(residual_chain(n))
            t_load, g = best(lambda: paramsurgery.load(path), repeat)
            t_val, findings = best(g.validate, repeat)
            assert not findings, findings[:3]
            out = Path(tmp) / "out.param"
            t_save, _ = best(lambda: g.save(out), repeat)
            assert out.read_bytes() == path.read_bytes()

            def ncnn_load():
                net = ncnn.Net()
                ret = net.load_param(str(path))
                assert ret == 0
                return net

            t_ncnn, _ = best(ncnn_load, 1 if n >= 50000 else repeat)
            ours = t_load + t_val + t_save
            rows.append({"layers": n, "load_s": t_load, "validate_s": t_val, "save_s": t_save,
                         "ours_total_s": ours, "ncnn_load_param_s": t_ncnn,
                         "speedup_vs_ncnn": t_ncnn / ours})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,50000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = bench(sizes, args.repeat)
    print(f"{'layers':>8} {'load':>8} {'validate':>9} {'save':>8} {'ours':>8} "
          f"{'ncnn':>8} {'ncnn/ours':>10}")
    for r in rows:
        print(f"{r['layers']:>8} {r['load_s']:8.3f} {r['validate_s']:9.3f} {r['save_s']:8.3f} "
              f"{r['ours_total_s']:8.3f} {r['ncnn_load_param_s']:8.3f} "
              f"{r['speedup_vs_ncnn']:9.1f}x")
    if len(rows) > 1:
        print(f"scaling: t({rows[-1]['layers']})/t({rows[0]['layers']}) = "
              f"{rows[-1]['ours_total_s'] / rows[0]['ours_total_s']:.1f} "
              f"for {rows[-1]['layers'] / rows[0]['layers']:.0f}x the layers")
    print(f"machine: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
