"""`paramsurgery lint` on the command line: golden text and JSON, --select/--ignore,
--explain, --list, exit codes, and the speed of a static lint of the real-size talker."""

import json
import time

import pytest

from paramsurgery.cli import main

from conftest import FIXTURES, REPO
from golden import check_golden
from test_cli import run_cli

STATIC = ["fixtures/repros/stack-sum-batch-axis/bug/model.ncnn.param",
          "fixtures/repros/repeat-kv-expand/bug/model.ncnn.param",
          "fixtures/repros/int-arith-before-embed/bug/model.ncnn.param",
          "fixtures/ncnn_corpus/squeezenet.param"]
RUN = ["fixtures/repros/uneven-chunk/bug/model.ncnn.param",
       "fixtures/repros/dropped-negative-slice/bug/model.ncnn.param",
       "fixtures/repros/causal-pad-from-shape/static/model.ncnn.param"]


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # relative paths in the output; ncnn child processes import us


def lint(capsys, *args):
    code = main(["lint", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_golden_text_static(in_repo, capsys):
    code, out, err = lint(capsys, "--no-run", *STATIC)
    assert code == 1 and not err
    check_golden("lint/static.txt", out)
    assert out.splitlines()[-1] == "Found 6 findings in 4 files: 6 errors."


def test_golden_text_with_conformance_runs(in_repo, capsys):
    code, out, err = lint(capsys, *RUN)
    assert code == 1 and not err
    check_golden("lint/conformance.txt", out)


def test_golden_json(in_repo, capsys):
    code, out, _ = lint(capsys, "--no-run", "--format", "json", *STATIC)
    assert code == 1
    check_golden("lint/static.json", out)
    data = json.loads(out)
    assert set(data) == {"summary", "lint_entries"}
    s = data["summary"]
    assert s["errors"] == 6 and s["passing"] == ["fixtures/ncnn_corpus/squeezenet.param"]
    assert len(s["failing"]) == 3
    e = data["lint_entries"][0]
    assert set(e) == {"file", "code", "severity", "layer", "line", "message", "fix", "fix_pass"}
    assert {x["fix_pass"] for x in data["lint_entries"]} >= {"fix-reduction", "fold-gqa"}


def test_explain_and_list(capsys):
    code, out, _ = lint(capsys, "--explain", "PS001")
    assert code == 0
    check_golden("lint/explain_PS001.txt", out)
    code, out, _ = lint(capsys, "--list")
    assert code == 0
    check_golden("lint/list.txt", out)
    code, out, _ = lint(capsys, "--list", "--format", "json")
    rules = json.loads(out)
    assert rules[0]["code"] == "PS001" and rules[0]["fix_pass"] == "fix-slice"
    code, out, _ = lint(capsys, "--explain", "ps404", "--format", "json")
    assert json.loads(out)["doc"].startswith("The graph loads")


def test_select_and_ignore(in_repo, capsys):
    path = STATIC[0]
    code, out, _ = lint(capsys, "--no-run", "--select", "PS006", path)
    assert code == 1 and [ln.split()[1] for ln in out.splitlines()[:-1]] == ["PS006"]
    code, out, _ = lint(capsys, "--no-run", "--ignore", "PS003,PS006", path)
    assert code == 0 and out.strip() == "All checks passed (1 file)."
    code, out, _ = lint(capsys, "--no-run", "--select", "PS0", "--ignore", "PS003", path)
    assert [ln.split()[1] for ln in out.splitlines()[:-1]] == ["PS006"]


def test_exit_codes(tmp_path, in_repo, capsys):
    assert lint(capsys, "fixtures/ncnn_corpus/squeezenet.param")[0] == 0
    warn_only = lint(capsys, "fixtures/ncnn_corpus/nanodet_m.param")
    assert warn_only[0] == 0 and "PS101 warning" in warn_only[1]
    assert lint(capsys, "--no-run", STATIC[0])[0] == 1
    bad = tmp_path / "bad.param"
    bad.write_text("7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=1,2.5\n")
    code, out, err = lint(capsys, str(bad), "fixtures/ncnn_corpus/squeezenet.param")
    assert code == 2 and f"{bad}:4:16: invalid array element" in err
    assert out.strip().endswith("No findings in 1 file (1 could not be read).")
    code, _, err = lint(capsys, str(tmp_path / "missing.param"))
    assert code == 2 and "no such file" in err
    # explicit companions that do not exist or do not parse are unreadable input too
    code, _, err = lint(capsys, STATIC[0], "--bin", str(tmp_path / "none.bin"))
    assert code == 2 and "no such file (weights)" in err
    broken = tmp_path / "m.pnnx.param"
    broken.write_text("7767517\n1 1\npnnx.Input in 0 1 0 #0=(1,x)f32\n")
    code, _, err = lint(capsys, STATIC[0], "--pnnx-param", str(broken))
    assert code == 2 and "m.pnnx.param:3:21: bad operand shape" in err
    for args in (["--select", "PS9"], ["--explain", "PS999"], []):
        code, _, err = lint(capsys, *args)
        assert code == 2 and err


def test_subprocess_exit_code_and_output(tmp_path):
    p = tmp_path / "m.param"
    p.write_text("7767517\n2 4\nInput in 0 1 a\nSlice unbind_0 1 3 a b c d\n")
    r = run_cli("lint", p)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stdout.splitlines()[0] == (
        f"{p}:4: PS001 error Slice 'unbind_0' has no slices or indices: ncnn dereferences a "
        f"null pointer at run time (SIGSEGV; pnnx wrote it for an `unbind`/`chunk` along its "
        f"batch axis) (fix: paramsurgery fix-slice)")


def test_input_shape_option_runs_the_traced_shapes(tmp_path, in_repo, capsys):
    import shutil

    src = FIXTURES / "repros" / "uneven-chunk" / "bug"
    for name in ("model.ncnn.param", "model.ncnn.bin", "model.pnnx.param"):
        shutil.copy(src / name, tmp_path / name)
    param = tmp_path / "model.ncnn.param"
    code, out, _ = lint(capsys, param)
    assert code == 0 and "PS400 info shape conformance not checked" in out  # dynamic, no shapes
    code, out, _ = lint(capsys, param, "--input-shape", "[1,4,9]f32@0")
    assert code == 1 and "PS402 error Slice 'chunk_0' splits length 9 as 4+5" in out
    code, _, err = lint(capsys, param, "--input-shape", "[1,4")
    assert code == 2 and "bad input shape" in err


def test_static_lint_of_the_real_talker_is_fast(in_repo, capsys):
    for variant in ("ported", "raw"):
        path = f"fixtures/qwen3_tts/real/talker_decoder.{variant}.ncnn.param"
        main(["lint", "--no-run", path])  # warm imports
        capsys.readouterr()
        t = time.process_time()  # CPU time: wall time fails on a loaded machine
        main(["lint", "--no-run", path])
        dt = time.process_time() - t
        capsys.readouterr()
        assert dt < 0.5, (variant, dt)


def test_linting_the_pnnx_ir_itself_says_which_file_to_lint(capsys):
    code, _, err = lint(capsys, FIXTURES / "repros" / "uneven-chunk" / "bug" / "model.pnnx.param")
    assert code == 2 and "lint the .ncnn.param next to it" in err
