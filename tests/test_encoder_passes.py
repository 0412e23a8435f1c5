"""Issue 24's encoder-side repairs on small graphs in pnnx's own forms: fix-tied-linear
(lint PS017) and fix-pow (lint PS018): numbers through ncnn at lengths no trace used against
numpy, and lint naming each repair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.formats.param_text import dumps
from paramsurgery.lint import lint_graph
from paramsurgery.passes.fix_pow import FixPow
from paramsurgery.passes.fix_tied_linear import FixTiedLinear
from paramsurgery.runtime.child import Feed, Fetch, run
from paramsurgery.formats.pnnx_traced import load_traced

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "encoder"


def _layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return (x64 - mu) / np.sqrt(var + 1e-5) * gamma + beta


@pytest.mark.parametrize("t", [5, 13])
def test_tied_linear_computes_the_logits_at_any_length(tmp_path, t) -> None:
    g = paramsurgery.load(FIX / "tied_head.param", bin=FIX / "tied_head.bin")
    assert [f.code for f in lint_graph(g, run=False) if f.code == "PS017"] == ["PS017"]
    table = g.layer("model.transformer.wte").weights[0].array().reshape(12, 8)
    ln = g.layer("ln_6").weights
    x = np.random.default_rng(t).standard_normal((t, 8)).astype(np.float32)
    want = _layernorm(x, ln.get("gamma").array(), ln.get("beta").array()) @ table.T
    raw = run(dumps(g), FIX / "tied_head.bin", {"in0": Feed(x, 233)}, [Fetch("out0", 233)])
    assert raw["out0"].shape != want.shape  # pnnx's form: (12, 12) = W·Wᵀ + h, whatever t is
    res = FixTiedLinear()(g)
    assert res.modified and "PS017" not in {f.code for f in lint_graph(res.graph, run=False)}
    paramsurgery.save(res.graph, tmp_path / "y.param", bin=tmp_path / "y.bin")
    got = run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x, 233)},
              [Fetch("out0", 233)])["out0"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_fix_runs_the_tied_linear_repair(tmp_path, capsys) -> None:
    out = tmp_path / "y.param"
    code = main(["fix", str(FIX / "tied_head.param"), "--bin", str(FIX / "tied_head.bin"),
                 "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "fix-tied-linear: 1 change(s)" in text
    assert "InnerProduct             linear_7                 1 1 2 out0" in out.read_text()


def test_tied_linear_structure_only_is_the_same_graph_without_weights() -> None:
    """`fix --pair` with no .bin next to the pair (the zoo's Gemma/GPT-2 pairs): the pair is
    repaired like the input only to be compared with it, so its layers are rewritten without
    the table's values; the layers and params equal the weighted rewrite's. A pass run on a
    graph that is written still refuses without the weights."""
    from paramsurgery.core.errors import PassRefused
    from paramsurgery.passes.base import RepairContext

    bare = paramsurgery.load(FIX / "tied_head.param")
    with pytest.raises(PassRefused, match="give --bin"):
        FixTiedLinear()(bare)
    assert FixTiedLinear.for_fix(RepairContext(weights=False), True) == FixTiedLinear()
    pass_ = FixTiedLinear.for_fix(RepairContext(weights=False, compare_only=True), True)
    assert pass_ == FixTiedLinear(structure_only=True)
    shape_only = pass_(bare).graph
    weighted = FixTiedLinear()(paramsurgery.load(FIX / "tied_head.param",
                                                 bin=FIX / "tied_head.bin")).graph
    assert dumps(shape_only) == dumps(weighted)
    assert shape_only.layer("linear_7").weights is None or \
        not len(shape_only.layer("linear_7").weights)


POW = """7767517
3 3
Input in0 0 1 in0
BinaryOp pow_0 1 1 in0 1 0=6 1=1 2={n}
ReLU relu_0 1 1 1 out0 0=-1.0
"""


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_fix_pow_is_right_for_negative_bases(n) -> None:
    text = POW.format(n=f"{n}.0")
    g = paramsurgery.loads(text, "m.param")
    assert any(f.code == "PS018" for f in lint_graph(g, run=False))
    x = np.linspace(-1.7, 1.3, 11 * 3, dtype=np.float32).reshape(11, 3)  # 11 rows: any length
    want = x.astype(np.float64) ** n
    want = np.where(want > 0, want, -want)  # the leaky ReLU with slope -1: |x**n|
    raw = run(text, None, {"in0": Feed(x, 233)}, [Fetch("out0", 233)])["out0"]
    assert np.abs(raw - want).max() > 1.0  # ncnn's pow of a negative base: 2.4e38
    res = FixPow()(g)
    assert res.modified and not any(f.code == "PS018" for f in lint_graph(res.graph, run=False))
    got = run(dumps(res.graph), None, {"in0": Feed(x, 233)}, [Fetch("out0", 233)])["out0"]
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    assert not FixPow()(res.graph).modified  # idempotent


def test_fix_pow_leaves_non_negative_bases_and_other_exponents() -> None:
    text = """7767517
4 5
Input in0 0 1 in0
Sigmoid sig 1 1 in0 1
BinaryOp pow_0 1 1 1 2 0=6 1=1 2=3.0
BinaryOp pow_1 1 1 2 out0 0=6 1=1 2=0.5
"""
    g = paramsurgery.loads(text, "m.param")
    assert not any(f.code == "PS018" for f in lint_graph(g, run=False))
    res = FixPow()(g)
    assert not res.modified and "its base is never negative" in res.format(explain=True)


# ---------------------------------------------------------------- dynamize: learned tables

def _fixtures_tool():  # noqa: ANN202
    import sys

    sys.path.insert(0, str(FIX.parent.parent / "tools"))
    import fixtures_encoder

    return fixtures_encoder


def test_fix_dynamizes_learned_and_uniform_tables_from_one_trace(tmp_path, capsys) -> None:
    """A BERT-like static export (T0=6) with its reference at T=4 next to it: the uniform
    token-type table becomes one row, the learned position table is cropped at run time,
    the all-zero folded mask goes; right at lengths no trace or reference used."""
    tool = _fixtures_tool()
    out = tmp_path / "y.param"
    code = main(["fix", str(FIX / "learned_pos.ncnn.param"), "--bin",
                 str(FIX / "learned_pos.ncnn.bin"), "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "uniform table (its 6 rows are one row)" in text
    assert "learned position table (row p = position p)" in text
    assert "checked through ncnn against the reference at T=4" in text
    assert "all-zero attention mask traced at 6: dropped from sdpa_3" in text
    w = tool.learned_pos_weights()
    for t in (1, 3, 5, 6):
        x = np.random.default_rng(t).standard_normal((t, 8)).astype(np.float32)
        got = run(out.read_text(), tmp_path / "y.bin", {"in0": Feed(x, 233)},
                  [Fetch("out0", 233)])["out0"]
        want = tool.learned_pos_forward(x, w)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), t


def test_a_reference_longer_than_the_learned_table_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "y.param"
    code = main(["dynamize", str(FIX / "learned_pos.ncnn.param"), "--bin",
                 str(FIX / "learned_pos.ncnn.bin"), "--reference",
                 str(FIX / "learned_pos_long.ref.npz"), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "pnnx_fold_63: a learned position table of 6 rows (added by add_1) has no rows " \
           "for T=9" in err and "--pair" in err


def test_a_table_that_is_not_positions_fails_the_reference_check(tmp_path) -> None:
    """Rows shuffled after the trace (a table not indexed by position, like ViT's
    interpolated grid at another size): the crop is refused by the check through ncnn."""
    from paramsurgery.formats.weights import set_weights
    from paramsurgery.passes.dynamize import Dynamize
    from paramsurgery.passes.dynamize_shapes import reference_shapes

    g = paramsurgery.load(FIX / "learned_pos.ncnn.param", bin=FIX / "learned_pos.ncnn.bin")
    table = g.layer("pnnx_fold_63")
    set_weights(table, {"data": table.weights[0].array().reshape(6, 8)[::-1].copy().reshape(-1)})
    ref = str(FIX / "learned_pos.ref.npz")
    shapes = reference_shapes(ref)
    assert shapes is not None
    p = Dynamize(traced=load_traced(FIX / "learned_pos.pnnx.param"), reference=(shapes[0], shapes[1], ref))
    with pytest.raises(paramsurgery.PassRefused, match="pnnx_fold_63: with the table.s. cropped "
                                                       "to the length the output differs"):
        p(g)


def test_a_length_the_shape_analysis_loses_is_refused_naming_the_layer(tmp_path, capsys) -> None:
    """A stride-2 conv (Whisper's stem, ViT's patches): values after it cannot be proven
    length-derived, so the output would be wrong at the reference's length: refused, named."""
    src = tmp_path / "m.ncnn.param"
    src.write_text("7767517\n4 4\nInput in0 0 1 in0\n"
                   "Convolution1D conv 1 1 in0 1 0=4 1=3 3=2 4=1 6=48\n"
                   "Reshape flat 1 1 1 2 0=28\nReLU relu 1 1 2 out0\n")
    (tmp_path / "m.pnnx.param").write_text(
        "7767517\n2 1\npnnx.Input pnnx_input_0 0 1 0 #0=(1,4,14)f32\n"
        "pnnx.Output pnnx_output_0 1 0 0 #0=(1,28)f32\n")
    from paramsurgery.core.npz import write_npz

    write_npz(tmp_path / "m.ref.npz", {"input_x": np.zeros((1, 4, 10), np.float32),
                                       "output_y": np.zeros((1, 20), np.float32)})
    out = tmp_path / "y.param"
    code = main(["dynamize", str(src), "--reference", str(tmp_path / "m.ref.npz"), "-o",
                 str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "the shape analysis loses the length at Convolution1D 'conv'" in err


# ---------------------------------------------------------------- fix-lossy-reshape

@pytest.mark.parametrize("t", [3, 6, 11, 16])
def test_fix_lossy_reshape_keeps_every_position(tmp_path, t) -> None:
    """The dynamic Whisper form: table[:T] + x through pnnx's broadcast Reshape to one row;
    after the repair right at every length up to the table's 16 rows."""
    from paramsurgery.passes.fix_lossy_reshape import FixLossyReshape

    g = paramsurgery.load(FIX / "broadcast_table.ncnn.param", bin=FIX / "broadcast_table.ncnn.bin")
    assert any(f.code == "PS019" for f in lint_graph(
        g, pnnx_param=FIX / "broadcast_table.pnnx.param", run=False))
    table = g.layer("encoder.embed_positions").weights[0].array().reshape(16, 8)
    x = np.random.default_rng(t).standard_normal((t, 8)).astype(np.float32)
    want = np.maximum(x + table[:t], 0)
    feeds, fetch = {"in0": Feed(x, 233)}, [Fetch("out0", 233)]
    raw = run(dumps(g), FIX / "broadcast_table.ncnn.bin", feeds, fetch)["out0"]
    assert t == 1 or np.abs(raw - want).max() > 0.1  # every row got table row 0
    res = FixLossyReshape(FIX / "broadcast_table.pnnx.param")(g)
    assert res.modified
    got = run(dumps(res.graph), FIX / "broadcast_table.ncnn.bin", feeds, fetch)["out0"]
    assert np.array_equal(got, want)
    assert not FixLossyReshape(FIX / "broadcast_table.pnnx.param")(res.graph).modified


def test_shape_rules_follow_an_expression_crop() -> None:
    from paramsurgery.analysis.shapes import infer_shapes

    g = paramsurgery.load(FIX / "broadcast_table.ncnn.param")
    # the 16-row table cropped to the input's T rows: min(16, T), not affine in T
    assert infer_shapes(g, inputshape={"in0": ("T", 8)}).shape_of("4") == (None, 8)
    assert infer_shapes(g, inputshape={"in0": (6, 8)}).shape_of("4") == (6, 8)
    assert infer_shapes(g, inputshape={"in0": (20, 8)}).shape_of("4") == (16, 8)


PARTIAL_ROPE = """7767517
9 12
Input                    in0                      0 1 in0
MemoryData               pnnx_fold_cos.4          0 1 1 0=4 1={T}
MemoryData               pnnx_fold_sin.4          0 1 2 0=4 1={T}
Reshape                  reshape_0                1 1 in0 3 0=8 1=2 2={T}
Permute                  transpose_1              1 1 3 4 0=2
Slice                    tensor_split_1           1 2 4 5 6 -23300=2,4,-233 1=2
RotaryEmbed              rope_0                   3 1 5 1 2 7 0=0
Concat                   cat_0                    2 1 7 6 8 0=2
Permute                  transpose_2              1 1 8 out0 0=2
"""


def test_partial_rotary_table_cropped_after_the_rotated_part(tmp_path) -> None:
    """Phi-3 / GPT-NeoX partial rotary: the rotated part is a Slice written after the cos/sin
    tables, so the tables' Crops go after it (the graph stays topological); right at T=4."""
    from paramsurgery.passes.dynamize_shapes import LengthSpec, ShapeDynamize
    from paramsurgery.analysis.shapes.affine import Affine
    from paramsurgery.formats.weights import set_weights

    t0, theta = 6, 1.0 / (10000 ** (np.arange(2) / 2))
    p = np.arange(t0)[:, None] * np.concatenate([theta, theta])[None, :]
    g = paramsurgery.loads(PARTIAL_ROPE.format(T=t0), "m.param")
    set_weights(g.layer("pnnx_fold_cos.4"), {"data": np.cos(p).astype(np.float32).reshape(-1)})
    set_weights(g.layer("pnnx_fold_sin.4"), {"data": np.sin(p).astype(np.float32).reshape(-1)})
    spec = LengthSpec({"in0": (Affine.symbol("T"), 16)}, {}, t0)
    res = ShapeDynamize(spec).run(g)
    assert not [f for f in paramsurgery.validate(g) if f.severity == "error"]
    assert any("position table" in c.format() for c in res.changes)
    x = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)
    paramsurgery.save(g, tmp_path / "y.param", bin=tmp_path / "y.bin")
    got = run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x, 233)},
              [Fetch("out0", 233)])["out0"].reshape(4, 2, 8)
    h = x.reshape(4, 2, 8).astype(np.float64)
    rot, rest = h[..., :4], h[..., 4:]
    half = np.concatenate([-rot[..., 2:], rot[..., :2]], -1)
    c, s = np.cos(p[:4])[:, None, :], np.sin(p[:4])[:, None, :]
    want = np.concatenate([rot * c + half * s, rest], -1)
    assert np.abs(got - want).max() <= 1e-5
