"""`paramsurgery fix`: lint → the repair passes the findings call for → write; afterwards
nothing fixable is left. The raw Qwen3-TTS fixtures: each repaired or refused, with the
reason recorded here."""

import json

import numpy as np
import pytest

import paramsurgery
from paramsurgery.commands.fix import detect, fix_graph, lint_findings
from paramsurgery.passes._traced import companion_pnnx
from paramsurgery.runtime import Feed, Fetch, run

from conftest import FIXTURES

REPROS = FIXTURES / "repros"
TINY = FIXTURES / "qwen3_tts" / "tiny"
R = FIXTURES / "repairs"

CASES = ["stack-sum-batch-axis", "unbind-batch-axis", "slice-batch-axis", "paramless-slice"]


@pytest.mark.parametrize("case", CASES)
def test_fix_repros_leaves_nothing_fixable(case, tmp_path):
    p = REPROS / case / "bug" / "model.ncnn.param"
    rep = fix_graph(paramsurgery.load(p), traced=companion_pnnx(p))
    assert rep.before and not rep.failures and rep.exit_code == 0
    assert rep.fixable_left == []
    # nothing left above info level (an info may remain, e.g. PS008 on a Reshape that moves
    # the unbound axis into ncnn's batch n and back, which no layer computes along)
    assert [f for f in rep.after if f.severity != "info"] == []
    st = json.loads((REPROS / case / "bug" / "status.json").read_text())
    ref = np.load(REPROS / case / "bug" / "ref.npz")
    rep.graph.save(tmp_path / "m.param")
    outs = [k for k in ref.files if k.startswith("out")]
    got = run(tmp_path / "m.param", REPROS / case / "bug" / "model.ncnn.bin",
              {k: Feed(ref[k], st["input_batch_index"].get(k, 233)) for k in ref.files
               if k.startswith("in")},
              [Fetch(k, st["output_batch_index"].get(k, 233)) for k in outs])
    for k in outs:
        np.testing.assert_allclose(got[k], ref[k], atol=1e-5)


def test_fix_refusal_rolls_back_and_exits_2(tmp_path, capsys):
    from paramsurgery.cli import main

    p = REPROS / "fused-qkv-unbind" / "bug" / "model.ncnn.param"
    assert main(["fix", str(p), "-o", str(tmp_path / "o.param")]) == 2
    out = capsys.readouterr().out
    assert "fix-slice: refused (rolled back)" in out and "rank 5" in out
    assert (tmp_path / "o.param").read_bytes() == p.read_bytes()


def test_fix_dynamize_when_given_a_length(tmp_path):
    p = R / "attention" / "static10" / "model.ncnn.param"
    rep = fix_graph(paramsurgery.load(p), traced=companion_pnnx(p), traced_len=10)
    assert [r.pass_name for r in rep.results] == ["dynamize"]
    assert len(rep.results[0].changes) == 8


def test_cli_json(tmp_path, capsys):
    from paramsurgery.cli import main

    p = R / "dequant_raw" / "dynamic" / "model.ncnn.param"
    assert main(["fix", str(p), "-o", str(tmp_path / "o.param"), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passes"][0]["pass"] == "fix-reduction" and data["findings_after"] == []


def test_fix_dequant_equals_ported(tmp_path):
    raw, ported = R / "dequant_raw" / "dynamic", R / "dequant_ported" / "dynamic"
    fix_graph(paramsurgery.load(raw / "model.ncnn.param")).graph.save(tmp_path / "m.param")
    ref = np.load(ported / "ref.npz")
    got = run(tmp_path / "m.param", raw / "model.ncnn.bin", {"in0": Feed(ref["in0"], 0)},
              [Fetch("out0", 0)])["out0"]
    want = run(ported / "model.ncnn.param", ported / "model.ncnn.bin",
               {"in0": Feed(ref["in0"], 0)}, [Fetch("out0", 0)])["out0"]
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ the raw Qwen3-TTS fixtures
# raw fixture -> (findings, outcome). "nothing to repair": pnnx converted it right (manifest
# status runs_right) and fix leaves it byte-identical. "refused": the broken layers are
# converter leftovers no repair pass rewrites (they need a torch-side change).
# codec_decoder has no raw export: pnnx itself aborts on it (manifest: pnnx_failed); its
# dequant (stack(levels, 0).sum(0)) is covered by fixtures/repairs/dequant_raw above.
RAW = {
    "talker_text_embed": ([], "nothing to repair"),
    "talker_codec_embed": ([], "nothing to repair"),
    "talker_codec_head": ([], "nothing to repair"),
    "predictor_embeds": ([], "nothing to repair"),
    "predictor_heads": ([], "nothing to repair"),
    "predictor_decoder": (["pnnx.Expression", "Tensor.expand"],
                          "refused: dynamic repeat_kv (case 1), no param-level repair"),
    "talker_decoder": (["Tensor.expand", "Tensor.slice", "Tensor.slice_copy", "pnnx.Expression"],
                       "refused: repeat_kv (case 1) and interleaved M-RoPE slice/slice_copy"),
    "speaker_encoder": (["Tensor.expand", "Tensor.masked_fill", "Tensor.repeat", "Tensor.to",
                         "pnnx.Expression", "torch.arange", "torch.eq", "torch.lt"],
                        "refused: length-mask arithmetic (arange/lt/masked_fill) in the graph"),
    "mimi_encoder": (["F.pad", "Reshape", "Tensor.to", "pnnx.Expression", "torch.arange"],
                     "refused: extra padding from the traced length (case 5), replicate F.pad, "
                     "in-graph positions"),
}


@pytest.mark.parametrize("module", sorted(RAW))
def test_raw_qwen3_tts_fixture(module, tmp_path):
    p = TINY / f"{module}.raw.ncnn.param"
    g = paramsurgery.load(p)
    rep = fix_graph(g, traced=companion_pnnx(p))
    leftovers, outcome = RAW[module]
    assert sorted({g.layer(f.layer).type for f in rep.unrepairable}) == sorted(leftovers)
    assert rep.fixable_left == [] and not rep.failures
    if outcome == "nothing to repair":
        assert rep.before == [] and rep.exit_code == 0
        assert rep.graph.dump_bytes() == p.read_bytes()
    else:
        assert rep.exit_code == 1 and not any(r.modified for r in rep.results)


def test_detect_matches_the_pass_preconditions():
    g = paramsurgery.load(REPROS / "stack-sum-batch-axis" / "bug" / "model.ncnn.param")
    assert [(f.layer, f.fix) for f in detect(g)] == [("sum_3", "paramsurgery fix-reduction")]
    assert lint_findings(g)
