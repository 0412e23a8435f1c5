"""fix-reduction: golden text, numeric parity through ncnn at untraced lengths (hypothesis
over K parts, channels, lengths), idempotence, validate(), refusals with their reasons."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.fix_reduction import FixReduction
from paramsurgery.runtime.child import Feed, Fetch, run, run_isolated

from conftest import FIXTURES
from golden import check_golden
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dump_bytes
from paramsurgery.formats.param_text import dumps

REPRO = FIXTURES / "repros" / "stack-sum-batch-axis"
REPAIRS = FIXTURES / "repairs"


def stacked(k: int, op: int = 0, extra: str = "") -> str:
    ins = " ".join(f"in{i}" for i in range(k))
    lines = [f"Input in{i} 0 1 in{i}" for i in range(k)]
    lines.append(f"Concat stack_0 {k} 1 {ins} s 0=-233")
    lines.append(f"Reduction red_0 1 1 s out0 0={op} 1=0 -23303=0 4=0 5=1{extra}")
    return f"7767517\n{len(lines)} {k + 2}\n" + "\n".join(lines) + "\n"


def test_golden_repro_eltwise():
    g = paramsurgery.load(REPRO / "bug" / "model.ncnn.param")
    res = FixReduction()(g)
    check_golden("fix/stack_sum.eltwise.param", dumps(res.graph))
    assert [(c.layer, c.before, c.after) for c in res.changes] == [
        ("sum_3", "Concat stack_0 0=-233 + Reduction 0=0 1=0 -23303=0 4=0 5=1", "Eltwise 0=1")]
    assert validate(res.graph) == []


def test_golden_mean_both_styles():
    g = paramsurgery.load(REPAIRS / "dequant_mean" / "dynamic" / "model.ncnn.param")
    check_golden("fix/dequant_mean.eltwise.param", dumps(FixReduction()(g).graph))
    check_golden("fix/dequant_mean.binaryop.param",
                 dumps(FixReduction(style="binaryop")(g).graph))


def test_small_golden_inline():
    out = dumps(FixReduction()(paramsurgery.loads(stacked(3, op=3))).graph)
    assert out == """7767517
