"""add-conv-cache: the worked example of issue 10 exactly, golden text, random conv /
transposed-conv stacks streamed in random chunkings against the offline graph through ncnn
(hypothesis), and refusals with their reasons.

The stacks are written here as ncnn text (every form the pass accepts: a `Padding` before the
conv or the conv's own pad_left, convs padding less than their receptive field, transposed
convs trimmed by their own pads, a numpy `Crop`, an expression `Crop` or both, depthwise
variants, fused activations, SnakeBeta / LayerNorm / channel-mixing Gemm between them,
residual branches) with synthetic weights, so no torch is needed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.base import all_passes
from paramsurgery.passes.conv_cache import AddConvCache, add_conv_cache
from paramsurgery.runtime.child import run
from paramsurgery.streaming import StreamingRunner, convert, emitted_after, stream_compare
from paramsurgery.formats.weights import set_weights, synth_weights

from golden import check_golden
from paramsurgery.formats.param_text import dumps

# ============================================================================ stack builder


class Stack:
    """A 1-D conv stack as ncnn text. Blobs are [w=time, h=channels]; each layer method
    returns nothing and tracks (rate, offset) of the current blob from the layer's own
    parameters, independently of the pass: after n frames the stack has emitted
    max(0, rate*n - offset) samples."""

    def __init__(self, channels: int, layout: str = "col") -> None:
        self.lines: list[list] = []
        self.blobs = 0
        self.c = channels
        self.layout = layout
        self.rate, self.offset = 1, 0
        self.mins: list[tuple[int, int]] = []  # (rate, offset) of every stage output
        self.x = self._layer("Input", [], "in0")
        if layout == "row":  # frames as rows (T, C): ncnn [w=C, h=T]
            self.x = self._layer("Permute", [self.x], None, "0=1")

    def _blob(self) -> str:
        self.blobs += 1
        return str(self.blobs)

    def _layer(self, typ: str, ins: list[str], out: str | None, params: str = "",
               n_out: int = 1) -> str:
        outs = [out] if out else [self._blob() for _ in range(n_out)]
        self.lines.append([typ, f"{typ.lower()}_{len(self.lines)}", list(ins), outs, params])
        return outs[0] if len(outs) == 1 else outs

    def _stage(self) -> None:
        self.mins.append((self.rate, self.offset))

    # ---------------------------------------------------------------- stateful layers
    def conv(self, c_out: int, k: int, d: int, pad: int, form: str = "padding",
             dw: bool = False) -> None:
        c_in = self.c
        if dw:
            c_out = c_in
        x = self.x
        own = 0
        if form == "param":
            own = pad
        elif form == "split":
            own = pad // 2
        if pad - own:
            x = self._layer("Padding", [x], None,
                            f"0=0 1=0 2={pad - own} 3=0 4=0 5=0.0 6=0")
        pads = f" 4={own} 15=0" if own or form == "param" else ""
        if dw:
            self.x = self._layer("ConvolutionDepthWise1D", [x], None,
                                 f"0={c_out} 1={k} 2={d} 3=1{pads} 5=1 6={c_out * k} 7={c_out}")
        else:
            self.x = self._layer("Convolution1D", [x], None,
                                 f"0={c_out} 1={k} 2={d} 3=1{pads} 5=1 6={c_out * c_in * k}")
        self.c = c_out
        self.offset += d * (k - 1) - pad
        self._stage()

    def deconv(self, c_out: int, k: int, d: int, s: int, left: int, form: str = "crop",
               dw: bool = False, act: int = 0) -> None:
        c_in = self.c
        if dw:
            c_out = c_in
        extent = d * (k - 1) + 1
        right = extent - s
        assert right >= 0
        act_p = {0: "", 1: " 9=1", 2: " 9=2 -23310=1,1.000000e-1", 3: " 9=3 -23310=2,-5.0e-1,5.0e-1",
                 4: " 9=4"}[act]
        pads = f" 4={left} 15={right}" if form == "param" else ""
        if form == "mixed":
            pads = f" 4={left // 2} 15=0"
        typ = "DeconvolutionDepthWise1D" if dw else "Deconvolution1D"
        size = c_out * k if dw else c_out * c_in * k
        group = f" 7={c_out}" if dw else ""
        y = self._layer(typ, [self.x], None,
                        f"0={c_out} 1={k} 2={d} 3={s}{pads} 5=1 6={size}{group}{act_p}")
        if form in ("crop", "mixed") and (left or right):
            st_ = left - (left // 2 if form == "mixed" else 0)
            y = self._layer("Crop", [y], None, f"-23309=1,{st_} -23310=1,{-right} -23311=1,-1")
        elif form == "expr" and (left or right):
            end = f"-(0w,{right})" if right else "0w"
            y = self._layer("Crop", [y], None, f'19="{left}" 20="{end}" 21="1"')
        self.x = y
        self.c = c_out
        self.rate *= s
        self.offset = self.offset * s + left
        self._stage()

    # ---------------------------------------------------------------- pointwise layers
    def snake(self) -> None:
        a, b = self._layer("Split", [self.x], None, n_out=2)
        alpha = self._layer("MemoryData", [], None, f"0=1 1={self.c}")
        beta = self._layer("MemoryData", [], None, f"0=1 1={self.c}")
        t = self._layer("BinaryOp", [a, alpha], None, "0=2")
        t = self._layer("UnaryOp", [t], None, "0=9")
        t = self._layer("UnaryOp", [t], None, "0=4")
        t = self._layer("BinaryOp", [beta, t], None, "0=2")
        self.x = self._layer("BinaryOp", [b, t], None, "0=0")

    def channel_mix(self, n: int) -> None:
        t = self._layer("Permute", [self.x], None, "0=1")
        t = self._layer("Gemm", [t], None, f"10=4 2=0 3=1 4=0 5=1 6=1 7=0 8={n} 9={self.c}")
        t = self._layer("GELU", [t], None)
        self.x = self._layer("Permute", [t], None, "0=1")
        self.c = n

    def layernorm(self) -> None:
        t = self._layer("Permute", [self.x], None, "0=1")
        t = self._layer("LayerNorm", [t], None, f"0={self.c} 1=1.000000e-5 2=1")
        self.x = self._layer("Permute", [t], None, "0=1")

    def residual(self, k: int, d: int) -> None:
        """x + conv1x1(snake(causal conv(x))): a Qwen3-TTS residual unit."""
        a, b = self._layer("Split", [self.x], None, n_out=2)
        self.x = a
        rate, offset = self.rate, self.offset
        self.conv(self.c, k, d, d * (k - 1))
        self.snake()
        self.conv(self.c, 1, 1, 0)
        assert (self.rate, self.offset) == (rate, offset)
        self.x = self._layer("BinaryOp", [self.x, b], None, "0=0")

    # ---------------------------------------------------------------- output
    def text(self) -> str:
        """The param text; the last blob is renamed out0."""
        lines = []
        blobs = set()
        for typ, name, ins, outs, params in self.lines:
            outs = ["out0" if b == self.x else b for b in outs]
            blobs.update(ins)
            blobs.update(outs)
            head = "%-24s %-24s %d %d" % (typ, name, len(ins), len(outs))
            lines.append(" ".join([head] + ins + outs + ([params] if params else [])))
        return f"7767517\n{len(lines)} {len(blobs)}\n" + "\n".join(lines) + "\n"

    def count(self, frames: int) -> int:
        return max(0, self.rate * frames - self.offset)

    def buffer_frames(self) -> int:
        n = 1
        while any(r * n - o < 1 for r, o in self.mins + [(self.rate, self.offset)]):
            n += 1
        return n

    def input_shape(self, frames: int) -> tuple[int, int]:
        return (frames, self.c0) if self.layout == "row" else (self.c0, frames)


def build(stack: Stack, seed: int = 0) -> paramsurgery.Graph:
    g = paramsurgery.loads(stack.text())
    return synth_weights(g, seed=seed)


def save(g: paramsurgery.Graph, path) -> tuple[str, str]:
    p, b = str(path) + ".param", str(path) + ".bin"
    paramsurgery.save(g, p, bin=b)
    return p, b


def new_stack(c: int, layout: str = "col") -> Stack:
    s = Stack(c, layout)
    s.c0 = c
    return s


# ============================================================================ worked example

WORKED = """7767517
3 3
Input                    in0                      0 1 in0
Deconvolution1D          deconv1d_0               1 1 in0 1 0=1 1=4 3=2 5=1 6=4
Crop                     trim_0                   1 1 1 out0 -23310=1,-2 -23311=1,-1 -23309=1,2
"""


def worked_graph() -> paramsurgery.Graph:
    g = paramsurgery.loads(WORKED)
    set_weights(g.layer("deconv1d_0"), weight=np.array([1, 2, 3, 4], np.float32),
                bias=np.array([0.5], np.float32))
    return g


def test_worked_example_exact(tmp_path):
    """K=4, s=2, weights [1,2,3,4], bias 0.5, frames [1,10,100]."""
    p, b = save(worked_graph(), tmp_path / "worked")
    frames = np.array([[1, 10, 100]], np.float32)
    offline = run(p, b, {"in0": frames}, ["out0"])["out0"]
    assert offline.tolist() == [[13.5, 24.5, 130.5, 240.5]]
    conv = convert(p, b, str(tmp_path / "stream"))
    r = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    got = [r.push(np.array([[f]], np.float32)).tolist() for f in (1, 10, 100)]
    assert got == [[[]], [[13.5, 24.5]], [[130.5, 240.5]]]
    assert r.flush().tolist() == [[]]
    m = conv.manifest
    assert [emitted_after(m, n) for n in range(4)] == [0, 0, 2, 4]  # max(0, n*s - (K-s))
    assert m["stream_start"]["buffer_frames"] == 2
    assert m["states"] == [{"index": 0, "in": "conv_state_in_0", "out": "conv_state_out_0",
                            "layer": "deconv1d_0", "kind": "deconv", "samples": 2,
                            "channels": 1, "ncnn_shape": {"w": 2, "h": 1},
                            "numpy_shape": [1, 2], "init": {"fill": 0.0}}]
    # the same stream in other chunkings, and a second stream after flush (reset)
    for chunks in ([3], [1, 2], [2, 1]):
        out, pos = [], 0
        for c in chunks:
            out.append(r.push(frames[:, pos:pos + c]))
            pos += c
        out.append(r.flush())
        assert np.concatenate(out, axis=1).tolist() == offline.tolist()


def test_worked_example_golden():
    res = add_conv_cache(worked_graph())
    check_golden("streaming/worked_example.param", dumps(res.graph))
    check_golden("streaming/worked_example.start.param", paramsurgery.dumps(res.data["start_graph"]))
    man = res.data["manifest"]
    assert man["outputs"] == [{"name": "out0", "numpy_axis": 1, "numpy_shape": [1, "T"],
                               "ncnn_axis": "w", "samples_per_frame": 2, "start_trim": 2,
                               "flush_samples": 0}]
    # the bias left the deconv for a MemoryData after the overlap-add, with the same bytes
    g = res.graph
    assert g.layer("deconv1d_0").params.get(5) == 0
    assert g.layer("deconv1d_0").weights.roles == ["weight"]
    assert g.layer("deconv1d_0_bias").weights["data"].array().tolist() == [[0.5]]


def mixed_stack() -> Stack:
    s = new_stack(2, "row")
    s.conv(3, 3, 1, 2, "padding")
    s.snake()
    s.deconv(2, 4, 1, 2, 0, "crop")
    s.layernorm()
    s.conv(2, 3, 2, 4, "param", dw=True)
    s.deconv(1, 3, 1, 3, 0, "crop")
    return s


def test_mixed_stack_golden():
    res = AddConvCache()(build(mixed_stack()))
    check_golden("streaming/mixed_stack.param", dumps(res.graph))
    assert res.data["start_graph"] is None
    man = res.data["manifest"]
    assert [(s["in"], s["kind"], s["numpy_shape"]) for s in man["states"]] == [
        ("conv_state_in_0", "conv", [2, 2]), ("conv_state_in_1", "deconv", [2, 2]),
        ("conv_state_in_2", "conv", [2, 4])]
    assert man["inputs"][0]["numpy_shape"] == ["T", 2] and man["inputs"][0]["numpy_axis"] == 0
    assert man["samples_per_frame"] == {"out0": 6}
    assert "left at the stream start" in res.format()


def test_pass_is_registered_and_refuses_twice(tmp_path):
    assert "add-conv-cache" in all_passes()
    res = add_conv_cache(worked_graph())
    with pytest.raises(PassRefused, match="already streams"):
        add_conv_cache(res.graph)


# ============================================================================ hypothesis


@st.composite
def stacks(draw):
    c = draw(st.integers(1, 4))
    s = new_stack(c, draw(st.sampled_from(["col", "row"])))
    n = draw(st.integers(1, 4))
    deconvs = 0
    for _ in range(n):
        kind = draw(st.sampled_from(["conv", "conv", "deconv", "deconv", "snake", "mix",
                                     "norm", "residual"]))
        if kind == "conv":
            k = draw(st.integers(1, 6))
            d = draw(st.integers(1, 3))
            full = d * (k - 1)
            pad = draw(st.sampled_from([full, full, max(0, full - draw(st.integers(0, 3)))]))
            s.conv(draw(st.integers(1, 4)), k, d, pad,
                   draw(st.sampled_from(["padding", "param", "split"])), draw(st.booleans()))
        elif kind == "deconv" and deconvs < 2:
            deconvs += 1
            st_ = draw(st.integers(1, 4))
            k = draw(st.integers(1, 8))
            d = draw(st.integers(1, 2))
            if d * (k - 1) + 1 < st_:
                k = st_
                d = 1
            s.deconv(draw(st.integers(1, 4)), k, d, st_,
                     draw(st.sampled_from([0, 0, 0, 1, 2, d * (k - 1) + 1 - st_])),
                     draw(st.sampled_from(["crop", "param", "expr", "mixed"])),
                     draw(st.booleans()), draw(st.sampled_from([0, 0, 1, 2, 3, 4])))
        elif kind == "snake":
            s.snake()
        elif kind == "mix":
            s.channel_mix(draw(st.integers(1, 4)))
        elif kind == "norm" and s.c > 1:
            s.layernorm()
        elif kind == "residual":
            s.residual(draw(st.integers(2, 5)), draw(st.integers(1, 3)))
    if not s.mins:
        s.conv(s.c, 3, 1, 2)
    return s


@st.composite
def chunkings(draw, total):
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) \
        if total > 1 else []
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_stacks_stream_like_offline(data, tmp_path_factory):
    stack = data.draw(stacks(), label="stack")
    start = stack.buffer_frames()
    total = start + data.draw(st.integers(0, 6), label="extra frames")
    chunks = data.draw(chunkings(total), label="chunks")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    tmp = tmp_path_factory.mktemp("stack")
    p, b = save(build(stack, seed), tmp / "model")
    conv = convert(p, b, str(tmp / "stream"))
    m = conv.manifest
    assert m["stream_start"]["buffer_frames"] == (start if conv.start_param else 1)
    runner = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    rng = np.random.default_rng(seed)
    frames = rng.standard_normal(stack.input_shape(total)).astype(np.float32)
    report = stream_compare(p, b, runner, {"in0": frames}, chunks)
    assert report.ok, report.format() + "\n" + stack.text()
    # per-chunk counts: the earliest possible, from the stack's own arithmetic
    done = 0
    for c, rep in zip(chunks, report.chunks):
        assert rep.emitted == stack.count(done + c) - stack.count(done), report.format()
        done += c
    assert report.flush_samples == 0
    assert report.samples == stack.count(total)
    # the prefix emitted after n frames is what the offline graph gives for those n frames
    n = data.draw(st.integers(start, total), label="prefix")
    ax = 0 if stack.layout == "row" else 1
    prefix = np.take(frames, np.arange(n), axis=ax)
    ref = run(p, b, {"in0": prefix}, ["out0"])["out0"]
    runner.reset()
    got = [runner.push(np.take(frames, [i], axis=ax)) for i in range(n)]
    got = np.concatenate(got, axis=1)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


# ============================================================================ refusals

def refuse(text: str, match: str, time_axis=None) -> str:
    g = synth_weights(paramsurgery.loads(text), seed=0)
    with pytest.raises(PassRefused, match=match) as exc:
        AddConvCache(time_axis)(g)
    return str(exc.value)


def one(params: str, typ: str = "Convolution1D", pre: str = "", extra_blobs: int = 0) -> str:
    lines = ["Input                    in0                      0 1 in0"]
    src = "in0"
    if pre:
        lines.append(pre)
        src = "p"
    lines.append(f"{typ:<24} layer                    1 1 {src} out0 {params}")
    return f"7767517\n{len(lines)} {len(lines) + extra_blobs}\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, match", [
    (one("0=2 1=3 3=2 5=1 6=12"), "stride 2: downsampling"),
    (one("0=2 1=3 4=1 5=1 6=12"), "pads the right by 1"),
    (one("0=2 1=3 4=-233 15=-233 5=1 6=12"), "SAME padding"),
    (one("0=2 1=3 5=1 6=12", pre="Padding                  pad                      1 1 in0 p "
                                "0=0 1=0 2=3 3=0 4=0 5=0.0 6=0"), r"left pad 3 > \(K-1\)\*d = 2"),
    (one("0=2 1=3 5=1 6=12", pre="Padding                  pad                      1 1 in0 p "
                                "0=0 1=0 2=2 3=0 4=1 5=0.0 6=0"), "replicate/reflect"),
    (one("0=2 1=3 5=1 6=12", pre="Padding                  pad                      1 1 in0 p "
                                "0=0 1=0 2=1 3=1 4=0 5=0.0 6=0"), "looks 1 samples ahead"),
    (one("0=2 1=4 3=2 5=1 6=16", "Deconvolution1D"), r"right trim 0 < K-s = 2: flush"),
    (one("0=2 1=4 3=2 4=3 15=3 5=1 6=16", "Deconvolution1D"), "right trim 3 > K-s = 2"),
    (one("0=2 1=2 3=3 5=1 6=8", "Deconvolution1D"), "kernel extent 2 < stride 3"),
    (one("0=2 1=4 3=2 15=2 5=1 6=16 9=5", "Deconvolution1D"), "fused activation 5"),
    (one("0=2 1=4 3=2 20=9 5=1 6=16", "Deconvolution1D"), "output_w"),
])
def test_refusals(text, match):
    refuse(text, match, time_axis=1)


def test_refuses_time_mixing_layers_with_the_layer_named():
    base = ["Input                    in0                      0 1 in0",
            "Padding                  pad                      1 1 in0 1 0=0 1=0 2=2 3=0 4=0 5=0.0 6=0",
            "Convolution1D            conv                     1 1 1 2 0=2 1=3 5=1 6=12"]
    def text(*more):
        lines = base + list(more)
        return f"7767517\n{len(lines)} {len(lines) + 2}\n" + "\n".join(lines) + "\n"
    msg = refuse(text("LayerNorm                ln                       1 1 2 out0 0=2 1=1.000000e-5 2=1"),
                 "LayerNorm ln: normalizes over the time axis", 1)
    assert "cannot stream" in msg
    refuse(text("Reshape                  rs                       1 1 2 out0 0=-1"),
           "Reshape rs: mixes samples along the time axis", 1)
    refuse(text("Pooling1D                pool                     1 1 2 out0 0=1 1=2"),
           "mixes samples along the time axis", 1)
    refuse(text("Crop                     cr                       1 1 2 out0 -23309=1,1 -23310=1,0 -23311=1,-1"),
           "crops the time axis, and not right after a transposed conv", 1)
    refuse(text("MemoryData               md                       0 1 3 0=7",
                "BinaryOp                 add                      2 1 2 3 out0 0=0"),
           "1-D constant of 7 values against a blob whose innermost axis is time", 1)
    refuse(text("MemoryData               md                       0 1 3 0=5 1=2",
                "BinaryOp                 add                      2 1 2 3 out0 0=0"),
           "5 values along the time axis", 1)
    refuse(text("Padding                  p2                       1 1 2 out0 0=0 1=0 2=1 3=0 4=0 5=0.0 6=0"),
           "pads the time axis", 1)
    refuse(text("CustomThing              ct                       1 1 2 out0"),
           "not known to paramsurgery", 1)


def test_refuses_codec_decoder_with_its_transformer():
    """The whole tiny codec decoder (codes in): the pass names the first layer that mixes
    time in a way it cannot stream; extracting the conv part is the way."""
    from conftest import FIXTURES

    g = paramsurgery.load(FIXTURES / "qwen3_tts/tiny/codec_decoder.ported.ncnn.param")
    with pytest.raises(PassRefused, match="cannot stream"):
        AddConvCache()(g)


def test_refuses_graph_without_convs():
    text = one("0=1", typ="ReLU").replace(" 0=1", "")
    with pytest.raises(PassRefused, match="no Convolution1D"):
        AddConvCache()(paramsurgery.loads(text))


def test_time_axis_is_inferred_or_given():
    s = new_stack(3, "row")
    s.conv(2, 3, 1, 2)
    g = build(s)
    assert add_conv_cache(g).data["manifest"]["inputs"][0]["numpy_axis"] == 0
    assert add_conv_cache(g, time_axis=0).data["manifest"]["inputs"][0]["numpy_axis"] == 0
    with pytest.raises(PassRefused, match="needs \\[w=time, h=channels\\]"):
        add_conv_cache(g, time_axis=1)
    with pytest.raises(PassRefused, match="time axis 'x'"):
        add_conv_cache(g, time_axis="x")


def test_manifest_is_json_and_complete(tmp_path):
    p, b = save(build(mixed_stack(), 3), tmp_path / "m")
    conv = convert(p, b, str(tmp_path / "out"))
    data = json.loads(open(conv.manifest_path).read())
    assert data["param"] == "out.param" and data["bin"] == "out.bin"
    assert data["start_param"] is None
    assert {"inputs", "outputs", "states", "stages", "stream_start", "flush",
            "samples_per_frame"} <= set(data)
    for s in data["states"]:
        assert s["init"] == {"fill": 0.0}
    # the state Inputs carry their shapes as hints
    g = paramsurgery.load(conv.param)
    for s in data["states"]:
        assert g.layer(s["in"]).params.get(0) == s["samples"]
        assert g.layer(s["in"]).params.get(1) == s["channels"]


def test_inputshape_pins_the_input_extents():
    """--inputshape gives the input's channel count; the time analysis (shared shape
    analysis) checks it against the conv that reads it."""
    from paramsurgery.analysis.shapes import parse_inputshape

    text = one("0=2 1=3 5=1 6=12")
    g = synth_weights(paramsurgery.loads(text), seed=0)
    ok = AddConvCache(1, inputshape=parse_inputshape("in0=[2,T]"))(g)
    assert ok.modified
    with pytest.raises(PassRefused, match="is 5, the layer needs 2"):
        AddConvCache(1, inputshape=parse_inputshape("in0=[5,T]"))(g)
