#!/usr/bin/env python
"""`paramsurgery quantize` against ncnn's own int8 tools (ncnn2table, ncnn2int8), on corpus
CNNs with seeded random weights (`synth-bin`):

    tools/build_ncnn_quant_tools.sh                 # once: builds the two tools (~20 min)
    python tools/compare_ncnn_quantize.py [--tools DIR] [--json] [--models a b ...]

Per model: 8 seeded calibration inputs (3x64x64, .npz for us, .npy for ncnn2table) and one
held-out input; ncnn2table (method=kl, type=1) and our calibration (kl) are compared scale
for scale; ncnn2int8 and our quantize-int8 pass are both run on ncnn2table's table and their
outputs compared byte for byte (the .param ignoring -23330 shape hints, which ncnn's
ModelWriter writes in its own 5-value form, and params at their defaults, which ModelWriter
omits); then the held-out input runs through ncnn (the
pip wheel) for fp32, ncnn2int8's model, and ours (our own table), and the errors against
fp32 are printed. Exit 1 when a scale differs by more than 1e-6 or the files differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import paramsurgery  # noqa: E402
from paramsurgery.formats.weights import write_synth_bin  # noqa: E402
from paramsurgery.passes.quantize_int8 import Int8Table, QuantizeInt8  # noqa: E402
from paramsurgery.runtime.child import Feed  # noqa: E402
from paramsurgery.verify.compare.options import PARITY  # noqa: E402
from paramsurgery.verify.precision.batch import Variant, Worker  # noqa: E402
from paramsurgery.verify.precision.calibrate import calibrate  # noqa: E402
from paramsurgery.verify.precision.metrics import METRICS  # noqa: E402

MODELS = ("squeezenet_v1.1", "mobilenet")
SHAPE = (3, 64, 64)
N_CALIB = 8


def _no_hints(path: Path) -> list[tuple]:
    """Every layer as (type, name, bottoms, tops, params) with the -23330 shape hints and
    the params at ncnn's default left out (ncnn's ModelWriter omits defaults and writes
    hints in its own form; the corpus files spell some defaults out)."""
    from paramsurgery.core.layer_params import param_default

    out = []
    for layer in paramsurgery.load(str(path)):
        params = {}
        for pid in layer.params:
            if pid in (30, -23330):  # the shape hints (-23330 = array id 30)
                continue
            v = layer.params.get(pid)
            d = param_default(layer.type, pid, layer.params)
            if d is not None and (v == d or (isinstance(v, float) and isinstance(d, (int, float))
                                             and float(v) == float(d))):
                continue
            params[pid] = v
        out.append((layer.type, layer.name, tuple(layer.inputs), tuple(layer.outputs),
                    sorted(params.items())))
    return out


def compare(model: str, tools: Path, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    param = work / f"{model}.param"
    param.write_text((ROOT / "fixtures" / "ncnn_corpus" / f"{model}.param").read_text())
    binp = work / f"{model}.bin"
    g = paramsurgery.load(str(param))
    with open(binp, "wb") as fh:
        write_synth_bin(g, fh)
    g = paramsurgery.load(str(param), bin=str(binp))
    inp = g.inputs[0]
    rng = np.random.default_rng(2026)
    calib, npys = [], []
    for i in range(N_CALIB):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        np.save(work / f"c{i}.npy", x)
        npys.append(str(work / f"c{i}.npy"))
        calib.append({inp: Feed(x)})
    held_out = rng.standard_normal(SHAPE).astype(np.float32)
    (work / "list.txt").write_text("\n".join(npys) + "\n")
    ncnn_table = work / "ncnn.table"
    subprocess.run([str(tools / "ncnn2table"), str(param), str(binp), str(work / "list.txt"),
                    str(ncnn_table), f"shape=[{SHAPE[2]},{SHAPE[1]},{SHAPE[0]}]", "pixel=RAW",
                    "thread=1", "method=kl", "type=1"], check=True, capture_output=True,
                   timeout=1800)
    theirs = Int8Table.read(ncnn_table)
    ours, _ = calibrate(g, str(binp), calib, method="kl")
    w_diff = max(float(np.max(np.abs(ours.weights[k] / theirs.weights[k] - 1)))
                 for k in theirs.weights)
    i_diff = max(abs(ours.inputs[k] / theirs.inputs[k] - 1) for k in theirs.inputs)
    missing = sorted(set(theirs.inputs) ^ set(ours.inputs))
    ref_param, ref_bin = work / "ncnn2int8.param", work / "ncnn2int8.bin"
    subprocess.run([str(tools / "ncnn2int8"), str(param), str(binp), str(ref_param),
                    str(ref_bin), str(ncnn_table)], check=True, capture_output=True, timeout=600)
    same_table = QuantizeInt8(theirs)(g).graph
    st_param, st_bin = work / "ours_ncnn_table.param", work / "ours_ncnn_table.bin"
    paramsurgery.save(same_table, str(st_param), bin=str(st_bin))
    own = QuantizeInt8(ours)(g).graph
    own_param, own_bin = work / "ours.param", work / "ours.bin"
    paramsurgery.save(own, str(own_param), bin=str(own_bin))
    out = g.outputs[0]
    opts = dict(PARITY, use_int8_inference=True)
    with Worker(str(binp), {inp: Feed(held_out)}) as w:
        fp32, ref, mine = w.run([
            Variant(param.read_text(), opts, [out]),
            Variant(ref_param.read_text(), opts, [out], bin=str(ref_bin)),
            Variant(own_param.read_text(), opts, [out], bin=str(own_bin))])

    def errors(r) -> dict:
        return {k: METRICS[k].measure(r.arrays[out], fp32.arrays[out]) for k in METRICS}

    return {
        "int8_layers": len(theirs.inputs), "missing": missing,
        "weight_scale_max_rel_diff": w_diff, "input_scale_max_rel_diff": i_diff,
        "bin_identical": st_bin.read_bytes() == ref_bin.read_bytes(),
        "param_identical_but_hints": _no_hints(st_param) == _no_hints(ref_param),
        "ncnn2int8_vs_fp32": errors(ref), "ours_vs_fp32": errors(mine),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default="/tmp/paramsurgery-ncnn-tools/build/tools/quantize",
                    help="where ncnn2table and ncnn2int8 are")
    ap.add_argument("--work", default="/tmp/paramsurgery-quant-compare")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    tools = Path(args.tools)
    if not (tools / "ncnn2table").exists():
        print(f"{tools}: no ncnn2table (run tools/build_ncnn_quant_tools.sh)", file=sys.stderr)
        return 2
    report = {m: compare(m, tools, Path(args.work) / m) for m in args.models}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for m, r in report.items():
            e, o = r["ncnn2int8_vs_fp32"], r["ours_vs_fp32"]
            print(f"{m}: {r['int8_layers']} int8 layers; scales vs ncnn2table: weights max rel "
                  f"diff {r['weight_scale_max_rel_diff']:.2g}, inputs "
                  f"{r['input_scale_max_rel_diff']:.2g}; from ncnn's table: .bin "
                  f"{'byte-identical' if r['bin_identical'] else 'DIFFERENT'} to ncnn2int8's, "
                  f".param {'identical' if r['param_identical_but_hints'] else 'DIFFERENT'} "
                  f"but for -23330 hints and spelled-out defaults")
            print(f"  held-out input vs fp32: ncnn2int8 rel {e['rel']:.3g} snr {e['snr']:.1f} dB"
                  f" cos {e['cos']:.6f}; ours rel {o['rel']:.3g} snr {o['snr']:.1f} dB cos "
                  f"{o['cos']:.6f}")
    bad = any(r["weight_scale_max_rel_diff"] > 1e-6 or r["input_scale_max_rel_diff"] > 1e-6
              or not r["bin_identical"] or not r["param_identical_but_hints"] or r["missing"]
              for r in report.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
