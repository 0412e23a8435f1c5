#!/usr/bin/env python3
"""Per-pass scaling: each pass run on graphs built to give it N and 10N sites (the layers it
rewrites), in one run; reported: CPU seconds at each size (the best of --repeat rounds; in
a round the sizes are interleaved and a smaller size's sample is the mean of 10N/N runs, so
every sample lasts about as long under the same machine load) and t(10N)/t(N). Linear
passes give ~10; a per-site walk that rescans the graph gives ~100. `shapes (static)` is the
shape analysis' static path (`infer_shapes`, symbolic inputs) on the decoder.

    python tools/bench_passes.py [--sites 1000,10000] [--repeat 3] [--only add-kvcache,...]

Each case builds its graph from a site template repeated N times (tools/bench_graphs.py for
the decoder); a pass is timed as a user calls it (`Pass()(g)`: copy, requires, run,
ensures), with the graph's load outside the timing. Goal (issue 15): t(10N)/t(N) <= 11.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import paramsurgery  # noqa: E402
from bench_graphs import DECODER_BLOCK_LAYERS, decoder  # noqa: E402
from paramsurgery.graph import Graph  # noqa: E402


def _text(rows: list[str]) -> str:
    blobs: set[str] = set()
    for r in rows:
        t = r.split()
        blobs.update(t[4:4 + int(t[2]) + int(t[3])])
    return f"7767517\n{len(rows)} {len(blobs)}\n" + "\n".join(rows) + "\n"


def relu_chain(n: int, type_: str = "ReLU", params: str = "") -> str:
    rows = ["Input in0 0 1 in0 0=16 1=8"]
    prev = "in0"
    for i in range(n):
        rows.append(f"{type_} l{i} 1 1 {prev} b{i}{params}")
        prev = f"b{i}"
    rows.append(f"ReLU last 1 1 {prev} out0")  # the graph output is no chain layer's top
    return _text(rows)


DECODER_INPUTS = {"in0": ("T", 1024), "in1": (1, "T", "T"), "in2": ("T", 128),
                  "in3": ("T", 128)}


def decoder_graph(sites: int) -> Graph:
    return paramsurgery.loads(decoder(10 + sites * DECODER_BLOCK_LAYERS))


def gqa_expanded(sites: int) -> Graph:
    from paramsurgery.passes.fold_gqa import expand_gqa

    g = decoder_graph(sites)
    expand_gqa(g)
    return paramsurgery.loads(g.dumps())


def stacked_reductions(sites: int) -> Graph:
    """`torch.stack(...).sum(0)` as pnnx writes it (Concat 0=-233 + Reduction -23303=0)."""
    rows = []
    for i in range(sites):
        rows += [f"Input a{i} 0 1 a{i}", f"Input b{i} 0 1 b{i}",
                 f"Concat stack_{i} 2 1 a{i} b{i} s{i} 0=-233",
                 f"Reduction red_{i} 1 1 s{i} out{i} 0=0 1=0 -23303=0 4=0 5=1"]
    return paramsurgery.loads(_text(rows))


def paramless_slices(sites: int) -> Graph:
    """`torch.unbind` along a batch axis pnnx inferred: Slice without params, shape hint on
    the Input (what fix-slice restores the slices from)."""
    rows = []
    for i in range(sites):
        rows += [f"Input in{i} 0 1 in{i} 0=6 1=4 2=2", f"Slice unbind_{i} 1 2 in{i} p{i} q{i}",
                 f'Reshape r{i}_0 1 1 p{i} out{i}_0 6="0w,0h"',
                 f'Reshape r{i}_1 1 1 q{i} out{i}_1 6="0w,0h"']
    return paramsurgery.loads(_text(rows))


def codebook_sum(sites: int) -> Graph:
    """`sites` Embeds, one id input each, summed by a chain of BinaryOp adds (one group: the
    pass fuses them into one Embed over the concatenated tables)."""
    rows, prev = [], None
    for i in range(sites):
        rows += [f"Input ids{i} 0 1 ids{i}", f"Embed emb_{i} 1 1 ids{i} e{i} 0=4 1=8 2=0 3=32"]
        if prev is not None:
            rows.append(f"BinaryOp add_{i} 2 1 {prev} e{i} s{i} 0=0")
            prev = f"s{i}"
        else:
            prev = f"e{i}"
    return paramsurgery.loads(_text(rows))


STATIC_LEN = 10  # the traced length of the static export dynamize rewrites


def static_crops(sites: int) -> Graph:
    """A static export's `x[..., :L-1]` per site: Crop with an absolute end at the traced
    length (what dynamize makes relative to the end)."""
    rows = []
    for i in range(sites):
        rows += [f"Input in{i} 0 1 in{i}",
                 f"Crop crop_{i} 1 1 in{i} out{i} -23310=1,{STATIC_LEN - 1} -23311=1,1 "
                 f"-23309=1,0"]
    return paramsurgery.loads(_text(rows))


def static_crops_traced(sites: int) -> list:
    """pnnx's traced ops for `static_crops` (what `X.pnnx.param` would give)."""
    from paramsurgery.passes._traced import PnnxOp

    shape = ((1, 3, STATIC_LEN), "f32")
    ops = []
    for i in range(sites):
        ops.append(PnnxOp("pnnx.Input", f"in{i}", [], [f"x{i}"], {}, {}, {}, 2 * i + 3,
                          shapes={f"x{i}": shape}))
        ops.append(PnnxOp("Tensor.slice", f"Tensor.slice_{i}", [f"x{i}"], [f"y{i}"],
                          {"dim": "2", "start": "0", "end": str(STATIC_LEN - 1)}, {}, {},
                          2 * i + 4, shapes={f"x{i}": shape}))
    return ops


