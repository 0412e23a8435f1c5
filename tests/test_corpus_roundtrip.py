"""Every real-world .param round-trips byte for byte; ncnn and we agree on what loads."""

import ncnn
import pytest

import paramsurgery
from paramsurgery.core.findings import ERROR
from paramsurgery.core.layer_types import is_ncnn_layer

from conftest import CORPUS, corpus_params
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dump_bytes
from paramsurgery.formats.param_text import dumps


@pytest.mark.parametrize("path", corpus_params(), ids=lambda p: p.name)
def test_corpus_file_round_trips_byte_identical(path):
    data = path.read_bytes()
    g = paramsurgery.load(path)
    assert dump_bytes(g) == data
    for layer in g:  # every value parses
        layer.params.check()


@pytest.mark.parametrize("path", corpus_params(), ids=lambda p: p.name)
def test_we_flag_exactly_what_ncnn_rejects(path):
    net = ncnn.Net()
    ncnn_ok = net.load_param(str(path)) == 0
    g = paramsurgery.load(path)
    problems = [f for f in validate(g) if f.severity == ERROR]
    problems += [layer for layer in g if not is_ncnn_layer(layer.type)]
    assert (not problems) == ncnn_ok, problems


def test_binary_param_in_corpus_is_recognised():
    # the binary form is read by the weights/binary module; text reader must not misparse it
    data = (CORPUS / "squeezenet_v1.1.param.bin").read_bytes()
    assert data[:4] == b"\xdd\x85\x76\x00"


def test_renders_match_for_pnnx_style_lines():
    """Re-rendering an untouched corpus layer keeps every param token's text."""
    g = paramsurgery.load(CORPUS / "vision_transformer.param")
    for layer in g:
        assert layer.params.tokens() == layer.origin.body.split()[4 + len(layer.inputs) + len(layer.outputs):]


def test_nanodet_header_mismatch_is_reported_and_kept():
    path = CORPUS / "nanodet_m.param"
    g = paramsurgery.load(path)
    codes = [(f.code, f.severity) for f in validate(g)]
    assert ("PS101", "warning") in codes
    assert g.source.declared_layers == 179 and len(g) == 180
    assert dump_bytes(g) == path.read_bytes()
    # once edited, the header is recomputed for the layers ncnn reads: the one past the
    # declared count stays out of its reach (it might not load), blobs counted for 179
    g.layer("Output").set(0, 1)
    text = dumps(g)
    assert text.split("\n")[1] == "179 204"
