"""The command line: exit codes, error format, atomic outputs, JSON."""

import json
import os
import subprocess
import sys


from paramsurgery.cli import main

from conftest import CORPUS, REPO


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "paramsurgery", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_info_text_and_json(capsys):
    assert main(["info", str(CORPUS / "vision_transformer.param")]) == 0
    out = capsys.readouterr().out
    assert "144 layers, 192 blobs" in out and "MultiHeadAttention 12" in out
    assert main(["info", "--format", "json", str(CORPUS / "nanodet_m.param")]) == 0
    data = json.loads(capsys.readouterr().out)["files"][0]  # one object, files listed
    assert data["file"] == str(CORPUS / "nanodet_m.param")
    assert data["layers"] == 180 and data["header"] == {"layers": 179, "blobs": 204}
    assert data["outputs"] == ["output"]


def test_info_lists_layers_ncnn_cannot_load(tmp_path, capsys):
    p = tmp_path / "m.param"
    p.write_text("7767517\n3 3\nInput in 0 1 a\npnnx.Expression e 1 1 a b\nTensor.expand x 1 1 b c\n")
    assert main(["info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "line 4: pnnx.Expression e (converter leftover)" in out


def test_syntax_error_prints_location_and_exits_2(tmp_path):
    p = tmp_path / "bad.param"
    p.write_text("7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=1,2.5\n")
    r = run_cli("info", p)
    assert r.returncode == 2
    assert r.stderr.strip() == f"{p}:4:16: invalid array element in '0=1,2.5' (ints and floats " \
                               f"cannot mix; spaces end a value)"
    assert "Traceback" not in r.stderr
    r = run_cli("info", tmp_path / "missing.param")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_validate_exit_codes(tmp_path, capsys):
    ok = CORPUS / "squeezenet.param"
    assert main(["validate", str(ok)]) == 0
    bad = tmp_path / "fanout.param"
    bad.write_text("7767517\n3 3\nInput in 0 1 a\nReLU r 1 1 a b\nReLU s 1 1 a c\n")
    assert main(["validate", str(bad)]) == 1
    assert "PS106 error" in capsys.readouterr().out


def test_fmt_writes_pnnx_layout_atomically(tmp_path):
    src = tmp_path / "in.param"
    src.write_text("7767517\n2 2\nInput\tin 0 1 a\r\nBinaryOp b 1 1 a out 2=1.500000e+00 0=2\r\n")
    out = tmp_path / "out.param"
    r = run_cli("fmt", src, "-o", out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == ("7767517\n2 2\n"
                               "Input                    in                       0 1 a\n"
                               "BinaryOp                 b                        1 1 a out 0=2 2=1.5\n")
    assert src.read_text().startswith("7767517\n2 2\nInput\tin")  # input untouched
    # refusing to write the input without --in-place
    r = run_cli("fmt", src, "-o", src)
    assert r.returncode == 2 and "--in-place" in r.stderr
    r = run_cli("fmt", src)  # the default output rule: <input>.fmt.param beside the input
    assert r.returncode == 0 and (tmp_path / "in.fmt.param").read_text() == out.read_text()
    assert run_cli("fmt", src, "--in-place").returncode == 0
    assert src.read_text() == out.read_text()


def test_failed_command_leaves_existing_output_alone(tmp_path):
    out = tmp_path / "out.param"
    out.write_text("precious")
    bad = tmp_path / "bad.param"
    bad.write_text("7767517\n1 1\nInput in 0 1 a 0=\n")
    r = run_cli("fmt", bad, "-o", out)
    assert r.returncode == 2
    assert out.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.param", "out.param"]


def test_demo_runs_on_the_bundled_graph():
    r = run_cli("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo: all steps passed" in r.stdout
    assert "byte-identical" in r.stdout


def test_no_command_prints_help():
    r = run_cli()
    assert r.returncode == 2 and "COMMAND" in r.stdout
