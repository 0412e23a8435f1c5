"""fuse-codebooks: hypothesis over N, vocab sizes, widths and sum forms (fused graph with
offset group-major ids = the original through ncnn), manifest round trip, the Qwen3-TTS
unfused predictor / per-level codec fixtures, untouched weight hashes, split mode, golden
text, refusals, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.extract import extract_subgraph
from paramsurgery.formats.codebooks import FusedManifest, Fusion
from paramsurgery.passes.fuse_codebooks import FuseCodebooks
from paramsurgery.verify.codebooks import verify_fusion
from paramsurgery.runtime.child import Feed, run
from paramsurgery.formats.weights import set_weights, weights_fingerprint

from conftest import FIXTURES, REPO
from golden import check_golden
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps

TINY = FIXTURES / "qwen3_tts" / "tiny"
REAL = FIXTURES / "qwen3_tts" / "real"
PRED = "predictor_embeds.unfused"
CODEC = "codec_decoder.ported_levelsum_per_level"


def fx(name: str, ext: str = "param", size=TINY):
    return size / f"{name}.ncnn.{ext}"


def by_name(g) -> dict[str, str]:
    return {k.split("#")[0]: v for k, v in weights_fingerprint(g).items()}


def rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ------------------------------------------------------------------ hand-built graphs

FORMS = ["add_chain", "add_tree", "eltwise", "stack_expand", "stack_expand_keep",
         "stack_concat_reshape"]


def build(vocabs: list[int], d: int, form: str, bias: list[bool], chain: bool,
          seed: int = 0, fp16: bool = False):
    """N Embeds, one id input each, summed in `form`; optional common Permute chain.
    Returns (graph with weights, tables, biases)."""
    n = len(vocabs)
    lines = [f"Input in{i} 0 1 in{i}" for i in range(n)]
    lines += [f"Embed emb{i} 1 1 in{i} r{i} 0={d} 1={v} 2={int(b)} 3={v * d}"
              for i, (v, b) in enumerate(zip(vocabs, bias))]
    terms = [f"r{i}" for i in range(n)]
    if chain:
        lines += [f"Permute perm{i} 1 1 r{i} p{i} 0=1" for i in range(n)]
        terms = [f"p{i}" for i in range(n)]
    if form == "add_chain":
        acc = terms[0]
        for i, t in enumerate(terms[1:]):
            nxt = "out" if i == n - 2 else f"s{i}"
            lines.append(f"BinaryOp add{i} 2 1 {acc} {t} {nxt} 0=0")
            acc = nxt
    elif form == "add_tree":
        level, k = list(terms), 0
        while len(level) > 1:
            nxt_level = []
            for j in range(0, len(level) - 1, 2):
                out = "out" if len(level) == 2 else f"s{k}"
                lines.append(f"BinaryOp add{k} 2 1 {level[j]} {level[j + 1]} {out} 0=0")
                nxt_level.append(out)
                k += 1
            if len(level) % 2:
                nxt_level.append(level[-1])
            level = nxt_level
    elif form == "eltwise":
        lines.append(f"Eltwise sum {n} 1 {' '.join(terms)} out 0=1")
    elif form in ("stack_expand", "stack_expand_keep"):
        lines += [f"ExpandDims x{i} 1 1 {t} e{i} -23303=1,0" for i, t in enumerate(terms)]
        lines.append(f"Concat cat {n} 1 {' '.join(f'e{i}' for i in range(n))} st 0=0")
        keep = int(form == "stack_expand_keep")
        lines.append(f"Reduction red 1 1 st out 0=0 1=0 -23303=1,0 4={keep} 5=1")
    elif form == "stack_concat_reshape":
        lines.append(f"Concat cat {n} 1 {' '.join(terms)} st 0=0")
        lines.append(f"Reshape rs 1 1 st st3 0={d} 1=-1 2={n}")
        lines.append("Reduction red 1 1 st3 out 0=0 1=0 -23303=1,0 4=0 5=1")
    text = f"7767517\n{len(lines)} {len(lines) * 2}\n" + "\n".join(lines) + "\n"
    g = paramsurgery.loads(text)
    rng = np.random.default_rng(seed)
    tables, biases = [], []
    for i, (v, b) in enumerate(zip(vocabs, bias)):
        t = rng.standard_normal((v, d)).astype(np.float16 if fp16 else np.float32)
        bb = rng.standard_normal(d).astype(np.float32) if b else None
        tables.append(t)
        biases.append(bb)
        kw = {"weight": t}
        if b:
            kw["bias"] = bb
        set_weights(g.layer(f"emb{i}"), **kw)
    return g, tables, biases


def numpy_sum(tables, biases, codes, chain: bool) -> np.ndarray:
    out = 0
    for t, b, c in zip(tables, biases, codes):
        rows = t.astype(np.float32)[c]
        if b is not None:
            rows = rows + b
        out = out + rows
    return out.T if chain else out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(2, 16), d=st.sampled_from([1, 3, 4, 8, 16, 33]),
       form=st.sampled_from(FORMS), equal=st.booleans(), T=st.integers(1, 9))
def test_fused_equals_original_through_ncnn(tmp_path_factory, data, n, d, form, equal, T):
    if equal:
        vocabs = [data.draw(st.integers(1, 40))] * n
    else:
        vocabs = data.draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    chain = form not in ("stack_concat_reshape",) and data.draw(st.booleans())
    bias = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    seed = data.draw(st.integers(0, 2 ** 16))
    tmp = tmp_path_factory.mktemp("fuse")
    g, tables, biases = build(vocabs, d, form, bias, chain, seed)
    save(g, tmp / "m.param", bin=tmp / "m.bin")
    rng = np.random.default_rng(seed + 1)
    codes = np.stack([rng.integers(0, v, T) for v in vocabs])
    want = numpy_sum(tables, biases, codes, chain)
    orig = run(tmp / "m.param", tmp / "m.bin",
               {f"in{i}": codes[i].astype(np.int32) for i in range(n)}, ["out"])["out"]
    assert rel(orig.reshape(want.shape), want) <= 1e-6  # the graph is the sum it claims

    res = FuseCodebooks()(paramsurgery.load(tmp / "m.param", bin=tmp / "m.bin"))
    save(res.graph, tmp / "f.param", bin=tmp / "f.bin")
    manifest = res.data["manifest"]
    (tmp / "f.json").write_text(manifest.dumps())
    back = FusedManifest.load(tmp / "f.json")  # the runtime reads the manifest, not the pass
    f = back.fusions[0]
    assert f.offsets == list(np.cumsum([0] + vocabs[:-1]))
    assert f.vocab_sizes == vocabs and f.input == "in0" and f.output == "out"
    fused = run(tmp / "f.param", tmp / "f.bin", back.feeds({"in0": codes}), ["out"])["out"]
    assert rel(fused, orig) <= 1e-6
    # one Embed, one input, no int tensor touched: the Embed reads the input directly
    fg = res.graph
    assert len(fg.by_type("Embed")) == 1 and fg.inputs == ["in0"]
    assert fg.consumer_layers("in0")[0].type == "Embed"
    assert not fg.by_type("Slice", "Crop", "BinaryOp")


def test_manifest_round_trip_and_pack_ids():
    f = Fusion("e", "sum", "ids", 4, output="out")
    from paramsurgery.formats.codebooks import CodebookGroup

    f.groups = [CodebookGroup(0, "a", "x", 3, 0), CodebookGroup(1, "b", "y", 5, 3),
                CodebookGroup(2, "c", "z", 2, 8)]
    m = FusedManifest([f], "m.fused.param", "m.fused.bin", "m.param", "m.bin")
    back = FusedManifest.loads(m.dumps())
    assert back.to_json() == m.to_json()
    assert '"offsets": [0, 3, 8]' in m.dumps()
    ids = back.fusion("ids").pack_ids([[0, 2], [4, 1], [1, 0]])
    assert ids.dtype == np.int32 and ids.tolist() == [0, 2, 7, 4, 9, 8]  # group-major
    with pytest.raises(ValueError, match="code 5 of group 1 .* outside its vocabulary"):
        back.fusion("e").pack_ids([[0, 1], [5, 0], [0, 0]])
    with pytest.raises(ValueError, match=r"codes must be \(num_groups=3, T\)"):
        back.fusion("e").pack_ids([[0, 1]])
    with pytest.raises(ValueError, match="not a fused-codebooks manifest"):
        FusedManifest.loads('{"format": "x"}')


def test_fp16_tables_stay_fp16_bytes(tmp_path):
    g, tables, _ = build([5, 7, 3], 6, "add_chain", [False] * 3, False, fp16=True)
    res = FuseCodebooks()(g)
    w = res.graph.layer("embed_fused").weights["weight"]
    assert w.dtype == "fp16"
    assert w.array().tobytes() == np.concatenate(tables).tobytes()
    # a bias forces fp32 (the folded rows are fp32 sums)
    g2, _, _ = build([5, 7], 6, "add_chain", [True, False], False, fp16=True)
    assert FuseCodebooks()(g2).graph.layer("embed_fused").weights["weight"].dtype == "fp32"


def test_small_golden():
    g, _, _ = build([3, 5, 2], 4, "add_chain", [False, True, False], True)
    res = FuseCodebooks()(g)
    check_golden("fusions/fuse_small_chain.param", dumps(res.graph))
    check_golden("fusions/fuse_small_chain.json", res.data["manifest"].dumps())
    g, _, _ = build([3, 5, 2], 4, "eltwise", [False] * 3, False)
    check_golden("fusions/fuse_small_split.param",
                 dumps(FuseCodebooks(mode="split")(g).graph))


# ------------------------------------------------------------------ Qwen3-TTS fixtures

def test_predictor_unfused_becomes_the_ports_fused_table(tmp_path):
    g = paramsurgery.load(fx(PRED), bin=fx(PRED, "bin"))
    res = FuseCodebooks()(g)
    check_golden("fusions/predictor_embeds.fused.param", dumps(res.graph))
    check_golden("fusions/predictor_embeds.fused.json", res.data["manifest"].dumps())
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    # the fused table is byte for byte the reference port's predictor_embeds (30720x1024
    # at real size; concatenated tables with one tag word)
    assert (tmp_path / "f.bin").read_bytes() == fx("predictor_embeds.ported", "bin").read_bytes()
    f = res.data["manifest"].fusions[0]
    assert f.offsets == [64 * i for i in range(15)] and f.input == "in0" and f.output == "out0"
    # torch reference of the unfused export (out0 comes back with T in ncnn's batch axis,
    # as in the original graph)
    ref = np.load(TINY / f"{PRED}.ref.npz")
    codes = np.stack([ref[f"input_codes_group{i + 1}"] for i in range(15)])
    out = run(tmp_path / "f.param", tmp_path / "f.bin", {"in0": f.pack_ids(codes)},
              ["out0"])["out0"]
    want = ref["output_embed_sum"]
    assert rel(out.reshape(want.shape), want) <= 1e-6
    check = verify_fusion(str(fx(PRED)), str(fx(PRED, "bin")), str(tmp_path / "f.param"),
                          str(tmp_path / "f.bin"), res.data["manifest"], lengths=(1, 11))
    assert check.ok, check.format()


def test_codec_per_level_fused_whole_decoder(tmp_path):
    """The 15 acoustic codebooks of the per-level codec decoder: fused, and the whole
    decoder (convs, transformer, upsampling) gives the same waveform."""
    g = paramsurgery.load(fx(CODEC), bin=fx(CODEC, "bin"))
    res = FuseCodebooks()(g)
    fg = res.graph
    save(fg, tmp_path / "f.param", bin=tmp_path / "f.bin")
    f = res.data["manifest"].fusions[0]
    assert [gr.embed for gr in f.groups] == [f"embed_{i}" for i in range(79, 94)]
    assert f.input == "in1" and f.removed_inputs == [f"in{i}" for i in range(2, 16)]
    assert len(fg) == len(g) - 14 - 14 - 15 + 3  # inputs, adds, embeds out; embed+reshape+sum in
    # untouched layers keep their bytes; the semantic codebook embed_78 is not fused
    before, after = by_name(g), by_name(fg)
    assert all(before[k] == v for k, v in after.items() if k != "embed_fused")
    assert len(after) == len(before) - 15 + 1
    ref = np.load(TINY / f"{CODEC}.ref.npz")
    codes = np.stack([ref[f"input_codes_level{i}"][0] for i in range(1, 16)])
    feeds = {"in0": Feed(ref["input_codes_level0"], 0), "in1": f.pack_ids(codes),
             "in16": Feed(ref["input_mask"], 0), "in17": Feed(ref["input_cos"], 0),
             "in18": Feed(ref["input_sin"], 0)}
    wav = run(tmp_path / "f.param", tmp_path / "f.bin", feeds, ["out0"])["out0"]
    orig_feeds = dict(feeds)
    del orig_feeds["in1"]
    orig_feeds.update({f"in{i}": Feed(ref[f"input_codes_level{i}"], 0) for i in range(1, 16)})
    wav0 = run(fx(CODEC), fx(CODEC, "bin"), orig_feeds, ["out0"])["out0"]
    assert rel(wav, wav0) <= 1e-6
    want = ref["output_wav"]
    assert rel(wav.reshape(want.shape), want) <= 1e-4  # the fixture's own ncnn-vs-torch bar


def test_codec_real_size_acoustic_codebooks(tmp_path):
    """Real sizes (15 x 2048x256): the embedding sum of the real per-level codec decoder,
    cut out with extract, weights from synth-bin."""
    from paramsurgery.formats.weights.synth import write_synth_bin

    g = paramsurgery.load(fx(CODEC, size=REAL))
    adds = [l for l in g.by_type("BinaryOp") if l.name == "add_13"]
    sub = extract_subgraph(g, None, [adds[0].outputs[0]])
    assert len(sub.by_type("Embed")) == 15
    save(sub, tmp_path / "s.param")
    with open(tmp_path / "s.bin", "wb") as fh:
        write_synth_bin(sub, fh, seed=3)
    sg = paramsurgery.load(tmp_path / "s.param", bin=tmp_path / "s.bin")
    res = FuseCodebooks()(sg)
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    f = res.data["manifest"].fusions[0]
    assert f.input_dim == 15 * 2048 and f.dim == 256
    assert os.path.getsize(tmp_path / "f.bin") == 4 + 15 * 2048 * 256 * 4
    check = verify_fusion(str(tmp_path / "s.param"), str(tmp_path / "s.bin"),
                          str(tmp_path / "f.param"), str(tmp_path / "f.bin"),
                          res.data["manifest"], lengths=(1, 25))
    assert check.ok, check.format()


@pytest.mark.slow
def test_predictor_real_size(tmp_path):
    """Real sizes: 15 tables of 2048x1024 (synth weights, 126 MB)."""
    from paramsurgery.formats.weights.synth import write_synth_bin

    g = paramsurgery.load(fx(PRED, size=REAL))
    with open(tmp_path / "m.bin", "wb") as fh:
        write_synth_bin(g, fh, seed=1)
    res = FuseCodebooks()(paramsurgery.load(fx(PRED, size=REAL), bin=tmp_path / "m.bin"))
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    assert os.path.getsize(tmp_path / "f.bin") == 125_829_124  # the port's predictor_embeds
    check = verify_fusion(str(fx(PRED, size=REAL)), str(tmp_path / "m.bin"),
                          str(tmp_path / "f.param"), str(tmp_path / "f.bin"),
                          res.data["manifest"], lengths=(1, 9))
    assert check.ok, check.format()


def test_split_mode_on_the_codec(tmp_path):
    g = paramsurgery.load(fx(CODEC), bin=fx(CODEC, "bin"))
    res = FuseCodebooks(mode="split", embeds=[f"embed_{i}" for i in range(79, 94)])(g)
    fg = res.graph
    save(fg, tmp_path / "s.param", bin=tmp_path / "s.bin")
    f = res.data["manifest"].fusions[0]
    assert [gr.output for gr in f.groups] == [str(b) for b in range(24, 39)]
    sl = fg.by_type("Slice")[-1]
    assert sl.outputs == tuple(str(b) for b in range(24, 39))
    assert fg.layer("add_0").inputs == ("24", "25")  # the sum is still there, untouched
    check = verify_fusion(str(fx(CODEC)), str(fx(CODEC, "bin")), str(tmp_path / "s.param"),
                          str(tmp_path / "s.bin"), res.data["manifest"], lengths=(3,))
    assert check.ok, check.format()
    # without --embeds split mode takes every Embed with its own ids: all 16 here
    assert len(FuseCodebooks(mode="split")(g).data["manifest"].fusions[0].groups) == 16


# ------------------------------------------------------------------ pnnx's sum forms

FUS = FIXTURES / "fusions"


def embeds3(form: str, ext: str = "param"):
    return FUS / f"embeds3.{form}.ncnn.{ext}"


@pytest.mark.parametrize("form", ["sum", "stack1", "stackm1"])
def test_pnnx_sum_forms_fuse_and_match_torch(tmp_path, form):
    """sum(parts), stack(parts, 1).sum(1), stack(parts, -1).sum(-1) as pnnx writes them
    (per-term Reshape into the batch axis, Concat + Reshape + Reduction)."""
    res = FuseCodebooks()(paramsurgery.load(embeds3(form), bin=embeds3(form, "bin")))
    check_golden(f"fusions/embeds3.{form}.fused.param", dumps(res.graph))
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    f = res.data["manifest"].fusions[0]
    assert f.vocab_sizes == [5, 7, 4] and f.offsets == [0, 5, 12]
    ref = np.load(FUS / f"embeds3.{form}.ref.npz")
    codes = np.stack([ref[f"input_ids{i}"] for i in range(3)])
    out = run(tmp_path / "f.param", tmp_path / "f.bin", {"in0": f.pack_ids(codes)},
              ["out0"])["out0"]
    assert rel(out.reshape(ref["output_sum"].shape), ref["output_sum"]) <= 1e-6
    check = verify_fusion(str(embeds3(form)), str(embeds3(form, "bin")),
                          str(tmp_path / "f.param"), str(tmp_path / "f.bin"),
                          res.data["manifest"], lengths=(1, 9))
    assert check.ok, check.format()


def test_pnnx_batch_axis_stack_refused_then_fixed(tmp_path):
    """stack(parts, 0).sum(0) is pnnx-bugs case 4 (Concat 0=-233 + Reduction -23303=0,
    wrong as exported): refused with the reason; after `fix-reduction` it fuses, and the
    fused graph gives torch's values."""
    from paramsurgery.passes.fix_reduction import FixReduction

    g = paramsurgery.load(embeds3("stack0"), bin=embeds3("stack0", "bin"))
    with pytest.raises(PassRefused, match=r"batch axis \(pnnx-bugs case 4.*fix-reduction"):
        FuseCodebooks()(g)
    res = FuseCodebooks()(FixReduction()(g).graph)
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    f = res.data["manifest"].fusions[0]
    ref = np.load(FUS / "embeds3.stack0.ref.npz")
    codes = np.stack([ref[f"input_ids{i}"] for i in range(3)])
    out = run(tmp_path / "f.param", tmp_path / "f.bin", {"in0": f.pack_ids(codes)},
              ["out0"])["out0"]
    assert rel(out.reshape(ref["output_sum"].shape), ref["output_sum"]) <= 1e-6


