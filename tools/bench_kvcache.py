#!/usr/bin/env python3
"""Benchmark: ncnn time per decoded token with the kv cache vs recomputing the whole prefix.

    python tools/bench_kvcache.py [--param P --bin B] [--lengths 64,256] [--steps 8]
                                  [--threads 2] [--synth-bin]

Default graph: the bundled tiny talker decoder. For each context length L, in one run:
- cached: prefill L tokens, then decode `--steps` single tokens feeding back the caches
  (extract type 1); reported per token;
- recompute: run the graph without cache on the whole L+1 tokens for each new token;
and the ratio recompute / cached. `--synth-bin` generates random weights for a param-only
graph (e.g. the real-size talker) with paramsurgery's synth-bin (needs the disk space).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paramsurgery  # noqa: E402
from paramsurgery.verify.kvcache import causal_mask, infer_head_dim, infer_hidden, rope_tables
from paramsurgery.passes.kvcache import AddKVCache, cache_slots  # noqa: E402
from paramsurgery.core.resources import fixture  # noqa: E402
from paramsurgery.formats.io import save


def load_net(param: Path, bin: Path, threads: int):
    import ncnn

    net = ncnn.Net()
    for k in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, k, False)
    net.opt.num_threads = threads
    assert net.load_param(str(param)) == 0
    assert net.load_model(str(bin)) == 0
    return net


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--param", default=str(fixture("qwen3_tts/tiny/talker_decoder.ported.ncnn.param")))
    ap.add_argument("--bin")
    ap.add_argument("--lengths", default="64,256")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--synth-bin", action="store_true")
    ap.add_argument("--rope-theta", type=float, default=1e6)
    args = ap.parse_args()
    import ncnn

    param = Path(args.param)
    g = paramsurgery.load(param)
    hidden, head_dim = infer_hidden(g, "in0"), infer_head_dim(g)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-benchkv-") as tmp:
        if args.bin:
            bin_path = Path(args.bin)
        elif args.synth_bin:
            from paramsurgery.formats.weights.synth import write_synth_bin

            bin_path = Path(tmp) / "synth.bin"
            with open(bin_path, "wb") as fh:
                write_synth_bin(g, fh, seed=0)
        else:
            bin_path = param.with_name(param.name.replace(".param", ".bin"))
        kv_param = Path(tmp) / "kv.param"
        save(AddKVCache()(g).graph, kv_param)
        slots = cache_slots(paramsurgery.load(kv_param))
        plain = load_net(param, bin_path, args.threads)
        cached = load_net(kv_param, bin_path, args.threads)
        keep: list = []

        def mat(a):
            a = np.ascontiguousarray(a, np.float32)
            keep.append(a)
            return ncnn.Mat(a).clone()

        rng = np.random.default_rng(0)
        print(f"graph: {param.name} ({len(g)} layers, {len(slots)} attention layers), "
              f"threads={args.threads}")
        print(f"{'context':>8} {'cached ms/token':>16} {'recompute ms/token':>19} {'ratio':>7}")
        for L in [int(x) for x in args.lengths.split(",")]:
            total = L + args.steps
            emb = rng.standard_normal((total, hidden)).astype(np.float32)
            cos, sin = rope_tables(np.arange(total), head_dim, args.rope_theta)

            def feed(ex, a, b, past):
                ex.input("in0", mat(emb[a:b]))
                ex.input("in1", mat(causal_mask(b - a, past)))
                ex.input("in2", mat(cos[a:b]))
                ex.input("in3", mat(sin[a:b]))

            ex = cached.create_extractor()
            feed(ex, 0, L, 0)
            for s in slots:
                ex.input(s.k_in, ncnn.Mat())
                ex.input(s.v_in, ncnn.Mat())
            ex.extract("out0")
            caches = {}
            for s in slots:
                caches[s.k_in] = ex.extract(s.k_out, 1)[1]
                caches[s.v_in] = ex.extract(s.v_out, 1)[1]
            t0 = time.perf_counter()
            for t in range(L, total):
                ex = cached.create_extractor()
                feed(ex, t, t + 1, t)
                for s in slots:
                    ex.input(s.k_in, caches[s.k_in])
                    ex.input(s.v_in, caches[s.v_in])
                ex.extract("out0")
                for s in slots:
                    caches[s.k_in] = ex.extract(s.k_out, 1)[1]
                    caches[s.v_in] = ex.extract(s.v_out, 1)[1]
            t_cached = (time.perf_counter() - t0) / args.steps
            t0 = time.perf_counter()
            for t in range(L, total):
                ex = plain.create_extractor()
                feed(ex, 0, t + 1, 0)
                ex.extract("out0")
            t_full = (time.perf_counter() - t0) / args.steps
            print(f"{L:>8} {t_cached * 1e3:>16.3f} {t_full * 1e3:>19.3f} {t_full / t_cached:>6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
