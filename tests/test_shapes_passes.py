"""Passes that ask the shape analysis: dynamize of a plain Crop behind an Input, fold-gqa
behind an Input (both numerically right through ncnn at lengths no trace used), hints
kept true by passes, refusals that name the blob and the flag, generic --verify."""

from __future__ import annotations

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.cli import main
from paramsurgery.verify.equivalence import verify_equivalent
from paramsurgery.passes.dynamize import Dynamize
from paramsurgery.passes.fold_gqa import FoldGQA
from paramsurgery.runtime.child import run
from paramsurgery.analysis.shapes import parse_inputshape
from paramsurgery.analysis.shapes.hints import read_hints, write_hints
from paramsurgery.analysis.shapes.oracle import oracle_shapes
from paramsurgery.analysis.shapes import infer_shapes
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps

CROP = """7767517
3 3
Input            in0   0 1 in0
Crop             c     1 1 in0 c0 -23309=1,2 -23310=1,17 -23311=1,-1
ReLU             r     1 1 c0 out0
"""

GQA = """7767517
8 11
Input            in0   0 3 q k v
ExpandDims       ek    1 1 k k1 -23303=1,1
Tile             tk    1 1 k1 k2 -23302=4,1,2,1,1
Reshape          xk    1 1 k2 k3 0=8 1=-1 2=4
ExpandDims       ev    1 1 v v1 -23303=1,1
Tile             tv    1 1 v1 v2 -23302=4,1,2,1,1
Reshape          xv    1 1 v2 v3 0=8 1=-1 2=4
SDPA             s     3 1 q k3 v3 out0
"""


# --------------------------------------------------------------------------- dynamize
def test_dynamize_plain_crop_refuses_without_shapes_naming_blob_and_flag():
    with pytest.raises(PassRefused, match=r"'in0'.*--inputshape"):
        Dynamize(20)(paramsurgery.loads(CROP))


def test_dynamize_plain_crop_with_inputshape_runs_at_untried_lengths(tmp_path):
    res = Dynamize(20, inputshape=parse_inputshape("in0=[4,20]"))(paramsurgery.loads(CROP))
    assert res.graph.layer("c").params.get(10) == [-3]
    out = tmp_path / "d.param"
    save(res.graph, out)
    rng = np.random.default_rng(0)
    for t in (9, 31):  # the trace used 20 only
        x = rng.standard_normal((4, t)).astype(np.float32)
        y = run(out, None, {"in0": x}, ["out0"])["out0"]
        assert np.array_equal(y, np.maximum(x[:, 2:t - 3], 0))


def test_dynamize_crop_off_the_length_axis_is_left_alone():
    text = CROP.replace("-23311=1,-1", "-23311=1,0").replace("-23310=1,17", "-23310=1,3")
    res = Dynamize(20, inputshape=parse_inputshape("in0=[4,20]"))(paramsurgery.loads(text))
    assert not res.modified


