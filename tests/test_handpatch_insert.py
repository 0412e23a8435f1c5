"""insert: a 1 -> 1 layer on an edge of the real tiny talker decoder (golden text, numbers
through ncnn with the fixture's weights and torch inputs), several targets, idempotence,
refusals (unknown type, weights, load_param, names, slots), CLI."""

import os
import subprocess
import sys

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.insert import InsertLayer, parse_target
from paramsurgery.runtime.child import run

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dumps

TINY = FIXTURES / "qwen3_tts" / "tiny"
PARAM = TINY / "talker_decoder.ported.ncnn.param"
BIN = TINY / "talker_decoder.ported.ncnn.bin"


def talker_outputs(text):
    ref = np.load(TINY / "talker_decoder.ported.ref.npz")
    # in0 embeds (T, 64), in1 mask (T, T), in2/in3 cos/sin (T, 16): the decoder convention
    names = ["input_embeds", "input_mask", "input_cos", "input_sin"]
    feeds = {f"in{i}": ref[k].reshape(ref[k].shape[-2:]) for i, k in enumerate(names)}
    return run(text, BIN, feeds, ["out0"])["out0"]


def test_reshape_before_residual_adds_golden_and_same_numbers():
    """ncnn_llm's --reshape-residual-adds: a Reshape on the residual input of each add."""
    g = paramsurgery.load(PARAM)
    adds = [lay.name for lay in g.by_type("BinaryOp") if lay.params.get(0) == 0
            and len(lay.inputs) == 2]
    res = InsertLayer("Reshape", "{layer}_rs", before=[f"{a}:1" for a in adds],
                      assignments=["0=64", "1=-1"])(g)
    check_golden("handpatch/talker.reshape_residual.param", dumps(res.graph))
    check_golden("handpatch/talker.reshape_residual.txt", res.format() + "\n")
    assert len(res.changes) == len(adds) >= 4
    assert ncnn_loads(dumps(res.graph)) == 0 and validate(res.graph) == []
    before = talker_outputs(dumps(g))
    want = np.load(TINY / "talker_decoder.ported.ref.npz")["output_hidden"][0]  # torch, T=9
    assert np.abs(before - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_array_equal(talker_outputs(dumps(res.graph)), before)
    again = InsertLayer("Reshape", "{layer}_rs", before=[f"{a}:1" for a in adds],
                        assignments=["0=64", "1=-1"])(res.graph)
    assert not again.modified and dumps(again.graph) == dumps(res.graph)


def test_after_keeps_the_output_name_and_changes_numbers_as_asked():
    g = paramsurgery.load(PARAM)
    last = g.producer("out0")
    res = InsertLayer("BinaryOp", "times3", after=[last.name], assignments=["0=2", "1=1", "2=3"])(g)
    new = res.graph.layer("times3")
    assert new.outputs == ("out0",) and res.graph.outputs == ["out0"]
    assert new.params.tokens() == ["0=2", "1=1", "2=3.0"]  # 2=3 typed as ncnn reads it: float
    np.testing.assert_array_equal(talker_outputs(dumps(res.graph)),
                                  np.float32(3) * talker_outputs(dumps(g)))


def test_parse_target():
    assert parse_target("add_0:1") == ("add_0", 1)
    assert parse_target("add_0") == ("add_0", 0)
    assert parse_target("ns:layer:2") == ("ns:layer", 2)
    assert parse_target("weird:x") == ("weird:x", 0)


@pytest.mark.parametrize("kw,msg", [
    (dict(layer_type="Relu", layer_name="x", after=["gemm_3"]),
     "ncnn has no layer type 'Relu' \\(did you mean ReLU"),
    (dict(layer_type="aten::addcmul", layer_name="x", after=["gemm_3"]),
     "ncnn has no layer type 'aten::addcmul'"),
    (dict(layer_type="Convolution", layer_name="x", after=["gemm_3"],
          assignments=["0=4", "1=3", "6=48"]), "reads weights from the .bin \\(weight\\[48\\]\\)"),
    (dict(layer_type="Softmax", layer_name="x", after=["gemm_3"], assignments=["0=1"]),
     "ncnn's load_param rejects layer 'x' \\(Softmax 0=1\\): param is too old"),
    (dict(layer_type="ReLU", layer_name="gemm_0", after=["gemm_3"]),
     "a layer named 'gemm_0' already exists"),
    (dict(layer_type="ReLU", layer_name="x", after=["nope"]), "no layer named 'nope'"),
    (dict(layer_type="ReLU", layer_name="x", before=["gemm_3:1"]),
     "Gemm 'gemm_3' has 1 bottoms; there is no slot 1"),
    (dict(layer_type="ReLU", layer_name="x", before=["add_0:1", "add_2:1"]),
     "2 targets need 2 names"),
    (dict(layer_type="ReLU", layer_name="x", assignments=["7=1"], after=["gemm_3"]),
     "ReLU does not read param 7"),
    (dict(layer_type="ReLU", layer_name="x"), "give --before"),
    (dict(layer_type="BinaryOp", layer_name="x", after=["gemm_3"], assignments=["0=2"]),
     "BinaryOp reads 2 bottoms; insert puts a layer on one edge .*set 1=1"),
    (dict(layer_type="MatMul", layer_name="x", after=["gemm_3"]), "MatMul reads 2 bottoms"),
])
def test_refusals(kw, msg):
    with pytest.raises(PassRefused, match=msg):
        InsertLayer(kw.pop("layer_type"), kw.pop("layer_name"), **kw)(paramsurgery.load(PARAM))


# ------------------------------------------------------------------ CLI

def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli(tmp_path):
    p = tmp_path / "t.param"
    p.write_bytes(PARAM.read_bytes())
    r = cli("insert", p, "--before", "add_0:1", "add_2:1", "--type", "Reshape", "--name",
            "{layer}_rs", "0=64", "1=-1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "t.inserted.param").read_text()
    assert "Reshape                  add_0_rs                 1 1 38 38_add_0_rs 0=64 1=-1" in out
    assert p.read_bytes() == PARAM.read_bytes()
    r = cli("insert", p, "--after", "gemm_3", "--type", "Softmax", "--name", "s", "0=1",
            "-o", tmp_path / "bad.param", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"{p}:") and "param is too old" in r.stderr
    assert not (tmp_path / "bad.param").exists()