def cases() -> dict[str, tuple[Callable[[int], Graph], Callable[[Graph, int], Any]]]:
    from paramsurgery.passes.dynamize import Dynamize
    from paramsurgery.passes.extract import Extract
    from paramsurgery.passes.fix_reduction import FixReduction
    from paramsurgery.passes.fix_slice import FixSlice
    from paramsurgery.passes.fold_gqa import FoldGQA
    from paramsurgery.passes.fuse_codebooks import FuseCodebooks
    from paramsurgery.passes.io_edits import RenameBlobs
    from paramsurgery.passes.kvcache import AddKVCache
    from paramsurgery.passes.lower import Lower
    from paramsurgery.passes.passthrough import RemovePassthrough

    return {
        "add-kvcache": (decoder_graph, lambda g, n: AddKVCache()),
        "fold-gqa": (gqa_expanded, lambda g, n: FoldGQA()),
        "fuse-codebooks": (codebook_sum, lambda g, n: FuseCodebooks()),
        "fix-reduction": (stacked_reductions, lambda g, n: FixReduction()),
        "fix-slice": (paramless_slices, lambda g, n: FixSlice()),
        "remove-passthrough": (lambda n: paramsurgery.loads(relu_chain(n, "Noop")),
                               lambda g, n: RemovePassthrough()),
        "dynamize": (static_crops,
                     lambda g, n: Dynamize(STATIC_LEN, traced=static_crops_traced(n))),
        "lower": (lambda n: paramsurgery.loads(relu_chain(n, "F.softsign")),
                  lambda g, n: Lower()),
        "rename-blobs": (lambda n: paramsurgery.loads(relu_chain(n)),
                         lambda g, n: RenameBlobs({f"b{i}": f"r{i}" for i in range(n)})),
        "extract": (lambda n: paramsurgery.loads(relu_chain(n + 10)),
                    lambda g, n: Extract(["b4"], [f"b{n + 4}"])),
        "shapes (static)": (decoder_graph, lambda g, n: StaticShapes(DECODER_INPUTS)),
    }


def bench(name: str, sizes: list[int], repeat: int) -> dict:
    """Rounds with the sizes interleaved (each sees the same machine load); a sample of a
    smaller size is the mean of `largest / n` runs, so samples of every size last about as
    long; the best sample of the rounds per size."""
    build, make = cases()[name]
    row: dict = {"pass": name}
    graphs = {n: build(n) for n in sizes}
    best: dict[int, float] = {}
    for _ in range(repeat):
        for n in sizes:
            g, inner, total = graphs[n], max(1, sizes[-1] // n), 0.0
            for _ in range(inner):
                p = make(g, n)
                t0 = time.process_time()
                res = p(g)
                total += time.process_time() - t0
                assert res.modified, f"{name} changed nothing at {n} sites"
            best[n] = min(best.get(n, total / inner), total / inner)
    for n in sizes:
        row[n] = best[n]
        row[f"layers_{n}"] = len(graphs[n])
    return row


class StaticShapes:
    """The shape analysis' static path as a bench case (not a pass: it changes nothing)."""

    def __init__(self, inputshape: dict) -> None:
        self.inputshape = inputshape

    def __call__(self, g: Graph) -> SimpleNamespace:
        from paramsurgery.shapes import infer_shapes

        sm = infer_shapes(g, self.inputshape)
        return SimpleNamespace(modified=len(sm.shapes) >= len(g))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", default="1000,10000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", help="comma-separated pass names")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sites.split(",")]
    names = args.only.split(",") if args.only else list(cases())
    lo, hi = sizes[0], sizes[-1]
    print(f"{'pass':<20} {'layers':>9} {'t(' + str(lo) + ')':>10} {'layers':>9} "
          f"{'t(' + str(hi) + ')':>10} {'ratio':>7}")
    for name in names:
        r = bench(name, sizes, args.repeat)
        print(f"{name:<20} {r['layers_' + str(lo)]:>9} {r[lo]:10.3f} {r['layers_' + str(hi)]:>9} "
              f"{r[hi]:10.3f} {r[hi] / r[lo]:7.1f}", flush=True)
    print(f"sites x{hi / lo:.0f}; CPU seconds: best of {args.repeat} rounds, a round's sample "
          f"at {lo} sites the mean of {hi // lo} runs; machine: {os.cpu_count()} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
