"""add-kvcache: golden text, parity through ncnn at untraced lengths, idempotence,
selection, refusals, and the explicit-cache fold."""

import json
import os
import subprocess
import sys

import ncnn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.verify.kvcache import DecoderIO, verify_kvcache
from paramsurgery.pipeline.manager import PassManager
from paramsurgery.passes.fold_explicit_cache import FoldExplicitCache
from paramsurgery.passes.kvcache import AddKVCache, cache_slots

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps

TINY = FIXTURES / "qwen3_tts" / "tiny"
REAL = FIXTURES / "qwen3_tts" / "real"
DECODERS = ["talker_decoder", "predictor_decoder"]


def fixture(module, ext="param", size=TINY):
    return size / f"{module}.ported.ncnn.{ext}"


# ------------------------------------------------------------------ golden text (filecheck style)

SMALL = """7767517
6 8
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Split                    splitncnn_0              1 3 in0 1 2 3
Gemm                     gemm_0                   1 1 1 4 10=-1 2=0 3=1 4=0 5=0 6=1 7=5 8=8 9=8
SDPA                     sdpa_0                   4 1 4 2 3 in1 5 5=1 6=0.353553385
Gemm                     gemm_1                   1 1 5 out0 10=-1 2=0 3=1 4=0 5=0 6=1 7=5 8=8 9=8
"""


def test_small_graph_golden_docs_naming():
    g = AddKVCache()(paramsurgery.loads(SMALL)).graph
    assert dumps(g) == """7767517
7 12
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Input                    kv_cache_in              0 2 cache_k_in_0 cache_v_in_0
Split                    splitncnn_0              1 3 in0 1 2 3
Gemm                     gemm_0                   1 1 1 4 10=-1 2=0 3=1 4=0 5=0 6=1 7=5 8=8 9=8
SDPA                     sdpa_0                   6 3 4 2 3 in1 cache_k_in_0 cache_v_in_0 5 cache_k_out_0 cache_v_out_0 5=1 6=0.353553385 7=1
Gemm                     gemm_1                   1 1 5 out0 10=-1 2=0 3=1 4=0 5=0 6=1 7=5 8=8 9=8
"""


def test_small_graph_golden_llm_naming_split_inputs_dynamic_gemm():
    res = AddKVCache(naming="ncnn-llm", split_inputs=True, dynamic_gemm=True)(
        paramsurgery.loads(SMALL))
    assert dumps(res.graph) == """7767517
8 12
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Input                    cache_k0                 0 1 cache_k0
Input                    cache_v0                 0 1 cache_v0
Split                    splitncnn_0              1 3 in0 1 2 3
Gemm                     gemm_0                   1 1 1 4 10=-1 2=0 3=1 4=0 5=0 6=1 7=0 8=8 9=8
SDPA                     sdpa_0                   6 3 4 2 3 in1 cache_k0 cache_v0 5 out_cache_k0 out_cache_v0 5=1 6=0.353553385 7=1
Gemm                     gemm_1                   1 1 5 out0 10=-1 2=0 3=1 4=0 5=0 6=1 7=0 8=8 9=8
"""
    gemm_changes = [c for c in res.changes if c.what == "7 (constantM)"]
    assert [(c.layer, c.before, c.after) for c in gemm_changes] == [("gemm_0", 5, 0), ("gemm_1", 5, 0)]


@pytest.mark.parametrize("module", DECODERS)
@pytest.mark.parametrize("naming", ["ncnn-docs", "ncnn-llm"])
def test_fixture_golden(module, naming):
    g = paramsurgery.load(fixture(module))
    res = AddKVCache(naming=naming)(g)
    check_golden(f"kvcache/{module}.{naming}.param", dumps(res.graph))
    # every line the pass did not touch is byte-identical to the input
    before = fixture(module).read_text().splitlines()
    after = dumps(res.graph).splitlines()
    untouched = [l for l in before[2:] if not l.startswith("SDPA")]
    assert all(l in after for l in untouched)
    assert ncnn_loads(dumps(res.graph)) == 0


# ------------------------------------------------------------------ parity through ncnn

@pytest.fixture(scope="module")
def kv_fixtures(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("kv")
    for module in DECODERS:
        g = AddKVCache()(paramsurgery.load(fixture(module))).graph
        p = d / f"{module}.kvcache.param"
        save(g, p)
        out[module] = p
    return out


@pytest.mark.parametrize("module", DECODERS)
def test_parity_default(module, kv_fixtures):
    rep = verify_kvcache(kv_fixtures[module], fixture(module, "bin"), n=11, m=4,
                         reference_param=fixture(module))
    assert rep.ok, rep.format()
    assert len(rep.steps) == 5 and rep.reference_rel == 0.0
    assert all(s.max_rel <= 1e-5 for s in rep.steps)


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 40), m=st.integers(1, 8), module=st.sampled_from(DECODERS))
def test_parity_hypothesis(kv_fixtures, n, m, module):
    rep = verify_kvcache(kv_fixtures[module], fixture(module, "bin"), n=n, m=m, seed=n * 7 + m)
    assert rep.ok, rep.format()


