#!/usr/bin/env python
"""Qwen3-TTS end to end with a reduced-precision build at tiny size: what the mixed build
of `tools/qwen3tts_precision_table.py` does to the codes and the waveform.

    python tools/qwen3tts_precision_e2e.py [--mode bf16] [--tol 40] [--frames 24]

1. For every tiny module, the `paramsurgery precision` search (metric SNR, --tol dB against
   the module's fp32 ncnn run on its reference input) gives the layers to keep in fp32.
2. The pipeline is assembled as `tools/e2e_qwen3tts.py` does (fp32); the mixed build is the
   same pipeline with each part's kept layers masked (`keep-precision`, the part's layers of
   that name; the count of kept names found is printed) and run with the mode's options
   (ncnn's bf16 storage on every other layer). The unprotected build (no layer kept) is run
   too: what the protection buys.
3. Each build generates greedily from the same text and mels; its codes are compared frame
   by frame with the fp32 ncnn run (the first frame that differs is named), and its codec
   decodes the fp32 run's codes: that waveform's SNR (dB, against the fp32 waveform) is the
   codec's own effect, whatever the codes did. (Speed: the table tool measures it per
   module, interleaved; one end-to-end run here would not be a fair timing.)

Last line: `precision e2e (bf16): codes N/N frames identical to fp32; codec waveform SNR X dB
(unprotected: M/N, Y dB)`. Exit 1 when the mode is in effect in no module.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from e2e_qwen3tts import REFERENCE  # noqa: E402
from qwen3tts import assemble  # noqa: E402
from qwen3tts.ncnn_pipeline import Generator, Settings  # noqa: E402
from qwen3tts_precision_table import MODULES, module_rows  # noqa: E402

from paramsurgery.runtime.child import RunOptions  # noqa: E402


@dataclasses.dataclass
class ReducedOptions(RunOptions):
    """fp32 parity options with the mode's switches on (ncnn's bf16 / fp16 storage)."""

    mode: str = "bf16"

    def apply(self, net) -> None:  # noqa: ANN001 - an ncnn.Net
        from paramsurgery.verify.compare.options import ALIASES

        super().apply(net)
        for key, value in ALIASES[self.mode].items():
            setattr(net.opt, key, value)


def snr_db(x: np.ndarray, ref: np.ndarray) -> float:
    if x.shape != ref.shape:
        return float("-inf")
    noise = float(np.sum((x.astype(np.float64) - ref) ** 2))
    power = float(np.sum(ref.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(power / noise)


def masked_pipeline(pipe: assemble.Pipeline, kept: dict[str, list[str]], mode: str,
                    work: Path) -> tuple[assemble.Pipeline, list[str]]:
    """The pipeline with each part's kept layers masked (the names its module's search kept
    that the part has); a line per part that keeps any."""
    import paramsurgery
    from paramsurgery.passes.keep_precision import KeepPrecision

    log = []

    def masked(part: assemble.Part) -> assemble.Part:
        names = kept.get(part.module, [])
        if not names:
            return part
        g = paramsurgery.load(str(part.param))
        have = tuple(n for n in names if g.find(n) is not None)
        log.append(f"{part.name} ({part.module}): {len(have)} of {len(names)} kept layer(s) "
                   f"present, masked")
        if not have:
            return part
        out = work / f"{part.name}.{mode}.param"
        out.write_text(paramsurgery.dumps(KeepPrecision(have, mode)(g).graph))
        return dataclasses.replace(part, param=out)

    parts = {name: masked(part) for name, part in pipe.parts.items()}
    return dataclasses.replace(pipe, parts=parts, codec_front=masked(pipe.codec_front)), log


def _searched_codec(mixed: assemble.Pipeline, pipe: assemble.Pipeline, feeds: dict,
                    args: argparse.Namespace, work: Path) -> assemble.Pipeline:
    import paramsurgery
    from paramsurgery.verify.precision.search import search

    part = pipe.parts["codec"]
    g = paramsurgery.load(str(part.param), bin=str(part.bin))
    res = search(g, str(part.bin), feeds, mode=args.mode, metric="snr", tol=args.tol)
    print(f"  codec as assembled ({len(g)} layers): its own {args.mode} search keeps "
          f"{len(res.kept)} layer(s) for {args.tol:g} dB (every layer reduced: "
          f"{res.worst(res.all_reduced):.1f} dB, kept: {res.worst(res.final):.1f} dB"
          f"{'' if res.reached else ', not reached'})", flush=True)
    out = work / f"codec.searched.{args.mode}.param"
    out.write_text(res.text)
    parts = dict(mixed.parts, codec=dataclasses.replace(part, param=out))
    return dataclasses.replace(mixed, parts=parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--tol", type=float, default=40.0, help="SNR dB per module (40)")
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    kept: dict[str, list[str]] = {}
    in_effect = 0
    for module in MODULES:
        (row,) = module_rows(module, [args.mode], args.tol, reps=1)
        in_effect += bool(row["in_effect"])
        kept[module] = list(row["kept"]) if row["in_effect"] else []
        print(f"{module}: {args.mode} {'in effect' if row['in_effect'] else 'not in effect'}; "
              f"{len(kept[module])} layer(s) kept for {args.tol:g} dB"
              + ("" if row["reached"] else " (not reached)"), flush=True)
    if not in_effect:
        print(f"precision e2e ({args.mode}): {args.mode} not in effect here on any module")
        return 1
    with np.load(REFERENCE) as data:
        ref = {k: data[k] for k in data.files}
    s = Settings.from_npz(ref)
    frames = min(args.frames, s.frames)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-prec-e2e-") as tmp:
        work = Path(tmp)
        (work / "fp32").mkdir()
        pipe = assemble.assemble("tiny", "ported", work / "fp32")
        mixed, log = masked_pipeline(pipe, kept, args.mode, work)
        for line in log:
            print("  " + line)
        # the codec as assembled (fused codebooks, renamed layers) is not the module the
        # table searched: its own search, on the fp32 run's codes, gives its kept set
        gen32 = Generator(pipe, options=RunOptions(num_threads=args.threads))
        codes32 = gen32.generate(ref["input_text_ids"], ref["input_mels"], s, frames)["codes"]
        mixed = _searched_codec(mixed, pipe, gen32._codec_feeds(codes32, 0), args, work)
        runs = {}
        for label, p, opts in (
                ("fp32", pipe, RunOptions(num_threads=args.threads)),
                ("mixed", mixed, ReducedOptions(num_threads=args.threads, mode=args.mode)),
                ("unprotected", pipe, ReducedOptions(num_threads=args.threads, mode=args.mode))):
            gen = Generator(p, options=opts)
            codes = gen.generate(ref["input_text_ids"], ref["input_mels"], s, frames)["codes"]
            base = runs["fp32"][0] if runs else codes
            runs[label] = (codes, gen.decode_offline(base))
    codes32, wav32 = runs["fp32"]
    lines = {}
    for label in ("mixed", "unprotected"):
        codes, wav = runs[label]
        same = [bool(np.array_equal(codes[i], codes32[i])) for i in range(frames)]
        first = next((i for i, ok in enumerate(same) if not ok), None)
        snr = snr_db(wav, wav32)
        lines[label] = f"{sum(same)}/{frames}", snr
        print(f"{label}: codes {sum(same)}/{frames} frames identical to fp32"
              + (f" (first difference at frame {first}: {codes[first].tolist()[:4]}... vs "
                 f"{codes32[first].tolist()[:4]}...)" if first is not None else "")
              + f"; its codec on fp32's codes: waveform SNR {snr:.1f} dB")
    (mc, ms), (uc, us) = lines["mixed"], lines["unprotected"]
    print(f"precision e2e ({args.mode}): codes {mc} frames identical to fp32; codec waveform SNR "
          f"{ms:.1f} dB (unprotected: {uc}, {us:.1f} dB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
