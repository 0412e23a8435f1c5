"""set-param: typed overrides, reports, idempotence, ncnn's load_param verdict, refusals."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.set_param import SetParam, ncnn_load_error, typed_value
from paramsurgery.runtime.child import run
from paramsurgery.core.values import Kind

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.formats.param_text import dumps

SMALL = """7767517
8 9
Input                    in0                      0 1 in0
Split                    splitncnn_0              1 2 in0 1 2
Softmax                  softmax_0                1 1 1 3 0=0 1=1
Concat                   cat_0                    2 1 3 2 4 0=2
BinaryOp                 mul_0                    1 1 4 5 0=2 1=1 2=2.0
Reshape                  reshape_0                1 1 5 6 6="0w,-1"
RotaryEmbed              rope_0                   1 1 6 7 0=0
Convolution              conv_0                   1 1 7 out0 0=4 1=1 5=0 6=16
"""


def setp(*assign, **kw):
    return SetParam(list(assign), **kw)(paramsurgery.loads(SMALL, "small.param"))


def line(res, name):
    return next(ln for ln in dumps(res.graph).splitlines() if f" {name} " in ln)


def test_golden_and_report():
    res = setp("axis=-1", layers=["softmax_0"])
    res2 = SetParam(["2=3", "0=0"], types=["BinaryOp"])(res.graph)
    res3 = SetParam(["0=1"], types=["Concat"], where=["0=2"])(res2.graph)
    res4 = SetParam(["6=0w,0h,-1"], types=["Reshape"])(res3.graph)
    res5 = SetParam(["interleaved=1"], types=["RotaryEmbed"])(res4.graph)
    check_golden("handpatch/set_param.small.param", dumps(res5.graph))
    report = "\n".join(r.format() for r in (res, res2, res3, res4, res5)) + "\n"
    check_golden("handpatch/set_param.report.txt", report)
    assert ncnn_loads(dumps(res5.graph)) == 0
    # untouched lines are byte-identical
    for ln in SMALL.splitlines()[2:]:
        if not any(f" {n} " in ln for n in ("softmax_0", "mul_0", "cat_0", "reshape_0", "rope_0")):
            assert ln in dumps(res5.graph).splitlines()


def test_values_are_typed_by_what_ncnn_reads():
    assert line(setp("2=3", types=["BinaryOp"]), "mul_0").endswith("0=2 1=1 2=3.0")  # float param
    assert typed_value("BinaryOp", 2, "1").kind is Kind.FLOAT
    assert typed_value("Softmax", 0, "2.0").python == 2 and typed_value("Softmax", 0, "2").kind \
        is Kind.INT
    assert typed_value("Reduction", 3, "1").python == [1]  # a one-element int array
    assert typed_value("Padding", 6, "0").kind is Kind.INT
    assert typed_value("Reshape", 6, '"0w,-1"').python == "0w,-1"
    assert typed_value("Clip", 0, "-1").python == -1.0
    assert line(setp("-23303=2,1,2", types=["Concat"], force=True), "cat_0").endswith(
        "0=2 -23303=2,1,2")  # an array key for an id the type does not read, forced
    assert typed_value("Reduction", 3, "1,0", key="-23303").python == [0]  # old style: count
    assert typed_value("Reduction", 3, "1,0", key="3").python == [1, 0]  # new style
    with pytest.raises(PassRefused, match="int param, but -23300 is an array key"):
        typed_value("Concat", 0, "1,2", key="-23300")
    with pytest.raises(PassRefused, match=r"int param, but 1.5 is not an integer"):
        setp("0=1.5", types=["BinaryOp"])
    with pytest.raises(PassRefused, match="float\\[\\] param|is not a number"):
        typed_value("Reduction", 3, "a,b")


def test_param_names_and_unset():
    res = setp("axis=0", types=["Softmax"], unset=["fixbug0"])
    assert line(res, "softmax_0").endswith("1 1 1 3 0=0")
    assert [c.format() for c in res.changes] == ["line 5: softmax_0: 1(fixbug0): 1 -> absent (default 0)"]
    with pytest.raises(PassRefused, match="Softmax has no param named 'axes'.*0=axis, 1=fixbug0"):
        setp("axes=1", types=["Softmax"])


def test_idempotent():
    res = setp("0=1", types=["Concat"])
    again = SetParam(["0=1"], types=["Concat"])(res.graph)
    assert not again.modified and dumps(again.graph) == dumps(res.graph)
    assert "already have these values" in again.format()


def test_unknown_id_refused_unless_forced():
    with pytest.raises(PassRefused, match="Concat does not read param 3.*--force"):
        setp("3=1", types=["Concat"])
    assert line(setp("3=1", types=["Concat"], force=True), "cat_0").endswith("0=2 3=1")


def test_ncnn_load_param_rejects_names_the_layer():
    with pytest.raises(PassRefused) as exc:
        setp("axis=1", types=["Softmax"], unset=["1"])
    assert exc.value.line == 5 and exc.value.file == "small.param"
    assert "ncnn's load_param rejects layer 'softmax_0' (Softmax 0=1)" in exc.value.message
    assert "param is too old" in exc.value.message  # ncnn's own message
    # Reduction axes without 5=1: ncnn's load_param fails
    g = paramsurgery.loads("7767517\n2 2\nInput in0 0 1 in0\nReduction r 1 1 in0 out0 0=0 1=0 5=1\n")
    res = SetParam(["-23303=1,0"], layers=["r"])(g)
    assert ncnn_load_error(res.graph.layer("r")) is None
    with pytest.raises(PassRefused, match="rejects layer 'r'"):
        SetParam(["5=0"], layers=["r"])(res.graph)


def test_weight_layout_change_refused():
    with pytest.raises(PassRefused, match=r"changes what it reads from the \.bin \(weight\[16\] "
                                          r"-> weight\[16\], bias\[4\]\)"):
        setp("bias_term=1", types=["Convolution"])


def test_arity_changing_params_refused():
    with pytest.raises(PassRefused, match="BinaryOp with 1=0 reads 2 bottoms and writes 1 top, but it has 1 and 1"):
        setp("with_scalar=0", types=["BinaryOp"])
    path = FIXTURES / "qwen3_tts" / "tiny" / "predictor_decoder.ported.ncnn.param"
    with pytest.raises(PassRefused, match="SDPA with 5=1 7=1 reads 6 bottoms and writes 3 tops, "
                                          "but it has 4 and 1 \\(7=1 needs the cache blobs: leave 7=0 "
                                          "and let paramsurgery add-kvcache"):
        SetParam(["kv_cache=1"], types=["SDPA"])(paramsurgery.load(path))


def test_selection_refusals():
    with pytest.raises(PassRefused, match="no layer named 'nope'"):
        setp("0=1", layers=["nope"])
    with pytest.raises(PassRefused, match="no layer of type SDPA"):
        setp("7=1", types=["SDPA"])
    with pytest.raises(PassRefused, match="no selected layer matches --where 0=5"):
        setp("0=1", types=["Concat"], where=["0=5"])
    with pytest.raises(PassRefused, match="say which layers"):
        SetParam(["0=1"])
    res = SetParam(["0=1"], types=["Concat", "Softmax"], where=["0=0"])(paramsurgery.loads(SMALL))
    assert [c.layer for c in res.changes] == ["softmax_0"]  # cat_0 has 0=2
    assert "--where 0=0: has 2" in res.format(explain=True)


def test_numbers_change_as_set_through_ncnn():
    """Softmax over axis 0 -> over the last axis: ncnn computes the new function."""
    text = "7767517\n2 2\nInput in0 0 1 in0\nSoftmax sm 1 1 in0 out0 0=0 1=1\n"
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    res = SetParam(["axis=-1"], layers=["sm"])(paramsurgery.loads(text))
    for t, axis in ((text, 0), (dumps(res.graph), -1)):
        got = run(t, None, {"in0": x}, ["out0"])["out0"]
        e = np.exp(x - x.max(axis, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(axis, keepdims=True), rtol=1e-6, atol=1e-7)


def test_real_graph_rotary_and_sdpa():
    path = FIXTURES / "qwen3_tts" / "tiny" / "talker_decoder.ported.ncnn.param"
    g = paramsurgery.load(path)
    res = SetParam(["6=0.5"], types=["SDPA"])(g)
    assert len(res.changes) == len(g.by_type("SDPA"))
    assert all(c.before == "0.25" and c.after == "0.5" for c in res.changes)
    assert ncnn_loads(dumps(res.graph)) == 0


# ------------------------------------------------------------------ CLI

def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli(tmp_path):
    p = tmp_path / "m.param"
    p.write_text(SMALL)
    r = cli("set-param", p, "--type", "Concat", "--where", "0=2", "0=1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "cat_0: 0(axis): 2 -> 1" in r.stdout
    assert "0=1" in (tmp_path / "m.set.param").read_text().splitlines()[5]
    assert p.read_text() == SMALL
    r = cli("set-param", p, "--layer", "mul_0", "softmax_0", "0=1", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0 and "softmax_0" in r.stdout and "2 change(s)" in r.stderr
    r = cli("set-param", p, "--type", "BinaryOp", "2=4", "--format", "json", "-o",
            tmp_path / "j.param", cwd=tmp_path)
    data = json.loads(r.stdout)
    assert data["modified"] and data["changes"][0]["after"] == "4.0"
    # refusal: file:line, exit 2, nothing written
    out = tmp_path / "bad.param"
    r = cli("set-param", p, "--type", "Softmax", "0=1", "--unset", "1", "-o", out, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"{p}:5: ncnn's load_param rejects")
    assert not out.exists()
    r = cli("set-param", p, "--type", "Nope", "0=1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"{p}: no layer of type Nope")
    r = cli("set-param", tmp_path / "missing.param", "--type", "Nope", "0=1", cwd=tmp_path)
    assert r.returncode == 2 and "missing.param" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ properties

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from paramsurgery.core.layer_params import LAYER_PARAMS  # noqa: E402

SCALARS = [(t, pid, info.kind) for t, ps in LAYER_PARAMS.items() for pid, info in ps.items()
           if info.kind in (Kind.INT, Kind.FLOAT)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SCALARS), st.integers(-1000, 1000))
def test_every_scalar_param_is_written_with_the_kind_ncnn_reads(spec, n):
    """`ID=<int text>` on any scalar param of any type: a float param is written with a '.'
    or an 'e' (ncnn reads it as a float), an int param stays an int."""
    layer_type, pid, kind = spec
    v = typed_value(layer_type, pid, str(n))
    assert v.kind is kind and float(v.python) == n
    from paramsurgery.core.values import format_value

    token = format_value(pid, v).split("=", 1)[1]
    assert (("." in token or "e" in token) if kind is Kind.FLOAT else token == str(n))
