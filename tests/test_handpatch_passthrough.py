"""remove-passthrough: real pnnx exports with leftover Tensor.to layers (removed and checked
against torch at a length no trace used, or refused when the cast changes values), the ncnn
no-op layers, output names, idempotence, CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.core.layer_types import is_converter_leftover
from paramsurgery.core.match import MatchFailure
from paramsurgery.passes.passthrough import RemovePassthrough, cast_verdict
from paramsurgery.runtime.child import Feed, Fetch, run

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.formats.param_text import dumps

HP = FIXTURES / "handpatch"


def fixture(name):
    d = HP / name
    return d, paramsurgery.load(d / "model.ncnn.param"), d / "model.pnnx.param"


def run_against_torch(d, text):
    """ncnn on `text` with the fixture's weights vs torch's outputs at T=13 (ref.npz)."""
    meta = json.loads((d / "meta.json").read_text())
    ref = np.load(d / "ref.npz")
    feeds = {k: Feed(ref[k], meta["input_batch_index"].get(k, 233)) for k in ref.files
             if k.startswith("in")}
    fetch = [Fetch(k, meta["output_batch_index"].get(k, 233)) for k in ref.files
             if k.startswith("out")]
    outs = run(text, d / "model.ncnn.bin", feeds, fetch)
    worst = 0.0
    for f in fetch:
        want = ref[f.name]
        got = outs[f.name].reshape(want.shape)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    return worst


def test_casts_removed_golden_and_torch_parity():
    d, g, traced = fixture("casts")
    assert ncnn_loads(dumps(g)) != 0  # as pnnx wrote it: Tensor.to does not load
    res = RemovePassthrough(traced=traced)(g)
    check_golden("handpatch/casts.nopass.param", dumps(res.graph))
    check_golden("handpatch/casts.nopass.txt", res.format(explain=True) + "\n")
    assert not any(is_converter_leftover(t) for t in res.graph.types())
    assert run_against_torch(d, dumps(res.graph)) <= 1e-6
    assert res.graph.outputs == ["out0"] and res.graph.inputs == ["in0", "in1"]


def test_idempotent():
    _, g, traced = fixture("casts")
    once = RemovePassthrough(traced=traced)(g).graph
    again = RemovePassthrough(traced=traced)(once)
    assert not again.modified and dumps(again.graph) == dumps(once)
    assert "no passthrough layer" in again.format()


def test_int_float_casts_refused_naming_them():
    _, g, traced = fixture("casts_int_float")
    with pytest.raises(PassRefused) as exc:
        RemovePassthrough(traced=traced)(g)
    msg = exc.value.message
    assert exc.value.line == 5
    assert "Tensor.to 'Tensor.to_0' is not a passthrough: i32 -> f32 converts ints to floats" in msg
    assert "f32 -> i64 converts floats to ints" in msg and "read by Embed 'embed_1'" in msg
    res = RemovePassthrough(traced=traced, partial=True)(g)
    assert not res.modified and len(res.skipped) == 2
    assert dumps(res.graph) == dumps(g)


def test_cast_needs_the_traced_dtypes():
    _, g, _ = fixture("casts")
    with pytest.raises(PassRefused, match="its dtypes are only in pnnx's IR.*--pnnx"):
        RemovePassthrough()(g)


@pytest.mark.parametrize("din,dout,ok", [
    ("f32", "f64", True), ("f64", "f32", True), ("f16", "f32", True), ("i32", "i64", True),
    ("i64", "i32", True), ("f32", "f32", True), ("f32", "f16", False), ("f32", "bf16", False),
    ("i64", "i8", False), ("i32", "f32", False), ("f32", "i64", False), ("bool", "f32", False),
])
def test_cast_verdicts(din, dout, ok):
    if ok:
        assert cast_verdict(din, dout)
    else:
        with pytest.raises(MatchFailure):
            cast_verdict(din, dout)


NOOPS = """7767517
8 9
Input                    in0                      0 1 in0
Noop                     noop_0                   1 1 in0 1
Dropout                  drop_0                   1 1 1 2
Split                    split_0                  1 1 2 3
Dropout                  drop_1                   1 1 3 4 0=1.0
ReLU                     relu_0                   1 1 4 5
Noop                     noop_1                   2 2 5 5 6 7
BinaryOp                 add_0                    2 1 6 7 out0 0=0
"""


def test_ncnn_noop_layers_same_outputs_through_ncnn():
    g = paramsurgery.loads(NOOPS)
    res = RemovePassthrough()(g)
    assert dumps(res.graph) == """7767517
