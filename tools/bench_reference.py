#!/usr/bin/env python3
"""The machine's own scaling, the reference for t(10N)/t(N) figures: a walk that is linear by
construction, shaped like a graph copy (per layer a small object with a dict of params and
lists of blob names; blobs and names indexed in dicts), timed like tools/bench_passes.py — CPU
seconds of the first run in a fresh process, a smaller size's sample the mean of
`min(5, 10N/n)` runs, the best of `--repeat` rounds with the sizes interleaved.

    python tools/bench_reference.py [--layers 30000,300000] [--repeat 3]

On a 2-core machine shared with other jobs the ratio comes out above 10 (memory: the larger
heap misses the caches more often per object), so a pass whose ratio is close to this one's
does no more than linear work; its `--profile` calls ratio (bench_passes.py) says so exactly.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time


class _Layer:
    __slots__ = ("name", "inputs", "outputs", "params")

    def __init__(self, name: str, inputs: list[str], outputs: list[str], params: dict) -> None:
        self.name, self.inputs, self.outputs, self.params = name, inputs, outputs, params


def linear_copy(n: int) -> float:
    """CPU seconds of one copy of an n-layer chain-shaped structure (built outside the
    timing, with the collector off as our passes run)."""
    gc.disable()
    layers = {i: _Layer(f"l{i}", [f"b{i}"], [f"b{i + 1}"], {0: i, 1: 2.0, 2: "x"})
              for i in range(n)}
    producer = {layer.outputs[0]: i for i, layer in layers.items()}
    t0 = time.process_time()
    copied = {i: _Layer(layer.name, list(layer.inputs), list(layer.outputs), dict(layer.params))
              for i, layer in layers.items()}
    consumers: dict[str, list[tuple[int | None, int]]] = {}
    for i, layer in copied.items():
        for b in layer.inputs:
            consumers.setdefault(b, []).append((producer.get(b), i))
    by_name = {layer.name: i for i, layer in copied.items()}
    dt = time.process_time() - t0
    assert len(by_name) == n
    return dt


def fresh_run(n: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", str(n)], check=True,
                         capture_output=True, text=True).stdout
    return float(json.loads(out.splitlines()[-1]))


def reference_ratio(sizes: list[int], repeat: int) -> dict[int, float]:
    """Best sample per size (see the module docstring)."""
    best: dict[int, float] = {}
    for _ in range(repeat):
        for n in sizes:
            k = max(1, min(5, sizes[-1] // n))
            t = sum(fresh_run(n) for _ in range(k)) / k
            best[n] = min(best.get(n, t), t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="30000,300000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(linear_copy(args.child)))
        return 0
    sizes = [int(s) for s in args.layers.split(",")]
    best = reference_ratio(sizes, args.repeat)
    lo, hi = sizes[0], sizes[-1]
    print(f"linear copy: t({lo}) {best[lo]:.4f}  t({hi}) {best[hi]:.4f}  "
          f"ratio {best[hi] / best[lo]:.1f} for x{hi / lo:.0f} the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
