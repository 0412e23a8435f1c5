"""Pictures that work on LLMs (issue 25 item 7), without a browser: `--around` stops at hub
layers, the overview finds the 28 blocks of a decoder, box params are never cut mid-word,
a diff's changed params are in the boxes, the compare colours break at the tolerance, and a
`.param.bin` written by any command keeps its names (in `x.id.h`) so diff and --report
pair by name. The browser half is tests/test_view_browser.py."""

import json
import re

import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.view.labels import wrap
from paramsurgery.view.overview import find_blocks
from paramsurgery.view.page import graph_page, values_page
from paramsurgery.view.scene import hub_layers, neighbourhood

from conftest import FIXTURES

TINY = FIXTURES / "qwen3_tts" / "tiny"
REAL = FIXTURES / "qwen3_tts" / "real"
REAL_TALKER = REAL / "talker_decoder.ported.ncnn.param"


@pytest.fixture(scope="module")
def decoder28(tmp_path_factory):
    out = tmp_path_factory.mktemp("dec") / "kv.param"
    assert main(["add-kvcache", str(REAL_TALKER), "-o", str(out)]) == 0
    return paramsurgery.load(out), out


def test_around_stops_at_hubs_on_a_28_block_decoder(decoder28, tmp_path, capsys):
    g, path = decoder28
    hubs = hub_layers(g)
    assert {g.layer(i).name for i in hubs} == {"kv_cache_in", "splitncnn_1", "splitncnn_3",
                                              "splitncnn_4"}
    assert len(neighbourhood(g, "sdpa_577", 6)) == 493  # walking through them: most blocks
    near = neighbourhood(g, "sdpa_577", 6, hubs=hubs)
    assert len(near) <= 60 and not near & hubs
    # every drawn layer is in the target's block: its name numbers are its block's
    assert {g.layer(i).type for i in near} >= {"SDPA", "RotaryEmbed", "Gemm", "RMSNorm"}
    assert sum(g.layer(i).type == "SDPA" for i in near) == 1
    page = tmp_path / "a.html"
    assert main(["view", str(path), "--around", "sdpa_577", "--depth", "6", "-o",
                 str(page)]) == 0
    assert f"({len(near)} layers)" in capsys.readouterr().out
    html = page.read_text()
    assert html.count('class="box layer') == len(near)
    stubs = re.findall(r'class="box hub hub" data-name="([^"]*)"', html)
    assert sorted(stubs) == ["kv_cache_in", "splitncnn_1", "splitncnn_3", "splitncnn_4"]
    assert ">56 tops, 28 readers</text>" in html  # kv_cache_in, labelled
    assert 'data-center="g0-n' in html  # the page opens on the target
    # --expand-hubs: the old walk; flags of --around need it
    assert main(["view", str(path), "--around", "sdpa_577", "--depth", "6", "--expand-hubs",
                 "-o", str(page)]) == 0
    assert "(493 layers)" in capsys.readouterr().out
    assert main(["view", str(path), "--expand-hubs", "-o", str(page)]) == 2
    assert "--expand-hubs needs --around LAYER" in capsys.readouterr().err