4 4
Input in0 0 1 in0
Input in1 0 1 in1
Input in2 0 1 in2
Eltwise                  red_0                    3 1 in0 in1 in2 out0 0=1 -23301=3,0.333333343,0.333333343,0.333333343
"""


@pytest.mark.parametrize("style", ["eltwise", "binaryop"])
def test_repro_matches_torch_reference(style, tmp_path):
    """The pnnx repro (SIGFPE before) repaired, run at T=13 (traced at 10 and 8)."""
    before = run_isolated(REPRO / "bug" / "model.ncnn.param", REPRO / "bug" / "model.ncnn.bin",
                          {"in0": Feed(np.load(REPRO / "bug" / "ref.npz")["in0"], 0)},
                          [Fetch("out0", 0)])
    assert before.status == "crash"
    res = FixReduction(style=style)(paramsurgery.load(REPRO / "bug" / "model.ncnn.param"))
    save(res.graph, tmp_path / "m.param")
    ref = np.load(REPRO / "bug" / "ref.npz")
    got = run(tmp_path / "m.param", REPRO / "bug" / "model.ncnn.bin",
              {"in0": Feed(ref["in0"], 0)}, [Fetch("out0", 0)])["out0"]
    assert got.shape == ref["out0"].shape
    np.testing.assert_allclose(got, ref["out0"], atol=1e-5, rtol=1e-5)


@settings(max_examples=12, deadline=None)
@given(t=st.integers(1, 40))
def test_repro_equals_numpy_sum_of_its_parts(t, tmp_path_factory):
    """At any length: the repaired output equals the numpy sum of the three conv outputs,
    read from the same net (no torch needed)."""
    d = tmp_path_factory.mktemp("fr")
    save(FixReduction()(paramsurgery.load(REPRO / "bug" / "model.ncnn.param")).graph, d / "m.param")
    x = np.random.default_rng(t).standard_normal((1, 4, t)).astype(np.float32)
    outs = run(d / "m.param", REPRO / "bug" / "model.ncnn.bin", {"in0": Feed(x, 0)},
               ["4", "5", "6", Fetch("out0", 0)],)
    np.testing.assert_allclose(outs["out0"][0], outs["4"] + outs["5"] + outs["6"], atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 16), c=st.integers(1, 6), t=st.integers(1, 24),
       op=st.sampled_from([0, 3, 4, 5, 6]), style=st.sampled_from(["eltwise", "binaryop"]),
       coeff=st.sampled_from([None, 0.5]))
def test_hypothesis_k_parts(k, c, t, op, style, coeff):
    if coeff is not None and op not in (0, 3):
        coeff = None
    text = stacked(k, op, f" 2={coeff}" if coeff is not None else "")
    g = FixReduction(style=style)(paramsurgery.loads(text)).graph
    assert validate(g) == []
    assert not g.by_type("Concat") and not g.by_type("Reduction")
    rng = np.random.default_rng(k * 1000 + c * 100 + t)
    xs = [rng.uniform(0.5, 1.5, (c, t)).astype(np.float32) for _ in range(k)]
    got = run(dumps(g), None, {f"in{i}": x for i, x in enumerate(xs)}, ["out0"])["out0"]
    stack = np.stack(xs, 0)
    want = {0: stack.sum(0), 3: stack.mean(0), 4: stack.max(0), 5: stack.min(0),
            6: stack.prod(0)}[op] * (coeff if coeff is not None else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dequant_raw_repaired_equals_ported(tmp_path):
    """The RVQ dequant `stack(levels, 0).sum(0)` (the codec's raw form) repaired equals its
    ported twin `sum(levels)`, through ncnn, at a length no trace used."""
    raw = REPAIRS / "dequant_raw" / "dynamic"
    ported = REPAIRS / "dequant_ported" / "dynamic"
    meta = json.loads((raw / "meta.json").read_text())
    ref = np.load(ported / "ref.npz")
    feeds = {"in0": Feed(ref["in0"], meta["input_batch_index"]["in0"])}
    fetch = [Fetch("out0", meta["output_batch_index"]["out0"])]
    assert run_isolated(raw / "model.ncnn.param", raw / "model.ncnn.bin", feeds, fetch).status \
        == "crash"
    save(FixReduction()(paramsurgery.load(raw / "model.ncnn.param")).graph, tmp_path / "m.param")
    got = run(tmp_path / "m.param", raw / "model.ncnn.bin", feeds, fetch)["out0"]
    want = run(ported / "model.ncnn.param", ported / "model.ncnn.bin", feeds, fetch)["out0"]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, ref["out0"], atol=1e-5)


def test_idempotent():
    g = FixReduction()(paramsurgery.load(REPRO / "bug" / "model.ncnn.param")).graph
    again = FixReduction()(g)
    assert not again.modified and dumps(again.graph) == dumps(g)
    assert "no Reduction with empty axes" in again.format()


def test_untouched_graph_is_byte_identical():
    p = REPRO / "workaround" / "model.ncnn.param"
    res = FixReduction()(paramsurgery.load(p))
    assert not res.modified and dump_bytes(res.graph) == p.read_bytes()


# ------------------------------------------------------------------ refusals

def test_refuses_lone_reduction_without_traced_shapes():
    text = "7767517\n2 2\nInput in0 0 1 in0\nReduction r 1 1 in0 out0 0=0 1=0 -23303=0 4=0 5=1\n"
    with pytest.raises(PassRefused, match=r"r \(line 4\): not fed by Concat 0=-233, and its intended axes "
                       r"are unknown.*--pnnx model.pnnx.param"):
        FixReduction()(paramsurgery.loads(text))


def test_refuses_non_elementwise_op_and_keepdims():
    with pytest.raises(PassRefused, match=r"operation 2 \(SUMSQ\) of a stacked axis is not an "
                                          r"element-wise combination"):
        FixReduction()(paramsurgery.loads(stacked(3, op=2)))
    with pytest.raises(PassRefused, match=r"keepdims 4=1"):
        FixReduction()(paramsurgery.loads(stacked(2).replace("4=0", "4=1")))


def test_partial_keeps_the_provable_rewrite():
    text = stacked(2).replace("2 4\n", "3 5\n", 1) + \
        "Reduction r2 1 1 out0 out1 0=0 1=0 -23303=0 4=0 5=1\n"
    res = FixReduction(partial=True)(paramsurgery.loads(text))
    assert [c.layer for c in res.changes] == ["red_0"]
    assert [s.layer for s in res.skipped] == ["r2"]


def _lone_traced(shape: str, dim: str) -> list:
    from paramsurgery.formats.pnnx_traced import pnnx_op

    dims = tuple(None if s == "?" else int(s) for s in shape.split(","))
    return [pnnx_op("torch.sum", "torch.sum_0", ["0"], ["1"], {"dim": dim},
                   {"0": (dims, "f32")}, line=3)]


def test_lone_reduction_over_size_one_dim_is_bypassed():
    """`conv(x).sum(0)` on (1,C,T): pnnx drops the batch dim and writes empty axes; the traced
    shape proves the reduced dim had size 1, so the layer is an identity."""
    text = ("7767517\n3 3\nInput in0 0 1 in0\nReLU relu 1 1 in0 a\n"
            "Reduction sum_0 1 1 a out0 0=0 1=0 -23303=0 4=0 5=1\n")
    res = FixReduction(traced=_lone_traced("1,4,?", "(0)"))(paramsurgery.loads(text))
    assert dumps(res.graph).splitlines()[-1].split()[:2] == ["ReLU", "relu"]
    assert res.graph.outputs == ["out0"]
    assert "reduces size-1 dim(s) 0 of (1,4,?)" in res.changes[0].what


def test_lone_reduction_over_the_batch_axis_is_refused():
    """`F.embedding(ids(15,T)).sum(0)`: the reduced dim (15) is ncnn's batch axis."""
    text = "7767517\n2 2\nInput in0 0 1 in0\nReduction sum_0 1 1 in0 out0 0=0 1=0 -23303=0 4=0 5=1\n"
    with pytest.raises(PassRefused, match=r"reduces dim 0 of size 15 of \(15,\?,8\), which pnnx "
                                          r"made ncnn's batch axis"):
        FixReduction(traced=_lone_traced("15,?,8", "(0)"))(paramsurgery.loads(text))


def test_cli(tmp_path, capsys):
    from paramsurgery.cli import main

    out = tmp_path / "o.param"
    assert main(["fix-reduction", str(REPRO / "bug" / "model.ncnn.param"), "-o", str(out)]) == 0
    assert "sum_3: stack of 3 parts + SUM" in capsys.readouterr().out
    assert "Eltwise" in out.read_text()
    assert main(["fix-reduction", str(REPRO / "bug" / "model.ncnn.param"), "-o", "-",
                 "--format", "json", "--style", "binaryop"]) == 0
