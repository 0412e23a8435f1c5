#!/usr/bin/env python
"""Benchmark: load + save of a ≥ 1 GB `.bin` with one layer's weight replaced, against `cp`.

    python tools/bench_bin.py [--layers 16] [--dim 4096] [--dir /tmp] [--repeat 2]

Writes a param with an InnerProduct stack (default 16 × 4096×4096 fp32 = 1.07 GB) and its
synth-bin to a temporary directory outside the repo, then, alternating, `repeat` times:

- `cp` of the `.bin` (and `cp` + fsync, since paramsurgery's atomic save fsyncs);
- in a child process: `load(param, bin)`, replace the weight of the middle layer,
  `save(param2, bin2)`; the child reports its wall time and peak RSS (ru_maxrss). It runs
  twice: as is (the atomic save fsyncs both outputs) and with fsync disabled, the
  like-for-like comparison with a plain `cp`.

Prints the best times, the speed ratio (cp time / our time; goal ≥ 0.5) and the peak RSS
(goal < 300 MB), checks the output differs from the input only inside the replaced blob, and
deletes everything it wrote.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import os, resource, sys, time
sys.path.insert(0, {repo!r})
if {no_fsync!r}:
    os.fsync = lambda fd: None  # measure our work alone (paramsurgery's save fsyncs; cp does not)
t0 = time.perf_counter()
import numpy as np
from paramsurgery.formats.io import load, save
from paramsurgery.formats.weights import replace_weight
t1 = time.perf_counter()
g = load({param!r}, bin={bin!r})
layer = g.layer({name!r})
w = layer.weights["weight"]
replace_weight(layer, "weight", np.full(w.count, 0.5, np.float32))
save(g, {param2!r}, bin={bin2!r})
t2 = time.perf_counter()
print(t2 - t1, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, w.offset, w.nbytes)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--dir", default=None, help="scratch directory (default: system temp)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    sys.path.insert(0, str(REPO))
    from paramsurgery.formats.io import load
    from paramsurgery.formats.weights.synth import write_synth_bin

    tmp = Path(tempfile.mkdtemp(prefix="bench_bin.", dir=args.dir))
    try:
        d, n = args.dim, args.layers
        lines = ["Input in 0 1 x0"]
        for i in range(n):
            lines.append(f"InnerProduct fc{i} 1 1 x{i} x{i + 1} 0={d} 1=1 2={d * d}")
        param = tmp / "big.param"
        param.write_text(f"7767517\n{len(lines)} {n + 1}\n" + "\n".join(lines) + "\n")
        binp = tmp / "big.bin"
        t = time.perf_counter()
        with open(binp, "wb") as fh:
            size = write_synth_bin(load(param), fh, seed=0)
        synth_s = time.perf_counter() - t
        print(f"synth-bin: {size / 1e9:.3f} GB in {synth_s:.1f} s  ({binp})")

        cp_s, cps_s, ours_s, nofs_s, rss = [], [], [], [], []
        info = None
        for _ in range(args.repeat):
            dst = tmp / "copy.bin"
            t = time.perf_counter()
            subprocess.run(["cp", str(binp), str(dst)], check=True)
            cp_s.append(time.perf_counter() - t)
            dst.unlink()
            t = time.perf_counter()
            subprocess.run(["cp", str(binp), str(dst)], check=True)
            fd = os.open(dst, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            cps_s.append(time.perf_counter() - t)
            dst.unlink()

            for no_fsync in (True, False):
                code = CHILD.format(repo=str(REPO), param=str(param), bin=str(binp),
                                    name=f"fc{n // 2}", param2=str(tmp / "out.param"),
                                    bin2=str(tmp / "out.bin"), no_fsync=no_fsync)
                t = time.perf_counter()
                out = subprocess.run([sys.executable, "-c", code], check=True,
                                     capture_output=True, text=True).stdout.split()
                wall = time.perf_counter() - t
                (nofs_s if no_fsync else ours_s).append(float(out[0]))
                rss.append(int(out[1]) / 1024)
                info = (int(out[2]), int(out[3]), wall)
                if no_fsync or _ < args.repeat - 1:
                    (tmp / "out.bin").unlink()

        off, nbytes, wall = info
        a, b = binp, tmp / "out.bin"
        assert a.stat().st_size == b.stat().st_size
        with open(a, "rb") as fa, open(b, "rb") as fb:
            same_before = fa.read(off) == fb.read(off)
            fa.seek(off + nbytes)
            fb.seek(off + nbytes)
            same_after = True
            while True:
                x, y = fa.read(8 << 20), fb.read(8 << 20)
                if x != y:
                    same_after = False
                    break
                if not x:
                    break
        best_cp, best_cps, best = min(cp_s), min(cps_s), min(ours_s)
        gbs = size / 1e9
        print(f"cp:                 {best_cp:.3f} s  ({gbs / best_cp:.2f} GB/s)  runs {cp_s}")
        print(f"cp + fsync:         {best_cps:.3f} s  ({gbs / best_cps:.2f} GB/s)  runs {cps_s}")
        print(f"load+replace+save:  {best:.3f} s  ({size / best / 1e9:.2f} GB/s)  runs {ours_s} "
              f"(child wall incl. interpreter start {wall:.3f} s)")
        best_nofs = min(nofs_s)
        print(f"  same, no fsync:   {best_nofs:.3f} s  ({gbs / best_nofs:.2f} GB/s)  runs {nofs_s}")
        print(f"speed vs cp:        {best_cp / best:.2f}x   (goal >= 0.5; both without fsync: "
              f"{best_cp / best_nofs:.2f}x)")
        print(f"speed vs cp+fsync:  {best_cps / best:.2f}x")
        print(f"peak RSS:           {max(rss):.0f} MB   (goal < 300 MB)")
        print(f"bytes outside the replaced blob unchanged: {same_before and same_after}")
        return 0 if same_before and same_after else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
