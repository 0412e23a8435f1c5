"""The `.pnnx.param` reader (paramsurgery.formats.pnnx_param)."""

import pytest

from paramsurgery.core.errors import ParamSyntaxError
from paramsurgery.formats.pnnx_param import find_pnnx_param, parse_shape, parse_value, read_pnnx_param

from conftest import FIXTURES

REPROS = FIXTURES / "repros"


def test_reads_ops_params_and_traced_shapes():
    g = read_pnnx_param(REPROS / "uneven-chunk" / "bug" / "model.pnnx.param")
    assert [op.type for op in g.ops] == ["pnnx.Input", "nn.Conv1d", "torch.chunk",
                                         "prim::TupleConstruct", "pnnx.Output"]
    chunk = g.ops[2]
    assert chunk.param("chunks") == 2 and chunk.param("dim") == 2
    assert chunk.arg_names == {"input": "1"}
    assert chunk.line == 5
    conv = g.ops[1]
    assert conv.param("kernel_size") == (3,) and conv.param("bias") is True
    assert conv.attrs["weight"] == ((4, 4, 3), "f32")
    assert g.operand("1").shape == (1, 4, None) and g.operand("1").dtype == "f32"
    assert g.operand("1").producer is conv and g.operand("1").consumers == [chunk]
    assert [o.name for o in g.inputs] == ["0"]
    # outputs expand the tuple: ncnn out0, out1
    assert [o.name for o in g.outputs] == ["2", "3"]
    assert g.is_dynamic


def test_static_export_and_int_inputs():
    g = read_pnnx_param(REPROS / "causal-pad-from-shape" / "static" / "model.pnnx.param")
    assert not g.is_dynamic and g.inputs[0].shape == (1, 4, 10)
    g = read_pnnx_param(REPROS / "int-arith-before-embed" / "bug" / "model.pnnx.param")
    assert g.inputs[0].shape == (None,) and g.inputs[0].is_int
    assert g.ops[1].param("expr") == "add(@0,5)"


def test_values_and_shapes():
    assert parse_value("None") is None and parse_value("False") is False
    assert parse_value("(0,-3)") == (0, -3) and parse_value("()") == ()
    assert parse_value("1.000000e-6") == pytest.approx(1e-6)
    assert parse_value("[2,sub(10,size(@0,2))]") == "[2,sub(10,size(@0,2))]"
    assert parse_shape("(1,?,64)f32") == ((1, None, 64), "f32")
    assert parse_shape("(3,1,4,?)bool") == ((3, 1, 4, None), "bool")
    assert parse_shape("()f32") == ((), "f32")
    assert parse_shape("nope") is None


def test_every_fixture_pnnx_param_parses():
    files = sorted(FIXTURES.glob("**/*.pnnx.param"))
    assert len(files) > 40
    for f in files:
        g = read_pnnx_param(f)
        assert g.ops and g.inputs, f
        for o in g.inputs + g.outputs:
            assert o.shape is not None, (f, o.name)


def test_errors_are_located(tmp_path):
    p = tmp_path / "bad.pnnx.param"
    p.write_text("7767517\n1 1\npnnx.Input in 0 1 0 #0=(1,x)f32\n")
    with pytest.raises(ParamSyntaxError) as e:
        read_pnnx_param(p)
    assert e.value.line == 3 and e.value.col == 21 and "bad operand shape" in e.value.message
    p.write_text("7767516\n")
    with pytest.raises(ParamSyntaxError, match="magic"):
        read_pnnx_param(p)
    with pytest.raises(ParamSyntaxError, match="no such file"):
        read_pnnx_param(tmp_path / "missing.pnnx.param")


def test_find_next_to_ncnn_param(tmp_path):
    assert find_pnnx_param(REPROS / "uneven-chunk" / "bug" / "model.ncnn.param") == \
        str(REPROS / "uneven-chunk" / "bug" / "model.pnnx.param")
    assert find_pnnx_param(tmp_path / "x.ncnn.param") is None
