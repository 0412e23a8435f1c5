"""Streaming conv state on real exports: the pnnx fixtures of every layer kind
(fixtures/streaming, made by tools/fixtures_streaming.py) and the tiny Qwen3-TTS codec
decoder's conv stack (extracted after its transformer); StreamingRunner behaviour; the
add-conv-cache and stream-check commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import ParamSurgeryError, PassRefused
from paramsurgery.passes.conv_cache import AddConvCache
from paramsurgery.passes.extract import extract_subgraph
from paramsurgery.runtime.child import Feed, run
from paramsurgery.streaming import (StreamingRunner, check_stream, convert, emitted_after, random_frames,
                                    stream_compare)

from conftest import FIXTURES, REPO
from golden import check_golden
from paramsurgery.formats.io import save

STREAMING = FIXTURES / "streaming"
CASES = json.loads((STREAMING / "cases.json").read_text())
TINY = FIXTURES / "qwen3_tts" / "tiny" / "codec_decoder.ported.ncnn"
REAL = FIXTURES / "qwen3_tts" / "real" / "codec_decoder.ported.ncnn"
CODEC_CUT = "117"  # output_proj (Gemm) of the transformer: the conv stack reads it


def case_files(name):
    return str(STREAMING / f"{name}.ncnn.param"), str(STREAMING / f"{name}.ncnn.bin")


def cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


# ============================================================================ pnnx fixtures

STREAMS = sorted(n for n, c in CASES.items() if c["expect"] == "streams")
REFUSES = sorted(n for n, c in CASES.items() if c["expect"] == "refuses")


def test_fixture_index_covers_every_layer_kind():
    kinds = {t for c in CASES.values() if c["expect"] == "streams" for t in c["ncnn_layers"]}
    assert {"Padding", "Convolution1D", "ConvolutionDepthWise1D", "Deconvolution1D",
            "DeconvolutionDepthWise1D", "Crop", "LayerNorm", "Gemm", "Permute"} <= kinds
    assert REFUSES


@pytest.mark.parametrize("name", STREAMS)
def test_pnnx_fixture_streams_like_offline_and_torch(name, tmp_path):
    p, b = case_files(name)
    ref = np.load(STREAMING / f"{name}.ref.npz")
    x, y = ref["input"], ref["output"]
    offline = run(p, b, {"in0": x}, ["out0"])["out0"]
    scale = max(1.0, float(np.abs(y).max()))
    assert offline.shape == y.shape
    assert float(np.abs(offline - y).max()) / scale < 1e-4  # the ncnn graph is the torch module
    conv = convert(p, b, str(tmp_path / "s"))
    runner = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    n = x.shape[1]
    for chunks in ([1] * n, [n], [2, 1, n - 3], [n - 1, 1]):
        rep = stream_compare(p, b, runner, {"in0": x}, chunks, offline={"out0": offline})
        assert rep.ok, rep.format()
        assert rep.samples == y.shape[1]
        # and therefore the torch module's output, chunk by chunk
    runner.reset()
    got = np.concatenate([runner.push(x[:, i:i + 1]) for i in range(n)] + [runner.flush()], 1)
    assert float(np.abs(got - y).max()) / scale < 1e-4


@pytest.mark.parametrize("name", REFUSES)
def test_pnnx_fixture_refused_with_reason(name):
    p, b = case_files(name)
    g = paramsurgery.load(p, bin=b)
    with pytest.raises(PassRefused, match="cannot stream") as exc:
        AddConvCache()(g)
    assert CASES[name]["reason"] in str(exc.value)


def test_pnnx_worked_example_exact(tmp_path):
    """The worked example as pnnx writes it (ConvTranspose1d + F.pad(h, (-2, -2)))."""
    p, b = case_files("worked_example")
    conv = convert(p, b, str(tmp_path / "w"))
    r = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    per_frame = [r.push(np.array([[v]], np.float32))[0].tolist() for v in (1, 10, 100)]
    assert per_frame == [[], [13.5, 24.5], [130.5, 240.5]]
    assert r.flush()[0].tolist() == []
    assert run(p, b, {"in0": np.array([[1, 10, 100]], np.float32)}, ["out0"])["out0"].tolist() \
        == [[13.5, 24.5, 130.5, 240.5]]


# ============================================================================ tiny codec


@pytest.fixture(scope="module")
def codec_conv(tmp_path_factory):
    """The tiny codec decoder's conv part: everything after the transformer's output_proj."""
    g = paramsurgery.load(str(TINY) + ".param", bin=str(TINY) + ".bin")
    assert g.producer(CODEC_CUT).type == "Gemm"
    sub = extract_subgraph(g, [CODEC_CUT], ["out0"])
    d = tmp_path_factory.mktemp("codec")
    p, b = str(d / "conv.param"), str(d / "conv.bin")
    save(sub, p, bin=b)
    conv = convert(p, b, str(d / "stream"))
    return p, b, conv


def test_codec_conv_stack_golden(codec_conv):
    p, b, conv = codec_conv
    check_golden("streaming/codec_decoder_conv.param", open(conv.param).read())
    m = conv.manifest
    assert conv.start_param is None  # the codec trims only at the right
    assert m["samples_per_frame"] == {"out0": 1920}
    assert m["inputs"][0]["numpy_shape"] == ["T", 48] and m["inputs"][0]["numpy_axis"] == 0
    kinds = [s["kind"] for s in m["states"]]
    assert kinds.count("deconv") == 4 and kinds.count("conv") == 16
    # the two k=2 s=2 upsamplers have no overlap, hence no state, and are left alone
    g = paramsurgery.load(conv.param)
    assert g.layer("deconv1d_72").params.get(5) == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6), seed=st.integers(0, 99))
def test_codec_conv_stack_any_chunking_equals_offline(codec_conv, chunks, seed):
    p, b, conv = codec_conv
    runner = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    frames = random_frames(conv.manifest, sum(chunks), seed)
    rep = stream_compare(p, b, runner, frames, chunks)
    assert rep.ok, rep.format()
    assert [c.emitted for c in rep.chunks] == [1920 * c for c in chunks]


def test_codec_conv_stack_streams_the_full_decoders_waveform(codec_conv):
    """Streaming the conv part on the transformer's output, 3 frames at a time, reproduces
    the full decoder's waveform through ncnn and the torch reference of the fixture."""
    p, b, conv = codec_conv
    ref = np.load(str(TINY).replace(".ncnn", "") + ".ref.npz")
    feeds = {"in0": Feed(ref["input_codes_level0"], 0),
             "in1": Feed(ref["input_codes_rest_time_major"]),
             "in2": Feed(ref["input_mask"], 0), "in3": Feed(ref["input_cos"], 0),
             "in4": Feed(ref["input_sin"], 0)}
    full = run(str(TINY) + ".param", str(TINY) + ".bin", feeds, [CODEC_CUT, "out0"])
    hidden, wav = full[CODEC_CUT], full["out0"]
    assert hidden.shape == (13, 48)
    runner = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    out = [runner.push(hidden[i:i + 3]) for i in range(0, hidden.shape[0], 3)]
    got = np.concatenate(out + [runner.flush()], axis=1)
    assert got.shape == wav.reshape(1, -1).shape == (1, 13 * 1920)
    assert float(np.abs(got - wav.reshape(1, -1)).max()) < 1e-5
    torch_wav = ref["output_wav"].reshape(1, -1)
    assert float(np.abs(got - torch_wav).max()) < 1e-3


