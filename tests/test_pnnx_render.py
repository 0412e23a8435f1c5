"""Our renderer is pnnx's writer: re-rendering EVERY line of a pnnx-written .param (layout,
param order, float spelling, string quoting, header) reproduces the file byte for byte."""

import pytest

import paramsurgery
from paramsurgery.formats.normalize import normalize

from conftest import FIXTURES
from paramsurgery.formats.param_text import dump_bytes

PNNX_WRITTEN = sorted(FIXTURES.rglob("*.ncnn.param"))  # every pnnx export in the fixtures


def test_there_are_pnnx_written_fixtures():
    assert len(PNNX_WRITTEN) >= 20


@pytest.mark.parametrize("path", PNNX_WRITTEN, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_full_rerender_is_byte_identical(path):
    data = path.read_bytes()
    g = paramsurgery.load(path)
    assert dump_bytes(g) == data  # untouched round trip
    assert dump_bytes(normalize(g)) == data  # every line re-rendered from the IR


def test_flt_max_spelling_is_a_valid_float():
    g = paramsurgery.loads("7767517\n2 2\nInput in 0 1 a\nClip c 1 1 a b 0=0.0 1=3.40282347e38\n")
    assert g.layer("c").params[1] == 3.4028234663852886e38
