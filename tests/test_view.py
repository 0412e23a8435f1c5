"""`paramsurgery view`: the real talker drawn whole (every layer and blob in the SVG) fast,
no external URL in the page, a golden SVG of a small graph, the layout's invariants,
--around, the per-layer values page compare reuses, and --report on graph-writing commands."""

import re
import time

import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.view.layout import layered_layout
from paramsurgery.view.page import graph_page, values_page
from paramsurgery.view.scene import build_scene, hub_layers, neighbourhood
from paramsurgery.view.svg import render_svg

from conftest import FIXTURES
from golden import check_golden

TINY = FIXTURES / "qwen3_tts" / "tiny"
REAL_TALKER = FIXTURES / "qwen3_tts" / "real" / "talker_decoder.ported.ncnn.param"

SMALL = """7767517
9 10
Input            data      0 1 data -23330=4,3,8,8,3
Convolution      conv1     1 1 data c1 -23330=4,3,8,8,4 0=4 1=3 4=1 5=1 6=108
Split            split0    1 2 c1 c1a c1b
ReLU             relu1     1 1 c1a r1
torch.roll       roll0     1 1 c1b r2 0=1
BinaryOp         add0      2 1 r1 r2 s 0=0
MyCustom         custom0   1 1 s t
Concat           cat0      2 1 t ghost u
Sigmoid          sig0      1 1 u out0
"""

EXTERNAL = re.compile(r"https?:|//[a-z0-9]|\bsrc=|\bhref=|url\(|@import|xmlns", re.I)


def test_small_svg_golden():
    g = paramsurgery.loads(SMALL, "small.param")
    from paramsurgery.view.labels import blob_shapes

    scene = build_scene(g, shapes=blob_shapes(g))
    svg = render_svg(scene)
    check_golden("view/small.svg", svg + "\n")
    # the structure the golden pins: kinds and highlights
    assert 'class="box layer io" data-name="data"' in svg
    assert 'class="box layer leftover" data-name="roll0"' in svg
    assert 'class="box layer unknown" data-name="custom0"' in svg
    assert 'class="box missing missing" data-name="ghost"' in svg
    assert 'class="box output io" data-name="out0"' in svg
    assert ">c1 [4,8,8]</text>" in svg  # the shapes analysis, from the -23330 hints
    assert ">num_output=4 kernel_w=3 pad_left=1</text>" in svg  # defaults left out
    assert ">bias_term=1 weight_data_size=108</text>" in svg
    assert "\n-23330=4,3,8,8,4 0=4 1=3 4=1 5=1 6=108\n" in svg  # all of it in the tooltip


def test_real_talker_every_layer_and_blob_fast(tmp_path):
    from paramsurgery.view.labels import blob_shapes

    # CPU time of this process: the machine running the suite may be shared (wall time is
    # what tools/bench_view.py reports)
    t0 = time.process_time()
    g = paramsurgery.load(REAL_TALKER)
    page = graph_page(g, shapes=blob_shapes(g))
    elapsed = time.process_time() - t0
    assert elapsed < 2.0, f"{elapsed:.2f} s"
    names = set(re.findall(r'<g id="g0-n\d+" class="box layer [^"]*" data-name="([^"]*)"', page))
    assert names == {lay.name for lay in g} and len(g) == 850
    blobs = set(re.findall(r'data-blob="([^"]*)"', page))
    pills = set(re.findall(r'class="box (?:output|missing|cut)[^"]*" data-name="([^"]*)"', page))
    assert set(g.blob_names()) <= blobs | pills
    assert len(g.blob_names()) == 1127
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    # shapes from the pnnx trace beside the file label the wires
    assert "(1,?,1024)" in page


def test_cli_view(tmp_path, capsys):
    out = tmp_path / "p.html"
    assert main(["view", str(TINY / "talker_decoder.ported.ncnn.param"), "--bin",
                 str(TINY / "talker_decoder.ported.ncnn.bin"), "-o", str(out)]) == 0
    html = out.read_text()
    assert html.startswith("<!doctype html>") and "<script>" in html
    assert not EXTERNAL.search(html)
    assert ">fp32 16.0 KB</text>" in html  # weights per box with --bin
    assert "41 blob shapes known" in html


