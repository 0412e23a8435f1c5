"""lower: a real pnnx export full of leftovers lowered and checked against torch at a length
no trace used; declining rules refuse with the reason; constants pruned; rules compose;
idempotence; CLI. Slow: torch at random lengths, fixture regeneration."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.core.layer_types import is_converter_leftover
from paramsurgery.passes.lower import RULES, Lower
from paramsurgery.passes.lowering import Rule, Rules
from paramsurgery.runtime.child import Feed, Fetch, run

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dumps

HP = FIXTURES / "handpatch"


def fixture(name):
    d = HP / name
    return d, paramsurgery.load(d / "model.ncnn.param"), d / "model.pnnx.param"


def ncnn_outputs(d, text, arrays):
    meta = json.loads((d / "meta.json").read_text())
    feeds = {k: Feed(v, meta["input_batch_index"].get(k, 233)) for k, v in arrays.items()}
    fetch = [Fetch(k, meta["output_batch_index"].get(k, 233))
             for k in meta["output_batch_index"]]
    return run(text, d / "model.ncnn.bin", feeds, fetch)


def max_rel(got, want):
    return float(np.abs(got.reshape(want.shape) - want).max() / np.abs(want).max())


def test_leftovers_lowered_golden_and_torch_parity():
    d, g, traced = fixture("leftovers")
    meta = json.loads((d / "meta.json").read_text())
    assert len(meta["leftovers"]) >= 9 and ncnn_loads(dumps(g)) != 0
    res = Lower(traced=traced)(g)
    text = dumps(res.graph)
    check_golden("handpatch/leftovers.lowered.param", text)
    check_golden("handpatch/leftovers.lowered.txt", res.format(explain=True) + "\n")
    assert not any(is_converter_leftover(t) for t in res.graph.types())
    assert validate(res.graph) == []
    ref = np.load(d / "ref.npz")  # torch at T=13; pnnx traced 7 and 5
    outs = ncnn_outputs(d, text, {k: ref[k] for k in ref.files if k.startswith("in")})
    assert max_rel(outs["out0"], ref["out0"]) <= 2e-6


def test_idempotent_and_untouched_lines():
    _, g, traced = fixture("leftovers")
    once = Lower(traced=traced)(g).graph
    again = Lower(traced=traced)(once)
    assert not again.modified and dumps(again.graph) == dumps(once)
    assert "no leftover a rule lowers" in again.format()
    before = dumps(g).splitlines()[2:]
    kept = [ln for ln in before if not is_converter_leftover(ln.split()[0])]
    after = dumps(once).splitlines()
    assert all(ln in after for ln in kept if not ln.startswith("Split"))


def test_declined_refuses_with_reasons_partial_lowers_the_rest():
    d, g, traced = fixture("declined")
    with pytest.raises(PassRefused) as exc:
        Lower(traced=traced)(g)
    msg = exc.value.message
    assert exc.value.line == 8 and exc.value.file.endswith("declined/model.ncnn.param")
    assert msg.startswith("aten::lerp 'pnnx_2' (lerp): the weight is a tensor")
    assert "aten::exp2 'pnnx_3' (exp2): ncnn has no exp2" in msg
    res = Lower(traced=traced, partial=True)(g)
    assert [c.layer for c in res.changes] == ["pnnx_4"]  # frac
    assert {s.layer for s in res.skipped} == {"pnnx_2", "pnnx_3"}
    assert res.graph.types()["aten::lerp"] == 1


def test_needs_the_pnnx_param_for_constants_and_shapes():
    _, g, _ = fixture("leftovers")
    with pytest.raises(PassRefused, match="constant pnnx.Expression 'pnnx_expr_17', whose value "
                                          "pnnx keeps only in X.pnnx.param"):
        Lower()(g)
    res = Lower(partial=True)(g)  # frac / softsign / tanhshrink need nothing from pnnx
    assert {c.layer for c in res.changes} >= {"pnnx_29", "F.softsign_4", "F.tanhshrink_5"}
    assert any("needs pnnx's traced op" in s.reason for s in res.skipped)


ADDCMUL2 = """7767517
7 12
Input                    in0                      0 4 a b c b2
Split                    splitncnn_c              1 2 c c0 c1
pnnx.Expression          pnnx_expr_0              0 1 k
Split                    splitncnn_k              1 2 k k0 k1
aten::addcmul            pnnx_1                   4 1 a b c0 k0 x
aten::addcmul            pnnx_2                   4 1 x b2 c1 k1 y
ReLU                     relu                     1 1 y out0
"""
ADDCMUL2_PNNX = """7767517
5 8
pnnx.Input               pnnx_input_0             0 4 0 1 2 5 #0=(1,?,8)f32 #1=(1,?,8)f32 #2=(1,?,8)f32 #5={b2}
pnnx.Expression          pnnx_expr_0              0 1 3 expr=-2
aten::addcmul            pnnx_1                   4 1 0 1 2 3 4 #0=(1,?,8)f32 #1=(1,?,8)f32 #2=(1,?,8)f32 #4=(1,?,8)f32
aten::addcmul            pnnx_2                   4 1 4 5 2 3 6 #4=(1,?,8)f32 #5={b2} #2=(1,?,8)f32 #6=(1,?,8)f32
pnnx.Output              pnnx_output_0            1 0 6 #6=(1,?,8)f32
"""


def test_shared_constant_pruned_and_broadcast_declined(tmp_path):
    ok = tmp_path / "ok.pnnx.param"
    ok.write_text(ADDCMUL2_PNNX.format(b2="(1,?,8)f32"))
    g = paramsurgery.loads(ADDCMUL2)
    res = Lower(traced=ok)(g)
    assert res.graph.types() == {"Input": 1, "Split": 1, "BinaryOp": 6, "ReLU": 1}
    assert validate(res.graph) == []
    assert "removed unread splitncnn_k" in res.format() and "pnnx_expr_0" in res.format()
    assert "2=-2.0" in res.graph.layer("pnnx_1_mul").params.tokens()
    rng = np.random.default_rng(2)
    a, b, c, b2 = (rng.standard_normal((5, 8)).astype(np.float32) for _ in range(4))
    got = run(dumps(res.graph), None, {"a": a, "b": b, "c": c, "b2": b2}, ["out0"])["out0"]
    x = a + (-2 * b) * c
    np.testing.assert_allclose(got, np.maximum(x + (-2 * b2) * c, 0), rtol=1e-6, atol=1e-6)
    # the second addcmul broadcasts (b2 is (8)): declined; the constant's Split loses one top
    bc = tmp_path / "bc.pnnx.param"
    bc.write_text(ADDCMUL2_PNNX.format(b2="(8)f32"))
    with pytest.raises(PassRefused, match=r"broadcasts \(\(1,\?,8\), \(8\), \(1,\?,8\)\)"):
        Lower(traced=bc)(g)
    res = Lower(traced=bc, partial=True)(g)
    assert res.graph.types()["aten::addcmul"] == 1 and "splitncnn_k" in res.format()
    assert res.graph.layer("pnnx_2").inputs[3] == "k"  # the 1-top Split was bypassed
    assert res.graph.find("splitncnn_k") is None and validate(res.graph) == []


def test_dim0_declined(tmp_path):
    ncnn = "7767517\n2 2\nInput in0 0 1 in0\nF.softmin F.softmin_0 1 1 in0 out0\n"
    pnnx = ("7767517\n3 2\npnnx.Input pnnx_input_0 0 1 0 #0=(3,8)f32\n"
            "F.softmin F.softmin_0 1 1 0 1 dim={} $input=0 #0=(3,8)f32 #1=(3,8)f32\n"
            "pnnx.Output pnnx_output_0 1 0 1 #1=(3,8)f32\n")
    for dim, ok in (("1", True), ("-1", True), ("0", False), ("-2", False)):
        tp = tmp_path / f"d{dim}.pnnx.param"
        tp.write_text(pnnx.format(dim))
        if ok:
            res = Lower(traced=tp)(paramsurgery.loads(ncnn))
            assert res.graph.layer("F.softmin_0").params.tokens() == ["0=-1", "1=1"]
        else:
            with pytest.raises(PassRefused, match="works along dim 0, which may be pnnx's batch"):
                Lower(traced=tp)(paramsurgery.loads(ncnn))


def test_rules_compose():
    assert isinstance(RULES.only(["frac"]), Rules) and RULES.only(["frac"]).names() == ["frac"]
    assert "lerp" not in RULES.without(["lerp"]).names()
    double = Rule("double", ("aten::twice",), "x * 2", lambda s: s.binary(2, s.input(0), scalar=2))
    rules = RULES.only(["frac"]) + [double]
    assert rules.names() == ["frac", "double"]
    g = paramsurgery.loads("7767517\n3 3\nInput in0 0 1 in0\naten::twice t 1 1 in0 1\n"
                           "aten::frac f 1 1 1 out0\n")
    res = Lower(rules)(g)
    assert res.graph.types() == {"Input": 1, "BinaryOp": 2, "Split": 1, "UnaryOp": 1}
    x = np.linspace(-3, 3, 13, dtype=np.float32)
    got = run(dumps(res.graph), None, {"in0": x}, ["out0"])["out0"]
    np.testing.assert_array_equal(got, np.float32(2) * x - np.trunc(np.float32(2) * x))
    only_frac = Lower(RULES.only(["frac"]))(paramsurgery.loads(
        "7767517\n2 2\nInput in0 0 1 in0\naten::exp2 e 1 1 in0 out0\n"))
    assert not only_frac.modified and "no rule for aten::exp2" in only_frac.format()
    with pytest.raises(PassRefused, match="unknown rule\\(s\\) nope"):
        RULES.only(["nope"])


def test_every_rule_has_a_one_line_doc_and_types():
    assert len(set(RULES.names())) == len(RULES)
    for r in RULES:
        assert r.types and r.doc and "\n" not in r.doc


# ------------------------------------------------------------------ CLI

def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli(tmp_path):
    for name in ("leftovers", "declined"):
        shutil.copytree(HP / name, tmp_path / name)
    src = tmp_path / "leftovers" / "model.ncnn.param"
    r = cli("lower", src, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "leftovers" / "model.ncnn.lowered.param").read_text() == \
        (REPO / "tests" / "golden" / "handpatch" / "leftovers.lowered.param").read_text()
    bad = tmp_path / "declined" / "model.ncnn.param"
    out = tmp_path / "o.param"
    r = cli("lower", bad, "-o", out, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"{bad}:8: aten::lerp 'pnnx_2' (lerp)")
    assert not out.exists()
    r = cli("lower", bad, "--rules", "frac", "-o", out, cwd=tmp_path)
    assert r.returncode == 0 and out.exists() and "aten::lerp" in out.read_text()
    r = cli("lower", bad, "--list-rules", cwd=tmp_path)
    assert r.returncode == 0 and "addcmul" in r.stdout and "declined:" in r.stdout
    r = cli("lower", bad, "--rules", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "unknown rule(s) nope" in r.stderr


# ------------------------------------------------------------------ slow: torch

@pytest.mark.slow
def test_torch_parity_at_random_lengths():
    pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "tools"))
    from fixtures_handpatch import reference

    d, g, traced = fixture("leftovers")
    text = dumps(Lower(traced=traced)(g).graph)
    for length in (1, 2, 9, 31, 64):
        xs, ys = reference("leftovers", length)
        outs = ncnn_outputs(d, text, {f"in{i}": x for i, x in enumerate(xs)})
        assert max_rel(outs["out0"], ys[0]) <= 2e-6, length


@pytest.mark.slow
def test_fixtures_regenerate_byte_identical(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "tools"))
    import fixtures_handpatch

    try:
        fixtures_handpatch.main(["--out", str(tmp_path)])
    except Exception as exc:  # noqa: BLE001 - pnnx missing
        pytest.skip(f"cannot export: {exc}")
    for f in sorted(HP.rglob("*")):
        if f.is_file() and f.name != "README.md":
            assert (tmp_path / f.relative_to(HP)).read_bytes() == f.read_bytes(), f
