#!/usr/bin/env python
"""Qwen3-TTS end to end on ncnn: assemble the pipeline from the fixture graphs with
paramsurgery's passes, generate greedily, decode offline and in chunks, compare with torch.

    python tools/e2e_qwen3tts.py [--frames N] [--variant ported|raw] [--threads T]
                                 [--chunks 1,3,2]
    python tools/e2e_qwen3tts.py --size real [--frames N] [--work DIR]
    python tools/e2e_qwen3tts.py --size real --synth [--frames N]

Tiny (default): the torch reference is `fixtures/qwen3_tts/tiny/e2e.ref.npz` (greedy HF
generation with the fixtures' weights, made by `tools/make_fixtures.py --only e2e`); no
torch needed here. Last line:

    e2e: codes N/N frames identical; waveform rel X; chunked == offline rel Y

(waveform rel = max|ncnn offline - torch| / max|torch| over the N frames' samples; chunked
== offline rel = the same between the chunked and the offline ncnn decodes.) Exit 1 when a
frame differs or a rel exceeds --tol.

`--size real`: the real-size pipeline against torch with the same weights. In `--work`
(default /tmp/e2e-qwen3tts-real; ~3 GB, reused by the next run) the fixture generator's
specs export the real-size nets with their `.bin` (`qwen3tts/real_export.py`: seeded random
weights, released configs; each `.param` must equal the committed fixture's), a child process
runs the qwen-tts code as released (`e2e_reference.build("real", N, logits=True)`: greedy HF
generation, the codec decoder's waveform, every choice's logits), and the pipeline is
assembled from the fixture graphs with these weights by paramsurgery's passes alone. Codes
are compared frame by frame: identical until the first near tie (`qwen3tts/divergence.py`),
which is named with torch's top-2 gap; a divergence with a clear gap fails. Last line:

    e2e real: codes M/N frames identical[ until <the near tie>]; logits rel X over K choices;
    waveform rel Y on the M matching frames; chunked == offline rel Z

Needs torch, qwen-tts and pnnx (the export environment, /work/genvenv); ~4.4 GB peak RSS.

`--size real --synth`: the real-size graphs with `synth-bin` weights (seeded random numbers
unrelated to torch, in a temporary directory: ~4 GB), random text ids and mels; prints time
per frame and the real-time factor, no reference comparison.

`--variant raw`: the raw (HF code) exports after `paramsurgery fix` (+ fold-gqa); stops with
exit 2 naming every module that has no raw export or does not load after `fix`, unless
`--raw-fallback`, which keeps those modules' ported graphs and names them in the log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from qwen3tts import assemble, configs  # noqa: E402
from qwen3tts.ncnn_pipeline import Generator, Settings  # noqa: E402

REFERENCE = ROOT / "fixtures" / "qwen3_tts" / "tiny" / "e2e.ref.npz"
REAL_WORK = Path("/tmp/e2e-qwen3tts-real")
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
SYNTH_SEED = 0


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    if a.shape != ref.shape:
        return float("inf")
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(a.astype(np.float64) - ref))) / scale


def real_settings(frames: int) -> Settings:
    """The generation settings at real size, from the released config values (what
    e2e.ref.npz's meta_* keys record at tiny size)."""
    tts, talker = configs.get("real", "tts"), configs.get("real", "talker")
    talker_sup, pred_sup = configs.suppressed_ids("real")
    eos = talker["codec_eos_token_id"]
    return Settings(frames=frames, hidden=talker["hidden_size"],
                    tts_bos_eos_pad=[tts["tts_bos_token_id"], tts["tts_eos_token_id"],
                                     tts["tts_pad_token_id"]],
                    codec_think=[talker["codec_think_id"], talker["codec_think_bos_id"],
                                 talker["codec_language_id"]["english"],
                                 talker["codec_think_eos_id"]],
                    codec_pad_bos=[talker["codec_pad_id"], talker["codec_bos_id"]],
                    codec_eos=eos, talker_banned=np.asarray(talker_sup + [eos]),
                    predictor_banned=np.asarray(pred_sup, dtype=np.int64),
                    groups=talker["num_code_groups"])


def synth_bins(manifest: dict, work: Path, log: list[str]) -> dict[str, Path]:
    """synth-bin weights for every real-size source graph the pipeline reads."""
    from paramsurgery import load
    from paramsurgery.formats.weights.synth import write_synth_bin

    bins: dict[str, Path] = {}
    for module, variant in assemble.SOURCES.values():
        key = f"{module}.{variant}"
        if key in bins:
            continue
        rec = assemble.export_record(manifest, module, variant, "real")
        param = assemble.FIXTURES / rec["files"]["ncnn_param"]
        out = work / f"{key}.synth.bin"
        t = time.perf_counter()
        with open(out, "wb") as fh:
            write_synth_bin(load(param), fh, seed=SYNTH_SEED)
        bins[key] = out
        log.append(f"synth-bin {key}: {out.stat().st_size / 1e6:.0f} MB in "
                   f"{time.perf_counter() - t:.1f} s")
    return bins


def timing_lines(gen: Generator, frames: int, threads: int) -> tuple[list[str], dict]:
    t = gen.timing
    per_frame = float(np.mean(t.per_frame)) if t.per_frame else 0.0
    per_frame_cpu = float(np.mean(t.per_frame_cpu)) if t.per_frame_cpu else 0.0
    codec_chunked = sum(t.codec_stream_chunks)
    how = "window cache" if gen.pipe.codec_parts is not None else \
        "front recomputed over its left context"
    audio = frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    total = t.prompt + sum(t.per_frame) + codec_chunked
    figures = {"prompt_s": t.prompt, "generate_ms_per_frame": per_frame * 1e3,
               "generate_cpu_ms_per_frame": per_frame_cpu * 1e3,
               "codec_offline_ms_per_frame": t.codec_offline / frames * 1e3,
               "codec_chunked_ms_per_frame": codec_chunked / frames * 1e3,
               "total_s": total, "audio_s": audio, "rtf": total / audio,
               "first_audio_ms": None if t.first_audio is None else t.first_audio * 1e3}
    lines = [(f"timing ({threads} threads): prompt {t.prompt * 1e3:.1f} ms; talker + "
              f"predictor {per_frame * 1e3:.1f} ms/frame (CPU {per_frame_cpu * 1e3:.1f}); "
              f"codec offline "
              f"{figures['codec_offline_ms_per_frame']:.1f} ms/frame, chunked "
              f"{figures['codec_chunked_ms_per_frame']:.1f} ms/frame ({how})"),
             (f"real-time factor {figures['rtf']:.3f} ({total:.2f} s for {audio:.2f} s of "
              f"audio: prompt + generation + chunked decode; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")]
    if t.first_audio is not None:
        lines.append(f"first audio {t.first_audio * 1e3:.1f} ms (text ids in -> first PCM out: "
                     f"x-vector, prompt prefill, frame 0, its 1-frame codec chunk)")
    return lines, figures


def run_tiny(args: argparse.Namespace, work: Path) -> int:
    with np.load(REFERENCE) as data:
        ref = {k: data[k] for k in data.files}
    s = Settings.from_npz(ref)
    frames = args.frames
    if not 1 <= frames <= s.frames:
        print(f"--frames {frames}: the reference has {s.frames} frames", file=sys.stderr)
        return 2
    pipe = assemble.assemble("tiny", args.variant, work, raw_fallback=args.raw_fallback)
    for line in pipe.log:
        print("  " + line)
    too_long = {m: n for m, n in assemble.FIX_BOUNDS.items() if n < frames}
    if args.variant == "raw" and too_long:
        print("e2e: --variant raw cannot run: " + "; ".join(
            f"{m} after fix is exact for lengths up to {n} only (one trace's position "
            f"tables), --frames {frames}" for m, n in too_long.items()), file=sys.stderr)
        return 2
    if args.variant == "raw":
        raw = [p.module for p in pipe.parts.values() if p.variant == "raw"]
        kept = sorted({p.module for p in pipe.parts.values() if p.variant != "raw"
                       and p.name in assemble.RAW_PARTS})
        print(f"raw: {len(set(raw))} module(s) after `paramsurgery fix` alone"
              + (f"; ported fallback (--raw-fallback): {', '.join(kept)}" if kept else ""))
    gen = Generator(pipe, threads=args.threads)
    live = gen.stream_decoder() if pipe.codec_parts is not None else None
    out = gen.generate(ref["input_text_ids"], ref["input_mels"], s, frames,
                       on_frame=live.push if live is not None else None)
    streamed = np.concatenate([np.concatenate(live.pieces), live.flush()]) \
        if live is not None else None
    want = ref["output_codes"][:frames]
    same = [bool(np.array_equal(out["codes"][i], want[i])) for i in range(frames)]
    first_bad = next((i for i, ok in enumerate(same) if not ok), None)
    print(f"x-vector rel {rel(out['xvector'], ref['output_xvector']):.2e}; prompt embeds rel "
          f"{rel(out['prompt'], ref['output_prompt_embeds']):.2e}; trailing text rel "
          f"{rel(out['trailing'], ref['output_trailing_text']):.2e}")
    if first_bad is not None:
        print(f"frame {first_bad}: ncnn {out['codes'][first_bad].tolist()} != torch "
              f"{want[first_bad].tolist()}")
    codes = out["codes"]
    wav = gen.decode_offline(codes)
    chunks = [int(c) for c in args.chunks.split(",")]
    chunked = gen.decode_streaming(codes, chunks)
    ref_wav = ref["output_wav"][:frames * SAMPLES_PER_FRAME]
    wav_rel, chunk_rel = rel(wav, ref_wav), rel(chunked, wav)
    live_rel = rel(streamed, wav) if streamed is not None else 0.0
    for line in timing_lines(gen, frames, args.threads)[0]:
        print(line)
    if streamed is not None:
        print(f"streamed during generation (1-frame chunks) == offline rel {live_rel:.2e}")
    else:
        print("not streamed during generation, no first-audio latency: the codec has no "
              "window cache (see the codec stream line of the log)")
    print(f"e2e: codes {sum(same)}/{frames} frames identical; waveform rel {wav_rel:.2e}; "
          f"chunked == offline rel {chunk_rel:.2e}")
    ok = all(same) and wav_rel <= args.tol and chunk_rel <= args.tol and live_rel <= args.tol
    return 0 if ok else 1


def run_real(args: argparse.Namespace, work: Path) -> int:
    manifest = json.loads((assemble.FIXTURES / "manifest.json").read_text())
    log: list[str] = []
    t0 = time.perf_counter()
    bins = synth_bins(manifest, work, log)
    pipe = assemble.assemble("real", args.variant, work, bins=bins, manifest=manifest)
    for line in log + pipe.log:
        print("  " + line)
    print(f"  assembled in {time.perf_counter() - t0:.0f} s")
    s = real_settings(args.frames)
    rng = np.random.default_rng(SYNTH_SEED)
    tts = configs.get("real", "tts")
    words = rng.integers(0, 150000, 8).tolist()
    text_ids = np.asarray([tts["im_start_token_id"], tts["assistant_token_id"],
                           tts["newline_token_id"]] + words +
                          [tts["im_end_token_id"], tts["newline_token_id"],
                           tts["im_start_token_id"], tts["assistant_token_id"],
                           tts["newline_token_id"]], np.int32)
    mels = rng.standard_normal((1, 300, configs.get("real", "speaker")["mel_dim"])) \
        .astype(np.float32)
    gen = Generator(pipe, threads=args.threads)
    live = gen.stream_decoder()
    out = gen.generate(text_ids, mels, s, args.frames, on_frame=live.push)
    live.flush()
    codes = out["codes"]
    wav = gen.decode_offline(codes)
    chunked = gen.decode_streaming(codes, [int(c) for c in args.chunks.split(",")])
    lines, _ = timing_lines(gen, args.frames, args.threads)
    for line in lines:
        print(line)
    print(f"e2e real (synth weights, no reference): {args.frames} frames, "
          f"{wav.size} samples; chunked == offline rel {rel(chunked, wav):.2e}")
    return 0


def stage_child(stage: str, work: Path, frames: int) -> None:
    """The torch stages, in a child process each (they hold 3.6 GB of torch weights that
    the ncnn side must not keep): `export` (the nets' .bin) and `reference` (torch's run)."""
    from qwen3tts.env import pin_arithmetic

    pin_arithmetic()   # the same seeded weights in both children (qwen3tts/env.py says why)
    manifest = json.loads((assemble.FIXTURES / "manifest.json").read_text())
    if stage == "export":
        from qwen3tts import real_export

        log: list[str] = []
        try:
            real_export.export(work, manifest, log)
        finally:
            print("\n".join(log), flush=True)
        return
    from qwen3tts import e2e_reference
    from qwen3tts.npz import save_npz

    t = time.perf_counter()
    arrays = e2e_reference.build("real", frames, logits=True)
    save_npz(reference_path(work, frames), arrays)
    print(f"torch reference: {frames} frames in {time.perf_counter() - t:.0f} s", flush=True)


def reference_path(work: Path, frames: int) -> Path:
    return work / f"e2e.real.{frames}.ref.npz"


def _run_stage(stage: str, work: Path, frames: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--stage", stage, "--work", str(work),
                           "--frames", str(frames)], env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    for line in lines:
        print("  " + line)
    if proc.returncode != 0:
        raise SystemExit(f"e2e real: the {stage} stage exited {proc.returncode}:\n"
                         f"{proc.stderr.strip()[-3000:]}")
    print(f"  {stage} stage: {time.perf_counter() - t:.0f} s")


def run_real_torch(args: argparse.Namespace) -> int:
    from qwen3tts import divergence, real_export

    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((assemble.FIXTURES / "manifest.json").read_text())
    _run_stage("export", work, args.frames)
    bins = {f"{m}.{v}": work / f"{m}.{v}.ncnn.bin" for m, v in real_export.needed()}
    ref_path = reference_path(work, args.frames)
    if ref_path.exists():
        print(f"  torch reference: reused {ref_path}")
    else:
        _run_stage("reference", work, args.frames)
    with np.load(ref_path) as data:
        ref = {k: data[k] for k in data.files}
    s = Settings.from_npz(ref)
    frames = args.frames
    t0 = time.perf_counter()
    built = work / "assembled"
    built.mkdir(exist_ok=True)
    pipe = assemble.assemble("real", "ported", built, bins=bins, manifest=manifest)
    for line in pipe.log:
        print("  " + line)
    print(f"  assembled in {time.perf_counter() - t0:.0f} s")
    gen = Generator(pipe, threads=args.threads, keep_logits=True)
    live = gen.stream_decoder()
    out = gen.generate(ref["input_text_ids"], ref["input_mels"], s, frames, on_frame=live.push)
    live.flush()
    print(f"x-vector rel {rel(out['xvector'], ref['output_xvector']):.2e}; prompt embeds rel "
          f"{rel(out['prompt'], ref['output_prompt_embeds']):.2e}; trailing text rel "
          f"{rel(out['trailing'], ref['output_trailing_text']):.2e}")
    assert gen.logits is not None
    cmp = divergence.compare(out["codes"], ref["output_codes"], gen.logits,
                             ref["output_logits_talker"], ref["output_logits_predictor"],
                             s.talker_banned, s.predictor_banned, args.tie_tol)
    m = cmp.matching
    wav_rel = chunk_rel = 0.0
    if m:
        codes = out["codes"][:m]
        wav = gen.decode_offline(codes)
        # the codec is causal: torch's first m frames of samples depend on its first m codes
        wav_rel = rel(wav, ref["output_wav"][:m * SAMPLES_PER_FRAME])
        chunk_rel = rel(gen.decode_streaming(codes, [int(c) for c in args.chunks.split(",")]),
                        wav)
    for line in timing_lines(gen, frames, args.threads)[0]:
        print(line)
    tie = f" until {cmp.divergence.describe()}" if cmp.divergence else ""
    print(f"e2e real: codes {m}/{frames} frames identical{tie}; logits rel {cmp.logit_rel:.2e} "
          f"over {cmp.choices} choices; waveform rel {wav_rel:.2e} on the {m} matching "
          f"frames; chunked == offline rel {chunk_rel:.2e}")
    ok = cmp.ok() and wav_rel <= args.tol and chunk_rel <= args.tol
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=24, help="frames to generate (default 24)")
    ap.add_argument("--variant", choices=["ported", "raw"], default="ported")
    ap.add_argument("--raw-fallback", action="store_true",
                    help="--variant raw: keep the ported graph of a module whose raw export "
                         "cannot run yet (named in the log) instead of stopping")
    ap.add_argument("--size", choices=["tiny", "real"], default="tiny")
    ap.add_argument("--synth", action="store_true",
                    help="real size: synth-bin weights, no torch comparison")
    ap.add_argument("--work", type=Path, default=REAL_WORK,
                    help=f"real size: the exported .bin files and torch references, reused "
                         f"(default {REAL_WORK})")
    ap.add_argument("--tie-tol", type=float, default=None,
                    help="real size: a divergence is a near tie when torch's gap between "
                         "the two codes is at most this times max|logit| (default "
                         "qwen3tts.divergence.TIE_TOL)")
    ap.add_argument("--stage", choices=["export", "reference"], help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None,
                    help="ncnn threads (default: 1 tiny, 2 real)")
    ap.add_argument("--chunks", default="1,3,2",
                    help="chunked decode: frames per chunk, cycled (default 1,3,2)")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="relative tolerance of both waveform comparisons (default 1e-4)")
    ap.add_argument("--keep", type=Path, help="keep the assembled graphs in this directory")
    args = ap.parse_args(argv)
    if args.stage:
        stage_child(args.stage, args.work, args.frames)
        return 0
    if args.frames < 1:
        ap.error("--frames must be at least 1")
    if args.threads is None:
        args.threads = 2 if args.synth else 1
    if args.tie_tol is None:
        from qwen3tts.divergence import TIE_TOL

        args.tie_tol = TIE_TOL
    if args.size == "real" and not args.synth:
        return run_real_torch(args)
    try:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            return (run_real if args.size == "real" else run_tiny)(args, args.keep)
        with tempfile.TemporaryDirectory(prefix="e2e-qwen3tts-") as tmp:
            return (run_real if args.size == "real" else run_tiny)(args, Path(tmp))
    except assemble.RawNotReady as exc:
        print(f"e2e: --variant raw cannot run: {exc.module}: {exc.reason}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
