#!/usr/bin/env python
"""The Qwen3-TTS codec decoder alone, streamed with the window cache (codec_stream.py) and
decoded offline, through ncnn: chunked == offline for each chunking, and the time per chunk
early and late in the stream (constant work).

    python tools/codec_stream_check.py [--size tiny|real] [--frames N] [--chunks 1 7,16,1]

Real size: the fixture graph (`codec_decoder.ported_levelsum_per_level`, .param only) with
`synth-bin` weights (seeded random, ~460 MB in a temporary directory); the same passes as the
pipeline (fuse-codebooks, extract, add-conv-cache, the window cache). Random codes (seed 0).
Prints one line per chunking and exits 1 when one exceeds --tol.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from qwen3tts import assemble, codec_stream  # noqa: E402
from qwen3tts.ncnn_pipeline import codec_feeds  # noqa: E402

MODULE, VARIANT = "codec_decoder", "ported_levelsum_per_level"


def build(size: str, work: Path) -> tuple[assemble.Part, assemble.Part, codec_stream.CodecParts,
                                          dict, list[str]]:
    from paramsurgery import load
    from paramsurgery.formats.weights.synth import write_synth_bin
    from paramsurgery.passes.extract import extract_subgraph
    from paramsurgery.streaming import convert

    manifest = assemble.load_manifest()
    rec = assemble.export_record(manifest, MODULE, VARIANT, size)
    param = assemble.FIXTURES / rec["files"]["ncnn_param"]
    binp = assemble.FIXTURES / rec["files"]["ncnn_bin"] if "ncnn_bin" in rec["files"] else None
    log: list[str] = []
    if binp is None:
        binp = work / "codec.synth.bin"
        t = time.perf_counter()
        with open(binp, "wb") as fh:
            write_synth_bin(load(param), fh, seed=0)
        log.append(f"synth-bin: {binp.stat().st_size / 1e6:.0f} MB in "
                   f"{time.perf_counter() - t:.1f} s")
    extra: dict = {}
    p, b, g = assemble._fuse("codec", load(param, bin=binp), work, extra, log)
    part = assemble.Part("codec", MODULE, VARIANT, p, b, rec["io"],
                         rec["input_shapes"]["reference"], extra)
    cut = assemble.codec_cut_blob(g)
    front = extract_subgraph(g, None, [cut])
    conv = extract_subgraph(g, [cut], list(g.outputs))
    cp, cb = assemble._save(conv, work, "codec_conv", True)
    stream = convert(cp, cb, str(work / "codec_conv.stream"))
    notes = assemble.export_record(manifest, MODULE, "ported", size)["notes"]
    win = int(notes["sliding_window"])
    front_part = assemble.Part("codec_front", MODULE, VARIANT, p, b, rec["io"],
                               rec["input_shapes"]["reference"],
                               {"window": win, "rope_theta": notes["rope_theta"],
                                "head_dim": notes["head_dim"]})
    parts = codec_stream.build(front, win, work, assemble._save)
    log += parts.log
    return part, front_part, parts, {"param": stream.param, "bin": stream.bin,
                                     "manifest": stream.manifest_path,
                                     "start_param": stream.start_param}, log


def main(argv: list[str] | None = None) -> int:
    from paramsurgery.runtime.child import RunOptions, load_net, run_net, Fetch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=["tiny", "real"], default="tiny")
    ap.add_argument("--frames", type=int, default=None,
                    help="frames (default: 2 windows + 5: 13 tiny, 149 real)")
    ap.add_argument("--chunks", nargs="+", default=["1", "7,16,1"],
                    help="chunkings to check, each frames per chunk, cycled")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="codec-stream-") as tmp:
        part, front, parts, stack, log = build(args.size, Path(tmp))
        for line in log:
            print("  " + line)
        frames = args.frames or 2 * parts.window + 5
        vocab = int(assemble.export_record(assemble.load_manifest(), MODULE, "ported",
                                           args.size)["notes"]["vocab"])
        codes = np.random.default_rng(0).integers(0, vocab, (frames, 16)).astype(np.int32)
        options = RunOptions(num_threads=args.threads)
        fusion = part.extra.get("fusion")

        def feeds(c: np.ndarray, start: int) -> dict:
            return codec_feeds(front.extra, part, fusion, c, start)

        t = time.perf_counter()
        net = load_net(part.param, part.bin, options)
        offline = run_net(net, feeds(codes, 0), [Fetch("out0")])["out0"].reshape(-1)
        del net
        print(f"offline: {frames} frames in {time.perf_counter() - t:.1f} s")
        roles = {i["name"]: i["blob"] for i in part.io["inputs"]
                 if i["name"] in ("mask", "cos", "sin")}
        worst = 0.0
        for spec in args.chunks:
            sizes = [int(x) for x in spec.split(",")]
            codec = codec_stream.StreamingCodec(parts, stack, options, feeds, roles,
                                                int(front.extra["head_dim"]),
                                                float(front.extra["rope_theta"]))
            pieces, pos = [], 0
            while pos < frames:
                n = min(sizes[len(pieces) % len(sizes)], frames - pos)
                pieces.append(codec.push(codes[pos:pos + n]))
                pos += n
            timings = list(codec.timings)
            pcm = np.concatenate(pieces + [codec.flush()])
            rel = float(np.max(np.abs(pcm - offline)) / np.max(np.abs(offline))) \
                if pcm.shape == offline.shape else float("inf")
            worst = max(worst, rel)
            half = len(timings) // 2
            print(f"chunks {spec}: {len(timings)} chunk(s), chunked == offline rel {rel:.2e}; "
                  f"ms per chunk median first half {np.median(timings[:half]) * 1e3:.1f}, "
                  f"second half {np.median(timings[half:]) * 1e3:.1f}")
    print(f"codec stream ({args.size}, window {parts.window}, {frames} frames): "
          f"worst rel {worst:.2e} (tol {args.tol})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
