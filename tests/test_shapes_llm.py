"""Affine shapes of a de-cached LLM decoder (the Qwen3-TTS talker, tiny and real size)
equal ncnn's blob shapes at two lengths neither the fit nor the export used, every blob."""

from __future__ import annotations

import pytest

from paramsurgery.formats.io import load
from paramsurgery.analysis.shapes import parse_inputshape
from paramsurgery.analysis.shapes.affine import evaluate
from paramsurgery.analysis.shapes.feeds import make_feeds
from paramsurgery.analysis.shapes.oracle import oracle_shapes, run_all_blobs

from conftest import FIXTURES
from paramsurgery.analysis.shapes import infer_shapes

TALKER = FIXTURES / "qwen3_tts" / "{size}" / "talker_decoder.ported.ncnn.param"


def check_decoder(path, hidden: int, head_dim: int, bin=None) -> int:  # noqa: ANN001
    g = load(path)
    spec = parse_inputshape(f"in0=[T,{hidden}] in1=[1,T,T] in2=[T,{head_dim}] "
                            f"in3=[T,{head_dim}]")
    static = infer_shapes(g, inputshape=spec)
    fitted = oracle_shapes(g, spec, bin=bin, values={"T": [16, 19, 23]})
    blobs = g.blob_names()
    assert not fitted.notes and not fitted.not_affine
    for b in blobs:  # the static rules and ncnn's fit agree on every blob
        assert static.known(b) is not None, b
        assert fitted.shape_of(b) == static.shape_of(b), b
    envs = [{"T": 7}, {"T": 30}]  # untried: not 16/19/23, not the export's lengths
    feeds = [make_feeds(g, {k: tuple(evaluate(d, env) for d in s) for k, s in spec.items()})
             for env in envs]
    runs = run_all_blobs(g, bin, feeds, blobs)
    for env, got in zip(envs, runs):
        for b in blobs:
            assert tuple(got[b]["shape"]) == static.concrete(b, env), (b, env)
    return len(blobs)


def test_tiny_talker_affine_shapes_equal_ncnn():
    tiny = FIXTURES / "qwen3_tts" / "tiny"
    n = check_decoder(tiny / "talker_decoder.ported.ncnn.param", 64, 16,
                      bin=tiny / "talker_decoder.ported.ncnn.bin")
    assert n == 87


@pytest.mark.slow
def test_real_talker_affine_shapes_equal_ncnn():
    """Real 0.6B layout, zero weights (ncnn's DataReaderFromEmpty): 1127 blobs."""
    real = FIXTURES / "qwen3_tts" / "real"
    assert check_decoder(real / "talker_decoder.ported.ncnn.param", 1024, 128) == 1127


@pytest.mark.parametrize("form", ["talker_decoder.tile", "predictor_decoder.stack"])
def test_gqa_expanded_decoders_affine_shapes_equal_ncnn(form):
    """K/V expanded to all heads before SDPA (ExpandDims + Tile + Reshape: the layout of
    ncnn's benchmark LLM params; or stack + Reshape), zero weights."""
    n = check_decoder(FIXTURES / "fusions" / f"{form}.ncnn.param", 64, 16)
    assert n in (99, 107)