# ------------------------------------------------------------------ refusals

def refuse(text: str, match: str, **kw):
    with pytest.raises(PassRefused, match=match):
        FuseCodebooks(**kw)(paramsurgery.loads(text))


def head(n_lines: int) -> str:
    return f"7767517\n{n_lines} {2 * n_lines}\n"


def test_refusals():
    two = ("Input a 0 1 a\nInput b 0 1 b\nEmbed e0 1 1 a r0 0=4 1=3 2=0 3=12\n")
    refuse(head(5) + two + "Embed e1 1 1 b r1 0=5 1=3 2=0 3=15\nBinaryOp s 2 1 r0 r1 out 0=0\n",
           r"different num_output \('e0': 4, 'e1': 5\)")
    refuse(head(5) + two + "Embed e1 1 1 b r1 0=4 1=3 2=0 3=12 18=1\n"
           "BinaryOp s 2 1 r0 r1 out 0=0\n", r"is int8")
    refuse(head(5) + "Input a 0 1 a\nSplit sp 1 2 a a0 a1\nEmbed e0 1 1 a0 r0 0=4 1=3 2=0 3=12\n"
           "Embed e1 1 1 a1 r1 0=4 1=3 2=0 3=12\nBinaryOp s 2 1 r0 r1 out 0=0\n",
           r"are not a graph input \(they come from Split 'sp'\)")
    refuse(head(6) + two + "Embed e1 1 1 b r1 0=4 1=3 2=0 3=12\nPermute p 1 1 r1 q 0=1\n"
           "BinaryOp s 2 1 r0 q out 0=0\n", r"layout layers after 'e1' differ")
    refuse(head(5) + two + "Embed e1 1 1 b r1 0=4 1=3 2=0 3=12\n"
           "Eltwise s 2 1 r0 r1 out 0=1 -23301=2,1.0,2.0\n", r"coefficients")
    refuse(head(6) + two + "Embed e1 1 1 b r1 0=4 1=3 2=0 3=12\n"
           "Concat c 2 1 r0 r1 st 0=-233\nReduction red 1 1 st out 0=0 1=0 -23303=0 4=0 5=1\n",
           r"batch axis \(pnnx-bugs case 4")
    refuse(head(7) + "Input a 0 1 a\nInput b 0 1 b\nInput x 0 1 x\n"
           "Embed e0 1 1 a r0 0=4 1=3 2=0 3=12\nEmbed e1 1 1 b r1 0=4 1=3 2=0 3=12\n"
           "BinaryOp s 2 1 r0 r1 t 0=0\nBinaryOp s2 2 1 t x out 0=0\n",
           r"summed term 'x' comes from Input 'x', not from an Embed")
    refuse(head(6) + two + "Embed e1 1 1 b r1 0=4 1=3 2=0 3=12\nSplit sp 1 2 r1 r1a r1b\n"
           "BinaryOp s 2 1 r0 r1a out 0=0\n", r"comes from Split 'sp'")
    refuse(head(1) + "Input a 0 1 a\n", "no Embed layer")
    refuse(head(3) + "Input a 0 1 a\nEmbed e0 1 1 a r0 0=4 1=3 2=0 3=12\nReLU r 1 1 r0 out\n",
           "no sum of Embed lookups to fuse")
    refuse(head(3) + "Input a 0 1 a\nEmbed e0 1 1 a r0 0=4 1=3 2=0 3=12\nReLU r 1 1 r0 out\n",
           "split mode needs at least 2", mode="split")
    refuse(head(5) + two + "Embed e1 1 1 b r1 0=5 1=3 2=0 3=15\nBinaryOp s 2 1 r0 r1 out 0=0\n",
           "different widths", mode="split")


