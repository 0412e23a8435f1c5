#!/usr/bin/env python
"""Where the real-size codec's time goes: every convolution of the codec conv stack (the
upsampler + vocoder after the transformer) timed alone through ncnn, next to torch's
conv1d / conv_transpose1d on the same weights and input, 1 thread.

    python tools/qwen3tts/profile_codec.py [--work /tmp/e2e-qwen3tts-real] [--frames 16]

Reads `<work>/assembled/codec_conv.{param,bin}` (written by `tools/e2e_qwen3tts.py --size
real`). The stack runs once in ncnn on random (frames, 1024) rows to get every conv's real
input; each conv layer is then cut out with `extract` and timed alone (median of 5 after a
warm-up), torch runs the same op on the same input and weights (its output is checked
against ncnn's, rel <= 1e-4, so the two time the same computation), and the same layer is
timed once more as ncnn's 2-D op (Convolution / Deconvolution / ConvolutionDepthWise with
kernel_h 1 on a (C, 1, T) view, the same .bin; its output checked against the 1-D layer's):
what a 1-D -> 2-D rewrite pass would win. Prints one line per layer type and the slowest
layers, and the whole stack's ncnn time for scale.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CONV_TYPES = ("Convolution1D", "Deconvolution1D", "ConvolutionDepthWise1D")


def _median_time(fn, repeat: int = 5) -> float:   # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _torch_op(layer, x: np.ndarray):  # type: ignore[no-untyped-def]
    """The layer as a torch call on x (C, T), weights from its .bin."""
    import torch
    import torch.nn.functional as F

    p = layer.params
    cout, k = int(p.get(0)), int(p.get(1, 1))
    dil, stride = int(p.get(2, 1)), int(p.get(3, 1))
    pad = int(p.get(4, 0))
    arrays = [w.array().astype(np.float32) for w in layer.weights]
    w = torch.from_numpy(arrays[0].reshape(-1))
    b = torch.from_numpy(arrays[1].reshape(-1)) if int(p.get(5, 0)) and len(arrays) > 1 else None
    xt = torch.from_numpy(np.ascontiguousarray(x))[None]
    cin = x.shape[0]
    if layer.type == "Deconvolution1D":
        w = w.reshape(cout, cin, k).transpose(0, 1).contiguous()   # ncnn: (out, in, k)
        return lambda: F.conv_transpose1d(xt, w, b, stride=stride, dilation=dil)[0], pad
    groups = int(p.get(7, 1)) if layer.type == "ConvolutionDepthWise1D" else 1
    w = w.reshape(cout, cin // groups, k)
    act, act_params = int(p.get(9, 0)), p.get(10, [])
    if act not in (0, 3):
        raise ValueError(f"{layer.name}: activation 9={act} not modelled on the torch side")

    def op() -> "torch.Tensor":
        y = F.conv1d(xt, w, b, stride=stride, dilation=dil, padding=pad, groups=groups)[0]
        # 9=3: the clamp pnnx fused into the conv (the codec's final clamp(-1, 1))
        return y.clamp(float(act_params[0]), float(act_params[1])) if act == 3 else y

    return op, pad


def _as_2d(sub_param: Path, layer, cin: int, t_in: int, out_shape: tuple) -> str:  # type: ignore[no-untyped-def]
    """The one-layer graph `sub_param` with its 1-D conv replaced by the 2-D op of ncnn on a
    (C, 1, T) view (kernel_h, dilation_h, stride_h 1; 1-D and 2-D weights share a layout)."""
    lines = [ln for ln in sub_param.read_text().splitlines()[2:] if ln.strip()]
    head = [ln for ln in lines if ln.split()[0] == "Input"]
    op = next(ln for ln in lines if ln.split()[0] != "Input").split()
    bottom, top = op[4], op[5]
    kv = dict(t.split("=", 1) for t in op[6:])
    kv.update({"11": "1", "12": "1", "13": "1"})
    if "4" in kv:
        kv["14"] = "0"
    kv.pop("18", None)         # Deconvolution1D's output pad id; 2-D has its own (18/19)
    typ = op[0].replace("1D", "")
    params = " ".join(f"{k}={v}" for k, v in kv.items())
    body = [f"Reshape as2d_in 1 1 {bottom} as2d_x 0={t_in} 1=1 2={cin}",
            f"{typ} as2d_op 1 1 as2d_x as2d_y {params}",
            f"Reshape as2d_out 1 1 as2d_y {top} 0={out_shape[1]} 1={out_shape[0]}"]
    return "\n".join(["7767517", f"{len(head) + 3} {len(head) + 3}"] + head + body) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/e2e-qwen3tts-real"))
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    import torch

    from paramsurgery import load
    from paramsurgery.formats.io import save
    from paramsurgery.passes.extract import extract_subgraph
    from paramsurgery.runtime.child import Fetch, RunOptions, load_net, run_net

    torch.set_num_threads(1)
    opts = RunOptions(num_threads=1)
    param = args.work / "assembled" / "codec_conv.param"
    g = load(param, bin=param.with_suffix(".bin"))
    (inp,) = g.inputs
    x = np.random.default_rng(0).standard_normal((args.frames, 1024)).astype(np.float32)
    net = load_net(param, param.with_suffix(".bin"), opts)
    whole = _median_time(lambda: run_net(net, {inp: x}, [Fetch(g.outputs[0])]), 3)
    convs = [layer for layer in g if layer.type in CONV_TYPES]
    values = run_net(net, {inp: x}, [Fetch(c.inputs[0]) for c in convs]
                     + [Fetch(c.outputs[0]) for c in convs])
    rows = []
    with tempfile.TemporaryDirectory(prefix="profile-codec-") as tmp:
        for i, conv in enumerate(convs):
            sub = extract_subgraph(g, [conv.inputs[0]], [conv.outputs[0]])
            sp, sb = Path(tmp) / f"c{i}.param", Path(tmp) / f"c{i}.bin"
            save(sub, sp, bin=sb)
            one = load_net(sp, sb, opts)
            xin = values[conv.inputs[0]]
            feeds, fetch = {sub.inputs[0]: xin}, [Fetch(sub.outputs[0])]
            t_ncnn = _median_time(lambda: run_net(one, feeds, fetch))  # noqa: B023 - called now
            got = values[conv.outputs[0]]
            two = Path(tmp) / f"c{i}.2d.param"
            two.write_text(_as_2d(sp, conv, xin.shape[0], xin.shape[1], got.shape))
            net2 = load_net(two, sb, opts)
            y2 = run_net(net2, feeds, fetch)[sub.outputs[0]]
            t_2d = _median_time(lambda: run_net(net2, feeds, fetch))  # noqa: B023 - called now
            err_2d = float(np.max(np.abs(y2 - got)) / (np.max(np.abs(got)) or 1.0)) \
                if y2.shape == got.shape else float("inf")
            op, _ = _torch_op(conv, xin)
            with torch.no_grad():
                t_torch = _median_time(op)
                ref = op().numpy()
            if conv.type == "Deconvolution1D" and got.shape != ref.shape:
                ref = ref[:, :got.shape[1]]
            err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) or 1.0)) \
                if got.shape == ref.shape else float("inf")
            rows.append((conv, xin.shape, got.shape, t_ncnn, t_torch, max(err, err_2d), t_2d))
    bad = [r for r in rows if r[5] > 1e-4]
    by_type: dict[str, list[float]] = {}
    for conv, _, _, tn, tt, _, t2 in rows:
        acc = by_type.setdefault(conv.type, [0, 0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += tn
        acc[2] += tt
        acc[3] += t2
    print(f"codec conv stack, {args.frames} frames, 1 thread: whole stack {whole * 1e3:.0f} ms "
          f"in ncnn; load average {os.getloadavg()[0]:.1f}")
    for t, (n, tn, tt, t2) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t} x{n}: ncnn {tn * 1e3:.0f} ms, torch {tt * 1e3:.0f} ms "
              f"(ncnn / torch {tn / tt:.1f}x); as ncnn 2-D ops {t2 * 1e3:.0f} ms "
              f"({tn / t2:.1f}x faster than 1-D)")
    total = sum(r[3] for r in rows)
    print(f"  all convs: ncnn {total * 1e3:.0f} ms ({total / whole:.0%} of the stack), torch "
          f"{sum(r[4] for r in rows) * 1e3:.0f} ms, as ncnn 2-D ops "
          f"{sum(r[6] for r in rows) * 1e3:.0f} ms")
    for conv, si, so, tn, tt, err, t2 in sorted(rows, key=lambda r: -r[3])[:args.top]:
        p = conv.params
        print(f"  {conv.name} {conv.type} k={p.get(1, 1)} s={p.get(3, 1)} d={p.get(2, 1)} "
              f"in {si} out {so}: ncnn {tn * 1e3:.1f} ms, torch {tt * 1e3:.1f} ms, as 2-D "
              f"{t2 * 1e3:.1f} ms; rel {err:.1e}")
    if bad:
        print(f"profile_codec: {len(bad)} layer(s) where torch's op is not ncnn's (rel > 1e-4): "
              + ", ".join(f"{r[0].name} {r[5]:.1e}" for r in bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
