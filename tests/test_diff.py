"""`paramsurgery diff`: the exact added / removed / changed / renamed sets for each pass on the
fixtures, checked against the pass's own change list; identical graphs diff empty; renamed
graphs diff as renames; exit codes like diff(1)."""

import json

import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.view.diff import diff_graphs

from conftest import FIXTURES
from paramsurgery.formats.io import save

TINY = FIXTURES / "qwen3_tts" / "tiny"
REPROS = FIXTURES / "repros"


def sets(d):
    return ({lay.name for lay in d.added}, {lay.name for lay in d.removed},
            {c.layer for c in d.changed}, set(d.renamed))


def pass_layers(changes, *graphs):
    """The layer names a pass's change list names (entries like 'graph' or 'Input' that
    name no layer are summaries)."""
    names = {c.layer for c in changes}
    return {n for n in names if any(g.find(n) is not None for g in graphs)}


def check_against_pass(d, changes, a, b):
    """Every layer the pass says it changed is in the diff, and every layer the diff calls
    changed (paired in both graphs) is one the pass names or a reader it rewired."""
    named = pass_layers(changes, a, b)
    assert named <= d.touched() | {x for x, _ in d.renamed}, named - d.touched()


def test_add_kvcache():
    from paramsurgery.passes.kvcache import AddKVCache

    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    res = AddKVCache()(g)
    d = diff_graphs(g, res.graph)
    assert sets(d) == ({"kv_cache_in"}, set(), {"sdpa_43", "sdpa_44"}, set())
    check_against_pass(d, res.changes, g, res.graph)
    assert d.touched() == pass_layers(res.changes, g, res.graph)  # exactly the pass's list
    c = {c.layer: c for c in d.changed}["sdpa_43"]
    assert c.params == {7: (None, 1)}
    assert c.inputs == (["33", "34", "22", "5"], ["33", "34", "22", "5", "cache_k_in_0",
                                                  "cache_v_in_0"])
    assert c.outputs == (["35"], ["35", "cache_k_out_0", "cache_v_out_0"])
    assert c.type_change is None and c.weights is None


def test_fold_gqa():
    from paramsurgery.passes.fold_gqa import FoldGQA

    g = paramsurgery.load(FIXTURES / "fusions" / "predictor_decoder.tile.ncnn.param")
    res = FoldGQA()(g)
    d = diff_graphs(g, res.graph)
    # the pass names the two SDPAs it folded; the diff also lists the expansion it removed
    expansion = {f"{k}_{i}" for k, ids in (("unsqueeze", (51, 52, 53, 54)),
                                           ("expand", (25, 26, 27, 28)),
                                           ("reshape", (32, 33, 38, 39))) for i in ids}
    assert sets(d) == (set(), expansion, {"sdpa_55", "sdpa_56"}, set())
    assert pass_layers(res.changes, g, res.graph) == {"sdpa_55", "sdpa_56"}
    check_against_pass(d, res.changes, g, res.graph)
    for c in d.changed:  # the SDPA now reads the un-expanded k/v
        assert c.inputs is not None and c.params is None and c.outputs is None


def test_fuse_codebooks_with_weights(tmp_path):
    from paramsurgery.passes.fuse_codebooks import FuseCodebooks

    src, src_bin = TINY / "predictor_embeds.unfused.ncnn.param", \
        TINY / "predictor_embeds.unfused.ncnn.bin"
    g = paramsurgery.load(src, bin=src_bin)
    res = FuseCodebooks()(g)
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    b = paramsurgery.load(tmp_path / "f.param", bin=tmp_path / "f.bin")
    d = diff_graphs(g, b)
    added, removed, changed, renamed = sets(d)
    assert added == {"embed_fused_sum", "embed_fused_reshape0"}
    assert removed == ({f"in{i}" for i in range(1, 15)} | {f"embed_{i}" for i in range(1, 15)}
                       | {f"reshape_{i}" for i in range(16, 30)} | {f"add_{i}" for i in range(14)})
    # the first Embed (reading in0) became the fused one: paired by structure
    assert renamed == {("embed_0", "embed_fused"), ("reshape_15", "embed_fused_reshape")}
    assert changed == {"embed_fused", "embed_fused_reshape"}
    fused = {c.layer: c for c in d.changed}["embed_fused"]
    assert fused.weights is not None and fused.weights[0] != fused.weights[1]
    assert fused.weights[1] == b.layer("embed_fused").weights.sha256
    check_against_pass(d, res.changes, g, b)
    # the pass's summary entries: the 15 Embeds, the removed sum and id inputs
    texts = " ".join(f"{c.layer} {c.what} {c.before} {c.after}" for c in res.changes)
    for name in removed:
        if name.startswith(("embed_", "in")):
            assert name in texts
    # through the CLI, weights compared by hash
    r = main(["diff", str(src), str(tmp_path / "f.param"), "--bin-a", str(src_bin),
              "--bin-b", str(tmp_path / "f.bin"), "--format", "json"])
    assert r == 1


