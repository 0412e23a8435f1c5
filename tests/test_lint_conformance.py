"""The conformance machinery behind PS4xx: shape matching, torch split semantics, input
shapes from pnnx's script or the command line, references, the blob ↔ operand mapping, and
when a run is skipped or its findings downgraded."""

import shutil
from pathlib import Path

import numpy as np
import paramsurgery
import pytest

from paramsurgery.core.findings import ERROR, INFO, WARNING
from paramsurgery.formats.pnnx_param import read_pnnx_param
from paramsurgery.lint import LintOptions, Reference, lint_file, lint_graph, parse_input_shapes
from paramsurgery.formats.pnnx_reference import find_reference, read_pnnx_script, shape_matches
from paramsurgery.lint.conformance import map_blobs, torch_parts

from test_lint_support import QWEN, REPROS


def test_shape_matching_ignores_ones_and_batch_position():
    assert shape_matches((4, 12), (1, 4, 12))          # ncnn dropped the batch axis
    assert shape_matches((4, 12), (1, 4, None))
    assert shape_matches((1, 4, 12), (1, 4, None))     # a kept 1 is fine too
    assert shape_matches((4,), (1, 4, None))           # `?` may have been 1
    assert shape_matches((9, 1024), (None, 1024))      # T in ncnn's n, leading
    assert shape_matches((3, 9, 16), (9, 3, 16))       # n=3 from torch axis 1, leading
    assert not shape_matches((4, 15), (1, 4, 12))
    assert not shape_matches((0,), (1, 4, None))       # an empty Mat
    assert not shape_matches((4, 4, 9), (1, 4, None))


def test_torch_split_semantics():
    assert torch_parts(9, 2, "chunk") == [5, 4]
    assert torch_parts(10, 3, "chunk") == [4, 4, 2]
    assert torch_parts(10, 3, "tensor_split") == [4, 3, 3]
    assert torch_parts(4, 3, "chunk") == [2, 2]        # torch returns fewer chunks
    assert torch_parts(8, 2, "tensor_split") == [4, 4]


def test_input_shapes_in_pnnx_syntax():
    specs = parse_input_shapes("[1,4,10]f32@0,[7]i32,[1,1,7,7]@233")
    assert [(s.blob, s.shape, s.dtype, s.batch_index) for s in specs] == [
        ("in0", (1, 4, 10), "f32", 0), ("in1", (7,), "i32", None),
        ("in2", (1, 1, 7, 7), "f32", 233)]
    assert specs[1].guessed and specs[1].effective_batch_index() == 233
    with pytest.raises(ValueError, match="bad input shape"):
        parse_input_shapes("[1,4")
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_input_shapes("[1]q7")


def test_pnnx_script_gives_the_traced_shapes_and_batch_axes():
    specs, outs = read_pnnx_script(REPROS / "rope-4d-no-batch" / "bug" / "model_ncnn.py")
    assert [(s.blob, s.shape, s.batch_index) for s in specs] == [
        ("in0", (1, 2, 7, 8), 233), ("in1", (1, 1, 7, 8), 233), ("in2", (1, 1, 7, 8), 233)]
    specs, _ = read_pnnx_script(REPROS / "int-arith-before-embed" / "bug" / "model_ncnn.py")
    assert [(s.shape, s.dtype) for s in specs] == [((7,), "i32")]


def test_references_in_both_layouts(tmp_path):
    d = REPROS / "uneven-chunk" / "bug"
    g = paramsurgery.load(d / "model.ncnn.param")
    ref = Reference.load(str(d / "ref.npz"), g)
    assert ref.outputs == {"out0": (1, 4, 5), "out1": (1, 4, 4)}
    assert ref.inputs[0].batch_index == 0 and ref.inputs[0].shape == (1, 4, 9)
    assert find_reference(str(d / "model.ncnn.param")) == str(d / "ref.npz")
    # input_*/output_* arrays (sorted by name) are paired through pnnx's traced shapes
    q = QWEN / "tiny" / "mimi_encoder.ported"
    g = paramsurgery.load(f"{q}.ncnn.param")
    pn = read_pnnx_param(f"{q}.pnnx.param")
    ref = Reference.load(f"{q}.ref.npz", g, pn)
    shapes = {s.blob: s.shape for s in ref.inputs}
    assert shapes["in0"] == (1, 1, 38400) and shapes["in1"] == (1, 1, 40, 40)
    # the fixture's io side file (X.ref.io.json) pairs them without pnnx's IR; a copy
    # without it cannot be paired
    assert {s.blob: s.shape for s in Reference.load(f"{q}.ref.npz", g, None).inputs} == shapes
    bare = tmp_path / "bare.ref.npz"
    bare.write_bytes(Path(f"{q}.ref.npz").read_bytes())
    with pytest.raises(ValueError, match="pnnx"):
        Reference.load(str(bare), g, None)
    bad = tmp_path / "bad.npz"
    np.savez(bad, input_x=np.zeros((2, 2, 2, 2, 2), np.float32), output_y=np.zeros(3))
    with pytest.raises(ValueError, match="do not fit"):
        Reference.load(str(bad), g, pn)


