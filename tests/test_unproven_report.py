"""A run that modified the graph and ran no check says so (one `not verified through ncnn:`
line, the JSON's `not_verified`); an unmodified run says nothing new (issue 24)."""

import json
import shutil

from paramsurgery.cli import main

from conftest import FIXTURES

TINY = FIXTURES / "qwen3_tts" / "tiny"
RAW = TINY / "predictor_decoder.raw.ncnn"
PASS_LINE = ("not verified through ncnn: the rewritten graph was not run through ncnn (the "
             "pass's own tests prove its rewrite, not this output); run with --verify")


def test_modified_run_without_verify_says_so(tmp_path, capsys):
    out = tmp_path / "g.param"
    assert main(["fold-gqa", f"{RAW}.param", "--bin", f"{RAW}.bin", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("not verified through ncnn") == 1 and PASS_LINE in text.splitlines()
    assert main(["fold-gqa", f"{RAW}.param", "--bin", f"{RAW}.bin", "-o", str(out),
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["modified"] and data["not_verified"] == PASS_LINE.split(": ", 1)[1]


def test_unmodified_run_says_nothing_new(tmp_path, capsys):
    out = tmp_path / "g.param"
    src = tmp_path / "in.param"
    assert main(["fold-gqa", f"{RAW}.param", "--bin", f"{RAW}.bin", "-o", str(src)]) == 0
    capsys.readouterr()
    assert main(["fold-gqa", str(src), "-o", str(out), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not data["modified"] and "not_verified" not in data
    assert main(["fold-gqa", str(src), "-o", str(out)]) == 0
    assert "not verified" not in capsys.readouterr().out


def test_fix_without_a_reference_says_so(tmp_path, capsys):
    bug = FIXTURES / "repros" / "ones-padding-mask" / "bug"
    shutil.copy(bug / "model.ncnn.param", tmp_path / "model.ncnn.param")
    shutil.copy(bug / "model.pnnx.param", tmp_path / "model.pnnx.param")
    argv = ["fix", str(tmp_path / "model.ncnn.param"), "-o", str(tmp_path / "o.param"),
            "--always-write"]
    code = main(argv)
    text = capsys.readouterr().out
    want = (f"not verified through ncnn: no torch reference ({tmp_path}/model.ref.npz next to "
            f"the input, or --reference REF.npz)")
    assert code in (0, 1) and text.count(want) == 1, text
    main(argv + ["--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data["modified"] and data["not_verified"].startswith("no torch reference (")