def test_around_and_the_size_limit(tmp_path, capsys):
    g = paramsurgery.load(REAL_TALKER)
    ids = neighbourhood(g, "sdpa_564", 2)
    near = {g.layer(i).name for i in ids}
    # 2 hops reach every SDPA through the attention mask's Split: 40 of 850 layers
    assert "sdpa_564" in near and len(near) == 40
    for i in ids:  # everything within 2 hops, nothing farther
        lay = g.layer(i)
        assert lay.name == "sdpa_564" or any(n.id in ids for n in (*g.predecessors(lay),
                                                                   *g.successors(lay)))
    out = tmp_path / "a.html"
    assert main(["view", str(REAL_TALKER), "--around", "sdpa_564", "--depth", "2", "-o",
                 str(out), "--expand-hubs"]) == 0
    html = out.read_text()
    assert html.count('class="box layer') == len(near)
    assert 'class="box cut cut"' in html  # the border of the neighbourhood
    # by default the walk stops at the hubs (the mask's and rope tables' Splits, read by
    # every block): each is one stub, and the neighbourhood stays in its block
    hubs = hub_layers(g)
    assert {g.layer(i).name for i in hubs} == {"splitncnn_1", "splitncnn_3", "splitncnn_4"}
    few = neighbourhood(g, "sdpa_564", 2, hubs=hubs)
    assert len(few) == 9 and not few & hubs
    assert main(["view", str(REAL_TALKER), "--around", "sdpa_564", "--depth", "2", "-o",
                 str(out)]) == 0
    html = out.read_text()
    assert html.count('class="box layer') == 9
    assert html.count('class="box hub hub"') == 3
    assert "hubs drawn as one stub each (--expand-hubs draws through them): splitncnn_1 (Split, " \
        "28 readers), splitncnn_3 (Split, 56 readers), splitncnn_4 (Split, 56 readers)" in html
    # too big without --around: a refusal that says what to do, exit 2, no page
    big = tmp_path / "big.html"
    assert main(["view", str(REAL_TALKER), "--max-layers", "100", "-o", str(big)]) == 2
    err = capsys.readouterr().err
    assert "850 layers, too many to draw readably (limit 100)" in err and "--around" in err
    assert not big.exists()
    assert main(["view", str(REAL_TALKER), "--around", "nope", "-o", str(big)]) == 2
    assert "--around 'nope': no layer or blob of that name" in capsys.readouterr().err


def test_layout_invariants():
    g = paramsurgery.load(REAL_TALKER)
    scene = build_scene(g).layout()
    p = scene.placed
    edges = [(w.src, w.dst) for w in scene.wires]
    for u, v in edges:  # every wire points down
        assert p.rank[v] > p.rank[u]
    rows: dict[int, list[int]] = {}
    for i, r in enumerate(p.rank):
        rows.setdefault(r, []).append(i)
    for row in rows.values():  # no two boxes of a rank overlap
        row.sort(key=lambda i: p.x[i])
        for a, b in zip(row, row[1:]):
            gap = (p.x[b] - scene.boxes[b].width / 2) - (p.x[a] + scene.boxes[a].width / 2)
            assert gap >= 21.9
    # long reads (mask, rope tables) are jumps, the rest are routed
    assert sum(1 for r in p.routes if not r) == 135
    assert p.crossings <= 10


def test_layout_reduces_crossings():
    # two chains whose second rank is listed crossed
    widths, heights = [10.0] * 6, [10.0] * 6
    edges = [(0, 3), (1, 2), (2, 4), (3, 5)]
    placed = layered_layout(widths, heights, edges)
    assert placed.crossings == 0
    assert placed.x[0] < placed.x[1]  # kept order where free
    assert placed.x[3] < placed.x[2]


def test_values_page_for_compare():
    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    vals = {"sdpa_43": 1e-6, "sdpa_44": 1e-2, "gemm_0": 3e-4}
    html = values_page(g, vals, label="max|err|")
    assert ">max|err| 1e-06</text>" in html.replace("&#x27;", "'")
    assert re.search(r'data-name="sdpa_44" data-type="SDPA" data-value="0.01" '
                     r'transform="[^"]*"><title>[^<]*</title><rect [^>]*style="fill:hsl\(0,', html)
    assert re.search(r'data-name="sdpa_43" [^>]*data-value="1e-06"[^>]*><title>[^<]*</title>'
                     r'<rect [^>]*style="fill:hsl\(120,', html)