def test_fix():
    from paramsurgery.pipeline.fix import fix_graph
    from paramsurgery.formats.pnnx_traced import companion_pnnx

    expected = {
        "paramless-slice": (set(), set(), {"unbind_0"}, set()),
        "stack-sum-batch-axis": (set(), {"stack_0"}, {"sum_3"}, set()),
        "slice-batch-axis": ({"tensor_split_0_unbatch", "tensor_split_0_part0",
                              "tensor_split_0_part1", "tensor_split_0_part2"}, set(),
                             {"tensor_split_0"}, set()),
    }
    for case, want in expected.items():
        p = REPROS / case / "bug" / "model.ncnn.param"
        g = paramsurgery.load(p)
        rep = fix_graph(g, traced=companion_pnnx(p))
        d = diff_graphs(g, rep.graph)
        assert sets(d) == want, case
        changes = [c for r in rep.results for c in r.changes]
        check_against_pass(d, changes, g, rep.graph)
        assert pass_layers(changes, g, rep.graph) <= {c.layer for c in d.changed}


def test_extract():
    from paramsurgery.passes.extract import Extract

    g = paramsurgery.load(TINY / "predictor_heads.ported.ncnn.param")
    res = Extract(None, ["out3"])(g)
    d = diff_graphs(g, res.graph)
    kept = {lay.name for lay in res.graph}
    assert kept == {"in0", "gemm_3"}
    assert sets(d) == (set(), {lay.name for lay in g} - kept, {"gemm_3"}, set())
    assert {c.layer: c.inputs for c in d.changed} == {"gemm_3": (["12"], ["in0"])}
    check_against_pass(d, res.changes, g, res.graph)


def test_set_param():
    from paramsurgery.passes.set_param import SetParam

    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    res = SetParam(["scale=0.5"], types=["SDPA"])(g)
    d = diff_graphs(g, res.graph)
    assert sets(d) == (set(), set(), {"sdpa_43", "sdpa_44"}, set())
    assert d.touched() == pass_layers(res.changes, g, res.graph)
    assert all(c.params == {6: (0.25, 0.5)} for c in d.changed)