def _decode(param, bin, calls, slots, io):
    """Feed explicit per-call inputs (the torch reference's), caches fed back raw."""
    net = ncnn.Net()
    for k in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, k, False)
    assert net.load_param(str(param)) == 0 and net.load_model(str(bin)) == 0
    caches, outs, keep = {}, [], []
    for feeds in calls:
        ex = net.create_extractor()
        for name, arr in feeds.items():
            a = np.ascontiguousarray(arr, np.float32)
            keep.append(a)
            ex.input(name, ncnn.Mat(a).clone())
        for s in slots:
            ex.input(s.k_in, caches.get(s.k_in, ncnn.Mat()))
            ex.input(s.v_in, caches.get(s.v_in, ncnn.Mat()))
        ret, out = ex.extract(io.output)
        assert ret == 0
        outs.append(np.array(out))
        for s in slots:
            caches[s.k_in] = ex.extract(s.k_out, 1)[1]
            caches[s.v_in] = ex.extract(s.v_out, 1)[1]
    return outs


@pytest.mark.parametrize("module", DECODERS)
def test_steps_match_the_torch_reference(module, kv_fixtures):
    """The fixture's torch reference (explicit-cache layer loop): prefill + 3 steps."""
    ref = np.load(TINY / f"{module}.kvcache.npz")
    io = DecoderIO()
    calls = []
    for stage in ["prefill", "step1", "step2", "step3"]:
        calls.append({io.embeds: ref[f"{stage}_embeds"][0], io.mask: ref[f"{stage}_mask"],
                      io.cos: ref[f"{stage}_cos"][0], io.sin: ref[f"{stage}_sin"][0]})
    slots = cache_slots(paramsurgery.load(kv_fixtures[module]))
    outs = _decode(kv_fixtures[module], fixture(module, "bin"), calls, slots, io)
    for stage, got in zip(["prefill", "step1", "step2", "step3"], outs):
        want = ref[f"{stage}_out"][0]
        rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert rel <= 1e-5, (stage, rel)


def test_mha_self_attention_cache(tmp_path):
    """MultiHeadAttention's kv-cache form, with weights written by hand."""
    E, H = 16, 2
    text = ("7767517\n4 5\nInput in0 0 1 in0\nInput in1 0 1 in1\n"
            f"MultiHeadAttention mha 2 1 in0 in1 a 0={E} 1={H} 2={E * E} 5=1\n"
            "ReLU relu 1 1 a out0\n")
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(4):  # q, k, v, out: tagged weight, raw bias
        parts.append(np.zeros(1, np.uint32).tobytes())
        parts.append((rng.standard_normal(E * E) / 4).astype(np.float32).tobytes())
        parts.append((rng.standard_normal(E) / 4).astype(np.float32).tobytes())
    (tmp_path / "m.bin").write_bytes(b"".join(parts))
    (tmp_path / "m.param").write_text(text)
    res = AddKVCache()(paramsurgery.loads(text))
    assert res.graph.layer("mha").inputs == ("in0", "in1", "cache_k_in_0", "cache_v_in_0")
    assert res.graph.layer("mha").outputs == ("a", "cache_k_out_0", "cache_v_out_0")
    save(res.graph, tmp_path / "kv.param")
    rep = verify_kvcache(tmp_path / "kv.param", tmp_path / "m.bin", n=5, m=4,
                         reference_param=tmp_path / "m.param")
    assert rep.ok, rep.format()


def test_verify_reports_a_decoder_that_mixes_positions(kv_fixtures, tmp_path):
    """A graph the cache cannot serve (a cumulative sum over the sequence before attention)
    must fail the parity check: the prefill still matches, the cached steps do not."""
    g = paramsurgery.load(kv_fixtures["talker_decoder"])
    first = g.consumers("in0")[0][0]
    g.insert_before(first, "CumulativeSum", "mix_positions", {0: 0})
    save(g, tmp_path / "broken.param")
    rep = verify_kvcache(tmp_path / "broken.param", fixture("talker_decoder", "bin"), n=6, m=3,
                         io=DecoderIO(hidden=64))
    assert not rep.ok
    assert rep.steps[0].max_rel <= 1e-5
    assert max(s.max_rel for s in rep.steps[1:]) > 1e-2


# ------------------------------------------------------------------ behaviour

def test_idempotent_and_says_so():
    g = AddKVCache()(paramsurgery.load(fixture("talker_decoder"))).graph
    again = AddKVCache()(g)
    assert not again.modified
    assert dumps(again.graph) == dumps(g)
    assert "every attention layer already has a kv cache" in again.format()