def test_dynamize_cli_names_the_file(tmp_path, capsys):
    p = tmp_path / "crop.param"
    p.write_text(CROP)
    assert main(["dynamize", str(p), "--traced-len", "20"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{p}: c:") and "<input>" not in err and "--inputshape" in err
    assert main(["dynamize", str(p), "--traced-len", "20", "--inputshape", "in0=[4,20]",
                 "-o", str(tmp_path / "o.param")]) == 0
    assert "-23310=1,-3" in (tmp_path / "o.param").read_text()


# --------------------------------------------------------------------------- fold-gqa
def _sdpa_gqa(q, k, v):
    rep = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def test_fold_gqa_behind_an_input_needs_shapes_then_folds(tmp_path):
    res = FoldGQA()(paramsurgery.loads(GQA))
    assert not res.modified
    assert "Input 'in0' is in the way" in res.skipped[0].reason
    assert "--inputshape k=" in res.skipped[0].reason
    shapes = parse_inputshape("q=[4,T,8] k=[2,T,8] v=[2,T,8]")
    res = FoldGQA(inputshape=shapes)(paramsurgery.loads(GQA))
    assert res.modified and res.graph.layer("s").inputs == ("q", "k", "v")
    out = tmp_path / "f.param"
    save(res.graph, out)
    rng = np.random.default_rng(3)
    for t in (5, 11):  # no length was ever traced
        q = rng.standard_normal((4, t, 8)).astype(np.float32)
        k = rng.standard_normal((2, t, 8)).astype(np.float32)
        v = rng.standard_normal((2, t, 8)).astype(np.float32)
        y = run(out, None, {"q": q, "k": k, "v": v}, ["out0"])["out0"]
        assert np.allclose(y, _sdpa_gqa(q, k, v), rtol=1e-5, atol=1e-5)
    src = tmp_path / "g.param"
    src.write_text(GQA)
    check = verify_equivalent(out, src, inputshape=shapes, values={"T": [6, 15]})
    assert check.ok and len(check.rel) == 2, check.format()


def test_fold_gqa_cli_generic_verify(tmp_path, capsys):
    src = tmp_path / "g.param"
    src.write_text(GQA)
    assert main(["fold-gqa", str(src), "-o", str(tmp_path / "f.param"), "--inputshape",
                 "q=[4,T,8] k=[2,T,8] v=[2,T,8]", "--verify", "--lengths", "5,13"]) == 0
    assert "parity: ok" in capsys.readouterr().out


def test_pass_refreshes_hints_to_ncnn_shapes(tmp_path):
    """A hinted graph (hints written at q/k/v = [4,6,8]/[2,6,8]): after fold-gqa every
    remaining hint equals the shape ncnn gives that blob."""
    shapes = parse_inputshape("q=[4,6,8] k=[2,6,8] v=[2,6,8]")
    g = paramsurgery.loads(GQA)
    write_hints(g, infer_shapes(g, inputshape=shapes))
    assert read_hints(g.layer("xk")) == [(4, 6, 8)]
    res = FoldGQA()(g)  # the Input's own hints give the shapes
    assert res.modified
    folded = res.graph
    actual = oracle_shapes(folded, shapes)
    hinted = 0
    for layer in folded:
        for blob, h in zip(layer.outputs, read_hints(layer) or ()):
            assert h == actual.shape_of(blob), (layer.name, blob)
            hinted += 1
    assert hinted == 4  # q, k, v and the SDPA output
    assert dumps(paramsurgery.loads(dumps(folded))) == dumps(folded)


def test_refresh_after_an_edit_rewrites_downstream_hints_only():
    from conftest import CORPUS

    from paramsurgery.analysis.shapes.static import refresh_after
    from paramsurgery.analysis.shapes.hints import snapshot

    g = paramsurgery.load(CORPUS / "squeezenet.param")
    before = snapshot(g)
    conv = g.layer("fire2/expand1x1")
    conv.set(0, 32).set(6, 512)  # 64 -> 32 output channels
    changed = refresh_after(g, before)
    assert "fire2/expand1x1" in changed and "fire2/concat" in changed
    assert read_hints(g.layer("fire2/concat")) == [(96, 56, 56)]
    assert read_hints(g.layer("fire3/squeeze1x1")) == [(16, 56, 56)]  # shape unchanged
    assert "fire3/squeeze1x1" not in changed


def test_lint_ps412_stale_hint_and_inputshape_flag(tmp_path, capsys):
    from conftest import CORPUS

    from paramsurgery.lint import lint_graph

    g = paramsurgery.load(CORPUS / "squeezenet.param")
    assert not [f for f in lint_graph(g, select="PS412")]
    g.layer("fire2/expand1x1").set(0, 32).set(6, 512)  # edited without refreshing hints
    hits = [f for f in lint_graph(g, select="PS412")]
    layers = {f.layer for f in hits}
    assert "fire2/expand1x1" in layers and "fire2/concat" in layers
    assert "says [64, 56, 56], the layer computes [32, 56, 56]" in \
        next(f.message for f in hits if f.layer == "fire2/expand1x1")
    p = tmp_path / "c.param"
    p.write_text(CROP)
    assert main(["lint", str(p), "--inputshape", "in0=[4,20]", "--no-run"]) in (0, 1)


# --------------------------------------------------------------------------- kv cache, generic
SMALL_DEC = """7767517
8 11
Input                    x                        0 1 x
Input                    m                        0 1 m
Gemm                     gemm_0                   1 1 x a 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=8 9=8
Reshape                  r0                       1 1 a q3 0=8 1=-1 2=1
Split                    splitncnn_0              1 3 q3 1 2 3
SDPA                     sdpa_0                   4 1 1 2 3 m o 5=1 6=0.353553385
Reshape                  r1                       1 1 o o2 0=8 1=-1
Gemm                     gemm_1                   1 1 o2 y 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=8 9=8
"""


def test_verify_kvcache_generic_from_inputshape(tmp_path):
    """Blob names outside the decoder convention (x, m -> y): the input spec alone says how
    to slice each input per step (rows of x and m, columns of m up to the position)."""
    from paramsurgery.verify.kvcache import verify_kvcache
    from paramsurgery.passes.kvcache import AddKVCache
    from paramsurgery.formats.weights import synth_weights

    g = synth_weights(paramsurgery.loads(SMALL_DEC), seed=1)
    src, srcbin = tmp_path / "d.param", tmp_path / "d.bin"
    save(g, src, srcbin)
    kv = AddKVCache()(paramsurgery.load(src)).graph
    kvp = tmp_path / "kv.param"
    save(kv, kvp)
    from paramsurgery.verify.kvcache import DecoderIO

    rep = verify_kvcache(kvp, srcbin, n=5, m=3, io=DecoderIO(output="y"),
                         inputshape={"x": ("T", 8), "m": ("T", "T")}, reference_param=src)
    assert rep.ok and len(rep.steps) == 4 and rep.reference_rel == 0.0, rep.format()
    assert main(["verify-kvcache", str(kvp), str(srcbin), "--inputshape", "x=[T,8] m=[T,T]",
                 "--output-blob", "y", "--n", "4", "--m", "2"]) == 0