def test_blob_mapping_pairs_kinds_in_order():
    d = REPROS / "fused-qkv-unbind" / "workaround"
    g = paramsurgery.load(d / "model.ncnn.param")
    pn = read_pnnx_param(d / "model.pnnx.param")
    m = map_blobs(g, pn)
    assert m["in0"].name == "0" and m["out0"].name == "14"
    assert m["1"].producer.type == "nn.Linear"          # gemm_0 <-> qkv
    assert [m[b].name for b in ("2", "3", "4")] == ["2", "3", "4"]  # chunk_0 <-> torch.chunk
    assert m["11"].producer.type == "F.scaled_dot_product_attention"
    # a kind whose counts differ (a fusion) is left out
    d = REPROS / "rope-4d-no-batch" / "bug"
    m = map_blobs(paramsurgery.load(d / "model.ncnn.param"), read_pnnx_param(d / "model.pnnx.param"))
    assert set(m) == {"in0", "in1", "in2", "out0"}


def _copy(src, dst, names):
    for n in names:
        shutil.copy(src / n, dst / n)
    return dst / "model.ncnn.param"


def test_runs_with_synthetic_weights_when_no_bin(tmp_path):
    p = _copy(REPROS / "dropped-negative-slice" / "bug", tmp_path,
              ["model.ncnn.param", "model.pnnx.param", "ref.npz"])
    fs = lint_file(p)
    assert [(f.code, f.severity) for f in fs] == [("PS403", ERROR)]


def test_skips_are_info_and_say_why(tmp_path):
    d = REPROS / "dropped-negative-slice" / "bug"
    p = _copy(d, tmp_path, ["model.ncnn.param", "model.pnnx.param"])
    fs = lint_file(p)
    assert [(f.code, f.severity) for f in fs] == [("PS400", INFO)]
    assert "dynamic and no concrete input shapes" in fs[0].message
    fs = lint_file(p, input_shapes="[1,4,13]@0", options=LintOptions(max_synth_bytes=16))
    assert [f.code for f in fs] == ["PS400"] and "MB of weights" in fs[0].message
    assert lint_file(p, input_shapes="[1,4,13]@0", run=False) == []
    g = paramsurgery.load(REPROS / "sdpa-is-causal" / "bug" / "model.ncnn.param")
    fs = lint_graph(g, pnnx_param=REPROS / "sdpa-is-causal" / "bug" / "model.pnnx.param",
                    input_shapes="[1,7,32]@0", select="PS4")
    assert [f.code for f in fs] == ["PS400"] and "cannot load" in fs[0].message


def test_guessed_batch_axes_downgrade_to_warnings(tmp_path):
    d = REPROS / "dropped-negative-slice" / "bug"
    p = _copy(d, tmp_path, ["model.ncnn.param", "model.ncnn.bin", "model.pnnx.param"])
    with np.load(d / "ref.npz") as z:
        np.savez(tmp_path / "ref.npz", in0=z["in0"], out0=z["out0"])  # no batch_index_*
    fs = lint_file(p)
    f = next(x for x in fs if x.code == "PS403")
    assert f.severity == WARNING and "batch axes guessed" in f.message


def test_traced_shape_mismatch_reports_where_it_starts():
    """PS401 names the first blob that differs and counts the ones computed from it."""
    from test_lint_support import lint_export

    fs = [f for f in lint_export("tiny/codec_decoder.ported_levelsum_port_matmul", True)
          if f.code == "PS401"]
    assert len(fs) == 1 and "blob(s) computed from it differ too" in fs[0].message