def test_report_on_pass_commands(tmp_path, capsys):
    src = TINY / "talker_decoder.ported.ncnn.param"
    page = tmp_path / "r.html"
    assert main(["add-kvcache", str(src), "-o", str(tmp_path / "kv.param"), "--report",
                 str(page)]) == 0
    assert "wrote " + str(page) + " (1 added, 0 removed, 2 changed, 0 renamed)" in \
        capsys.readouterr().out
    html = page.read_text()
    assert html.count('<svg id="g') == 2 and "mark-added" in html
    assert not EXTERNAL.search(html)
    # a pass run through the shared runner, --in-place: the page shows the file before
    work = tmp_path / "t.param"
    work.write_bytes(src.read_bytes())
    page2 = tmp_path / "s.html"
    assert main(["set-param", str(work), "--type", "SDPA", "scale=0.5", "--in-place",
                 "--report", str(page2), "--format", "json"]) == 0
    assert "0.25 -&gt; 0.5" in page2.read_text()
    # extract (its own output arguments) takes it too
    page3 = tmp_path / "e.html"
    assert main(["extract", str(TINY / "predictor_heads.ported.ncnn.param"), "--outputs",
                 "out3", "-o", str(tmp_path / "ex"), "--report", str(page3)]) == 0
    assert "15 removed" in page3.read_text()
    # fuse-codebooks writes three files at once (the runner): the page names its .param
    page4 = tmp_path / "f.html"
    assert main(["fuse-codebooks", str(TINY / "predictor_embeds.unfused.ncnn.param"),
                 str(TINY / "predictor_embeds.unfused.ncnn.bin"), "-o", str(tmp_path / "fz"),
                 "--no-verify", "--report", str(page4)]) == 0
    assert "(2 added, 56 removed, 2 changed, 2 renamed)" in capsys.readouterr().out
    assert f"-&gt; {tmp_path / 'fz.param'}</title>" in page4.read_text()


def test_report_refusals_write_nothing(tmp_path, capsys):
    src = TINY / "talker_decoder.ported.ncnn.param"
    page = tmp_path / "r.html"
    assert main(["add-kvcache", str(src), "-o", "-", "--report", str(page)]) == 2
    assert "--report needs the graph written to a file" in capsys.readouterr().err
    # a command that fails writes no report
    assert main(["set-param", str(src), "--type", "SDPA", "nosuch=1", "-o",
                 str(tmp_path / "o.param"), "--report", str(page)]) == 2
    assert not page.exists() and not (tmp_path / "o.param").exists()
    assert main(["add-kvcache", str(src), "-o", str(tmp_path / "o.param"), "--report",
                 str(src)]) == 2
    assert main(["add-kvcache", str(src), "-o", str(tmp_path / "o.param"), "--report",
                 str(tmp_path / "o.param")]) == 2
    assert "--report names the output file" in capsys.readouterr().err
    assert not (tmp_path / "o.param").exists()


@pytest.mark.parametrize("cmd", ["add-kvcache", "fold-gqa", "fix", "fmt", "set-param", "lower",
                                 "remove-passthrough", "merge-inputs", "rename-blobs", "insert",
                                 "dynamize", "fix-slice", "fix-reduction",
                                 "fold-explicit-cache", "fuse-codebooks", "extract",
                                 "add-conv-cache", "shapes", "fix-batch-reshape"])
def test_every_graph_writing_command_takes_report(cmd):
    from paramsurgery.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert "--report" in sub.choices[cmd]._option_string_actions


def test_inputshape_labels_every_blob(tmp_path, capsys):
    """--inputshape: the shapes analysis labels every blob, symbolically; the shapes agree
    with pnnx's trace wherever it has one (ncnn dims: pnnx's batch axis dropped)."""
    src = TINY / "talker_decoder.ported.ncnn.param"
    out = tmp_path / "s.html"
    spec = ["in0=[T,64]", "in1=[1,T,T]", "in2=[T,16]", "in3=[T,16]"]
    assert main(["view", str(src), "--inputshape", *spec, "-o", str(out)]) == 0
    html = out.read_text()
    g = paramsurgery.load(src)
    # each wire's (or long edge's) tooltip: "blob [dims]"
    labels = dict(re.findall(r'data-blob="([^"]*)"[^>]*>(?:<g [^>]*>)?<title>\S+ (\[[0-9T,]+\])',
                             html))
    assert set(labels) == {b for b in g.blob_names() if g.producer(b) is not None}
    assert labels["in0"] == "[T,64]" and labels["in1"] == "[1,T,T]"
    from paramsurgery.view.labels import blob_shapes
    from paramsurgery.analysis.shapes import ShapeMap

    traced = blob_shapes(g, analysis=ShapeMap())  # pnnx's trace only
    assert len(traced) == 41
    for blob, text in traced.items():
        want = ["T" if d == "?" else d for d in text.strip("()").split(",")]
        if len(want) > 1 and want[0] == "1":  # pnnx's batch axis, not an ncnn dim
            want = want[1:]
        assert labels[blob] == "[" + ",".join(want) + "]", blob
    assert main(["view", str(src), "--inputshape", "nosuch=[3]", "-o", str(out)]) == 2
    assert "--inputshape names blob 'nosuch'" in capsys.readouterr().err


