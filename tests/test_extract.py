"""extract: golden text, head + body reproduce the full graph's blobs bit for bit through
ncnn, exactly the right weight bytes, refusals with reasons, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.extract import Extract, check_extract, extract_subgraph, plan_extract
from paramsurgery.runtime.child import Feed
from paramsurgery.formats.weights import weights_fingerprint

from conftest import FIXTURES, REPO
from golden import check_golden
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps

TINY = FIXTURES / "qwen3_tts" / "tiny"


def fx(module: str, ext: str = "param", variant: str = "ported"):
    return TINY / f"{module}.{variant}.ncnn.{ext}"


def by_name(g) -> dict[str, str]:
    return {k.split("#")[0]: v for k, v in weights_fingerprint(g).items()}


def decoder_feeds(module: str) -> dict[str, Feed]:
    ref = np.load(TINY / f"{module}.ported.ref.npz")
    return {"in0": Feed(ref["input_embeds"], 0), "in1": Feed(ref["input_mask"], 0),
            "in2": Feed(ref["input_cos"], 0), "in3": Feed(ref["input_sin"], 0)}


# ------------------------------------------------------------------ golden text

def test_lm_head_off_the_predictor_heads_golden(tmp_path):
    """One of the 15 lm_heads: the Input, the Gemm, nothing else; exactly its bytes."""
    g = paramsurgery.load(fx("predictor_heads"), bin=fx("predictor_heads", "bin"))
    res = Extract(None, ["out3"])(g)
    check_golden("fusions/extract_predictor_head3.param", dumps(res.graph))
    assert res.data["inputs"] == ["in0"] and res.data["cut"] == []
    save(res.graph, tmp_path / "h.param", bin=tmp_path / "h.bin")
    blob = (tmp_path / "h.bin").read_bytes()
    w = g.layer("gemm_3").weights["B"]
    assert len(blob) == 4 + 64 * 64 * 4 == w.nbytes
    src = fx("predictor_heads", "bin").read_bytes()
    assert blob == src[w.offset:w.offset + w.nbytes]  # the same bytes, cut by the schema


def test_decoder_head_golden():
    g = paramsurgery.load(fx("predictor_decoder"))
    res = Extract(["75", "77"], ["out0"])(g)
    check_golden("fusions/extract_predictor_decoder_head.param", dumps(res.graph))
    text = dumps(res.graph).splitlines()
    assert text[2:4] == ["Input                    75                       0 1 75",
                         "Input                    77                       0 1 77"]
    # every kept line is the source line, byte for byte
    src = fx("predictor_decoder").read_text().splitlines()
    assert all(line in src for line in text[4:])


def test_body_keeps_the_graph_inputs_in_order():
    g = paramsurgery.load(fx("predictor_decoder"))
    res = Extract(None, ["75", "77"])(g)
    assert res.data["inputs"] == ["in0", "in1", "in2", "in3"]
    assert len(res.graph) == 62 and res.graph.outputs == ["75", "77"]
    check_golden("fusions/extract_predictor_decoder_body.param", dumps(res.graph))


# ------------------------------------------------------------------ numeric proof

@pytest.mark.parametrize("module,cut,extra", [
    ("predictor_decoder", ["75", "77"], []),      # last layer's MLP
    ("talker_decoder", ["75", "77"], []),
    ("talker_decoder", ["51", "53"], ["in1", "in2", "in3"]),  # last layer, mask/rope fed again
])
def test_head_and_body_reproduce_the_full_graph_exactly(tmp_path, module, cut, extra):
    """Cut at the residual stream + normed input of a layer's MLP (or between layers): body
    (graph inputs -> cut) and head (cut [+ graph inputs] -> out0) give exactly the full
    graph's blobs."""
    g = paramsurgery.load(fx(module), bin=fx(module, "bin"))
    head = extract_subgraph(g, cut + extra, ["out0"])
    body = extract_subgraph(g, None, cut)
    save(head, tmp_path / "head.param", bin=tmp_path / "head.bin")
    save(body, tmp_path / "body.param", bin=tmp_path / "body.bin")
    feeds = decoder_feeds(module)
    c_head = check_extract(str(fx(module)), str(fx(module, "bin")), str(tmp_path / "head.param"),
                           str(tmp_path / "head.bin"), feeds, ["out0"], cut=cut)
    c_body = check_extract(str(fx(module)), str(fx(module, "bin")), str(tmp_path / "body.param"),
                           str(tmp_path / "body.bin"), feeds, cut)
    assert c_head.exact, c_head.format()
    assert c_body.exact, c_body.format()
    # head + body weights = the whole .bin, and every kept layer kept its bytes
    total = os.path.getsize(fx(module, "bin"))
    assert os.path.getsize(tmp_path / "head.bin") + os.path.getsize(tmp_path / "body.bin") == total
    full = by_name(g)
    for part in (head, body):
        fp = by_name(part)
        assert fp and all(full[k] == v for k, v in fp.items())
    # and the chain head(body(x)) through ncnn equals the full graph's out0
    from paramsurgery.runtime.child import run

    mid = run(tmp_path / "body.param", tmp_path / "body.bin", feeds, cut)
    out = run(tmp_path / "head.param", tmp_path / "head.bin",
              {**mid, **{k: feeds[k] for k in extra}}, ["out0"])["out0"]
    want = run(fx(module), fx(module, "bin"), feeds, ["out0"])["out0"]
    assert np.array_equal(out, want)


