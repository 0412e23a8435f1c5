"""fix-slice: the hand-written parameterless Slice and pnnx's raw unbind / batch-axis slice
repros repaired and matching at random sizes; golden text; idempotence; refusals."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.fix_slice import FixSlice
from paramsurgery.runtime.child import Feed, Fetch, run, run_isolated

from conftest import FIXTURES
from golden import check_golden
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps
from paramsurgery.formats.pnnx_traced import load_traced

REPROS = FIXTURES / "repros"


def _bug(case):
    d = REPROS / case / "bug"
    traced = d / "model.pnnx.param"
    # pnnx's ops, read here as the command reads them (a pass reads no file)
    return d, paramsurgery.load(d / "model.ncnn.param"), (load_traced(traced) if traced.exists()
                                                           else None)


def paramless(k: int, c_hint: int | None = None) -> str:
    hint = f" 0=6 1=4 2={c_hint}" if c_hint else ""
    outs = " ".join(str(i + 1) for i in range(k))
    lines = [f"Input in0 0 1 in0{hint}", f"Slice unbind_0 1 {k} in0 {outs}"]
    lines += [f"Reshape unbind_0_ncnnreshape{i} 1 1 {i + 1} out{i} 6=\"0w,0h\"" for i in range(k)]
    return f"7767517\n{len(lines)} {2 * k + 1}\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", ["paramless-slice", "unbind-batch-axis", "slice-batch-axis"])
def test_golden(case):
    _, g, traced = _bug(case)
    res = FixSlice(traced=traced)(g)
    check_golden(f"fix/{case}.param", dumps(res.graph))
    assert validate(res.graph) == []
    again = FixSlice(traced=traced)(res.graph)
    assert not again.modified and dumps(again.graph) == dumps(res.graph)


def test_paramless_equals_the_handwritten_twin():
    _, g, _ = _bug("paramless-slice")
    fixed = dumps(FixSlice()(g).graph)
    assert fixed == (REPROS / "paramless-slice" / "workaround" / "model.ncnn.param").read_text()


@pytest.mark.parametrize("case", ["paramless-slice", "unbind-batch-axis", "slice-batch-axis"])
def test_repro_repaired_matches_torch(case, tmp_path):
    d, g, traced = _bug(case)
    st_ = json.loads((d / "status.json").read_text())
    ref = np.load(d / "ref.npz")
    feeds = {k: Feed(ref[k], st_["input_batch_index"].get(k, 233)) for k in ref.files
             if k.startswith("in")}
    fetch = [Fetch(k, st_["output_batch_index"].get(k, 233)) for k in ref.files
             if k.startswith("out")]
    before = run_isolated(d / "model.ncnn.param", d / "model.ncnn.bin", feeds, fetch)
    assert before.status in ("crash", "load_param_failed")
    save(FixSlice(traced=traced)(g).graph, tmp_path / "m.param")
    got = run(tmp_path / "m.param", d / "model.ncnn.bin", feeds, fetch)
    for f in fetch:
        np.testing.assert_array_equal(got[f.name], ref[f.name])


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 8), h=st.integers(1, 5), w=st.integers(1, 7),
       hint=st.booleans())
def test_hypothesis_paramless_unbind(k, h, w, hint):
    text = paramless(k, k if hint else None).replace("0=6 1=4", f"0={w} 1={h}")
    g = FixSlice()(paramsurgery.loads(text)).graph
    x = np.random.default_rng(k * 100 + h * 10 + w).standard_normal((k, h, w)).astype(np.float32)
    outs = run(dumps(g), None, {"in0": x}, [f"out{i}" for i in range(k)])
    for i in range(k):
        np.testing.assert_array_equal(outs[f"out{i}"], x[i])


@settings(max_examples=12, deadline=None)
@given(k=st.integers(2, 6), t=st.integers(1, 30), case=st.sampled_from(
    ["unbind-batch-axis", "slice-batch-axis"]))
def test_hypothesis_batch_axis_random_sizes(k, t, case, tmp_path_factory):
    """The batch-axis rewrite on K codebooks of length T (K, T drawn): each part equals the
    row of the input, read back from the repaired net."""
    from paramsurgery.formats.pnnx_traced import pnnx_op

    outs = " ".join(str(i + 1) for i in range(k))
    if case == "unbind-batch-axis":
        layer = f"torch.unbind torch.unbind_0 1 {k} in0 {outs}"
        op = pnnx_op("torch.unbind", "torch.unbind_0", ["0"], [str(i + 1) for i in range(k)],
                    {"dim": "0"}, {"0": ((k, None), "f32")})
    else:
        idx = ",".join(str(i) for i in range(1, k))
        layer = f"Slice tensor_split_0 1 {k} in0 {outs} 1=-233 -23302={k - 1},{idx}"
        op = pnnx_op("torch.tensor_split", "Tensor.slice_0", ["0"], [str(i + 1) for i in range(k)],
                    {"dim": "0", "indices": f"({idx})"}, {"0": ((k, None), "f32")})
    relus = [f"ReLU r{i} 1 1 {i + 1} out{i}" for i in range(k)]
    text = f"7767517\n{k + 2} {2 * k + 1}\nInput in0 0 1 in0\n{layer}\n" + "\n".join(relus) + "\n"
    g = FixSlice(traced=[op])(paramsurgery.loads(text)).graph
    assert validate(g) == []
    x = np.random.default_rng(k * 31 + t).uniform(0, 1, (k, t)).astype(np.float32)
    got = run(dumps(g), None, {"in0": Feed(x, 0)}, [f"out{i}" for i in range(k)])
    for i in range(k):
        np.testing.assert_array_equal(got[f"out{i}"].reshape(-1), x[i])


# ------------------------------------------------------------------ refusals

def test_refuses_when_the_axis_is_unknowable():
    text = "7767517\n3 4\nInput in0 0 1 in0\nSlice s 1 2 in0 a b\nBinaryOp add 2 1 a b out0 0=0\n"
    with pytest.raises(PassRefused, match=r"s \(line 4\): Slice without slices or indices: the "
                       r"axis is unknown: no traced op \(X.pnnx.param\) and output 'a' is not "
                       r"read by exactly one Reshape"):
        FixSlice()(paramsurgery.loads(text))


def test_refuses_hint_that_contradicts_the_output_count():
    with pytest.raises(PassRefused, match=r"the outermost axis has 5 elements \(Input shape "
                                          r"hint\) but the Slice has 3 outputs"):
        FixSlice()(paramsurgery.loads(paramless(3, 5)))


def test_refuses_batch_axis_without_traced_op():
    _, g, _ = _bug("unbind-batch-axis")
    with pytest.raises(PassRefused, match=r"raw torch.unbind: which dim is pnnx's batch axis, "
                                          r"and the rank, come only from the traced op"):
        FixSlice()(g)


def test_refuses_fused_qkv_rank5():
    _, g, traced = _bug("fused-qkv-unbind")
    with pytest.raises(PassRefused, match=r"rank 5 cannot hold the batch axis as a real axis"):
        FixSlice(traced=traced)(g)


def test_refuses_dynamic_uneven_chunk():
    from paramsurgery.formats.pnnx_traced import pnnx_op

    text = "7767517\n2 3\nInput in0 0 1 in0\nSlice chunk_0 1 2 in0 out0 out1\n"
    op = pnnx_op("torch.chunk", "torch.chunk_0", ["0"], ["1", "2"], {"chunks": "2", "dim": "2"},
                {"0": ((1, 4, None), "f32")})
    with pytest.raises(PassRefused, match=r"the traced extent along dim 2 is dynamic"):
        FixSlice(traced=[op])(paramsurgery.loads(text))
    op.shapes["0"] = ((1, 4, 9), "f32")
    g = FixSlice(traced=[op])(paramsurgery.loads(text)).graph
    assert g.layer("chunk_0").params.get(0) == [5, 4] and g.layer("chunk_0").params.get(1) == -1


def test_cli(tmp_path, capsys):
    from paramsurgery.cli import main

    d = REPROS / "unbind-batch-axis" / "bug"
    assert main(["fix-slice", str(d / "model.ncnn.param"), "-o", str(tmp_path / "o.param")]) == 0
    assert "batch dim 0 of (3,?)" in capsys.readouterr().out  # found model.pnnx.param itself
    assert main(["fix-slice", str(REPROS / "fused-qkv-unbind" / "bug" / "model.ncnn.param"),
                 "-o", str(tmp_path / "q.param")]) == 2
    assert "rank 5" in capsys.readouterr().err
