"""`fix --verify` against a torch reference: pnnx's batch axis of each array comes from the
reference's io side file (`X.ref.io.json`, the fixture manifest's `io` record), not a guess."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import FIXTURES
from paramsurgery.formats.pnnx_reference import io_sidefile, read_io_sidefile

TINY = FIXTURES / "qwen3_tts" / "tiny"


def _io_record(module: str, variant: str) -> dict:
    exports = json.loads((FIXTURES / "manifest.json").read_text())["qwen3_tts"]["exports"]
    return next(r for r in exports if r["module"] == module and r["variant"] == variant
                and r["size"] == "tiny")["io"]


def test_raw_talker_verifies_with_the_io_side_file(tmp_path, capsys):
    """The raw tiny talker feeds cos/sin with batch axis 1 (not the leading 1 a guess
    takes): with the side file `fix --bin --verify` writes the repaired graph (it runs right
    at T=9, no traced length); without it the guess makes it refuse, naming the guess."""
    from paramsurgery.cli import main

    fixture = TINY / "talker_decoder.raw"
    # a copy without pnnx's talker_decoder.raw_ncnn.py, which also records the batch axes
    stem = tmp_path / "talker_decoder.raw"
    for suffix in (".ncnn.param", ".ncnn.bin", ".pnnx.param"):
        shutil.copyfile(f"{fixture}{suffix}", f"{stem}{suffix}")
    ref = tmp_path / "talker.ref.npz"
    shutil.copyfile(f"{fixture}.ref.npz", ref)
    args = ["fix", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "--verify",
            "--reference", str(ref)]
    assert main(args + ["-o", str(tmp_path / "guessed.param")]) == 1
    err = capsys.readouterr().err
    assert "MISMATCH" in err and "batch axis guessed for in0, in1, in2, in3, out0" in err
    assert not (tmp_path / "guessed.param").exists()

    (tmp_path / "talker.ref.io.json").write_text(json.dumps(_io_record("talker_decoder", "raw")))
    assert main(args + ["-o", str(tmp_path / "out.param")]) == 0
    out = capsys.readouterr().out
    assert "verify against" in out and ": ok: out0 rel" in out
    assert (tmp_path / "out.param").exists() and (tmp_path / "out.bin").exists()

    # the fixture carries its side file (written from the same manifest record) and pnnx's
    # script: either gives the axes
    assert read_io_sidefile(f"{fixture}.ref.npz") == {
        part: [{k: e[k] for k in ("batch_index", "blob", "key", "name")} for e in entries]
        for part, entries in _io_record("talker_decoder", "raw").items()}
    assert (TINY / "talker_decoder.raw_ncnn.py").exists()
    for name, ref_args in (("fixture", []), ("script", ["--reference", str(ref)])):
        (tmp_path / "talker.ref.io.json").unlink(missing_ok=True)
        assert main(["fix", f"{fixture}.ncnn.param", "--bin", f"{fixture}.ncnn.bin",
                     "--verify", *ref_args, "-o", str(tmp_path / f"{name}.param")]) == 0
        assert ": ok: out0 rel" in capsys.readouterr().out


def test_io_sidefile_is_read_and_checked(tmp_path):
    ref = tmp_path / "x.ref.npz"
    assert io_sidefile(str(ref)) == str(tmp_path / "x.ref.io.json")
    assert read_io_sidefile(str(ref)) is None
    io = {"inputs": [{"blob": "in0", "key": "input_x", "batch_index": 233}],
          "outputs": [{"blob": "out0", "key": "output_y", "batch_index": 0}]}
    (tmp_path / "x.ref.io.json").write_text(json.dumps(io))
    assert read_io_sidefile(str(ref)) == io
    (tmp_path / "x.ref.io.json").write_text(json.dumps({"inputs": [{"blob": "in0"}]}))
    with pytest.raises(ValueError, match="not an io record"):
        read_io_sidefile(str(ref))


def test_reference_pairs_keys_through_the_side_file(tmp_path):
    """With the side file no pnnx IR is needed to pair `input_*` keys with blobs."""
    import paramsurgery
    from paramsurgery.formats.pnnx_reference import Reference

    g = paramsurgery.loads("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n", "m.param")
    np.savez(tmp_path / "r.npz", input_x=np.ones((1, 3, 4), np.float32),
             output_y=np.ones((1, 3, 4), np.float32))
    (tmp_path / "r.io.json").write_text(json.dumps(
        {"inputs": [{"blob": "in0", "key": "input_x", "batch_index": 1}],
         "outputs": [{"blob": "out0", "key": "output_y", "batch_index": 1}]}))
    ref = Reference.load(str(tmp_path / "r.npz"), g)
    assert [(s.blob, s.batch_index) for s in ref.inputs] == [("in0", 1)]
    assert ref.output_keys == {"out0": "output_y"} and ref.output_batch == {"out0": 1}