def test_only_and_skip_and_stable_numbering():
    g = paramsurgery.load(fixture("talker_decoder"))
    names = [l.name for l in g.by_type("SDPA")]
    res = AddKVCache(only=[names[1]])(g)
    assert [s.layer for s in res.data["slots"]] == [names[1]]
    assert res.data["slots"][0].k_in == "cache_k_in_1"  # ordinal among all attention layers
    assert "not selected by --only" in res.format(explain=True)
    # the rest later: appended to the same Input layer
    res2 = AddKVCache(skip=[])(res.graph)
    inputs = res2.graph.layer("kv_cache_in").outputs
    assert inputs == ("cache_k_in_1", "cache_v_in_1", "cache_k_in_0", "cache_v_in_0")
    with pytest.raises(PassRefused, match="not attention layers: nope"):
        AddKVCache(only=["nope"])(g)


def test_refuses_without_attention():
    g = paramsurgery.load(FIXTURES / "ncnn_corpus" / "squeezenet.param")
    with pytest.raises(PassRefused, match="no SDPA or MultiHeadAttention layer"):
        AddKVCache()(g)


def test_refuses_cross_attention_sdpa():
    text = ("7767517\n3 6\nInput in0 0 3 q enc mask\nSplit sp 1 2 enc k v\n"
            "SDPA sdpa_0 4 1 q k v mask out0 5=1\n")
    res = AddKVCache()(paramsurgery.loads(text))
    assert not res.modified
    assert res.skipped[0].reason.startswith("not self-attention")
    text2 = ("7767517\n2 5\nInput in0 0 4 q k v mask\nSDPA sdpa_0 4 1 q k v mask out0 5=1\n")
    res2 = AddKVCache()(paramsurgery.loads(text2))
    assert "k/v depend on graph input(s) k, v that q does not" in res2.skipped[0].reason


def test_refuses_inconsistent_sdpa():
    text = "7767517\n2 4\nInput in0 0 3 q k v\nSDPA s 3 1 q k v out0 5=1\n"
    res = AddKVCache()(paramsurgery.loads(text))
    assert "has 3 bottoms but 5=1 means 4" in res.skipped[0].reason


def test_blob_name_collision_is_refused():
    text = SMALL.replace("5 5=1", "cache_k_in_0 5=1").replace("1 1 5 out0", "1 1 cache_k_in_0 out0")
    with pytest.raises(PassRefused, match="already exist"):
        AddKVCache()(paramsurgery.loads(text))


def test_manager_rolls_back_a_failed_pass():
    g = paramsurgery.loads(SMALL)
    before = dumps(g)
    final, results, failures = PassManager([AddKVCache(), AddKVCache(only=["zzz"])]).run(g)
    assert dumps(g) == before  # the input is never modified
    assert failures and failures[0][0] == "add-kvcache"
    assert dumps(final) == dumps(results[0].graph)


@pytest.mark.parametrize("module,n_sdpa", [("talker_decoder", 28), ("predictor_decoder", 5)])
def test_real_size_params(module, n_sdpa):
    path = fixture(module, size=REAL)
    g = paramsurgery.load(path)
    res = AddKVCache()(g)
    new = res.graph
    assert len(res.data["slots"]) == n_sdpa
    assert len(new) == len(g) + 1 and new.blob_count() == g.blob_count() + 4 * n_sdpa
    head = dumps(new).split("\n")[1]
    assert head == f"{len(g) + 1} {g.blob_count() + 4 * n_sdpa}"
    assert ncnn_loads(dumps(new)) == 0


@pytest.mark.slow
def test_real_size_parity_with_synth_weights(tmp_path):
    """One parity run at real size: the 5-layer predictor (16 q / 8 kv heads, head_dim 128,
    hidden 1024) with synth-bin weights (157 MB)."""
    from paramsurgery.formats.weights.synth import write_synth_bin

    src = fixture("predictor_decoder", size=REAL)
    g = paramsurgery.load(src)
    with open(tmp_path / "p.bin", "wb") as fh:
        write_synth_bin(g, fh, seed=0)
    save(AddKVCache()(g).graph, tmp_path / "kv.param")
    rep = verify_kvcache(tmp_path / "kv.param", tmp_path / "p.bin", n=13, m=3,
                         io=DecoderIO(rope_theta=1e6), reference_param=src)
    assert rep.ok, rep.format()
    assert rep.reference_rel == 0.0


# ------------------------------------------------------------------ CLI

