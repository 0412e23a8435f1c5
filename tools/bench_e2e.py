#!/usr/bin/env python
"""Qwen3-TTS on ncnn, timed end to end: talker step, predictor group, codec per chunk (the
constant-cost stream, 1-frame chunks, decoded while generating), frames per second, real-time
factor, first-audio latency (text ids in -> first PCM out) and peak RSS, for ncnn fp32 at 1
and 2 threads, on the tiny set (fixtures; no torch needed) or at real size.

    python tools/bench_e2e.py [--frames 24] [--repeat 5] [--threads 1,2]
    python tools/bench_e2e.py --size real [--frames 8] [--repeat 1] [--work DIR]

`--size real`: the nets, weights and torch reference of `tools/e2e_qwen3tts.py --size real
--frames N` (run it first with the same N and --work: the .bin files and
`e2e.real.N.ref.npz` are read from there); needs torch and qwen-tts (the export
environment). Every row carries the load average (1 min) at its start and end: on a shared
machine the figures mean little without it.

Each thread count runs in its own child process (peak RSS is that process's `ru_maxrss`:
the assembled nets, ncnn and Python); assembly is not timed; one warm-up generation, then
`--repeat` timed ones, medians reported. Every timed run is checked, not just timed: its codes
must equal the torch reference (fixtures/qwen3_tts/tiny/e2e.ref.npz) and the streamed PCM the
offline decode (rel <= 1e-4), otherwise the figures are not printed and the exit code is 1.

torch fp32 rows (`qwen3tts/torch_bench.py`: the qwen-tts code as released, same weights,
inputs, greedy settings, same thread count; its codes must equal the reference too) when
qwen-tts is importable, else a line saying they were not run; `--no-torch` skips them. torch
has no streaming codec: its codec figure is the offline decode per frame and it has no
first-audio latency. Ratios torch / ncnn are printed per thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

REFERENCE = ROOT / "fixtures" / "qwen3_tts" / "tiny" / "e2e.ref.npz"
REAL_WORK = Path("/tmp/e2e-qwen3tts-real")
SAMPLE_RATE, SAMPLES_PER_FRAME = 24000, 1920
TOL = 1e-4


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    if a.shape != ref.shape:
        return float("inf")
    return float(np.max(np.abs(a - ref)) / (np.max(np.abs(ref)) or 1.0))


def reference(size: str, work: Path, frames: int) -> dict[str, np.ndarray]:
    path = REFERENCE if size == "tiny" else work / f"e2e.real.{frames}.ref.npz"
    if not path.exists():
        raise SystemExit(f"bench_e2e: {path} does not exist: run python tools/e2e_qwen3tts.py "
                         f"--size real --frames {frames} --work {work} first")
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def run_child(threads: int, frames: int, repeat: int, size: str = "tiny",
              work: Path = REAL_WORK) -> dict:
    from qwen3tts import assemble
    from qwen3tts.ncnn_pipeline import Generator, Settings, Timing

    load_start = os.getloadavg()[0]
    ref = reference(size, work, frames)
    s = Settings.from_npz(ref)
    bins = None
    if size == "real":
        from qwen3tts import real_export

        bins = {f"{m}.{v}": work / f"{m}.{v}.ncnn.bin" for m, v in real_export.needed()}
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        pipe = assemble.assemble(size, "ported", Path(tmp), bins=bins)
        gen = Generator(pipe, threads=threads)
        runs = []
        for i in range(repeat + 1):            # run 0 is the warm-up
            gen.timing = Timing()
            live = gen.stream_decoder()
            t0 = time.perf_counter()
            out = gen.generate(ref["input_text_ids"], ref["input_mels"], s, frames,
                               on_frame=live.push)
            pcm = np.concatenate(live.pieces + [live.flush()])
            total = time.perf_counter() - t0
            same = int(sum(np.array_equal(a, b) for a, b in
                           zip(out["codes"], ref["output_codes"][:frames])))
            offline = gen.decode_offline(out["codes"])
            t = gen.timing
            if i:
                runs.append({"total": total, "first_audio": t.first_audio,
                             "talker_step": float(np.median(t.talker_step)),
                             "predictor_group": float(np.median(t.predictor_group)),
                             "codec_chunk": float(np.median(live.timings)),
                             "codec_chunk_first_half": float(np.median(
                                 live.timings[:frames // 2])),
                             "codec_chunk_second_half": float(np.median(
                                 live.timings[frames // 2:])),
                             "codes_identical": same, "stream_rel": _rel(pcm, offline)})
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        traffic = weight_traffic(pipe, s.groups)     # after the RSS: it loads the weights
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]
           if k not in ("codes_identical", "stream_rel")}
    med["codes_identical"] = min(r["codes_identical"] for r in runs)
    med["stream_rel"] = max(r["stream_rel"] for r in runs)
    audio = frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    med.update({"threads": threads, "frames": frames, "repeat": repeat, "audio_s": audio,
                "fps": frames / med["total"], "rtf": med["total"] / audio,
                "groups": s.groups, "load": (load_start, os.getloadavg()[0]),
                "peak_rss_mb": peak_rss_mb, **traffic, "copy_gbps": copy_bandwidth()})
    return med


def _streamed_bytes(param: Path, binp: Path | None) -> int:
    """Weight bytes one run of a net reads: everything in its .bin except Embed tables (a
    lookup reads one row per id)."""
    from paramsurgery import load
    from paramsurgery.formats.weights import weight_summary

    if binp is None:
        return 0
    by_type = weight_summary(load(param, bin=binp))["by_type"]
    return sum(n for t, n in by_type.items() if t != "Embed")


def weight_traffic(pipe: object, groups: int) -> dict[str, float]:
    """MB of weights read per talker step, per predictor group (one decoder run and one
    head per residual code) and per codec chunk (every streamed codec net once): at real
    size a one-row step is a matrix-vector product per weight, so this over the memory
    bandwidth bounds the step time from below, whatever the kernels."""
    p = pipe.parts                                            # type: ignore[attr-defined]
    heads = _streamed_bytes(p["predictor_heads"].param, p["predictor_heads"].bin)
    cp = pipe.codec_parts                                     # type: ignore[attr-defined]
    codec = 0
    if cp is not None:
        codec = sum(_streamed_bytes(Path(a), Path(b)) for a, b in
                    (cp.pre, cp.attn, (cp.conv["param"], cp.conv["bin"]),
                     (pipe.codec_stream["param"], pipe.codec_stream["bin"])))  # type: ignore[attr-defined]
    return {"mb_talker_step": (_streamed_bytes(p["talker"].param, p["talker"].bin)
                               + _streamed_bytes(p["codec_head"].param, p["codec_head"].bin)) / 1e6,
            "mb_predictor_group": ((groups - 1) * _streamed_bytes(p["predictor"].param,
                                                                 p["predictor"].bin)
                                   + heads) / 1e6,
            "mb_codec_chunk": codec / 1e6}


def copy_bandwidth(mb: int = 512, repeat: int = 3) -> float:
    """GB/s of a numpy copy (bytes read + written, best of `repeat`) on this machine now:
    what one thread can stream while the others run their jobs."""
    a = np.ones(mb * (1 << 20) // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best / 1e9


def run_torch_child(threads: int, frames: int, repeat: int, size: str = "tiny",
                    work: Path = REAL_WORK) -> dict:
    from qwen3tts.env import pin_arithmetic

    pin_arithmetic()     # the reference's seeded weights (qwen3tts/env.py)
    from qwen3tts import torch_bench

    load_start = os.getloadavg()[0]
    ref = reference(size, work, frames)
    row = torch_bench.run(threads, frames, repeat, ref, size)
    audio = frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    row.update({"threads": threads, "frames": frames, "fps": frames / row["total"],
                "rtf": row["total"] / audio, "load": (load_start, os.getloadavg()[0])})
    return row


def table(rows: list[dict], torch_rows: list[dict]) -> list[str]:
    g = rows[0]["groups"] - 1
    head = (f"| fp32 | talker step | predictor group ({g} codes) | codec / chunk (1st half "
            f"/ 2nd half) | frames/s | RTF | first audio | peak RSS |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in torch_rows:
        lines.append(f"| torch, {r['threads']} thread{'s' if r['threads'] > 1 else ''} | "
                     f"{r['talker_step'] * 1e3:.2f} ms | {r['predictor_group'] * 1e3:.2f} ms | "
                     f"{r['codec_offline'] * 1e3:.2f} ms/frame offline (no stream) | "
                     f"{_fps(r)} | {r['rtf']:.3f} | n/a | {r['peak_rss_mb']:.0f} MB | "
                     f"{_load(r)} |")
    for r in rows:
        lines.append(f"| ncnn, {r['threads']} thread{'s' if r['threads'] > 1 else ''} | "
                     f"{r['talker_step'] * 1e3:.2f} ms | {r['predictor_group'] * 1e3:.2f} ms | "
                     f"{r['codec_chunk'] * 1e3:.2f} ms ({r['codec_chunk_first_half'] * 1e3:.2f}"
                     f" / {r['codec_chunk_second_half'] * 1e3:.2f}) | {_fps(r)} | "
                     f"{r['rtf']:.3f} | {r['first_audio'] * 1e3:.1f} ms | "
                     f"{r['peak_rss_mb']:.0f} MB | {_load(r)} |")
    return lines


def _fps(r: dict) -> str:
    return f"{r['fps']:.0f}" if r["fps"] >= 10 else f"{r['fps']:.2f}"


def _load(r: dict) -> str:
    return "{:.1f}-{:.1f}".format(*r["load"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    ap.add_argument("--size", choices=["tiny", "real"], default="tiny")
    ap.add_argument("--work", type=Path, default=REAL_WORK,
                    help=f"real size: e2e_qwen3tts.py --size real's work directory "
                         f"(default {REAL_WORK})")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--torch-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(args.child, args.frames, args.repeat, args.size, args.work)))
        return 0
    if args.torch_child is not None:
        print(json.dumps(run_torch_child(args.torch_child, args.frames, args.repeat, args.size,
                                         args.work)))
        return 0
    if args.size == "tiny" and not 1 <= args.frames <= 24:
        ap.error("--frames: the tiny reference has 24 frames")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    import importlib.util

    with_torch = not args.no_torch and importlib.util.find_spec("qwen_tts") is not None
    rows, torch_rows = [], []
    for n in (int(x) for x in args.threads.split(",")):
        for flag, into in (("--child", rows),) + ((("--torch-child", torch_rows),)
                                                  if with_torch else ()):
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            proc = subprocess.run([sys.executable, __file__, flag, str(n), "--frames",
                                   str(args.frames), "--repeat", str(args.repeat), "--size",
                                   args.size, "--work", str(args.work)],
                                  capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(f"bench_e2e: {flag[2:]} {n} thread(s): exited {proc.returncode}:\n"
                      f"{proc.stderr.strip()[-2000:]}", file=sys.stderr)
                return 1
            into.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    bad = [r for r in rows if r["codes_identical"] != r["frames"] or r["stream_rel"] > TOL]
    bad += [r for r in torch_rows if r["codes_identical"] != r["frames"]]
    for r in bad:
        print(f"bench_e2e: {r['threads']} thread(s): codes {r['codes_identical']}/{r['frames']} "
              f"identical to the torch reference, streamed == offline rel "
              f"{r.get('stream_rel', 0.0):.2e} (tol {TOL}): not timing a wrong pipeline",
              file=sys.stderr)
    if bad:
        return 1
    for line in table(rows, torch_rows):
        print(line)
    for t, r in zip(torch_rows, rows):
        print(f"torch / ncnn at {r['threads']} thread(s): whole run {t['total'] / r['total']:.1f}x"
              f" (ncnn includes its streaming decode), talker step "
              f"{t['talker_step'] / r['talker_step']:.1f}x, predictor group "
              f"{t['predictor_group'] / r['predictor_group']:.1f}x, generation per frame "
              f"(talker step + predictor group) "
              f"{(t['talker_step'] + t['predictor_group']) / (r['talker_step'] + r['predictor_group']):.1f}x"
              f"; codec: torch offline per frame / ncnn 1-frame chunk "
              f"{t['codec_offline'] / r['codec_chunk']:.2f}x")
    for r in rows:
        bound = (r["mb_talker_step"] + r["mb_predictor_group"]) / 1e3 / r["copy_gbps"]
        print(f"ncnn {r['threads']} thread(s): weights read per frame {r['mb_talker_step']:.0f} MB "
              f"(talker step) + {r['mb_predictor_group']:.0f} MB (predictor group), "
              f"{r['mb_codec_chunk']:.0f} MB per codec chunk; numpy copy bandwidth "
              f"{r['copy_gbps']:.1f} GB/s -> at least {bound * 1e3:.0f} ms per frame of "
              f"generation, measured {(r['talker_step'] + r['predictor_group']) * 1e3:.0f} ms")
    if not with_torch:
        print("torch rows not run: " + ("--no-torch" if args.no_torch else
                                        "qwen-tts is not importable in this Python"))
    r0 = rows[0]
    print(f"{args.size} set, {r0['frames']} frames ({r0['audio_s']:.2f} s of audio), median of "
          f"{r0['repeat']} runs after a warm-up; codec decoded while generating, 1-frame chunks;"
          f" every run: codes {r0['frames']}/{r0['frames']} identical to torch, streamed == "
          f"offline rel <= {max(r['stream_rel'] for r in rows):.1e}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
