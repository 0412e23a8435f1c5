"""int_cast's graph-input provenance looks only at data, not at a Crop's shape reference.

pnnx's dynamic export of an HF decoder (fixtures/zoo/llama/embeds_sdpa_dynamic) casts the
rotary positions `torch.arange(size(in0, 1)).to(float)`. `lower` turns the arange into a
table cropped to in0's length (`Crop table, in0`); the cast then reads positions computed
in the graph, an identity in ncnn's float32. Walking every bottom of the Crop mistook
them for graph input in0's integer bit patterns and kept the cast (ncnn cannot load it).
"""

from __future__ import annotations

from pathlib import Path

import paramsurgery
from paramsurgery.passes.lower import Lower

EXPORT = Path(__file__).resolve().parent.parent / "fixtures" / "zoo" / "llama" / "embeds_sdpa_dynamic"


def test_cast_of_an_arange_cropped_to_the_input_length_is_lowered() -> None:
    g = paramsurgery.load(f"{EXPORT}.ncnn.param", bin=f"{EXPORT}.ncnn.bin")
    result = Lower(traced=f"{EXPORT}.pnnx.param", partial=True).run(g)
    assert "Tensor.to_57" in [c.layer for c in result.changes]
    assert not [layer.name for layer in g if layer.type == "Tensor.to"]
    assert not [s for s in result.skipped if "bit patterns" in s.reason]


def test_cast_of_the_graph_input_itself_is_still_refused() -> None:
    # the same graph, with the cast reading in0 directly: ncnn holds in0 as int32 bits
    g = paramsurgery.load(f"{EXPORT}.ncnn.param", bin=f"{EXPORT}.ncnn.bin")
    cast = g.layer("Tensor.to_57")
    g.set_input(cast, 0, g.layer("splitncnn_0").outputs[0])
    result = Lower(traced=f"{EXPORT}.pnnx.param", partial=True).run(g)
    assert "Tensor.to_57" not in [c.layer for c in result.changes]
    assert any("graph input" in s.reason for s in result.skipped if s.layer == "Tensor.to_57")
