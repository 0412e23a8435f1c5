"""Typed values: pnnx float spelling, kind inference, kind preservation on edit."""

import numpy as np
import pytest

import paramsurgery
from paramsurgery.core.values import (Float, Int, Kind, Str, infer, pnnx_float, format_value, parse_value,
                                      Ints, Floats)
from paramsurgery.core import values as values
from paramsurgery.core.values import Value
from paramsurgery.formats.param_text import dumps

# spellings observed in pnnx 20261020 output (ncnn-format.md §7.1)
PNNX_SPELLINGS = ["0.0", "100.0", "0.1", "2.5", "0.333333343", "3.14159274", "123456.789",
                  "0.166666672", "0.00467098", "1.000000e-5", "1.000000e-8", "1.234000e-5",
                  "1.000000e8", "1.234567e6", "-1.325979e-7", "6.16321377e-2",
                  "3.40282347e38", "8.83883461e-2", "0.125", "0.353553385"]


@pytest.mark.parametrize("text", PNNX_SPELLINGS)
def test_pnnx_float_reproduces_observed_spellings(text):
    assert pnnx_float(float(np.float32(text))) == text


def test_pnnx_float_always_reads_back_as_the_same_float32():
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-9, 9, 2000),
                           rng.integers(-1000, 1000, 200).astype(np.float64)])
    for v in vals.astype(np.float32):
        s = pnnx_float(v)
        assert "." in s or "e" in s
        assert np.float32(s) == v
        assert len(s) <= 15  # ncnn's reference parser reads at most 15 chars per token


def test_negative_zero_and_kinds():
    assert pnnx_float(-0.0) == "0.0"
    assert format_value(2, Float(1)) == "2=1.0"
    assert format_value(0, Int(5)) == "0=5"
    assert format_value(0, Ints([1, 2])) == "-23300=2,1,2"
    assert format_value(3, Ints([])) == "-23303=0"
    assert format_value(1, Floats([0.5])) == "-23301=1,0.5"
    assert format_value(6, Str("16,4,0h")) == '6="16,4,0h"'
    assert format_value(4, Str("hello")) == "4=hello"
    assert format_value(4, Str("-1")) == '4="-1"'


def test_infer_keeps_the_existing_kind():
    assert infer(1, like=Float(2.0)) == Float(1.0)
    assert infer(2.0, like=Int(1)) == Int(2)
    with pytest.raises(TypeError):
        infer(2.5, like=Int(1))
    assert infer([1, 2], like=Floats([0.5])).kind is Kind.FLOATS
    assert infer(3).kind is Kind.INT and infer(3.0).kind is Kind.FLOAT
    assert infer(np.int64(3)).kind is Kind.INT and infer(np.float32(3)).kind is Kind.FLOAT
    with pytest.raises(ValueError):
        infer(float("inf"))
    with pytest.raises(ValueError):
        infer(2 ** 40)


def test_editing_a_param_keeps_kind_and_other_tokens_text():
    g = paramsurgery.loads("7767517\n2 2\nInput in 0 1 in0\n"
                           "BinaryOp   b 1 1 in0 out0 0=2 1=1 2=1.500000e+00\n")
    layer = g.layer("b")
    layer.set(2, 3)  # int assigned to a float param stays a float
    assert layer.params.kind(2) is Kind.FLOAT
    line = dumps(g).splitlines()[-1]
    assert line.endswith("0=2 1=1 2=3.0")
    assert line.startswith("BinaryOp                 b ")  # re-rendered in pnnx layout


def test_new_params_take_the_kind_ncnn_reads_and_pnnx_order():
    g = paramsurgery.loads("7767517\n2 2\nInput in 0 1 in0\nBinaryOp b 1 1 in0 out0 0=2\n")
    g.layer("b").set(2, 1).set(1, 1)
    assert dumps(g).splitlines()[-1].split()[-3:] == ["0=2", "1=1", "2=1.0"]
    g2 = paramsurgery.loads("7767517\n2 2\nInput in 0 1 in0\nGemm g 1 1 in0 out0 2=0 3=1\n")
    g2.layer("g").set(10, 4).set(20, 1)
    assert dumps(g2).splitlines()[-1].split()[-4:] == ["10=4", "2=0", "20=1", "3=1"]


def test_parse_value_forms():
    assert parse_value("-23300", "2,3,4") == (0, Ints([3, 4]))
    assert parse_value("0", "1,2,3") == (0, Ints([1, 2, 3]))
    assert parse_value("6", '"a b"')[1].value == "a b"
    assert parse_value("2", "1E5")[1] == Float(1e5)


# ------------------------------------------------------------------ long arrays, packed
def _elementwise(tokens: list[str], old_style: bool) -> tuple[Kind, list]:
    """What the short-array path gives for the same elements (one at a time)."""
    pairs = [values._parse_number(t, 0) for t in tokens]
    if old_style:
        kinds = [f for f, _ in pairs]
        return (Kind.FLOATS if kinds[-1] else Kind.INTS), [v for _, v in pairs]
    first = pairs[0][0]
    return (Kind.FLOATS if first else Kind.INTS), [float(np.float32(v)) if first else v
                                                   for _, v in pairs]


@pytest.mark.parametrize("old_style", [True, False])
@pytest.mark.parametrize("mix", ["ints", "floats", "mixed"])
def test_long_arrays_parse_packed_like_short_ones(old_style, mix):
    import random
    rnd = random.Random(f"{mix}{old_style}")
    ints = ["0", "-1", "+7", "2147483647", "-2147483648", "007"]
    floats = ["0.5", "-1.", ".25", "1e-3", "3.4028234e38", "-0.0", "1E+5", "1.5e-45"]
    if mix == "mixed" and not old_style:
        pool = floats + ints  # a new-style float array converts its int elements
        first = ["0.5"]
    else:
        pool = {"ints": ints, "floats": floats, "mixed": ints + floats}[mix]
        first = []
    tokens = first + [rnd.choice(pool) for _ in range(9000)]
    text = (f"{len(tokens)}," if old_style else "") + ",".join(tokens)
    pid, v = parse_value("-23301" if old_style else "1", text)
    assert pid == 1 and isinstance(v, values.Packed)
    kind, want = _elementwise(tokens, old_style)
    assert v.kind is kind and len(v) == len(tokens)
    got = list(v.value)
    assert got == want and [type(x) for x in got] == [type(x) for x in want]
    assert values.is_mixed(v) == (mix == "mixed" and old_style)
    # equal to the same array built the ordinary way, both ways round
    plain = values._Mixed(kind, want) if values.is_mixed(v) else Value(kind, want)
    assert v == plain and plain == v and hash(v) == hash(plain)
    # written the same way as the plain value, and to .param.bin with the same bits
    assert format_value(1, v) == format_value(1, plain)
    from paramsurgery.formats.param_bin import encode_value
    assert encode_value(1, v) == encode_value(1, plain)


@pytest.mark.parametrize("bad,offset", [("1,2,x", 4), ("1,,2", 2), ("1,99999999999,2", 2),
                                        ("0.5,1e39", 4), ("1,0.5", 2)])
def test_long_array_errors_name_the_element(bad, offset):
    prefix = ",".join(["1" if bad[0] == "1" else "0.5"] * 3000) + ","
    with pytest.raises(values.ValueError_) as exc:
        parse_value("1", prefix + bad)
    assert exc.value.offset == len(prefix) + offset
