"""The text grammar, with ncnn itself as the oracle: for each input, ncnn's load_param and
our loader (plus validate()) must agree on accept/reject, and what we accept round-trips."""

import pytest

import paramsurgery
from paramsurgery import ParamSyntaxError
from paramsurgery.core.findings import ERROR

from conftest import ncnn_loads
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dump_bytes

H = "7767517\n2 2\nInput in 0 1 in0\n"
L = "BinaryOp b 1 1 in0 out0"

# name -> (text, where we expect the error: (line, col) or None when we accept)
CASES = {
    "plain": (H + L + " 0=2 1=1 2=1.5\n", None),
    "crlf": (H.replace("\n", "\r\n") + L + " 0=2\r\n", None),
    "bare_cr": (H.replace("\n", "\r") + L + " 0=2\r", None),
    "tabs": (H + "BinaryOp\tb\t1 1 in0\tout0\t0=2\t1=1\n", None),
    "vertical_tab": (H + "BinaryOp\x0bb 1 1 in0 out0 0=2\n", None),
    "no_final_newline": (H + L + " 0=2", None),
    "blank_lines": ("\n" + H + "\n\n" + L + " 0=2\n\n", None),
    "header_on_one_line": ("7767517 2 2\nInput in 0 1 in0\n" + L + "\n", None),
    "leading_spaces": ("  7767517\n 2 2\n  Input in 0 1 in0\n  " + L + "\n", None),
    "blob_list_across_lines": (H + "BinaryOp b 1 1 in0\n out0 0=2 1=1\n", None),
    "id_31": (H + L + " 31=1\n", None),
    "plus_signs": (H + L + " +0=+2\n", None),
    "inf_is_a_string": (H + L + " 2=inf\n", None),
    "float_array_then_int": (H + L + " 1=1.0,2\n", None),
    "one_element_array": (H + L + " 1=5,\n", None),
    "old_empty_array": (H + L + " -23301=0\n", None),
    "old_mixed_array": (H + L + " -23301=2,1.0,2\n", None),
    "quoted_with_space": (H + L + ' 6="a b" 0=2\n', None),
    "unquoted_string_comma": (H + L + " 6=a,b\n", None),
    "duplicate_id": (H + L + " 0=2 0=1\n", None),
    "float_forms": (H + L + " 2=1. 3=.5 4=1E5 5=1.000000e-05\n", None),
    "long_token": (H + L + " 2=0.1000000000000000001\n", None),
    # rejected by both
    "comment_line": (H + "# hi\n" + L + "\n", (5, 1)),
    "trailing_comment": (H + L + " 0=2 # c\n", (4, 29)),
    "space_before_equals": (H + L + " 0 =2\n", (4, 25)),
    "id_32": (H + L + " 32=2\n", (4, 25)),
    "negative_id": (H + L + " -5=2\n", (4, 25)),
    "hex_int": (H + L + " 0=0x10\n", (4, 25)),
    "minus_inf": (H + L + " 2=-inf\n", (4, 25)),
    "float_overflow": (H + L + " 2=1e39\n", (4, 27)),
    "int_overflow": (H + L + " 0=99999999999\n", (4, 27)),
    "int_then_float_array": (H + L + " 1=1,2.0\n", (4, 25)),
    "old_array_too_short": (H + L + " -23301=3,1,2\n", (4, 32)),
    "old_array_too_long": (H + L + " -23301=1,1,2\n", (4, 32)),
    "space_in_array": (H + L + " -23301=2,1, 2\n", (4, 25)),
    "unterminated_quote": (H + L + ' 6="3,4\n', (4, 25)),
    "stray_quote": (H + L + ' 6=3,4"\n', (4, 25)),
    "single_quotes": (H + L + " 6='1'\n", (4, 25)),
    "text_after_quote": (H + L + ' 6="a"b\n', (4, 25)),
    "empty_value": (H + L + " 0=\n", (4, 25)),
    "dot_only": (H + L + " 2=.\n", (4, 25)),
    "bad_magic": ("7767518\n2 2\nInput in 0 1 in0\n" + L + "\n", (1, 1)),
    "zero_layer_count": ("7767517\n0 2\nInput in 0 1 in0\n", (2, 1)),
    "non_int_blob_count": (H + "BinaryOp b x 1 in0 out0\n", (4, 12)),
    "negative_blob_count": (H + "BinaryOp b -1 1 in0 out0\n", (4, 12)),
    "empty_file": ("", (1, 1)),
    "truncated_blob_list": ("7767517\n2 3\nInput in 0 1 in0\nBinaryOp b 2 1 in0", (4, None)),
}

# rejected by ncnn, loaded by us and reported by validate() (graph-level, not syntax)
GRAPH_LEVEL = {
    "fewer_layers_than_header": ("7767517\n3 3\nInput in 0 1 in0\n" + L + "\n", "PS101"),
    "too_many_blobs": ("7767517\n2 1\nInput in 0 1 in0\n" + L + "\n", "PS102"),
}


