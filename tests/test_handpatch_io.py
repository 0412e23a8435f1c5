"""merge-inputs and rename-blobs: per-layer cache Inputs merged, cache blobs renamed to a
convention (both reproduce add-kvcache's own output byte for byte), kv-cache parity through
ncnn after the edits, swaps, collisions and refusals, idempotence, CLI."""

import os
import subprocess
import sys

import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.verify.kvcache import verify_kvcache
from paramsurgery.passes.fold_explicit_cache import FoldExplicitCache
from paramsurgery.passes.io_edits import MergeInputs, RenameBlobs
from paramsurgery.passes.kvcache import AddKVCache, cache_slots

from conftest import FIXTURES, REPO, ncnn_loads
from golden import check_golden
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps

TINY = FIXTURES / "qwen3_tts" / "tiny"


def decoder(module="predictor_decoder", ext="param"):
    return TINY / f"{module}.ported.ncnn.{ext}"


def split_cache(module="predictor_decoder", naming="ncnn-docs"):
    return AddKVCache(naming=naming, split_inputs=True)(paramsurgery.load(decoder(module))).graph


@pytest.mark.parametrize("module", ["predictor_decoder", "talker_decoder"])
def test_merge_equals_add_kvcache_single_input(module):
    g = split_cache(module)
    assert len(g.by_type("Input")) == 4 + 2 * len(g.by_type("SDPA"))
    res = MergeInputs(kv_cache=True, layer_name="kv_cache_in")(g)
    single = AddKVCache()(paramsurgery.load(decoder(module))).graph
    assert dumps(res.graph) == dumps(single)
    assert res.graph.inputs == g.inputs  # same input names, same order


def test_merge_golden_parity_and_idempotence(tmp_path):
    res = MergeInputs(kv_cache=True)(split_cache())
    check_golden("handpatch/predictor.merged.txt", res.format() + "\n")
    again = MergeInputs(kv_cache=True)(res.graph)
    assert not again.modified and "already holds exactly these inputs" in again.format()
    save(res.graph, tmp_path / "m.param")
    rep = verify_kvcache(tmp_path / "m.param", decoder(ext="bin"), n=7, m=3,
                         reference_param=decoder())
    assert rep.ok, rep.format()


def test_merge_explicit_inputs_keeps_other_tops():
    text = ("7767517\n4 6\nInput in0 0 2 a b\nInput in1 0 1 c\nInput in2 0 1 d\n"
            "Concat cat 4 1 a b c d out0 0=0\n")
    res = MergeInputs(["d", "b"], layer_name="bd")(paramsurgery.loads(text))
    assert dumps(res.graph) == ("7767517\n4 5\n"
                                 "Input                    bd                       0 2 d b\n"
                                 "Input                    in0                      0 1 a\n"
                                 "Input in1 0 1 c\n"
                                 "Concat cat 4 1 a b c d out0 0=0\n")
    assert "kept the other tops of in0" in res.format()
    assert ncnn_loads(dumps(res.graph)) == 0


@pytest.mark.parametrize("inputs,kw,msg", [
    (["a"], {}, "need at least two inputs"),
    (["a", "a"], {}, "listed twice: a"),
    (["a", "x"], {}, "'x' is not a graph input: ReLU 'r' writes it"),
    (["a", "zz"], {}, "no blob 'zz'"),
    (["a", "b"], {"layer_name": "r"}, "a layer named 'r' already exists"),
    (None, {"kv_cache": True}, "no attention layer has a native kv cache"),
])
def test_merge_refusals(inputs, kw, msg):
    text = "7767517\n3 4\nInput in0 0 1 a\nInput in1 0 1 b\nReLU r 1 1 a x\n"
    with pytest.raises(PassRefused, match=msg):
        MergeInputs(inputs, **kw)(paramsurgery.loads(text))


def test_merge_refuses_different_shape_hints():
    text = "7767517\n2 2\nInput in0 0 1 a 0=4\nInput in1 0 1 b 0=8\n"
    with pytest.raises(PassRefused, match="different shape hints \\(in0: 0=4; in1: 0=8\\)"):
        MergeInputs(["a", "b"])(paramsurgery.loads(text))
    same = "7767517\n2 2\nInput in0 0 1 a 0=4\nInput in1 0 1 b 0=4\n"
    assert MergeInputs(["a", "b"])(paramsurgery.loads(same)).graph.layer("kv_cache").params[0] == 4


# ------------------------------------------------------------------ rename-blobs

@pytest.mark.parametrize("module", ["predictor_decoder", "talker_decoder"])
def test_cache_naming_equals_add_kvcache_naming(module):
    docs = AddKVCache()(paramsurgery.load(decoder(module))).graph
    res = RenameBlobs(cache_naming="ncnn-llm")(docs)
    llm = AddKVCache(naming="ncnn-llm")(paramsurgery.load(decoder(module))).graph
    assert dumps(res.graph) == dumps(llm)  # blobs and the Input layer's name (kv_cache)
    back = RenameBlobs(cache_naming="ncnn-docs")(res.graph)
    assert dumps(back.graph) == dumps(docs)


def test_rename_golden_parity_idempotence(tmp_path):
    docs = AddKVCache()(paramsurgery.load(decoder())).graph
    res = RenameBlobs(cache_naming="ncnn-llm")(docs)
    check_golden("handpatch/predictor.renamed.txt", res.format() + "\n")
    again = RenameBlobs(cache_naming="ncnn-llm")(res.graph)
    assert not again.modified and "already has its name" in again.format()
    save(res.graph, tmp_path / "r.param")
    assert [s.k_in for s in cache_slots(res.graph)] == ["cache_k0", "cache_k1"]
    rep = verify_kvcache(tmp_path / "r.param", decoder(ext="bin"), n=5, m=2)
    assert rep.ok, rep.format()