def run_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli_add_kvcache_verify_and_bin(tmp_path):
    src, b = fixture("talker_decoder"), fixture("talker_decoder", "bin")
    out = tmp_path / "talker.kv.param"
    r = run_cli("add-kvcache", src, "--bin", b, "-o", out, "--verify", "--n", "9", "--m", "3",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "parity: ok" in r.stdout and "weights: unchanged" in r.stdout
    assert (tmp_path / "talker.kv.bin").read_bytes() == b.read_bytes()
    r = run_cli("verify-kvcache", out, tmp_path / "talker.kv.bin", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"]
    # default output name, input untouched
    copy = tmp_path / "talker.param"
    copy.write_bytes(src.read_bytes())
    r = run_cli("add-kvcache", copy, cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "talker.kvcache.param").exists()
    assert copy.read_bytes() == src.read_bytes()


def test_cli_verify_failure_writes_nothing(tmp_path):
    # a time-mixing layer (cumulative sum over the sequence) before attention: the cache
    # cannot see the earlier tokens, so the parity check fails and nothing is written
    text = ("7767517\n6 8\nInput in0 0 1 in0\nInput in1 0 1 in1\n"
            "CumulativeSum cs 1 1 in0 x 0=0\nReshape r 1 1 x x3 0=8 1=-1 2=1\n"
            "Split sp 1 3 x3 q k v\nSDPA s 4 1 q k v in1 out0 5=1\n")
    p = tmp_path / "cumsum.param"
    p.write_text(text)
    (tmp_path / "cumsum.bin").write_bytes(b"")
    out = tmp_path / "out.param"
    r = run_cli("add-kvcache", p, "--bin", tmp_path / "cumsum.bin", "-o", out, "--verify",
                "--n", "4", "--m", "2", "--hidden", "8", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "refusing to write" in r.stderr
    assert not out.exists()


def test_cli_passes_lists_add_kvcache(tmp_path):
    r = run_cli("passes", cwd=tmp_path)
    assert r.returncode == 0 and "add-kvcache" in r.stdout and "fold-explicit-cache" in r.stdout


# ------------------------------------------------------------------ explicit cache fold

EXPLICIT = """7767517
6 13
Input                    in0                      0 6 q k v past_k past_v mask
Concat                   cat_k                    2 1 past_k k kk 0=1
Split                    split_k                  1 2 kk kk_0 present_k
Concat                   cat_v                    2 1 past_v v vv 0=1
Split                    split_v                  1 2 vv vv_0 present_v
SDPA                     sdpa_0                   4 1 q kk_0 vv_0 mask out0 5=1
"""


def test_fold_explicit_cache_golden_and_numbers():
    g = paramsurgery.loads(EXPLICIT)
    res = FoldExplicitCache()(g)
    assert dumps(res.graph) == """7767517
2 9
Input                    in0                      0 6 q k v past_k past_v mask
SDPA                     sdpa_0                   6 3 q k v mask past_k past_v out0 present_k present_v 5=1 7=1
"""
    # numbers: explicit graph fed numpy pasts vs folded graph fed its own raw caches
    D, G, T = 8, 2, 7
    rng = np.random.default_rng(3)
    Q, K, V = (rng.standard_normal((G, T, D)).astype(np.float32) for _ in range(3))
    exp_net, fold_net = ncnn.Net(), ncnn.Net()
    for net, text in ((exp_net, EXPLICIT), (fold_net, dumps(res.graph))):
        net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = False
        assert net.load_param_mem(text) == 0
        net.load_model(ncnn.DataReaderFromEmpty())
    keep, caches = [], {}

    def m(a):
        a = np.ascontiguousarray(a, np.float32)
        keep.append(a)
        return ncnn.Mat(a).clone()

    for t in range(T):
        qt, kt, vt = Q[:, t:t + 1], K[:, t:t + 1], V[:, t:t + 1]
        mask = np.zeros((1, t + 1), np.float32)
        ex = fold_net.create_extractor()
        for name, arr in (("q", qt), ("k", kt), ("v", vt), ("mask", mask)):
            ex.input(name, m(arr))
        ex.input("past_k", caches.get("k", ncnn.Mat()))
        ex.input("past_v", caches.get("v", ncnn.Mat()))
        got = np.array(ex.extract("out0")[1])
        caches = {"k": ex.extract("present_k", 1)[1], "v": ex.extract("present_v", 1)[1]}
        if t == 0:
            continue  # the explicit graph cannot take an empty past (Concat crashes)
        ex2 = exp_net.create_extractor()
        for name, arr in (("q", qt), ("k", kt), ("v", vt), ("mask", mask),
                          ("past_k", K[:, :t]), ("past_v", V[:, :t])):
            ex2.input(name, m(arr))
        want = np.array(ex2.extract("out0")[1])
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_fold_explicit_cache_explains_near_misses():
    text = EXPLICIT.replace("past_k k kk 0=1", "past_k k kk 0=2")
    res = FoldExplicitCache()(paramsurgery.loads(text))
    assert not res.modified
    assert "joins axis 2, not the sequence axis" in res.format(explain=True)