@pytest.mark.parametrize("name", CASES)
def test_grammar_agrees_with_ncnn(name):
    text, where = CASES[name]
    ncnn_ok = ncnn_loads(text) == 0 if text else False
    if where is None:
        assert ncnn_ok, "case list is wrong: ncnn rejects it"
        g = paramsurgery.loads(text)
        for layer in g:
            layer.params.check()
        assert dump_bytes(g) == text.encode()
        # the cases use a one-bottom BinaryOp as a generic layer: their grammar is under
        # test, not the run-time contract of its params (PS113, which ncnn's loader
        # does not check either)
        assert not [f for f in validate(g) if f.severity == ERROR and f.code != "PS113"]
    else:
        assert not ncnn_ok, "case list is wrong: ncnn accepts it"
        with pytest.raises(ParamSyntaxError) as info:
            g = paramsurgery.loads(text, "m.param")
            for layer in g:
                layer.params.check()
        err = info.value
        assert err.file == "m.param"
        assert err.line == where[0]
        if where[1] is not None:
            assert err.col == where[1], str(err)
        assert str(err).startswith(f"m.param:{where[0]}")


@pytest.mark.parametrize("name", GRAPH_LEVEL)
def test_graph_level_rejections_are_reported(name):
    text, code = GRAPH_LEVEL[name]
    assert ncnn_loads(text) != 0
    g = paramsurgery.loads(text)
    assert dump_bytes(g) == text.encode()
    assert code in [f.code for f in validate(g) if f.severity == ERROR]


def test_lines_after_the_declared_layers_are_ignored_like_ncnn():
    text = H + L + "\nthis is not a layer line at all 0=\n"
    assert ncnn_loads(text) == 0
    g = paramsurgery.loads(text)
    assert len(g) == 2
    assert g.source.ignored_lines == 1
    assert "PS110" in [f.code for f in validate(g)]
    assert dump_bytes(g) == text.encode()


def test_values_are_typed_as_ncnn_types_them():
    g = paramsurgery.loads(H + L + ' 0=2 1=1.0,2 2=1.5 3=inf 4=1,2 6="16,4,0h" 7=abc '
                           "-23308=2,1.5,2.5 -23309=0 10=-233\n")
    p = g.layer("b").params
    K = paramsurgery.Kind
    assert (p.kind(0), p[0]) == (K.INT, 2)
    assert (p.kind(1), p[1]) == (K.FLOATS, [1.0, 2.0])
    assert (p.kind(2), p[2]) == (K.FLOAT, 1.5)
    assert (p.kind(3), p[3]) == (K.STRING, "inf")
    assert (p.kind(4), p[4]) == (K.INTS, [1, 2])
    assert (p.kind(6), p[6]) == (K.STRING, "16,4,0h") and p.value(6).quoted
    assert (p.kind(7), p[7]) == (K.STRING, "abc") and not p.value(7).quoted
    assert (p.kind(8), p[8]) == (K.FLOATS, [1.5, 2.5])
    assert (p.kind(9), p[9]) == (K.INTS, [])
    assert (p.kind(10), p[10]) == (K.INT, -233)


def test_names_with_any_non_whitespace_bytes_survive():
    text = ("7767517\n2 2\nInput in/0:x 0 1 blob.0\"q\nBinaryOp b\xe9 1 1 blob.0\"q "
            "out\u00e90 0=2\n")
    g = paramsurgery.loads(text)
    assert g.inputs == ['blob.0"q']
    assert dump_bytes(g) == text.encode()
    raw = b"7767517\n2 2\nInput in 0 1 \xff\xfe\nBinaryOp b 1 1 \xff\xfe out0\n"
    g = paramsurgery.loads(raw)
    assert dump_bytes(g) == raw


def test_unicode_space_is_not_a_separator():
    # U+00A0 is not C-locale whitespace: it stays inside the blob name, as in ncnn
    text = "7767517\n2 2\nInput in 0 1 a\u00a0b\nReLU r 1 1 a\u00a0b out0\n"
    g = paramsurgery.loads(text)
    assert g.inputs == ["a\u00a0b"]
    assert dump_bytes(g) == text.encode()


def test_converter_types_are_kept_as_written():
    text = ("7767517\n4 4\nInput in 0 1 in0\npnnx.Expression pnnx_expr_0 1 1 in0 a\n"
            "Tensor.expand Tensor.expand_1 1 1 a b 0=1\naten::triu t 1 1 b out0\n")
    assert ncnn_loads(text) != 0  # ncnn: "layer pnnx.Expression not exists or registered"
    g = paramsurgery.loads(text)
    from paramsurgery.core.layer_types import is_converter_leftover, is_ncnn_layer
    assert [l.type for l in g if not is_ncnn_layer(l.type)] == \
        ["pnnx.Expression", "Tensor.expand", "aten::triu"]
    assert all(is_converter_leftover(l.type) for l in g if l.type != "Input")
    assert dump_bytes(g) == text.encode()


def test_overlong_names_are_rejected_at_their_column():
    long = "n" * 256
    text = f"7767517\n2 2\nInput in 0 1 a\nReLU {long} 1 1 a b\n"
    assert ncnn_loads(text) != 0
    with pytest.raises(ParamSyntaxError) as info:
        paramsurgery.loads(text)
    assert (info.value.line, info.value.col) == (4, 6) and "layer name" in info.value.message
    text = f"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a {long}\n"
    assert ncnn_loads(text) != 0
    with pytest.raises(ParamSyntaxError, match="blob name longer than 255"):
        paramsurgery.loads(text)
