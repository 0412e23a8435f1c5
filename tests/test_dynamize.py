"""dynamize: static exports (x[..., 1:L-r], F.pad(x, (-1, -r)), a Reshape/Gemm attention
block) made dynamic and run at lengths no trace used; --pair recovers what a dynamic pnnx
export gives; ambiguity refused; golden text; idempotence."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.dynamize import Dynamize
from paramsurgery.formats.pnnx_traced import companion_pnnx, pnnx_op
from paramsurgery.runtime.child import Feed, Fetch, run

from conftest import FIXTURES
from golden import check_golden
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps
from paramsurgery.formats.pnnx_traced import load_traced

R = FIXTURES / "repairs"
MODELS = ["neg_slice", "attention"]


def path(model, variant="static10"):
    return R / model / variant / "model.ncnn.param"


def feeds_of(model, variant, x):
    meta = json.loads((R / model / variant / "meta.json").read_text())
    return ({"in0": Feed(x, meta["input_batch_index"]["in0"])},
            [Fetch("out0", meta["output_batch_index"].get("out0", 233))])


def dyn(model, **kw):
    p = path(model)
    if "pair" in kw:  # as the command reads it: the pass gets the graph and pnnx's ops
        other = kw["pair"]
        kw.update(pair=paramsurgery.load(other), pair_traced=load_traced(companion_pnnx(other)),
                  pair_path=other)
    return Dynamize(traced=load_traced(companion_pnnx(p)), **kw)(paramsurgery.load(p))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", ["traced_len", "pair"])
def test_golden_and_report(model, mode):
    kw = {"traced_len": 10} if mode == "traced_len" else {"pair": path(model, "static12")}
    res = dyn(model, **kw)
    check_golden(f"fix/dynamize.{model}.param", dumps(res.graph))  # both modes: same text
    assert validate(res.graph) == []
    assert all(c.before is not None and c.after is not None for c in res.changes)
    again = Dynamize(traced_len=10, traced=load_traced(companion_pnnx(path(model))))(res.graph)
    assert not again.modified


def test_report_lines():
    res = dyn("attention", pair=path("attention", "static12"))
    text = res.format()
    assert "gemm_0: 7 (runtime size (0), 0 + 1·T): 10 -> 0" in text
    assert "reshape_7: 1 (inferred (-1), 0 + 1·T): 10 -> -1" in text
    res = dyn("neg_slice", traced_len=10)
    assert [c.format() for c in res.changes] == [
        "line 5: slice_0: 10[0] (relative to the end (input extent 12)): 9 -> -3"]


@pytest.mark.parametrize("model", MODELS)
def test_ref_length_matches_torch(model, tmp_path):
    """ref.npz was made by torch at T=13; the static export is wrong there, the dynamized
    graph is right."""
    ref = np.load(R / model / "static10" / "ref.npz")
    feeds, fetch = feeds_of(model, "static10", ref["in0"])
    binp = R / model / "static10" / "model.ncnn.bin"
    static = run(path(model), binp, feeds, fetch)["out0"]
    assert static.shape != ref["out0"].shape
    save(dyn(model, traced_len=10).graph, tmp_path / "d.param")
    got = run(tmp_path / "d.param", binp, feeds, fetch)["out0"]
    np.testing.assert_allclose(got, ref["out0"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", MODELS + ["pad_crop"])
def test_pair_recovers_the_dynamic_export(model, tmp_path):
    """The layers --pair rewrites are exactly those whose lines differ between the static and
    the dynamic pnnx export, and both graphs give the same numbers at untraced lengths."""
    res = dyn(model, pair=path(model, "static12"))
    save(res.graph, tmp_path / "d.param")
    static = path(model).read_text().splitlines()
    dynamic = path(model, "dynamic").read_text().splitlines()
    differ = {a.split()[1] for a, b in zip(static[2:], dynamic[2:]) if a != b}
    assert {c.layer for c in res.changes} == differ
    binp = R / model / "static10" / "model.ncnn.bin"
    for t in (5, 13, 31):
        shape = (t, 32) if model == "attention" else (1, 4, t)
        x = np.random.default_rng(t).standard_normal(shape).astype(np.float32)
        feeds, fetch = feeds_of(model, "dynamic", x)
        want = run(path(model, "dynamic"), R / model / "dynamic" / "model.ncnn.bin", feeds,
                   fetch)["out0"]
        got = run(tmp_path / "d.param", binp, feeds, fetch)["out0"]
        np.testing.assert_array_equal(got, want)


@settings(max_examples=20, deadline=None)
@given(L=st.integers(4, 40), r=st.integers(1, 3), s=st.integers(0, 1), run_len=st.integers(5, 50))
def test_hypothesis_crop_amounts_and_lengths(L, r, s, run_len):
    """A static `x[..., s:L-r]` on (C, L) dynamized, run at another length: equals numpy."""
    text = ("7767517\n2 2\nInput in0 0 1 in0\n"
            f"Crop crop_0 1 1 in0 out0 -23310=1,{L - r} -23311=1,1 -23309=1,{s}\n")
    op = pnnx_op("Tensor.slice", "Tensor.slice_0", ["0"], ["1"],
                {"dim": "2", "start": str(s), "end": str(L - r)}, {"0": ((1, 3, L), "f32")})
    g = Dynamize(L, traced=[op] + [pnnx_op("pnnx.Input", "in", [], ["0"], {},
                                          {"0": ((1, 3, L), "f32")})])(paramsurgery.loads(text)).graph
    x = np.random.default_rng(L * 7 + run_len).standard_normal((3, run_len)).astype(np.float32)
    got = run(dumps(g), None, {"in0": x}, ["out0"])["out0"]
    np.testing.assert_array_equal(got, x[:, s:run_len - r])


# ------------------------------------------------------------------ refusals

def test_ambiguous_head_count_refused_then_resolved_by_layers(tmp_path):
    p = path("attention", "static4")
    with pytest.raises(PassRefused, match=r"reshape_4: ambiguous: 2 dims look length-derived "
                       r"\(1\(h\)=4, 2\(c\)=4\)"):
        Dynamize(4, traced=load_traced(companion_pnnx(p)))(paramsurgery.load(p))
    layers = ["gemm_0", "gemm_1", "gemm_2", "gemm_3", "reshape_4:2", "reshape_5:2",
              "reshape_6:2", "reshape_7:1"]
    g = Dynamize(4, layers=layers, traced=load_traced(companion_pnnx(p)))(paramsurgery.load(p)).graph
    save(g, tmp_path / "d.param")
    ref = np.load(R / "attention" / "static4" / "ref.npz")
    got = run(tmp_path / "d.param", R / "attention" / "static4" / "model.ncnn.bin",
              {"in0": ref["in0"]}, ["out0"])["out0"]
    np.testing.assert_allclose(got, ref["out0"], atol=1e-5)


def test_pair_resolves_the_ambiguity():
    p = path("attention", "static4")
    other = path("attention", "static10")  # the pass gets the pair's graph and ops, not files
    res = Dynamize(traced=load_traced(companion_pnnx(p)), pair=paramsurgery.load(other),
                   pair_traced=load_traced(companion_pnnx(other)), pair_path=other)(
        paramsurgery.load(p))
    assert ("reshape_4", 2) in {(c.layer, int(c.what.split()[0])) for c in res.changes}


def test_refusals():
    with pytest.raises(PassRefused, match="needs --traced-len T or --pair"):
        Dynamize()
    md = "7767517\n2 2\nMemoryData mask 0 1 m 0=10 1=10\nReLU r 1 1 m out0\n"
    with pytest.raises(PassRefused, match=r"mask: MemoryData 0=10 is a constant traced at one "
                                          r"length \(a mask or table\); make it an input"):
        Dynamize(10)(paramsurgery.loads(md))
    crop = "7767517\n2 2\nInput in0 0 1 in0\nCrop c 1 1 in0 out0 -23310=1,7 -23311=1,1 -23309=1,0\n"
    with pytest.raises(PassRefused, match=r"extent of its input 'in0' along that axis is unknown"):
        Dynamize(10)(paramsurgery.loads(crop))
    with pytest.raises(PassRefused, match=r"differ in structure"):
        Dynamize(pair=paramsurgery.loads(md))(paramsurgery.load(path("attention")))
    gemm = "7767517\n2 2\nInput in0 0 1 in0\nGemm g 1 1 in0 out0 4=1 5=1 7=10 8=4 9=3\n"
    with pytest.raises(PassRefused, match=r"Gemm 7=10 sizes a constant operand"):
        Dynamize(10)(paramsurgery.loads(gemm))


def test_cli(tmp_path, capsys):
    from paramsurgery.cli import main

    out = tmp_path / "o.param"
    assert main(["dynamize", str(path("attention")), "--pair", str(path("attention", "static12")),
                 "-o", str(out)]) == 0
    assert "0 + 1·T" in capsys.readouterr().out
    assert main(["dynamize", str(path("attention", "static4")), "--traced-len", "4", "-o",
                 str(out)]) == 2
    assert "ambiguous" in capsys.readouterr().err


# ------------------------------------------------------------------ slow: torch at any length

@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(t=st.integers(6, 40), model=st.sampled_from(MODELS + ["pad_crop"]))
def test_torch_at_random_lengths(t, model, tmp_path_factory):
    pytest.importorskip("torch")
    import sys

    sys.path.insert(0, str(FIXTURES.parent / "tools"))
    from fixtures_repairs import reference

    d = tmp_path_factory.mktemp("dz")
    save(dyn(model, pair=path(model, "static12")).graph, d / "m.param")
    (x,), (want,) = reference(model, t, seed=t)
    feeds, fetch = feeds_of(model, "static10", x)
    got = run(d / "m.param", R / model / "static10" / "model.ncnn.bin", feeds, fetch)["out0"]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