# ============================================================================ runner


def test_runner_checks_shapes_and_buffers_the_start(tmp_path):
    p, b = case_files("worked_example")
    conv = convert(p, b, str(tmp_path / "w"))
    r = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    with pytest.raises(ParamSurgeryError, match="must be 2-D"):
        r.push(np.zeros(3, np.float32))
    with pytest.raises(ParamSurgeryError, match=r"must be \(1, T\)"):
        r.push(np.zeros((2, 3), np.float32))
    assert r.push(np.zeros((1, 0), np.float32)).shape == (1, 0)
    assert r.push(np.ones((1, 1), np.float32)).shape == (1, 0)  # buffered: nothing is final
    assert not r.started and r.calls[-1]["buffered"]
    assert r.push(np.ones((1, 1), np.float32)).shape == (1, 2)
    assert r.started and r.emitted == {"out0": 2}
    r.flush()
    assert not r.started and r.frames_in == 0
    with pytest.raises(ParamSurgeryError, match="start graph"):
        StreamingRunner(conv.param, conv.bin, {**conv.manifest, "start_param": None})


def test_emitted_after_formula():
    man = {"stream_start": {"buffer_frames": 3},
           "outputs": [{"name": "o", "samples_per_frame": 4, "start_trim": 5}]}
    assert [emitted_after(man, n) for n in range(5)] == [0, 0, 0, 7, 11]


def test_check_stream_api(tmp_path):
    p, b = case_files("decoder_block")
    rep, man = check_stream(p, b, [1, 2, 1, 3], seed=3, floor=True)
    assert rep.ok, rep.format()
    assert rep.noise_floor is not None and rep.noise_floor < 1e-5
    assert "offline noise floor" in rep.format()
    assert man["samples_per_frame"] == {"out0": 4}
    with pytest.raises(ParamSurgeryError, match="positive"):
        check_stream(p, b, [0])


# ============================================================================ CLI