def test_overview_finds_the_repeated_blocks(decoder28):
    g, _ = decoder28
    for graph, count, period in ((g, 28, 30), (paramsurgery.load(REAL_TALKER), 28, 30),
                                 (paramsurgery.load(REAL / "talker_decoder.raw.ncnn.param"),
                                  28, 54)):
        b = find_blocks(graph)
        assert b is not None and (b.count, b.period) == (count, period)
        lays = list(graph)
        types = [sorted(lays[i].type for i in m) for m in b.members]
        assert all(t == types[0] for t in types)  # every block has the same layers
        assert sum(lays[i].type == "SDPA" for i in b.members[0]) == 1
        assert len(b.positions()) == count * period
    # block 0 shares its stretch of the file with the mask and rope tables: found anyway
    assert find_blocks(g).members[0][:2] == [1, 7]
    # small or unrepeated graphs are drawn whole
    assert find_blocks(paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")) is None
    assert find_blocks(paramsurgery.load(FIXTURES / "ncnn_corpus" / "resnet50.param")) is None


def test_overview_page(decoder28):
    g, _ = decoder28
    html = graph_page(g)
    over = html[html.index('<svg id="g0o"'):html.index('<svg id="g0"')]
    assert 'class="graph overview"' in over
    names = re.findall(r'class="box layer[^"]*" data-name="([^"]*)"', over)
    assert len(names) < 30 and "sdpa_577" not in names and "rmsn_336" in names
    group = re.search(r'class="box group group" data-name="28 × block" data-expand="(g0-n\d+)"',
                      over)
    assert group, "the group box, expandable"
    # it expands to block 0's first layer in the full drawing
    assert f'<g id="{group.group(1)}" class="box layer plain" data-name="splitncnn_0"' in html
    assert ">30 layers each, splitncnn_0 … add_83</text>" in over
    # the wide Splits' 56 tops are one wire each into the group
    assert len(re.findall(r'<path class="wire" data-blob', over)) < 40
    # the full drawing is there, hidden until asked for
    assert re.search(r'<svg id="g0" class="graph"[^>]*style="display:none"', html)


def test_wide_splits_are_one_bus(decoder28):
    g, _ = decoder28
    html = graph_page(g, overview=False)
    # the 56-top rope Splits: a bus each, no stub per top under them
    buses = re.findall(r'<g class="bus" data-to="[^"]*"><title>(splitncnn_\d+): (\d+) of its',
                       html)
    assert {b for b, _ in buses} >= {"splitncnn_3", "splitncnn_4"}
    # their far reads keep the stub over each reader, not one under the Split per top
    assert html.count('class="jump-out"') < html.count('class="jump-in"') - 100


def test_box_params_are_never_cut_and_the_panel_has_them_all():
    words = " ".join(f"p{i}=1" for i in range(30))
    lines = wrap(words, 2)
    assert len(lines) == 2 and lines[-1].endswith("more: click") and "…" not in "".join(lines)
    shown = " ".join(lines).split()
    assert all(re.fullmatch(r"p\d+=1|\+\d+|more:|click", w) for w in shown)
    assert int(lines[-1].split("+")[1].split()[0]) + sum(
        w.startswith("p") for w in shown) == 30
    assert wrap("shape=" + ",".join(map(str, range(64))), 2) == ["shape=[64 values]"]
    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    html = graph_page(g)
    info = {}
    for blob in re.findall(r'<script type="application/json" class="info">(.*?)</script>',
                           html):
        info.update(json.loads(blob))
    sdpa = next(v for v in info.values() if v["name"] == "sdpa_43")
    assert [p[:3] for p in sdpa["params"]] == [[5, "attn_mask", "1"], [6, "scale", "0.25"]]
    assert sdpa["in"][0][0] and sdpa["line"]


def test_diff_boxes_show_every_changed_param(tmp_path):
    src = TINY / "talker_decoder.ported.ncnn.param"
    g = paramsurgery.load(src)
    g.layer("sdpa_43").set(6, 0.5)
    g.layer("reshape_25").set(0, 99)
    paramsurgery.save(g, tmp_path / "e.param")
    page = tmp_path / "d.html"
    assert main(["diff", str(src), str(tmp_path / "e.param"), "--html", str(page)]) == 1
    html = page.read_text()
    assert html.count(">6(scale): 0.25 → 0.5</text>") == 2  # both sides
    assert html.count(">0(w): (unset) → 99</text>") == 2  # a param that was not there


def test_compare_colours_break_at_the_tolerance():
    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    vals = {"sdpa_43": 0.017, "gemm_0": 0.0, "gemm_1": 2e-4, "sdpa_44": 0.5}
    html = values_page(g, vals, label="rel", threshold=1e-3, first="sdpa_43")

    def hue(name):
        m = re.search(rf'data-name="{name}"[^>]*><title>[^<]*</title><rect [^>]*'
                      r'style="fill:hsl\((\d+),', html)
        return int(m.group(1))

    # rel 0.017 is 17x over tolerance: not green (it was before the tolerance was the break)
    assert hue("sdpa_43") <= 50 and hue("sdpa_44") == 0
    assert hue("gemm_0") == 130 and hue("gemm_1") == 130
    assert 'id="value-legend"' in html and "≤ tol 0.001: agrees" in html
    assert "first divergence: sdpa_43" in html and ">▶ first divergence</text>" in html
    assert re.search(r'data-center="g0-n\d+"', html)


def test_param_bin_edits_keep_their_names(tmp_path, capsys):
    src = TINY / "talker_decoder.ported.ncnn.param"
    a = tmp_path / "t.param.bin"
    assert main(["fmt", str(src), "-o", str(a)]) == 0
    assert (tmp_path / "t.id.h").exists()  # ncnn2mem's names file, beside it
    b = tmp_path / "u.param.bin"
    capsys.readouterr()
    assert main(["set-param", str(a), "--layer", "sdpa_43", "scale=0.5", "-o", str(b),
                 "--report", str(tmp_path / "r.html")]) == 0
    assert "(0 added, 0 removed, 1 changed, 0 renamed)" in capsys.readouterr().out
    assert (tmp_path / "u.id.h").exists()
    assert main(["diff", str(a), str(b), "--format", "json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["renamed"] == [] and [c["layer"] for c in d["changed"]] == ["sdpa_43"]
    # the names round-trip exactly, also those that are not C identifiers
    g = paramsurgery.load(src)
    g.layer("sdpa_43").name = "attn.0/sdpa"
    paramsurgery.save(g, tmp_path / "v.param.bin")
    h = (tmp_path / "v.id.h").read_text()
    assert "const int LAYER_attn_0_sdpa = " in h and "// attn.0/sdpa" in h
    back = paramsurgery.load(tmp_path / "v.param.bin")
    assert [lay.name for lay in back] == [lay.name for lay in g]
    assert back.blob_names() == g.blob_names()
