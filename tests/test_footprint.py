"""Memory per loaded layer, measured (tracemalloc), not timed: a 100k-layer graph's working set
decides how much of every whole-graph step runs from RAM instead of cache, so its bytes per
layer are held to a bound (1.94 KB a layer before ids, blob names, types and param lists were
shared and bottoms/tops became tuples, ~1.4 KB after). Plus the sharing itself and the name
index it changed."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import pytest

import paramsurgery

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from bench_graphs import SHAPES  # noqa: E402

MAX_BYTES_PER_LAYER = 1650


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_loaded_graph_bytes_per_layer(shape: str) -> None:
    n = 3000
    data = SHAPES[shape](n).encode()
    paramsurgery.loads(SHAPES[shape](60))  # first-call caches (param lines, regexes) apart
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        g = paramsurgery.loads(data.decode())
        gc.collect()
        per_layer = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(g) == n
    assert per_layer <= MAX_BYTES_PER_LAYER, f"{shape}: {per_layer:.0f} bytes per layer"


def test_blob_names_and_types_are_one_string_each() -> None:
    g = paramsurgery.loads(SHAPES["chain"](40))
    split, conv, add = g.layer("splitncnn_0"), g.layer("conv_0"), g.layer("add_0")
    assert conv._inputs[0] is split._outputs[0]
    assert add._inputs[1] is conv._outputs[0]
    assert g.layer("splitncnn_1")._type is split._type


def test_layers_sharing_a_name_are_indexed_in_file_order() -> None:
    g = paramsurgery.loads("7767517\n3 3\nInput x 0 1 a\nReLU r 1 1 a b\nReLU r 1 1 b c\n")
    first, second = g.layers[1], g.layers[2]
    assert g.find("r") is first and g.layer("r") is first
    first.name = "r1"
    assert g.find("r") is second and g.find("r1") is first
    second.name = "r1"  # now r1 is shared again, the earlier layer first
    assert g.find("r1") is first and g.find("r") is None
    g.remove_layer(first)
    assert g.find("r1") is second
    g.remove_layer(second)
    assert g.find("r1") is None
    assert g.unique_layer_name("r1") == "r1"