3 3
Input                    in0                      0 1 in0
ReLU                     relu_0                   1 1 in0 5
BinaryOp                 add_0                    2 1 5 5 out0 0=0
"""
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    before = run(NOOPS, None, {"in0": x}, ["out0"])["out0"]
    after = run(dumps(res.graph), None, {"in0": x}, ["out0"])["out0"]
    assert np.array_equal(before, after)
    assert len(res.changes) == 5


def test_scaling_dropout_refused_and_type_selection():
    text = NOOPS.replace("drop_1                   1 1 3 4 0=1.0", "drop_1                   1 1 3 4 0=0.5")
    with pytest.raises(PassRefused, match="Dropout 'drop_1'.*multiplies by its 0=scale \\(0.5\\)"):
        RemovePassthrough()(paramsurgery.loads(text))
    res = RemovePassthrough(["Noop"])(paramsurgery.loads(text))
    assert [c.layer for c in res.changes] == ["noop_0", "noop_1"]
    with pytest.raises(PassRefused, match="not a passthrough type: ReLU"):
        RemovePassthrough(["ReLU"])


def test_leftover_identities_and_output_names():
    text = ("7767517\n5 5\nInput in0 0 1 in0\nTensor.contiguous c0 1 1 in0 1\n"
            "ReLU relu 1 1 1 2\nnn.Identity id0 1 1 2 3\nTensor.clone cl 1 1 3 out0\n")
    res = RemovePassthrough()(paramsurgery.loads(text))
    assert dumps(res.graph) == "7767517\n2 2\nInput in0 0 1 in0\n" \
        "ReLU                     relu                     1 1 in0 out0\n"
    assert "output out0 is now written by 'relu'" in res.format()
    # an input passed straight to an output cannot be removed without renaming one of them
    text2 = "7767517\n2 2\nInput in0 0 1 in0\nTensor.clone cl 1 1 in0 out0\n"
    with pytest.raises(PassRefused, match="would turn graph input 'in0' into graph output 'out0'"):
        RemovePassthrough()(paramsurgery.loads(text2))


def test_f_dropout_training_flag(tmp_path):
    ncnn = "7767517\n3 3\nInput in0 0 1 in0\nF.dropout F.dropout_0 1 1 in0 1\nReLU r 1 1 1 out0\n"
    pnnx = ("7767517\n3 3\npnnx.Input pnnx_input_0 0 1 0 #0=(1,4)f32\n"
            "F.dropout F.dropout_0 1 1 0 1 p=0.1 training={} $input=0 #0=(1,4)f32 #1=(1,4)f32\n"
            "pnnx.Output pnnx_output_0 1 0 1 #1=(1,4)f32\n")
    with pytest.raises(PassRefused, match="runs in training mode is only in pnnx's IR"):
        RemovePassthrough()(paramsurgery.loads(ncnn))
    for flag, ok in (("False", True), ("True", False)):
        tp = tmp_path / f"{flag}.pnnx.param"
        tp.write_text(pnnx.format(flag))
        p = RemovePassthrough(traced=tp)
        if ok:
            assert p(paramsurgery.loads(ncnn)).graph.types() == {"Input": 1, "ReLU": 1}
        else:
            with pytest.raises(PassRefused, match="traced with training=True"):
                p(paramsurgery.loads(ncnn))


# ------------------------------------------------------------------ CLI

def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli(tmp_path):
    import shutil

    for name in ("casts", "casts_int_float"):
        shutil.copytree(HP / name, tmp_path / name)
    src = tmp_path / "casts" / "model.ncnn.param"
    r = cli("remove-passthrough", src, cwd=tmp_path)  # finds model.pnnx.param next to it
    assert r.returncode == 0, r.stderr
    assert "3 change(s)" in r.stdout
    assert (tmp_path / "casts" / "model.ncnn.nopass.param").read_text() == \
        (REPO / "tests" / "golden" / "handpatch" / "casts.nopass.param").read_text()
    bad = tmp_path / "casts_int_float" / "model.ncnn.param"
    out = tmp_path / "x.param"
    r = cli("remove-passthrough", bad, "-o", out, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"{bad}:5: Tensor.to 'Tensor.to_0'")
    assert not out.exists() and "Traceback" not in r.stderr
    r = cli("remove-passthrough", bad, "--partial", "--explain", "-o", out, cwd=tmp_path)
    assert r.returncode == 0 and "kept: i32 -> f32" in r.stdout