def test_input_graph_is_not_modified():
    g = paramsurgery.load(fx("predictor_decoder"))
    before = dumps(g)
    extract_subgraph(g, ["75", "77"], ["out0"])
    assert dumps(g) == before and not g.modified


# ------------------------------------------------------------------ structure

def test_split_trimmed_and_multi_top_input_trimmed():
    text = ("7767517\n6 10\nInput in 0 3 a b c\nSplit sp 1 3 a a0 a1 a2\n"
            "ReLU r0 1 1 a0 x\nReLU r1 1 1 a1 y\nBinaryOp add 2 1 x b z 0=0\n"
            "BinaryOp mul 2 1 a2 c w 0=2\n")
    g = paramsurgery.loads(text)
    sub = extract_subgraph(g, ["a", "b"], ["z"])
    assert dumps(sub) == ("7767517\n3 4\n"
                           "Input                    in                       0 2 a b\n"
                           "ReLU                     r0                       1 1 a x\n"
                           "BinaryOp add 2 1 x b z 0=0\n")
    sub2 = extract_subgraph(g, ["a", "b", "c"], ["z", "w"])
    assert sub2.layer("sp").outputs == ("a0", "a2") and sub2.outputs == ["z", "w"]


def test_extra_outputs_of_multi_top_layers_are_reported():
    text = ("7767517\n4 6\nInput in 0 1 a\nSlice s 1 2 a p q -23300=2,-233,-233 1=0\n"
            "ReLU r 1 1 p x\nReLU r2 1 1 q y\n")
    res = Extract(["a"], ["x"])(paramsurgery.loads(text))
    assert res.data["extra_outputs"] == ["q"]
    assert "s (Slice) also writes q" in res.format()


def test_a_layer_that_also_writes_an_input_blob():
    text = ("7767517\n4 6\nInput in 0 1 a\nSlice s 1 2 a p q -23300=2,-233,-233 1=0\n"
            "BinaryOp add 2 1 p q x 0=0\nReLU r 1 1 x y\n")
    res = Extract(["a", "q"], ["y"])(paramsurgery.loads(text))
    g = res.graph
    assert g.producer("q").type == "Input" and g.layer("s").outputs == ("p", "q_unused")
    assert any("renamed 'q_unused'" in n for n in res.notes)


# ------------------------------------------------------------------ refusals

def test_refusals():
    g = paramsurgery.load(fx("predictor_decoder"))
    with pytest.raises(PassRefused, match=r"out0 depends on graph inputs in1, in2, in3, "
                                          r"which are not in the inputs"):
        extract_subgraph(g, ["75", "in0"], ["out0"])
    with pytest.raises(PassRefused, match=r"output 'nope': no blob of that name"):
        extract_subgraph(g, None, ["nope"])
    with pytest.raises(PassRefused, match=r"input 'zz': no blob"):
        extract_subgraph(g, ["zz"], ["out0"])
    with pytest.raises(PassRefused, match=r"named as both input and output"):
        extract_subgraph(g, ["75", "out0"], ["out0"])
    with pytest.raises(PassRefused, match=r"input\(s\) in0: no output depends on them"):
        extract_subgraph(g, ["75", "77", "in0"], ["out0"])  # in0 is cut off by 75/77
    with pytest.raises(PassRefused, match="no outputs given"):
        extract_subgraph(g, None, [])


def test_plan_names_the_cut():
    g = paramsurgery.load(fx("predictor_decoder"))
    with pytest.raises(PassRefused, match=r"input\(s\) in1: no output depends"):
        plan_extract(g, ["75", "77", "in1"], ["out0"])
    plan = plan_extract(g, ["77", "75"], ["out0"])
    assert plan.cut == ["77", "75"] and plan.graph_inputs == [] and len(plan.keep) == 8


# ------------------------------------------------------------------ CLI

def cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli_writes_param_and_bin_and_verifies(tmp_path):
    ref = np.load(TINY / "predictor_decoder.ported.ref.npz")
    np.savez(tmp_path / "feeds.npz", in0=ref["input_embeds"][0], in1=ref["input_mask"][0, 0],
             in2=ref["input_cos"][0], in3=ref["input_sin"][0])
    r = cli("extract", fx("predictor_decoder"), fx("predictor_decoder", "bin"), "--inputs",
            "75,77", "--outputs", "out0", "-o", tmp_path / "head", "--verify", "--feeds",
            tmp_path / "feeds.npz")
    assert r.returncode == 0, r.stderr
    assert "bit-identical" in r.stdout and "98572 weight bytes" in r.stdout
    assert (tmp_path / "head.param").exists() and (tmp_path / "head.bin").stat().st_size == 98572
    r = cli("extract", fx("predictor_heads"), fx("predictor_heads", "bin"), "--outputs", "out3",
            "-o", tmp_path / "lm3.param", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["layers"] == 2 and data["weight_bytes"] == 16388
    assert data["bin"] == str(tmp_path / "lm3.bin")


def test_cli_refusal_exit_2(tmp_path):
    r = cli("extract", fx("predictor_decoder"), "--inputs", "75", "--outputs", "out0", "-o",
            tmp_path / "x")
    assert r.returncode == 2
    assert "predictor_decoder.ported.ncnn.param: out0 depends on graph inputs in0, in1, in2, " \
           "in3" in r.stderr
    assert not (tmp_path / "x.param").exists()
