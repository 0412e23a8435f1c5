#!/usr/bin/env python
"""fold-gqa benchmark: ncnn step time and kv-cache bytes of a decoder whose K/V are expanded
to the query heads before SDPA (ExpandDims + Tile + Reshape, ncnn's benchmark LLM layout)
against the same decoder after `fold-gqa` (SDPA reads the kv heads), in one run.

    python tools/bench_gqa.py [--layers 28] [--past 128,1024] [--steps 16] [--rounds 2]
                              [--threads 1] [--scratch /tmp] [--json out.json]

The decoder is the real-size Qwen3-TTS talker stack (fixtures/qwen3_tts/real/
talker_decoder.ported.ncnn.param: hidden 1024, 16 query heads, 8 kv heads, head_dim 128,
28 layers; `--layers N` keeps the first N layers, cut with `extract`). The expanded twin is
built from it with `paramsurgery.passes.fold_gqa.expand_gqa` (the inverse rewrite), both get
ncnn's native kv cache (`add-kvcache`), and both load the same synthetic `.bin`
(`synth-bin`; the expansion layers have no weights, so one file serves both). The folded
graph is `fold-gqa` applied to the expanded one.

Per past length P and round: a prefill of P tokens with empty caches on each net, then
`--steps` single-token steps feeding the caches back as ncnn returns them
(`extract(name, 1)`), the two nets' steps interleaved (A, B, A, B; the order flips every
round) so that load from other processes hits both alike. Reported: median and minimum ms
per step over all rounds, prefill ms, and the kv-cache bytes after the last step (logical
`w*h*c*4`, and as allocated, `cstep*c*elemsize`) summed over all layers. Ratios are
expanded / folded.
Before timing, the prefill outputs of the two nets are compared (they must agree).
The synthetic `.bin` (about 1.76 GB at 28 layers) is written to --scratch and deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paramsurgery.formats.io import load  # noqa: E402
from paramsurgery.verify.kvcache import causal_mask, rope_tables  # noqa: E402
from paramsurgery.passes.extract import extract_subgraph  # noqa: E402
from paramsurgery.passes.fold_gqa import FoldGQA, expand_gqa  # noqa: E402
from paramsurgery.passes.kvcache import AddKVCache, cache_slots  # noqa: E402
from paramsurgery.formats.weights.synth import write_synth_bin  # noqa: E402
from paramsurgery.formats.io import save  # noqa: E402

TALKER = ROOT / "fixtures" / "qwen3_tts" / "real" / "talker_decoder.ported.ncnn.param"
HIDDEN, HEAD_DIM, THETA = 1024, 128, 1_000_000.0


def first_layers(g, n: int):  # noqa: ANN001, ANN201
    """The first n decoder layers: cut at the residual stream after layer n (the second
    residual add of that layer)."""
    sdpas = g.by_type("SDPA")
    if n >= len(sdpas):
        return g
    pos = g.position()
    nxt = pos[sdpas[n].id]
    adds = [l for l in g.by_type("BinaryOp") if l.params.get(0) == 0 and len(l.inputs) == 2
            and pos[l.id] < nxt]
    return extract_subgraph(g, None, [adds[-1].outputs[0]])


def build(layers: int, scratch: Path) -> dict:
    base = load(TALKER)
    base = first_layers(base, layers)
    expanded = base.copy()
    n = len(expand_gqa(expanded))
    expanded_kv = AddKVCache()(expanded).graph
    folded_res = FoldGQA()(expanded_kv)
    folded_kv = folded_res.graph
    assert len(folded_res.data["folded"]) == n == layers, folded_res.format()
    out = {"expanded": scratch / "expanded.param", "folded": scratch / "folded.param",
           "bin": scratch / "talker.bin"}
    save(expanded_kv, out["expanded"])
    save(folded_kv, out["folded"])
    t0 = time.monotonic()
    with open(out["bin"], "wb") as fh:
        write_synth_bin(folded_kv, fh, seed=0)
    out["synth_seconds"] = time.monotonic() - t0
    out["output"] = [b for b in folded_kv.outputs if not b.startswith("cache_")][0]
    out["slots"] = {"expanded": cache_slots(expanded_kv), "folded": cache_slots(folded_kv)}
    out["layer_counts"] = {"expanded": len(expanded_kv), "folded": len(folded_kv)}
    return out


def load_net(param: Path, bin_path: Path, threads: int):  # noqa: ANN201
    import ncnn

    net = ncnn.Net()
    for k in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, k, False)
    net.opt.num_threads = threads
    assert net.load_param(str(param)) == 0, param
    assert net.load_model(str(bin_path)) == 0, bin_path
    return net


class Runner:
    def __init__(self, net, slots, output: str) -> None:  # noqa: ANN001
        self.net, self.slots, self.output = net, slots, output
        self.keep: list = []

    def call(self, embeds, mask, cos, sin, caches):  # noqa: ANN001, ANN201
        import ncnn

        ex = self.net.create_extractor()
        for name, a in (("in0", embeds), ("in1", mask), ("in2", cos), ("in3", sin)):
            a = np.ascontiguousarray(a, np.float32)
            self.keep.append(a)
            ex.input(name, ncnn.Mat(a).clone())
        for s in self.slots:
            ex.input(s.k_in, caches.get(s.k_in, ncnn.Mat()))
            ex.input(s.v_in, caches.get(s.v_in, ncnn.Mat()))
        ret, out = ex.extract(self.output)
        assert ret == 0
        new = {}
        for s in self.slots:
            for src, dst in ((s.k_out, s.k_in), (s.v_out, s.v_in)):
                r, m = ex.extract(src, 1)
                assert r == 0
                new[dst] = m
        result = np.array(out, copy=True)
        self.keep.clear()
        return result, new


def cache_bytes(caches: dict) -> tuple[int, int]:
    logical = allocated = 0
    for m in caches.values():
        logical += m.w * m.h * m.d * m.c * 4
        allocated += m.cstep * m.c * m.elemsize
    return logical, allocated


def measure(nets: dict, past: int, steps: int, seed: int, flip: bool) -> dict:
    """Prefill both nets, then their single-token steps interleaved (A, B, A, B, ...) so
    load from other processes hits both alike. Per net: prefill ms, per-step ms, caches."""
    rng = np.random.default_rng(seed)
    total = past + steps
    embeds = rng.standard_normal((total, HIDDEN)).astype(np.float32)
    cos, sin = rope_tables(np.arange(total), HEAD_DIM, THETA)
    names = list(nets)[::-1] if flip else list(nets)
    out = {n: {"step_ms": []} for n in names}
    caches = {}
    for n in names:
        t0 = time.perf_counter()
        _, caches[n] = nets[n].call(embeds[:past], causal_mask(past, 0), cos[:past],
                                    sin[:past], {})
        out[n]["prefill_ms"] = (time.perf_counter() - t0) * 1e3
    for t in range(past, total):
        for n in names:
            t0 = time.perf_counter()
            _, caches[n] = nets[n].call(embeds[t:t + 1], np.zeros((1, t + 1), np.float32),
                                        cos[t:t + 1], sin[t:t + 1], caches[n])
            out[n]["step_ms"].append((time.perf_counter() - t0) * 1e3)
    for n in names:
        out[n]["cache_bytes"], out[n]["cache_bytes_allocated"] = cache_bytes(caches[n])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--past", default="128,1024", help="prefill lengths before the steps")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    pasts = [int(x) for x in args.past.split(",") if x.strip()]
    scratch = Path(tempfile.mkdtemp(prefix="bench-gqa-", dir=args.scratch))
    try:
        t0 = time.monotonic()
        b = build(args.layers, scratch)
        bin_size = os.path.getsize(b["bin"])
        print(f"talker stack: {args.layers} layers, hidden {HIDDEN}, 16 q heads / 8 kv heads, "
              f"head_dim {HEAD_DIM}; synth .bin {bin_size / 1e9:.2f} GB "
              f"({b['synth_seconds']:.0f} s); layers expanded {b['layer_counts']['expanded']} "
              f"/ folded {b['layer_counts']['folded']}; {args.threads} thread(s)", flush=True)
        nets = {k: Runner(load_net(b[k], b["bin"], args.threads), b["slots"][k], b["output"])
                for k in ("expanded", "folded")}
        # the two graphs compute the same thing
        rng = np.random.default_rng(1)
        x = rng.standard_normal((8, HIDDEN)).astype(np.float32)
        cos, sin = rope_tables(np.arange(8), HEAD_DIM, THETA)
        ya, _ = nets["expanded"].call(x, causal_mask(8, 0), cos, sin, {})
        yb, _ = nets["folded"].call(x, causal_mask(8, 0), cos, sin, {})
        agree = float(np.max(np.abs(ya - yb)) / np.max(np.abs(ya)))
        print(f"prefill outputs agree: max rel {agree:.2e}", flush=True)
        results: dict = {"layers": args.layers, "threads": args.threads, "steps": args.steps,
                         "rounds": args.rounds, "bin_bytes": bin_size, "agree_rel": agree,
                         "past": {}}
        for past in pasts:
            runs = [measure(nets, past, args.steps, seed=past + r, flip=bool(r % 2))
                    for r in range(args.rounds)]
            summary = {}
            for name in nets:
                steps = [x for r in runs for x in r[name]["step_ms"]]
                pre = [r[name]["prefill_ms"] for r in runs]
                summary[name] = {
                    "step_ms": statistics.median(steps), "step_ms_min": min(steps),
                    "prefill_ms": statistics.median(pre), "prefill_ms_min": min(pre),
                    "cache_bytes": runs[-1][name]["cache_bytes"],
                    "cache_bytes_allocated": runs[-1][name]["cache_bytes_allocated"]}
            e, f = summary["expanded"], summary["folded"]
            summary["ratio"] = {k: e[k] / f[k] for k in e}
            results["past"][past] = summary
            rt = summary["ratio"]
            print(f"past {past:>5} + {args.steps} steps x {args.rounds}: step median "
                  f"{e['step_ms']:7.1f} -> {f['step_ms']:7.1f} ms (x{rt['step_ms']:.3f}), min "
                  f"{e['step_ms_min']:7.1f} -> {f['step_ms_min']:7.1f} ms "
                  f"(x{rt['step_ms_min']:.3f}); prefill {e['prefill_ms']:8.0f} -> "
                  f"{f['prefill_ms']:8.0f} ms (x{rt['prefill_ms']:.3f}); kv cache "
                  f"{e['cache_bytes'] / 2**20:.1f} -> {f['cache_bytes'] / 2**20:.1f} MiB "
                  f"(x{rt['cache_bytes']:.2f}; allocated "
                  f"{e['cache_bytes_allocated'] / 2**20:.1f} -> "
                  f"{f['cache_bytes_allocated'] / 2**20:.1f} MiB)", flush=True)
        results["seconds"] = time.monotonic() - t0
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
