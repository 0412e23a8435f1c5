"""Weight schemas vs the ncnn wheel, read for read.

Every case is one layer of a weighted type with crafted params (optional bias, int8 scale
tables, block quantization, directions, projections, ranks, ...). All cases of a run go into
one net (each layer fed from Input blobs), get synthetic weights, and the reads ncnn's
`Net.load_model` makes through a recording DataReader must equal our prediction exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramsurgery.formats.io import loads
from paramsurgery.core.layer_params import LAYER_PARAMS
from paramsurgery.core.layer_types import NCNN_LAYER_TYPES
from paramsurgery.formats.weights import NO_WEIGHTS, SCHEMAS, attach_weights, reads_for, weights_bytes
from paramsurgery.formats.weights import tags as T
from paramsurgery.formats.weights.oracle import predicted_reads, record_reads
from paramsurgery.formats.weights.schema import PACKED, TAGGED, SchemaError
from paramsurgery.formats.weights.synth import synth_weights

# (type, params, number of inputs)
CASES = [
    ("BatchNorm", "0=5", 1),
    ("Bias", "0=7", 1),
    ("Convolution", "0=4 1=3 6=108", 1),
    ("Convolution", "0=4 1=3 11=2 5=1 6=72", 1),
    ("Convolution", "0=4 1=1 5=1 6=12 8=2", 1),
    ("Convolution", "0=4 1=1 5=1 6=12 8=102", 1),
    ("Convolution", "0=4 1=3 5=1 6=108 19=1", 2),
    ("Convolution1D", "0=4 1=3 5=1 6=36", 1),
    ("Convolution1D", "0=4 1=3 6=36", 1),
    ("Convolution1D", "0=4 1=3 5=1 6=36 19=1", 2),
    ("Convolution3D", "0=2 1=3 5=1 6=162", 1),
    ("Convolution3D", "0=2 1=3 11=2 21=1 6=36", 1),
    ("ConvolutionDepthWise", "0=4 1=3 5=1 6=36 7=4", 1),
    ("ConvolutionDepthWise", "0=4 1=3 6=36 7=4 8=1", 1),
    ("ConvolutionDepthWise", "0=4 1=3 5=1 6=36 7=4 8=2", 1),
    ("ConvolutionDepthWise", "0=4 1=3 6=36 7=4 8=101", 1),
    ("ConvolutionDepthWise", "0=4 1=3 6=36 7=4 8=102", 1),
    ("ConvolutionDepthWise", "0=6 1=3 5=1 6=108 7=3", 1),
    ("ConvolutionDepthWise", "0=4 1=3 6=36 7=4 19=1", 2),
    ("ConvolutionDepthWise1D", "0=4 1=3 5=1 6=12 7=4", 1),
    ("ConvolutionDepthWise1D", "0=4 1=3 6=12 7=4 19=1", 2),
    ("ConvolutionDepthWise3D", "0=4 1=3 5=1 6=108 7=4", 1),
    ("Deconvolution", "0=4 1=3 5=1 6=108", 1),
    ("Deconvolution", "0=4 1=2 3=2 6=48", 1),
    ("Deconvolution", "0=4 1=3 6=108 28=1", 2),
    ("Deconvolution1D", "0=4 1=3 5=1 6=36", 1),
    ("Deconvolution1D", "0=4 1=3 6=36 28=1", 2),
    ("Deconvolution3D", "0=2 1=3 5=1 6=162", 1),
    ("DeconvolutionDepthWise", "0=4 1=3 5=1 6=36 7=4", 1),
    ("DeconvolutionDepthWise", "0=4 1=3 6=36 7=4 28=1", 2),
    ("DeconvolutionDepthWise1D", "0=4 1=3 5=1 6=12 7=4", 1),
    ("DeconvolutionDepthWise3D", "0=4 1=3 5=1 6=108 7=4", 1),
    ("DeformableConv2D", "0=4 1=3 5=1 6=108", 3),
    ("DeformableConv2D", "0=4 1=3 6=108", 2),
    ("Dequantize", "0=1", 1),
    ("Dequantize", "0=4 1=4", 1),
    ("Embed", "0=4 1=5 3=20", 1),
    ("Embed", "0=4 1=5 2=1 3=20", 1),
    ("Embed", "0=4 1=5 2=1 3=20 18=1", 1),
    ("Gemm", "2=0 3=1 4=0 5=1 6=1 7=0 8=3 9=4 10=4", 1),
    ("Gemm", "3=0 5=1 8=3 9=4", 1),
    ("Gemm", "4=1 2=0 7=2 9=4 6=1 10=1", 1),
    ("Gemm", "4=1 2=1 7=2 9=4", 1),
    ("Gemm", "4=1 5=1 7=2 8=3 9=4 6=1 10=3", 0),
    ("Gemm", "4=1 5=1 7=2 8=3 9=4 6=1 10=2", 0),
    ("Gemm", "4=1 5=1 7=2 8=3 9=4 6=1 10=0", 0),
    ("Gemm", "4=1 5=1 7=2 8=3 9=4 6=1 10=-1", 0),
    ("Gemm", "6=1 10=-1", 2),
    ("Gemm", "5=1 3=1 8=3 9=4 18=1", 1),
    ("Gemm", "4=1 7=2 9=4 18=2", 1),
    ("Gemm", "5=1 3=1 8=3 9=40 18=400", 1),
    ("Gemm", "5=1 3=1 6=1 10=4 8=3 9=40 18=411", 1),
    ("Gemm", "5=1 3=1 8=5 9=3 18=602", 1),
    ("Gemm", "5=1 3=1 8=1 9=1 18=800", 1),
    ("GroupNorm", "0=2 1=4", 1),
    ("GroupNorm", "0=2 1=4 3=0", 1),
    ("GRU", "0=4 1=48", 1),
    ("GRU", "0=4 1=96 2=2", 1),
    ("GRU", "0=4 1=48 8=1", 1),
    ("InnerProduct", "0=4 2=8", 1),
    ("InnerProduct", "0=4 1=1 2=12", 1),
    ("InnerProduct", "0=4 1=1 2=12 8=1", 1),
    ("InstanceNorm", "0=3", 1),
    ("InstanceNorm", "0=3 2=0", 1),
    ("LayerNorm", "0=6", 1),
    ("LayerNorm", "0=6 2=0", 1),
    ("LSTM", "0=4 1=64", 1),
    ("LSTM", "0=4 1=128 2=2", 1),
    ("LSTM", "0=2 1=64 3=4", 1),
    ("LSTM", "0=2 1=128 2=2 3=4 8=1", 1),
    ("MemoryData", "0=3", 0),
    ("MemoryData", "0=3 1=2", 0),
    ("MemoryData", "0=3 1=2 2=4", 0),
    ("MemoryData", "0=3 1=2 11=2 2=2", 0),
    ("MemoryData", "0=3 1=2 21=0", 0),
    ("MemoryData", "", 0),
    ("MultiHeadAttention", "0=4 1=2 2=16", 1),
    ("MultiHeadAttention", "0=4 1=2 2=20 3=3 4=7", 3),
    ("MultiHeadAttention", "0=4 1=2 2=16 5=1", 2),
    ("MultiHeadAttention", "0=4 1=2 2=16 18=1", 1),
    ("MultiHeadAttention", "0=4 1=2 2=16 18=400", 1),
    ("MultiHeadAttention", "0=4 1=2 2=20 3=3 4=7 18=611", 3),
    ("MultiHeadAttention", "0=3 1=1 2=9 18=402", 1),
    ("Normalize", "3=5", 1),
    ("Normalize", "1=1 3=1", 1),
    ("Padding", "0=1 6=3", 1),
    ("Padding", "0=1", 1),
    ("PReLU", "0=1", 1),
    ("PReLU", "0=6", 1),
    ("Quantize", "0=1", 1),
    ("Quantize", "0=5", 1),
    ("Requantize", "0=4 1=1 2=4", 1),
    ("Requantize", "", 1),
    ("RMSNorm", "0=6", 1),
    ("RMSNorm", "0=6 2=0", 1),
    ("RNN", "0=4 1=16", 1),
    ("RNN", "0=4 1=40 2=2", 1),
    ("RNN", "0=4 1=16 8=1", 1),
    ("Scale", "0=5", 1),
    ("Scale", "0=5 1=1", 1),
    ("Scale", "0=-233 1=1", 2),
    # weightless types the fuzz found silent even with int8 / odd params
    ("SDPA", "5=1 18=1", 4),
    ("RotaryEmbed", "0=1", 3),
]

# layers whose int8 scale terms make ncnn accept int8-tagged (0x000D4B38) weights
INT8_OK = {("Convolution", "0=4 1=1 5=1 6=12 8=2"), ("Convolution", "0=4 1=1 5=1 6=12 8=102"),
           ("ConvolutionDepthWise", "0=4 1=3 6=36 7=4 8=1"),
           ("ConvolutionDepthWise", "0=4 1=3 5=1 6=36 7=4 8=2"),
           ("InnerProduct", "0=4 1=1 2=12 8=1"), ("Embed", "0=4 1=5 2=1 3=20 18=1"),
           ("Gemm", "5=1 3=1 8=3 9=4 18=1"), ("MultiHeadAttention", "0=4 1=2 2=16 18=1"),
           ("RNN", "0=4 1=16 8=1"), ("GRU", "0=4 1=48 8=1")}


def combined_param(cases) -> str:  # noqa: ANN001
    """One net with every case as a layer fed from Input blobs."""
    n_in = max(1, max(n for _, _, n in cases))
    ins = [f"in{i}" for i in range(n_in)]
    lines = [f"Input in 0 {n_in} {' '.join(ins)}"]
    for i, (t, p, n) in enumerate(cases):
        lines.append(f"{t} l{i}_{t} {n} 1 {' '.join(ins[:n])} out{i} {p}".replace("  ", " "))
    return f"7767517\n{len(lines)} {n_in + len(cases)}\n" + "\n".join(lines) + "\n"


def oracle_equal(text: str, bin_bytes: bytes, *, allow_lut: bool = False) -> int:
    g = loads(text)
    attach_weights(g, bin_bytes, allow_lut=allow_lut)
    pred = predicted_reads(g)
    rec = record_reads(text, bin_bytes)
    assert rec.crashed is None, rec.stderr
    assert rec.load_param == 0, rec.stderr
    for i, (p, r) in enumerate(zip(pred, rec.reads)):
        assert p[:2] == r, f"read #{i}: predicted {p} but ncnn read {r}"
    assert len(pred) == len(rec.reads), (pred[len(rec.reads):][:3], rec.reads[len(pred):][:3])
    assert rec.load_model == 0, rec.stderr
    return len(pred)


def test_every_type_has_a_schema_or_none():
    assert set(SCHEMAS) | NO_WEIGHTS == set(NCNN_LAYER_TYPES)
    assert not set(SCHEMAS) & NO_WEIGHTS
    assert len(SCHEMAS) == 34
    assert set(LAYER_PARAMS) == set(NCNN_LAYER_TYPES)
    covered = {t for t, _, _ in CASES}
    assert set(SCHEMAS) <= covered


def test_layer_type_index_matches_wheel():
    import ncnn

    for i, t in enumerate(NCNN_LAYER_TYPES):
        assert ncnn.layer_to_index(t) == i


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_crafted_cases_read_for_read(dtype):
    text = combined_param(CASES)
    g = loads(text)
    synth_weights(g, seed=3, dtype=dtype)
    data = weights_bytes(g)
    assert oracle_equal(text, data) > 250


def _retagged(cases, make):  # noqa: ANN001, ANN202
    text = combined_param(cases)
    g = loads(text)
    synth_weights(g, seed=5)
    for layer in g:
        if layer.weights:
            for w in list(layer.weights):
                if w.mode == TAGGED:
                    layer.weights = layer.weights.replace(w.role, make(w), dtype=None)
    return text, weights_bytes(g)


def test_int8_tagged_weights():
    cases = [c for c in CASES if (c[0], c[1]) in INT8_OK]
    assert len(cases) == len(INT8_OK)
    rng = np.random.default_rng(0)
    text, data = _retagged(cases, lambda w: rng.integers(-127, 128, w.count).astype(np.int8))
    assert b"\x38\x4b\x0d\x00" in data
    oracle_equal(text, data)


def test_scaled_fp32_and_lut_tags():
    """0x0002C056 (fp32 "with scaling") and a 256-entry LUT tag, accepted with allow_lut."""
    cases = [("InnerProduct", "0=4 1=1 2=12", 1), ("Convolution", "0=4 1=3 6=108", 1),
             ("Embed", "0=4 1=5 3=21", 1), ("InnerProduct", "0=3 2=9", 1)]
    text = combined_param(cases)
    g = loads(text)
    synth_weights(g)
    blobs = []
    for i, layer in enumerate(g):
        for w in layer.weights:
            if w.mode == TAGGED and i % 2:
                blobs.append(w.replace(w.float32(), dtype="fp32s").raw().tobytes())
            elif w.mode == TAGGED:
                table = np.linspace(-1, 1, 256, dtype=np.float32)
                idx = np.arange(w.count, dtype=np.uint8)
                pad = bytes(T.align4(w.count) - w.count)
                blobs.append(b"\x07\x00\x00\x00" + table.tobytes() + idx.tobytes() + pad)
            else:
                blobs.append(w.raw().tobytes())
    data = b"".join(blobs)
    oracle_equal(text, data, allow_lut=True)
    g2 = loads(text)
    attach_weights(g2, data, allow_lut=True)
    assert g2.layers[1].weights["weight"].dtype == "fp32s"
    w = g2.layers[2].weights["weight"]
    assert w.dtype == "lut8"
    assert w.float32().reshape(-1)[5] == np.linspace(-1, 1, 256, dtype=np.float32)[5]
    assert weights_bytes(g2) == data


def test_wheel_block_quant_is_untagged_packed():
    reads = reads_for("Gemm", loads("7767517\n1 1\nGemm g 0 1 o 5=1 3=1 8=3 9=3 18=400\n")
                      .layers[0].params)
    assert [(r.role, r.mode, r.count) for r in reads] == [("B", PACKED, 6), ("B_scales", "raw", 3)]
    assert T.payload_size(T.PACKED, 6) == 8  # align4 of the whole blob, as the wheel reads


@pytest.mark.parametrize("line", [
    "MultiHeadAttention m 1 1 a b 0=0 2=16",
    "MemoryData m 0 1 b 0=3 21=2",
    "Gemm g 1 1 a b 6=1 10=7",
    "RNN r 1 1 a b 0=0 1=16",
])
def test_params_ncnn_cannot_load_are_schema_errors(line):
    g = loads("7767517\n2 2\nInput in 0 1 a\n" + line + "\n")
    with pytest.raises(SchemaError):
        reads_for(g.layers[1].type, g.layers[1].params)


# ----------------------------------------------------------------------------- property

_dim = st.integers(1, 6)


@st.composite
def layer_cases(draw):  # noqa: ANN201
    kind = draw(st.sampled_from(["conv", "dw", "ip", "embed", "gemm", "mha", "lstm", "gru",
                                 "rnn", "norm", "md", "deconv1d"]))
    o, i, k = draw(_dim), draw(_dim), draw(st.integers(1, 3))
    b = draw(st.integers(0, 1))
    if kind == "conv":
        return ("Convolution", f"0={o} 1={k} 5={b} 6={o * i * k * k}", 1)
    if kind == "dw":
        g = draw(st.sampled_from([d for d in range(1, o + 1) if o % d == 0]))
        return ("ConvolutionDepthWise", f"0={o} 1={k} 5={b} 6={o * i * k * k} 7={g}", 1)
    if kind == "ip":
        return ("InnerProduct", f"0={o} 1={b} 2={o * i}", 1)
    if kind == "embed":
        return ("Embed", f"0={o} 1={i} 2={b} 3={o * i}", 1)
    if kind == "gemm":
        ta, tb, bct = draw(st.integers(0, 1)), draw(st.integers(0, 1)), draw(st.integers(-1, 4))
        ca, cb = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        n_in = (1 - ca) + (1 - cb)
        if n_in == 0:
            cb = 0
            n_in = 1
        return ("Gemm", f"2={ta} 3={tb} 4={ca} 5={cb} 6=1 7={o} 8={i} 9={k} 10={bct}", n_in)
    if kind == "mha":
        h = draw(st.sampled_from([1, 2]))
        e = h * o
        q = draw(_dim)
        return ("MultiHeadAttention", f"0={e} 1={h} 2={e * q} 3={draw(_dim)} 4={draw(_dim)}", 3)
    if kind == "lstm":
        d = draw(st.sampled_from([1, 2]))
        hid = draw(_dim)
        return ("LSTM", f"0={o} 1={d * hid * 4 * i} 2={0 if d == 1 else 2} 3={hid}", 1)
    if kind == "gru":
        d = draw(st.sampled_from([1, 2]))
        return ("GRU", f"0={o} 1={d * o * 3 * i} 2={0 if d == 1 else 2}", 1)
    if kind == "rnn":
        return ("RNN", f"0={o} 1={o * i}", 1)
    if kind == "norm":
        t = draw(st.sampled_from(["LayerNorm", "RMSNorm", "InstanceNorm", "BatchNorm"]))
        return (t, f"0={o}", 1)
    if kind == "md":
        return ("MemoryData", f"0={o} 1={i} 21={b}", 0)
    return ("Deconvolution1D", f"0={o} 1={k} 5={b} 6={o * i * k}", 1)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(layer_cases(), min_size=1, max_size=12), st.sampled_from(["fp32", "fp16"]))
def test_random_params_read_for_read(cases, dtype):
    text = combined_param(cases)
    g = loads(text)
    synth_weights(g, seed=1, dtype=dtype)
    oracle_equal(text, weights_bytes(g))


# ----------------------------------------------------------------------------- weightless

# params with which every weightless registered type loads in the wheel
_BASE = {
    "Reshape": "0=4", "Pooling": "1=2", "Pooling1D": "1=2", "Pooling3D": "1=2",
    "Einsum": "-23300=5,105,106,45,62,105", "Fold": "1=2 20=4", "Unfold": "1=2",
    "Spectrogram": "0=8", "InverseSpectrogram": "0=8", "PriorBox": "-23300=1,4.0",
    "ROIAlign": "0=2 1=2",
    "YoloDetectionOutput": "-23304=10,1.0,2.0,3.0,4.0,1.0,2.0,3.0,4.0,1.0,2.0",
    "Yolov3DetectionOutput": "-23304=10,1.0,2.0,3.0,4.0,1.0,2.0,3.0,4.0,1.0,2.0 "
                             "-23305=5,0.0,1.0,2.0,3.0,4.0 -23306=1,32.0",
}
_UNREGISTERED = {"ArgMax", "SPP"}


def _weightless(extra: str = ""):  # noqa: ANN202
    return [(t, (_BASE.get(t, "") + extra).strip(), 1) for t in sorted(NO_WEIGHTS)
            if t not in _UNREGISTERED and t != "Input"]


def test_weightless_types_read_nothing():
    text = combined_param(_weightless())
    rec = record_reads(text, b"")
    assert rec.load_param == 0 and rec.load_model == 0 and rec.reads == [], rec.stderr


@pytest.mark.slow
def test_weightless_types_read_nothing_for_any_single_param(tmp_path):
    """The fuzz the schema table rests on: every weightless type with each param id set to
    one of a few values (on top of params that load) reads no byte."""
    from paramsurgery.formats.weights.oracle import record_many

    jobs = []
    for pid in range(32):
        for v in ("1", "2", "4", "101", "400", "-1"):
            for t, p, n in _weightless():
                path = tmp_path / f"{t}_{pid}_{v}.param"
                path.write_text(combined_param([(t, f"{p} {pid}={v}".strip(), n)]))
                jobs.append(str(path))
    recs = record_many([(j, None) for j in jobs])
    loaded = 0
    for j, rec in zip(jobs, recs):
        assert rec.reads == [], j
        loaded += rec.load_param == 0
    assert loaded > len(jobs) // 2
