"""fold-gqa: the raw predictor (HF repeat_kv leftovers) becomes loadable and equal to its
ported twin; the raw talker's M-RoPE leftovers are reported, not hidden; Tile- and
stack-expanded decoders equal their folded twins at random lengths; kv-cache parity after
fold + add-kvcache (both orders); golden text; refusals; CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.verify.kvcache import DecoderIO, verify_kvcache
from paramsurgery.passes.fold_gqa import FoldGQA, expand_gqa
from paramsurgery.verify.gqa import verify_fold
from paramsurgery.passes.kvcache import AddKVCache, cache_slots
from paramsurgery.runtime.child import Feed, run, run_isolated
from paramsurgery.formats.weights import weights_fingerprint

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.formats.param_text import dumps

TINY = FIXTURES / "qwen3_tts" / "tiny"
REAL = FIXTURES / "qwen3_tts" / "real"
FUS = FIXTURES / "fusions"
IO = {"predictor_decoder": DecoderIO(head_dim=16, rope_theta=1e6),
      "talker_decoder": DecoderIO(head_dim=16, rope_theta=1e6)}


def tiny(module: str, variant: str, ext: str = "param"):
    return TINY / f"{module}.{variant}.ncnn.{ext}"


def ported_bin(module: str):
    return tiny(module, "ported", "bin")


def expanded(module: str, form: str):
    return FUS / f"{module}.{form}.ncnn.param"


def save(g, path) -> str:
    paramsurgery.save(g, path)
    return str(path)


def ref_feeds(npz) -> dict:
    ref = np.load(npz)
    return {"in0": Feed(ref["input_embeds"], 0), "in1": Feed(ref["input_mask"], 0),
            "in2": Feed(ref["input_cos"], 0), "in3": Feed(ref["input_sin"], 0)}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(np.shape(a))
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ------------------------------------------------------------------ fixtures are what we think

def test_fixture_manifest_matches_files():
    man = json.loads((FUS / "manifest.json").read_text())
    import hashlib

    for rec in man["files"]:
        if rec["module"] not in IO:
            continue  # the embeds3 records belong to test_fuse_codebooks
        assert hashlib.sha256((FUS / rec["param"]).read_bytes()).hexdigest() == \
            rec["param_sha256"]
        assert hashlib.sha256((FUS / rec["bin"]).read_bytes()).hexdigest() == rec["bin_sha256"]
        assert rec["status"]["kind"] == "runs_right"  # the expanded export itself is right
        g = paramsurgery.load(FUS / rec["param"])
        kinds = {"tile": "Tile", "stack": "Concat"}
        assert len(g.by_type(kinds[rec["form"]])) == 2 * len(g.by_type("SDPA"))


# ------------------------------------------------------------------ golden text

@pytest.mark.parametrize("module,form", [("predictor_decoder", "tile"),
                                         ("predictor_decoder", "stack"),
                                         ("talker_decoder", "tile")])
def test_golden_expanded_fixtures(module, form):
    res = FoldGQA()(paramsurgery.load(expanded(module, form)))
    check_golden(f"fusions/{module}.{form}.gqa.param", dumps(res.graph))
    assert [c.what.split(":")[0] for c in res.changes] == [f"k/v {form} expansion removed"] * 2
    assert ncnn_loads(dumps(res.graph)) == 0


def test_golden_raw_predictor():
    res = FoldGQA()(paramsurgery.load(tiny("predictor_decoder", "raw")))
    check_golden("fusions/predictor_decoder.raw.gqa.param", dumps(res.graph))
    text = dumps(res.graph)
    assert "pnnx.Expression" not in text and "Tensor.expand" not in text
    # HF's mask slice (Crop to the key length) now reads the kv-head K through a Split
    crop = res.graph.layer("slice1_0")
    assert res.graph.producer(crop.inputs[1]).type == "Split"
    sdpa = res.graph.layer("sdpa_51")
    assert res.graph.producer(sdpa.inputs[1]).type == "Split"
    assert res.graph.producer(sdpa.inputs[2]).name == "transpose_39"


# ------------------------------------------------------------------ raw HF repeat_kv

def test_raw_predictor_becomes_loadable_and_equals_the_ported_twin(tmp_path):
    raw = tiny("predictor_decoder", "raw")
    assert run_isolated(raw, tiny("predictor_decoder", "raw", "bin"), {}, []).status == \
        "load_param_failed"
    folded = save(FoldGQA()(paramsurgery.load(raw)).graph, tmp_path / "f.param")
    feeds = ref_feeds(TINY / "predictor_decoder.raw.ref.npz")
    got = run(folded, tiny("predictor_decoder", "raw", "bin"), feeds, ["out0"])["out0"]
    twin = run(tiny("predictor_decoder", "ported"), ported_bin("predictor_decoder"), feeds,
               ["out0"])["out0"]
    assert np.array_equal(got, twin)  # same kernels on the same numbers: bit-identical
    want = np.load(TINY / "predictor_decoder.raw.ref.npz")["output_hidden"]
    assert rel(got, want) <= 1e-5  # and equal to HF's own computation in torch
    check = verify_fold(folded, str(tiny("predictor_decoder", "raw", "bin")),
                        str(tiny("predictor_decoder", "ported")), lengths=(1, 5, 23),
                        io=IO["predictor_decoder"])
    assert check.ok and max(check.rel.values()) == 0.0, check.format()


def test_raw_talker_is_folded_but_still_unloadable(tmp_path):
    """The raw talker has repeat_kv AND interleaved M-RoPE (Tensor.slice step 3 +
    Tensor.slice_copy). fold-gqa folds both SDPAs and says the graph still cannot load;
    it does not pretend otherwise (the M-RoPE fix is an export patch, qwen3-tts.md §6.1)."""
    res = FoldGQA()(paramsurgery.load(tiny("talker_decoder", "raw")))
    assert len(res.data["folded"]) == 2
    assert res.data["unloadable"] == {"Tensor.slice": 4, "Tensor.slice_copy": 8}
    assert "still has layers ncnn cannot load: Tensor.slice x4, Tensor.slice_copy x8" in \
        res.format()
    folded = save(res.graph, tmp_path / "f.param")
    r = run_isolated(folded, tiny("talker_decoder", "raw", "bin"), {}, [])
    assert r.status == "load_param_failed" and "Tensor.slice" in r.stderr
    assert "pnnx.Expression" not in r.stderr and "Tensor.expand" not in r.stderr


# ------------------------------------------------------------------ Tile / stack forms

@pytest.fixture(scope="module")
def folded_fixtures(tmp_path_factory):
    d = tmp_path_factory.mktemp("gqa")
    out = {}
    for module, form in [("predictor_decoder", "tile"), ("predictor_decoder", "stack"),
                         ("talker_decoder", "tile")]:
        out[(module, form)] = save(FoldGQA()(paramsurgery.load(expanded(module, form))).graph,
                                   d / f"{module}.{form}.param")
    return out


@pytest.mark.parametrize("module,form", [("predictor_decoder", "tile"),
                                         ("predictor_decoder", "stack"),
                                         ("talker_decoder", "tile")])
def test_expanded_equals_torch_and_folded_at_the_reference_length(folded_fixtures, module,
                                                                   form):
    feeds = ref_feeds(FUS / f"{module}.{form}.ref.npz")
    want = np.load(FUS / f"{module}.{form}.ref.npz")["output_hidden"]
    a = run(expanded(module, form), ported_bin(module), feeds, ["out0"])["out0"]
    b = run(folded_fixtures[(module, form)], ported_bin(module), feeds, ["out0"])["out0"]
    assert rel(a, want) <= 1e-5 and rel(b, want) <= 1e-5
    assert np.array_equal(b, run(tiny(module, "ported"), ported_bin(module), feeds,
                                 ["out0"])["out0"])


@settings(max_examples=8, deadline=None)
@given(t=st.integers(1, 48), which=st.sampled_from([("predictor_decoder", "tile"),
                                                    ("predictor_decoder", "stack"),
                                                    ("talker_decoder", "tile")]))
def test_expanded_equals_its_folded_twin_at_random_lengths(folded_fixtures, t, which):
    module, form = which
    check = verify_fold(folded_fixtures[which], str(ported_bin(module)),
                        str(expanded(module, form)), lengths=(t,), io=IO[module], seed=t)
    assert check.ok, check.format()


def test_expand_then_fold_is_the_identity():
    for p in (tiny("talker_decoder", "ported"), tiny("predictor_decoder", "ported"),
              REAL / "talker_decoder.ported.ncnn.param"):
        g = paramsurgery.load(p)
        e = g.copy()
        n = len(expand_gqa(e))
        assert n == len(g.by_type("SDPA")) and len(e.by_type("Tile")) == 2 * n
        assert dumps(FoldGQA()(e).graph) == p.read_text()


def test_benchmark_form_heads_and_cache(tmp_path):
    """The real talker layout (16 q heads, 8 kv heads, head_dim 128) in ncnn's benchmark
    form is recognised with the right numbers."""
    g = paramsurgery.load(REAL / "talker_decoder.ported.ncnn.param")
    expand_gqa(g)
    res = FoldGQA()(AddKVCache()(g).graph)
    assert len(res.data["folded"]) == 28
    assert {(f["heads"], f["kv_heads"], f["head_dim"], f["kv_cache"])
            for f in res.data["folded"]} == {(16, 8, 128, True)}
    assert "(its kv cache now holds kv heads)" in res.format()


# ------------------------------------------------------------------ kv cache

@pytest.mark.parametrize("order", ["fold-then-cache", "cache-then-fold"])
@pytest.mark.parametrize("src", ["predictor_decoder.tile", "talker_decoder.tile",
                                 "predictor_decoder.raw"])
def test_kvcache_parity_after_fold(tmp_path, order, src):
    module, variant = src.split(".")
    param = expanded(module, variant) if variant != "raw" else tiny(module, "raw")
    bin_ = ported_bin(module)
    g = paramsurgery.load(param)
    if order == "fold-then-cache":
        out = AddKVCache()(FoldGQA()(g).graph).graph
    else:
        out = FoldGQA()(AddKVCache()(g).graph).graph
    p = save(out, tmp_path / "kv.param")
    rep = verify_kvcache(p, bin_, n=6, m=4, io=IO[module])
    assert rep.ok, rep.format()
    assert max(s.max_rel for s in rep.steps) <= 1e-5


def test_cache_holds_kv_heads(tmp_path):
    """After fold + add-kvcache the cache blobs have G channels instead of H."""
    import ncnn

    from paramsurgery.verify.kvcache import causal_mask, rope_tables

    module = "predictor_decoder"
    shapes = {}
    for name, g in (("expanded", AddKVCache()(paramsurgery.load(expanded(module, "tile"))).graph),
                    ("folded", AddKVCache()(FoldGQA()(paramsurgery.load(
                        expanded(module, "tile"))).graph).graph)):
        p = save(g, tmp_path / f"{name}.param")
        net = ncnn.Net()
        for k in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic"):
            setattr(net.opt, k, False)
        assert net.load_param(p) == 0 and net.load_model(str(ported_bin(module))) == 0
        cos, sin = rope_tables(np.arange(5), 16, 1e6)
        arrays = [np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32),
                  causal_mask(5, 0), cos, sin]
        with net.create_extractor() as ex:
            for i, a in enumerate(arrays):
                ex.input(f"in{i}", ncnn.Mat(a).clone())
            for s in cache_slots(g):
                ex.input(s.k_in, ncnn.Mat())
                ex.input(s.v_in, ncnn.Mat())
            ret, m = ex.extract(cache_slots(g)[0].k_out, 1)
            assert ret == 0
            shapes[name] = (m.w, m.h, m.c)
    assert shapes["expanded"] == (16, 5, 4) and shapes["folded"] == (16, 5, 2)


# ------------------------------------------------------------------ behaviour, refusals

def test_idempotent_and_weights_untouched():
    g = paramsurgery.load(expanded("predictor_decoder", "tile"), bin=ported_bin("predictor_decoder"))
    res = FoldGQA()(g)
    again = FoldGQA()(res.graph)
    assert not again.modified and "every SDPA already reads kv heads" in again.format()
    assert dumps(again.graph) == dumps(res.graph)
    fp = lambda x: {k.split("#")[0]: v for k, v in weights_fingerprint(x).items()}  # noqa: E731
    assert fp(res.graph) == fp(g)  # the removed layers have no weights; the .bin is the same


DEC = """7767517
{n} {b}
Input                    in0                      0 1 in0
Split                    splitncnn_0              1 3 in0 1 2 3
Reshape                  rq                       1 1 1 q0 0=8 1=4 2=-1
Permute                  pq                       1 1 q0 q 0=2
Reshape                  rk                       1 1 2 k0 0=8 1=2 2=-1
Permute                  pk                       1 1 k0 k 0=2
Reshape                  rv                       1 1 3 v0 0=8 1=2 2=-1
Permute                  pv                       1 1 v0 v 0=2
{body}
"""


def dec(body: str) -> str:
    lines = DEC.format(n=0, b=0, body=body.strip()).strip().splitlines()
    return "7767517\n%d %d\n" % (len(lines) - 2, 64) + "\n".join(lines[2:]) + "\n"


TILE_K = ("ExpandDims ek 1 1 k k1 -23303=1,1\nTile tk 1 1 k1 k2 -23302=4,1,2,1,1\n"
          "Reshape xk 1 1 k2 k3 0=8 1=-1 2=4\n")
TILE_V = ("ExpandDims ev 1 1 v v1 -23303=1,1\nTile tv 1 1 v1 v2 -23302=4,1,2,1,1\n"
          "Reshape xv 1 1 v2 v3 0=8 1=-1 2=4\n")


def test_small_graph_golden_and_numbers(tmp_path):
    text = dec(TILE_K + TILE_V + "SDPA s 3 1 q k3 v3 out0 5=0\n")
    res = FoldGQA()(paramsurgery.loads(text))
    assert res.graph.layer("s").inputs == ("q", "k", "v")
    check_golden("fusions/small_tile.gqa.param", dumps(res.graph))
    a = save(paramsurgery.loads(text), tmp_path / "a.param")
    b = save(res.graph, tmp_path / "b.param")
    x = np.random.default_rng(1).standard_normal((7, 32)).astype(np.float32)
    ya = run(a, None, {"in0": x}, ["out0"])["out0"]
    yb = run(b, None, {"in0": x}, ["out0"])["out0"]
    assert np.allclose(ya, yb, rtol=1e-6, atol=1e-6) and ya.shape == (4, 7, 8)


def skipped_reason(text: str) -> str:
    res = FoldGQA()(paramsurgery.loads(text))
    assert not res.modified
    return res.skipped[0].reason


def test_refusals_and_reasons():
    # repeat order (cat([k]*rep, dim=heads)): head j would read kv head j mod G
    stack0 = ("Split sk 1 2 k ka kb\nConcat ck 2 1 ka kb k2 0=0\nReshape xk 1 1 k2 k3 "
              "6=\"8,0h,2,2\"\nReshape yk 1 1 k3 k4 0=8 1=-1 2=4\n")
    assert "repeat order" in skipped_reason(dec(stack0 + TILE_V + "SDPA s 3 1 q k4 v3 out0\n"))
    # Tile repeating the head axis instead of the new one
    bad_tile = TILE_K.replace("-23302=4,1,2,1,1", "-23302=4,2,1,1,1")
    assert "want [1, rep, 1, 1]" in skipped_reason(dec(bad_tile + TILE_V +
                                                       "SDPA s 3 1 q k3 v3 out0\n"))
    # ExpandDims before the heads (axis 0)
    bad_exp = TILE_K.replace("-23303=1,1", "-23303=1,0")
    assert "not from ExpandDims adding axis 1" in skipped_reason(
        dec(bad_exp + TILE_V + "SDPA s 3 1 q k3 v3 out0\n"))
    # the expanded K is also read by something that needs all H heads
    extra = TILE_K.replace("Reshape xk 1 1 k2 k3", "Reshape xk 1 1 k2 kk") + \
        "Split sx 1 2 kk k3 k4\nReLU relu 1 1 k4 out1\n"
    assert "also read by ReLU 'relu', which would see 2 heads instead of 4" in skipped_reason(
        dec(extra + TILE_V + "SDPA s 3 1 q k3 v3 out0\n"))
    # the final Reshape does not keep [D, T]
    bad_r = TILE_K.replace("0=8 1=-1 2=4", "0=16 1=-1 2=2")
    assert "gives width 16, not head_dim 8" in skipped_reason(
        dec(bad_r + TILE_V + "SDPA s 3 1 q k3 v3 out0\n"))
    # Tensor.expand with h=-1: the repeat count is unknown, so c=H cannot be proven
    exp_k = ("ExpandDims ek 1 1 k k1 -23303=1,1\npnnx.Expression pe 1 1 k sz\n"
             "Tensor.expand te 2 1 k1 sz k2\nReshape xk 1 1 k2 k3 0=8 1=-1 2=4\n")
    assert "rep unknown" in skipped_reason(dec(exp_k + TILE_V + "SDPA s 3 1 q k3 v3 out0\n"))
    # head layout not recoverable (K comes straight from the input)
    text = ("7767517\n7 9\nInput in0 0 3 q k v\nExpandDims ek 1 1 k k1 -23303=1,1\n"
            "Tile tk 1 1 k1 k2 -23302=4,1,2,1,1\nReshape xk 1 1 k2 k3 0=8 1=-1 2=4\n"
            "ExpandDims ev 1 1 v v1 -23303=1,1\nTile tv 1 1 v1 v2 -23302=4,1,2,1,1\n"
            "SDPA s 3 1 q k3 v2 out0\n")
    assert "cannot find how 'k' was split into heads" in skipped_reason(text)
    with pytest.raises(PassRefused, match="no SDPA layer"):
        FoldGQA()(paramsurgery.load(FIXTURES / "ncnn_corpus" / "squeezenet.param"))
    with pytest.raises(PassRefused, match="not SDPA layers: nope"):
        FoldGQA(only=["nope"])(paramsurgery.load(expanded("predictor_decoder", "tile")))


def test_only_and_skip():
    g = paramsurgery.load(expanded("predictor_decoder", "tile"))
    res = FoldGQA(only=["sdpa_55"])(g)
    assert [f["sdpa"] for f in res.data["folded"]] == ["sdpa_55"]
    assert "not selected by --only" in res.format(explain=True)
    res = FoldGQA(skip=["sdpa_55"])(g)
    assert [f["sdpa"] for f in res.data["folded"]] == ["sdpa_56"]


# ------------------------------------------------------------------ CLI

def cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli(tmp_path):
    r = cli("fold-gqa", expanded("predictor_decoder", "tile"), "-o", tmp_path / "f.param",
            "--bin", ported_bin("predictor_decoder"), "--verify", "--lengths", "3,11",
            "--head-dim", "16", "--rope-theta", "1000000")
    assert r.returncode == 0, r.stderr
    assert "parity: ok" in r.stdout and ("hard link" in r.stdout or "copy" in r.stdout)
    assert (tmp_path / "f.bin").read_bytes() == ported_bin("predictor_decoder").read_bytes()
    # the raw predictor cannot be its own reference (it does not load): refuse, then prove
    # it against the ported twin
    raw, raw_bin = tiny("predictor_decoder", "raw"), tiny("predictor_decoder", "raw", "bin")
    r = cli("fold-gqa", raw, "-o", tmp_path / "r.param", "--bin", raw_bin, "--verify")
    assert r.returncode == 1 and "the reference does not run: load_param_failed" in r.stderr
    assert not (tmp_path / "r.param").exists()
    r = cli("fold-gqa", raw, "-o", tmp_path / "r.param", "--bin", raw_bin, "--verify",
            "--reference", tiny("predictor_decoder", "ported"), "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["verify"]["ok"] and len(data["folded"]) == 2
    r = cli("fold-gqa", FIXTURES / "ncnn_corpus" / "squeezenet.param", "-o", tmp_path / "x")
    assert r.returncode == 2 and "no SDPA layer" in r.stderr


# ------------------------------------------------------------------ regeneration (torch+pnnx)

@pytest.mark.slow
def test_regenerate_fixtures(tmp_path):
    pytest.importorskip("torch")
    import importlib.util

    if importlib.util.find_spec("qwen_tts") is None:  # importing it needs the torchaudio stub
        pytest.skip("qwen-tts is not installed")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "fixtures_fusions.py"), "--out",
                        str(tmp_path), "--scratch", str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    for rec in json.loads((FUS / "manifest.json").read_text())["files"]:
        assert (tmp_path / rec["param"]).read_bytes() == (FUS / rec["param"]).read_bytes()


@pytest.mark.slow
def test_bench_gqa_smoke(tmp_path):
    """tools/bench_gqa.py on a 1-layer cut of the real talker (synth weights)."""
    r = subprocess.run([sys.executable, str(REPO / "tools" / "bench_gqa.py"), "--layers", "1",
                        "--past", "8", "--steps", "2", "--rounds", "1", "--scratch",
                        str(tmp_path), "--json", str(tmp_path / "b.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["agree_rel"] == 0.0
    assert data["past"]["8"]["ratio"]["cache_bytes"] == 2.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("bench-gqa-")]
