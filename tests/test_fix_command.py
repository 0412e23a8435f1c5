"""`paramsurgery fix`: lint → the repair passes the findings call for → write; afterwards
nothing fixable is left. The raw Qwen3-TTS fixtures: each repaired or refused, with the
reason recorded here."""

import json

import numpy as np
import pytest

import paramsurgery
from paramsurgery.pipeline.fix import fix_graph, lint_findings
from paramsurgery.formats.pnnx_traced import companion_pnnx
from paramsurgery.runtime.child import Feed, Fetch, run

from conftest import FIXTURES
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dump_bytes
from paramsurgery.formats.param_text import dumps

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
    save(rep.graph, tmp_path / "m.param")
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
    captured = capsys.readouterr()
    out = captured.out
    assert "fix-slice: refused (rolled back)" in out and "rank 5" in out
    # and located on stderr, as every exit-2 message is (the unbind's line), with what is
    # left and the refusal to write
    err = captured.err.splitlines()
    assert err[0] == (
        f"{p}:10: fix-slice: refused (rolled back): fix-slice cannot prove the rewrite of 1 "
        f"layer(s): torch.unbind_7 (line 10): raw torch.unbind: rank 5 cannot hold the batch "
        f"axis as a real axis")
    assert err[-1] == (f"{p}: refusing to write {tmp_path / 'o.param'}: 1 repair(s) refused "
                       f"(fix-slice; rolled back, see above)")
    assert "wrote" not in captured.out
    assert not (tmp_path / "o.param").exists()


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
    save(fix_graph(paramsurgery.load(raw / "model.ncnn.param")).graph, tmp_path / "m.param")
    ref = np.load(ported / "ref.npz")
    got = run(tmp_path / "m.param", raw / "model.ncnn.bin", {"in0": Feed(ref["in0"], 0)},
              [Fetch("out0", 0)])["out0"]
    want = run(ported / "model.ncnn.param", ported / "model.ncnn.bin",
               {"in0": Feed(ref["in0"], 0)}, [Fetch("out0", 0)])["out0"]
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ the raw Qwen3-TTS fixtures
# raw fixture -> (leftover types no pass repairs, leftover types a pass is named for but
# keeps, passes that change the graph). Empty/empty/none: pnnx converted it right (manifest
# status runs_right) and fix leaves it byte-identical. codec_decoder has no raw export: pnnx
# itself aborts on it (manifest: pnnx_failed); its dequant (stack(levels, 0).sum(0)) is
# covered by fixtures/repairs/dequant_raw above.
RAW = {
    "talker_text_embed": ([], [], []),
    "talker_codec_embed": ([], [], []),
    "talker_codec_head": ([], [], []),
    "predictor_embeds": ([], [], []),
    "predictor_heads": ([], [], []),
    # dynamic repeat_kv (case 1): fold-gqa feeds SDPA the kv heads; nothing is left
    "predictor_decoder": ([], [], ["fold-gqa"]),
    # repeat_kv folded; the interleaved M-RoPE slice/slice_copy lowered (Crop + Concat)
    "talker_decoder": ([], [], ["fold-gqa", "lower"]),
    # the ECAPA length mask without weights: lower lowers the eq of the 0/1 mask, and keeps
    # what needs the .bin (arange/repeat tables, the folded length's value) and what reads it
    # (with --bin it repairs everything: tests/test_rawfix_qwen3tts.py)
    "speaker_encoder": (["pnnx.Expression"],
                        ["Tensor.expand", "Tensor.masked_fill", "Tensor.repeat", "Tensor.to",
                         "pnnx.Expression", "torch.arange", "torch.lt"], ["lower"]),
    # the computed pads are lowered and the lossy Reshape pair merged; the in-graph
    # positions (arange over the length) stay (lower needs the weights for its table)
    "mimi_encoder": ([], ["pnnx.Expression", "torch.arange"], ["lower", "fix-batch-reshape"]),
}


