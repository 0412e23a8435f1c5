"""conv1d-as-2d through ncnn: the tiny Qwen3-TTS codec (37 1-D convs: Convolution1D,
Deconvolution1D, ConvolutionDepthWise1D) decodes the same waveform at a length no trace
used, with its .bin bytes unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from paramsurgery import load  # noqa: E402
from paramsurgery.formats.io import save  # noqa: E402
from paramsurgery.passes.conv1d_as_2d import Conv1dAs2d  # noqa: E402

from qwen3tts import assemble  # noqa: E402
from qwen3tts.ncnn_pipeline import Generator, Net  # noqa: E402

FRAMES = 13     # the codec fixture was traced at other lengths


def test_the_codec_decodes_the_same_through_ncnn(tmp_path: Path) -> None:
    pipe = assemble.assemble("tiny", "ported", tmp_path, conv2d=False)
    gen = Generator(pipe, threads=1)
    codes = np.random.default_rng(3).integers(0, 32, (FRAMES, 16)).astype(np.int32)
    ref = gen.decode_offline(codes)
    part = pipe.parts["codec"]
    res = Conv1dAs2d()(load(part.param, bin=part.bin))
    types = {c.what.split(" on ")[0] for c in res.changes}
    assert len(res.changes) == 37 and not res.skipped
    assert types == {"as Convolution", "as Deconvolution", "as ConvolutionDepthWise"}
    assert not [la for la in res.graph if la.type.endswith("1D")]
    save(res.graph, tmp_path / "c2d.param", bin=tmp_path / "c2d.bin")
    # 1-D and 2-D weights share a layout: the same bytes
    assert (tmp_path / "c2d.bin").read_bytes() == Path(part.bin).read_bytes()
    part.param, part.bin = tmp_path / "c2d.param", tmp_path / "c2d.bin"
    gen.codec = Net(part, gen.options)
    got = gen.decode_offline(codes)
    assert got.shape == ref.shape == (FRAMES * 1920,)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 5e-5


def test_the_assembled_stream_uses_2d_convs(tmp_path: Path) -> None:
    pipe = assemble.assemble("tiny", "ported", tmp_path)
    line = next(ln for ln in pipe.log if "conv1d-as-2d" in ln)
    assert "codec.fused 37" in line and "codec_conv.stream 34" in line
    for param in (pipe.parts["codec"].param, Path(pipe.codec_stream["param"])):
        assert not [la for la in load(param) if la.type.endswith("1D")]
