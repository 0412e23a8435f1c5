"""`paramsurgery quantize` and the quantize-int8 pass: ncnn2table's scales, ncnn2int8's
layout, the result loaded and run by ncnn (child processes) against fp32. The comparison
with ncnn's own tools (built from source by tools/build_ncnn_quant_tools.sh) is slow."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.passes.quantize_int8 import (Int8Table, QuantizeInt8, _kl_threshold_loop,
                                               float2int8, kl_threshold)
from paramsurgery.runtime.child import Feed
from paramsurgery.verify.compare.options import PARITY
from paramsurgery.verify.precision.batch import Variant, run_variants
from paramsurgery.verify.precision.metrics import rel_error

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "precision"
SMALL, SMALL_BIN = FIX / "small_cnn.param", FIX / "small_cnn.bin"
CALIB = FIX / "small_cnn.calib"
TINY = ROOT / "fixtures" / "qwen3_tts" / "tiny"
TOOLS = Path(os.environ.get("PARAMSURGERY_NCNN_TOOLS",
                            "/tmp/paramsurgery-ncnn-tools/build/tools/quantize"))


def _calib(i: int) -> np.ndarray:
    with np.load(CALIB / f"c{i}.npz") as z:
        return z["in0"]


def _run(param: str, bin: str, x: np.ndarray, blob: str = "out0") -> np.ndarray:
    (r,) = run_variants(bin, {"in0": Feed(x)},
                        [Variant(Path(param).read_text(), dict(PARITY, use_int8_inference=True),
                                 [blob])], timeout=60)
    assert r.ok, r.message
    return r.arrays[blob]


def test_float2int8_rounds_half_away_from_zero_and_clamps():
    got = float2int8(np.array([0.5, -0.5, 1.5, -2.5, 300.0, -300.0, 0.49], np.float32), 1.0)
    assert got.tolist() == [1, -1, 2, -3, 127, -127, 0]


def test_kl_threshold_is_ncnn2tables_loops():
    rng = np.random.default_rng(3)
    for values in (np.abs(rng.standard_normal(20000)), rng.exponential(1.0, 20000)):
        hist = np.bincount(np.minimum((values / values.max() * 512).astype(int), 511),
                           minlength=512)
        assert kl_threshold(hist) == _kl_threshold_loop(hist)


def test_table_round_trips_in_ncnn2tables_format(tmp_path):
    t = Int8Table.read(FIX / "small_cnn.table")
    assert set(t.weights) == set(t.inputs) == {"conv0", "dw1", "pw2", "fc"}
    assert t.weights["dw1"].size == 8 and t.inputs["fc"] == 60.0
    (tmp_path / "t.table").write_text(t.format())
    assert (tmp_path / "t.table").read_text() == (FIX / "small_cnn.table").read_text()


def test_quantize_small_cnn_loads_and_runs_in_ncnn(tmp_path, capsys):
    out = tmp_path / "q.param"
    # max: with 3 small calibration inputs KL clips the 16-value fc input hard (rel 0.34)
    code = main(["quantize", str(SMALL), "--bin", str(SMALL_BIN), "--calib", str(CALIB),
                 "--method", "max", "-o", str(out), "--save-table", str(tmp_path / "q.table"),
                 "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    assert rep["int8_by_type"] == {"Convolution": 2, "ConvolutionDepthWise": 1,
                                   "InnerProduct": 1}
    assert rep["in_effect"] is True and 0 < rep["errors"]["out0"]["rel"] < 0.05
    # the .bin is in ncnn's int8 layout: the weights schema reads it back, int8 weights
    g = paramsurgery.load(str(out), bin=str(tmp_path / "q.bin"))
    assert g.layer("pw2").weights["weight"].dtype == "int8"
    assert g.layer("pw2").params.get(8) == 2 and g.layer("conv0").params.get(8) == 102
    # and ncnn runs it: int8 differs from fp32, by a small error, on an input not calibrated on
    x = np.random.default_rng(11).standard_normal((3, 12, 12)).astype(np.float32)
    ref = _run(str(SMALL), str(SMALL_BIN), x)
    q = _run(str(out), str(tmp_path / "q.bin"), x)
    assert q.tobytes() != ref.tobytes() and rel_error(q, ref) < 0.05
    # the saved table is ncnn2table's format, with the scales reported
    t = Int8Table.read(tmp_path / "q.table")
    assert math.isclose(t.inputs["pw2"], rep["scales"]["pw2"]["scale"], rel_tol=1e-6)


def test_kl_scale_clips_below_the_calibration_max(tmp_path, capsys):
    assert main(["quantize", str(SMALL), "--bin", str(SMALL_BIN), "--calib", str(CALIB),
                 "-o", str(tmp_path / "q.param"), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    m = max(float(np.max(np.abs(_calib(i)))) for i in range(3))
    s = rep["scales"]["conv0"]
    assert math.isclose(s["absmax"], m, rel_tol=1e-6)
    assert s["threshold"] <= m and math.isclose(s["scale"], 127 / s["threshold"], rel_tol=1e-6)


def test_keep_from_a_precision_report_leaves_layers_fp32(tmp_path, capsys):
    report = tmp_path / "prec.json"
    report.write_text(json.dumps({"kept": ["fc", "dw1"]}))
    assert main(["quantize", str(SMALL), "--bin", str(SMALL_BIN), "--calib", str(CALIB),
                 "--keep-from", str(report), "-o", str(tmp_path / "q.param")]) == 0
    text = (tmp_path / "q.param").read_text()
    assert re.search(r"^InnerProduct +fc .* 2=80$", text, re.M)  # no 8=
    assert re.search(r"^ConvolutionDepthWise +dw1 .* 7=8 9=1$", text, re.M)
    assert "kept in fp32: dw1, fc" in capsys.readouterr().out


def test_pass_output_through_ncnn_matches_the_scales():
    """The golden case's graph run by ncnn: what int8 with these scales computes (every
    layer's int8 output within a few quantization steps of fp32)."""
    g = paramsurgery.load(str(SMALL), bin=str(SMALL_BIN))
    res = QuantizeInt8(Int8Table.read(FIX / "small_cnn.table"))(g)
    assert res.modified
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p, b = os.path.join(tmp, "q.param"), os.path.join(tmp, "q.bin")
        paramsurgery.save(res.graph, p, bin=b)
        x = _calib(0)
        assert rel_error(_run(p, b, x), _run(str(SMALL), str(SMALL_BIN), x)) < 0.05