@pytest.mark.parametrize("module", sorted(RAW))
def test_raw_qwen3_tts_fixture(module, tmp_path):
    p = TINY / f"{module}.raw.ncnn.param"
    g = paramsurgery.load(p)
    rep = fix_graph(g, traced=companion_pnnx(p))
    unrepairable, kept, changed_by = RAW[module]
    assert sorted({g.layer(f.layer).type for f in rep.unrepairable if f.layer}) == unrepairable
    assert sorted({g.layer(f.layer).type for f in rep.fixable_left if f.layer}) == kept
    assert [r.pass_name for r in rep.results if r.modified] == changed_by
    assert not rep.failures
    if not (unrepairable or kept or changed_by):
        assert rep.before == [] and rep.exit_code == 0
        assert dump_bytes(rep.graph) == p.read_bytes()
    else:
        assert rep.exit_code == (1 if unrepairable or kept else 0)


def test_fix_repairs_raw_predictor_decoder(tmp_path, capsys):
    """The issue's case: `fix --bin` on the raw tiny predictor (dynamic repeat_kv) writes a
    graph that ncnn loads and runs right against the torch reference at T=9 (neither traced
    length, 37 and 5), with the weights hard-linked (fold-gqa removes weightless layers)."""
    from paramsurgery.cli import main
    from paramsurgery.verify.reference import relative_error

    stem = TINY / "predictor_decoder.raw"
    out = tmp_path / "out.param"
    assert main(["fix", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "-o", str(out)]) == 0
    assert "fold-gqa: 2 change(s)" in capsys.readouterr().out
    assert (tmp_path / "out.bin").stat().st_ino == (TINY / "predictor_decoder.raw.ncnn.bin").stat().st_ino
    assert paramsurgery.lint.lint_file(out, run=False) == []
    io = next(r for r in json.loads((FIXTURES / "manifest.json").read_text())["qwen3_tts"]["exports"]
              if r.get("module") == "predictor_decoder" and r.get("variant") == "raw"
              and "ncnn_bin" in r["files"])["io"]
    ref = np.load(f"{stem}.ref.npz")
    from paramsurgery.runtime.child import run_isolated

    res = run_isolated(out, tmp_path / "out.bin",
                       {i["blob"]: Feed(ref[i["key"]], i["batch_index"]) for i in io["inputs"]},
                       [Fetch(o["blob"], o["batch_index"]) for o in io["outputs"]])
    assert res.ok, res.describe()
    for o in io["outputs"]:
        assert relative_error(res.outputs[o["blob"]], ref[o["key"]]) <= 1e-4


def test_fix_verify_refuses_a_wrong_result(tmp_path, capsys):
    """--verify compares with the reference before writing: a reference whose output is
    off makes fix refuse (exit 1) and write nothing."""
    from paramsurgery.cli import main

    stem = TINY / "predictor_decoder.raw"
    ref = dict(np.load(f"{stem}.ref.npz"))
    ref["output_hidden"] = ref["output_hidden"] + 1.0
    np.savez(tmp_path / "bad.npz", **ref)
    out = tmp_path / "out.param"
    args = ["fix", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "-o", str(out), "--verify"]
    assert main(args + ["--reference", str(tmp_path / "bad.npz")]) == 1
    assert "MISMATCH" in capsys.readouterr().err and not out.exists()
    assert main(args) == 0
    assert "verify against" in capsys.readouterr().out and out.exists()


def test_fix_plan_comes_from_the_pass_declarations():
    """Lint names the pass that claims a leftover (PS004 → lower, remove-passthrough), and
    fix runs it: no list of repairs in fix itself. The result loads in ncnn and computes
    x/(|x|+1) then ReLU."""
    from paramsurgery.passes.base import repair_for, repairs
    from paramsurgery.runtime.child import run_isolated

    g = paramsurgery.loads("7767517\n4 4\nInput in0 0 1 in0\n"
                           "F.softsign F.softsign_0 1 1 in0 a\n"
                           "Tensor.contiguous Tensor.contiguous_1 1 1 a b\n"
                           "ReLU relu 1 1 b out0\n", "m.param")
    order = [p.name for p in repairs()]
    assert order[:6] == ["fix-bool-table", "fold-gqa", "unbatch-heads", "causal-mask", "lower",
                         "remove-passthrough"]
    assert {"fix-slice", "fix-reduction", "dynamize"} <= set(order)
    assert [repair_for(layer) for layer in g] == [None, "lower", "remove-passthrough", None]
    rep = fix_graph(g)
    assert sorted(f.fix_pass for f in rep.before) == ["lower", "remove-passthrough"]
    assert rep.wanted == ["lower", "remove-passthrough"] and rep.exit_code == 0
    assert rep.after == [] and [r.pass_name for r in rep.results if r.modified] == rep.wanted
    assert {layer.type for layer in rep.graph} == {"Input", "Split", "UnaryOp", "BinaryOp", "ReLU"}
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    res = run_isolated(dumps(rep.graph), None, {"in0": x}, ["out0"])
    assert res.ok, res.describe()
    np.testing.assert_allclose(res.outputs["out0"], np.maximum(x / (np.abs(x) + 1), 0),
                               rtol=1e-6)


