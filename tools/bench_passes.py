#!/usr/bin/env python3
"""Per-pass scaling: each pass run on graphs built to give it N and 10N sites (the layers it
rewrites), in one run; reported: CPU seconds at each size and t(10N)/t(N). Linear passes give
~10; a per-site walk that rescans the graph gives ~100. `shapes (static)` is the shape
analysis' static path (`infer_shapes`, symbolic inputs) on the decoder.

    python tools/bench_passes.py [--sites 1000,10000] [--repeat 3] [--only add-kvcache,...]
                                 [--profile]

Every timed run is the first run of the pass on its graph in a fresh process, at every size,
as a user's command runs once: the child loads the graph (built once by the parent; outside
the timing), pays the imports and first calls on a 10-site graph, then times one
`Pass()(g)` (copy, requires, run, ensures). `--repeat` rounds interleave the sizes (each
sees the same machine load); a sample of a smaller size is the mean of `min(5, 10N/n)` such
runs, so samples of both sizes last about as long and meet the same mix of quiet and busy
moments (the best of many short runs would catch only the quiet ones); reported is the best
sample per size. (A sample of a smaller size was once the mean of 10N/n runs in one process
that also held the larger graph: its later runs found the heap grown by the earlier ones,
and the larger graph's objects interleaved with its own, which the larger size's single run
did not.)
Also reported: `ref`, the machine's own ratio for a walk that is linear by construction over
as many layers, timed the same way in the same run (tools/bench_reference.py: above 10 when
the larger heap misses the caches more often), and the cyclic collector's collections during
the timed run at each size (`gc`: generation 0/1/2 counts; passes pause the collector, so a
count is one the pause missed).
`--profile`: one profiled run per size instead, printing for the functions costing most at
10N their own time and calls at both sizes and the ratios (a walk that rescans the graph
shows a calls ratio above 10; a time ratio above 10 at a calls ratio of 10 is a cost per call
that grows with the heap).
Goal (issue 15): t(10N)/t(N) <= 11.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import paramsurgery  # noqa: E402
from bench_graphs import DECODER_BLOCK_LAYERS, decoder  # noqa: E402
from paramsurgery.ir.graph import Graph  # noqa: E402
from paramsurgery.formats.param_text import dumps


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
    return paramsurgery.loads(dumps(g))


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
    from paramsurgery.formats.pnnx_traced import PnnxOp

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


WARMUP_SITES = 10  # the graph a child runs its pass on first (imports, first calls)
PROFILE_TOP = 25  # functions listed per pass by --profile


def graph_file(name: str, n: int, tmp: str) -> str:
    """The case's n-site graph, built once and written for the children to load (a load
    is what a user's command starts with; building in every child would cost more)."""
    path = Path(tmp) / f"{name.replace(' ', '_')}-{n}.param"
    if not path.exists():
        path.write_text(dumps(cases()[name][0](n)))
    return str(path)