EXPLICIT = """7767517
6 13
Input                    in0                      0 6 in1 in2 in3 in4 in5 in6
Concat                   cat_k                    2 1 in4 in2 kk 0=1
Split                    split_k                  1 2 kk kk_0 out1
Concat                   cat_v                    2 1 in5 in3 vv 0=1
Split                    split_v                  1 2 vv vv_0 out2
SDPA                     sdpa_0                   4 1 in1 kk_0 vv_0 in6 out0 5=1
"""


def test_full_decoder_io_after_fold_explicit_cache():
    """ncnn_llm's --rename-full-decoder-io: in4../out1.. -> cache_k{i}/out_cache_k{i}."""
    folded = FoldExplicitCache()(paramsurgery.loads(EXPLICIT)).graph
    res = RenameBlobs(["in1=q", "in6=mask"], cache_naming="ncnn-llm")(folded)
    assert dumps(res.graph) == """7767517
2 9
Input                    in0                      0 6 q in2 in3 cache_k0 cache_v0 mask
SDPA                     sdpa_0                   6 3 q in2 in3 mask cache_k0 cache_v0 out0 out_cache_k0 out_cache_v0 5=1 7=1
"""


def test_swap_and_chain():
    text = "7767517\n3 4\nInput in0 0 2 a b\nBinaryOp s 2 1 a b c 0=1\nReLU r 1 1 c d\n"
    res = RenameBlobs(["a=b", "b=a", "c=x", "d=c"])(paramsurgery.loads(text))
    assert dumps(res.graph).splitlines()[2:] == [
        "Input                    in0                      0 2 b a",
        "BinaryOp                 s                        2 1 b a x 0=1",
        "ReLU                     r                        1 1 x c"]


@pytest.mark.parametrize("renames,naming,msg", [
    (["a=c"], None, "cannot rename 'a' to 'c': blob 'c' exists \\(written by 's'\\)"),
    (["a=z", "b=z"], None, "'a' and 'b' would both be named 'z'"),
    (["q=z"], None, "no blob named 'q'"),
    (["a=z", "a=y"], None, "'a' would be renamed twice"),
    (["a=has space"], None, "contains whitespace"),
    ([], "ncnn-llm", "no attention layer has a native kv cache"),
    (["a"], None, "expected OLD=NEW"),
    ([], None, "nothing to rename"),
])
def test_rename_refusals(renames, naming, msg):
    text = "7767517\n2 3\nInput in0 0 2 a b\nBinaryOp s 2 1 a b c 0=1\n"
    with pytest.raises(PassRefused, match=msg):
        RenameBlobs(renames, cache_naming=naming)(paramsurgery.loads(text))


def test_cache_naming_collision_refused():
    g = AddKVCache()(paramsurgery.load(decoder())).graph
    with pytest.raises(PassRefused, match="would be renamed twice"):
        RenameBlobs(["cache_k_in_0=zz"], cache_naming="ncnn-llm")(g)
    g2 = RenameBlobs(["in0=cache_k1"])(AddKVCache()(paramsurgery.load(decoder())).graph).graph
    with pytest.raises(PassRefused, match="cannot rename 'cache_k_in_1' to 'cache_k1'"):
        RenameBlobs(cache_naming="ncnn-llm")(g2)


# ------------------------------------------------------------------ CLI

def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli(tmp_path):
    p = tmp_path / "p.param"
    save(split_cache(), p)
    r = cli("merge-inputs", p, "--kv-cache", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    merged = tmp_path / "p.merged.param"
    assert "Input                    kv_cache                 0 4 " in merged.read_text()
    r = cli("rename-blobs", merged, "--cache-naming", "ncnn-llm", "in0=embeds", "-o",
            tmp_path / "r.param", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "in0 -> embeds" in r.stdout and "cache_k_in_0 -> cache_k0" in r.stdout
    r = cli("merge-inputs", p, "--inputs", "in0,1", "-o", tmp_path / "x.param", cwd=tmp_path)
    assert r.returncode == 2 and "'1' is not a graph input: Split 'splitncnn_0'" in r.stderr
    assert r.stderr.startswith(f"{p}:") and not (tmp_path / "x.param").exists()
    r = cli("rename-blobs", p, "in0=in1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"{p}: cannot rename 'in0' to 'in1'")


# ------------------------------------------------------------------ properties

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PERM_GRAPH = paramsurgery.load(decoder())


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(2, 12))
def test_rename_any_permutation_round_trips(rnd, k):
    """Renaming k blobs by a permutation of their names, then by the inverse, is the identity
    (and the graph stays valid and loadable in between)."""
    names = PERM_GRAPH.blob_names()
    picked = rnd.sample(names, k)
    shuffled = picked[:]
    rnd.shuffle(shuffled)
    fwd = dict(zip(picked, shuffled))
    res = RenameBlobs(fwd)(PERM_GRAPH)
    assert validate(res.graph) == []
    assert ncnn_loads(dumps(res.graph)) == 0
    back = RenameBlobs({v: k_ for k_, v in fwd.items()})(res.graph)
    assert dumps(back.graph) == dumps(PERM_GRAPH)