def test_fix_rewrites_weights_when_a_repair_adds_some(tmp_path, capsys):
    """Raw mimi encoder: lower's arange rule adds a position table (a weighted layer), so
    `fix --bin` writes new weights next to the output (not a link) and the result matches
    the torch reference (--verify, T=9, neither traced length)."""
    from paramsurgery.cli import main

    stem = TINY / "mimi_encoder.raw"
    out = tmp_path / "out.param"
    assert main(["fix", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "-o", str(out),
                 "--verify"]) == 0
    text = capsys.readouterr().out
    assert f"weights: rewritten to {tmp_path / 'out.bin'}" in text and "verify against" in text
    assert (tmp_path / "out.bin").stat().st_ino != (TINY / "mimi_encoder.raw.ncnn.bin").stat().st_ino
    assert [f for f in paramsurgery.lint.lint_file(out, run=False) if f.severity != "info"] == []


def test_fix_sees_a_frozen_trace_length_no_other_rule_shows(tmp_path, capsys):
    """Repro case `size-after-transpose-folded`: every layer is one ncnn has, so only PS016
    (which reads pnnx's record of the trace) shows the length frozen at 10. `fix` lints with
    pnnx's `.pnnx.param` next to the file, runs `lower`'s thaw, and the result matches torch
    at the reference length (0.164 off before)."""
    from golden import check_golden

    from paramsurgery.cli import main

    bug = REPROS / "size-after-transpose-folded" / "bug"
    assert [f.code for f in lint_findings(paramsurgery.load(bug / "model.ncnn.param"))] == []
    out = tmp_path / "y.param"
    assert main(["fix", str(bug / "model.ncnn.param"), "--bin", str(bug / "model.ncnn.bin"),
                 "-o", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("1 finding(s); repairs called for: lower") and "ok: out0 rel" in text
    check_golden("fix/frozen_trace_length.param", out.read_text())
    ref = np.load(bug / "ref.npz")
    got = run(out, tmp_path / "y.bin", {"in0": Feed(ref["in0"], 233)},
              [Fetch("out0", 233)])["out0"]
    assert ref["in0"].shape[-1] != 10
    np.testing.assert_allclose(got, ref["out0"], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ exit codes and outputs

SIMPLE = "7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b\n"


def test_fix_with_nothing_to_repair_writes_nothing_unless_asked(tmp_path, capsys):
    from paramsurgery.cli import main

    p = tmp_path / "m.param"
    p.write_text(SIMPLE)
    out = tmp_path / "o.param"
    assert main(["fix", str(p), "-o", str(out)]) == 0
    assert "nothing to change; no file written" in capsys.readouterr().out
    assert not out.exists() and not (tmp_path / "m.fixed.param").exists()
    assert main(["fix", str(p), "-o", str(out), "--always-write"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out and out.read_text() == SIMPLE
    assert main(["fix", str(p), "-o", str(tmp_path / "j.param"), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["written"] is False and all(f["role"] != "output" for f in data["files"])


def test_fix_applies_the_header_rewrite_its_findings_name(tmp_path, capsys):
    """PS102 (too few blobs in the header) names `fmt`'s header rewrite: fix applies it."""
    from paramsurgery.cli import main

    p = tmp_path / "m.param"
    p.write_text(SIMPLE.replace("2 2\n", "2 1\n"))
    assert {f.code for f in lint_findings(paramsurgery.load(p))} >= {"PS102"}
    out = tmp_path / "o.param"
    assert main(["fix", str(p), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "repairs called for: header" in text and "2 1 -> 2 2" in text
    assert out.read_text() == SIMPLE
    assert paramsurgery.lint.lint_file(out, run=False) == []


def test_every_fix_a_finding_names_is_a_repair_fix_runs():
    """A rule whose fix is a paramsurgery command names a pass fix runs (or the header
    rewrite fix does itself). Info findings are suggestions (PS014's fuse-codebooks changes
    the model's inputs): fix leaves them to the user."""
    from paramsurgery.pipeline.fix import HEADER
    from paramsurgery.lint.catalogue import all_rules
    from paramsurgery.passes.base import repairs

    names = {p.name for p in repairs()}
    for r in all_rules().values():
        if r.fix and r.fix.startswith("paramsurgery ") and set(r.severities) - {"info"}:
            assert r.fix_pass in names or (r.code in ("PS101", "PS102") and HEADER), r.code


def test_fix_refuses_errors_no_repair_handles(tmp_path, capsys):
    """A graph lint rejects is never written as fixed: the errors are listed, located, and
    nothing is written (exit 2); --always-write writes the partly repaired graph (exit 1)."""
    from paramsurgery.cli import main

    p = tmp_path / "m.param"
    p.write_text(SIMPLE.replace("2 2\n", "3 3\n") + "FooBar x 1 1 b c\n")
    out = tmp_path / "o.param"
    assert main(["fix", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:5: PS005 error FooBar 'x'" in err
    assert "refusing to write" in err and "PS005 x (line 5)" in err and not out.exists()
    assert main(["fix", str(p), "-o", str(out), "--always-write"]) == 1
    assert out.exists()


def test_fix_runs_lints_run_rules_and_refuses_a_wrong_output(tmp_path, capsys):
    """The reference next to the export shows an output of the wrong shape (PS403, a rule
    that runs the graph through ncnn): no repair handles it, so fix refuses, naming the
    layer, instead of "0 finding(s) ... wrote"."""
    from paramsurgery.cli import main

    p = REPROS / "dropped-negative-slice" / "bug" / "model.ncnn.param"
    out = tmp_path / "o.param"
    assert main(["fix", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "PS403 error output 'out0' from BinaryOp 'mul_0'" in err and not out.exists()
    rep = fix_graph(paramsurgery.load(p), traced=companion_pnnx(p), param=str(p),
                    reference=str(p.parent / "ref.npz"))
    assert [f.layer for f in rep.errors_left] == ["mul_0"]


def test_fix_verify_verifies_an_unchanged_graph(tmp_path, capsys):
    from paramsurgery.cli import main

    d = R / "attention" / "dynamic"
    ref = dict(np.load(d / "ref.npz"))
    outs = [k for k in ref if k.startswith("out")]
    args = ["fix", str(d / "model.ncnn.param"), "--bin", str(d / "model.ncnn.bin"),
            "-o", str(tmp_path / "o.param"), "--verify"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "verify against" in text and "nothing to change" in text
    for k in outs:
        ref[k] = ref[k] + 1.0
    np.savez(tmp_path / "bad.npz", **ref)
    assert main(args + ["--reference", str(tmp_path / "bad.npz")]) == 1
    assert "MISMATCH" in capsys.readouterr().err


def test_fix_verifies_a_dynamized_static_export_by_default(tmp_path, capsys):
    """A static export (traced at 10) with a reference at 13 next to it is dynamized to 13:
    fix proves it against that reference without --verify (the .bin next to it)."""
    from paramsurgery.cli import main

    d = R / "attention" / "static10"
    assert main(["fix", str(d / "model.ncnn.param"), "-o", str(tmp_path / "f.param")]) == 0
    text = capsys.readouterr().out
    assert "repairs called for: dynamize" in text and "ref.npz: ok: out0 rel" in text
    ref = dict(np.load(d / "ref.npz"))
    ref["out0"] = ref["out0"] * 2.0
    np.savez(tmp_path / "ref.npz", **ref)
    for name in ("model.ncnn.param", "model.ncnn.bin", "model.pnnx.param"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    assert main(["fix", str(tmp_path / "model.ncnn.param"), "-o", str(tmp_path / "g.param")]) == 1
    assert "MISMATCH" in capsys.readouterr().err and not (tmp_path / "g.param").exists()
    (tmp_path / "model.ncnn.bin").unlink()
    assert main(["fix", str(tmp_path / "model.ncnn.param"), "-o", str(tmp_path / "g.param")]) == 2
    assert "give the weights (--bin)" in capsys.readouterr().err
