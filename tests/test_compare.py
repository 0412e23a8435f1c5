"""`paramsurgery compare`: blob streams, layouts, ncnn vs ncnn (planted one-layer changes
named as the first divergence, identical graphs and weight-preserving passes report none)
and the CLI. The ncnn-vs-torch tests (pnnx exports) are in test_compare_torch.py."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import paramsurgery
from paramsurgery.verify.compare import NcnnSide, compare_ncnn
from paramsurgery.verify.compare.expression import parse, subterm_values
from paramsurgery.verify.compare.frames import FrameFile, read_frames, write_frame
from paramsurgery.verify.compare.graph_match import match_graphs
from paramsurgery.analysis.traced_inputs import make_feeds
from paramsurgery.verify.compare.layout import measure
from paramsurgery.verify.compare.options import parse_options
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.formats.pnnx_param import read_pnnx_param
from paramsurgery.runtime.child import Feed

from conftest import FIXTURES, REPO
from paramsurgery.formats.io import save

pytest.importorskip("ncnn")

TINY = FIXTURES / "qwen3_tts" / "tiny"
FUS = FIXTURES / "fusions"
# every ported graph but `ported_levelsum_port_matmul`, the known-wrong one: its batched
# MatMul (pnnx moved 15 levels into ncnn's batch axis) gives values that change from run
# to run, so compare finds it differing from itself right there
PORTED = sorted(p.name[: -len(".ncnn.param")] for p in TINY.glob("*.ported*.ncnn.param")
                if "port_matmul" not in p.name)
BIG = ("codec_decoder.ported", "codec_decoder.ported_levelsum_per_level")
PARITY = parse_options(None)


def side(param, bin=None, options=None) -> NcnnSide:
    return NcnnSide(str(param), None if bin is None else str(bin), parse_options(options))


def tiny_feeds(name: str):
    p = TINY / f"{name}.ncnn.param"
    feeds, _ = make_feeds(paramsurgery.load(p), str(p), read_pnnx_param(TINY / f"{name}.pnnx.param"),
                          npz=str(TINY / f"{name}.ref.npz"))
    return feeds


# ------------------------------------------------------------------ building blocks

def test_frames_stream_and_memory_map(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7, 8], np.int64),
              "empty": np.zeros((0,), np.float32)}
    buf = io.BytesIO()
    ends = []
    for k, v in arrays.items():
        write_frame(buf, {"name": k}, v)
        ends.append(buf.tell())
    write_frame(buf, {"end": True})
    got = list(read_frames(io.BytesIO(buf.getvalue())))
    assert [h.get("name") for h, _ in got] == ["a", "b", "empty", None]
    assert all(np.array_equal(a, arrays[h["name"]]) for h, a in got if "name" in h)
    # a truncated stream (the writer died) yields what was complete
    assert [h["name"] for h, _ in read_frames(io.BytesIO(buf.getvalue()[:ends[0] + 9]))] == ["a"]
    path = tmp_path / "f.frames"
    path.write_bytes(buf.getvalue())
    with FrameFile(path) as ff:
        assert ff.names() == ["a", "b", "empty"]
        assert np.array_equal(ff.get("b"), arrays["b"]) and ff.get("nope") is None


def test_layout_batch_axis_int_bits_and_flat():
    x = np.random.default_rng(0).standard_normal((1, 4, 6)).astype(np.float32)
    assert measure(x[0], x).max_abs == 0                       # batch axis dropped
    moved = np.moveaxis(x[0].reshape(4, 2, 3), 1, 0)           # ncnn n=2 leading
    assert measure(moved, x[0].reshape(4, 2, 3), batch_n=2).max_abs == 0
    assert measure(x.reshape(24), x).shape == "(24) vs (1,4,6)"
    assert measure(x.reshape(3, 8), x).shape == "(3,8) vs (1,4,6)"
    assert measure(x.reshape(3, 8), x, flat=True).max_abs == 0
    ids = np.array([3, 5, 9], np.int32)
    as_ncnn = ids.view(np.float32)                              # int32 bits in a float blob
    assert measure(as_ncnn, ids.astype(np.int64)).max_abs == 0
    assert measure((as_ncnn + np.float32(5)), (ids + 5)).max_abs > 1e6
    # ncnn vs ncnn: denormal blobs are ids, compared as ints
    assert measure(np.array([3, 6, 9], np.int32).view(np.float32), as_ncnn).max_abs == 1


def test_expression_inner_terms():
    a = np.full((2, 2), 2, np.float32)
    b = np.full((2, 2), 3, np.float32)
    terms = dict(subterm_values("sub(mul(@0,@1),mul(@1,1.5e+00))", [a, b]))
    assert set(terms) == {"mul(@0,@1)", "mul(@1,1.5e+00)"}
    assert terms["mul(@0,@1)"][0, 0] == 6 and terms["mul(@1,1.5e+00)"][0, 0] == 4.5
    assert subterm_values("add(@0,5)", [a]) == []               # no inner term
    assert subterm_values("foo(bar(@0),1)", [a]) == []          # unknown functions: skipped
    with pytest.raises(ValueError):
        parse("add(@0,")


def test_options():
    assert parse_options("fp16,threads=2")["use_fp16_arithmetic"] is True
    assert parse_options("packing=0")["use_packing_layout"] is False
    with pytest.raises(ParamSurgeryError, match="unknown ncnn option"):
        parse_options("warp_drive=1")


# ------------------------------------------------------------------ ncnn vs ncnn

_ACTIVATION_SWAP = {"Swish": "ReLU", "GELU": "ReLU", "ELU": "ReLU", "TanH": "Sigmoid"}


def plant_change(g, bin_in, bin_out):
    """One layer changed: a residual add → sub, else a norm's eps, else an activation,
    else a Gemm's alpha, else an Embed's table scaled (in a copy of the .bin)."""
    shutil.copyfile(bin_in, bin_out)
    adds = [x for x in g if x.type == "BinaryOp" and len(x.inputs) == 2 and not x.params.get(0)]
    if adds:
        layer = adds[len(adds) // 2]
        layer.set(0, 1)
        return layer
    norms = [x for x in g if x.type in ("RMSNorm", "LayerNorm")]
    if norms:
        layer = norms[len(norms) // 2]
        layer.set(1, 0.5)
        return layer
    acts = [x for x in g if x.type in _ACTIVATION_SWAP]
    if acts:
        acts[0].type = _ACTIVATION_SWAP[acts[0].type]
        return acts[0]
    gemms = [x for x in g if x.type == "Gemm"]
    if gemms:
        layer = gemms[len(gemms) // 2]
        layer.set(0, 2.0)
        return layer
    embed = next(x for x in g if x.type == "Embed")
    w = paramsurgery.load(g.source.path, bin=bin_in).layer(embed.name).weights["weight"]
    assert w.dtype == "fp32"
    with open(bin_out, "r+b") as fh:
        fh.seek(w.offset + w.header_size)
        table = np.frombuffer(fh.read(4 * w.count), np.float32) * np.float32(1.5)
        fh.seek(w.offset + w.header_size)
        fh.write(table.tobytes())
    return embed


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n
                                  for n in PORTED])
def test_planted_change_is_the_first_divergence(tmp_path, name):
    param = TINY / f"{name}.ncnn.param"
    g = paramsurgery.load(param)
    layer = plant_change(g, TINY / f"{name}.ncnn.bin", tmp_path / "x.bin")
    save(g, tmp_path / "x.param")
    report = compare_ncnn(side(tmp_path / "x.param", tmp_path / "x.bin"),
                          side(param, TINY / f"{name}.ncnn.bin"), tiny_feeds(name))
    fd = report.first_divergence()
    assert fd is not None and fd.layer == layer.name, report.format_text()
    assert fd.line == layer.source_line
    assert report.status == "ok" and len(report.compared) == len(report.rows)
    assert all(r.status == "ok" for r in report.rows if r.line < fd.line)


def test_identical_graphs_report_none():
    name = "mimi_encoder.ported"
    param, binp = TINY / f"{name}.ncnn.param", TINY / f"{name}.ncnn.bin"
    report = compare_ncnn(side(param, binp), side(param, binp), tiny_feeds(name))
    assert report.first_divergence() is None
    assert len(report.compared) == len(report.rows) == 139
    assert all(r.error.max_abs == 0 for r in report.compared)


def _decoder_feeds(npz):
    ref = np.load(npz)
    return {"in0": Feed(ref["input_embeds"], 0), "in1": Feed(ref["input_mask"], 0),
            "in2": Feed(ref["input_cos"], 0), "in3": Feed(ref["input_sin"], 0)}


@pytest.mark.parametrize("module", ["predictor_decoder", "talker_decoder"])
def test_fold_gqa_and_add_kvcache_report_none(tmp_path, module):
    from paramsurgery.passes.fold_gqa import FoldGQA
    from paramsurgery.passes.kvcache import AddKVCache

    binp = TINY / f"{module}.ported.ncnn.bin"
    feeds = _decoder_feeds(TINY / f"{module}.ported.ref.npz")
    expanded = FUS / f"{module}.tile.ncnn.param"
    save(FoldGQA()(paramsurgery.load(expanded)).graph, tmp_path / "gqa.param")
    report = compare_ncnn(side(tmp_path / "gqa.param", binp), side(expanded, binp), feeds)
    assert report.first_divergence() is None, report.format_text()
    assert len(report.compared) == len(report.rows)
    # add-kvcache at the prefill (caches fed empty): every blob but the opaque caches
    ported = TINY / f"{module}.ported.ncnn.param"
    save(AddKVCache()(paramsurgery.load(ported)).graph, tmp_path / "kv.param")
    report = compare_ncnn(side(tmp_path / "kv.param", binp), side(ported, binp), feeds)
    assert report.first_divergence() is None and report.status == "ok"
    skipped = [r for r in report.rows if r.status == "skipped"]
    assert len(skipped) == 4 and all(r.type == "SDPA" for r in skipped)
    unmatched = [r for r in report.rows if r.status == "unmatched"]
    assert len(unmatched) == 4 and all(r.type == "Input" for r in unmatched)  # the new caches
    assert len(report.compared) == len(report.rows) - 8


def test_fuse_codebooks_reports_none(tmp_path):
    from paramsurgery.passes.fuse_codebooks import FuseCodebooks

    name = "codec_decoder.ported_levelsum_per_level"
    param, binp = TINY / f"{name}.ncnn.param", TINY / f"{name}.ncnn.bin"
    res = FuseCodebooks()(paramsurgery.load(param, bin=binp))
    save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    fusion = res.data["manifest"].fusions[0]
    ref = np.load(TINY / f"{name}.ref.npz")
    codes = np.stack([ref[f"input_codes_level{i}"][0] for i in range(1, 16)])
    feeds = {"in0": Feed(ref["input_codes_level0"], 0), "in1": fusion.pack_ids(codes),
             "in16": Feed(ref["input_mask"], 0), "in17": Feed(ref["input_cos"], 0),
             "in18": Feed(ref["input_sin"], 0)}
    ref_feeds = {k: v for k, v in feeds.items() if k != "in1"}
    ref_feeds.update({f"in{i}": Feed(ref[f"input_codes_level{i}"], 0) for i in range(1, 16)})
    report = compare_ncnn(side(tmp_path / "f.param", tmp_path / "f.bin"), side(param, binp),
                          feeds, reference_feeds=ref_feeds)
    assert report.first_divergence() is None, report.format_text()
    rows = {r.blob: r for r in report.rows}
    assert rows["out0"].status == "ok"
    # everything outside the fused embedding pairs by name and agrees
    assert len(report.compared) >= len(report.rows) - 6


def test_match_by_structure_and_dataflow_when_renamed():
    g = paramsurgery.load(TINY / "talker_decoder.ported.ncnn.param")
    renamed = g.copy()
    for layer in list(renamed)[8:12]:
        for b in layer.outputs:
            renamed.rename_blob(b, f"{b}_renamed")
    pairs = match_graphs(renamed, g)
    for layer in list(renamed)[8:12]:
        for b in layer.outputs:
            assert pairs[b] == (b[: -len("_renamed")], "structure")
    renamed_layers = renamed.copy()
    for i, layer in enumerate(list(renamed_layers)[8:12]):
        layer.name = f"other_{i}"
    pairs = match_graphs(renamed_layers, g)
    assert {pairs[b][1] for layer in list(renamed_layers)[8:12] for b in layer.outputs} <= \
        {"dataflow", "split"}


def test_crash_is_reported_at_the_blob_ncnn_died_on():
    d = FIXTURES / "repros" / "stack-sum-batch-axis" / "bug"
    p = d / "model.ncnn.param"
    feeds, _ = make_feeds(paramsurgery.load(p), str(p), None, npz=str(d / "ref.npz"))
    report = compare_ncnn(side(p, d / "model.ncnn.bin"), side(p, d / "model.ncnn.bin"), feeds)
    assert report.status == "crash" and "SIGFPE" in report.message
    failed = [r for r in report.rows if r.status == "failed"]
    assert [r.layer for r in failed] == ["sum_4"] or [r.type for r in failed] == ["Reduction"]


# ------------------------------------------------------------------ CLI

def cli(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", "compare", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_cli_json_and_exit_codes(tmp_path):
    name = "talker_decoder.ported"
    param = TINY / f"{name}.ncnn.param"
    g = paramsurgery.load(param)
    layer = plant_change(g, TINY / f"{name}.ncnn.bin", tmp_path / "x.ncnn.bin")
    save(g, tmp_path / "x.ncnn.param")
    # pnnx's IR next to the file pairs the fixture's input_<name> arrays with in0, in1, ...
    shutil.copyfile(TINY / f"{name}.pnnx.param", tmp_path / "x.pnnx.param")
    r = cli(tmp_path / "x.ncnn.param", "--reference", param, "--reference-bin",
            TINY / f"{name}.ncnn.bin", "--inputs", TINY / f"{name}.ref.npz", "--format", "json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    fd = data["first_divergence"]
    assert (fd["layer"], fd["line"], fd["type"]) == (layer.name, layer.source_line, "BinaryOp")
    assert fd["max_abs"] > 0 and fd["rel"] > 0
    assert data["coverage"] == {"compared": 87, "blobs": 87}
    assert [b["blob"] for b in data["blobs"]][:3] == ["in0", "1", "2"]  # graph order
    r = cli(param, "--reference", param, "--inputs", TINY / f"{name}.ref.npz")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("no divergence; 0 blobs differ; 87/87 blobs")


def test_cli_bad_inputs_exit_2(tmp_path):
    param = TINY / "talker_decoder.ported.ncnn.param"
    r = cli(param, "--reference", tmp_path / "missing.param")
    assert r.returncode == 2 and "missing.param" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.npz"
    np.savez(bad, nothing=np.zeros(3))
    r = cli(param, "--reference", param, "--inputs", bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = cli(param, "--pnnx", tmp_path / "x.pnnx.param", "--inputs",
            TINY / "talker_decoder.ported.ref.npz")
    assert r.returncode == 2 and "x.pnnx.param" in r.stderr and "Traceback" not in r.stderr
    r = cli(param, "--reference", param, "--options", "warp=1")
    assert r.returncode == 2 and "unknown ncnn option" in r.stderr


def test_cli_inputshape_and_html_page(tmp_path):
    name = "talker_decoder.ported"
    param = TINY / f"{name}.ncnn.param"
    g = paramsurgery.load(param)
    layer = plant_change(g, TINY / f"{name}.ncnn.bin", tmp_path / "x.ncnn.bin")
    save(g, tmp_path / "x.ncnn.param")
    page = tmp_path / "errors.html"
    r = cli(tmp_path / "x.ncnn.param", "--reference", param, "--reference-bin",
            TINY / f"{name}.ncnn.bin", "--inputshape", "in0=[T,64]", "in1=[T,T]", "in2=[T,16]",
            "in3=[T,16]", "--at", "T=5", "--html", page, "--format", "json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["first_divergence"]["layer"] == layer.name
    assert next(b for b in data["blobs"] if b["blob"] == "in0")["shape"] == [5, 64]
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") or "<html" in html
    assert "rel 0" in html and layer.name in html
    r = cli(param, "--reference", param, "--inputshape", "in0=[T,64]", "--at", "T")
    assert r.returncode == 2 and "SYM=N" in r.stderr