def test_explain_lists_near_misses():
    text = head(8) + ("Input a 0 1 a\nInput b 0 1 b\nInput c 0 1 c\nInput d 0 1 d\n"
                      "Embed e0 1 1 a r0 0=4 1=3 2=0 3=12\nEmbed e1 1 1 b r1 0=4 1=3 2=0 3=12\n"
                      "BinaryOp s 2 1 r0 r1 out 0=0\nBinaryOp s2 2 1 c d out2 0=0\n")
    res = FuseCodebooks()(paramsurgery.loads(text))
    assert res.modified and len(res.data["fusions"]) == 1
    assert res.graph.inputs == ["a", "c", "d"]


# ------------------------------------------------------------------ CLI

def cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli_writes_param_bin_manifest(tmp_path):
    import shutil

    for ext in ("param", "bin"):
        shutil.copy(fx(PRED, ext), tmp_path / f"model.{ext}")
    r = cli("fuse-codebooks", "model.param", "model.bin", "--input-name", "ids", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "parity: ok" in r.stdout and "14 untouched" not in r.stdout
    for ext in ("param", "bin", "json"):
        assert (tmp_path / f"model.fused.{ext}").exists()
    m = FusedManifest.load(tmp_path / "model.fused.json")
    assert m.param == "model.fused.param" and m.fusions[0].input == "ids"
    assert paramsurgery.load(tmp_path / "model.fused.param").inputs == ["ids"]
    r = cli("fuse-codebooks", "model.param", "model.bin", "--split", "-o", "s", "--format",
            "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["parity"]["ok"] and data["manifest"]["fusions"][0]["mode"] == "split"
    r = cli("fuse-codebooks", fx("predictor_decoder.ported"), "-o", tmp_path / "x")
    assert r.returncode == 2 and "no Embed layer" in r.stderr


def test_negative_reduction_axis_proven_by_inputshape(tmp_path):
    """stack via ExpandDims + Reduction over axis -3: the stacked blob's rank comes from the
    shape analysis; without the ids' shapes the pass says which flag supplies them."""
    from paramsurgery.analysis.shapes import parse_inputshape

    g, tables, biases = build([5, 7, 6], 4, "stack_expand", [False] * 3, False)
    for layer in g:
        if layer.type == "Reduction":
            layer.set(3, [-3])
    with pytest.raises(PassRefused, match=r"rank of 'st' is not known.*--inputshape"):
        FuseCodebooks()(g)
    shapes = parse_inputshape("in0=[T] in1=[T] in2=[T]")
    res = FuseCodebooks(inputshape=shapes)(g)
    assert res.modified
    codes = np.stack([np.array([0, 4, 2]), np.array([6, 1, 3]), np.array([5, 0, 2])])
    p, b = tmp_path / "f.param", tmp_path / "f.bin"
    save(res.graph, p, b)
    man = res.data["manifest"]
    out = run(p, b, {man.fusions[0].input: man.fusions[0].pack_ids(codes)}, ["out"])["out"]
    assert np.allclose(out, numpy_sum(tables, biases, codes, False), atol=1e-5)
