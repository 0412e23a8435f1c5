#!/usr/bin/env python
"""Memory of verification at model scale (issue 15): the peak memory of every numeric check
against the weight bytes of the model it checks; goal peak <= 1.2x the weights.

    python tools/bench_memory.py [--size real|tiny] [--work DIR] [--only NAME,...]
                                 [--frames 12] [--chunks 1,3,2] [--goal 1.2]
                                 [--interval 0.05] [--json out.json]

Inputs are built from the real-size Qwen3-TTS fixtures (fixtures/qwen3_tts/real/, no
weights kept) with `paramsurgery synth-bin` fp32 weights:
- the talker decoder (talker_decoder.ported: 28 layers, 1.76 GB) for add-kvcache --verify,
  verify-kvcache, fold-gqa --verify (on its twin with K/V expanded to the query heads,
  `expand_gqa`; the expansion layers have no weights, so one .bin serves both),
  fold-explicit-cache --verify (its cached twin with the cache made explicit again:
  Concat(past, current) per SDPA, `explicit_cache`), extract --verify (the first half of
  the layers), fix --verify (the raw export, talker_decoder.raw, which reads the same .bin,
  against the ported graph's ncnn output as its reference), compare (expanded against plain) and reduce (a
  copy whose last residual add multiplies: a mismatch against the plain graph);
- the codec decoder's conv stack (codec_decoder.ported cut where the README's streaming
  workflow cuts it, `extract` up to out0: 322 layers, 0.29 GB) for stream-check;
- a wider causal conv stack (`wide_stack`: 12 residual 2048-channel K=7 convs and a x4
  transposed-conv upsampler, 1.44 GB) for stream-check where the weights, not the
  interpreters and the activations, make up most of the memory.

Every command runs in a fresh process under `tools/peak_rss.py`'s sampler (the process
tree's summed RSS, and its PSS, every --interval s), one at a time. Printed: each command
line, then one table (command, weight bytes, peak RSS, ratio, goal, pass/fail; PSS and wall
time too). --work DIR keeps the built inputs there and reuses them on the next run (the
synth-bin of the talker takes about a minute); without it they go in a temporary directory
that is deleted at the end. Command outputs are deleted after each command. Disk: ~3.5 GB
(the .bin files; outputs that keep the weights are hard links). Exit 1 when a command failed
or a ratio is over the goal.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from peak_rss import Peak, measure  # noqa: E402

from paramsurgery.formats.io import load  # noqa: E402
from paramsurgery.verify.kvcache import causal_mask, rope_tables  # noqa: E402
from paramsurgery.passes.extract import extract_subgraph  # noqa: E402
from paramsurgery.passes.fold_gqa import expand_gqa  # noqa: E402
from paramsurgery.core.npz import write_npz  # noqa: E402
from qwen3tts.assemble import codec_cut_blob  # noqa: E402
from paramsurgery.formats.io import save  # noqa: E402

# per fixture size: the talker's hidden size and RoPE table width, the conv stack's channels
# and the wide conv stack's width and depth
SIZES = {"real": {"hidden": 1024, "rope": 128, "conv_channels": 1024, "wide": (2048, 12)},
         "tiny": {"hidden": 64, "rope": 16, "conv_channels": 48, "wide": (64, 3)}}
TOKENS = 8  # rows of the talker's inputs (compare --at T=, reduce/extract feeds)


@dataclass
class Row:
    name: str
    command: list[str]
    weights: int
    peak_rss: int = 0
    peak_pss: int = 0
    returncode: int = 0
    seconds: float = 0.0

    @property
    def ratio(self) -> float:
        return self.peak_rss / self.weights

    @property
    def pss_ratio(self) -> float:
        return self.peak_pss / self.weights


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "paramsurgery", *map(str, args)]


def _run_cli(*args: str) -> None:
    subprocess.run(_cli(*args), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def _synth(param: Path, bin_path: Path) -> None:
    if not bin_path.exists():
        print(f"  synth-bin {param.name} -> {bin_path.name}", file=sys.stderr, flush=True)
        _run_cli("synth-bin", param, "-o", bin_path)


def build_inputs(size: str, work: Path) -> dict[str, Path]:
    """Write (or reuse) every input in `work`; returns them by role."""
    fixtures = ROOT / "fixtures" / "qwen3_tts" / size
    dims = SIZES[size]
    f = {"talker": work / "talker.param", "bin": work / "talker.bin",
         "kv": work / "talker.kv.param", "explicit": work / "talker.explicit.param",
         "expanded": work / "talker.expanded.param",
         "bad": work / "talker.bad.param", "feeds": work / "talker.inputs.npz",
         "raw": work / "talker_raw.ncnn.param", "raw_ref": work / "talker_raw.ref.npz",
         "stack": work / "stack.param", "stack_bin": work / "stack.bin",
         "wide": work / "wide.param", "wide_bin": work / "wide.bin"}
    if not f["talker"].exists():
        shutil.copyfile(fixtures / "talker_decoder.ported.ncnn.param", f["talker"])
    _synth(f["talker"], f["bin"])
    if not f["kv"].exists():
        _run_cli("add-kvcache", f["talker"], "-o", f["kv"])
    if not f["explicit"].exists():
        f["explicit"].write_text(explicit_cache(f["kv"].read_text()))
    if not f["expanded"].exists():
        g = load(f["talker"])
        expand_gqa(g)
        save(g, f["expanded"])
    if not f["bad"].exists():
        g = load(f["talker"])
        adds = [la for la in g.by_type("BinaryOp") if la.params.get(0) == 0
                and len(la.inputs) == 2]
        _run_cli("set-param", f["talker"], "--layer", adds[-1].name, "0=2", "-o", f["bad"])
    if not f["feeds"].exists():
        rng = np.random.default_rng(0)
        cos, sin = rope_tables(np.arange(TOKENS), dims["rope"], 1_000_000.0)
        write_npz(f["feeds"], {"in0": rng.standard_normal((TOKENS, dims["hidden"]))
                               .astype(np.float32),
                               "in1": causal_mask(TOKENS, 0)[None], "in2": cos, "in3": sin})
    if not f["raw"].exists():
        for kind in ("ncnn", "pnnx"):
            shutil.copyfile(fixtures / f"talker_decoder.raw.{kind}.param",
                            work / f"talker_raw.{kind}.param")
    if not f["raw_ref"].exists():
        write_raw_reference(f)
    if not f["stack"].exists():
        codec = load(fixtures / "codec_decoder.ported.ncnn.param")
        save(extract_subgraph(codec, [codec_cut_blob(codec)], list(codec.outputs)), f["stack"])
    _synth(f["stack"], f["stack_bin"])
    if not f["wide"].exists():
        f["wide"].write_text(wide_stack(*dims["wide"]))
    _synth(f["wide"], f["wide_bin"])
    return f


def wide_stack(channels: int, layers: int) -> str:
    """A causal conv stack like the codec's, wider: `layers` residual units (left Padding,
    Convolution1D K=7 channels -> channels, ReLU, residual add), a causal transposed conv
    upsampler (K=8, stride 4, right trim 4) to channels/4, and a Convolution1D to one
    channel. Frames along numpy axis 1 of (channels, T)."""
    c, lines, blob = channels, [], "in0"
    lines.append("Input in0 0 1 in0")
    for i in range(layers):
        lines += [f"Split split_{i} 1 2 {blob} r{i}a r{i}b",
                  f"Padding pad_{i} 1 1 r{i}a p{i} 0=0 1=0 2=6 3=0 4=0 5=0.0 6=0",
                  f"Convolution1D conv_{i} 1 1 p{i} c{i} 0={c} 1=7 2=1 3=1 4=0 5=1 "
                  f"6={c * c * 7}",
                  f"ReLU relu_{i} 1 1 c{i} a{i}",
                  f"BinaryOp res_{i} 2 1 r{i}b a{i} h{i} 0=0"]
        blob = f"h{i}"
    up = c // 4
    lines += [f"Deconvolution1D up 1 1 {blob} u 0={up} 1=8 2=1 3=4 4=0 5=1 6={c * up * 8}",
              "Crop trim 1 1 u ut -23310=1,-4 -23311=1,-1 -23309=1,0",
              "Padding pad_out 1 1 ut po 0=0 1=0 2=6 3=0 4=0 5=0.0 6=0",
              f"Convolution1D conv_out 1 1 po out0 0=1 1=7 2=1 3=1 4=0 5=1 6={up * 7}"]
    blobs = {t for ln in lines for t in ln.split()[4:] if "=" not in t}
    return f"7767517\n{len(lines)} {len(blobs)}\n" + "\n".join(lines) + "\n"


def write_raw_reference(f: dict[str, Path]) -> None:
    """The reference `fix --verify` checks the raw talker against: the ported talker's
    output through ncnn with the same weights (both are exports of one torch module and
    read one .bin; at tiny size their torch references are identical), on inputs in the
    raw export's layout (batch axes kept; M-RoPE tables: the same plain table for each of
    the 3 sections, text positions being equal in all three)."""
    from paramsurgery.runtime.child import run_isolated

    with np.load(f["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    res = run_isolated(f["talker"], f["bin"], feeds, ["out0"])
    if not res.ok:
        raise SystemExit(f"the ported talker did not run: {res.describe()}")
    tables = {b: np.broadcast_to(feeds[b][None, None], (3, 1) + feeds[b].shape).copy()
              for b in ("in2", "in3")}
    write_npz(f["raw_ref"], {"in0": feeds["in0"][None], "in1": feeds["in1"][None], **tables,
                             "out0": res.outputs["out0"][None],
                             **{f"batch_index_{b}": np.array(i) for b, i in
                                (("in0", 0), ("in1", 0), ("in2", 1), ("in3", 1),
                                 ("out0", 0))}})


def explicit_cache(kv_text: str) -> str:
    """The inverse of `fold-explicit-cache` on a graph with SDPA's native cache (6 bottoms,
    3 tops, 7=1): per SDPA, Concat(past, current) along the sequence axis feeds SDPA and,
    through a Split, leaves the graph as the present k/v, the cache blobs keeping their
    names."""
    head, counts, *rows = kv_text.splitlines()
    n_layers, n_blobs = map(int, counts.split())
    out = []
    for row in rows:
        f = row.split()
        if f[0] != "SDPA" or "7=1" not in f[12:]:
            out.append(row)
            continue
        name, (q, k, v, mask, past_k, past_v), (y, present_k, present_v) = f[1], f[4:10], \
            f[10:13]
        for side, cur, past, present in (("k", k, past_k, present_k), ("v", v, past_v,
                                                                         present_v)):
            out += [f"Concat {name}_cat_{side} 2 1 {past} {cur} {name}_{side}{side} 0=1",
                    f"Split {name}_split_{side} 1 2 {name}_{side}{side} {name}_{side}{side}_0 "
                    f"{present}"]
        params = [x for x in f[13:] if x != "7=1"]
        out.append(" ".join(["SDPA", name, "4", "1", q, f"{name}_kk_0", f"{name}_vv_0", mask, y,
                             *params]))
        n_layers += 4
        n_blobs += 4
    return "\n".join([head, f"{n_layers} {n_blobs}", *out]) + "\n"


def half_way_blob(param: Path) -> str:
    """The residual stream after the middle decoder layer: an output for extract --verify."""
    g = load(param)
    adds = [la for la in g.by_type("BinaryOp") if la.params.get(0) == 0 and len(la.inputs) == 2]
    return adds[len(adds) // 2].outputs[0]


def commands(f: dict[str, Path], out: Path, size: str, frames: int, chunks: str
             ) -> list[Row]:
    dims = SIZES[size]
    talker_w = f["bin"].stat().st_size
    stack_w = f["stack_bin"].stat().st_size
    shape = [f"in0=[T,{dims['hidden']}]", "in1=[1,T,T]", f"in2=[T,{dims['rope']}]",
             f"in3=[T,{dims['rope']}]"]
    cut = load(f["stack"]).inputs[0]
    return [
        Row("add-kvcache --verify", _cli("add-kvcache", f["talker"], "--bin", f["bin"], "-o",
                                         out / "kv.param", "--verify"), talker_w),
        Row("verify-kvcache", _cli("verify-kvcache", f["kv"], f["bin"], "--reference",
                                   f["talker"]), talker_w),
        Row("fold-gqa --verify", _cli("fold-gqa", f["expanded"], "--bin", f["bin"], "-o",
                                      out / "folded.param", "--verify"), talker_w),
        Row("fold-explicit-cache --verify", _cli("fold-explicit-cache", f["explicit"], "--bin",
                                                 f["bin"], "-o", out / "native.param",
                                                 "--verify", "--inputshape", *shape),
            talker_w),
        Row("fix --verify", _cli("fix", f["raw"], "--bin", f["bin"], "-o", out / "fixed.param",
                                 "--verify", "--reference", f["raw_ref"]), talker_w),
        Row("extract --verify", _cli("extract", f["talker"], f["bin"], "--outputs",
                                     half_way_blob(f["talker"]), "-o", out / "half.param",
                                     "--verify", "--feeds", f["feeds"]), talker_w),
        Row("compare", _cli("compare", f["expanded"], f["bin"], "--reference", f["talker"],
                            "--reference-bin", f["bin"], "--inputshape", *shape, "--at",
                            f"T={TOKENS}"), talker_w),
        Row("reduce", _cli("reduce", f["bad"], f["bin"], "--fails", "mismatch", "--reference",
                           f["talker"], "--reference-bin", f["bin"], "--inputs", f["feeds"],
                           "-o", out / "reduced", "-q"), talker_w),
        Row("stream-check", _cli("stream-check", f["stack"], f["stack_bin"], "--chunks", chunks,
                                 "--frames", str(frames), "--input-shape",
                                 f"{cut}=T,{dims['conv_channels']}", "--tol", "1e-4"),
            stack_w),
        Row("stream-check wide", _cli("stream-check", f["wide"], f["wide_bin"], "--chunks",
                                      chunks, "--frames", str(frames), "--input-shape",
                                      f"in0={dims['wide'][0]},T", "--tol", "1e-4"),
            f["wide_bin"].stat().st_size),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="real")
    ap.add_argument("--work", type=Path, help="build the inputs here and keep them (reused "
                    "when present); default: a temporary directory, deleted at the end")
    ap.add_argument("--only", help="comma-separated command names (e.g. stream-check,reduce)")
    ap.add_argument("--frames", type=int, default=12, help="stream-check --frames (default 12)")
    ap.add_argument("--chunks", default="1,3,2", help="stream-check --chunks (default 1,3,2)")
    ap.add_argument("--goal", type=float, default=1.2, help="peak / weights goal (default 1.2)")
    ap.add_argument("--interval", type=float, default=0.05, help="sampling period (s)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args()

    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-memory-")
        work = Path(tmp.name)
    else:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    try:
        files = build_inputs(args.size, work)
        out = work / "out"
        rows = commands(files, out, args.size, args.frames, args.chunks)
        if args.only:
            wanted = {w.strip() for w in args.only.split(",")}
            rows = [r for r in rows if r.name.split()[0] in wanted or r.name in wanted]
        for row in rows:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            print("$ " + " ".join(map(str, row.command)), flush=True)
            with tempfile.TemporaryFile() as err:
                peak: Peak = measure(row.command, args.interval, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=err)
                if peak.returncode != 0:
                    err.seek(0)
                    tail = err.read().decode(errors="replace").strip().splitlines()[-5:]
                    print("  exit %d: %s" % (peak.returncode, " | ".join(tail)), flush=True)
            row.peak_rss, row.peak_pss = peak.rss, peak.pss
            row.returncode, row.seconds = peak.returncode, peak.seconds
        shutil.rmtree(out, ignore_errors=True)
    finally:
        if tmp is not None:
            tmp.cleanup()

    head = (f"{'command':<28} {'weights GB':>10} {'peak RSS GB':>11} {'ratio':>6} "
            f"{'goal':>5} {'':4} {'PSS GB':>7} {'ratio':>6} {'exit':>4} {'s':>5}")
    print(head)
    failed = False
    for r in rows:
        ok = r.returncode == 0 and r.ratio <= args.goal
        failed |= not ok
        print(f"{r.name:<28} {r.weights / 1e9:>10.3f} {r.peak_rss / 1e9:>11.3f} {r.ratio:>6.2f} "
              f"{args.goal:>5.2f} {'pass' if ok else 'FAIL':4} {r.peak_pss / 1e9:>7.3f} "
              f"{r.pss_ratio:>6.2f} {r.returncode:>4} {r.seconds:>5.0f}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "command": list(map(str, r.command)),
                                          "ratio": r.ratio, "pss_ratio": r.pss_ratio}
                                         for r in rows], indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
