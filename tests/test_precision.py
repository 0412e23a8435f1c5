"""`paramsurgery precision` and the keep-precision pass: the planted layers of
fixtures/precision (tools/fixtures_precision.py) are found and protected through ncnn, the
searched set is minimal, a mode without effect is said to be so, and the written masks
hold under the reduced options (numbers through ncnn in child processes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.passes.keep_precision import KeepPrecision
from paramsurgery.runtime.child import Feed
from paramsurgery.verify.compare.options import PARITY
from paramsurgery.verify.precision import search as search_mod
from paramsurgery.verify.precision.batch import Variant, VariantResult, Worker, run_variants
from paramsurgery.verify.precision.metrics import METRICS, rel_error
from paramsurgery.verify.precision.search import mode_settings

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "fixtures" / "precision" / "planted.param"
PLANTED_BIN = ROOT / "fixtures" / "precision" / "planted.bin"
PLANTED_INPUTS = ROOT / "fixtures" / "precision" / "planted.inputs.npz"


def _planted_feeds() -> dict:
    with np.load(PLANTED_INPUTS) as z:
        return {"in0": Feed(z["in0"])}


def _out0(texts_settings: list[tuple[str, dict]]) -> list[np.ndarray]:
    got = run_variants(str(PLANTED_BIN), _planted_feeds(),
                       [Variant(t, s, ["out0"]) for t, s in texts_settings], timeout=120)
    assert all(r.ok for r in got), [r.message for r in got]
    return [r.arrays["out0"] for r in got]


def _has_f16c() -> bool:
    try:
        return " f16c" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_planted_bf16_layer_is_found_protected_and_written(tmp_path, capsys):
    out = tmp_path / "kept.param"
    page = tmp_path / "page.html"
    code = main(["precision", str(PLANTED), "--mode", "bf16", "--inputs", str(PLANTED_INPUTS),
                 "--tol", "0.01", "-o", str(out), "--html", str(page), "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    assert rep["in_effect"] and rep["kept"] == ["conv_huge"]
    assert rep["all_reduced"]["out0"] > 0.5           # bf16 everywhere: the output is wrong
    assert rep["final"]["out0"] <= 0.01               # conv_huge kept in fp32: within tolerance
    assert rep["proof"]["conv_huge"] > 0.01           # and it is needed
    rows = {r["layer"]: r for r in rep["layers"]}
    assert max(rows, key=lambda n: rows[n]["alone"]) == "conv_huge"
    assert rep["kept_fp32_exact"] is True
    # the written file, run again through ncnn: bf16 within tolerance, fp32 bit-identical
    text = out.read_text()
    assert re.search(r"^Convolution +conv_huge .* 31=4( |$)", text, re.M)
    assert (tmp_path / "kept.bin").read_bytes() == PLANTED_BIN.read_bytes()
    orig = PLANTED.read_text()
    ref, orig_bf16, kept_bf16, kept_fp32 = _out0([(orig, dict(PARITY)),
                                                  (orig, mode_settings("bf16")),
                                                  (text, mode_settings("bf16")),
                                                  (text, dict(PARITY))])
    assert rel_error(orig_bf16, ref) > 0.5
    assert rel_error(kept_bf16, ref) <= 0.01
    assert kept_fp32.tobytes() == ref.tobytes()
    assert "conv_huge" in page.read_text() and "<html" in page.read_text().lower()


@pytest.mark.skipif(not _has_f16c(), reason="ncnn's x86 fp16 weight storage needs F16C")
def test_planted_fp16_overflow_is_found_and_protected(capsys):
    code = main(["precision", str(PLANTED), "--mode", "fp16", "--inputs", str(PLANTED_INPUTS)])
    text = capsys.readouterr().out
    assert code == 0, text
    # on x86 only InnerProduct stores fp16 weights: the convolutions are said to be unaffected
    assert re.search(r"^conv_huge +Convolution +not in effect", text, re.M)
    assert re.search(r"^fc_huge +InnerProduct .* kept$", text, re.M)
    assert "kept in fp32: fc_huge" in text and "without fc_huge" in text


def test_a_mode_without_effect_is_said_so_never_a_zero(tmp_path, capsys):
    """Two convolutions (the feature-mask doc's graph): on a CPU whose ncnn has no fp16
    convolution the fp16 run is bit for bit the fp32 run. The command's claim is checked
    against the bits themselves."""
    param = tmp_path / "doc.param"
    param.write_text("7767517\n3 3\nInput input 0 1 input0 0=6 1=6 2=8\n"
                     "Convolution conv0 1 1 input0 conv0 0=8 1=1 6=64 9=1\n"
                     "Convolution conv1 1 1 conv0 conv1 0=16 1=3 6=1152 9=1\n")
    assert main(["synth-bin", str(param), "-o", str(tmp_path / "doc.bin")]) == 0
    x = np.random.default_rng(0).standard_normal((8, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input0=x)
    capsys.readouterr()
    ref, fp16 = (r.arrays["conv1"] for r in run_variants(
        str(tmp_path / "doc.bin"), {"input0": x},
        [Variant(param.read_text(), dict(PARITY), ["conv1"]),
         Variant(param.read_text(), mode_settings("fp16"), ["conv1"])], timeout=60))
    code = main(["precision", str(param), "--bin", str(tmp_path / "doc.bin"), "--mode", "fp16",
                 "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.param"),
                 "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    if ref.tobytes() == fp16.tobytes():
        assert code == 1 and rep["in_effect"] is False
        assert rep["all_reduced"] is None and rep["final"] is None
        assert "fp16 not in effect here" in rep["verdict"]
        assert not (tmp_path / "o.param").exists()
    else:
        assert rep["in_effect"] is True and rep["in_effect_layers"]


def test_bad_input_is_located_exit_2(tmp_path, capsys):
    assert main(["precision", str(tmp_path / "none.param"), "--mode", "bf16"]) == 2
    assert "none.param: no such file" in capsys.readouterr().err
    assert main(["precision", str(PLANTED), "--mode", "bf16", "--inputs",
                 str(tmp_path / "x.npz")]) == 2
    assert "x.npz: --inputs: no such file" in capsys.readouterr().err


# ---------------------------------------------------------------- the search, on a model

CHAIN = """7767517
5 5
Input in0 0 1 in0
ReLU A 1 1 in0 a
ReLU B 1 1 a b
ReLU C 1 1 b c
ReLU D 1 1 c out0
"""


def _error_of(reduced: set[str]) -> float:
    """An output error where greedy keeps a layer the tolerance does not need: B's error
    alone is large, but reducing D too cancels it."""
    return (0.5 * ("A" in reduced) + 0.3 * ("C" in reduced) +
            0.4 * ("B" in reduced and "D" not in reduced) + 0.01 * ("D" in reduced))


class _ModelWorker:
    """Stands in for the ncnn worker: outputs from the masks written in each variant."""

    def __init__(self, bin, feeds, timeout=0.0) -> None:
        self.seen: list[set[str]] = []

    def run(self, variants):
        out = []
        for v in variants:
            masked = set(re.findall(r"^ReLU +(\w+) .*31=4", v.param_text, re.M))
            reduced = set() if not v.settings.get("use_bf16_storage") else \
                {"A", "B", "C", "D"} - masked
            err = _error_of(reduced)
            self.seen.append(reduced)
            out.append(VariantResult("ok", {b: np.full(4, 1.0 + err, np.float32)
                                            for b in v.blobs}))
        return out

    def close(self) -> None:
        pass


def test_search_keeps_a_minimal_set(monkeypatch):
    monkeypatch.setattr(search_mod, "Worker", _ModelWorker)
    g = paramsurgery.loads(CHAIN)
    res = search_mod.search(g, None, {"in0": np.zeros(4, np.float32)}, mode="bf16",
                            metric="rel", tol=0.1)
    assert [r.name for r in sorted(res.rows, key=lambda r: -(r.alone or 0))] == \
        ["A", "B", "C", "D"]
    # greedy by contribution needs A, B, C; B is then shown needless and dropped
    assert sorted(res.kept) == ["A", "C"]
    assert res.final["out0"] <= 0.1
    # minimal: without any one kept layer the tolerance breaks (the proof, and the model)
    assert set(res.proof) == {"A", "C"} and all(v > 0.1 for v in res.proof.values())
    for k in res.kept:
        assert _error_of({"A", "B", "C", "D"} - (set(res.kept) - {k})) > 0.1


def test_metrics_spell_overflow_as_the_worst_value():
    ref = np.array([1.0, -2.0, 3.0], np.float32)
    bad = np.array([1.0, np.inf, 3.0], np.float32)
    assert METRICS["rel"].measure(bad, ref) == float("inf")
    assert METRICS["snr"].measure(bad, ref) == float("-inf")
    assert not METRICS["cos"].within(METRICS["cos"].measure(bad, ref), 0.9)
    assert METRICS["snr"].measure(ref * 1.001, ref) == pytest.approx(60.0, abs=0.01)
    assert METRICS["rel"].measure(ref, ref) == 0.0


def test_worker_outlives_a_hanging_or_crashing_variant():
    # no params: ncnn hangs or dies (SIGSEGV), depending on what the heap holds
    hang = "7767517\n2 3\nInput in0 0 1 in0\nSlice s 1 2 in0 a b\n"
    good = "7767517\n2 2\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n"
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with Worker(None, {"in0": x}, timeout=3) as w:
        got = w.run([Variant(good, {}, ["out0"]), Variant(hang, {}, ["a"]),
                     Variant(good, {}, ["out0"])])
        again = w.run([Variant(good, {}, ["out0"])])
    assert got[0].ok and got[1].status in ("timeout", "crash") and got[2].ok
    assert got[2].arrays["out0"].tolist() == np.maximum(x, 0).tolist()
    assert again[0].ok


def test_keep_precision_masks_hold_through_ncnn():
    """The pass's output under bf16: the kept layers compute in fp32 (the output is
    repaired), and the guards make a masked layer fed by a reduced one right: without
    them ncnn hands the masked layer bf16 bits as fp32."""
    g = paramsurgery.load(str(PLANTED))
    kept = KeepPrecision(("conv_huge", "fc"), "bf16")(g).graph
    text = paramsurgery.dumps(kept)
    assert text.count("DeepCopy") == 2
    unguarded = PLANTED.read_text().replace(" 6=128\n", " 6=128 31=4\n").replace(
        " 2=160\n", " 2=160 31=4\n")
    ref, good, fp32 = _out0([(PLANTED.read_text(), dict(PARITY)),
                             (text, mode_settings("bf16")), (text, dict(PARITY))])
    assert rel_error(good, ref) <= 0.01
    assert fp32.tobytes() == ref.tobytes()
    bad = run_variants(str(PLANTED_BIN), _planted_feeds(),
                       [Variant(unguarded, mode_settings("bf16"), ["out0"])], timeout=20)[0]
    assert not bad.ok or rel_error(bad.arrays["out0"], ref) > 0.01


def test_int8_search_keeps_the_layers_int8_breaks_and_quantize_takes_them(tmp_path, capsys):
    """--mode int8: the variants are the graph quantized as `quantize` does (max scales on
    the calibration set), every layer but the kept ones; the report's kept set then goes to
    `quantize --keep-from`."""
    fix = ROOT / "fixtures" / "precision"
    out = tmp_path / "int8.param"
    code = main(["precision", str(fix / "small_cnn.param"), "--mode", "int8", "--calib",
                 str(fix / "small_cnn.calib"), "--inputs", str(fix / "small_cnn.calib" / "c0.npz"),
                 "--tol", "0.002", "-o", str(out), "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    assert rep["all_reduced"]["out0"] > 0.002 >= rep["final"]["out0"]
    assert rep["kept"] and all(v > 0.002 for v in rep["proof"].values())
    assert set(rep["proof"]) == set(rep["kept"])
    # the written graph: int8 but for the kept layers, its own .bin, run by ncnn
    g = paramsurgery.load(str(out), bin=str(tmp_path / "int8.bin"))
    for layer in g:
        if layer.type in ("Convolution", "ConvolutionDepthWise", "InnerProduct"):
            assert bool(layer.params.get(8)) == (layer.name not in rep["kept"])
    (tmp_path / "prec.json").write_text(json.dumps(rep))
    assert main(["quantize", str(fix / "small_cnn.param"), "--bin", str(fix / "small_cnn.bin"),
                 "--calib", str(fix / "small_cnn.calib"), "--keep-from",
                 str(tmp_path / "prec.json"), "-o", str(tmp_path / "q.param")]) == 0
    assert f"kept in fp32: {', '.join(sorted(rep['kept']))}" in capsys.readouterr().out


def test_layers_that_share_a_name_are_searched_as_two(tmp_path):
    """pnnx writes some names twice (two `splitncnn_0` in the zoo's llama): each layer is
    its own candidate (`name#2` for the second), masked by itself — the control with every
    layer masked is bit for bit fp32, which masking by name (the first only) was not."""
    text = PLANTED.read_text().replace("ReLU                     relu2 ",
                                       "ReLU                     relu  ")
    g = paramsurgery.loads(text)
    assert [x.name for x in g].count("relu") == 2
    res = search_mod.search(g, str(PLANTED_BIN), _planted_feeds(), mode="bf16", tol=1e-2)
    rows = {r.name: r for r in res.rows}
    assert {"relu", "relu#2"} <= set(rows) and rows["relu#2"].line == rows["relu"].line + 2
    assert res.control_exact and res.kept == ["conv_huge"]


def test_a_reference_the_fp32_run_misses_is_said_and_not_reached(monkeypatch):
    """--pnnx's reference (here: torch's outputs stood in by fp32 + 1 %): errors are held
    against it; when ncnn's fp32 run is itself outside the tolerance, no kept set can reach
    it, and the search says so instead of keeping every layer."""
    g = paramsurgery.load(str(PLANTED))
    (fp32,) = _out0([(PLANTED.read_text(), dict(PARITY))])
    off = {"out0": fp32 * np.float32(1.01)}
    res = search_mod.search(g, str(PLANTED_BIN), _planted_feeds(), mode="bf16", tol=1e-3,
                            reference=off)
    assert res.reference == "torch" and not res.reached
    assert 0.009 < res.fp32_vs_reference["out0"] < 0.011
    assert any("ncnn's fp32 run is already" in n for n in res.notes)
    near = {"out0": fp32 * np.float32(1.0001)}  # within: the search runs against it
    res = search_mod.search(g, str(PLANTED_BIN), _planted_feeds(), mode="bf16", tol=1e-2,
                            reference=near)
    assert res.reached and res.kept == ["conv_huge"] and res.final["out0"] <= 1e-2


def test_pnnx_reference_is_torchs_output(tmp_path, capsys):
    """`precision --pnnx` on the zoo's llama (pnnx's torch export kept next to it): the
    outputs are held against torch; ncnn's fp32 run is within fp32 noise of it."""
    pytest.importorskip("torch")
    stem = ROOT / "fixtures" / "zoo" / "llama" / "embeds_sdpa_static"
    code = main(["precision", f"{stem}.ncnn.param", "--mode", "bf16", "--pnnx",
                 f"{stem}.pnnx.param", "--metric", "snr", "--tol", "30", "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    assert rep["reference"] == "torch" and rep["fp32_vs_reference"]["out0"] > 100
    assert rep["control_exact"] is True and 30 < rep["all_reduced"]["out0"] < 100


def test_pnnx_without_its_export_is_located(tmp_path, capsys):
    (tmp_path / "m.pnnx.param").write_text("7767517\n0 0\n")
    assert main(["precision", str(PLANTED), "--mode", "bf16", "--inputs", str(PLANTED_INPUTS),
                 "--pnnx", str(tmp_path / "m.pnnx.param")]) == 2
    err = capsys.readouterr().err
    assert "m.pnnx.param: pnnx's torch export is incomplete" in err and "m_pnnx.py" in err