def test_cli_add_conv_cache_writes_param_bin_manifest(tmp_path):
    p, b = case_files("worked_example")
    r = cli("add-conv-cache", p, b, "-o", tmp_path / "out", "--verify", "--chunks", "1,2,1")
    assert r.returncode == 0, r.stderr
    assert "stream-check OK" in r.stdout
    for f in ("out.param", "out.bin", "out.json", "out.start.param"):
        assert (tmp_path / f).exists(), f
    man = json.loads((tmp_path / "out.json").read_text())
    assert man["param"] == "out.param" and man["start_param"] == "out.start.param"
    assert man["stream_start"]["buffer_frames"] == 2
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.bin", "out.json", "out.param",
                                                          "out.start.param"]  # no temp left
    r = cli("add-conv-cache", p, b, "-o", tmp_path / "j", "--format", "json")
    data = json.loads(r.stdout)
    assert data["manifest"]["states"][0]["in"] == "conv_state_in_0"


def test_cli_add_conv_cache_refuses_with_reason(tmp_path):
    p, b = case_files("refuse_stride")
    r = cli("add-conv-cache", p, b, "-o", tmp_path / "out")
    assert r.returncode == 2
    assert "stride 2: downsampling convs are not handled" in r.stderr
    assert not list(tmp_path.iterdir())
    r = cli("add-conv-cache", *case_files("causal_conv"), "-o", tmp_path / "nodir" / "out")
    # the shared write contract (tests/test_reliability.py): `PATH: cannot write: <reason>`
    assert r.returncode == 2 and "out.param: cannot write: No such file or directory" in r.stderr


def test_cli_stream_check_exit_codes(tmp_path):
    p, b = case_files("decoder_block")
    ok = cli("stream-check", p, b, "--chunks", "1,3,2", "--frames", "11")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "stream-check OK: 11 frame(s) in 6 chunk(s)" in ok.stdout
    assert "1->4, 3->12, 2->8, 1->4, 3->12, 1->4" in ok.stdout
    bad = cli("stream-check", p, b, "--chunks", "2,1", "--tol", "0")
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout
    refused = cli("stream-check", *case_files("refuse_untrimmed"))
    assert refused.returncode == 2 and "right trim 0 < K-s" in refused.stderr
    js = cli("stream-check", p, b, "--chunks", "2", "--format", "json", "--keep", tmp_path / "k")
    data = json.loads(js.stdout)
    assert data["ok"] and data["chunks"] == [{"frames": 2, "emitted": 8, "expected": 8}]
    assert (tmp_path / "k" / "decoder_block.ncnn.stream.json").exists()


# ============================================================================ slow


@pytest.mark.slow
@pytest.mark.export
def test_fixtures_regenerate_and_stream(tmp_path, monkeypatch):
    """tools/fixtures_streaming.py re-exports every case with torch + pnnx; each streams
    (or is refused) as the committed index says."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "tools"))
    import fixtures_streaming as fx

    monkeypatch.setattr(fx, "OUT", tmp_path)
    assert fx.main([]) == 0
    index = json.loads((tmp_path / "cases.json").read_text())
    assert {k: v["expect"] for k, v in index.items()} == {k: v["expect"] for k, v in CASES.items()}
    for name, case in index.items():
        p, b = str(tmp_path / f"{name}.ncnn.param"), str(tmp_path / f"{name}.ncnn.bin")
        if case["expect"] == "streams":
            rep, _ = check_stream(p, b, [1, 2, 3, 1])
            assert rep.ok, (name, rep.format())
        else:
            with pytest.raises(PassRefused, match=case["reason"]):
                AddConvCache()(paramsurgery.load(p, bin=b))


@pytest.mark.slow
def test_real_size_codec_conv_stack_streams(tmp_path):
    """The real 0.6B codec decoder's conv part (synthetic weights): a few chunkings."""
    from paramsurgery.formats.weights import synth_weights

    g = synth_weights(paramsurgery.load(str(REAL) + ".param"), seed=0)
    permute = g.producer(g.by_type("Deconvolution1D")[0].inputs[0])
    cut = permute.inputs[0]  # output_proj of the transformer, as in the tiny fixture
    assert permute.type == "Permute" and g.producer(cut).type == "Gemm"
    sub = extract_subgraph(g, [cut], ["out0"])
    p, b = str(tmp_path / "conv.param"), str(tmp_path / "conv.bin")
    save(sub, p, bin=b)
    rep, man = check_stream(p, b, [1, 2, 1], num_threads=2, floor=True, tol=1e-3)
    assert rep.ok, rep.format()
    assert [c.emitted for c in rep.chunks] == [1920, 3840, 1920]
    assert man["samples_per_frame"] == {"out0": 1920}
    # 1536-channel fp32 convs: the offline graph disagrees with itself on a causal prefix by
    # ~2.5e-5 (ncnn picks kernels by width); streaming is held to twice that floor
    assert rep.noise_floor is not None
    assert rep.rel <= max(1e-5, 2 * rep.noise_floor), rep.format()
