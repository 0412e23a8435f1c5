"""The one runner of graph-writing commands (commands/_runner.GraphCommand): the same
error for the same mistake in every command, nothing written on a refusal, weights linked
when unchanged."""

import json

import pytest

from paramsurgery.cli import main

from conftest import FIXTURES

TINY = FIXTURES / "qwen3_tts" / "tiny"
DECODER = TINY / "predictor_decoder.ported.ncnn.param"


@pytest.mark.parametrize("argv", [
    ["add-kvcache", str(DECODER), "--verify"],
    ["fix", str(DECODER), "--verify"],
    ["extract", str(DECODER), "--outputs", "out0", "--verify"],
])
def test_verify_without_weights_is_one_error(argv, tmp_path, capsys):
    out = tmp_path / "o.param"
    assert main(argv + ["-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{DECODER}: --verify needs the weights (--bin model.bin)" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_unchanged_weights_are_linked_and_reported(tmp_path, capsys):
    raw = TINY / "predictor_decoder.raw.ncnn"
    out = tmp_path / "g.param"
    assert main(["fold-gqa", f"{raw}.param", "--bin", f"{raw}.bin", "-o", str(out),
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pass"] == "fold-gqa" and data["output"] == str(out) and data["modified"]
    assert (tmp_path / "g.bin").stat().st_ino == (TINY / "predictor_decoder.raw.ncnn.bin").stat().st_ino


def test_output_naming_the_input_is_refused(tmp_path, capsys):
    src = tmp_path / "m.param"
    src.write_bytes(DECODER.read_bytes())
    assert main(["fold-gqa", str(src), "-o", str(src)]) == 2
    assert "use --in-place" in capsys.readouterr().err