def test_identical_files_diff_empty(capsys):
    p = str(TINY / "talker_decoder.ported.ncnn.param")
    assert main(["diff", p, p, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "a": p, "b": p, "added": [], "removed": [], "changed": [], "renamed": [],
        "files": [{"file": p, "role": "a"}, {"file": p, "role": "b"}]}
    b = str(TINY / "talker_decoder.ported.ncnn.bin")
    assert main(["diff", p, p, "--bin-a", b, "--bin-b", b]) == 0
    assert "no semantic difference" in capsys.readouterr().out


def test_reformatting_is_no_difference(tmp_path):
    """Param spelling (1.0 vs 1.000000e+00), order and layout are not semantic."""
    a = "7767517\n3 3\nInput in 0 1 x\nClip c 1 1 x y 0=-1.0 1=1.0\nReLU r 1 1 y z 0=0.1\n"
    b = "7767517\n3 3\nInput in 0 1 x\nClip c 1 1 x y 1=1.000000e+00 0=-1\nReLU r 1 1 y z 0=1e-1\n"
    d = diff_graphs(paramsurgery.loads(a), paramsurgery.loads(b))
    assert d.same, d.format()


def test_renamed_layers_diff_as_renames():
    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    h = g.copy()
    for lay in list(h):
        lay.name = f"renamed_{lay.name}"
    d = diff_graphs(g, h)
    assert not d.added and not d.removed and not d.changed
    assert d.renamed == [(lay.name, f"renamed_{lay.name}") for lay in g]


def test_renamed_layers_and_blobs_follow_the_chain():
    """Layers and blobs both renamed: pairing follows the translated blobs down the graph;
    each renamed blob is reported once, at its producer's tops."""
    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    h = g.copy()
    for lay in list(h):
        lay.name = f"L_{lay.name}"
    for blob in h.blob_names():
        h.rename_blob(blob, f"b_{blob}")
    d = diff_graphs(g, h)
    assert not d.added and not d.removed
    assert len(d.renamed) == len(g)
    assert all(c.inputs is None and c.params is None and c.outputs for c in d.changed)
    assert {c.layer for c in d.changed} == {f"L_{lay.name}" for lay in g if lay.outputs}


def test_text_stat_and_exit_codes(tmp_path, capsys):
    a = tmp_path / "a.param"
    b = tmp_path / "b.param"
    a.write_text("7767517\n3 3\nInput in 0 1 x\nReLU r 1 1 x y\nSigmoid s 1 1 y z\n")
    b.write_text("7767517\n3 3\nInput in 0 1 x\nReLU r 1 1 x y 0=0.1\nTanH t 1 1 y z\n")
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert " ReLU    |    1 ~" in out and " Sigmoid |    1 -" in out and " TanH    |    1 +" in out
    assert "1 added, 1 removed, 1 changed, 0 renamed (3 -> 3 layers)" in out
    assert "~ r (ReLU)\n      params: 0(slope): (unset) -> 0.1" in out
    # bad input: exit 2 with file:line:col, no traceback
    assert main(["diff", str(a), str(tmp_path / "missing.param")]) == 2
    assert "missing.param: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.param"
    bad.write_text("7767517\n1 1\nReLU r 1\n")
    assert main(["diff", str(a), str(bad)]) == 2
    assert main(["diff", str(a), str(b), "--bin-a", str(a)]) == 2


def test_html_side_by_side(tmp_path, capsys):
    from paramsurgery.passes.kvcache import AddKVCache

    src = TINY / "talker_decoder.ported.ncnn.param"
    save(AddKVCache()(paramsurgery.load(src)).graph, tmp_path / "kv.param")
    page = tmp_path / "d.html"
    assert main(["diff", str(src), str(tmp_path / "kv.param"), "--html", str(page)]) == 1
    html = page.read_text()
    assert html.count('<svg id="g') == 2
    assert html.count("mark-changed") >= 4 + 1  # both SDPAs in both panes (+ legend)
    assert 'class="box layer io mark-added" data-name="kv_cache_in"' in html


@pytest.mark.parametrize("name", ["squeezenet.param", "mobilenet_v2.param"])
def test_corpus_self_diff(name):
    g = paramsurgery.load(FIXTURES / "ncnn_corpus" / name)
    assert diff_graphs(g, g.copy()).same


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TALKER = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")


@settings(max_examples=25, deadline=None)
@given(st.sets(st.sampled_from([lay.name for lay in _TALKER]), max_size=20),
       st.sets(st.sampled_from([b for b in _TALKER.blob_names()]), max_size=10))
def test_random_renames_are_exactly_the_renames(layers, blobs):
    """Any set of renamed layers (and blobs) diffs as exactly those renames; a renamed
    blob shows once, as a change of its producer's tops (or of an Input's)."""
    h = _TALKER.copy()
    for name in layers:
        h.layer(name).name = f"{name}_x"
    for b in blobs:
        h.rename_blob(b, f"{b}_x")
    d = diff_graphs(_TALKER, h)
    assert not d.added and not d.removed
    assert sorted(d.renamed) == sorted((n, f"{n}_x") for n in layers)
    producers = {_TALKER.producer(b).name for b in blobs}
    want = {f"{n}_x" if n in layers else n for n in producers}
    assert {c.layer for c in d.changed} == want
    assert all(c.inputs is None and c.params is None and c.type_change is None
               for c in d.changed)
