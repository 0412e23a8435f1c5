"""Benchmark chunked (add-conv-cache + StreamingRunner) vs offline decoding of the Qwen3-TTS
codec decoder's conv stack (everything after the transformer's output_proj: 2 upsamplers
with ConvNeXt blocks, 4 decoder blocks, 1920 samples per frame at 24 kHz) with synthetic
weights (`synth_weights(seed=0)`: the .bin is byte-identical to
`paramsurgery synth-bin <workdir>/real_conv.param --seed 0`).

Reported per thread count:
- offline: one ncnn run over all frames (the original graph); its latency to first sample is
  the whole decode, after the last frame has arrived;
- chunked, per chunk size c (frames): latency to first sample = compute time of the first
  push (c frames; the stream must first wait for those c frames), and the steady per-chunk
  time; real-time factor (RTF) = compute seconds / audio seconds (< 1 is faster than real
  time), over the whole stream.
Every timing is the median of --repeat runs after one warm-up; the chunked output is checked
against the offline output (max|diff| / max|offline|).

    python tools/bench_streaming.py [--size real|tiny] [--frames 25] [--chunks 1,2,5]
                                    [--threads 1,2] [--repeat 3] [--workdir /tmp/...] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from paramsurgery.formats.io import save

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SAMPLE_RATE = 24000


def conv_stack(size: str, workdir: Path) -> tuple[str, str, str]:
    """Extract the conv part (param + synthetic .bin) into workdir; returns (param, bin, cut)."""
    import paramsurgery
    from paramsurgery.passes.extract import extract_subgraph
    from paramsurgery.formats.weights import synth_weights

    src = ROOT / "fixtures" / "qwen3_tts" / size / "codec_decoder.ported.ncnn.param"
    g = paramsurgery.load(src)
    first = g.by_type("Deconvolution1D")[0]
    permute = g.producer(first.inputs[0])
    assert permute.type == "Permute", permute
    cut = permute.inputs[0]  # the transformer's output_proj (Gemm) output, (T, C)
    sub = extract_subgraph(g, [cut], ["out0"])
    synth_weights(sub, seed=0)
    p, b = workdir / f"{size}_conv.param", workdir / f"{size}_conv.bin"
    if not (p.exists() and b.exists()):
        save(sub, p, bin=b)
    return str(p), str(b), cut


def median_time(fn, repeat: int) -> tuple[float, object]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--frames", type=int, default=25, help="codec frames (80 ms each)")
    ap.add_argument("--chunks", default="1,2,5", help="chunk sizes in frames")
    ap.add_argument("--threads", default="1,2", help="ncnn thread counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/paramsurgery-bench-streaming")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    from paramsurgery.runtime.child import RunOptions, load_net, run_net
    from paramsurgery.streaming import StreamingRunner, convert

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    param, bin_, cut = conv_stack(args.size, work)
    t_extract = time.perf_counter() - t0
    t0 = time.perf_counter()
    conv = convert(param, bin_, str(work / f"{args.size}_stream"))
    t_convert = time.perf_counter() - t0
    man = conv.manifest
    spf = man["samples_per_frame"]["out0"]
    channels = man["inputs"][0]["numpy_shape"][1]
    n = args.frames
    audio_s = n * spf / SAMPLE_RATE
    frames = np.random.default_rng(0).standard_normal((n, channels)).astype(np.float32)
    chunks = [int(c) for c in args.chunks.split(",")]
    results = {"size": args.size, "frames": n, "audio_seconds": audio_s,
               "samples_per_frame": spf, "input": f"({n}, {channels})", "cut_blob": cut,
               "states": len(man["states"]),
               "state_floats": sum(s["samples"] * s["channels"] for s in man["states"]),
               "bin_bytes": os.path.getsize(bin_), "extract_seconds": t_extract,
               "convert_seconds": t_convert, "cpu": os.cpu_count(), "runs": []}
    print(f"{args.size} codec conv stack: {n} frames = {audio_s:.2f} s of 24 kHz audio, "
          f"input ({n}, {channels}), {spf} samples/frame, {results['states']} state blobs "
          f"({results['state_floats']} floats), weights {results['bin_bytes'] / 1e6:.0f} MB "
          f"(synthetic); convert {t_convert:.2f} s")
    for threads in [int(t) for t in args.threads.split(",")]:
        opts = RunOptions(num_threads=threads)
        net = load_net(param, bin_, opts)
        t_off, ref = median_time(lambda: run_net(net, {cut: frames}, ["out0"])["out0"],
                                 args.repeat)
        net = None  # free it before the chunked runs
        row = {"threads": threads, "mode": "offline", "chunk": n, "first_sample_s": t_off,
               "total_s": t_off, "rtf": t_off / audio_s, "per_chunk_s": t_off}
        results["runs"].append(row)
        print(f"threads={threads} offline            first sample {t_off * 1e3:8.1f} ms  "
              f"total {t_off:7.3f} s  RTF {t_off / audio_s:.3f}")
        runner = StreamingRunner(conv.param, conv.bin, conv.manifest, num_threads=threads)
        for c in chunks:
            def stream():
                runner.reset()
                runner.calls.clear()
                t_first, out = None, []
                t_start = time.perf_counter()
                for i in range(0, n, c):
                    y = runner.push(frames[i:i + c])
                    if t_first is None and y.shape[1]:
                        t_first = time.perf_counter() - t_start
                    out.append(y)
                out.append(runner.flush())
                return (t_first, time.perf_counter() - t_start,
                        [k["seconds"] for k in runner.calls], np.concatenate(out, axis=1))
            stream()  # warm-up
            firsts, totals, pers, got = [], [], [], None
            for _ in range(args.repeat):
                t_first, total, per, got = stream()
                firsts.append(t_first)
                totals.append(total)
                pers.append(statistics.mean(per[1:]) if len(per) > 1 else per[0])
            err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
            row = {"threads": threads, "mode": "chunked", "chunk": c,
                   "first_sample_s": statistics.median(firsts),
                   "total_s": statistics.median(totals),
                   "rtf": statistics.median(totals) / audio_s,
                   "per_chunk_s": statistics.median(pers),
                   "chunk_audio_s": c * spf / SAMPLE_RATE, "rel_err_vs_offline": err}
            results["runs"].append(row)
            print(f"threads={threads} chunk={c:<3d} frames  first sample "
                  f"{row['first_sample_s'] * 1e3:8.1f} ms  total {row['total_s']:7.3f} s  "
                  f"RTF {row['rtf']:.3f}  per chunk {row['per_chunk_s'] * 1e3:7.1f} ms for "
                  f"{row['chunk_audio_s'] * 1e3:.0f} ms of audio  rel.err {err:.1e}")
        runner = None
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