def test_tiny_codec_quantizes_loads_and_runs(tmp_path, capsys):
    """The tiny Qwen3-TTS codec decoder: its Gemm (constant B), Embed and SDPA layers in int8
    (its Convolution1D has no int8 path in ncnn), run by ncnn against fp32."""
    stem = TINY / "codec_decoder.ported"
    code = main(["quantize", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "--calib",
                 f"{stem}.ref.npz", "-o", str(tmp_path / "codec.param"), "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    assert rep["int8_by_type"] == {"Embed": 2, "Gemm": 20, "SDPA": 2}
    assert rep["in_effect"] is True
    assert rep["errors"]["out0"]["cos"] > 0.99  # figures: README "Quantize"


SEQ, SEQ_BIN = FIX / "seq_rnn.param", FIX / "seq_rnn.bin"


def test_recurrent_and_attention_weight_only_int8_runs_in_ncnn(tmp_path, capsys):
    """LSTM / GRU (bidirectional) / RNN / MultiHeadAttention as ncnn2int8 writes them:
    int8 weights with ncnn2table's per-row scales, read back by the weights schema; ncnn runs
    the result in int8 (its bits differ from fp32) within a small error on a held-out input."""
    out = tmp_path / "q.param"
    code = main(["quantize", str(SEQ), "--bin", str(SEQ_BIN), "--calib", str(FIX / "seq_rnn.calib"),
                 "-o", str(out), "--save-table", str(tmp_path / "q.table"), "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    assert rep["int8_by_type"] == {"GRU": 1, "LSTM": 1, "MultiHeadAttention": 1, "RNN": 1}
    fp32 = paramsurgery.load(str(SEQ), bin=str(SEQ_BIN))
    g = paramsurgery.load(str(out), bin=str(tmp_path / "q.bin"))
    gru, w = g.layer("gru").weights, fp32.layer("gru").weights["weight_hc"].array()
    assert gru["weight_hc"].dtype == "int8" and gru["weight_xc"].dtype == "int8"
    # ncnn2table's scale: 127 / absmax of every gate row, both directions (2 × 3 × 20 rows)
    rows = np.asarray(w, np.float32).reshape(120, -1)
    assert np.allclose(gru["weight_hc_scales"].array().reshape(-1),
                       np.float32(127) / np.abs(rows).max(axis=1), rtol=1e-6)
    assert g.layer("mha").weights["out_scale"].array().size == 1
    # the saved table holds every weight set in ncnn2table's order, and drives the same bytes
    t = Int8Table.read(tmp_path / "q.table")
    assert [len(t.more_weights[n]) for n in ("lstm", "gru", "rnn", "mha")] == [1, 1, 1, 3]
    res = QuantizeInt8(t)(paramsurgery.load(str(SEQ), bin=str(SEQ_BIN)))
    paramsurgery.save(res.graph, str(tmp_path / "t.param"), bin=str(tmp_path / "t.bin"))
    assert (tmp_path / "t.bin").read_bytes() == (tmp_path / "q.bin").read_bytes()
    x = np.random.default_rng(12).standard_normal((10, 16)).astype(np.float32)
    ref = _run(str(SEQ), str(SEQ_BIN), x)
    q = _run(str(out), str(tmp_path / "q.bin"), x)
    assert q.tobytes() != ref.tobytes() and rel_error(q, ref) < 0.05


def test_bad_inputs_exit_2(tmp_path, capsys):
    assert main(["quantize", str(SMALL), "--bin", str(SMALL_BIN)]) == 2
    assert "give --calib" in capsys.readouterr().err
    assert main(["quantize", str(SMALL), "--bin", str(SMALL_BIN), "--calib",
                 str(tmp_path / "none")]) == 2
    assert "none: --calib: no such file or directory" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.skipif(not (TOOLS / "ncnn2table").exists(),
                    reason="ncnn's tools not built (tools/build_ncnn_quant_tools.sh)")
def test_agrees_with_ncnn2table_and_ncnn2int8(tmp_path):
    """tools/compare_ncnn_quantize.py on two corpus CNNs: scales within 1e-6 of ncnn2table's,
    the .bin from ncnn's table byte-identical to ncnn2int8's."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compare_ncnn_quantize.py"),
                           "--tools", str(TOOLS), "--work", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert set(rep) == {"squeezenet_v1.1", "mobilenet"}
    for r in rep.values():
        assert r["weight_scale_max_rel_diff"] <= 1e-6
        assert r["input_scale_max_rel_diff"] <= 1e-6
        assert r["bin_identical"] and r["param_identical_but_hints"]
