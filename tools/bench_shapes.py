#!/usr/bin/env python3
"""Benchmark: the shape analysis.

    python tools/bench_shapes.py [--sizes 10000,50000,100000] [--repeat 3] [--no-oracle]

1. Static propagation (`Graph.shapes`, params parsed on first use, so the first analysis of
   a freshly loaded graph is what is timed) on residual chains (Split → Convolution →
   BinaryOp add per block, `tools/bench.py`'s graphs) with `--inputshape in0=[16,32,32]`,
   against ncnn's own `Net.load_param` on the same file in the same run; linear if
   t(largest)/t(smallest) ≈ the size ratio.
2. The ncnn-oracle path on the real-size Qwen3-TTS talker decoder (850 layers, 1127 blobs,
   zero weights): seconds for the three runs in one child process (T = 16, 19, 23), and
   how many blobs it fitted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import paramsurgery  # noqa: E402
from bench import best, residual_chain  # noqa: E402
from paramsurgery.analysis.shapes import infer_shapes  # noqa: E402


def static_rows(sizes: list[int], repeat: int) -> list[dict]:
    import ncnn

    rows = []
    with tempfile.TemporaryDirectory(prefix="paramsurgery-bench-shapes-") as tmp:
        for n in sizes:
            path = Path(tmp) / f"chain{n}.param"
            path.write_text(residual_chain(n))
            times = []
            for _ in range(repeat):
                g = paramsurgery.load(path)
                t0 = time.perf_counter()
                sm = infer_shapes(g, inputshape={"in0": (16, 32, 32)})
                times.append(time.perf_counter() - t0)
            known = sum(1 for b in g.blob_names() if sm.known(b) is not None)

            def ncnn_load():
                net = ncnn.Net()
                assert net.load_param(str(path)) == 0
                return net

            t_ncnn, _ = best(ncnn_load, 1 if n >= 50000 else repeat)
            rows.append({"layers": n, "shapes_s": min(times), "known_blobs": known,
                         "blobs": g.blob_count(), "ncnn_load_param_s": t_ncnn})
    return rows


def oracle_row() -> dict:
    from paramsurgery.analysis.shapes import parse_inputshape
    from paramsurgery.analysis.shapes.oracle import oracle_shapes

    path = ROOT / "fixtures/qwen3_tts/real/talker_decoder.ported.ncnn.param"
    g = paramsurgery.load(path)
    spec = parse_inputshape("in0=[T,1024] in1=[1,T,T] in2=[T,128] in3=[T,128]")
    t0 = time.perf_counter()
    static = infer_shapes(g, inputshape=spec)
    t_static = time.perf_counter() - t0
    t0 = time.perf_counter()
    fitted = oracle_shapes(g, spec, static=static)
    t_oracle = time.perf_counter() - t0
    return {"layers": len(g), "blobs": len(g.blob_names()), "static_s": t_static,
            "oracle_s": t_oracle, "fitted": len(fitted.shapes),
            "not_affine": len(fitted.not_affine), "disagreements": len(fitted.notes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,50000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-oracle", action="store_true")
    args = ap.parse_args()
    rows = static_rows([int(s) for s in args.sizes.split(",")], args.repeat)
    print(f"{'layers':>8} {'shapes':>8} {'known/blobs':>13} {'ncnn load':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['layers']:>8} {r['shapes_s']:8.3f} {r['known_blobs']:>6}/{r['blobs']:<6} "
              f"{r['ncnn_load_param_s']:10.3f} {r['shapes_s'] / r['ncnn_load_param_s']:6.2f}x")
    if len(rows) > 1:
        print(f"scaling: t({rows[-1]['layers']})/t({rows[0]['layers']}) = "
              f"{rows[-1]['shapes_s'] / rows[0]['shapes_s']:.1f} for "
              f"{rows[-1]['layers'] / rows[0]['layers']:.0f}x the layers")
    if not args.no_oracle:
        o = oracle_row()
        print(f"oracle, real talker decoder ({o['layers']} layers, {o['blobs']} blobs): "
              f"static {o['static_s']:.3f} s, ncnn oracle {o['oracle_s']:.1f} s for 3 runs "
              f"(one child, zero weights); fitted {o['fitted']}, not affine "
              f"{o['not_affine']}, static disagreements {o['disagreements']}")
    print(f"machine: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
