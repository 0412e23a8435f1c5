#!/usr/bin/env python3
"""Benchmark: writing the `view` page (load + traced shapes + layout + SVG + HTML) against
ncnn's own `Net.load_param` of the same file, in one run.

    python tools/bench_view.py [--repeat 3] [--sizes 1000,5000] [--json out.json]

Graphs: the real-size Qwen3-TTS talker decoder fixture (850 layers) and synthetic residual
chains of the given sizes (`tools/bench.py`'s), the latter also with `--around` on a
100k-layer chain. Reported: best-of-N seconds, ncnn's load_param time, the ratio ours /
ncnn, and the page size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import paramsurgery  # noqa: E402
from bench_graphs import residual_chain  # noqa: E402
from paramsurgery.view.labels import blob_shapes  # noqa: E402
from paramsurgery.view.page import graph_page  # noqa: E402
from paramsurgery.view.scene import neighbourhood  # noqa: E402

REAL_TALKER = (Path(__file__).resolve().parent.parent / "fixtures" / "qwen3_tts" / "real"
               / "talker_decoder.ported.ncnn.param")


def best(fn, repeat: int) -> tuple[float, object]:
    """The least wall time of `repeat` calls of `fn`, and its last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def page_of(path: Path, around: str | None = None, depth: int = 10) -> str:
    g = paramsurgery.load(path)
    layers = neighbourhood(g, around, depth) if around else None
    return graph_page(g, layers=layers, shapes=blob_shapes(g))


def ncnn_load(path: Path) -> None:
    import ncnn

    net = ncnn.Net()
    assert net.load_param(str(path)) == 0
    net.clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="paramsurgery-bench-view-") as tmp:
        cases: list[tuple[str, Path, str | None]] = [("real talker decoder", REAL_TALKER, None)]
        for n in (int(s) for s in args.sizes.split(",") if s):
            p = Path(tmp) / f"chain{n}.param"
            p.write_text(residual_chain(n))
            cases.append((f"chain {n}", p, None))
        big = Path(tmp) / "chain100000.param"
        big.write_text(residual_chain(100000))
        cases.append(("chain 100000 --around conv_20000 --depth 10", big, "conv_20000"))
        for name, path, around in cases:
            t_ours, page = best(lambda p=path, a=around: page_of(p, a), args.repeat)
            t_ncnn, _ = best(lambda p=path: ncnn_load(p), args.repeat)
            row = {"graph": name, "layers": len(paramsurgery.load(path)), "page_s": t_ours,
                   "ncnn_load_param_s": t_ncnn, "ratio": t_ours / t_ncnn if t_ncnn else None,
                   "page_bytes": len(page)}
            rows.append(row)
            print(f"{name:<46} {row['layers']:>7} layers  page {t_ours:7.3f} s  "
                  f"ncnn load_param {t_ncnn:7.4f} s  ratio {row['ratio']:7.1f}x  "
                  f"{len(page) / 1e6:6.2f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