def child_main(name: str, n: int, path: str, profile_out: str | None) -> int:
    """One run: the pass's first run on its n-site graph (loaded from `path`) in this fresh
    process; prints the CPU seconds, the layer count and the collector's collections as
    JSON."""
    build, make = cases()[name]
    warm = build(WARMUP_SITES)
    make(warm, WARMUP_SITES)(warm)
    del warm
    g = paramsurgery.load(path)
    p = make(g, n)
    collections = [0, 0, 0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    gc.callbacks.append(count)
    if profile_out:
        prof = cProfile.Profile()
        t0 = time.process_time()
        res = prof.runcall(p, g)
        dt = time.process_time() - t0
        prof.dump_stats(profile_out)
    else:
        t0 = time.process_time()
        res = p(g)
        dt = time.process_time() - t0
    gc.callbacks.remove(count)
    assert res.modified, f"{name} changed nothing at {n} sites"
    print(json.dumps({"t": dt, "layers": len(g), "gc": collections}))
    return 0


def child_run(name: str, n: int, tmp: str, profile_out: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", f"{name}:{n}", "--graph", graph_file(name, n, tmp)]
    if profile_out:
        cmd += ["--profile-out", profile_out]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def bench(name: str, sizes: list[int], repeat: int, tmp: str) -> dict:
    """Rounds with the sizes interleaved (each sees the same machine load). Every run is a
    fresh process's first run; a sample of a smaller size is the mean of `min(5, largest /
    n)` such runs, so samples of every size last about as long and meet the same mix of
    quiet and busy moments (the best of many short runs would catch only the quiet ones);
    the best sample of the rounds per size."""
    row: dict = {"pass": name}
    for _ in range(repeat):
        for n in sizes:
            runs = [child_run(name, n, tmp) for _ in range(max(1, min(5, sizes[-1] // n)))]
            t = sum(r["t"] for r in runs) / len(runs)
            if n not in row or t < row[n]:
                row[n] = t
                row[f"gc_{n}"] = [max(r["gc"][k] for r in runs) for k in range(3)]
            row[f"layers_{n}"] = runs[0]["layers"]
            row[f"runs_{n}"] = len(runs)
    return row


def profile(name: str, sizes: list[int], tmp: str) -> None:
    """Own time and calls per function at the smallest and largest size, one profiled
    sample each: a walk that rescans the graph shows as a calls ratio > 10, a cost per call
    that grows with the graph (memory) as a time ratio > 10 at a calls ratio of 10."""
    own: dict[int, dict[str, tuple[float, int]]] = {}
    for n in (sizes[0], sizes[-1]):
        out = str(Path(tmp) / f"{n}.prof")
        child_run(name, n, tmp, profile_out=out)
        stats = pstats.Stats(out).stats  # type: ignore[attr-defined]
        own[n] = {f"{Path(k[0]).name}:{k[1]}:{k[2]}": (v[2], v[1]) for k, v in stats.items()}
    lo, hi = own[sizes[0]], own[sizes[-1]]
    print(f"{name}: own CPU seconds and calls per function (profiled) at {sizes[-1]} and "
          f"{sizes[0]} sites, their ratios; the top {PROFILE_TOP} at {sizes[-1]}")
    print(f"  {'t(' + str(sizes[-1]) + ')':>9} {'t(' + str(sizes[0]) + ')':>9} {'ratio':>7} "
          f"{'calls':>9} {'ratio':>7}")
    for fn in sorted(hi, key=lambda f: hi[f][0], reverse=True)[:PROFILE_TOP]:
        (t_hi, c_hi), (t_lo, c_lo) = hi[fn], lo.get(fn, (0.0, 0))
        ratios = (f"{t_hi / t_lo:7.1f}" if t_lo else "      -",
                  f"{c_hi / c_lo:7.1f}" if c_lo else "      -")
        print(f"  {t_hi:9.3f} {t_lo:9.4f} {ratios[0]} {c_hi:>9} {ratios[1]}  {fn}")
    t_hi, t_lo = sum(v[0] for v in hi.values()), sum(v[0] for v in lo.values())
    print(f"  {t_hi:9.3f} {t_lo:9.4f} {t_hi / t_lo:7.1f}  (all)", flush=True)


class StaticShapes:
    """The shape analysis' static path as a bench case (not a pass: it changes nothing)."""

    def __init__(self, inputshape: dict) -> None:
        self.inputshape = inputshape

    def __call__(self, g: Graph) -> SimpleNamespace:
        from paramsurgery.analysis.shapes import infer_shapes

        sm = infer_shapes(g, self.inputshape)
        return SimpleNamespace(modified=len(sm.shapes) >= len(g))


def table(names: list[str], sizes: list[int], repeat: int, tmp: str) -> None:
    """The scaling table; `ref`: the machine's ratio for a walk linear by construction over
    as many layers (tools/bench_reference.py), measured in the same run the same way."""
    from bench_reference import reference_ratio

    lo, hi = sizes[0], sizes[-1]
    print(f"{'pass':<20} {'layers':>9} {'t(' + str(lo) + ')':>10} {'layers':>9} "
          f"{'t(' + str(hi) + ')':>10} {'ratio':>7} {'ref':>6}  {'gc(' + str(lo) + ')':>9} "
          f"{'gc(' + str(hi) + ')':>9}")
    runs: dict[int, int] = {}
    refs: dict[tuple[int, int], float] = {}
    for name in names:
        r = bench(name, sizes, repeat, tmp)
        runs = {n: r[f"runs_{n}"] for n in sizes}
        layers = (r[f"layers_{lo}"], r[f"layers_{hi}"])
        if layers not in refs:
            best = reference_ratio(list(layers), repeat)
            refs[layers] = best[layers[1]] / best[layers[0]]
        print(f"{name:<20} {layers[0]:>9} {r[lo]:10.3f} {layers[1]:>9} {r[hi]:10.3f} "
              f"{r[hi] / r[lo]:7.1f} {refs[layers]:6.1f}  "
              f"{'/'.join(map(str, r['gc_' + str(lo)])):>9} "
              f"{'/'.join(map(str, r['gc_' + str(hi)])):>9}", flush=True)
    print(f"sites x{hi / lo:.0f}; CPU seconds of a pass's first run in a fresh process, the "
          f"best of {repeat} rounds of the mean of "
          + ", ".join(f"{k} run(s) at {n} sites" for n, k in runs.items())
          + "; ref: t(10N)/t(N) of a linear copy of as many layers (bench_reference.py); "
          f"gc: the most collections of a run; machine: {os.cpu_count()} cpus")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", default="1000,10000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", help="comma-separated pass names")
    ap.add_argument("--profile", action="store_true",
                    help="own time per function at both sizes instead of the table")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # name:n, one measuring process
    ap.add_argument("--graph", help=argparse.SUPPRESS)  # the child's graph file
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, n = args.child.rsplit(":", 1)
        return child_main(name, int(n), args.graph, args.profile_out)
    sizes = [int(s) for s in args.sites.split(",")]
    names = args.only.split(",") if args.only else list(cases())
    with tempfile.TemporaryDirectory(prefix="paramsurgery-bench-passes-") as tmp:
        if args.profile:
            for name in names:
                profile(name, sizes, tmp)
            return 0
        table(names, sizes, args.repeat, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