def test_oracle_shapes_from_ncnn(tmp_path):
    """--oracle: the labels come from ncnn itself (a run with lightmode off)."""
    src = TINY / "talker_decoder.ported.ncnn.param"
    out = tmp_path / "o.html"
    assert main(["view", str(src), "--inputshape", "in0=[7,64] in1=[1,7,7] in2=[7,16] "
                 "in3=[7,16]", "--oracle", "-o", str(out)]) == 0
    html = out.read_text()
    assert "ncnn as the oracle" in html
    assert ">in0 [7,64]</text>" in html and ">35 [4,7,16]</text>" in html


def test_diff_page_of_large_graphs_draws_around_the_changes():
    from paramsurgery.passes.kvcache import AddKVCache
    from paramsurgery.view import diff_graphs, diff_page

    g = paramsurgery.load(REAL_TALKER)
    kv = AddKVCache()(g).graph
    d = diff_graphs(g, kv)
    assert len(d.changed) == 28 and [lay.name for lay in d.added] == ["kv_cache_in"]
    html = diff_page(g, kv, d, max_layers=500, context=1)
    assert "the graphs are large (850 and 851 layers): drawn are the layers within 1 hops" in html
    panes = html.split('<svg id="g1"')
    a_boxes = re.findall(r'class="box layer[^"]*" data-name="([^"]*)"', panes[0])
    b_boxes = re.findall(r'class="box layer[^"]*" data-name="([^"]*)"', panes[1])
    # every SDPA, its readers and writers; nothing farther
    assert {n for n in a_boxes if n.startswith("sdpa_")} == {
        lay.name for lay in g.by_type("SDPA")}
    assert len(a_boxes) < 250 and "kv_cache_in" in b_boxes and "kv_cache_in" not in a_boxes
    assert not any(n.startswith("gemm_") for n in a_boxes)  # 2 hops from an SDPA


def test_a_graph_out_of_order_is_drawn_with_the_fault_marked():
    g = paramsurgery.loads("7767517\n3 3\nInput in 0 1 x\nReLU r 1 1 y z\nReLU s 1 1 x y\n")
    svg = render_svg(build_scene(g))
    assert '<g id="g0-n1" class="box missing missing" data-name="y"' in svg
    assert ">written later: y</text>" in svg
    assert "blob y is written by ReLU s, after this layer in the file" in svg


def test_around_computes_shapes_of_the_neighbourhoods_ancestors_only(tmp_path, monkeypatch):
    """`view --around` on a large graph: the shape analysis visits the drawn layers and what
    they read from, not the whole graph, and labels them exactly as the full analysis."""
    from paramsurgery.analysis.shapes import infer_shapes, static
    from paramsurgery.analysis.shapes.static import ancestors

    g = paramsurgery.load(REAL_TALKER)
    ids = neighbourhood(g, "sdpa_564", 1)
    full = infer_shapes(g)
    visited = []
    rule = static.infer_layer
    monkeypatch.setattr(static, "infer_layer",
                        lambda layer, ins: visited.append(layer.id) or rule(layer, ins))
    part = infer_shapes(g, layers=ids)
    need = ancestors(g, ids, limit=len(g) // 3)
    assert need is not None and set(visited) == need
    # late in a long chain most of the graph is upstream: the whole analysis instead
    assert ancestors(g, [len(g) - 1], limit=len(g) // 3) is None
    for i in ids:
        for b in (*g.layer(i).inputs, *g.layer(i).outputs):
            assert part.shape_of(b) == full.shape_of(b), b
    out = tmp_path / "a.html"
    assert main(["view", str(REAL_TALKER), "--around", "sdpa_564", "--depth", "1", "-o",
                 str(out)]) == 0
    assert "blob shapes known among the drawn layers" in out.read_text()
