#!/usr/bin/env python
"""The Qwen3-TTS mixed-precision table at tiny size: for each module (fixtures/qwen3_tts/tiny,
ported variants) and mode (bf16, int8), the smallest set of layers kept in fp32 for every
output within --tol (SNR dB against the module's fp32 ncnn run on its reference input, the
`paramsurgery precision` search), the error with and without them, and the speed ratio to
fp32 measured in one child process (fp32 and the reduced graph loaded side by side, runs
interleaved, median of --reps each; ratio = fp32 time / reduced time, >1 is faster).

    python tools/qwen3tts_precision_table.py [--tol 40] [--reps 30] [--modules a b] [--json]

int8 variants are calibrated (max) on the same reference input they are measured on: a
tiny-size figure of what int8 costs and buys, not a calibration study.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = ROOT / "fixtures" / "qwen3_tts" / "tiny"
MODULES = ("talker_decoder", "predictor_decoder", "predictor_heads", "talker_codec_head",
           "codec_decoder", "mimi_encoder", "speaker_encoder")


def _bench_child(spec_path: str) -> int:
    """In the child: load every graph of the spec, time them interleaved, print JSON."""
    import ncnn

    from paramsurgery.runtime.child import Feed, _to_mat

    spec = json.loads(Path(spec_path).read_text())
    with np.load(spec["inputs"]) as z:
        feeds = {n: Feed(z[f"i{k}"], b) for k, (n, b) in enumerate(spec["names"])}
    nets = []
    for g in spec["graphs"]:
        net = ncnn.Net()
        for k, v in g["settings"].items():
            if hasattr(net.opt, k):
                setattr(net.opt, k, v)
        net.opt.lightmode = True
        net.load_param(g["param"])
        net.load_model(g["bin"])
        nets.append(net)
    times: list[list[float]] = [[] for _ in nets]
    for rep in range(spec["reps"] + 2):
        for i, net in enumerate(nets):
            mats = {n: _to_mat(f) for n, f in feeds.items()}
            t0 = time.perf_counter()
            with net.create_extractor() as ex:
                for n, m in mats.items():
                    ex.input(n, m)
                for o in spec["outputs"]:
                    ex.extract(o)
            if rep >= 2:  # two warm-up rounds
                times[i].append(time.perf_counter() - t0)
    print(json.dumps([float(np.median(t)) for t in times]))
    return 0


def _speed(graphs: list[dict], feeds: dict, outputs: list[str], reps: int) -> list[float]:
    from paramsurgery.core.npz import save_arrays
    from paramsurgery.runtime.child import _as_feed
    from paramsurgery.runtime.launch import run_child

    with tempfile.TemporaryDirectory() as tmp:
        fs = {n: _as_feed(f) for n, f in feeds.items()}
        save_arrays(os.path.join(tmp, "in.npz"), {f"i{k}": f.array for k, f in enumerate(fs.values())})
        spec = {"inputs": os.path.join(tmp, "in.npz"), "names": [[n, f.batch_index] for n, f in fs.items()],
                "graphs": graphs, "outputs": outputs, "reps": reps}
        Path(tmp, "spec.json").write_text(json.dumps(spec))
        proc = run_child(__file__, "--bench-child", os.path.join(tmp, "spec.json"), timeout=1800)
        if not proc.ok:
            raise RuntimeError(f"bench child: {proc.how()} {proc.tail()}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def module_rows(module: str, modes: list[str], tol: float, reps: int) -> list[dict]:
    import paramsurgery
    from paramsurgery.analysis.traced_inputs import make_feeds
    from paramsurgery.formats.pnnx_param import read_pnnx_param
    from paramsurgery.verify.compare.options import PARITY
    from paramsurgery.verify.precision.calibrate import calibrate
    from paramsurgery.verify.precision.search import mode_settings, search

    stem = TINY / f"{module}.ported"
    param, binp = f"{stem}.ncnn.param", f"{stem}.ncnn.bin"
    g = paramsurgery.load(param, bin=binp)
    pnnx = read_pnnx_param(f"{stem}.pnnx.param")
    feeds, _ = make_feeds(g, param, pnnx, npz=f"{stem}.ref.npz")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        graphs = [{"param": param, "bin": binp, "settings": dict(PARITY)}]
        for mode in modes:
            table = calibrate(g, binp, [feeds], method="max")[0] if mode == "int8" else None
            res = search(g, binp, feeds, mode=mode, metric="snr", tol=tol, table=table)
            row = {"module": module, "mode": mode, "in_effect": res.in_effect,
                   "layers": len(res.rows), "in_effect_layers": sum(r.in_effect for r in res.rows),
                   "kept": res.kept, "snr_all_reduced": res.worst(res.all_reduced),
                   "snr_kept": res.worst(res.final), "reached": res.reached, "runs": res.runs}
            rows.append(row)
            if not res.in_effect or res.graph_out is None:
                continue
            out_p, out_b = os.path.join(tmp, f"{mode}.param"), os.path.join(tmp, f"{mode}.bin")
            if mode == "int8":
                paramsurgery.save(res.graph_out, out_p, bin=out_b)
            else:
                Path(out_p).write_text(res.text)
                out_b = binp
            graphs.append({"param": out_p, "bin": out_b, "settings": mode_settings(mode)})
            row["_graph"] = len(graphs) - 1
        outputs = [o for o in g.outputs]
        times = _speed(graphs, feeds, outputs, reps)
    for row in rows:
        i = row.pop("_graph", None)
        row["speed_ratio"] = times[0] / times[i] if i is not None else None
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tol", type=float, default=40.0, help="SNR dB every output keeps (40)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--modules", nargs="+", default=list(MODULES))
    ap.add_argument("--modes", nargs="+", default=["bf16", "int8"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--bench-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.bench_child:
        return _bench_child(args.bench_child)
    rows = [r for m in args.modules for r in module_rows(m, args.modes, args.tol, args.reps)]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    print("| module | mode | in effect | kept in fp32 | SNR all reduced | SNR kept | speed vs fp32 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if not r["in_effect"]:
            print(f"| {r['module']} | {r['mode']} | not in effect here | - | - | - | - |")
            continue
        kept = ", ".join(r["kept"]) if r["kept"] else "none"
        ratio = f"{r['speed_ratio']:.2f}x" if r["speed_ratio"] else "-"
        print(f"| {r['module']} | {r['mode']} | {r['in_effect_layers']}/{r['layers']} | {kept} | "
              f"{r['snr_all_reduced']:.1f} dB | {r['snr_kept']:.1f} dB"
              f"{'' if r['reached'] else ' (not reached)'} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
